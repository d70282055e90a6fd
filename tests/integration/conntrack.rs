//! The bpfnat veth path's conntrack against the traffic a host really
//! has: connections to a VIP and, from the same address and ports, straight
//! to one of its backends.

use hostmesh::abi::HmMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

use nix::sys::socket::{self, SockType, SockaddrStorage};

use crate::fixtures::bound;
use crate::topology::*;

/// One backend per service, so every VIP flow and every direct one meet
/// the same backend address and port.
const ONE_BACKEND: &str = r#"
[[service]]
name = "web"
vip = "10.96.0.10"
port = 80
backends = ["192.168.10.11:8080"]

[[service]]
name = "dns"
vip = "10.96.0.10"
port = 53
protocol = "udp"
backends = ["192.168.10.11:5353"]

[[service]]
name = "web6"
vip = "fd00:96::10"
port = 80
backends = ["[fd00:10::11]:8080"]

[[service]]
name = "dns6"
vip = "fd00:96::10"
port = 53
protocol = "udp"
backends = ["[fd00:10::11]:5353"]
"#;

const FIRST_PORT: u16 = 20_000;

/// How many flows a load check makes: `full` on a machine of its own; a
/// tenth under software emulation (the kernel matrix's VMs, where the
/// suite's time scale is above 1), which still exercises the same ports,
/// entries and timeouts on that kernel at a fraction of the cost.
fn flows(full: u16) -> u16 {
    if hm_testkit::time_scale() > 1 {
        full / 10
    } else {
        full
    }
}

/// VIP flows made before the direct ones, and direct ones that reuse the
/// source ports of the last of them.
fn vip_flows() -> u16 {
    flows(20_000)
}

fn direct_flows() -> u16 {
    flows(2_000)
}
/// Direct connections stop at this many failures (each costs a timeout).
const ENOUGH_FAILURES: usize = 10;

/// One request and its answer, from `src` to `dst`, over TCP or UDP;
/// returns the answer and the peer the answer came from.
fn exchange(udp: bool, src: SocketAddr, dst: SocketAddr, timeout: Duration) -> std::io::Result<(String, SocketAddr)> {
    if udp {
        let sock = UdpSocket::from(bound(SockType::Datagram, src)?);
        sock.set_read_timeout(Some(timeout))?;
        // Connected: only datagrams from dst itself are received.
        sock.connect(dst)?;
        sock.send(b"hello\n")?;
        let mut buf = [0u8; 64];
        let n = sock.recv(&mut buf)?;
        return Ok((String::from_utf8_lossy(&buf[..n]).trim().to_string(), sock.peer_addr()?));
    }
    let stream = TcpStream::from(bound(SockType::Stream, src)?);
    stream.set_write_timeout(Some(timeout))?;
    // A blocking connect(2) honours SO_SNDTIMEO.
    socket::connect(std::os::fd::AsRawFd::as_raw_fd(&stream), &SockaddrStorage::from(dst))?;
    stream.set_read_timeout(Some(timeout))?;
    let peer = stream.peer_addr()?;
    (&stream).write_all(b"hello\n")?;
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line)?;
    Ok((line.trim().to_string(), peer))
}

