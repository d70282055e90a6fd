//! Backend health checks of every kind (tcp, http, udp, exec), from the
//! source address the config names, with rise and fall, a new backend kept
//! out until its first check passes, and the states kept across a restart.
//! The checks are the daemon's own sockets and processes: no kernel
//! changes them (the dataplane's side of health, on every kernel, is
//! tests/integration/health.rs).

use hostmesh::state::BackendState;

use crate::health_net::*;

/// An HTTP health endpoint in the backends' namespace (health_http.py),
/// killed when dropped.
struct HttpHealth {
    child: std::process::Child,
    status: std::path::PathBuf,
    log: std::path::PathBuf,
}

impl HttpHealth {
    fn start(net: &HealthNet, dir: &hm_testkit::TempDir, i: usize, port: u16) -> HttpHealth {
        use std::io::BufRead;
        let (status, log) = (dir.join(&format!("status-{i}")), dir.join(&format!("log-{i}")));
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/clients/health_http.py");
        let mut child = net
            .backends
            .command("python3")
            .args([script, BACKENDS[i], &port.to_string(), status.to_str().unwrap(), log.to_str().unwrap()])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start health_http.py");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "listening");
        HttpHealth { child, status, log }
    }

    fn answer(&self, code: u16) {
        std::fs::write(&self.status, code.to_string()).unwrap();
    }

    fn requests(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log).unwrap_or_default().lines().map(str::to_string).collect()
    }
}

impl Drop for HttpHealth {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn http_exec_and_udp_checks_take_a_backend_down_and_back_and_checks_leave_from_source() {
    let dir = hm_testkit::TempDir::new("hm-health");
    let script = dir.join("check-app");
    std::fs::write(&script, "#!/bin/sh\n# down while <script>.fail-<address> exists\n! [ -e \"$0.fail-$1\" ]\n")
        .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let timing = format!("interval = \"{}ms\", rise = 2, fall = 2", interval().as_millis());
    let both = |port: u16| format!("[\"{}:{port}\", \"{}:{port}\"]", BACKENDS[0], BACKENDS[1]);
    let services = format!(
        "[[service]]\nname = \"web\"\nvip = \"10.96.0.10\"\nport = 80\nbackends = {}\n\
         health_check = {{ kind = \"http\", port = 9091, path = \"/healthz\", host = \"web.internal\", expect = \"200-299\", source = \"192.168.10.2\", {timing} }}\n\n\
         [[service]]\nname = \"dns\"\nvip = \"10.96.0.10\"\nport = 53\nprotocol = \"udp\"\nbackends = {}\n\
         health_check = {{ kind = \"udp\", port = 9092, send = 'ping\\x00', expect = \"b\", {timing} }}\n\n\
         [[service]]\nname = \"app\"\nvip = \"10.96.0.11\"\nport = 80\nbackends = {}\n\
         health_check = {{ kind = \"exec\", command = [\"{}\", \"{{address}}\", \"{{port}}\"], {timing} }}\n",
        both(8080),
        both(5353),
        both(8080),
        script.display()
    );
    let net = HealthNet::new("connect_time_lb = \"all\"", &services);
    let http: Vec<HttpHealth> = (0..2).map(|i| HttpHealth::start(&net, &dir, i, 9091)).collect();
    let mut udp: Vec<Option<hm_testkit::Servers>> = (0..2)
        .map(|i| {
            let addr = format!("{}:9092", BACKENDS[i]);
            Some(hm_testkit::Servers::start(&net.backends, &[(&addr, hm_testkit::Proto::Udp, NAMES[i])]))
        })
        .collect();
    let _d = net.host.start_ready();
    for i in 0..2 {
        for (service, port) in [("web", 8080), ("dns", 5353), ("app", 8080)] {
            net.wait_state(service, i, port, BackendState::Up);
        }
    }

    // http: 503 takes b2 down, 200 brings it back.
    http[1].answer(503);
    net.wait_state("web", 1, 8080, BackendState::Down);
    assert_eq!(net.backend("web", 1, 8080).unwrap().reason.as_deref(), Some("http 503"));
    wait_only(&net, "tcp", "b1", "b2 answers 503");
    http[1].answer(200);
    net.wait_state("web", 1, 8080, BackendState::Up);
    for (i, h) in http.iter().enumerate() {
        let seen = h.requests();
        assert!(!seen.is_empty(), "b{} was checked", i + 1);
        assert!(
            seen.iter().all(|l| l == "192.168.10.2 /healthz web.internal"),
            "every check came from source: {seen:?}"
        );
    }

