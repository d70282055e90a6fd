//! The bpfnat veth's plumbing: packets to a VIP leave through hm-natin and
//! reach hm_natout, which balances them (counted per backend) or refuses
//! them; `ip route` names hostmesh's routes. (End-to-end service traffic
//! is `services.rs`.)

use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::process::Command;
use std::time::Duration;

use hm_testkit::TempDir;
use hostmesh::abi::{BackendStats, BackendStatsKey, Pod};
use hostmesh::backends::bpf::sys;

use crate::fixtures::*;

/// New veth-path flows to a service's backends, summed over the backends
/// and CPUs of the pinned HM_BACKEND_STATS.
fn veth_flows(host: &Host, id: u32) -> u64 {
    let fd = sys::obj_get(&host.opts.bpffs.join("maps/HM_BACKEND_STATS")).unwrap();
    let cpus = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    let ncpu = cpus.trim().rsplit('-').next().unwrap().parse::<usize>().unwrap() + 1;
    let size = std::mem::size_of::<BackendStats>();
    let keys = sys::map_keys(fd.as_fd(), std::mem::size_of::<BackendStatsKey>()).unwrap();
    let mut flows = 0;
    for k in keys.iter().filter(|k| BackendStatsKey::from_bytes(k).unwrap().svc_id == id) {
        let mut value = vec![0u8; size * ncpu];
        assert!(sys::map_lookup(fd.as_fd(), k, &mut value).unwrap());
        flows += value.chunks(size).map(|c| BackendStats::from_bytes(c).unwrap().veth_connections).sum::<u64>();
    }
    flows
}

#[test]
fn vip_packets_reach_hm_natout_which_balances_or_refuses_them() {
    let host = Host::with_daemon_config("connect_time_lb = \"off\"");
    // A source address for host-originated traffic.
    host.ns.ip(&["addr", "add", "192.168.77.1/32", "dev", "lo"]);
    host.write("web.toml", WEB);
    host.write("dns.toml", "[[service]]\nname = \"dns\"\nvip = \"10.96.0.10\"\nport = 53\nprotocol = \"udp\"\n");
    let _d = host.start_ready();

    let route = host.ns.ip(&["route", "get", "10.96.0.10"]);
    assert!(route.contains("via 169.254.1.1 dev hm-natin"), "{route}");

    // Service ids are dense from 0 in key order: dns (port 53) then web.
    let web = 1;
    let refused = host.ns.run(|| {
        // TCP: the SYN starts a flow to one of web's backends (which are
        // unreachable here).
        let _ = TcpStream::connect_timeout(&"10.96.0.10:80".parse::<SocketAddr>().unwrap(), Duration::from_millis(300));
        // UDP to dns, which has no backends: hm_natout answers with a
        // port unreachable, which a connected socket hears.
        let udp = UdpSocket::bind("0.0.0.0:0").unwrap();
        udp.connect("10.96.0.10:53").unwrap();
        udp.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        udp.send(b"q").unwrap();
        udp.recv(&mut [0u8; 16]).unwrap_err().kind()
    });
    assert!(veth_flows(&host, web) >= 1, "the SYN to web started a veth-path flow");
    assert_eq!(refused, std::io::ErrorKind::ConnectionRefused, "dns (no backends) refused");
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
