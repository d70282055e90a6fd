//! The gateway object's hm_wg_in on a crafted packet: what hm-wg0
//! receives is marked as having come through WireGuard, and goes on
//! untouched. (hm_tun_in, which takes an encrypted peer's VXLAN only so
//! marked, reads the tunnel's metadata, which a test run cannot give it:
//! the kernel matrix's encrypted-sites test shows it with real packets.)

use super::*;

/// `__sk_buff`'s `mark` (its third word).
const MARK: std::ops::Range<usize> = 8..12;

#[test]
fn hm_wg_in_marks_what_the_wireguard_device_receives_and_hands_it_on() {
    let mut p = Probes::with("");
    let datagram = packet(client(40000), vip(), None);
    let out = p.run_on(Program::WgIn, 1, &datagram);
    assert_eq!(out.retval as i32, abi::TC_ACT_UNSPEC, "other filters still see it");
    assert_eq!(u32::from_ne_bytes(out.ctx[MARK].try_into().unwrap()), abi::WG_RX_MARK);
    assert_eq!(out.data, datagram, "the packet is untouched");
}
