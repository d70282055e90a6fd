//! hm_natin, at hm-natin's TC egress, on crafted packets in the external
//! tests' namespace (a host interface towards another host's backends,
//! and addresses of this host's own): a packet to a VIP whose backend is
//! reached out of an interface is translated there and redirected to it,
//! so it never crosses the veth; anything else (a backend on this host, a
//! VIP nobody serves, not IP) goes on untouched to hm_natout.

use std::net::{Ipv4Addr, SocketAddr};

use super::external_tests::{
    addresses6, at, config, ifindex, ip, two_interfaces, BACKEND_SIDE, HOST_A, HOST_B, REMOTE, REMOTE6,
};
use super::*;

const REDIRECT: u32 = abi::TC_ACT_REDIRECT as u32;
const OK: u32 = abi::TC_ACT_OK as u32;
/// A few ticks of the kernel's coarse clock (a tick is 1-10 ms).
const TICKS: std::time::Duration = std::time::Duration::from_millis(25);

/// Each open flow entry's state and time (its next hop aside, which the
/// first packet of a new epoch finds again).
fn state_of(entries: &[(abi::CtKey, abi::CtValue)]) -> Vec<(abi::CtKey, u8, u64)> {
    entries.iter().map(|(k, v)| (*k, v.flags, v.last_seen_ns)).collect()
}

fn state(p: &mut Probes) -> Vec<(abi::CtKey, u8, u64)> {
    state_of(&p.conntrack(HmMap::Ct))
}

fn vip(last: u8, port: u16) -> SocketAddr {
    at(Ipv4Addr::new(10, 96, 0, last), port)
}

