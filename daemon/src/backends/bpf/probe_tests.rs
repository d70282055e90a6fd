//! The probes' logic on crafted packets, as Cilium's `bpf/tests` do: the
//! programs this build carries run once per packet (BPF_PROG_TEST_RUN)
//! against maps the loader made and the reconciler's own map entries for a
//! compiled configuration. A new flow's backend is the one the Rust model
//! (Maglev table and flow hash) predicts, a reply is translated back, a
//! closed flow moves to the closed ones, an ICMP error about a flow quotes
//! the VIP again, a packet of no flow passes untouched, a VIP nobody
//! serves refuses (a RST, an ICMP port unreachable), and `sk_lookup`
//! hands a mesh VIP to its sidecar's listener.
//!
//! They need root (loading programs, a bpffs of their own under a temp
//! dir) and take milliseconds. Each runs on a thread of its own in a fresh
//! network namespace (the programs' FIB lookups see only its loopback, up
//! and forwarding), which goes with the thread.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::{AsFd, AsRawFd};

use super::pins::PinDir;
use super::{sys, PinnedBpf};
use crate::abi::{self, HmMap, Pod, ProbeObject};
use crate::backends::BpfBackend;
use crate::model::{flow_hash::flow_hash, maglev, Desired, HostFacts, Prior, Program};
use crate::table_size;

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const CLIENT: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
/// Local addresses, so the FIB hands a translated packet to the stack
/// (TC_ACT_OK) on any host, whatever its routes.
const BACKENDS: [&str; 3] = ["127.0.0.11:8080", "127.0.0.12:8080", "127.0.0.13:8080"];
const TABLE: u32 = 251;

/// The probes loaded with maps pinned in a bpffs of the test's own,
/// removed (and unmounted) on drop.
struct Probes {
    bpf: PinnedBpf,
    dir: tempfile::TempDir,
}

impl Probes {
    /// Loads the probes and writes the map entries `config` compiles to.
    fn with(config: &str) -> Probes {
        Probes::with_host(config, |_| {})
    }

    /// `with`, after `host` has set up the test's namespace (links,
    /// addresses, routes) and the facts compile sees of it.
    fn with_host(config: &str, host: impl FnOnce(&mut HostFacts)) -> Probes {
        assert!(nix::unistd::geteuid().is_root(), "the probe tests load BPF programs: run them as root");
        own_netns();
        let dir = tempfile::tempdir().unwrap();
        let pins = dir.path().join("bpf");
        PinDir::new(&pins).prepare().unwrap();
        super::raise_memlock_limit();
        let features = super::features::probe().unwrap();
        let mut bpf = PinnedBpf::new(&pins, features.clone());
        let mut facts =
            HostFacts { interfaces: ["lo".to_string()].into(), netns_cookie: 1, features, ..Default::default() };
        host(&mut facts);
        let desired: Desired = crate::model::compile(&crate::config::from_text(config), &facts, &Prior::default());
        assert!(desired.warnings.is_empty(), "{:?}", desired.warnings);
        for (k, v) in &desired.map_entries {
            bpf.put_map_entry(k, &v.spec.bytes().unwrap()).unwrap();
        }
        Probes { bpf, dir }
    }

    fn run(&mut self, program: Program, packet: &[u8]) -> sys::TestRun {
        let prog = super::load::program_fd(&mut self.bpf.maps, program).unwrap();
        sys::prog_test_run(prog.as_fd(), packet, &[]).unwrap()
    }

    /// `run` as if the packet were on the interface `ifindex`: the
    /// `__sk_buff` given holds only that (its 11th word), at its full size
    /// (the kernel writes it back whole, and fails if it has no room).
    fn run_on(&mut self, program: Program, ifindex: u32, packet: &[u8]) -> sys::TestRun {
        self.run_with(program, ifindex, [0; 5], packet)
    }

    /// `run_on` with the `__sk_buff`'s `cb` words as given (what a program
    /// before, on the packet's way, left there).
    fn run_with(&mut self, program: Program, ifindex: u32, cb: [u32; 5], packet: &[u8]) -> sys::TestRun {
        let prog = super::load::program_fd(&mut self.bpf.maps, program).unwrap();
        let mut ctx = [0u8; 192];
        ctx[40..44].copy_from_slice(&ifindex.to_ne_bytes());
        for (i, word) in cb.iter().enumerate() {
            ctx[CB + 4 * i..CB + 4 * i + 4].copy_from_slice(&word.to_ne_bytes());
        }
        sys::prog_test_run(prog.as_fd(), packet, &ctx).unwrap()
    }
}

/// Where `__sk_buff`'s `cb` words start.
const CB: usize = 48;

/// The `cb` words of a test run's context as the program left them.
fn cb_of(run: &sys::TestRun) -> [u32; 5] {
    std::array::from_fn(|i| u32::from_ne_bytes(run.ctx[CB + 4 * i..CB + 4 * i + 4].try_into().unwrap()))
}

impl Probes {
    /// Every (key, value) of a map, as bytes.
    fn entries(&mut self, map: HmMap) -> Vec<(Vec<u8>, Vec<u8>)> {
        let fd = self.bpf.maps.map_fd(map).unwrap();
        let def = map.def();
        sys::map_dump(fd.as_fd(), def.key_size as usize, def.value_size as usize).unwrap()
    }

