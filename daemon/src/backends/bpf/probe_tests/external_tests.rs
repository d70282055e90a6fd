//! Flows from the network (node ports, external VIPs) through hm_reply
//! and hm_direct, on crafted packets: the test's namespace has two
//! "host interfaces" (a veth pair, `hm-ta` towards clients and `hm-tb`
//! towards another host's backends), with addresses, so the programs' FIB
//! lookups and socket lookups see a host as a node has it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::process::Command;

use zerocopy::IntoBytes;

use super::*;

pub(super) const CLIENT_SIDE: &str = "hm-ta";
pub(super) const BACKEND_SIDE: &str = "hm-tb";
/// This host's addresses on the two.
pub(super) const HOST_A: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);
pub(super) const HOST_B: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
const HOST_A6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xa, 0, 0, 0, 0, 0x10);
const HOST_B6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xb, 0, 0, 0, 0, 0x10);
/// Another host's backend, behind hm-tb.
pub(super) const REMOTE: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 20);
pub(super) const REMOTE6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xb, 0, 0, 0, 0, 0x20);

pub(super) fn ip(args: &str) {
    let out = Command::new("ip").args(args.split_whitespace()).output().expect("run ip");
    assert!(out.status.success(), "ip {args}: {}", String::from_utf8_lossy(&out.stderr));
}

/// The two host interfaces, up, addressed and forwarding (what hostmesh
/// sets on host interfaces when a service is reached from the network),
/// and the facts compile needs of them.
pub(super) fn two_interfaces(facts: &mut HostFacts) {
    ip(&format!("link add {CLIENT_SIDE} type veth peer name {BACKEND_SIDE}"));
    ip(&format!("addr add {HOST_A}/24 dev {CLIENT_SIDE}"));
    ip(&format!("addr add {HOST_A6}/64 dev {CLIENT_SIDE} nodad"));
    ip(&format!("addr add {HOST_B}/24 dev {BACKEND_SIDE}"));
    ip(&format!("addr add {HOST_B6}/64 dev {BACKEND_SIDE} nodad"));
    let mut sysctl = crate::backends::sysctl::ProcSys::new();
    for dev in [CLIENT_SIDE, BACKEND_SIDE] {
        ip(&format!("link set {dev} up"));
        for family in ["ipv4", "ipv6"] {
            crate::backends::SysctlBackend::set(&mut sysctl, &format!("net/{family}/conf/{dev}/forwarding"), "1")
                .unwrap();
        }
        facts.interfaces.insert(dev.to_string());
    }
    // Another network, routed through a router behind hm-tb.
    ip(&format!("route add 203.0.113.0/24 via 198.51.100.1 dev {BACKEND_SIDE}"));
    let backends: Vec<IpAddr> = vec![REMOTE.into(), REMOTE6.into(), HOST_A.into()];
    let mut netlink = crate::backends::netlink::Rtnetlink::open().unwrap();
    facts.backend_routes = netlink.backend_routes(&backends).unwrap();
    facts.addresses = netlink.addresses().unwrap();
}

pub(super) fn config(snat_range: &str) -> String {
    format!(
        "[daemon]\nconnect_time_lb = \"off\"\nhost_interfaces = [\"{CLIENT_SIDE}\", \"{BACKEND_SIDE}\"]\n\
         snat_port_range = \"{snat_range}\"\n\
         [[service]]\nname = \"web\"\nvip = \"10.96.0.10\"\nport = 80\nbackends = [\"{REMOTE}:8080\"]\n\
         node_port = 30080\nexternal = true\n\
         [[service]]\nname = \"here\"\nvip = \"10.96.0.11\"\nport = 80\nbackends = [\"{HOST_A}:8081\"]\nnode_port = 30081\n\
         [[service]]\nname = \"dns\"\nvip = \"10.96.0.12\"\nport = 53\nprotocol = \"udp\"\n\
         backends = [\"{REMOTE}:5353\"]\nnode_port = 30053\n\
         [[service]]\nname = \"dns6\"\nvip = \"fd00:96::12\"\nport = 53\nprotocol = \"udp\"\n\
         backends = [\"[{REMOTE6}]:5353\"]\nnode_port = 30053\n\
         [[service]]\nname = \"none\"\nvip = \"10.96.0.13\"\nport = 80\nnode_port = 30082\n\
         [[service]]\nname = \"none-udp\"\nvip = \"10.96.0.13\"\nport = 53\nprotocol = \"udp\"\nnode_port = 30054\n"
    )
}

pub(super) fn ifindex(dev: &str) -> u32 {
    nix::net::if_::if_nametoindex(dev).unwrap()
}

pub(super) fn at(ip: impl Into<IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(ip.into(), port)
}

/// (source, destination) of an IPv6 UDP frame, its checksum checked.
pub(super) fn addresses6(frame: &[u8]) -> (SocketAddr, SocketAddr) {
    let addr = |at: usize| Ipv6Addr::from(<[u8; 16]>::try_from(&frame[at..at + 16]).unwrap());
    let (s, d) = (addr(22), addr(38));
    let udp = &frame[54..];
    assert_eq!(checksum(udp, pseudo6_of(s, d, 17, udp.len())), 0, "UDP checksum after translation");
    let port = |at: usize| u16::from_be_bytes([udp[at], udp[at + 1]]);
    (SocketAddr::new(s.into(), port(0)), SocketAddr::new(d.into(), port(2)))
}

