//! Backends that fail (issue 14): health checks take a backend out of its
//! service's tables and bring it back, on the connect-time path and the
//! bpfnat veth path, with real servers stopped and started in another
//! namespace. Interval 200 ms, rise 2, fall 2 (health_net.rs).

use std::time::{Duration, Instant};

use hm_testkit::{scaled, wait_soon};
use hostmesh::state::BackendState;

use crate::health_net::*;
use crate::topology::Held;

fn killed_backend_leaves_and_comes_back(mode: &str) {
    let services = services("kind = \"tcp\"", "kind = \"udp\", send = \"hello\"", [1, 1]);
    let mut net = HealthNet::new(&format!("connect_time_lb = \"{mode}\""), &services);
    let d = net.host.start_ready();
    for (service, port) in [("web", 8080), ("dns", 5353)] {
        for i in 0..2 {
            net.wait_state(service, i, port, BackendState::Up);
        }
    }
    wait_both(&net, "tcp", mode);
    wait_both(&net, "udp", mode);

    net.stop_main(1);
    net.wait_state("web", 1, 8080, BackendState::Down);
    net.wait_state("dns", 1, 5353, BackendState::Down);
    let what = format!("mode {mode}, b2 killed");
    wait_only(&net, "tcp", "b1", &what);
    wait_only(&net, "udp", "b1", &what);
    let web = net.backend("web", 1, 8080).unwrap();
    assert_eq!(
        (web.state, web.reason.as_deref()),
        (BackendState::Down, Some("connect: connection refused")),
        "{web:?}"
    );
    let dns = net.backend("dns", 1, 5353).unwrap();
    assert_eq!((dns.state, dns.reason.as_deref()), (BackendState::Down, Some("udp: connection refused")), "{dns:?}");
    let (text, _) = net.host.status_text();
    assert!(text.contains("192.168.10.12:8080  down") && text.contains("connect: connection refused"), "{text}");
    // The log line may follow the status (the daemon's log is written on
    // its own): waited for, as the deletion's in metrics.rs.
    wait_soon("the transition logged", || d.log_text().contains("backend down"))
        .unwrap_or_else(|e| panic!("{e}: one log line per transition\n{}", d.log_text()));

    net.start_main(1);
    for (service, port) in [("web", 8080), ("dns", 5353)] {
        net.wait_state(service, 1, port, BackendState::Up);
    }
    wait_both(&net, "tcp", &format!("mode {mode}, b2 back"));
    wait_both(&net, "udp", &format!("mode {mode}, b2 back"));
    wait_soon("the transition logged", || d.log_text().contains("backend up"))
        .unwrap_or_else(|e| panic!("{e}\n{}", d.log_text()));
}

#[test]
fn a_killed_backend_gets_no_new_connections_and_comes_back_connect_time() {
    killed_backend_leaves_and_comes_back("all");
}

#[test]
fn a_killed_backend_gets_no_new_connections_and_comes_back_veth_path() {
    killed_backend_leaves_and_comes_back("off");
}

#[test]
fn an_established_veth_tcp_flow_survives_draining_and_a_flap_and_a_udp_flow_moves() {
    let mut net = HealthNet::new("connect_time_lb = \"off\"", &port_checks([1, 1]));
    let _d = net.host.start_ready();
    for i in 0..2 {
        net.wait_state("web", i, 8080, BackendState::Up);
        net.wait_state("dns", i, 5353, BackendState::Up);
    }
    let mut tcp = Held::start(&net.host, &["hold", "10.96.0.10", "80"]);
    let first = tcp.answer();
    let i = index_of(&first);

    // Draining: weight 0.
    let mut weights = [1, 1];
    weights[i] = 0;
    net.host.write("services.toml", &port_checks(weights));
    net.wait_state("web", i, 8080, BackendState::Draining);
    assert_only(&net, "tcp", NAMES[1 - i], "draining");
    assert_eq!(tcp.again(), first, "the established flow keeps its draining backend");

    // A flap: down, then up, while the connection lives.
    net.host.write("services.toml", &port_checks([1, 1]));
    net.wait_state("web", i, 8080, BackendState::Up);
    net.stop_check(i);
    net.wait_state("web", i, 8080, BackendState::Down);
    assert_eq!(tcp.again(), first, "the established flow keeps its backend while it is down");
    net.start_check(i);
    net.wait_state("web", i, 8080, BackendState::Up);
    assert_eq!(tcp.again(), first, "and after it is back");

    // A UDP flow (one socket, one 5-tuple) moves when its backend goes down.
    let mut udp = Held::start(&net.host, &["hold-udp", "10.96.0.10", "53", "unconnected"]);
    let flow_backend = udp.answer();
    let j = index_of(&flow_backend);
    net.stop_check(j);
    net.wait_state("dns", j, 5353, BackendState::Down);
    let moved = (0..20).map(|_| udp.again()).find(|a| *a != flow_backend);
    assert_eq!(moved.as_deref(), Some(NAMES[1 - j]), "the UDP flow moved to the serving backend");
    assert_eq!(udp.again(), NAMES[1 - j], "and stays there");
}