    /// Every (key, value) of a conntrack map.
    fn conntrack(&mut self, map: HmMap) -> Vec<(abi::CtKey, abi::CtValue)> {
        self.entries(map)
            .into_iter()
            .map(|(k, v)| (abi::CtKey::from_bytes(&k).unwrap(), abi::CtValue::from_bytes(&v).unwrap()))
            .collect()
    }
}

impl Drop for Probes {
    fn drop(&mut self) {
        let _ = self.bpf.remove_all();
    }
}

/// Moves the calling thread into a new network namespace with its
/// loopback up and forwarding (what the veth path's hm-natout has).
fn own_netns() {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
    crate::backends::NetBackend::set_link_up(&mut crate::backends::netlink::Rtnetlink::open().unwrap(), "lo").unwrap();
    let mut sysctl = crate::backends::sysctl::ProcSys::new();
    for family in ["ipv4", "ipv6"] {
        crate::backends::SysctlBackend::set(&mut sysctl, &format!("net/{family}/conf/lo/forwarding"), "1").unwrap();
    }
}

fn service(proto: &str) -> String {
    let backends: Vec<String> = BACKENDS.iter().map(|b| format!("\"{b}\"")).collect();
    format!(
        "[daemon]\nconnect_time_lb = \"off\"\nhost_interfaces = [\"lo\"]\n[[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = 80\nprotocol = \
         \"{proto}\"\nmaglev_table_size = {TABLE}\nbackends = [{}]\n",
        backends.join(", ")
    )
}

/// The backend the Rust model gives a flow: Maglev's table for the
/// service's backends, at the slot of the flow's hash.
fn modelled_backend(sport: u16, proto: u8) -> SocketAddr {
    let entries: Vec<maglev::Entry> =
        BACKENDS.iter().map(|b| maglev::Entry { addr: b.parse().unwrap(), weight: 1 }).collect();
    let size = table_size::resolve(Some(TABLE), None, entries.len());
    let table = maglev::build(&entries, size);
    let slot = flow_hash(IpAddr::V4(CLIENT), IpAddr::V4(VIP), sport, 80, proto) % size;
    entries[table[slot as usize] as usize].addr
}

const TCP_FIN: u8 = 0x01;
const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
const TCP_ACK: u8 = 0x10;

/// An Ethernet frame with an IPv4 packet carrying a TCP segment (`flags`)
/// or a UDP datagram, checksums valid.
fn packet(src: SocketAddr, dst: SocketAddr, tcp_flags: Option<u8>) -> Vec<u8> {
    let (IpAddr::V4(s), IpAddr::V4(d)) = (src.ip(), dst.ip()) else { panic!("IPv4 only") };
    let payload = b"hello\n";
    let mut l4 = Vec::new();
    l4.extend(src.port().to_be_bytes());
    l4.extend(dst.port().to_be_bytes());
    let proto = match tcp_flags {
        Some(flags) => {
            l4.extend(1000u32.to_be_bytes()); // seq
            l4.extend(0u32.to_be_bytes()); // ack
            l4.extend([5 << 4, flags]);
            l4.extend(64240u16.to_be_bytes()); // window
            l4.extend([0, 0, 0, 0]); // checksum, urgent
            6u8
        }
        None => {
            l4.extend(((8 + payload.len()) as u16).to_be_bytes());
            l4.extend([0, 0]);
            17u8
        }
    };
    l4.extend(payload);
    let mut ip = vec![0x45, 0];
    ip.extend(((20 + l4.len()) as u16).to_be_bytes());
    ip.extend([0, 1, 0x40, 0, 64, proto, 0, 0]);
    ip.extend(s.octets());
    ip.extend(d.octets());
    let sum = checksum(&ip, 0);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    let at = if proto == 6 { 16 } else { 6 };
    let sum = checksum(&l4, pseudo(s, d, proto, l4.len()));
    l4[at..at + 2].copy_from_slice(&sum.to_be_bytes());
    let mut frame = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2, 0x08, 0x00];
    frame.extend(ip);
    frame.extend(l4);
    frame
}

fn pseudo(s: Ipv4Addr, d: Ipv4Addr, proto: u8, len: usize) -> u32 {
    let mut b = Vec::new();
    b.extend(s.octets());
    b.extend(d.octets());
    b.extend([0, proto]);
    b.extend((len as u16).to_be_bytes());
    b.chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum()
}

/// The Internet checksum of `bytes`, starting from `sum`.
fn checksum(bytes: &[u8], mut sum: u32) -> u16 {
    for w in bytes.chunks(2) {
        sum += u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// (source, destination) of a frame built by `packet`, checking both
/// checksums are still valid.
fn addresses(frame: &[u8]) -> (SocketAddr, SocketAddr) {
    let ip = &frame[14..34];
    assert_eq!(checksum(ip, 0), 0, "IPv4 header checksum");
    let (s, d) = (Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]), Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]));
    let l4 = &frame[34..];
    assert_eq!(checksum(l4, pseudo(s, d, ip[9], l4.len())), 0, "L4 checksum after translation");
    let port = |at: usize| u16::from_be_bytes([l4[at], l4[at + 1]]);
    (SocketAddr::new(s.into(), port(0)), SocketAddr::new(d.into(), port(2)))
}

