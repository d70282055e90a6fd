//! Mesh redirects for real: connections and datagrams for a VIP:port land
//! on a local sidecar, which sees the VIP:port as its local address — with
//! sk_lookup, and with the nftables fallback alike.

use hm_testkit::wait_soon;
use hostmesh::state::{ObjectKind, ObjectState};

use crate::fixtures::*;
use crate::topology::Topology;

/// Exact ports on .60 / ::60; whole VIPs on .61 / ::61, except port 80 of
/// .61, whose exact entry goes to another sidecar.
const MESH: &str = r#"
[[mesh]]
name = "tcp4"
vip = "10.96.0.60"
port = 80
redirect_port = 15001

[[mesh]]
name = "udp4"
vip = "10.96.0.60"
port = 53
protocol = "udp"
redirect_port = 15001

[[mesh]]
name = "tcp6"
vip = "fd00:96::60"
port = 80
redirect_port = 15001

[[mesh]]
name = "udp6"
vip = "fd00:96::60"
port = 53
protocol = "udp"
redirect_port = 15001

[[mesh]]
name = "all-tcp4"
vip = "10.96.0.61"
port = 0
redirect_port = 15002

[[mesh]]
name = "all-udp4"
vip = "10.96.0.61"
port = 0
protocol = "udp"
redirect_port = 15002

[[mesh]]
name = "exact-tcp4"
vip = "10.96.0.61"
port = 80
redirect_port = 15001

[[mesh]]
name = "all-tcp6"
vip = "fd00:96::61"
port = 0
redirect_port = 15002

[[mesh]]
name = "all-udp6"
vip = "fd00:96::61"
port = 0
protocol = "udp"
redirect_port = 15002
"#;