impl Probes {
    /// Every entry of HM_NAT.
    fn nat(&mut self) -> Vec<(abi::CtKey, abi::NatValue)> {
        let fd = self.bpf.maps.map_fd(HmMap::Nat).unwrap();
        let def = HmMap::Nat.def();
        sys::map_dump(fd.as_fd(), def.key_size as usize, def.value_size as usize)
            .unwrap()
            .into_iter()
            .map(|(k, v)| (abi::CtKey::from_bytes(&k).unwrap(), abi::NatValue::from_bytes(&v).unwrap()))
            .collect()
    }
}

#[test]
fn a_node_port_and_an_external_vip_reach_another_hosts_backend_from_this_hosts_address_and_back() {
    let mut p = Probes::with_host(&config("61000-65535"), two_interfaces);
    let (a, b) = (ifindex(CLIENT_SIDE), ifindex(BACKEND_SIDE));
    let client = at(Ipv4Addr::new(192, 0, 2, 1), 40000);
    let node_port = at(HOST_A, 30080);

    let out = p.run_on(Program::Reply, a, &packet(client, node_port, Some(TCP_SYN)));
    assert_eq!(out.retval, abi::TC_ACT_REDIRECT as u32, "forwarded out of the backend's interface");
    let (src, dst) = addresses(&out.data);
    assert_eq!(dst, at(REMOTE, 8080), "to the backend");
    assert_eq!(src.ip(), IpAddr::V4(HOST_B), "from this host's address on the way to it");
    assert!((61000..=65535).contains(&src.port()), "a port of snat_port_range: {src}");
    assert_eq!(p.nat().len(), 2, "the flow, both ways");

    // The backend's answer comes back to that address and port, and goes
    // to the client from the node port.
    let out = p.run_on(Program::Reply, b, &packet(dst, src, Some(TCP_SYN | TCP_ACK)));
    assert_eq!(out.retval, abi::TC_ACT_REDIRECT as u32);
    assert_eq!(addresses(&out.data), (node_port, client));
    // The client's next packet follows the flow.
    let out = p.run_on(Program::Reply, a, &packet(client, node_port, Some(TCP_ACK)));
    assert_eq!(addresses(&out.data), (src, dst), "same backend, same port");
    assert!(p.nat().iter().all(|(_, v)| v.flags & abi::CT_F_REPLIED != 0), "the backend answered");

    // The external VIP, from another client port: another source port.
    let vip = at(Ipv4Addr::new(10, 96, 0, 10), 80);
    let out = p.run_on(Program::Reply, a, &packet(at(client.ip(), 40001), vip, Some(TCP_SYN)));
    let (src2, dst2) = addresses(&out.data);
    assert_eq!((src2.ip(), dst2), (IpAddr::V4(HOST_B), at(REMOTE, 8080)));
    assert_ne!(src2.port(), src.port(), "two flows to one backend never share a port");

    // UDP to a node port, IPv4 and IPv6.
    let out = p.run_on(Program::Reply, a, &packet(at(client.ip(), 40002), at(HOST_A, 30053), None));
    let (src3, dst3) = addresses(&out.data);
    assert_eq!((src3.ip(), dst3), (IpAddr::V4(HOST_B), at(REMOTE, 5353)));
    let client6 = at(Ipv6Addr::new(0x2001, 0xdb8, 0xa, 0, 0, 0, 0, 1), 40003);
    let out = p.run_on(Program::Reply, a, &packet6(client6, at(HOST_A6, 30053)));
    assert_eq!(out.retval, abi::TC_ACT_REDIRECT as u32, "IPv6");
    let (src6, dst6) = addresses6(&out.data);
    assert_eq!((src6.ip(), dst6), (IpAddr::V6(HOST_B6), at(REMOTE6, 5353)), "IPv6");
    let out = p.run_on(Program::Reply, b, &packet6(dst6, src6));
    assert_eq!(addresses6(&out.data), (at(HOST_A6, 30053), client6), "IPv6: the answer from the node port");
}

#[test]
fn a_flow_whose_backend_has_not_answered_yet_waits_for_it_as_long_as_a_syn_does() {
    let mut p = Probes::with_host(&config("61000-65535"), two_interfaces);
    let (a, b) = (ifindex(CLIENT_SIDE), ifindex(BACKEND_SIDE));
    let client = at(Ipv4Addr::new(192, 0, 2, 1), 40000);
    let out = p.run_on(Program::Reply, a, &packet(client, at(HOST_A, 30080), Some(TCP_SYN)));
    let (src, dst) = addresses(&out.data);
    // The backend is slow: its SYN-ACK comes 3 s after the SYN (the
    // entries' times set back; the probes' clock is coarse, a tick behind).
    let fd = p.bpf.maps.map_fd(HmMap::Nat).unwrap().as_fd().try_clone_to_owned().unwrap();
    let now = super::super::conntrack::now_ns();
    for (k, mut v) in p.nat() {
        v.last_seen_ns = now - 3_000_000_000;
        sys::map_update(fd.as_fd(), k.as_bytes(), v.as_bytes()).unwrap();
    }
    assert_eq!(
        super::super::conntrack::expire_external(fd.as_fd(), None, now).unwrap().removed,
        0,
        "the sweep keeps a flow whose backend has not answered for the 60 s of a SYN"
    );
    let out = p.run_on(Program::Reply, b, &packet(dst, src, Some(TCP_SYN | TCP_ACK)));
    assert_eq!(out.retval, abi::TC_ACT_REDIRECT as u32, "the late answer goes to the client");
    assert_eq!(addresses(&out.data), (at(HOST_A, 30080), client));
}