fn client(sport: u16) -> SocketAddr {
    SocketAddr::new(CLIENT.into(), sport)
}

fn vip() -> SocketAddr {
    SocketAddr::new(VIP.into(), 80)
}

#[test]
fn natout_sends_each_new_flow_to_the_backend_the_rust_maglev_model_picks() {
    let mut p = Probes::with(&service("tcp"));
    let mut seen = std::collections::BTreeSet::new();
    for sport in 40000..40064 {
        let out = p.run(Program::NatOut, &packet(client(sport), vip(), Some(TCP_SYN)));
        assert_eq!(out.retval, abi::TC_ACT_OK as u32, "a local backend: the stack delivers it");
        let (src, dst) = addresses(&out.data);
        assert_eq!(src, client(sport), "the source is kept");
        assert_eq!(dst, modelled_backend(sport, 6), "port {sport}: the probe and the Rust model disagree");
        seen.insert(dst);
    }
    assert_eq!(seen.len(), BACKENDS.len(), "64 flows reach every backend: {seen:?}");
    // Each flow is tracked both ways: client -> VIP, backend -> client.
    assert_eq!(p.conntrack(HmMap::Ct).len(), 2 * 64);
    // UDP the same.
    let mut p = Probes::with(&service("udp"));
    for sport in 50000..50016 {
        let out = p.run(Program::NatOut, &packet(client(sport), vip(), None));
        assert_eq!(addresses(&out.data).1, modelled_backend(sport, 17), "UDP, port {sport}");
    }
}

#[test]
fn a_lone_backend_s_table_of_one_slot_takes_every_flow() {
    // No maglev_table_size: one backend gets the automatic one-slot table.
    let config = format!(
        "[daemon]\nconnect_time_lb = \"off\"\nhost_interfaces = [\"lo\"]\n[[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = \
         80\nbackends = [\"{}\"]\n",
        BACKENDS[1]
    );
    let mut p = Probes::with(&config);
    let svc = p.entries(HmMap::Services);
    assert_eq!(svc.len(), 1);
    assert_eq!(abi::SvcValue::from_bytes(&svc[0].1).unwrap().table_size, table_size::ONE_BACKEND_TABLE_SIZE);
    assert_eq!(p.entries(HmMap::Maglev).len(), 1, "one chunk");
    for sport in 42000..42032 {
        let out = p.run(Program::NatOut, &packet(client(sport), vip(), Some(TCP_SYN)));
        assert_eq!(out.retval, abi::TC_ACT_OK as u32);
        assert_eq!(addresses(&out.data).1, BACKENDS[1].parse().unwrap(), "port {sport}");
    }
}

#[test]
fn a_reply_gets_the_vip_back_and_a_closed_flow_moves_to_the_closed_ones() {
    let mut p = Probes::with(&service("tcp"));
    let sport = 41000;
    let backend = addresses(&p.run(Program::NatOut, &packet(client(sport), vip(), Some(TCP_SYN))).data).1;
    // The SYN-ACK from the backend, on a host interface: the VIP again,
    // and classification goes on (TC_ACT_UNSPEC).
    let out = p.run(Program::Reply, &packet(backend, client(sport), Some(TCP_SYN | TCP_ACK)));
    assert_eq!(out.retval as i32, abi::TC_ACT_UNSPEC);
    assert_eq!(addresses(&out.data), (vip(), client(sport)), "the reply comes from the VIP");
    // A FIN each way closes it: its entries leave the open flows.
    let fin = p.run(Program::NatOut, &packet(client(sport), vip(), Some(TCP_FIN | TCP_ACK)));
    assert_eq!(addresses(&fin.data).1, backend, "a known flow keeps its backend");
    p.run(Program::Reply, &packet(backend, client(sport), Some(TCP_FIN | TCP_ACK)));
    assert_eq!(p.conntrack(HmMap::Ct), vec![], "no open flow left");
    let closed = p.conntrack(HmMap::CtClosing);
    assert_eq!(closed.len(), 2, "{closed:?}");
    assert!(closed.iter().all(|(_, v)| v.flags & abi::CT_F_CLOSING != 0), "{closed:?}");
}

