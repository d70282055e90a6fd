//! The probes' backend hash of a 5-tuple (`hm_flow_hash` in
//! probes/service_maps.h), for `hostmesh explain --from`: the veth path
//! and connect-time LB for a socket bound to a source port pick slot
//! `hash % table_size` of the service's Maglev table. The explain test
//! checks the two agree on real connections.

use std::net::IpAddr;

use crate::abi::addr16;

fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58476d1ce4e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d049bb133111eb);
    x ^ (x >> 31)
}

/// The hash of (src, dst, sport, dport, protocol number), ports in host
/// byte order here (the probe reads them in network order from the
/// packet; the conversion below gives the same words).
pub(crate) fn flow_hash(src: IpAddr, dst: IpAddr, sport: u16, dport: u16, proto: u8) -> u32 {
    let (s, d) = (addr16(src), addr16(dst));
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
    // A __be16 loaded as a little-endian u16.
    let be = |p: u16| u64::from(u16::from_le_bytes(p.to_be_bytes()));
    let mut h: u64 = 0x9e3779b97f4a7c15;
    for w in [word(&s[..8]), word(&s[8..]), word(&d[..8]), word(&d[8..])] {
        h = mix(h ^ w);
    }
    h = mix(h ^ (be(sport) << 24 | be(dport) << 8 | u64::from(proto)));
    (h ^ (h >> 32)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_depends_on_every_field_and_spreads_source_ports() {
        let (a, b): (IpAddr, IpAddr) = ("192.168.10.1".parse().unwrap(), "10.96.0.10".parse().unwrap());
        let base = flow_hash(a, b, 40000, 80, 6);
        assert_eq!(base, flow_hash(a, b, 40000, 80, 6), "deterministic");
        for other in [
            flow_hash(b, a, 40000, 80, 6),
            flow_hash(a, b, 40001, 80, 6),
            flow_hash(a, b, 40000, 81, 6),
            flow_hash(a, b, 40000, 80, 17),
        ] {
            assert_ne!(other, base);
        }
        // 1,000 source ports over a 251-slot table: no slot takes more than
        // a few times its share.
        let mut slots = [0u32; 251];
        for p in 30000..31000 {
            slots[(flow_hash(a, b, p, 80, 6) % 251) as usize] += 1;
        }
        assert!(slots.iter().all(|n| *n <= 16), "{slots:?}");
    }
}