#[test]
fn a_backend_on_this_host_sees_the_clients_address_and_its_reply_leaves_from_the_node_port() {
    let mut p = Probes::with_host(&config("61000-65535"), two_interfaces);
    let a = ifindex(CLIENT_SIDE);
    let client = at(Ipv4Addr::new(192, 0, 2, 1), 40010);
    let out = p.run_on(Program::Reply, a, &packet(client, at(HOST_A, 30081), Some(TCP_SYN)));
    assert_eq!(out.retval, abi::TC_ACT_OK as u32, "delivered here");
    assert_eq!(addresses(&out.data), (client, at(HOST_A, 8081)), "the client's own address");
    // The backend's reply leaves through the host interface: the node
    // port is its source again.
    let out = p.run_on(Program::Direct, a, &packet(at(HOST_A, 8081), client, Some(TCP_SYN | TCP_ACK)));
    assert_eq!(out.retval as i32, abi::TC_ACT_UNSPEC);
    assert_eq!(addresses(&out.data), (at(HOST_A, 30081), client));
}

#[test]
fn a_host_process_reaches_its_own_node_port_through_lo_as_a_client_on_another_machine_would() {
    let mut p = Probes::with_host(&config("61000-65535"), |facts| {
        two_interfaces(facts);
        // What hostmesh sets on lo for the turnaround.
        ip("link set lo up");
        let mut sysctl = crate::backends::sysctl::ProcSys::new();
        crate::backends::SysctlBackend::set(&mut sysctl, "net/ipv4/conf/lo/forwarding", "1").unwrap();
    });
    let b = ifindex(BACKEND_SIDE);
    const LO: u32 = 1;
    let process = at(HOST_A, 40100);
    // At lo's egress, the process's SYN to its own address's node port goes
    // to the other host's backend, from this host's address towards it.
    let out = p.run_on(Program::Direct, LO, &packet(process, at(HOST_A, 30080), Some(TCP_SYN)));
    assert_eq!(out.retval, abi::TC_ACT_REDIRECT as u32, "out of the backend's interface");
    let (src, dst) = addresses(&out.data);
    assert_eq!((dst, src.ip()), (at(REMOTE, 8080), IpAddr::V4(HOST_B)));
    // The backend's answer comes back to that address, and reaches the
    // process through lo's ingress (where a source of the host's own is
    // no martian), from the node port.
    let out = p.run_on(Program::Reply, b, &packet(dst, src, Some(TCP_SYN | TCP_ACK)));
    assert_eq!(out.retval, abi::TC_ACT_REDIRECT as u32, "to lo");
    assert_eq!(addresses(&out.data), (at(HOST_A, 30080), process));
    assert_eq!(out.data[..12], [0u8; 12], "lo's address, so lo takes it as its own");
    // The process's next segment follows the flow.
    let out = p.run_on(Program::Direct, LO, &packet(process, at(HOST_A, 30080), Some(TCP_ACK)));
    assert_eq!(addresses(&out.data), (src, dst));
    // A backend that is a process of this host: delivered on lo, seeing
    // the client's address; its reply at lo's egress has the node port back.
    let other = at(HOST_A, 40101);
    let out = p.run_on(Program::Direct, LO, &packet(other, at(HOST_A, 30081), Some(TCP_SYN)));
    assert_eq!(out.retval as i32, abi::TC_ACT_OK, "on to lo's ingress");
    assert_eq!(addresses(&out.data), (other, at(HOST_A, 8081)));
    let out = p.run_on(Program::Direct, LO, &packet(at(HOST_A, 8081), other, Some(TCP_SYN | TCP_ACK)));
    assert_eq!(addresses(&out.data), (at(HOST_A, 30081), other));
    // The host's own traffic to its address on any other port is not touched.
    let sent = packet(at(HOST_A, 40102), at(HOST_A, 22), Some(TCP_SYN));
    let out = p.run_on(Program::Direct, LO, &sent);
    assert_eq!((out.retval as i32, &out.data), (abi::TC_ACT_UNSPEC, &sent));
}

#[test]
fn what_is_no_flow_from_the_network_passes_and_a_node_port_nobody_serves_refuses() {
    let mut p = Probes::with_host(&config("61000-65535"), two_interfaces);
    let a = ifindex(CLIENT_SIDE);
    let client = at(Ipv4Addr::new(192, 0, 2, 1), 40020);
    for (to, why) in [
        (at(Ipv4Addr::new(10, 96, 0, 11), 80), "a VIP that is not external"),
        (at(HOST_A, 30083), "a port that is no node port"),
        (at(Ipv4Addr::new(203, 0, 113, 5), 30080), "another host's address on a node port (routed on)"),
        (at(Ipv4Addr::new(100, 64, 0, 1), 30080), "an address with no route, on a node port"),
    ] {
        let sent = packet(client, to, Some(TCP_SYN));
        let out = p.run_on(Program::Reply, a, &sent);
        assert_eq!((out.retval as i32, &out.data), (abi::TC_ACT_UNSPEC, &sent), "{why}: untouched");
    }
    // A segment of no flow to the host's address goes to the host, which
    // resets it.
    let sent = packet(client, at(HOST_A, 30080), Some(TCP_ACK));
    assert_eq!(p.run_on(Program::Reply, a, &sent).data, sent);
    assert!(p.nat().is_empty(), "nothing tracked");
    // A node port whose service has no backend: a RST from the node port.
    let out = p.run_on(Program::Reply, a, &packet(client, at(HOST_A, 30082), Some(TCP_SYN)));
    assert_eq!(out.retval, abi::TC_ACT_REDIRECT as u32, "sent back out where it came in");
    assert_eq!(addresses(&out.data), (at(HOST_A, 30082), client));
    assert_eq!(out.data[34 + 13] & 0x04, 0x04, "RST set");
}

