//! Clients on other machines (README.md, "Clients on other machines"):
//! node ports and external VIPs, balanced at the host's interfaces.
//!
//! ```text
//!  client                  host (hostmesh)                   another host
//!  eth0 192.0.2.2  ----  ext0 192.0.2.1     eth0 192.168.10.1  ----  192.168.10.11/.12
//!       2001:db8:c::2         2001:db8:c::1      fd00:10::1           fd00:10::11/12
//!  (VIPs via the host)   vm0 10.77.0.1  ----  vm 10.77.0.2 (a namespace behind a veth
//!                                              of the host: not a host interface)
//!                        a process of the host on 192.168.10.1:7070
//! ```
//!
//! Every backend is an echo server: it answers with the address it sees
//! the client as, so the test sees where the source was translated.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

use hm_testkit::{Netns, Servers};

use crate::fixtures::*;

const SERVICES: &str = r#"
[[service]]
name = "web"
vip = "10.96.0.10"
port = 80
backends = ["192.168.10.11:8080", "192.168.10.12:8080"]
node_port = 30080
external = true
health_check = { kind = "tcp", interval = "200ms", rise = 2, fall = 2, initial = "up" }

[[service]]
name = "dns"
vip = "10.96.0.10"
port = 53
protocol = "udp"
backends = ["192.168.10.11:8080", "192.168.10.12:8080"]
node_port = 30053
external = true

[[service]]
name = "web6"
vip = "fd00:96::10"
port = 80
backends = ["[fd00:10::11]:8080", "[fd00:10::12]:8080"]
node_port = 30080
external = true

[[service]]
name = "dns6"
vip = "fd00:96::10"
port = 53
protocol = "udp"
backends = ["[fd00:10::11]:8080"]
node_port = 30053

[[service]]
name = "vm"
vip = "10.96.0.11"
port = 80
backends = ["10.77.0.2:8080"]
node_port = 30081

[[service]]
name = "here"
vip = "10.96.0.12"
port = 80
backends = ["192.168.10.1:7070"]
node_port = 30082

[[service]]
name = "mixed"
vip = "10.96.0.14"
port = 80
backends = ["192.168.10.11:8080", "10.77.0.2:8080"]
node_port = 30084
external = true
external_policy = "local"
health_check = { kind = "tcp", interval = "200ms", rise = 2, fall = 2, initial = "up" }

[[service]]
name = "far"
vip = "10.96.0.13"
port = 80
backends = ["10.50.0.5:8080"]
node_port = 30083
"#;

/// Field order is drop order: servers, then the host, then the rest.
struct External {
    _servers: Servers,
    host: Host,
    client: Netns,
    remote: Netns,
    vm: Netns,
    _far: Netns,
}

