//! The metrics endpoint, scraped by a real Prometheus server (Debian's
//! package) in the test's namespace: the probes count every connection
//! on both paths exactly, every family of the metric set is there and
//! passes `promtool check metrics`, and the packaged alert rules and
//! Grafana dashboard name only metrics a scrape has.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use hm_testkit::{http_get, wait_soon, Prometheus};

use crate::topology::*;

const METRICS: &str = "127.0.0.1:9853";
const PROMETHEUS: &str = "127.0.0.1:9090";
const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// Every family of the metric set (the README's "Metrics" table).
const FAMILIES: [&str; 20] = [
    "hostmesh_build_info",
    "hostmesh_services",
    "hostmesh_backends",
    "hostmesh_backend_up",
    "hostmesh_service_connections_total",
    "hostmesh_backend_connections_total",
    "hostmesh_backend_bytes_total",
    "hostmesh_sync_duration_seconds",
    "hostmesh_sync_errors_total",
    "hostmesh_config_files",
    "hostmesh_config_reloads_total",
    "hostmesh_bpf_map_entries",
    "hostmesh_bpf_map_capacity",
    "hostmesh_conntrack_entries",
    "hostmesh_snat_ports_in_use",
    "hostmesh_mesh_listener_registered",
    "hostmesh_gateway_peer_up",
    "hostmesh_gateway_peer_transitions_total",
    "hostmesh_gateway_failovers_total",
    "hostmesh_gateway_active",
];

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// The backend address a server name stands for, on `port`.
/// `expr`'s series as (service, backend or path) -> value.
fn by(prom: &Prometheus, net: &Topology, expr: &str, label: &str) -> BTreeMap<(String, String), u64> {
    prom.query(&net.host.ns, expr)
        .into_iter()
        .map(|(l, v)| {
            let get = |k: &str| l.get(k).and_then(|x| x.as_str()).unwrap_or_default().to_string();
            ((get("service"), get(label)), v as u64)
        })
        .collect()
}

