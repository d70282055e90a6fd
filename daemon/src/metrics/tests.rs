use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use super::*;
use crate::state::{BackendState, BackendStatus, Counts, FileState, FileStatus, Status, SyncSummary};

const CONFIG: &str = r#"
[daemon]
connect_time_lb = "tcp"
metrics_backend_limit = 3

[[service]]
name = "web"
vip = "10.96.0.10"
port = 80
backends = ["192.168.10.11:8080", { address = "192.168.10.12:8080", weight = 0 }]
health_check = { kind = "tcp" }

[[service]]
name = "dns"
vip = "10.96.0.10"
port = 53
protocol = "udp"
backends = ["192.168.10.11:5353"]
"#;

fn status(backends: Vec<BackendStatus>) -> Status {
    Status {
        version: 1,
        pid: 1,
        started_at: 0,
        updated_at: 0,
        config_dir: "/etc/hostmesh".into(),
        config_dirs: vec![],
        bpffs: "/sys/fs/bpf/hostmesh".into(),
        generation: 1,
        resync_interval_ms: 30_000,
        ready: true,
        stopped: false,
        last_sync: SyncSummary::default(),
        counts: Counts {
            conntrack_open: 4,
            conntrack_closed: 1,
            conntrack_external: 6,
            snat_ports: 3,
            ..Default::default()
        },
        files: vec![
            FileStatus { path: "/etc/hostmesh/a.toml".into(), state: FileState::Applied, errors: vec![] },
            FileStatus { path: "/etc/hostmesh/b.toml".into(), state: FileState::Rejected, errors: vec![] },
        ],
        skipped: vec![],
        masked: vec![],
        objects: vec![],
        warnings: vec![],
        kernel: None,
        backends,
    }
}

fn checked(addr: &str, state: BackendState) -> BackendStatus {
    BackendStatus {
        service: "web".into(),
        address: addr.parse().unwrap(),
        state,
        since: None,
        last_check: None,
        last_passed: None,
        reason: None,
    }
}

fn metrics() -> Metrics {
    // No pins there: the traffic families are empty, not an error.
    Metrics::new(TrafficReader::new(std::path::Path::new("/nonexistent/hostmesh-test")))
}

fn web_down() -> Snapshot {
    let config = crate::config::from_text(CONFIG);
    let st = status(vec![
        checked("192.168.10.11:8080", BackendState::Down),
        checked("192.168.10.12:8080", BackendState::Draining),
    ]);
    Snapshot::build(&config, &st, vec![MapRow { map: "HM_SERVICES", entries: Some(2), capacity: 65536 }])
}

#[test]
fn a_snapshot_counts_services_by_path_backends_by_state_and_files() {
    let s = web_down();
    assert_eq!(s.services, BTreeMap::from([("connect_time", 1), ("veth", 1)]));
    let states: Vec<(&str, BackendState)> = s.backends.iter().map(|b| (b.service.as_str(), b.state)).collect();
    // dns has no check: its backend takes connections, so it is up.
    assert_eq!(states, [("web", BackendState::Down), ("web", BackendState::Draining), ("dns", BackendState::Up)]);
    assert_eq!(s.files, BTreeMap::from([("applied", 1), ("rejected", 1)]));
    assert_eq!(s.conntrack_veth, 5);
    assert_eq!(s.names.len(), 2);
    assert!(!s.collapsed(), "3 backends, limit 3");
}

#[test]
fn render_has_each_backend_and_sums_them_per_service_over_the_limit() {
    let m = metrics();
    m.publish_snapshot(web_down());
    let text = m.render();
    for line in [
        "hostmesh_backend_up{service=\"web\",backend=\"192.168.10.11:8080\"} 0",
        "hostmesh_backend_up{service=\"dns\",backend=\"192.168.10.11:5353\"} 1",
        "hostmesh_backends{service=\"web\",state=\"down\"} 1",
        "hostmesh_backends{service=\"web\",state=\"draining\"} 1",
        "hostmesh_backends{service=\"web\",state=\"up\"} 0",
        "hostmesh_config_files{state=\"rejected\"} 1",
        "hostmesh_bpf_map_entries{map=\"HM_SERVICES\"} 2",
        "hostmesh_bpf_map_capacity{map=\"HM_SERVICES\"} 65536",
        "hostmesh_service_connections_total{service=\"dns\",path=\"veth\"} 0",
        "hostmesh_conntrack_entries{path=\"veth\"} 5",
        "hostmesh_conntrack_entries{path=\"external\"} 6",
        "hostmesh_snat_ports_in_use 3",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing from:\n{text}");
    }
    let mut over = web_down();
    over.backend_limit = 2;
    m.publish_snapshot(over);
    let text = m.render();
    assert!(text.contains("hostmesh_backend_up{service=\"web\",backend=\"all\"} 0"), "{text}");
    assert!(!text.contains("192.168.10.11:8080"), "no per-backend series over the limit:\n{text}");
}