#[test]
fn port_unreachable_errors_to_the_network_are_limited_as_the_kernels_own_and_resets_are_not() {
    let mut p = Probes::with_host(&config("61000-65535"), two_interfaces);
    let a = ifindex(CLIENT_SIDE);
    let unserved = at(HOST_A, 30054);
    let started = std::time::Instant::now();
    let verdicts: Vec<i32> = (0..200u16)
        .map(|i| {
            p.run_on(Program::Reply, a, &packet(at(Ipv4Addr::new(192, 0, 2, 1), 43000 + i), unserved, None)).retval
                as i32
        })
        .collect();
    let answered = verdicts.iter().filter(|v| **v == abi::TC_ACT_REDIRECT).count();
    assert!(verdicts.iter().all(|v| [abi::TC_ACT_REDIRECT, abi::TC_ACT_SHOT].contains(v)), "{verdicts:?}");
    // A burst of 50, then one a millisecond (icmp_msgs_burst and
    // icmp_msgs_per_sec's defaults); the clock is a tick coarse.
    let allowed = 50 + started.elapsed().as_millis() as usize + 10;
    assert!((50..=allowed.min(199)).contains(&answered), "{answered} of 200 answered, at most {allowed} allowed");
    // The rest were dropped, not passed to the host (which would answer
    // them itself). A RST for a TCP SYN is not limited, as the kernel's is not.
    for i in 0..60 {
        let out = p.run_on(
            Program::Reply,
            a,
            &packet(at(Ipv4Addr::new(192, 0, 2, 1), 44000 + i), at(HOST_A, 30082), Some(TCP_SYN)),
        );
        assert_eq!(out.retval, abi::TC_ACT_REDIRECT as u32, "RST {i}");
    }
    // The budget comes back with time.
    let again = hm_testkit::wait_soon("an ICMP error allowed again", || {
        let out = p.run_on(Program::Reply, a, &packet(at(Ipv4Addr::new(192, 0, 2, 1), 45000), unserved, None));
        out.retval == abi::TC_ACT_REDIRECT as u32
    });
    assert!(again.is_ok());
}

#[test]
fn with_external_policy_local_flows_reach_only_this_hosts_backends_and_are_refused_when_there_is_none() {
    let local = format!(
        "{}[[service]]\nname = \"mixed\"\nvip = \"10.96.0.14\"\nport = 80\nbackends = [\"{REMOTE}:8080\", \"{HOST_A}:8082\"]\n\
         node_port = 30084\nexternal = true\nexternal_policy = \"local\"\n\
         [[service]]\nname = \"far\"\nvip = \"10.96.0.15\"\nport = 53\nprotocol = \"udp\"\nbackends = [\"{REMOTE}:5353\"]\n\
         node_port = 30085\nexternal_policy = \"local\"\n",
        config("61000-65535")
    );
    let mut p = Probes::with_host(&local, two_interfaces);
    let a = ifindex(CLIENT_SIDE);
    // Many clients, through the node port and the external VIP: every one
    // reaches the backend here (the other host's is in the service's
    // table too), seeing its own address.
    for n in 0..32u16 {
        let client = at(Ipv4Addr::new(192, 0, 2, 1 + (n % 4) as u8), 41000 + n);
        let to = if n % 2 == 0 { at(HOST_A, 30084) } else { at(Ipv4Addr::new(10, 96, 0, 14), 80) };
        let out = p.run_on(Program::Reply, a, &packet(client, to, Some(TCP_SYN)));
        assert_eq!(out.retval, abi::TC_ACT_OK as u32, "{client} -> {to}: delivered here");
        assert_eq!(addresses(&out.data), (client, at(HOST_A, 8082)), "{client} -> {to}");
    }
    // No backend of "far" is here: a datagram is answered with an ICMP
    // port unreachable from the node port, and nothing is tracked for it.
    let before = p.nat().len();
    let client = at(Ipv4Addr::new(192, 0, 2, 1), 41100);
    let out = p.run_on(Program::Reply, a, &packet(client, at(HOST_A, 30085), None));
    assert_eq!(out.retval, abi::TC_ACT_REDIRECT as u32, "sent back out where it came in");
    assert_eq!(out.data[14 + 9], 1, "ICMP");
    assert_eq!((out.data[34], out.data[35]), (3, 3), "port unreachable");
    assert_eq!(p.nat().len(), before);
}