#[test]
fn a_connected_udp_socket_whose_backend_goes_down_gets_an_error() {
    let mut net = HealthNet::new("connect_time_lb = \"all\"", &port_checks([1, 1]));
    let d = net.host.start_ready();
    for i in 0..2 {
        net.wait_state("dns", i, 5353, BackendState::Up);
    }
    let mut udp = Held::start(&net.host, &["hold-udp", "10.96.0.10", "53", "connected"]);
    let backend = udp.answer();
    let i = index_of(&backend);
    net.stop_check(i);
    let stopped = Instant::now();
    let error = loop {
        udp.send_again();
        match udp.outcome() {
            Ok(answer) => assert_eq!(answer, backend, "the socket stays connected to its backend until destroyed"),
            Err(e) => break e,
        }
        assert!(stopped.elapsed() < scaled(hm_testkit::SOON), "no error in time\n{}", d.log_text());
        std::thread::sleep(Duration::from_millis(50));
    };
    // A destroyed socket is aborted and disconnected: a call blocked in
    // recv() gets ECONNABORTED, the next send() EDESTADDRREQ.
    assert!(["ECONNABORTED", "EDESTADDRREQ"].contains(&error.as_str()), "{error} after {:?}", stopped.elapsed());
    // A new socket reaches the serving backend.
    assert_only(&net, "udp", NAMES[1 - i], "after the destroy");
}

#[test]
fn with_every_backend_down_the_vip_refuses_at_once() {
    for mode in ["all", "off"] {
        let check = format!("kind = \"tcp\", port = {CHECK_PORT}");
        let mut net = HealthNet::new(&format!("connect_time_lb = \"{mode}\""), &services(&check, &check, [1, 1]));
        let _d = net.host.start_ready();
        for i in 0..2 {
            net.wait_state("web", i, 8080, BackendState::Up);
        }
        net.stop_check(0);
        net.stop_check(1);
        for i in 0..2 {
            net.wait_state("web", i, 8080, BackendState::Down);
            net.wait_state("dns", i, 5353, BackendState::Down);
        }
        let status = net.host.status();
        assert_eq!(status.counts.backends_down, 4, "{:?}", status.backends);
        // Connect-time LB refuses as the kernel lets it (EPERM without
        // bpf_set_retval()); the veth path answers the SYN with a RST.
        let want = if mode == "off" { "ECONNREFUSED" } else { net.host.refused_at_connect() };
        let v = net.client(&["refused", "tcp", "10.96.0.10", "80"]);
        // An error, not the client's 5 s timeout: refused at once.
        assert_eq!(v["error"], want, "mode {mode}: {v}");
        // Connected UDP likewise: at connect(), or by the veth path's ICMP
        // port unreachable.
        let v = net.client(&["refused", "udp", "10.96.0.10", "53"]);
        assert_eq!(v["error"], want, "mode {mode}, udp: {v}");
    }
}

/// Answers of 20 TCP connections to the VIP, each socket bound to
/// `source` when given.
fn twenty(net: &HealthNet, source: Option<&str>) -> Vec<(String, u64)> {
    let v = match source {
        Some(src) => net.client(&["requests-from", src, "tcp", "10.96.0.10", "80", "20"]),
        None => net.client(&["requests", "tcp", "10.96.0.10", "80", "20"]),
    };
    assert!(v["errors"].as_array().unwrap().is_empty(), "{v}");
    v["answers"].as_object().unwrap().iter().map(|(k, n)| (k.clone(), n.as_u64().unwrap())).collect()
}

fn one_backend(answers: &[(String, u64)], what: &str) -> usize {
    assert_eq!(answers.len(), 1, "{what}: 20 connections from one client reach one backend: {answers:?}");
    index_of(&answers[0].0)
}