/// Runs the VIP client in the host namespace.
fn client(host: &Host, args: &[&str]) -> serde_json::Value {
    let out = host.ns.command(&crate::topology::client()).args(args).output().expect("run the client");
    assert!(out.status.success(), "client {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Requests to vip:port: the one answer seen, and the peer the client saw.
fn ask(host: &Host, proto: &str, vip: &str, port: u16) -> (String, String) {
    let v = client(host, &["requests", proto, vip, &port.to_string(), "3"]);
    assert_eq!(v["errors"], serde_json::json!([]), "{proto} {vip}:{port}: {v}");
    let answers = v["answers"].as_object().unwrap();
    assert_eq!(answers.len(), 1, "{proto} {vip}:{port}: {v}");
    (answers.keys().next().unwrap().clone(), v["peers"][0].as_str().unwrap().to_string())
}

fn text(vip: &str, port: u16) -> String {
    if vip.contains(':') {
        format!("[{vip}]:{port}")
    } else {
        format!("{vip}:{port}")
    }
}

fn check_interception(backend: &str) {
    let host = Host::with_daemon_config(&format!("mesh_backend = \"{backend}\""));
    host.write("mesh.toml", MESH);
    let _a = Sidecar::start(&host, "sa", 15001);
    let _b = Sidecar::start(&host, "sb", 15002);
    let _d = host.start_ready();
    wait_soon("sidecars registered", || {
        host.status().objects.iter().filter(|o| o.kind == ObjectKind::Mesh).all(|o| o.state == ObjectState::Applied)
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}", host.status().objects));

    for (proto, vip, port, sidecar) in [
        ("tcp", "10.96.0.60", 80, "sa"),
        ("udp", "10.96.0.60", 53, "sa"),
        ("tcp", "fd00:96::60", 80, "sa"),
        ("udp", "fd00:96::60", 53, "sa"),
        ("tcp", "10.96.0.61", 8443, "sb"),
        ("udp", "10.96.0.61", 5353, "sb"),
        ("tcp", "10.96.0.61", 80, "sa"), // the exact port wins over the whole VIP
        ("tcp", "fd00:96::61", 8443, "sb"),
        ("udp", "fd00:96::61", 5353, "sb"),
    ] {
        let (answer, peer) = ask(&host, proto, vip, port);
        let at = text(vip, port);
        assert_eq!(answer, format!("{sidecar} {at}"), "{backend}: {proto} to {at} lands on {sidecar}, which sees {at}");
        assert_eq!(peer, at, "{backend}: the client's peer is the VIP");
    }
    let status = host.status();
    let tcp4 = status.objects.iter().find(|o| o.name == "tcp4").unwrap();
    assert!(tcp4.detail.contains(&format!("sidecar 127.0.0.1:15001 (pid {}, python3)", _a.pid())), "{}", tcp4.detail);
    let how = if backend == "sk_lookup" {
        "(sk_lookup)"
    } else {
        "(nftables tproxy, because [daemon] mesh_backend = \"nftables\")"
    };
    assert!(tcp4.detail.ends_with(how), "{}", tcp4.detail);
}

#[test]
fn sk_lookup_hands_tcp_and_udp_v4_and_v6_exact_and_wildcard_to_the_sidecar() {
    check_interception("sk_lookup");
}

#[test]
fn the_nftables_fallback_does_the_same() {
    check_interception("nftables");
}

fn check_sidecar_lifecycle(backend: &str) {
    let host = Host::with_daemon_config(&format!("mesh_backend = \"{backend}\""));
    host.write("mesh.toml", MESH);
    let _b = Sidecar::start(&host, "sb", 15002);
    let _d = host.start_ready();

    // No sidecar on 15001: refused at once, never a hang.
    let v = client(&host, &["refused", "tcp", "10.96.0.60", "80"]);
    // An error, not the client's 5 s timeout.
    assert_eq!(v["error"], "ECONNREFUSED", "{backend}: {v}");

    // A sidecar comes, is killed, and another takes the port: connections
    // land on the new one.
    let first = Sidecar::start(&host, "first", 15001);
    wait_soon("the first sidecar", || {
        client(&host, &["requests", "tcp", "10.96.0.60", "80", "1"])["answers"].get("first 10.96.0.60:80").is_some()
    })
    .unwrap();
    drop(first);
    let second = Sidecar::start(&host, "second", 15001);
    wait_soon("the restarted sidecar to get connections", || {
        tcp_ask(&host.ns, "10.96.0.60:80").is_ok_and(|a| a == "second 10.96.0.60:80")
    })
    .unwrap_or_else(|e| panic!("{backend}: {e}"));
    // UDP follows the new sidecar too (its listener is registered on its
    // own, a moment after the TCP one).
    wait_soon("UDP to reach the restarted sidecar", || {
        client(&host, &["requests", "udp", "10.96.0.60", "53", "1"])["answers"].get("second 10.96.0.60:53").is_some()
    })
    .unwrap_or_else(|e| panic!("{backend}: {e}"));
    let (answer, _) = ask(&host, "udp", "10.96.0.60", 53);
    assert_eq!(answer, "second 10.96.0.60:53", "{backend}: and stays there");

    // The entry goes: interception stops.
    let generation = host.status().generation;
    host.write(
        "mesh.toml",
        &MESH.replace("name = \"tcp4\"\nvip = \"10.96.0.60\"", "name = \"tcp4\"\nvip = \"10.96.0.99\""),
    );
    wait_soon("interception of 10.96.0.60:80 to stop", || {
        host.status().generation > generation && tcp_ask(&host.ns, "10.96.0.60:80").is_err()
    })
    .unwrap_or_else(|e| panic!("{backend}: {e}"));
    drop(second);
}

#[test]
fn sk_lookup_follows_sidecar_restarts_refuses_without_one_and_stops_when_removed() {
    check_sidecar_lifecycle("sk_lookup");
}

#[test]
fn the_nftables_fallback_follows_sidecars_the_same_way() {
    check_sidecar_lifecycle("nftables");
}

#[test]
fn a_vip_port_that_is_also_a_service_goes_to_the_sidecar() {
    for mode in ["tcp", "off"] {
        let t = Topology::new(&format!("connect_time_lb = \"{mode}\""));
        // web (10.96.0.10:80/tcp) has backends b1, b2; the mesh takes it.
        t.host.write(
            "mesh.toml",
            "[[mesh]]\nname = \"web-sidecar\"\nvip = \"10.96.0.10\"\nport = 80\nredirect_port = 15001\n",
        );
        let _s = Sidecar::start(&t.host, "sidecar", 15001);
        let _d = t.host.start_ready();
        wait_soon("the sidecar registered", || {
            t.host.status().objects.iter().any(|o| o.kind == ObjectKind::Mesh && o.state == ObjectState::Applied)
        })
        .unwrap();
        let (answers, peers, errors) = t.requests("tcp", "10.96.0.10", 80, 6);
        assert!(errors.is_empty(), "mode {mode}: {errors:?}");
        assert_eq!(answers, [("sidecar 10.96.0.10:80".to_string(), 6)], "mode {mode}");
        assert_eq!(peers, ["10.96.0.10:80"]);
        // Other services keep their backends.
        let (answers, _, errors) = t.requests("tcp", "fd00:96::10", 80, 6);
        assert!(errors.is_empty() && answers.iter().all(|(n, _)| n == "b1" || n == "b2"), "mode {mode}: {answers:?}");
    }
}
