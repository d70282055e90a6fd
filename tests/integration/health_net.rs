//! The network of the health-check tests:
//!
//! ```text
//!  host (hostmesh runs here)        backends
//!  eth0 192.168.10.1/24  ------  eth0 192.168.10.11 "b1"
//!       192.168.10.2/24               192.168.10.12 "b2"
//! ```
//!
//! Each backend has its own servers, stopped and started one by one: TCP
//! 8080 and UDP 5353 answering with its name (the service ports), and TCP
//! 9090 (a check port, for tests that fail checks while the service keeps
//! answering).

use std::time::Duration;

use hm_testkit::{Netns, Proto, Servers};
use hostmesh::state::{BackendState, BackendStatus};
use serde_json::Value;

use crate::fixtures::*;
use crate::topology::run_client;

pub const BACKENDS: [&str; 2] = ["192.168.10.11", "192.168.10.12"];
pub const NAMES: [&str; 2] = ["b1", "b2"];
pub const CHECK_PORT: u16 = 9090;

/// The check interval the tests use (200 ms; at most three times that on
/// a slow machine, where a check on a local link still takes
/// milliseconds), and `fall = rise = 2`.
pub fn interval() -> Duration {
    Duration::from_millis(200) * hm_testkit::time_scale().min(3)
}

/// A web (TCP 80) and a dns (UDP 53) service on 10.96.0.10 over both
/// backends, each with `check` as its health check's extra keys and the
/// test's interval, rise and fall; `weights` per backend.
pub fn services(web_check: &str, dns_check: &str, weights: [u32; 2]) -> String {
    let timing = format!("interval = \"{}ms\", rise = 2, fall = 2", interval().as_millis());
    let list = |port: u16| -> String {
        let items: Vec<String> = BACKENDS
            .iter()
            .zip(weights)
            .map(|(b, w)| format!("{{ address = \"{b}:{port}\", weight = {w} }}"))
            .collect();
        items.join(", ")
    };
    format!(
        "[[service]]\nname = \"web\"\nvip = \"10.96.0.10\"\nport = 80\nbackends = [{}]\nhealth_check = {{ {web_check}, {timing} }}\n\n\
         [[service]]\nname = \"dns\"\nvip = \"10.96.0.10\"\nport = 53\nprotocol = \"udp\"\nbackends = [{}]\nhealth_check = {{ {dns_check}, {timing} }}\n",
        list(8080),
        list(5353)
    )
}

/// Servers first, then the host (daemon dirs, cgroup, namespace), then the
/// backends' namespace.
pub struct HealthNet {
    main: [Option<Servers>; 2],
    checks: [Option<Servers>; 2],
    pub host: Host,
    pub backends: Netns,
}

impl HealthNet {
    /// Builds the network, starts every server and writes `services`; the
    /// daemon is not started.
    pub fn new(daemon_config: &str, services: &str) -> HealthNet {
        let host = Host::with_daemon_config(daemon_config);
        let backends = Netns::new();
        host.ns.veth_to(&backends, ("eth0", "192.168.10.1/24"), ("eth0", "192.168.10.11/24"));
        host.ns.ip_batch(&[
            &["addr", "add", "192.168.10.2/24", "dev", "eth0"],
            &["route", "add", "default", "via", "192.168.10.11", "dev", "eth0"],
        ]);
        backends.ip(&["addr", "add", "192.168.10.12/24", "dev", "eth0"]);
        let mut net = HealthNet { main: [None, None], checks: [None, None], host, backends };
        for i in 0..2 {
            net.start_main(i);
            net.start_check(i);
        }
        net.host.write("services.toml", services);
        net
    }

    pub fn start_main(&mut self, i: usize) {
        let (tcp, udp) = (format!("{}:8080", BACKENDS[i]), format!("{}:5353", BACKENDS[i]));
        self.main[i] =
            Some(Servers::start(&self.backends, &[(&tcp, Proto::Tcp, NAMES[i]), (&udp, Proto::Udp, NAMES[i])]));
    }

    /// Stops a backend's service servers (its open connections end too).
    pub fn stop_main(&mut self, i: usize) {
        self.main[i] = None;
    }

    pub fn start_check(&mut self, i: usize) {
        let addr = format!("{}:{CHECK_PORT}", BACKENDS[i]);
        self.checks[i] = Some(Servers::start(&self.backends, &[(&addr, Proto::Tcp, NAMES[i])]));
    }

    pub fn stop_check(&mut self, i: usize) {
        self.checks[i] = None;
    }

    pub fn client(&self, args: &[&str]) -> Value {
        run_client(&self.host, args)
    }

    /// `count` requests to the VIP on a new socket each: answers by
    /// backend name, and errors.
    pub fn requests(&self, proto: &str, count: u32) -> (Vec<(String, u64)>, Vec<String>) {
        let port = if proto == "tcp" { "80" } else { "53" };
        let v = self.client(&["requests", proto, "10.96.0.10", port, &count.to_string()]);
        let answers = v["answers"].as_object().unwrap().iter().map(|(k, n)| (k.clone(), n.as_u64().unwrap())).collect();
        let errors = v["errors"].as_array().unwrap().iter().map(|x| x.as_str().unwrap().to_string()).collect();
        (answers, errors)
    }

    /// The status of one backend of one service.
    pub fn backend(&self, service: &str, i: usize, port: u16) -> Option<BackendStatus> {
        let addr: std::net::SocketAddr = format!("{}:{port}", BACKENDS[i]).parse().unwrap();
        self.host.status().backends.into_iter().find(|b| b.service == service && b.address == addr)
    }

    /// Waits until `hostmesh status` shows that state.
    pub fn wait_state(&self, service: &str, i: usize, port: u16, state: BackendState) {
        let what = format!("{service} backend {} {state}", NAMES[i]);
        hm_testkit::wait_soon(&what, || self.backend(service, i, port).is_some_and(|b| b.state == state))
            .unwrap_or_else(|e| panic!("{e}: {:?}", self.backend(service, i, port)));
    }
}

pub const REQUESTS: u32 = 32;

pub fn assert_only(net: &HealthNet, proto: &str, name: &str, what: &str) {
    let (answers, errors) = net.requests(proto, REQUESTS);
    assert!(errors.is_empty(), "{what}, {proto}: {errors:?}");
    assert_eq!(answers, [(name.to_string(), u64::from(REQUESTS))], "{what}, {proto}");
}

/// Waits until every request of a round reaches `name` and none fails:
/// after a change of health, the sync that applies it follows the status
/// that shows it.
pub fn wait_only(net: &HealthNet, proto: &str, name: &str, what: &str) {
    hm_testkit::wait_soon(&format!("{what}: only {name} answers {proto}"), || {
        let (answers, errors) = net.requests(proto, REQUESTS);
        errors.is_empty() && answers == [(name.to_string(), u64::from(REQUESTS))]
    })
    .unwrap();
}

/// Waits until a round of requests reaches both backends and none fails.
pub fn wait_both(net: &HealthNet, proto: &str, what: &str) {
    hm_testkit::wait_soon(&format!("{what}: both backends answer {proto}"), || {
        let (answers, errors) = net.requests(proto, REQUESTS);
        errors.is_empty() && answers.iter().map(|(n, _)| n.as_str()).eq(NAMES)
    })
    .unwrap();
}

/// Checks on the check port, so a backend fails them while it serves.
pub fn port_checks(weights: [u32; 2]) -> String {
    let check = format!("kind = \"tcp\", port = {CHECK_PORT}");
    services(&check, &check, weights)
}

pub fn index_of(name: &str) -> usize {
    NAMES.iter().position(|n| *n == name).unwrap()
}