impl External {
    fn start() -> (External, hm_testkit::Daemon) {
        // The default connect_time_lb ("tcp"); "all", where only flows from
        // the network need the host interfaces' programs, and "off" pass
        // the same test (run by hand).
        let host = Host::with_daemon_config(
            "host_interfaces = [\"ext0\", \"eth0\"]\nservice_health_listen = \"192.0.2.1:10256\"",
        );
        let (client, remote, vm, far) = (Netns::new(), Netns::new(), Netns::new(), Netns::new());
        host.ns.veth_to(&client, ("ext0", "192.0.2.1/24"), ("eth0", "192.0.2.2/24"));
        host.ns.veth_to(&remote, ("eth0", "192.168.10.1/24"), ("eth0", "192.168.10.11/24"));
        host.ns.veth_to(&vm, ("vm0", "10.77.0.1/24"), ("eth0", "10.77.0.2/24"));
        // A backend behind a router (the remote host) whose link to it is
        // narrower: 1280 bytes.
        remote.veth_to(&far, ("far0", "10.50.0.1/24"), ("eth0", "10.50.0.5/24"));
        remote.ip(&["link", "set", "far0", "mtu", "1280"]);
        remote.set_sysctl("net/ipv4/ip_forward", "1");
        far.ip(&["route", "add", "default", "via", "10.50.0.1"]);
        host.ns.ip(&["route", "add", "10.50.0.0/24", "via", "192.168.10.11"]);
        host.ns.ip_batch(&[
            &["addr", "add", "2001:db8:c::1/64", "dev", "ext0", "nodad"],
            &["addr", "add", "fd00:10::1/64", "dev", "eth0", "nodad"],
        ]);
        client.ip_batch(&[
            &["addr", "add", "2001:db8:c::2/64", "dev", "eth0", "nodad"],
            // A router would announce the VIPs; here the client routes them.
            &["route", "add", "10.96.0.0/16", "via", "192.0.2.1"],
            &["route", "add", "fd00:96::/64", "via", "2001:db8:c::1"],
        ]);
        remote.ip_batch(&[
            &["addr", "add", "192.168.10.12/24", "dev", "eth0"],
            &["addr", "add", "fd00:10::11/64", "dev", "eth0", "nodad"],
            &["addr", "add", "fd00:10::12/64", "dev", "eth0", "nodad"],
        ]);
        vm.ip(&["route", "add", "default", "via", "10.77.0.1"]);
        // The VM's replies are forwarded by the host, as they are for
        // whatever else the VM talks to.
        host.ns.set_sysctl("net/ipv4/conf/vm0/forwarding", "1");
        host.ns.set_sysctl("net/ipv4/conf/ext0/forwarding", "1");
        let at = |a: &str| a.parse::<SocketAddr>().unwrap();
        let servers = Servers::echo(
            &remote,
            &[at("192.168.10.11:8080"), at("192.168.10.12:8080"), at("[fd00:10::11]:8080"), at("[fd00:10::12]:8080")],
        )
        .join(Servers::echo(&vm, &[at("10.77.0.2:8080")]))
        .join(Servers::echo(&host.ns, &[at("192.168.10.1:7070")]))
        .join(Servers::start(&far, &[("10.50.0.5:8080", hm_testkit::Proto::Tcp, "f1")]));
        // Another tool's filter on both host interfaces' ingress that ends
        // classification for every packet (seen on Debian 12's 6.1 with
        // the veth path's replies): hostmesh's programs run first, where
        // the kernel has TCX or not.
        for dev in ["ext0", "eth0"] {
            host.ns.exec("tc", &["qdisc", "add", "dev", dev, "clsact"]);
            pass_everything(&host.ns, dev, "7");
        }
        host.write("services.toml", SERVICES);
        let daemon = host.start_ready();
        (External { _servers: servers, host, client, remote, vm, _far: far }, daemon)
    }

    /// A TCP connection from the client: what the backend saw as the
    /// client's address and its own, and that it echoes a line back.
    fn tcp(&self, to: &str) -> std::io::Result<(String, String)> {
        let to: SocketAddr = to.parse().unwrap();
        self.client.run(move || {
            let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(2))?;
            s.set_read_timeout(Some(Duration::from_secs(2)))?;
            let mut r = BufReader::new(s.try_clone()?);
            let mut greeting = String::new();
            r.read_line(&mut greeting)?;
            s.write_all(b"ping\n")?;
            let mut echo = String::new();
            r.read_line(&mut echo)?;
            assert_eq!(echo, "ping\n", "echoed through {to}");
            let mut words = greeting.split_whitespace().map(String::from);
            Ok((words.next().unwrap_or_default(), words.next().unwrap_or_default()))
        })
    }

    /// The status of GET /services/NAME on the host's service health
    /// endpoint, asked from the client as an upstream balancer would.
    fn service_health(&self, name: &str) -> u16 {
        let request = format!("GET /services/{name} HTTP/1.0\r\n\r\n");
        self.client.run(move || {
            let mut s =
                TcpStream::connect_timeout(&"192.0.2.1:10256".parse().unwrap(), Duration::from_secs(2)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            s.write_all(request.as_bytes()).unwrap();
            let mut answer = String::new();
            std::io::Read::read_to_string(&mut s, &mut answer).unwrap();
            answer.split_whitespace().nth(1).and_then(|code| code.parse().ok()).unwrap_or(0)
        })
    }

    /// A UDP request from the client: the address the backend saw it as.
    fn udp(&self, to: &str) -> std::io::Result<String> {
        let to: SocketAddr = to.parse().unwrap();
        self.client.run(move || {
            let any: SocketAddr = if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }.parse().unwrap();
            let s = UdpSocket::bind(any)?;
            s.set_read_timeout(Some(Duration::from_secs(2)))?;
            s.connect(to)?;
            s.send(b"ping\n")?;
            let mut buf = [0u8; 256];
            let n = s.recv(&mut buf)?;
            Ok(String::from_utf8_lossy(&buf[..n]).trim().to_string())
        })
    }
}