/// 20,000 flows to the VIP (`vip_flows`), then 2,000 straight to its backend from the
/// same address and the source ports of the last VIP flows: every direct
/// one is answered by the backend, as itself.
fn check_direct_after_vip(t: &Topology, udp: bool, client: IpAddr, vip: SocketAddr, backend: SocketAddr) {
    let what = format!("{} {client} -> {backend}", if udp { "UDP" } else { "TCP" });
    let timeout = hm_testkit::scaled(Duration::from_secs(1));
    let (vip_failures, direct) = t.host.ns.run(move || {
        let mut vip_failures = Vec::new();
        let (vip_count, direct_count) = (vip_flows(), direct_flows());
        for port in FIRST_PORT..FIRST_PORT + vip_count {
            match exchange(udp, SocketAddr::new(client, port), vip, timeout) {
                Ok((answer, _)) if answer == "b1" => {}
                other => vip_failures.push(format!("port {port}: {other:?}")),
            }
        }
        // The ports of the last VIP flows: their entries are seconds old.
        let mut direct = Vec::new();
        for port in FIRST_PORT + vip_count - direct_count..FIRST_PORT + vip_count {
            match exchange(udp, SocketAddr::new(client, port), backend, timeout) {
                Ok((answer, peer)) if answer == "b1" && peer == backend => {}
                other => direct.push(format!("port {port}: {other:?}")),
            }
            if direct.len() >= ENOUGH_FAILURES {
                break;
            }
        }
        (vip_failures, direct)
    });
    assert!(
        vip_failures.is_empty(),
        "{what}: {} VIP flows failed: {:?}",
        vip_failures.len(),
        &vip_failures[..3.min(vip_failures.len())]
    );
    assert!(direct.is_empty(), "{what}: direct flows after the VIP flows failed: {direct:?}");
}

#[test]
fn direct_flows_to_a_backend_are_untouched_after_vip_flows_with_the_same_ports() {
    let t = Topology::new("connect_time_lb = \"off\"");
    t.host.write("services.toml", ONE_BACKEND);
    let _d = t.host.start_ready();
    let v4: IpAddr = "192.168.10.1".parse().unwrap();
    let v6: IpAddr = "fd00:10::1".parse().unwrap();
    for udp in [false, true] {
        let (port, backend_port) = if udp { (53, 5353) } else { (80, 8080) };
        check_direct_after_vip(
            &t,
            udp,
            v4,
            SocketAddr::new("10.96.0.10".parse().unwrap(), port),
            SocketAddr::new("192.168.10.11".parse().unwrap(), backend_port),
        );
        check_direct_after_vip(
            &t,
            udp,
            v6,
            SocketAddr::new("fd00:96::10".parse().unwrap(), port),
            SocketAddr::new("fd00:10::11".parse().unwrap(), backend_port),
        );
    }
}

/// `count` TCP requests to the VIP, each on a connection of its own, from
/// inside the host namespace.
fn vip_requests(t: &Topology, count: usize) -> usize {
    let timeout = hm_testkit::scaled(Duration::from_secs(1));
    let vip: SocketAddr = "10.96.0.10:80".parse().unwrap();
    let any: SocketAddr = "192.168.10.1:0".parse().unwrap();
    t.host.ns.run(move || (0..count).filter(|_| exchange(false, any, vip, timeout).is_ok()).count())
}

