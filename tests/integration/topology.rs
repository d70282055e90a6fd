//! The network the service tests run on:
//!
//! ```text
//!  host (hostmesh runs here)          backends                     far
//!  eth0 192.168.10.1/24  ------  eth0 192.168.10.11 "b1"       eth0 10.50.0.5 "f1"
//!       fd00:10::1/64                 192.168.10.12 "b2"  ----  (default via
//!  default via .254                   fd00:10::11 / ::12        10.50.0.1)
//!  local backend                      .254 routes to far:
//!  192.168.10.1:7070 "l1"             10.50.0.1/24
//! ```
//!
//! Backends answer TCP on 8080 and UDP on 5353 with their name; the far
//! backend sits behind a router hop; the local backend is an address of the
//! host itself.

use std::process::{Child, ChildStdin, ChildStdout, Stdio};

use hm_testkit::{wait_soon, Netns, Proto, Servers};
use serde_json::Value;

use crate::fixtures::*;

/// The VIP client (tests/clients/vip_client.rs): the one cargo built
/// beside the daemon, or `HM_TEST_CLIENT` (scripts/test-kernels runs copies).
pub fn client() -> String {
    std::env::var("HM_TEST_CLIENT").unwrap_or_else(|_| env!("CARGO_BIN_EXE_hm-vip-client").to_string())
}

pub const SERVICES: &str = r#"
[[service]]
name = "web"
vip = "10.96.0.10"
port = 80
backends = ["192.168.10.11:8080", "192.168.10.12:8080"]

[[service]]
name = "dns"
vip = "10.96.0.10"
port = 53
protocol = "udp"
backends = ["192.168.10.11:5353", "192.168.10.12:5353"]

[[service]]
name = "web6"
vip = "fd00:96::10"
port = 80
backends = ["[fd00:10::11]:8080", "[fd00:10::12]:8080"]

[[service]]
name = "dns6"
vip = "fd00:96::10"
port = 53
protocol = "udp"
backends = ["[fd00:10::11]:5353", "[fd00:10::12]:5353"]

[[service]]
name = "far"
vip = "10.96.0.20"
port = 80
backends = ["10.50.0.5:8080"]

[[service]]
name = "local"
vip = "10.96.0.30"
port = 80
backends = ["192.168.10.1:7070"]

[[service]]
name = "none"
vip = "10.96.0.40"
port = 80

[[service]]
name = "none-udp"
vip = "10.96.0.40"
port = 53
protocol = "udp"
"#;

/// The backend address a server's answer ("b1", "b2") stands for, on `port`.
pub fn backend_of(name: &str, port: u16) -> String {
    match name {
        "b1" => format!("192.168.10.11:{port}"),
        "b2" => format!("192.168.10.12:{port}"),
        other => panic!("unexpected answer {other}"),
    }
}

/// Beside SERVICES: a mesh entry for 10.96.0.60:80 (redirect port 15001)
/// and this host as a gateway with a peer site-b (endpoint 192.168.10.200,
/// which never answers) for 10.20.0.0/16; `gateway_extra` goes into
/// `[gateway]`.
pub fn mesh_and_peer(gateway_extra: &str) -> String {
    format!(
        "[[mesh]]\nname = \"api\"\nvip = \"10.96.0.60\"\nport = 80\nredirect_port = 15001\n\n\
         [gateway]\nrole = \"gateway\"\nlocal_ip = \"192.168.10.1\"\nvni = 4242\n{gateway_extra}\n\
         [[peer]]\nname = \"site-b\"\nendpoint = \"192.168.10.200\"\ncidrs = [\"10.20.0.0/16\"]\n"
    )
}

/// SERVICES without one backend, wherever it is in its list.
pub fn services_without(backend: &str) -> String {
    let quoted = format!("\"{backend}\"");
    SERVICES.replace(&format!("{quoted}, "), "").replace(&format!(", {quoted}"), "")
}

/// Field order is drop order: servers, then the host (daemon dirs, cgroup,
/// namespace), then the other namespaces.
pub struct Topology {
    _servers: Servers,
    pub host: Host,
    pub backends: Netns,
    /// Held for its Drop: the far backend's namespace.
    _far: Netns,
}