#[test]
fn clients_on_another_machine_reach_node_ports_and_external_vips_over_tcp_and_udp_ipv4_and_ipv6() {
    hm_testkit::require_root();
    let (t, mut daemon) = External::start();
    let (hosts4, hosts6) = (["192.168.10.11", "192.168.10.12"], ["fd00:10::11", "fd00:10::12"]);
    for (to, host_addr, backends) in [
        ("192.0.2.1:30080", "192.168.10.1", &hosts4),
        ("10.96.0.10:80", "192.168.10.1", &hosts4),
        ("[2001:db8:c::1]:30080", "fd00:10::1", &hosts6),
        ("[fd00:96::10]:80", "fd00:10::1", &hosts6),
    ] {
        let mut reached = std::collections::BTreeSet::new();
        for _ in 0..32 {
            let (seen_as, backend) = t.tcp(to).unwrap_or_else(|e| panic!("TCP to {to}: {e}\n{}", daemon.log_text()));
            assert_eq!(seen_as, host_addr, "{to}: another host's backend sees this host's address");
            reached.insert(backend);
            if reached.len() == 2 {
                break;
            }
        }
        assert_eq!(reached, backends.iter().map(|b| b.to_string()).collect(), "{to}: both backends answer");
    }
    for (to, host_addr) in [
        ("192.0.2.1:30053", "192.168.10.1"),
        ("10.96.0.10:53", "192.168.10.1"),
        ("[2001:db8:c::1]:30053", "fd00:10::1"),
    ] {
        let seen_as = t.udp(to).unwrap_or_else(|e| panic!("UDP to {to}: {e}\n{}", daemon.log_text()));
        assert_eq!(seen_as, host_addr, "UDP {to}");
    }
    // The flows are counted: their entries, and the source ports they hold.
    hm_testkit::wait_soon("external flows counted", || {
        let c = t.host.status().counts;
        c.conntrack_external > 0 && c.snat_ports > 0
    })
    .unwrap();
    // A backend behind a veth of the host, and a process of the host: both
    // see the client's own address.
    assert_eq!(t.tcp("192.0.2.1:30081").unwrap().0, "192.0.2.2", "a namespace behind a veth of the host");
    assert_eq!(t.tcp("192.0.2.1:30082").unwrap().0, "192.0.2.2", "a process of the host");
    // Path MTU discovery through hostmesh: the router answers full-size
    // segments with "fragmentation needed" sent to this host's address,
    // quoting what hostmesh sent; hm_reply sends it on to the client with
    // the quote translated back, or the client never hears of it and the
    // transfer stalls.
    let out = t
        .client
        .command(&crate::topology::client())
        .args(["bulk", "192.0.2.1", "30083", "1048576"])
        .output()
        .expect("run the client");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["answer"], "f1", "a megabyte through a 1280-byte link: {v}");
    assert!(v["mss"].as_u64().unwrap() <= 1240, "the connection learnt the path's MTU: {v}");
    // dns6 is no external VIP: its VIP is not served to the network.
    assert!(t.udp("[fd00:96::10]:53").is_err(), "a VIP that is not external");

    // An established flow from the network outlives the daemon: its
    // entries and the programs stay while a new daemon adopts them. And
    // clients asking every 50 ms meanwhile see no failure.
    let loops: Vec<_> = [("tcp", "192.0.2.1", "30080"), ("udp", "10.96.0.10", "53"), ("tcp", "fd00:96::10", "80")]
        .iter()
        .map(|(proto, host, port)| {
            let child = t
                .client
                .command(&crate::topology::client())
                .args(["loop", proto, host, port, "0.05", "4"])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("run the client");
            (format!("{proto} {host}:{port}"), child)
        })
        .collect();
    let held: SocketAddr = "192.0.2.1:30080".parse().unwrap();
    let (mut stream, mut reader) = t.client.run(move || {
        let s = TcpStream::connect_timeout(&held, Duration::from_secs(2)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut greeting = String::new();
        r.read_line(&mut greeting).unwrap();
        (s, r)
    });
    daemon.stop(READY_TIMEOUT);
    daemon = t.host.start_ready();
    stream.write_all(b"still there\n").unwrap();
    let mut echo = String::new();
    reader.read_line(&mut echo).expect("the held connection answers after the restart");
    assert_eq!(echo, "still there\n");
    drop((stream, reader));
    for (what, child) in loops {
        let out = child.wait_with_output().expect("the loop ends");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(v["failures"], serde_json::json!([]), "{what} across the restart\n{}", daemon.log_text());
        assert!(v["ok"].as_u64().unwrap() >= 10, "{what}: {v}");
    }

    // A backend that stops answering is taken out by its health check:
    // no new flow from the network reaches it.
    t.remote.ip(&["addr", "del", "192.168.10.12/24", "dev", "eth0"]);
    hm_testkit::wait_soon("192.168.10.12:8080 down", || t.host.status().counts.backends_down == 1)
        .unwrap_or_else(|e| panic!("{e}\n{}", daemon.log_text()));
    for _ in 0..16 {
        let (_, backend) = t.tcp("192.0.2.1:30080").unwrap();
        assert_eq!(backend, "192.168.10.11", "only the serving backend");
    }

    // external_policy = "local": only the backend on this host (behind
    // its veth) is reached, seeing the client's own address, through the
    // node port and the external VIP; the service health endpoint says
    // this host serves it.
    for to in ["192.0.2.1:30084", "10.96.0.14:80"].iter().cycle().take(16) {
        assert_eq!(t.tcp(to).unwrap(), ("192.0.2.2".to_string(), "10.77.0.2".to_string()), "{to}");
    }
    assert_eq!(t.service_health("mixed"), 200);
    // explain says so for the node port, and predicts the backend a client
    // on another machine reaches from the network's table.
    let mut args = vec!["explain", "192.0.2.1:30084", "--from", "192.0.2.2:40000", "--json"];
    let paths = t.host.opts.path_args();
    args.extend(paths.iter().map(String::as_str));
    let out = t.host.hostmesh(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(e["path"], "node_port", "{e}");
    assert_eq!(e["from"]["backend"], "10.77.0.2:8080", "{e}");
    assert_eq!(t.service_health("web"), 404, "not a \"local\" service");
    // Its last backend here goes: 503, and new flows are refused at once
    // (the other host's backend is not used); back, 200 and served again.
    t.vm.ip(&["addr", "del", "10.77.0.2/24", "dev", "eth0"]);
    hm_testkit::wait_soon("mixed: 503", || t.service_health("mixed") == 503)
        .unwrap_or_else(|e| panic!("{e}\n{}", daemon.log_text()));
    let refused = t.tcp("192.0.2.1:30084").unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused, "{refused}");
    t.vm.ip_batch(&[&["addr", "add", "10.77.0.2/24", "dev", "eth0"], &["route", "add", "default", "via", "10.77.0.1"]]);
    hm_testkit::wait_soon("mixed: 200", || t.service_health("mixed") == 200)
        .unwrap_or_else(|e| panic!("{e}\n{}", daemon.log_text()));
    assert_eq!(t.tcp("192.0.2.1:30084").unwrap().1, "10.77.0.2");

    // What hostmesh set for it, and put back at teardown.
    assert_eq!(t.host.ns.sysctl("net/ipv4/ip_local_reserved_ports").as_deref(), Some("30000-32767,61000-65535"));
    assert_eq!(t.host.ns.sysctl("net/ipv6/conf/ext0/forwarding").as_deref(), Some("1"));
    daemon.stop(READY_TIMEOUT);
    let out = t.host.teardown();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(t.host.ns.sysctl("net/ipv4/ip_local_reserved_ports").as_deref(), Some(""));
    assert_eq!(t.host.ns.sysctl("net/ipv6/conf/ext0/forwarding").as_deref(), Some("0"));
    // And no program, map or route of hostmesh's: the other tool's filter
    // stays, hostmesh's are gone, and so are its pins and routes.
    assert_eq!(hostmesh_filters(&t.host.ns), [], "no hostmesh filter left");
    assert!(t.host.owned_routes().is_empty(), "{:?}", t.host.owned_routes());
    assert!(!t.host.opts.bpffs.exists(), "pin dir still there");
}