#[test]
fn a_source_port_is_never_one_a_flow_or_a_socket_of_the_host_holds() {
    // One port in the range.
    let mut p = Probes::with_host(&config("61000-61000"), two_interfaces);
    let a = ifindex(CLIENT_SIDE);
    let client = Ipv4Addr::new(192, 0, 2, 1);
    let dns = at(HOST_A, 30053);
    let out = p.run_on(Program::Reply, a, &packet(at(client, 40030), dns, None));
    assert_eq!(addresses(&out.data).0, at(HOST_B, 61000));
    // The second flow to the same backend finds it taken: dropped, not
    // sharing it (whose replies would go to the first client).
    let out = p.run_on(Program::Reply, a, &packet(at(client, 40031), dns, None));
    assert_eq!(out.retval as i32, abi::TC_ACT_SHOT);
    assert_eq!(p.nat().len(), 2, "only the first flow");

    // A socket of the host bound to the port: no flow takes it.
    let mut p = Probes::with_host(&config("61000-61000"), two_interfaces);
    let _socket = std::net::UdpSocket::bind(at(HOST_B, 61000)).unwrap();
    let out = p.run_on(Program::Reply, ifindex(CLIENT_SIDE), &packet(at(client, 40032), dns, None));
    assert_eq!(out.retval as i32, abi::TC_ACT_SHOT, "the host's socket keeps its port");
    assert!(p.nat().is_empty());

    // Two ports: the port a flow gets first, when a socket holds it, it
    // tries on from (snat_port_take, once a try) to the other.
    let flow = packet(at(client, 40040), dns, None);
    let mut p = Probes::with_host(&config("61000-61001"), two_interfaces);
    let first = addresses(&p.run_on(Program::Reply, a, &flow).data).0;
    let other = at(HOST_B, if first.port() == 61000 { 61001 } else { 61000 });
    let mut p = Probes::with_host(&config("61000-61001"), two_interfaces);
    let _socket = std::net::UdpSocket::bind(first).unwrap();
    assert_eq!(addresses(&p.run_on(Program::Reply, a, &flow).data).0, other);
    let out = p.run_on(Program::Reply, a, &packet(at(client, 40041), dns, None));
    assert_eq!(out.retval as i32, abi::TC_ACT_SHOT, "both ports held");
    assert_eq!(p.nat().len(), 2, "one flow");
}

/// A link's MAC address (`ip -o link`: sysfs shows another namespace's).
fn mac_of(dev: &str) -> [u8; 6] {
    let out = Command::new("ip").args(["-o", "link", "show", "dev", dev]).output().expect("run ip");
    let text = String::from_utf8_lossy(&out.stdout);
    let mac = text.split_whitespace().skip_while(|w| *w != "link/ether").nth(1).unwrap_or_else(|| panic!("{text}"));
    let bytes: Vec<u8> = mac.split(':').map(|b| u8::from_str_radix(b, 16).unwrap()).collect();
    bytes.try_into().unwrap()
}

fn mac_text(mac: [u8; 6]) -> String {
    mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

/// Waits, if need be, until at least 600 ms of the probes' next-hop epoch
/// (2^30 ns of CLOCK_MONOTONIC, service_nat.c fib_epoch) are left.
fn early_in_an_epoch() {
    const EPOCH_NS: u64 = 1 << 30;
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).unwrap();
    let phase = (ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64) % EPOCH_NS;
    if EPOCH_NS - phase < 600_000_000 {
        // Past the end, and past the coarse clock's tick behind it.
        std::thread::sleep(std::time::Duration::from_nanos(EPOCH_NS - phase + 20_000_000));
    }
}