impl Topology {
    /// Builds the network and writes the services; the daemon is not started.
    pub fn new(daemon_config: &str) -> Topology {
        let host = Host::with_daemon_config(daemon_config);
        let backends = Netns::new();
        let far = Netns::new();
        host.ns.veth_to(&backends, ("eth0", "192.168.10.1/24"), ("eth0", "192.168.10.11/24"));
        backends.veth_to(&far, ("far0", "10.50.0.1/24"), ("eth0", "10.50.0.5/24"));
        backends.ip_batch(&[
            &["addr", "add", "192.168.10.12/24", "dev", "eth0"],
            &["addr", "add", "192.168.10.254/24", "dev", "eth0"],
            &["addr", "add", "fd00:10::11/64", "dev", "eth0", "nodad"],
            &["addr", "add", "fd00:10::12/64", "dev", "eth0", "nodad"],
        ]);
        host.ns.ip_batch(&[
            &["addr", "add", "fd00:10::1/64", "dev", "eth0", "nodad"],
            &["route", "add", "default", "via", "192.168.10.254", "dev", "eth0"],
            &["route", "add", "default", "via", "fd00:10::11", "dev", "eth0"],
        ]);
        far.ip(&["route", "add", "default", "via", "10.50.0.1"]);
        backends.set_sysctl("net/ipv4/ip_forward", "1");

        let servers = Servers::start(
            &backends,
            &[
                ("192.168.10.11:8080", Proto::Tcp, "b1"),
                ("192.168.10.12:8080", Proto::Tcp, "b2"),
                ("192.168.10.11:5353", Proto::Udp, "b1"),
                ("192.168.10.12:5353", Proto::Udp, "b2"),
                ("[fd00:10::11]:8080", Proto::Tcp, "b1"),
                ("[fd00:10::12]:8080", Proto::Tcp, "b2"),
                ("[fd00:10::11]:5353", Proto::Udp, "b1"),
                ("[fd00:10::12]:5353", Proto::Udp, "b2"),
            ],
        );
        let far_servers = Servers::start(&far, &[("10.50.0.5:8080", Proto::Tcp, "f1")]);
        let local_servers = Servers::start(&host.ns, &[("192.168.10.1:7070", Proto::Tcp, "l1")]);
        host.write("services.toml", SERVICES);
        Topology { _servers: servers.join(far_servers).join(local_servers), host, backends, _far: far }
    }

    /// Runs the client in the host namespace and the test cgroup.
    pub fn client(&self, args: &[&str]) -> Value {
        run_client(&self.host, args)
    }

    /// `count` requests; returns (answers by backend, peers seen, errors).
    pub fn requests(
        &self,
        proto: &str,
        vip: &str,
        port: u16,
        count: u32,
    ) -> (Vec<(String, u64)>, Vec<String>, Vec<String>) {
        let v = self.client(&["requests", proto, vip, &port.to_string(), &count.to_string()]);
        let answers = v["answers"].as_object().unwrap().iter().map(|(k, n)| (k.clone(), n.as_u64().unwrap())).collect();
        let strings = |key: &str| v[key].as_array().unwrap().iter().map(|x| x.as_str().unwrap().to_string()).collect();
        (answers, strings("peers"), strings("errors"))
    }

    /// A long-lived TCP connection to a VIP, driven request by request.
    pub fn hold(&self, vip: &str, port: u16) -> Held {
        Held::start(&self.host, &["hold", vip, &port.to_string()])
    }
}

impl Held {
    /// The client in `mode` (hold, hold-udp) in the host's namespace and cgroup.
    pub fn start(host: &Host, args: &[&str]) -> Held {
        let mut child = host
            .ns
            .command_in_cgroup(&client(), host.cgroup.path())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run the client");
        let stdin = child.stdin.take();
        let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        Held { child, stdin, stdout }
    }
}

impl Topology {
    /// Waits for a sync after a config change, which must have been accepted.
    pub fn wait_sync_after(&self, generation: u64) {
        wait_soon("a sync", || {
            let s = self.host.status();
            s.generation > generation && s.last_sync.ok
        })
        .unwrap_or_else(|e| panic!("{e}: {:?}", self.host.status().last_sync));
        let rejected: Vec<_> =
            self.host.status().files.into_iter().filter(|f| f.state != hostmesh::state::FileState::Applied).collect();
        assert!(rejected.is_empty(), "the test wrote a config hostmesh rejected: {rejected:?}");
    }

    /// Every entry of one of the veth path's conntrack maps: `HM_CT` (open
    /// flows) or `HM_CT_CLOSING` (closed TCP flows).
    pub fn conntrack(&self, map: hostmesh::abi::HmMap) -> Vec<(hostmesh::abi::CtKey, hostmesh::abi::CtValue)> {
        use hostmesh::abi::{CtKey, CtValue, Pod};
        use hostmesh::backends::bpf::sys;
        use std::os::fd::AsFd;
        let fd = sys::obj_get(&self.host.opts.bpffs.join("maps").join(map.name())).expect("pinned conntrack map");
        let def = map.def();
        sys::map_dump(fd.as_fd(), def.key_size as usize, def.value_size as usize)
            .unwrap()
            .into_iter()
            .map(|(k, v)| (CtKey::from_bytes(&k).unwrap(), CtValue::from_bytes(&v).unwrap()))
            .collect()
    }
}