    // udp: a socket that never answers takes b1 down.
    udp[0] = None;
    // (The port is free once every child another test forked meanwhile,
    // holding a copy of the server's socket until its exec, has exec'd.)
    let bind = || net.backends.run(|| std::net::UdpSocket::bind("192.168.10.11:9092"));
    let mut silent = None;
    hm_testkit::wait_soon("the UDP check port to be free", || {
        silent = bind().ok();
        silent.is_some()
    })
    .unwrap();
    net.wait_state("dns", 0, 5353, BackendState::Down);
    let reason = net.backend("dns", 0, 5353).unwrap().reason.unwrap();
    assert!(reason.starts_with("timeout after"), "{reason}");
    wait_only(&net, "udp", "b2", "b1 does not answer its checks");
    drop(silent);

    // exec: exit 1 takes b2 down.
    std::fs::write(format!("{}.fail-{}", script.display(), BACKENDS[1]), "").unwrap();
    net.wait_state("app", 1, 8080, BackendState::Down);
    assert_eq!(net.backend("app", 1, 8080).unwrap().reason.as_deref(), Some("exec: exit status 1"));
    let (answers, errors) = {
        let v = net.client(&["requests", "tcp", "10.96.0.11", "80", &REQUESTS.to_string()]);
        (v["answers"].clone(), v["errors"].clone())
    };
    assert_eq!(answers, serde_json::json!({ "b1": REQUESTS }), "{errors}");
    assert_eq!(net.backend("web", 1, 8080).unwrap().state, BackendState::Up, "each service has its own checks");
}

#[test]
fn a_new_backend_gets_nothing_before_its_first_check_passes_and_a_restart_keeps_every_state() {
    let check = |initial: &str| format!("kind = \"tcp\", port = {CHECK_PORT}, initial = \"{initial}\"");
    let only_b1 = |initial: &str| {
        services(&check(initial), &check(initial), [1, 1])
            .replace(", { address = \"192.168.10.12:8080\", weight = 1 }", "")
    };
    let mut net = HealthNet::new("connect_time_lb = \"all\"", &only_b1("unknown"));
    net.stop_check(1);
    let mut d = net.host.start_ready();
    net.wait_state("web", 0, 8080, BackendState::Up);

    // b2 comes with a check that cannot pass yet: it gets nothing.
    let generation = net.host.status().generation;
    net.host.write("services.toml", &services(&check("unknown"), &check("unknown"), [1, 1]));
    hm_testkit::wait_soon("the sync that adds b2", || {
        net.host.status().generation > generation && net.backend("web", 1, 8080).is_some()
    })
    .unwrap();
    let state = net.backend("web", 1, 8080).unwrap().state;
    assert!([BackendState::Unknown, BackendState::Down].contains(&state), "{state}");
    assert_only(&net, "tcp", "b1", "b2 before its first passing check");
    net.start_check(1);
    net.wait_state("web", 1, 8080, BackendState::Up);
    wait_both(&net, "tcp", "b2 once its check passed");

    // With initial = "up", only the saved state keeps a down backend out
    // after a restart; b1 (up) serves from the first sync on.
    net.host.write("services.toml", &services(&check("up"), &check("up"), [1, 1]));
    net.stop_check(1);
    net.wait_state("web", 1, 8080, BackendState::Down);
    net.wait_state("dns", 1, 5353, BackendState::Down);
    let since = net.backend("web", 1, 8080).unwrap().since;
    d.stop(hm_testkit::SOON);
    let d = net.host.start_ready();
    assert_only(&net, "tcp", "b1", "right after the restart");
    let b2 = net.backend("web", 1, 8080).unwrap();
    assert_eq!((b2.state, b2.since), (BackendState::Down, since), "the state and its time are restored");
    let log = d.log_text();
    let restarted = &log[log.rfind("msg=starting").unwrap()..];
    assert!(
        !restarted.contains("backend up") && !restarted.contains("backend down"),
        "no backend flipped: {restarted}"
    );
}
