//! The bpfnat veth's plumbing: packets to a VIP leave through hm-natin and
//! are counted per service by hm_natout; `ip route` names hostmesh's
//! routes. (End-to-end service traffic is `services.rs`.)

use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::process::Command;
use std::time::Duration;

use hm_testkit::TempDir;
use hostmesh::abi::{Pod, SvcStats};
use hostmesh::backends::bpf::sys;

use crate::fixtures::*;

/// Sums a service's per-CPU counters from the pinned stats map.
fn service_packets(host: &Host, id: u32) -> u64 {
    let fd = sys::obj_get(&host.opts.bpffs.join("maps/HM_SVC_STATS")).unwrap();
    let cpus = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    let ncpu = cpus.trim().rsplit('-').next().unwrap().parse::<usize>().unwrap() + 1;
    let mut value = vec![0u8; 16 * ncpu];
    assert!(sys::map_lookup(fd.as_fd(), &id.to_ne_bytes(), &mut value).unwrap());
    value.chunks(16).map(|c| SvcStats::from_bytes(c).unwrap().packets).sum()
}

#[test]
fn vip_packets_reach_hm_natout_and_are_counted_per_service() {
    let host = Host::with_daemon_config("connect_time_lb = \"off\"");
    // A source address for host-originated traffic.
    host.ns.ip(&["addr", "add", "192.168.77.1/32", "dev", "lo"]);
    host.write("web.toml", WEB);
    host.write("dns.toml", "[[service]]\nname = \"dns\"\nvip = \"10.96.0.10\"\nport = 53\nprotocol = \"udp\"\n");
    let _d = host.start_ready();

    let route = host.ns.ip(&["route", "get", "10.96.0.10"]);
    assert!(route.contains("via 169.254.1.1 dev hm-natin"), "{route}");

    // Service ids are dense from 0 in key order: dns (port 53) then web.
    let (dns, web) = (0, 1);
    host.ns.run(|| {
        // TCP: the SYN is counted (its backend is unreachable here).
        let _ = TcpStream::connect_timeout(&"10.96.0.10:80".parse::<SocketAddr>().unwrap(), Duration::from_millis(300));
        let udp = UdpSocket::bind("0.0.0.0:0").unwrap();
        for _ in 0..3 {
            udp.send_to(b"q", "10.96.0.10:53").unwrap();
        }
        // Not a service: UDP to the TCP service's port (refused with an
        // ICMP port unreachable, which this unconnected socket ignores;
        // not counted).
        udp.send_to(b"q", "10.96.0.10:80").unwrap();
    });
    assert!(service_packets(&host, web) >= 1, "the SYN to web was counted");
    assert_eq!(service_packets(&host, dns), 3, "three datagrams to dns (no backends: refused)");
}

#[test]
fn ip_route_shows_proto_hostmesh_with_the_packaged_rt_protos_entry() {
    let host = Host::new();
    host.write("web.toml", WEB);
    let _d = host.start_ready();
    // Show the packaged entry to iproute2 in a private mount namespace, so
    // the machine's /etc stays as it is.
    let conf = TempDir::new("hm-rtprotos");
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/../packaging/iproute2/hostmesh.conf"),
        conf.join("hostmesh.conf"),
    )
    .unwrap();
    let script = format!(
        "mount --bind {} /etc/iproute2/rt_protos.d && ip -n {} route show 10.96.0.10",
        conf.path().display(),
        host.ns.name()
    );
    let out = Command::new("unshare").args(["-m", "--propagation", "private", "sh", "-c", &script]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(text.trim(), "10.96.0.10 via 169.254.1.1 dev hm-natin proto hostmesh onlink");
}