impl Topology {
    /// The backend port of every entry of connect-time LB's reverse map
    /// (`HM_REVERSE_SOCK`: a socket it sent to a backend, by cookie).
    pub fn reverse_socket_ports(&self) -> Vec<u16> {
        use hostmesh::abi::{HmMap, Pod, RevSkKey};
        use hostmesh::backends::bpf::sys;
        use std::os::fd::AsFd;
        let map = HmMap::ReverseSock;
        let fd = sys::obj_get(&self.host.opts.bpffs.join("maps").join(map.name())).expect("pinned reverse map");
        let def = map.def();
        sys::map_dump(fd.as_fd(), def.key_size as usize, def.value_size as usize)
            .unwrap()
            .into_iter()
            .map(|(k, _)| u16::from_be(RevSkKey::from_bytes(&k).unwrap().port_be))
            .collect()
    }
}

/// The client, once, in `host`'s namespace and cgroup; its JSON answer.
pub fn run_client(host: &Host, args: &[&str]) -> Value {
    let out = host.ns.command_in_cgroup(&client(), host.cgroup.path()).args(args).output().expect("run the client");
    assert!(out.status.success(), "client {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("client {args:?}: {e}: {:?}", out.stdout))
}

/// Clients each sending a request every 50 ms for a few seconds.
pub struct Loops {
    clients: Vec<(String, Child)>,
}

impl Topology {
    /// Two loops to 10.96.0.10, TCP (port 80) and UDP (53); they run for
    /// `seconds`.
    pub fn loops(&self, seconds: u32) -> Loops {
        self.loops_to(&[("tcp", "10.96.0.10", 80), ("udp", "10.96.0.10", 53)], seconds)
    }

    /// A loop to each (protocol, address, port).
    pub fn loops_to(&self, targets: &[(&str, &str, u16)], seconds: u32) -> Loops {
        let clients = targets
            .iter()
            .map(|(proto, addr, port)| {
                let child = self
                    .host
                    .ns
                    .command_in_cgroup(&client(), self.host.cgroup.path())
                    .args(["loop", proto, addr, &port.to_string(), "0.05", &seconds.to_string()])
                    .stdout(Stdio::piped())
                    .spawn()
                    .expect("run the client");
                (format!("{proto} {addr}:{port}"), child)
            })
            .collect();
        Loops { clients }
    }
}

impl Loops {
    /// Waits for both to end: no request failed, and each got at least
    /// `min_ok` answers.
    pub fn assert_none_failed(self, min_ok: u64, what: &str) {
        for (proto, client) in self.clients {
            let out = client.wait_with_output().expect("wait for the client");
            let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{what}, {proto}: {e}"));
            assert_eq!(v["failures"].as_array().unwrap().len(), 0, "{what}, {proto}: {v}");
            assert!(v["ok"].as_u64().unwrap() >= min_ok, "{what}, {proto}: {v}");
        }
    }
}

pub struct Held {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: std::io::BufReader<ChildStdout>,
}

impl Held {
    /// The answer to the last request (the first comes on connect).
    pub fn answer(&mut self) -> String {
        self.outcome().unwrap_or_else(|e| panic!("the client got {e}"))
    }

    /// The answer to the last request, or the error name it got.
    pub fn outcome(&mut self) -> Result<String, String> {
        use std::io::BufRead;
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read from client");
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("client said {line:?}: {e}"));
        match v["answer"].as_str() {
            Some(a) => Ok(a.to_string()),
            None => Err(v["error"].as_str().unwrap_or("no answer or error").to_string()),
        }
    }

    /// Sends another request on the same connection.
    pub fn again(&mut self) -> String {
        self.send_again();
        self.answer()
    }

    /// Sends another request; `outcome` reads its result.
    pub fn send_again(&mut self) {
        use std::io::Write;
        writeln!(self.stdin.as_mut().unwrap(), "again").unwrap();
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        drop(self.stdin.take()); // EOF: the client exits
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `ip route get` in the host namespace.
pub fn route_to(ns: &Netns, dst: &str) -> String {
    ns.ip(&["route", "get", dst])
}