#[test]
fn hm_natin_sends_a_flow_to_another_host_out_at_once_and_refreshes_its_entries_only_with_news() {
    let mut p = Probes::with_host(&config("61000-65535"), two_interfaces);
    let host = at(HOST_B, 40100);
    let (web, backend) = (vip(10, 80), at(REMOTE, 8080));
    ip(&format!("neigh add {REMOTE} lladdr 02:00:00:00:00:20 dev {BACKEND_SIDE} nud permanent"));
    let dst_mac = |frame: &[u8]| frame[..6].to_vec();

    // The SYN: a backend picked and recorded both ways, the packet
    // translated, noted for hm_direct at the egress it is sent to, and
    // redirected there.
    let out = p.run_on(Program::NatIn, 1, &packet(host, web, Some(TCP_SYN)));
    assert_eq!(out.retval, REDIRECT, "sent out of the backend's interface");
    assert_eq!(addresses(&out.data), (host, backend));
    assert_ne!(cb_of(&out)[..2], [0, 0], "noted for hm_direct");
    let opened = p.conntrack(HmMap::Ct);
    assert_eq!(opened.len(), 2, "the flow, both ways: {opened:?}");
    // The FIB's answer (the backend's neighbour is known) is in the packet
    // and kept in the flow's forward entry.
    assert_eq!(dst_mac(&out.data), [2, 0, 0, 0, 0, 0x20]);
    let forward = opened.iter().find(|(k, _)| k.dir == abi::CT_FORWARD).unwrap().1;
    assert_eq!((forward.fib_ifindex, &forward.fib_macs[..6]), (ifindex(BACKEND_SIDE), &[2, 0, 0, 0, 0, 0x20][..]));

    // Its next packet, within the second and with nothing new: the same
    // backend, and neither entry written (nor the other looked up). The
    // probes' clock is the coarse one: a few ticks pass first, so a write
    // would show.
    std::thread::sleep(TICKS);
    let out = p.run(Program::NatIn, &packet(host, web, Some(TCP_ACK)));
    assert_eq!((out.retval, addresses(&out.data).1), (REDIRECT, backend));
    assert_eq!(state(&mut p), state_of(&opened), "nothing written");

    // The backend's answer, at the host interface: the VIP again, and its
    // news (answered) written to both entries; a repeat of it, nothing.
    let b = ifindex(BACKEND_SIDE);
    let out = p.run_on(Program::Reply, b, &packet(backend, host, Some(TCP_SYN | TCP_ACK)));
    assert_eq!(addresses(&out.data), (web, host));
    let answered = p.conntrack(HmMap::Ct);
    assert!(answered.iter().all(|(_, v)| v.flags & abi::CT_F_REPLIED != 0), "{answered:?}");
    std::thread::sleep(TICKS);
    p.run_on(Program::Reply, b, &packet(backend, host, Some(TCP_ACK)));
    assert_eq!(state(&mut p), state_of(&answered), "nothing new: nothing written");

    // The next hop is asked again once an epoch (about a second), not per
    // packet: a neighbour's new address reaches the flow within that.
    let ack = packet(host, web, Some(TCP_ACK));
    let epoch = || (super::super::conntrack::now_ns() >> 30) as u32;
    let kept = |p: &mut Probes| p.conntrack(HmMap::Ct).into_iter().find(|(k, _)| k.dir == abi::CT_FORWARD).unwrap().1;
    let neighbour = |last: u8| {
        ip(&format!("neigh replace {REMOTE} lladdr 02:00:00:00:00:{last:02x} dev {BACKEND_SIDE} nud permanent"))
    };
    loop {
        // At the start of an epoch the flow's first packet asks the FIB
        // (its entry's epoch moves); the neighbour changes; the next packet,
        // in the same epoch (the entry's epoch unmoved), goes where the
        // entry says. The epochs are the entry's, as the program's clock
        // made them: the program reads the coarse clock, which may lag this
        // test's clock by a tick at an epoch's edge.
        let start = epoch();
        while epoch() == start {
            std::thread::sleep(TICKS);
        }
        neighbour(0x20);
        let prior = kept(&mut p).fib_epoch;
        p.run(Program::NatIn, &ack);
        let asked = kept(&mut p).fib_epoch;
        neighbour(0x21);
        let mac = dst_mac(&p.run(Program::NatIn, &ack).data);
        if asked != prior && kept(&mut p).fib_epoch == asked {
            assert_eq!(mac, [2, 0, 0, 0, 0, 0x20], "the next hop kept in the entry");
            break;
        }
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while dst_mac(&p.run(Program::NatIn, &ack).data) != [2, 0, 0, 0, 0, 0x21] {
        assert!(std::time::Instant::now() < deadline, "the new neighbour never reached the flow");
        std::thread::sleep(TICKS);
    }
    assert_eq!(kept(&mut p).fib_macs[..6], [2, 0, 0, 0, 0, 0x21]);

    // A FIN each way closes it, as on hm_natout.
    let out = p.run(Program::NatIn, &packet(host, web, Some(TCP_FIN | TCP_ACK)));
    assert_eq!((out.retval, addresses(&out.data).1), (REDIRECT, backend));
    p.run_on(Program::Reply, b, &packet(backend, host, Some(TCP_FIN | TCP_ACK)));
    assert_eq!(p.conntrack(HmMap::Ct), vec![], "no open flow left");
    assert_eq!(p.conntrack(HmMap::CtClosing).len(), 2);

    // IPv6 and UDP alike.
    let host6: SocketAddr = "[2001:db8:b::10]:40101".parse().unwrap();
    let out = p.run(Program::NatIn, &packet6(host6, "[fd00:96::12]:53".parse().unwrap()));
    assert_eq!(out.retval, REDIRECT);
    assert_eq!(addresses6(&out.data), (host6, at(REMOTE6, 5353)));
}

#[test]
fn hm_natin_leaves_local_backends_refusals_and_other_packets_to_hm_natout_untouched() {
    let mut p = Probes::with_host(&config("61000-65535"), two_interfaces);
    let host = at(HOST_B, 40200);

    // "here"'s backend is an address of this host: hm_natin leaves the
    // packet as it is, records nothing, and hm_natout translates it and
    // hands it to the stack.
    let syn = packet(host, vip(11, 80), Some(TCP_SYN));
    let out = p.run(Program::NatIn, &syn);
    assert_eq!((out.retval, &out.data), (OK, &syn));
    assert_eq!(p.conntrack(HmMap::Ct), vec![], "nothing recorded");
    let out = p.run(Program::NatOut, &syn);
    assert_eq!((out.retval, addresses(&out.data)), (OK, (host, at(HOST_A, 8081))));
    // The flow's next packets too, though hm_natout has recorded it.
    let ack = packet(host, vip(11, 80), Some(TCP_ACK));
    let out = p.run(Program::NatIn, &ack);
    assert_eq!((out.retval, &out.data), (OK, &ack));
    assert_eq!(addresses(&p.run(Program::NatOut, &ack).data).1, at(HOST_A, 8081));

    // A service without backends, a port of a VIP without a service: left
    // to hm_natout, which answers with a RST.
    for to in [vip(13, 80), vip(10, 81)] {
        let syn = packet(at(HOST_B, 40201), to, Some(TCP_SYN));
        let out = p.run(Program::NatIn, &syn);
        assert_eq!((out.retval, &out.data), (OK, &syn), "{to}");
        let out = p.run(Program::NatOut, &syn);
        assert_eq!((out.retval, addresses(&out.data).0), (REDIRECT, to), "{to}: a RST from it");
    }
    assert_eq!(p.conntrack(HmMap::Ct).len(), 2, "only here's flow");

    // Not IP (an ARP request): untouched.
    let mut arp = vec![0xff; 6];
    arp.extend([0x02, 0, 0, 0, 0, 1, 0x08, 0x06]);
    arp.extend([0u8; 28]);
    let out = p.run(Program::NatIn, &arp);
    assert_eq!((out.retval, &out.data), (OK, &arp));
}