#[test]
fn syncs_reloads_and_peer_changes_are_counted() {
    let m = metrics();
    m.sync_done(true, Duration::from_millis(3), ["service/web", "service/api", "bpfnat"].into_iter());
    m.sync_done(false, Duration::from_millis(1), std::iter::empty());
    m.reload("applied");
    m.reload("rejected");
    m.reload("rejected");
    m.publish_snapshot(Snapshot { peers: BTreeMap::from([("b".to_string(), true)]), ..Default::default() });
    // Down (told twice: one change), then up again.
    m.peer_state("b", true);
    m.peer_state("b", false);
    m.peer_state("b", false);
    m.peer_state("b", true);
    let text = m.render();
    for line in [
        "hostmesh_sync_errors_total{object_kind=\"service\"} 2",
        "hostmesh_sync_errors_total{object_kind=\"bpfnat\"} 1",
        "hostmesh_sync_errors_total{object_kind=\"gateway\"} 0",
        "hostmesh_sync_duration_seconds_count{kind=\"full\"} 1",
        "hostmesh_sync_duration_seconds_count{kind=\"incremental\"} 1",
        "hostmesh_config_reloads_total{outcome=\"rejected\"} 2",
        "hostmesh_config_reloads_total{outcome=\"failed\"} 0",
        "hostmesh_gateway_peer_transitions_total{peer=\"b\"} 2",
        "hostmesh_gateway_peer_up{peer=\"b\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing from:\n{text}");
    }
}

fn get(addr: std::net::SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn the_endpoint_serves_get_metrics_only_and_an_idle_client_blocks_no_one() {
    let server = metrics().serve("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = server.addr();
    assert_ne!(addr.port(), 0, "addr() is the bound port");
    // A client that connects and says nothing holds one slot, not all.
    let _idle = TcpStream::connect(addr).unwrap();
    let ok = get(addr, "GET /metrics HTTP/1.0\r\n\r\n");
    assert!(ok.starts_with("HTTP/1.0 200") || ok.starts_with("HTTP/1.1 200"), "{ok}");
    assert!(ok.contains("text/plain; version=0.0.4"), "{ok}");
    assert!(ok.contains("# TYPE hostmesh_build_info gauge"), "{ok}");
    assert!(get(addr, "GET /other HTTP/1.0\r\n\r\n").contains(" 404 "));
    assert!(get(addr, "POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n").contains(" 405 "));
    drop(server);
    assert!(TcpStream::connect(addr).is_err(), "the port is closed once the server is dropped");
}

#[test]
fn a_taken_port_is_an_error_naming_the_key() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let Err(e) = metrics().serve(addr) else { panic!("bound a taken port") };
    assert!(e.to_string().contains("metrics_listen") && e.to_string().contains(&addr.to_string()), "{e}");
}

#[test]
fn a_publication_is_built_into_a_snapshot_at_the_next_scrape() {
    let m = metrics();
    let config = std::sync::Arc::new(crate::config::from_text(CONFIG));
    let published = |state| super::Published::new(&config, status(vec![checked("192.168.10.11:8080", state)]), vec![]);
    m.publish(published(BackendState::Down));
    let line = |up| format!("hostmesh_backend_up{{service=\"web\",backend=\"192.168.10.11:8080\"}} {up}");
    assert!(m.render().lines().any(|l| l == line(0)));
    // Rendered again without a new publication: the same snapshot.
    assert!(m.render().lines().any(|l| l == line(0)));
    m.publish(published(BackendState::Up));
    assert!(m.render().lines().any(|l| l == line(1)), "the newer publication wins");
    // Published, then the daemon loaded another configuration before a
    // scrape: the last snapshot stands (the next publication follows the
    // sync), and the old configuration was not kept for it.
    m.publish(published(BackendState::Down));
    let weak = std::sync::Arc::downgrade(&config);
    drop(config);
    assert!(weak.upgrade().is_none(), "the endpoint does not hold the configuration");
    assert!(m.render().lines().any(|l| l == line(1)));
}
