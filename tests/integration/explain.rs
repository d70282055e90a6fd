//! `hostmesh explain`: for a connect-time VIP, a veth-path VIP, a mesh VIP
//! with its sidecar, an address behind a gateway peer and an address
//! hostmesh does not handle, the right path; and the backend `--from
//! SRC:PORT` predicts is the one a real connection bound to that source
//! reaches, on both paths.

use serde_json::Value;

use crate::fixtures::Sidecar;
use crate::topology::*;

fn explain(net: &Topology, args: &[&str]) -> Value {
    let mut all = vec!["explain"];
    all.extend_from_slice(args);
    all.push("--json");
    let paths = net.host.opts.path_args();
    all.extend(paths.iter().map(String::as_str));
    let out = net.host.hostmesh(&all);
    assert!(out.status.success(), "explain {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// For 8 source ports: explain's prediction and the backend a socket bound
/// to 192.168.10.1:port reaches; both backends among the predictions.
fn predictions_hold(net: &Topology, target: &str, proto: &str, vport: u16, backend_port: u16, path: &str) {
    let mut seen = std::collections::BTreeSet::new();
    for sport in 41000..41008u16 {
        let from = format!("192.168.10.1:{sport}");
        let e = explain(net, &[target, "--from", &from]);
        assert_eq!(e["path"], path, "{e:#}");
        assert_eq!(e["from"]["by"], "hash", "{e:#}");
        let predicted = e["from"]["backend"].as_str().unwrap_or_else(|| panic!("no prediction: {e:#}")).to_string();
        let real =
            net.client(&["from-port", "192.168.10.1", &sport.to_string(), proto, "10.96.0.10", &vport.to_string()]);
        let answer = real["answer"].as_str().unwrap_or_else(|| panic!("{proto} from {from}: {real}"));
        assert_eq!(backend_of(answer, backend_port), predicted, "{target} from {from}: {e:#}");
        seen.insert(predicted);
    }
    assert_eq!(seen.len(), 2, "8 source ports predicted only {seen:?}");
}

/// The programs explain lists for a path: every one `wanted` names (by
/// program), each this build's by its mark and on a live hook.
fn programs_are_this_builds(e: &Value, wanted: &[&str]) {
    let listed = e["programs"].as_array().unwrap_or_else(|| panic!("no programs: {e:#}"));
    let mut names: Vec<&str> = listed.iter().map(|p| p["program"].as_str().unwrap()).collect();
    names.dedup();
    assert_eq!(names, wanted, "{e:#}");
    for p in listed {
        assert_eq!((p["build"].as_str(), p["live"].as_bool()), (Some("this"), Some(true)), "{p:#}");
        assert!(p["mark"].as_str().is_some_and(|m| m.len() == 16 && m != "0000000000000000"), "{p:#}");
    }
    let said = e["sentences"].as_array().unwrap().last().unwrap().as_str().unwrap();
    assert!(
        said.ends_with("attached and are this build's.") || said.ends_with("attached and is this build's."),
        "{e:#}"
    );
}

#[test]
fn explain_names_the_path_of_each_kind_of_address_and_predicts_the_backend_a_source_reaches() {
    let net = Topology::new("connect_time_lb = \"tcp\"");
    net.host.write("extras.toml", &mesh_and_peer(""));
    let _d = net.host.start_ready();
    let _sidecar = Sidecar::start(&net.host, "sidecar", 15001);

    // Connect-time LB (TCP) and the veth path (UDP), each predicted.
    let e = explain(&net, &["10.96.0.10:80/tcp"]);
    assert_eq!(e["path"], "connect_time", "{e:#}");
    assert_eq!(e["service"]["name"], "web");
    let shares: f64 = e["service"]["backends"].as_array().unwrap().iter().map(|b| b["share"].as_f64().unwrap()).sum();
    assert!((shares - 1.0).abs() < 1e-9, "the shares cover the table: {e:#}");
    programs_are_this_builds(
        &e,
        &[
            "hm_connect4",
            "hm_connect6",
            "hm_sendmsg4",
            "hm_sendmsg6",
            "hm_recvmsg4",
            "hm_recvmsg6",
            "hm_getpeername4",
            "hm_getpeername6",
            "hm_sock_release",
        ],
    );
    predictions_hold(&net, "10.96.0.10:80/tcp", "tcp", 80, 8080, "connect_time");
    let e = explain(&net, &["10.96.0.10:53/udp"]);
    assert_eq!(e["path"], "veth", "{e:#}");
    assert!(e["route"]["hostmesh"].as_bool().unwrap(), "the VIP's route is hostmesh's: {e:#}");
    programs_are_this_builds(&e, &["hm_natin", "hm_natout", "hm_reply", "hm_direct"]);
    predictions_hold(&net, "10.96.0.10:53/udp", "udp", 53, 5353, "veth");
    // Counters: the UDP requests just made went to dns's backends.
    let dns = explain(&net, &["10.96.0.10:53/udp"]);
    let counted: u64 =
        dns["service"]["backends"].as_array().unwrap().iter().map(|b| b["connections"].as_u64().unwrap()).sum();
    assert_eq!(counted, 8, "{dns:#}");

    // The mesh VIP, with its sidecar's listener.
    hm_testkit::wait_soon("the sidecar registered", || {
        explain(&net, &["10.96.0.60:80/tcp"])["mesh"]["listener"].as_str().is_some_and(|l| l.contains("15001"))
    })
    .unwrap_or_else(|e| panic!("{e}: {:#}", explain(&net, &["10.96.0.60:80/tcp"])));
    let e = explain(&net, &["10.96.0.60:80/tcp", "--from", "192.168.10.1:41100"]);
    assert_eq!((e["path"].as_str(), e["mesh"]["name"].as_str()), (Some("mesh"), Some("api")), "{e:#}");
    assert_eq!((e["from"]["backend"].as_str(), e["from"]["by"].as_str()), (Some("127.0.0.1:15001"), Some("listener")));
    programs_are_this_builds(&e, &["hm_mesh"]);
    let real = net.client(&["from-port", "192.168.10.1", "41100", "tcp", "10.96.0.60", "80"]);
    let answer = real["answer"].as_str().unwrap_or_default();
    assert!(answer.starts_with("sidecar "), "the connection reached the listener explain names: {real}");

    // Behind the gateway peer, and not handled at all.
    let e = explain(&net, &["10.20.1.5", "--from", "192.168.10.1"]);
    assert_eq!(e["path"], "gateway", "{e:#}");
    assert_eq!(e["from"]["backend"], "192.168.10.200:4789", "{e:#}");
    assert_eq!(
        (e["gateway"]["peer"].as_str(), e["gateway"]["endpoint"].as_str()),
        (Some("site-b"), Some("192.168.10.200"))
    );
    programs_are_this_builds(&e, &["hm_tun_in", "hm_tun_out"]);
    let e = explain(&net, &["192.0.2.99:80"]);
    assert_eq!(e["path"], "none", "{e:#}");
    assert!(e["sentences"][0].as_str().unwrap().contains("does not handle"), "{e:#}");
    assert_eq!(e["programs"].as_array().map(Vec::len), Some(0), "no program handles it: {e:#}");
    assert_eq!(
        (e["route"]["dev"].as_str(), e["route"]["hostmesh"].as_bool()),
        (Some("eth0"), Some(false)),
        "the default route, not hostmesh's: {e:#}"
    );

    // The text form says the same in sentences.
    let paths = net.host.opts.path_args();
    let mut args = vec!["explain", "10.96.0.10:80", "--from", "192.168.10.1:41000"];
    args.extend(paths.iter().map(String::as_str));
    let text = String::from_utf8(net.host.hostmesh(&args).stdout).unwrap();
    assert!(text.contains("service \"web\"") && text.contains("connect-time load balancing"), "{text}");
    assert!(text.contains("From 192.168.10.1:41000: 192.168.10.1"), "{text}");
    assert!(text.contains("program hm_connect4 on cgroup ") && text.contains("this build's"), "{text}");
}