const ONE_BACKEND: &str = r#"
[[service]]
name = "web"
vip = "10.96.0.10"
port = 80
backends = ["192.168.10.11:8080"]
node_port = 30080
external = true

[[service]]
name = "dns"
vip = "10.96.0.10"
port = 53
protocol = "udp"
backends = ["192.168.10.11:8080"]
node_port = 30053
external = true
"#;

/// A TCP connection from `local` (bound first, as a program that picks
/// its source port does) to `to`, with the backend's greeting read.
fn tcp_from(local: SocketAddr, to: SocketAddr) -> std::io::Result<(TcpStream, BufReader<TcpStream>)> {
    use nix::sys::socket::{connect, SockType, SockaddrStorage};
    use std::os::fd::AsRawFd;
    let fd = bound(SockType::Stream, local)?;
    connect(fd.as_raw_fd(), &SockaddrStorage::from(to))?;
    let s = TcpStream::from(fd);
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut r = BufReader::new(s.try_clone()?);
    let mut greeting = String::new();
    r.read_line(&mut greeting)?;
    Ok((s, r))
}

/// Writes a line and reads its echo.
fn echoes(s: &mut TcpStream, r: &mut BufReader<TcpStream>, line: &str) -> bool {
    let mut echo = String::new();
    s.write_all(line.as_bytes()).is_ok() && r.read_line(&mut echo).is_ok() && echo == line
}