#[test]
fn a_flows_next_hop_is_kept_in_its_entries_and_asked_again_in_the_next_epoch() {
    let mut p = Probes::with_host(&config("61000-65535"), two_interfaces);
    let (a, b) = (ifindex(CLIENT_SIDE), ifindex(BACKEND_SIDE));
    let (first, moved, client_mac) = ([2, 0, 0, 0, 0, 0x20], [2, 0, 0, 0, 0, 0x21], [2, 0, 0, 0, 0, 1]);
    ip(&format!("neigh replace {REMOTE} lladdr {} dev {BACKEND_SIDE} nud permanent", mac_text(first)));
    ip(&format!("neigh replace 192.0.2.1 lladdr {} dev {CLIENT_SIDE} nud permanent", mac_text(client_mac)));
    let client = at(Ipv4Addr::new(192, 0, 2, 1), 40070);
    let node_port = at(HOST_A, 30080);
    let macs = |data: &[u8]| (<[u8; 6]>::try_from(&data[..6]).unwrap(), <[u8; 6]>::try_from(&data[6..12]).unwrap());
    let entry = |p: &mut Probes, reply: bool| {
        let found = p.nat().into_iter().filter(|(_, v)| (v.flags & abi::NAT_F_REPLY != 0) == reply).collect::<Vec<_>>();
        assert_eq!(found.len(), 1, "{found:?}");
        found[0]
    };

    // The first packet finds the next hop, and its entry keeps it. (Early
    // in an epoch: the check below that the kept hop is used within the
    // epoch must not straddle its end, as it did once in the suite.)
    early_in_an_epoch();
    let out = p.run_on(Program::Reply, a, &packet(client, node_port, Some(TCP_SYN)));
    assert_eq!(out.retval, abi::TC_ACT_REDIRECT as u32);
    assert_eq!(macs(&out.data), (first, mac_of(BACKEND_SIDE)), "to the backend's neighbour, from hm-tb");
    let (key, kept) = entry(&mut p, false);
    assert_eq!(kept.fib_ifindex, b);
    assert_eq!(kept.fib_macs, [first, mac_of(BACKEND_SIDE)].concat()[..]);
    let (src, dst) = addresses(&out.data);

    // The backend's answer: the reply entry learns the way to the client.
    let out = p.run_on(Program::Reply, b, &packet(dst, src, Some(TCP_SYN | TCP_ACK)));
    assert_eq!(macs(&out.data), (client_mac, mac_of(CLIENT_SIDE)));
    assert_eq!(entry(&mut p, true).1.fib_ifindex, a);

    // Within the epoch the kept next hop is used, not asked again: a
    // neighbour that moved is not seen yet.
    ip(&format!("neigh replace {REMOTE} lladdr {} dev {BACKEND_SIDE} nud permanent", mac_text(moved)));
    let out = p.run_on(Program::Reply, a, &packet(client, node_port, Some(TCP_ACK)));
    assert_eq!((out.retval, macs(&out.data).0), (abi::TC_ACT_REDIRECT as u32, first), "the kept next hop");
    assert_eq!(addresses(&out.data), (src, dst));

    // An entry whose next hop is of an earlier epoch asks the FIB again.
    let fd = p.bpf.maps.map_fd(HmMap::Nat).unwrap().try_clone().unwrap();
    let older = abi::NatValue { fib_epoch: kept.fib_epoch.wrapping_sub(1), ..entry(&mut p, false).1 };
    sys::map_update(fd.as_fd(), key.as_bytes(), older.as_bytes()).unwrap();
    let out = p.run_on(Program::Reply, a, &packet(client, node_port, Some(TCP_ACK)));
    assert_eq!(macs(&out.data).0, moved, "the neighbour's new address");
    assert_eq!(entry(&mut p, false).1.fib_macs[..6], moved, "kept again");
    assert_ne!(entry(&mut p, false).1.fib_epoch, older.fib_epoch);

    // A next hop the FIB cannot resolve is not kept: the neighbour's
    // resolution is left to the kernel (bpf_redirect_neigh).
    ip(&format!("neigh del {REMOTE} dev {BACKEND_SIDE}"));
    let stale = abi::NatValue { fib_epoch: kept.fib_epoch.wrapping_sub(1), ..entry(&mut p, false).1 };
    sys::map_update(fd.as_fd(), key.as_bytes(), stale.as_bytes()).unwrap();
    let out = p.run_on(Program::Reply, a, &packet(client, node_port, Some(TCP_ACK)));
    assert_eq!(out.retval, abi::TC_ACT_REDIRECT as u32, "still sent on");
    assert_eq!(entry(&mut p, false).1.fib_ifindex, 0, "nothing kept");
}

#[test]
fn a_packet_hm_reply_sent_out_is_passed_by_hm_direct_at_that_egress_without_a_lookup() {
    let mut p = Probes::with_host(&config("61000-65535"), two_interfaces);
    let (a, b) = (ifindex(CLIENT_SIDE), ifindex(BACKEND_SIDE));
    let client = at(Ipv4Addr::new(192, 0, 2, 1), 40060);
    // hm_reply sends a client's SYN on to another host's backend, and notes
    // it in cb (which a redirect keeps).
    let out = p.run_on(Program::Reply, a, &packet(client, at(HOST_A, 30080), Some(TCP_SYN)));
    assert_eq!(out.retval, abi::TC_ACT_REDIRECT as u32);
    let note = cb_of(&out);
    assert_ne!(note[..2], [0, 0], "noted");
    // hm_direct at the egress it leaves by passes it untouched and takes
    // the note away (the packet may go on to programs and hosts after).
    let sent = out.data.clone();
    let out = p.run_with(Program::Direct, b, note, &sent);
    assert_eq!((out.retval as i32, &out.data), (abi::TC_ACT_UNSPEC, &sent));
    assert_eq!(cb_of(&out), [0; 5], "the note is gone");
    // It does not look: a local backend's reply, which it would translate,
    // goes untouched with the note, and is translated without it.
    p.run_on(Program::Reply, a, &packet(at(client.ip(), 40061), at(HOST_A, 30081), Some(TCP_SYN)));
    let reply = packet(at(HOST_A, 8081), at(client.ip(), 40061), Some(TCP_SYN | TCP_ACK));
    assert_eq!(p.run_with(Program::Direct, a, note, &reply).data, reply);
    assert_eq!(addresses(&p.run_on(Program::Direct, a, &reply).data).0, at(HOST_A, 30081));
    // A packet the veth path sends out is noted the same way.
    let syn = packet(at(HOST_B, 40062), at(Ipv4Addr::new(10, 96, 0, 10), 80), Some(TCP_SYN));
    let out = p.run_with(Program::NatOut, 1, [0; 5], &syn);
    assert_eq!((out.retval, cb_of(&out)[..2].to_vec()), (abi::TC_ACT_REDIRECT as u32, note[..2].to_vec()));
}