#[test]
fn a_reset_flow_is_forgotten_at_once_and_what_a_late_packet_of_it_opens_lives_until_answered_or_2_s() {
    let mut p = Probes::with(&service("tcp"));
    let open = |p: &mut Probes, sport: u16| {
        let backend = addresses(&p.run(Program::NatOut, &packet(client(sport), vip(), Some(TCP_SYN))).data).1;
        p.run(Program::Reply, &packet(backend, client(sport), Some(TCP_SYN | TCP_ACK)));
        backend
    };
    let sport = 41100;
    let backend = open(&mut p, sport);
    // The client's RST ends the flow: nothing of it is left, open or closed.
    p.run(Program::NatOut, &packet(client(sport), vip(), Some(TCP_RST | TCP_ACK)));
    assert_eq!(p.conntrack(HmMap::Ct), vec![], "no open flow left");
    assert_eq!(p.conntrack(HmMap::CtClosing), vec![], "nor a closed one");
    // An ACK the client sent before its RST, reaching the veth after it
    // (from another CPU): the flow's backend again, in a flow picked up
    // mid-stream, which the backend has not answered yet.
    let out = p.run(Program::NatOut, &packet(client(sport), vip(), Some(TCP_ACK)));
    assert_eq!(addresses(&out.data).1, backend);
    let picked = p.conntrack(HmMap::Ct);
    assert_eq!(picked.len(), 2, "{picked:?}");
    assert!(picked.iter().all(|(_, v)| v.flags == abi::CT_F_PICKUP), "{picked:?}");
    // The reset backend answers it with a RST: the flow is forgotten again.
    let out = p.run(Program::Reply, &packet(backend, client(sport), Some(TCP_RST | TCP_ACK)));
    assert_eq!(addresses(&out.data), (vip(), client(sport)), "the RST comes from the VIP");
    assert_eq!(p.conntrack(HmMap::Ct), vec![], "the backend's RST ended it");

    // Or the backend never answers (it took the ACK before the RST): after
    // 2 s the flow is no more, for the probes and for the daemon's sweep.
    p.run(Program::NatOut, &packet(client(sport), vip(), Some(TCP_ACK)));
    let fd = p.bpf.maps.map_fd(HmMap::Ct).unwrap().as_fd().try_clone_to_owned().unwrap();
    let now = super::conntrack::now_ns();
    let second = 1_000_000_000;
    assert_eq!(super::conntrack::expire(fd.as_fd(), None, now + second).unwrap(), (0, 2), "kept 1 s later");
    for (k, mut v) in p.conntrack(HmMap::Ct) {
        // (The probes' clock is coarse: a tick behind this one at most.)
        v.last_seen_ns = now - abi::CT_PICKUP_TIMEOUT_S * second - second / 10;
        sys::map_update(fd.as_fd(), &k.to_bytes(), &v.to_bytes()).unwrap();
    }
    let late = packet(backend, client(sport), Some(TCP_ACK));
    let out = p.run(Program::Reply, &late);
    assert_eq!((out.retval as i32, &out.data), (abi::TC_ACT_UNSPEC, &late), "an expired flow translates nothing");
    assert_eq!(p.conntrack(HmMap::Ct), vec![], "and is forgotten");
    // The daemon's sweep agrees: such a flow is gone 2 s after its packet.
    p.run(Program::NatOut, &packet(client(41103), vip(), Some(TCP_ACK)));
    let later = super::conntrack::now_ns() + abi::CT_PICKUP_TIMEOUT_S * second;
    assert_eq!(super::conntrack::expire(fd.as_fd(), None, later).unwrap(), (2, 0), "swept 2 s later");

    // A flow picked up mid-stream whose backend answers lives on as any
    // established one (a flow conntrack lost: evicted from a full map).
    let sport = 41101;
    let out = p.run(Program::NatOut, &packet(client(sport), vip(), Some(TCP_ACK)));
    let backend = addresses(&out.data).1;
    assert_eq!(backend, modelled_backend(sport, 6), "the table's backend, as a SYN would have had");
    p.run(Program::Reply, &packet(backend, client(sport), Some(TCP_ACK)));
    let now = super::conntrack::now_ns();
    assert_eq!(
        super::conntrack::expire(fd.as_fd(), None, now + abi::CT_SYN_TIMEOUT_S * second).unwrap(),
        (0, 2),
        "answered: the TCP timeout applies"
    );
    assert!(p.conntrack(HmMap::Ct).iter().all(|(_, v)| v.flags & abi::CT_F_REPLIED != 0));

    // A SYN on a tuple starts a new flow, not a picked-up one.
    open(&mut p, 41102);
    let flows = p.conntrack(HmMap::Ct);
    assert_eq!(flows.len(), 4, "{flows:?}");
    assert_eq!(flows.iter().filter(|(_, v)| v.flags & abi::CT_F_PICKUP != 0).count(), 2, "{flows:?}");
}

#[test]
fn packets_of_no_flow_pass_untouched_and_a_syn_nobody_serves_is_refused() {
    let mut p = Probes::with(&service("tcp"));
    // A reply no flow knows: left alone for the stack and other programs.
    let stray = packet("127.0.0.11:8080".parse().unwrap(), client(42000), Some(TCP_SYN | TCP_ACK));
    let out = p.run(Program::Reply, &stray);
    assert_eq!((out.retval as i32, &out.data), (abi::TC_ACT_UNSPEC, &stray));
    // Not IP at all (an ARP request): hm_natout passes it.
    let mut arp = vec![0xff; 6];
    arp.extend([0x02, 0, 0, 0, 0, 1, 0x08, 0x06]);
    arp.extend([0u8; 28]);
    let out = p.run(Program::NatOut, &arp);
    assert_eq!((out.retval, &out.data), (abi::TC_ACT_OK as u32, &arp));
    // A SYN to a VIP:port with no service is answered with a RST.
    let other = SocketAddr::new(VIP.into(), 81);
    let out = p.run(Program::NatOut, &packet(client(42001), other, Some(TCP_SYN)));
    assert_eq!(out.retval, abi::TC_ACT_REDIRECT as u32, "sent back where it came from");
    assert_eq!(addresses(&out.data), (other, client(42001)), "a RST from the VIP");
    assert_eq!(out.data[34 + 13] & 0x04, 0x04, "RST set");
}