#[test]
fn prometheus_sees_build_info_and_each_connection_counted_once_on_each_path() {
    let net = Topology::new(&format!("connect_time_lb = \"tcp\"\nmetrics_listen = \"{METRICS}\""));
    let _d = net.host.start_ready();
    let prom = Prometheus::start(&net.host.ns, addr(METRICS), addr(PROMETHEUS));
    let info =
        wait_soon("hostmesh_build_info in prometheus", || prom.query(&net.host.ns, "hostmesh_build_info").len() == 1);
    assert!(info.is_ok(), "{info:?}: {}", prom.log());
    let series = prom.query(&net.host.ns, "hostmesh_build_info");
    assert_eq!(series[0].0["version"], env!("CARGO_PKG_VERSION"));
    assert!(["tcx", "netlink"].contains(&series[0].0["tc_attach"].as_str().unwrap()), "{series:?}");
    // What the packaged HostmeshDown rule watches.
    let up = prom.query(&net.host.ns, r#"up{job="hostmesh"}"#);
    assert_eq!(up.iter().map(|(_, v)| *v).collect::<Vec<_>>(), [1.0], "{up:?}");

    let backends = r#"hostmesh_backend_connections_total{service=~"web|dns"}"#;
    let mut want = by(&prom, &net, backends, "backend");
    // TCP takes connect-time LB, UDP the veth path (mode "tcp").
    let mut per_path = BTreeMap::from([("web", 0), ("dns", 0)]);
    for (proto, port, backend_port, count) in [("tcp", 80, 8080, 12), ("udp", 53, 5353, 7)] {
        let (answers, _, errors) = net.requests(proto, "10.96.0.10", port, count);
        assert!(errors.is_empty(), "{proto}: {errors:?}");
        let service = if proto == "tcp" { "web" } else { "dns" };
        for (name, n) in answers {
            *want.entry((service.to_string(), backend_of(&name, backend_port))).or_default() += n;
            *per_path.get_mut(service).unwrap() += n;
        }
    }
    let counted = wait_soon("the counts in prometheus", || by(&prom, &net, backends, "backend") == want);
    assert!(counted.is_ok(), "want {want:?}, prometheus has {:?}", by(&prom, &net, backends, "backend"));
    // Three scrapes later: still exactly that (nothing counted twice).
    let scrapes = || prom.query(&net.host.ns, "count_over_time(up[1h])").first().map_or(0.0, |(_, v)| *v);
    let seen = scrapes();
    wait_soon("three more scrapes", || scrapes() >= seen + 3.0).unwrap();
    assert_eq!(by(&prom, &net, backends, "backend"), want);
    let paths = by(&prom, &net, r#"hostmesh_service_connections_total{service=~"web|dns"}"#, "path");
    let key = |s: &str, p: &str| (s.to_string(), p.to_string());
    assert_eq!(paths[&key("web", "connect_time")], per_path["web"], "{paths:?}");
    assert_eq!(paths[&key("web", "veth")], 0, "{paths:?}");
    assert_eq!(paths[&key("dns", "veth")], per_path["dns"], "{paths:?}");
    assert_eq!(paths[&key("dns", "connect_time")], 0, "{paths:?}");
}

/// Every metric name an expression mentions.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("hostmesh_") {
        let tail = &rest[i..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        out.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

/// The expressions of the packaged dashboard and alert rules.
fn packaged_expressions() -> Vec<String> {
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{REPO}/packaging/grafana/hostmesh-dashboard.json")).unwrap(),
    )
    .expect("the dashboard is JSON");
    let mut exprs: Vec<String> = dash["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t["expr"].as_str().expect("every target has an expr").to_string())
        .collect();
    assert!(exprs.len() >= 10, "{exprs:?}");
    let rules = std::fs::read_to_string(format!("{REPO}/packaging/prometheus/hostmesh.rules.yml")).unwrap();
    let rule_exprs: Vec<String> =
        rules.lines().filter_map(|l| l.trim().strip_prefix("expr:")).map(|e| e.trim().to_string()).collect();
    assert_eq!(rule_exprs.len(), 7, "{rules}");
    exprs.extend(rule_exprs);
    exprs
}

fn promtool(args: &[&str], input: &str) -> std::process::Output {
    use std::io::Write;
    let mut child = std::process::Command::new("promtool")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run promtool (Debian's prometheus package; scripts/deps installs it)");
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn every_family_is_scraped_and_promtool_passes_it_the_rules_and_the_dashboard() {
    let net = Topology::new(&format!("connect_time_lb = \"tcp\"\nmetrics_listen = \"{METRICS}\""));
    net.host.write("extras.toml", &mesh_and_peer("probe_interval = \"200ms\""));
    let _d = net.host.start_ready();
    for (proto, port) in [("tcp", 80), ("udp", 53)] {
        let (_, _, errors) = net.requests(proto, "10.96.0.10", port, 2);
        assert!(errors.is_empty(), "{proto}: {errors:?}");
    }
    // The peer starts up and goes down when its probes go unanswered.
    let down =
        ["hostmesh_gateway_peer_up{peer=\"site-b\"} 0", "hostmesh_gateway_peer_transitions_total{peer=\"site-b\"} 1"];
    let mut scrape = String::new();
    let seen = wait_soon("the peer down in a scrape", || {
        let (code, body) = http_get(&net.host.ns, addr(METRICS), "/metrics").unwrap();
        assert_eq!(code, 200, "{body}");
        scrape = body;
        down.iter().all(|l| scrape.lines().any(|x| x == *l))
    });
    assert!(seen.is_ok(), "{seen:?}:\n{scrape}");
    let samples: Vec<&str> = scrape.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).collect();
    for family in FAMILIES {
        assert!(samples.iter().any(|l| l.starts_with(family)), "{family} has no series in the scrape:\n{scrape}");
    }
    assert!(samples.contains(&"hostmesh_mesh_listener_registered{mesh=\"api\"} 0"), "{scrape}");
    let lint = promtool(&["check", "metrics"], &scrape);
    assert!(
        lint.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&lint.stdout),
        String::from_utf8_lossy(&lint.stderr)
    );
    let rules = format!("{REPO}/packaging/prometheus/hostmesh.rules.yml");
    let checked = promtool(&["check", "rules", &rules], "");
    assert!(checked.status.success(), "promtool check rules: {}", String::from_utf8_lossy(&checked.stdout));

    let scraped: std::collections::BTreeSet<&str> =
        samples.iter().map(|l| l.split(['{', ' ']).next().unwrap()).collect();
    for expr in packaged_expressions() {
        let names = metric_names(&expr);
        // The daemon-down rule reads Prometheus's own `up` of the job (the
        // first test sees it there, under the job name the rule assumes).
        assert!(!names.is_empty() || expr.starts_with("up{job=\"hostmesh\"}"), "{expr} names no hostmesh metric");
        for name in names {
            assert!(scraped.contains(name.as_str()), "{expr}: {name} is not in a scrape ({scraped:?})");
        }
    }
    let (code, _) = http_get(&net.host.ns, addr(METRICS), "/other").unwrap();
    assert_eq!(code, 404);
}

/// HM_BACKEND_STATS' pairs with one of web's two IPv4 backends, by backend.
fn web_counted(net: &Topology) -> BTreeMap<SocketAddr, u32> {
    use hostmesh::abi::{socket_addr16, BackendStatsKey, Pod};
    use hostmesh::backends::bpf::sys;
    use std::os::fd::AsFd;
    let fd = sys::obj_get(&net.host.opts.bpffs.join("maps/HM_BACKEND_STATS")).unwrap();
    sys::map_keys(fd.as_fd(), std::mem::size_of::<BackendStatsKey>())
        .unwrap()
        .iter()
        .map(|k| BackendStatsKey::from_bytes(k).unwrap())
        .map(|k| (socket_addr16(k.addr, k.port_be), k.svc_id))
        .filter(|(b, _)| [addr("192.168.10.11:8080"), addr("192.168.10.12:8080")].contains(b))
        .collect()
}

#[test]
fn a_removed_backend_s_counters_are_deleted_at_the_next_full_sync() {
    let net = Topology::new("connect_time_lb = \"tcp\"");
    let d = net.host.start_ready();
    // 24 connections: both backends get some (all on one: 2 in 2^24).
    let (_, _, errors) = net.requests("tcp", "10.96.0.10", 80, 24);
    assert!(errors.is_empty(), "{errors:?}");
    let counted = web_counted(&net);
    assert_eq!(counted.len(), 2, "both backends counted: {counted:?}");

    // An edit removes one: its counters stay until a full sync (an edit
    // costs what it changes, not a walk over every counter).
    let generation = net.host.status().generation;
    net.host.write("services.toml", &services_without("192.168.10.12:8080"));
    wait_soon("the edit synced", || net.host.status().generation > generation).unwrap();
    assert_eq!(web_counted(&net), counted, "{}", d.log_text());

    d.signal(nix::sys::signal::Signal::SIGHUP);
    let gone = wait_soon("the removed backend's counters deleted", || web_counted(&net).len() == 1);
    assert!(gone.is_ok(), "{:?}\n{}", web_counted(&net), d.log_text());
    let left: Vec<SocketAddr> = web_counted(&net).into_keys().collect();
    assert_eq!(left, [addr("192.168.10.11:8080")], "the one still configured keeps its counters");
    // Said in the log, which the daemon writes after the deletion (seen
    // in the 6.1 VM: the counters gone, the line not yet written).
    let said = || d.log_text().contains("traffic counters of backends no longer configured deleted");
    wait_soon("the deletion logged", said).unwrap_or_else(|e| panic!("{e}\n{}", d.log_text()));
}