#[test]
fn a_host_connection_through_the_veth_path_from_a_port_of_the_range_keeps_its_replies() {
    // One port in the range; a socket of the host bound to it connects to
    // web's VIP through the veth path (connect_time_lb = "off").
    let host = at(HOST_B, 61000);
    let vip = at(Ipv4Addr::new(10, 96, 0, 10), 80);
    let backend = at(REMOTE, 8080);
    let client = Ipv4Addr::new(192, 0, 2, 1);
    let mut p = Probes::with_host(&config("61000-61000"), two_interfaces);
    let (a, b) = (ifindex(CLIENT_SIDE), ifindex(BACKEND_SIDE));
    let out = p.run(Program::NatOut, &packet(host, vip, Some(TCP_SYN)));
    assert_eq!(addresses(&out.data), (host, backend));
    // A client on another machine, to web's node port: the one port is
    // the host connection's, so no flow takes it.
    let out = p.run_on(Program::Reply, a, &packet(at(client, 40050), at(HOST_A, 30080), Some(TCP_SYN)));
    assert_eq!(out.retval as i32, abi::TC_ACT_SHOT, "the veth path's connection keeps its port");
    assert!(p.nat().is_empty());
    let out = p.run_on(Program::Reply, b, &packet(backend, host, Some(TCP_SYN | TCP_ACK)));
    assert_eq!((out.retval as i32, addresses(&out.data)), (abi::TC_ACT_UNSPEC, (vip, host)), "its reply, from the VIP");

    // The other order: a flow from the network holds the port, then the
    // host's socket connects from it. The host's connection wins.
    let mut p = Probes::with_host(&config("61000-61000"), two_interfaces);
    let (a, b) = (ifindex(CLIENT_SIDE), ifindex(BACKEND_SIDE));
    let out = p.run_on(Program::Reply, a, &packet(at(client, 40051), at(HOST_A, 30080), Some(TCP_SYN)));
    assert_eq!(addresses(&out.data), (host, backend));
    assert_eq!(p.nat().len(), 2);
    p.run(Program::NatOut, &packet(host, vip, Some(TCP_SYN)));
    assert!(p.nat().is_empty(), "the flow from the network is forgotten");
    let out = p.run_on(Program::Reply, b, &packet(backend, host, Some(TCP_SYN | TCP_ACK)));
    assert_eq!((out.retval as i32, addresses(&out.data)), (abi::TC_ACT_UNSPEC, (vip, host)), "its reply, from the VIP");
}

#[test]
fn the_flows_of_a_backend_that_left_its_service_are_forgotten_and_no_others() {
    use crate::backends::{BpfBackend, StoppedBackend};
    use crate::config::Protocol;
    let mut p = Probes::with_host(&config("61000-65535"), two_interfaces);
    let a = ifindex(CLIENT_SIDE);
    let client = Ipv4Addr::new(192, 0, 2, 1);
    // A UDP flow through the node port of "dns", and a TCP one of "web"
    // to another port of the same backend address.
    p.run_on(Program::Reply, a, &packet(at(client, 40040), at(HOST_A, 30053), None));
    p.run_on(Program::Reply, a, &packet(at(client, 40041), at(HOST_A, 30080), Some(TCP_SYN)));
    assert_eq!(p.nat().len(), 4);
    let stopped =
        StoppedBackend { vip: "10.96.0.12:53".parse().unwrap(), protocol: Protocol::Udp, backend: at(REMOTE, 5353) };
    let forgotten = p.bpf.drop_flows(&[stopped]).unwrap();
    assert_eq!(forgotten.flow_entries, 2, "both entries of the UDP flow");
    let left = p.nat();
    assert_eq!(left.len(), 2, "web's flow stays: {left:?}");
    assert!(left.iter().all(|(k, _)| k.proto == 6));
}

#[test]
fn an_icmp_error_about_a_flow_to_another_host_goes_on_to_the_client_quoting_what_it_sent() {
    let mut p = Probes::with_host(&config("61000-65535"), two_interfaces);
    let a = ifindex(CLIENT_SIDE);
    let b = ifindex(BACKEND_SIDE);
    let client_ip = Ipv4Addr::new(192, 0, 2, 1);
    let (client, node_port) = (at(client_ip, 40050), at(HOST_A, 30080));
    let sent = p.run_on(Program::Reply, a, &packet(client, node_port, Some(TCP_SYN))).data;
    // Fragmentation needed (next hop MTU 1280) from a router on the way to
    // the backend, to this host's address, quoting what it was sent.
    let router = Ipv4Addr::new(198, 51, 100, 1);
    let error = icmp4(router, HOST_B, [3, 4], [0, 0, 0x05, 0x00], &sent[14..]);
    let out = p.run_on(Program::Reply, b, &error);
    assert_eq!(out.retval, abi::TC_ACT_REDIRECT as u32, "forwarded to the client");
    let ip = &out.data[14..34];
    assert_eq!(checksum(ip, 0), 0, "outer IPv4 header checksum");
    assert_eq!((&ip[12..16], &ip[16..20]), (&router.octets()[..], &client_ip.octets()[..]), "router -> client");
    assert_eq!(quoted4(&out.data), (client, node_port), "the quote is what the client sent");
    assert_eq!(out.data[34..36], [3, 4], "type and code unchanged");
    assert_eq!(out.data[38..42], [0, 0, 0x05, 0x00], "the MTU unchanged");

    // IPv6: packet too big about a UDP flow.
    let client6 = at(Ipv6Addr::new(0x2001, 0xdb8, 0xa, 0, 0, 0, 0, 1), 40051);
    let sent = p.run_on(Program::Reply, a, &packet6(client6, at(HOST_A6, 30053))).data;
    let router6 = Ipv6Addr::new(0x2001, 0xdb8, 0xb, 0, 0, 0, 0, 1);
    let mut icmp = vec![2, 0, 0, 0, 0, 0, 0x05, 0x00];
    icmp.extend(&sent[14..62]);
    let out = p.run_on(Program::Reply, b, &icmp6(router6, at(HOST_B6, 0), icmp));
    assert_eq!(out.retval, abi::TC_ACT_REDIRECT as u32, "IPv6: forwarded to the client");
    let IpAddr::V6(client6_ip) = client6.ip() else { unreachable!() };
    assert_eq!(&out.data[38..54], &client6_ip.octets(), "IPv6: to the client");
    let icmp = &out.data[54..];
    assert_eq!(checksum(icmp, pseudo6_of(router6, client6_ip, 58, icmp.len())), 0, "ICMPv6 checksum");
    assert_eq!(&icmp[8 + 8..8 + 24], &client6_ip.octets(), "the quote's source: the client");
    assert_eq!(&icmp[8 + 24..8 + 40], &HOST_A6.octets(), "the quote's destination: the node port's address");
    let port = |at: usize| u16::from_be_bytes([icmp[at], icmp[at + 1]]);
    assert_eq!((port(48), port(50)), (40051, 30053), "the quote's ports");
}