#[test]
fn a_udp_datagram_nobody_serves_is_answered_with_a_port_unreachable_from_the_vip() {
    // A service with no backends, and a port of the VIP with no service.
    let mut p = Probes::with(&format!(
        "[daemon]\nconnect_time_lb = \"off\"\nhost_interfaces = [\"lo\"]\n[[service]]\nname = \"dns\"\nvip = \"{VIP}\"\n\
         port = 53\nprotocol = \"udp\"\n[[service]]\nname = \"dns6\"\nvip = \"fd00:96::10\"\nport = 53\nprotocol = \"udp\"\n"
    ));
    for port in [53, 54] {
        let sent = packet(client(46000), SocketAddr::new(VIP.into(), port), None);
        let out = p.run(Program::NatOut, &sent);
        assert_eq!(out.retval, abi::TC_ACT_REDIRECT as u32, "port {port}: sent back where it came from");
        let f = &out.data;
        assert_eq!(f.len(), 14 + 20 + 8 + 28, "port {port}: headers and the quote, nothing more");
        assert_eq!((&f[..6], &f[6..12], &f[12..14]), (&sent[6..12], &sent[..6], &sent[12..14]), "MACs swapped");
        let ip = &f[14..34];
        assert_eq!(checksum(ip, 0), 0, "IPv4 header checksum");
        assert_eq!((ip[0], ip[9]), (0x45, 1), "IPv4, ICMP");
        assert_eq!(u16::from_be_bytes([ip[2], ip[3]]), 56, "total length");
        assert_eq!((&ip[12..16], &ip[16..20]), (&VIP.octets()[..], &CLIENT.octets()[..]), "from the VIP to the client");
        assert_eq!(&f[34..36], &[3, 3], "destination unreachable: port unreachable");
        assert_eq!(quoted4(f), (client(46000), SocketAddr::new(VIP.into(), port)), "quotes the datagram");
        assert_eq!(&f[42..70], &sent[14..42], "the quote is the datagram's IP header and UDP header");
    }
    assert_eq!(p.conntrack(HmMap::Ct), vec![], "nothing tracked");

    let vip6: SocketAddr = "[fd00:96::10]:53".parse().unwrap();
    let client6: SocketAddr = "[2001:db8::1]:46000".parse().unwrap();
    let sent = packet6(client6, vip6);
    let out = p.run(Program::NatOut, &sent);
    assert_eq!(out.retval, abi::TC_ACT_REDIRECT as u32, "IPv6: sent back where it came from");
    let f = &out.data;
    assert_eq!(f.len(), 14 + 40 + 8 + 48, "IPv6: headers and the quote, nothing more");
    assert_eq!((&f[..6], &f[6..12], &f[12..14]), (&sent[6..12], &sent[..6], &sent[12..14]), "MACs swapped");
    assert_eq!((f[14] >> 4, u16::from_be_bytes([f[18], f[19]]), f[20]), (6, 56, 58), "IPv6, payload 56, ICMPv6");
    let IpAddr::V6(vip_ip) = vip6.ip() else { unreachable!() };
    assert_eq!((&f[22..38], &f[38..54]), (&vip_ip.octets()[..], &sent[22..38]), "from the VIP to the client");
    let icmp = &f[54..];
    assert_eq!(checksum(icmp, pseudo6(vip_ip, client6, icmp.len())), 0, "ICMPv6 checksum");
    assert_eq!(&icmp[..2], &[1, 4], "destination unreachable: port unreachable");
    assert_eq!(&icmp[8..56], &sent[14..62], "the quote is the datagram's IPv6 header and UDP header");
}

#[test]
fn sk_lookup_hands_a_mesh_vip_to_its_sidecar_s_listener_and_passes_the_rest() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut p = Probes::with(&format!("[[mesh]]\nname = \"m\"\nvip = \"{VIP}\"\nport = 80\nredirect_port = {port}\n"));
    // The registrar's job, done by hand: the listener under its key.
    let key = abi::SockKey { port, family: abi::AF_INET, proto: 6 };
    let sockets = p.bpf.maps.map_fd(HmMap::MeshSockets).unwrap();
    sys::map_update(sockets.as_fd(), &key.to_bytes(), &u64::try_from(listener.as_raw_fd()).unwrap().to_ne_bytes())
        .unwrap();
    let cookie = crate::backends::sockopt::socket_cookie(listener.as_fd()).unwrap();

    let ctx = SkLookupCtx::from_btf();
    let prog = super::load::program_fd(&mut p.bpf.maps, Program::Mesh).unwrap();
    let lookup = |dst: Ipv4Addr, dport: u16| {
        let out = sys::prog_test_run(prog.as_fd(), &[], &ctx.build(dst, dport)).unwrap();
        assert_eq!(out.retval, abi::SK_PASS as u32);
        ctx.cookie(&out.ctx)
    };
    assert_eq!(lookup(VIP, 80), cookie, "the mesh VIP goes to the sidecar's listener");
    assert_eq!(lookup(VIP, 81), 0, "another port of the VIP: no socket chosen");
    assert_eq!(lookup(Ipv4Addr::new(10, 96, 0, 11), 80), 0, "another address: no socket chosen");
}