/// A connection of the host's own from a port of snat_port_range, bound on
/// purpose (ip_local_reserved_ports keeps the kernel from picking one),
/// keeps its port: flows from the network to the same backend take the
/// other ports of the range, and when those are all taken a new one is
/// dropped rather than given the host's. Straight to the backend over TCP
/// (a socket the kernel knows), and through a VIP on the veth path over
/// UDP (a flow only hostmesh's conntrack knows).
#[test]
fn host_connections_bound_in_snat_port_range_are_never_broken_by_flows_from_the_network() {
    hm_testkit::require_root();
    let host = Host::with_daemon_config("host_interfaces = [\"ext0\", \"eth0\"]\nsnat_port_range = \"61000-61003\"");
    let (client, remote) = (Netns::new(), Netns::new());
    host.ns.veth_to(&client, ("ext0", "192.0.2.1/24"), ("eth0", "192.0.2.2/24"));
    host.ns.veth_to(&remote, ("eth0", "192.168.10.1/24"), ("eth0", "192.168.10.11/24"));
    host.ns.set_sysctl("net/ipv4/conf/ext0/forwarding", "1");
    let _servers = Servers::echo(&remote, &["192.168.10.11:8080".parse().unwrap()]);
    host.write("services.toml", ONE_BACKEND);
    let daemon = host.start_ready();
    let at = |a: &str| a.parse::<SocketAddr>().unwrap();

    // The host's TCP connection from 61000, its UDP flow from 61001.
    let (mut own_tcp, mut own_reader) = host
        .ns
        .run(move || tcp_from(at("192.168.10.1:61000"), at("192.168.10.11:8080")))
        .expect("the host's connection");
    assert!(echoes(&mut own_tcp, &mut own_reader, "mine\n"));
    let own_udp = host.ns.run(move || {
        let s = UdpSocket::bind(at("192.168.10.1:61001")).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        s.connect(at("10.96.0.10:53")).unwrap();
        s
    });
    let ask = |s: &UdpSocket| -> std::io::Result<String> {
        s.send(b"ping\n")?;
        let mut buf = [0u8; 64];
        let n = s.recv(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf[..n]).trim().to_string())
    };
    assert_eq!(ask(&own_udp).expect("the host's UDP flow through the VIP"), "192.168.10.1");

    // Clients on another machine: three TCP connections held open take the
    // three other ports; a fourth finds none and is dropped.
    let held: Vec<_> = (0..3)
        .map(|i| {
            client
                .run(move || tcp_from(at(&format!("192.0.2.2:{}", 41000 + i)), at("192.0.2.1:30080")))
                .unwrap_or_else(|e| panic!("external TCP flow {i}: {e}\n{}", daemon.log_text()))
        })
        .collect();
    let fourth = client.run(move || TcpStream::connect_timeout(&at("192.0.2.1:30080"), Duration::from_millis(1500)));
    assert!(fourth.is_err(), "a fourth flow got a port: the host's 61000 or one already held");
    // UDP the same: 61000 is free for UDP, 61001 is the host's.
    let sockets: Vec<UdpSocket> = (0..4)
        .map(|i| {
            client.run(move || {
                let s = UdpSocket::bind(at(&format!("192.0.2.2:{}", 42000 + i))).unwrap();
                s.set_read_timeout(Some(Duration::from_millis(1500))).unwrap();
                s.connect(at("192.0.2.1:30053")).unwrap();
                s
            })
        })
        .collect();
    for (i, s) in sockets.iter().take(3).enumerate() {
        assert_eq!(ask(s).unwrap_or_else(|e| panic!("external UDP flow {i}: {e}")), "192.168.10.1");
    }
    assert!(ask(&sockets[3]).is_err(), "a fourth UDP flow got a port: the host's 61001 or one already held");

    // The host's own connections still work, and so do the held flows.
    assert!(echoes(&mut own_tcp, &mut own_reader, "still mine\n"), "the host's TCP connection\n{}", daemon.log_text());
    assert_eq!(ask(&own_udp).expect("the host's UDP flow after the flows from the network"), "192.168.10.1");
    for (i, (mut s, mut r)) in held.into_iter().enumerate() {
        assert!(echoes(&mut s, &mut r, "theirs\n"), "held external flow {i}");
    }
}