impl Probes {
    /// The bytes the metrics read for `backend` (every service, every
    /// CPU): to it, from it.
    fn bytes_of(&self, backend: SocketAddr) -> (u64, u64) {
        let reader = crate::backends::bpf::traffic::TrafficReader::new(&self.dir.path().join("bpf"));
        reader
            .read()
            .unwrap()
            .iter()
            .filter(|t| t.backend == backend)
            .fold((0, 0), |(to, from), t| (to + t.stats.bytes_to, from + t.stats.bytes_from))
    }
}

/// A TCP flow from a client to the node port of "web" (another host's
/// backend), answered: the backend's side of it, and the bytes each way.
struct Flow {
    client: SocketAddr,
    translated: (SocketAddr, SocketAddr),
    to: u64,
    from: u64,
}

impl Flow {
    fn open(p: &mut Probes, client_port: u16) -> Flow {
        let client = at(Ipv4Addr::new(192, 0, 2, 1), client_port);
        let mut flow = Flow { client, translated: (client, client), to: 0, from: 0 };
        let out = flow.send(p, Some(TCP_SYN));
        flow.translated = addresses(&out.data);
        flow.answer(p, TCP_SYN | TCP_ACK);
        flow
    }

    /// The client's segment `flags` (or a datagram), through hm_reply.
    fn send(&mut self, p: &mut Probes, flags: Option<u8>) -> sys::TestRun {
        let sent = packet(self.client, at(HOST_A, 30080), flags);
        let out = p.run_on(Program::Reply, ifindex(CLIENT_SIDE), &sent);
        assert_eq!(out.retval, abi::TC_ACT_REDIRECT as u32, "the client's {flags:?} forwarded");
        self.to += sent.len() as u64;
        out
    }

    /// The backend's segment `flags`, through hm_reply.
    fn answer(&mut self, p: &mut Probes, flags: u8) {
        let (src, dst) = self.translated;
        let sent = packet(dst, src, Some(flags));
        let out = p.run_on(Program::Reply, ifindex(BACKEND_SIDE), &sent);
        assert_eq!(out.retval, abi::TC_ACT_REDIRECT as u32, "the backend's {flags:#x} forwarded");
        self.from += sent.len() as u64;
    }
}

#[test]
fn every_byte_of_a_flow_from_the_network_is_counted_for_its_backend() {
    let mut p = Probes::with_host(&config("61000-65535"), two_interfaces);
    let backend = at(REMOTE, 8080);
    // A flow reset by the client, one closed with a FIN each way: every
    // byte each way is counted.
    for (port, ending) in [(40200u16, "reset"), (40201, "closed")] {
        let before = p.bytes_of(backend);
        let mut flow = Flow::open(&mut p, port);
        for _ in 0..4 {
            flow.send(&mut p, Some(TCP_ACK));
            flow.answer(&mut p, TCP_ACK);
        }
        if ending == "reset" {
            flow.send(&mut p, Some(TCP_RST | TCP_ACK));
        } else {
            flow.send(&mut p, Some(TCP_FIN | TCP_ACK));
            flow.answer(&mut p, TCP_FIN | TCP_ACK);
            flow.send(&mut p, Some(TCP_ACK));
        }
        assert_eq!(p.bytes_of(backend), (before.0 + flow.to, before.1 + flow.from), "{ending}");
    }
    // UDP: each datagram as it passes.
    let dns = at(REMOTE, 5353);
    let before = p.bytes_of(dns);
    let sent = packet(at(Ipv4Addr::new(192, 0, 2, 1), 40203), at(HOST_A, 30053), None);
    for n in 1..=3u64 {
        p.run_on(Program::Reply, ifindex(CLIENT_SIDE), &sent);
        assert_eq!(p.bytes_of(dns), (before.0 + n * sent.len() as u64, before.1), "datagram {n}");
    }
}