/// `struct bpf_sk_lookup` as the mesh object's BTF lays it out (the
/// kernel's UAPI, which no crate here binds).
struct SkLookupCtx {
    size: usize,
    family: usize,
    protocol: usize,
    local_ip4: usize,
    local_port: usize,
}

impl SkLookupCtx {
    fn from_btf() -> SkLookupCtx {
        let s = crate::abi::btf_struct(super::objects::bytes(ProbeObject::Mesh), "bpf_sk_lookup")
            .expect("bpf_sk_lookup in the mesh object's BTF");
        let at = |name: &str| s.members.iter().find(|m| m.name == name).map(|m| m.offset as usize).unwrap();
        // The socket's cookie: the union the struct starts with.
        assert!(s.members.iter().any(|m| m.offset == 0 && m.size == 8), "{:?}", s.members);
        SkLookupCtx {
            size: s.size as usize,
            family: at("family"),
            protocol: at("protocol"),
            local_ip4: at("local_ip4"),
            local_port: at("local_port"),
        }
    }

    fn build(&self, dst: Ipv4Addr, dport: u16) -> Vec<u8> {
        let mut b = vec![0u8; self.size];
        b[self.family..self.family + 4].copy_from_slice(&u32::from(abi::AF_INET).to_ne_bytes());
        b[self.protocol..self.protocol + 4].copy_from_slice(&6u32.to_ne_bytes());
        b[self.local_ip4..self.local_ip4 + 4].copy_from_slice(&dst.octets());
        b[self.local_port..self.local_port + 4].copy_from_slice(&u32::from(dport).to_ne_bytes());
        b
    }

    fn cookie(&self, out: &[u8]) -> u64 {
        u64::from_ne_bytes(out[..8].try_into().unwrap())
    }
}

#[test]
fn the_programs_load_while_signals_keep_arriving() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    // The daemon's threads take signals (SIGHUP, SIGTERM, SIGCHLD from
    // exec checks); one that arrives while the verifier runs makes
    // BPF_PROG_LOAD fail with EAGAIN. A handler, as the daemon has, and a
    // signal at this thread every 100 µs while it loads every object.
    signal_hook::flag::register(libc::SIGUSR1, Arc::new(AtomicBool::new(false))).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    // SAFETY: pthread_self has no preconditions.
    let me = unsafe { libc::pthread_self() } as usize;
    let killer = {
        let done = Arc::clone(&done);
        std::thread::spawn(move || {
            let mut sent = 0u32;
            while !done.load(Ordering::Relaxed) {
                // SAFETY: the target thread outlives this loop (it joins
                // this thread before it returns).
                unsafe { libc::pthread_kill(me as libc::pthread_t, libc::SIGUSR1) };
                sent += 1;
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
            sent
        })
    };
    let loaded = std::panic::catch_unwind(|| Probes::with(&service("tcp")));
    done.store(true, Ordering::Relaxed);
    let sent = killer.join().unwrap();
    assert!(sent > 10, "only {sent} signals sent");
    let mut p = loaded.unwrap_or_else(|_| panic!("loading failed with {sent} signals arriving"));
    let out = p.run(Program::NatOut, &packet(client(43000), vip(), Some(TCP_SYN)));
    assert_eq!(out.retval, abi::TC_ACT_OK as u32);
}

/// An ICMP error from `from` to `to` (type, code, 4 bytes of rest) quoting
/// the first 28 bytes of `quoted` (an IPv4 packet), checksum valid.
fn icmp4(from: Ipv4Addr, to: Ipv4Addr, type_code: [u8; 2], rest: [u8; 4], quoted: &[u8]) -> Vec<u8> {
    let mut icmp = vec![type_code[0], type_code[1], 0, 0];
    icmp.extend(rest);
    icmp.extend(&quoted[..28]);
    let sum = checksum(&icmp, 0);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    let mut ip = vec![0x45, 0];
    ip.extend(((20 + icmp.len()) as u16).to_be_bytes());
    ip.extend([0, 2, 0, 0, 64, 1, 0, 0]);
    ip.extend(from.octets());
    ip.extend(to.octets());
    let sum = checksum(&ip, 0);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    let mut frame = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2, 0x08, 0x00];
    frame.extend(ip);
    frame.extend(icmp);
    frame
}

/// What an ICMP error (from `icmp4`) quotes: (source, destination), after
/// checking the ICMP checksum and the quoted header's.
fn quoted4(frame: &[u8]) -> (SocketAddr, SocketAddr) {
    let icmp = &frame[34..];
    assert_eq!(checksum(icmp, 0), 0, "ICMP checksum");
    let ip = &icmp[8..28];
    assert_eq!(checksum(ip, 0), 0, "the quoted IPv4 header's checksum");
    let addr = |at: usize| Ipv4Addr::new(ip[at], ip[at + 1], ip[at + 2], ip[at + 3]);
    let port = |at: usize| u16::from_be_bytes([icmp[28 + at], icmp[28 + at + 1]]);
    (SocketAddr::new(addr(12).into(), port(0)), SocketAddr::new(addr(16).into(), port(2)))
}

