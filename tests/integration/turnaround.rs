//! The turnaround (README.md, "Clients on other machines"): a process of
//! the host connects to one of the host's own addresses on a node port and
//! is balanced as a client on another machine would be, in every
//! connect_time_lb mode: at connect() where connect-time LB handles the
//! protocol, at lo's egress otherwise.
//!
//! ```text
//!  host (hostmesh)                          another host
//!  eth0 192.168.20.1  ---------------------  eth0 192.168.20.11:8080 "r1"
//!  a process of the host on 192.168.20.1:7070 "h1"
//! ```

use hm_testkit::{Netns, Proto, Servers};

use crate::fixtures::*;
use crate::topology::run_client;

const SERVICES: &str = r#"
[[service]]
name = "np"
vip = "10.96.0.10"
port = 80
backends = ["192.168.20.11:8080", "192.168.20.1:7070"]
node_port = 30090

[[service]]
name = "np-udp"
vip = "10.96.0.10"
port = 53
protocol = "udp"
backends = ["192.168.20.11:8080", "192.168.20.1:7070"]
node_port = 30091
"#;

#[test]
fn a_host_process_reaches_its_own_node_port_in_modes_all_tcp_and_off() {
    hm_testkit::require_root();
    let host = Host::new();
    let remote = Netns::new();
    host.ns.veth_to(&remote, ("eth0", "192.168.20.1/24"), ("eth0", "192.168.20.11/24"));
    let _servers =
        Servers::start(&remote, &[("192.168.20.11:8080", Proto::Tcp, "r1"), ("192.168.20.11:8080", Proto::Udp, "r1")])
            .join(Servers::start(
                &host.ns,
                &[("192.168.20.1:7070", Proto::Tcp, "h1"), ("192.168.20.1:7070", Proto::Udp, "h1")],
            ));
    host.write("services.toml", SERVICES);
    for mode in ["all", "tcp", "off"] {
        host.set_daemon_config(&format!("connect_time_lb = \"{mode}\"\nhost_interfaces = [\"eth0\"]"));
        let mut daemon = host.start_ready();
        for (proto, port) in [("tcp", "30090"), ("udp", "30091")] {
            let v = run_client(&host, &["requests", proto, "192.168.20.1", port, "32"]);
            let what = format!("mode {mode}, {proto} to 192.168.20.1:{port}");
            assert_eq!(v["errors"], serde_json::json!([]), "{what}: {v}\n{}", daemon.log_text());
            let answers = v["answers"].as_object().unwrap();
            assert_eq!(answers.keys().collect::<Vec<_>>(), ["h1", "r1"], "{what}: both backends: {v}");
            assert_eq!(
                v["peers"],
                serde_json::json!([format!("192.168.20.1:{port}")]),
                "{what}: the node port is the peer"
            );
        }
        daemon.stop(READY_TIMEOUT);
    }
    let out = host.teardown();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // lo is as it was.
    assert_eq!(host.ns.sysctl("net/ipv4/conf/lo/accept_local").as_deref(), Some("0"));
}