/// `affinity = "client-ip"`: on the veth path the client is the source
/// address (the host's 192.168.10.1 here); for connect-time LB it is the
/// socket's bound address, and every unbound socket is "the host".
fn affinity_sticks_and_moves(mode: &str) {
    let check = format!("kind = \"tcp\", port = {CHECK_PORT}");
    // "plain" shares web's backends without checks, so a backend that is
    // down for web stays in the kernel's backend table: only hostmesh
    // forgetting web's clients of it moves them.
    let plain = format!(
        "\n[[service]]\nname = \"plain\"\nvip = \"10.96.0.12\"\nport = 80\nbackends = [\"{}:8080\", \"{}:8080\"]\n",
        BACKENDS[0], BACKENDS[1]
    );
    let services = services(&check, &check, [1, 1]).replacen(
        "health_check",
        "affinity = \"client-ip\"\naffinity_timeout = \"1h\"\nhealth_check",
        1,
    ) + &plain;
    let mut net = HealthNet::new(&format!("connect_time_lb = \"{mode}\""), &services);
    let _d = net.host.start_ready();
    for i in 0..2 {
        net.wait_state("web", i, 8080, BackendState::Up);
    }
    let first = one_backend(&twenty(&net, None), &format!("mode {mode}"));
    if mode == "all" {
        // A bound socket is a client of its own, and sticks too.
        one_backend(&twenty(&net, Some("192.168.10.2")), "bound to 192.168.10.2");
    }
    net.stop_check(first);
    net.wait_state("web", first, 8080, BackendState::Down);
    let moved = one_backend(&twenty(&net, None), &format!("mode {mode}, its backend down"));
    assert_eq!(moved, 1 - first, "mode {mode}: the client moved to the serving backend");
    net.start_check(first);
    net.wait_state("web", first, 8080, BackendState::Up);
    let after = one_backend(&twenty(&net, None), &format!("mode {mode}, the first backend back"));
    assert_eq!(after, moved, "mode {mode}: the client stays with its new backend");
}

#[test]
fn affinity_keeps_a_client_on_one_backend_and_moves_it_when_that_goes_down_connect_time() {
    affinity_sticks_and_moves("all");
}

#[test]
fn affinity_keeps_a_client_on_one_backend_and_moves_it_when_that_goes_down_veth_path() {
    affinity_sticks_and_moves("off");
}

/// `drain_timeout`: an established TCP connection keeps a backend that
/// left until the timeout, then it is dropped (reset on the veth path,
/// destroyed for connect-time LB).
fn drain_timeout_drops_established_flows(mode: &str) {
    let timeout = scaled(Duration::from_secs(1));
    let with = |weights: [u32; 2]| {
        port_checks(weights).replacen(
            "health_check",
            &format!("drain_timeout = \"{}ms\"\nhealth_check", timeout.as_millis()),
            1,
        )
    };
    let net = HealthNet::new(&format!("connect_time_lb = \"{mode}\""), &with([1, 1]));
    let _d = net.host.start_ready();
    for i in 0..2 {
        net.wait_state("web", i, 8080, BackendState::Up);
    }
    let mut tcp = Held::start(&net.host, &["hold", "10.96.0.10", "80"]);
    let first = tcp.answer();
    let i = index_of(&first);
    let mut weights = [1, 1];
    weights[i] = 0;
    net.host.write("services.toml", &with(weights));
    net.wait_state("web", i, 8080, BackendState::Draining);
    let drained = Instant::now();
    assert_eq!(tcp.again(), first, "mode {mode}: the flow keeps its backend within the drain timeout");
    let error = loop {
        tcp.send_again();
        match tcp.outcome() {
            Ok(answer) => assert_eq!(answer, first, "mode {mode}"),
            Err(e) => break e,
        }
        assert!(
            drained.elapsed() < timeout + scaled(hm_testkit::SOON),
            "mode {mode}: still up after the drain timeout"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let after = drained.elapsed();
    assert!(["ECONNRESET", "ECONNABORTED", "EPIPE", "closed"].contains(&error.as_str()), "mode {mode}: {error}");
    assert!(after >= timeout - Duration::from_millis(200), "mode {mode}: dropped after {after:?}, before the timeout");
    assert_only(&net, "tcp", NAMES[1 - i], &format!("mode {mode}, after the drain"));
}

#[test]
fn drain_timeout_drops_an_established_flow_veth_path() {
    drain_timeout_drops_established_flows("off");
}

#[test]
fn drain_timeout_drops_an_established_flow_connect_time() {
    drain_timeout_drops_established_flows("all");
}