#[test]
fn icmp_errors_about_a_translated_flow_quote_the_vip_again() {
    let router = Ipv4Addr::new(192, 0, 2, 254);
    let IpAddr::V4(client_ip) = client(0).ip() else { unreachable!() };
    for (proto, tcp, type_code) in [("tcp", Some(TCP_SYN | TCP_ACK), [3, 4]), ("udp", None, [3, 3])] {
        let mut p = Probes::with(&service(proto));
        let sport = 44000;
        // The packet as hm_natout sent it on: client -> backend.
        let sent = p.run(Program::NatOut, &packet(client(sport), vip(), tcp)).data;
        let backend = addresses(&sent).1;
        // Fragmentation needed (next hop MTU 1280) or port unreachable,
        // from a router or the backend, quoting it.
        let error = icmp4(router, client_ip, type_code, [0, 0, 0x05, 0x00], &sent[14..]);
        let out = p.run(Program::Reply, &error);
        assert_eq!(out.retval as i32, abi::TC_ACT_UNSPEC, "{proto}: other filters still see it");
        assert_eq!(quoted4(&out.data), (client(sport), vip()), "{proto}: the quote is of the flow the socket knows");
        assert_eq!(out.data[..36], error[..36], "{proto}: outer header, type and code unchanged");
        assert_eq!(out.data[38..42], error[38..42], "{proto}: the MTU unchanged");
        assert_eq!(p.conntrack(HmMap::Ct).len(), 2, "{proto}: the flow is still there");
        // An error about a flow hostmesh does not know is left alone.
        let other = packet(client(sport + 1), backend, tcp);
        let stray = icmp4(router, client_ip, type_code, [0, 0, 0x05, 0x00], &other[14..]);
        let out = p.run(Program::Reply, &stray);
        assert_eq!((out.retval as i32, &out.data), (abi::TC_ACT_UNSPEC, &stray), "{proto}");
    }
}

#[test]
fn an_icmpv6_packet_too_big_about_a_translated_flow_quotes_the_vip_again() {
    let vip6: SocketAddr = "[fd00:96::10]:53".parse().unwrap();
    let client6: SocketAddr = "[2001:db8::1]:45000".parse().unwrap();
    let router: std::net::Ipv6Addr = "2001:db8::fe".parse().unwrap();
    let mut p = Probes::with(
        "[daemon]\nconnect_time_lb = \"off\"\nhost_interfaces = [\"lo\"]\n[[service]]\nname = \"dns6\"\n\
         vip = \"fd00:96::10\"\nport = 53\nprotocol = \"udp\"\nbackends = [\"[::1]:5353\"]\n",
    );
    let sent = p.run(Program::NatOut, &packet6(client6, vip6)).data;
    assert_eq!(&sent[38..54], &std::net::Ipv6Addr::LOCALHOST.octets(), "sent to the backend");
    // Packet too big (MTU 1280), quoting the first 48 bytes of what was sent.
    let mut icmp = vec![2, 0, 0, 0, 0, 0, 0x05, 0x00];
    icmp.extend(&sent[14..62]);
    let out = p.run(Program::Reply, &icmp6(router, client6, icmp));
    assert_eq!(out.retval as i32, abi::TC_ACT_UNSPEC);
    let icmp = &out.data[54..];
    assert_eq!(checksum(icmp, pseudo6(router, client6, icmp.len())), 0, "ICMPv6 checksum");
    assert_eq!(&icmp[8 + 24..8 + 40], &vip6.ip().to_string().parse::<std::net::Ipv6Addr>().unwrap().octets());
    assert_eq!(u16::from_be_bytes([icmp[50], icmp[51]]), 53, "the VIP's port");
    assert_eq!(&icmp[8 + 8..8 + 24], &"2001:db8::1".parse::<std::net::Ipv6Addr>().unwrap().octets());
}

/// An Ethernet frame with an IPv6 UDP datagram, checksum valid.
fn packet6(src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
    let (IpAddr::V6(s), IpAddr::V6(d)) = (src.ip(), dst.ip()) else { panic!("IPv6 only") };
    let mut udp = Vec::new();
    udp.extend(src.port().to_be_bytes());
    udp.extend(dst.port().to_be_bytes());
    udp.extend(14u16.to_be_bytes());
    udp.extend([0, 0]);
    udp.extend(b"hello\n");
    let sum = checksum(&udp, pseudo6_of(s, d, 17, udp.len()));
    udp[6..8].copy_from_slice(&sum.to_be_bytes());
    frame6(s, d, 17, udp)
}

/// An Ethernet frame with an ICMPv6 message from `from` to `to`'s address.
fn icmp6(from: std::net::Ipv6Addr, to: SocketAddr, mut icmp: Vec<u8>) -> Vec<u8> {
    let IpAddr::V6(d) = to.ip() else { panic!("IPv6 only") };
    let sum = checksum(&icmp, pseudo6_of(from, d, 58, icmp.len()));
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    frame6(from, d, 58, icmp)
}