#[test]
fn closed_tcp_flows_keep_their_entries_ten_seconds_then_leave_conntrack() {
    use hostmesh::abi::{CT_F_CLOSING, CT_REVERSE};
    let t = Topology::new("connect_time_lb = \"off\"");
    t.host.write("services.toml", ONE_BACKEND);
    let _d = t.host.start_ready();
    let before = std::time::Instant::now();
    assert_eq!(vip_requests(&t, 20), 20);
    // Each closes once the backend's FIN has come back, too.
    hm_testkit::wait_soon("20 closed flows", || t.conntrack(HmMap::CtClosing).len() == 40)
        .unwrap_or_else(|e| panic!("{e}: {:?}", t.conntrack(HmMap::CtClosing)));
    let closed = t.conntrack(HmMap::CtClosing);
    assert!(closed.iter().all(|(_, v)| v.flags & CT_F_CLOSING != 0));
    assert_eq!(closed.iter().filter(|(k, _)| k.dir == CT_REVERSE).count(), 20, "a forward and a reverse entry each");
    assert!(t.conntrack(HmMap::Ct).iter().all(|(k, _)| k.proto != 6), "none is left with the open flows");
    // The status follows the sweeps.
    hm_testkit::wait_soon("the status to count the closed flows", || {
        let c = t.host.status().counts;
        c.conntrack_closed == 40 && c.conntrack_capacity == 131_072
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}", t.host.status().counts));
    let (text, _) = t.host.status_text();
    assert!(text.contains("conntrack: 0 entries of open flows, 40 of closed ones, of 131072 each"), "{text}");

    // 10 s after their close, at a sweep, they go; never before.
    hm_testkit::wait_until("closed flows to leave the map", Duration::from_secs(10) + hm_testkit::SOON, || {
        t.conntrack(HmMap::CtClosing).is_empty()
    })
    .unwrap();
    let earliest = before.elapsed();
    assert!(earliest >= Duration::from_secs(10), "closed flows keep their entries 10 s, for their last packets");
}

#[test]
fn a_reset_flow_leaves_conntrack_at_once() {
    let t = Topology::new("connect_time_lb = \"off\"");
    t.host.write("services.toml", ONE_BACKEND);
    let _d = t.host.start_ready();
    let timeout = hm_testkit::scaled(Duration::from_secs(1));
    let answered = t.host.ns.run(move || {
        let vip: SocketAddr = "10.96.0.10:80".parse().unwrap();
        let any: SocketAddr = "192.168.10.1:0".parse().unwrap();
        (0..20)
            .filter(|_| {
                let stream = TcpStream::from(bound(SockType::Stream, any).unwrap());
                stream.set_read_timeout(Some(timeout)).unwrap();
                stream.set_write_timeout(Some(timeout)).unwrap();
                let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
                if socket::connect(fd, &SockaddrStorage::from(vip)).is_err() || (&stream).write_all(b"hello\n").is_err()
                {
                    return false;
                }
                let mut line = String::new();
                let ok = BufReader::new(&stream).read_line(&mut line).is_ok() && line.trim() == "b1";
                // close(2) with SO_LINGER 0 sends a RST.
                socket::setsockopt(&stream, socket::sockopt::Linger, &libc::linger { l_onoff: 1, l_linger: 0 })
                    .unwrap();
                ok
            })
            .count()
    });
    assert_eq!(answered, 20);
    let tcp = |map: HmMap| t.conntrack(map).into_iter().filter(|(k, _)| k.proto == 6).count();
    // At once: the probe forgets a flow at its RST, long before the 10 s
    // after which a sweep would remove a closed one (kernel time, so the
    // bound is not scaled). A packet of it still on its way (seen once in
    // the 6.1 VM: an ACK queued on another CPU reached the veth after the
    // RST) opens it again as a flow picked up mid-stream, which the reset
    // backend answers with a RST, or never, and which then lives 2 s, not
    // the 60 s of a SYN.
    let deadline = std::time::Instant::now() + Duration::from_secs(hostmesh::abi::CT_CLOSING_TIMEOUT_S - 1);
    while tcp(HmMap::Ct) != 0 || tcp(HmMap::CtClosing) != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "TCP entries of open flows {}, of closed ones {}",
            tcp(HmMap::Ct),
            tcp(HmMap::CtClosing)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_full_conntrack_keeps_open_flows_working() {
    // The smallest table: 4,096 entries, 2,048 flows.
    let t = Topology::new("connect_time_lb = \"off\"\nconntrack_size = 4096");
    t.host.write("services.toml", ONE_BACKEND);
    let _d = t.host.start_ready();
    let mut held: Vec<Held> = (0..3).map(|_| t.hold("10.96.0.10", 80)).collect();
    for h in &mut held {
        assert_eq!(h.answer(), "b1");
    }
    // Five times as many short flows as the table holds (one and a half
    // times under emulation), while the held connections sit idle: the
    // closed ones push each other out.
    let short = usize::from(flows(10_000)) * if hm_testkit::time_scale() > 1 { 3 } else { 1 };
    assert_eq!(vip_requests(&t, short), short, "every short flow is answered");
    for h in &mut held {
        assert_eq!(h.again(), "b1", "an open flow outlived a full table");
    }
    hm_testkit::wait_soon("a sweep", || t.host.status().counts.conntrack_capacity == 4096).unwrap();
}