fn frame6(s: std::net::Ipv6Addr, d: std::net::Ipv6Addr, next: u8, payload: Vec<u8>) -> Vec<u8> {
    let mut frame = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2, 0x86, 0xdd, 0x60, 0, 0, 0];
    frame.extend((payload.len() as u16).to_be_bytes());
    frame.extend([next, 64]);
    frame.extend(s.octets());
    frame.extend(d.octets());
    frame.extend(payload);
    frame
}

fn pseudo6(from: std::net::Ipv6Addr, to: SocketAddr, len: usize) -> u32 {
    let IpAddr::V6(d) = to.ip() else { panic!("IPv6 only") };
    pseudo6_of(from, d, 58, len)
}

fn pseudo6_of(s: std::net::Ipv6Addr, d: std::net::Ipv6Addr, next: u8, len: usize) -> u32 {
    let mut b = Vec::new();
    b.extend(s.octets());
    b.extend(d.octets());
    b.extend((len as u32).to_be_bytes());
    b.extend([0, 0, 0, next]);
    b.chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum()
}

mod batch_tests;
mod external_tests;
mod gateway_tests;
mod natin_tests;

#[test]
fn a_preload_is_waited_for_by_the_first_use_which_reports_its_failure() {
    use crate::backends::BpfBackend;
    assert!(nix::unistd::geteuid().is_root(), "the probe tests load BPF programs: run them as root");
    own_netns();
    super::raise_memlock_limit();
    let features = super::features::probe().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pins = dir.path().join("bpf");
    PinDir::new(&pins).prepare().unwrap();
    // Warmed up before the configuration is read: the preload takes the
    // loader made meanwhile.
    let mut bpf = PinnedBpf::new(&pins, features.clone()).warmed(super::Warm::start());
    bpf.preload(&Program::ALL.into());
    assert!(bpf.maps.warm_taken(), "the preload took the warm loader");
    // Nothing was pinned: the maps it is making are new and empty, so
    // reading the maps does not wait for them.
    assert!(!bpf.maps.any());
    assert!(bpf.map_entries().unwrap().is_empty());
    bpf.prepare().unwrap();
    assert!(bpf.maps.any() && PinDir::new(&pins).map(HmMap::Config).exists());
    // A second preload of what is loaded does nothing.
    bpf.preload(&Program::ALL.into());
    bpf.prepare().unwrap();
    bpf.remove_all().unwrap();

    // Warmed up, then nothing to load (no services): the loader goes, and
    // a later load makes its own.
    let mut cooled = PinnedBpf::new(&pins, features.clone()).warmed(super::Warm::start());
    cooled.cool_down();
    assert!(cooled.maps.warm_taken());
    cooled.prepare().unwrap();
    cooled.remove_all().unwrap();

    // A pin dir that cannot be made: the first use says why, and the one
    // after tries again (and says it again).
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let mut bad = PinnedBpf::new(&file.join("bpf"), features);
    bad.preload(&Program::ALL.into());
    let first = bad.prepare().unwrap_err().to_string();
    assert!(first.contains("a-file/bpf") && first.contains("Not a directory"), "{first}");
    assert_eq!(bad.prepare().unwrap_err().to_string(), first);
}

/// An earlier build's map this one no longer has (HM_SVC_STATS): its pin
/// goes at the load, which says so, and never holds teardown back.
#[test]
fn an_earlier_build_s_map_is_unpinned_at_the_load() {
    use crate::backends::BpfBackend;
    use aya_obj::generated::bpf_map_type::BPF_MAP_TYPE_PERCPU_ARRAY;
    assert!(nix::unistd::geteuid().is_root(), "the probe tests load BPF programs: run them as root");
    own_netns();
    super::raise_memlock_limit();
    let dir = tempfile::tempdir().unwrap();
    let pins = dir.path().join("bpf");
    let pin_dir = PinDir::new(&pins);
    pin_dir.prepare().unwrap();
    pin_dir.ensure().unwrap();
    let old = pins.join("maps").join(crate::abi::RETIRED_MAPS[0]);
    let map = sys::map_create(BPF_MAP_TYPE_PERCPU_ARRAY as u32, 4, 16, 1024).unwrap();
    sys::obj_pin(map.as_fd(), &old).unwrap();
    drop(map);

    let mut bpf = PinnedBpf::new(&pins, super::features::probe().unwrap());
    bpf.prepare().unwrap();
    assert!(!old.exists(), "the old pin is gone");
    let notes = bpf.take_notes().join("\n");
    assert!(notes.contains("HM_SVC_STATS is not used by this build; unpinned it"), "{notes}");

    // Left behind (another daemon's load pinned it again): teardown takes it.
    let map = sys::map_create(BPF_MAP_TYPE_PERCPU_ARRAY as u32, 4, 16, 1024).unwrap();
    sys::obj_pin(map.as_fd(), &old).unwrap();
    let removed = bpf.remove_all().unwrap().join("\n");
    assert!(removed.contains("HM_SVC_STATS") && !pins.exists(), "{removed}");
}
