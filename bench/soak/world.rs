//! The soak's world: a host namespace running hostmesh, a namespace of
//! backends behind `eth0`, and a client namespace on another "machine"
//! behind `eth1` (the node port's side). Each backend is a pair of named
//! servers (TCP and UDP) that a fault may kill and start again; the daemon
//! may be signalled, killed and started again. Beside them, two sites
//! joined by their gateways (`crate::sites`).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

use hm_testkit::{Daemon, DaemonOptions, Netns, Proto, Servers, TempDir};

use crate::sites::Sites;

pub const WEB_VIP: &str = "10.96.0.10";
pub const WEB_PORT: u16 = 80;
pub const DNS_VIP: &str = "10.96.0.53";
pub const DNS_PORT: u16 = 53;
pub const NODE_PORT: u16 = 30080;
/// A mesh redirect: connections to it go to the sidecar's listener.
pub const MESH_VIP: &str = "10.96.0.80";
pub const MESH_PORT: u16 = 80;
const SIDECAR_PORT: u16 = 15001;
/// The sidecar the mesh tests use: a process of its own (Python).
const SIDECAR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/clients/sidecar.py");
/// The host's address on the outside client's link.
pub const HOST_OUTSIDE: &str = "172.16.0.1";
pub const OUTSIDE: &str = "172.16.0.2";
pub const BACKENDS: [&str; 3] = ["192.168.10.11", "192.168.10.12", "192.168.10.13"];
/// UDP flows the conntrack map holds; a pressure burst opens more.
pub const CONNTRACK_SIZE: usize = 4096;
/// The veth path's UDP flow expiry this soak configures.
pub const UDP_TIMEOUT_S: u64 = 5;
/// Services beside the loaded ones, so a sync takes long enough for a
/// SIGKILL to land in one.
pub const BULK: usize = 3000;

pub struct World {
    pub host: Netns,
    pub backends_ns: Netns,
    pub outside: Netns,
    pub opts: DaemonOptions,
    pub daemon: Option<Daemon>,
    backends: Vec<Option<Servers>>,
    sidecar: Option<std::process::Child>,
    pub cgroup: PathBuf,
    _dir: TempDir,
    /// The two sites, in namespaces of their own.
    pub sites: Sites,
}

impl World {
    pub fn new(bin: &std::path::Path, cgroup: PathBuf) -> World {
        let host = Netns::new();
        let backends_ns = Netns::new();
        let outside = Netns::new();
        host.veth_to(&backends_ns, ("eth0", "192.168.10.1/24"), ("eth0", "192.168.10.11/24"));
        for b in &BACKENDS[1..] {
            backends_ns.ip(&["addr", "add", &format!("{b}/24"), "dev", "eth0"]);
        }
        backends_ns.ip(&["route", "add", "default", "via", "192.168.10.1"]);
        host.veth_to(&outside, ("eth1", &format!("{HOST_OUTSIDE}/24")), ("eth0", &format!("{OUTSIDE}/24")));
        outside.ip(&["route", "add", "default", "via", HOST_OUTSIDE]);
        for ns in [&host, &backends_ns, &outside] {
            ns.set_sysctl("net/ipv4/tcp_tw_reuse", "1");
            ns.set_sysctl("net/ipv4/ip_local_port_range", "10000 60999");
        }
        host.set_sysctl("net/ipv4/ip_forward", "1");
        let dir = TempDir::new("hm-soak");
        let opts = DaemonOptions::in_dir(bin.to_str().expect("utf-8 path"), &dir);
        let mut w = World {
            host,
            backends_ns,
            outside,
            opts,
            daemon: None,
            backends: vec![],
            sidecar: None,
            cgroup,
            _dir: dir,
            sites: Sites::new(bin),
        };
        w.backends = (0..BACKENDS.len()).map(|i| Some(w.serve(i))).collect();
        w.start_sidecar();
        w.write_config();
        w
    }

    fn serve(&self, i: usize) -> Servers {
        let name = format!("b{}", i + 1);
        Servers::start(
            &self.backends_ns,
            &[
                (&format!("{}:8080", BACKENDS[i]), Proto::Tcp, &name),
                (&format!("{}:5353", BACKENDS[i]), Proto::Udp, &name),
            ],
        )
    }

    /// Stops backend `i`'s servers (a crash: listeners closed, connections
    /// reset).
    pub fn kill_backend(&mut self, i: usize) {
        self.backends[i] = None;
    }

    pub fn start_backend(&mut self, i: usize) {
        if self.backends[i].is_none() {
            self.backends[i] = Some(self.serve(i));
        }
    }

    /// The mesh's sidecar, answering "b-sidecar ..." once it listens.
    pub fn start_sidecar(&mut self) {
        use std::io::BufRead;
        let mut child = self
            .host
            .command("python3")
            .args([SIDECAR, "b-sidecar", &SIDECAR_PORT.to_string()])
            .stdout(std::process::Stdio::piped())
            // Its tracebacks of clients that reset their connection (every
            // one of the soak's does) are noise here.
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start the sidecar (python3)");
        let mut line = String::new();
        let _ = std::io::BufReader::new(child.stdout.as_mut().expect("its stdout")).read_line(&mut line);
        assert_eq!(line.trim(), "ready", "the sidecar did not start");
        self.sidecar = Some(child);
    }

    /// Ends the sidecar (by its PID: the child this world started).
    pub fn kill_sidecar(&mut self) {
        if let Some(mut c) = self.sidecar.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn write(&self, name: &str, text: &str) {
        self.opts.write_config(name, text);
    }

    pub fn conf(&self, name: &str) -> PathBuf {
        self.opts.config_dir.join(name)
    }

    fn write_config(&self) {
        self.write(
            "00-daemon.toml",
            &format!(
                "[daemon]\ncgroup = \"{}\"\nhost_interfaces = [\"eth1\"]\nconntrack_size = {CONNTRACK_SIZE}\n\
                 conntrack_udp_timeout = \"{UDP_TIMEOUT_S}s\"\n",
                self.cgroup.display()
            ),
        );
        self.write("10-web.toml", &web(1));
        self.write("20-dns.toml", &dns());
        self.write(
            "25-mesh.toml",
            &format!(
                "[[mesh]]\nname = \"mesh\"\nvip = \"{MESH_VIP}\"\nport = {MESH_PORT}\nredirect_port = {SIDECAR_PORT}\n"
            ),
        );
        let mut bulk = String::with_capacity(BULK * 120);
        for i in 0..BULK {
            bulk.push_str(&format!(
                "[[service]]\nname = \"bulk{i}\"\nvip = \"10.97.{}.{}\"\nport = 80\nbackends = [\"192.168.10.11:8080\"]\n\n",
                i / 250,
                i % 250 + 1
            ));
        }
        self.write("30-bulk.toml", &bulk);
    }

    pub fn start_daemon(&mut self) {
        let d = Daemon::start(&self.host, &self.opts);
        d.wait_ready(Duration::from_secs(60));
        self.daemon = Some(d);
    }

    pub fn pid(&self) -> Option<u32> {
        self.daemon.as_ref().map(|d| d.pid())
    }

    /// `hostmesh ARGS` in the host namespace: its exit code and output.
    pub fn hostmesh(&self, args: &[&str]) -> (i32, String) {
        let out = hm_testkit::cli(&self.host, &self.opts.bin, args);
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        (out.status.code().unwrap_or(-1), text)
    }

    /// The status file as JSON.
    pub fn status(&self) -> Option<serde_json::Value> {
        let text = fs::read_to_string(self.opts.state_dir.join("status.json")).ok()?;
        serde_json::from_str(&text).ok()
    }
}

/// Stops `daemon` (if it runs), runs `hostmesh teardown` in `ns` with the
/// paths of `opts`, and returns what is left: a failed teardown, and the
/// kernel objects and pins `leftovers` finds.
pub fn teardown(ns: &Netns, opts: &DaemonOptions, daemon: Option<Daemon>) -> Vec<String> {
    if let Some(mut d) = daemon {
        d.stop(Duration::from_secs(30));
    }
    let mut args = vec!["teardown".to_string()];
    args.extend(opts.path_args());
    let out = hm_testkit::cli(ns, &opts.bin, &args.iter().map(String::as_str).collect::<Vec<_>>());
    let mut left = Vec::new();
    if !out.status.success() {
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        left.push(format!("teardown exited {:?}: {text}", out.status.code()));
    }
    left.extend(leftovers(ns, opts));
    left
}

/// The kernel objects hostmesh leaves in `ns` and in the pins of `opts`:
/// none after a teardown.
fn leftovers(ns: &Netns, opts: &DaemonOptions) -> Vec<String> {
    let mut out: Vec<String> =
        ns.links().into_iter().filter(|l| l.starts_with("hm-")).map(|l| format!("link {l}")).collect();
    out.extend(ns.routes_with_proto("hostmesh").iter().map(|r| format!("route {r}")));
    if let Ok(entries) = fs::read_dir(&opts.bpffs) {
        out.extend(entries.flatten().map(|e| format!("pin {}", e.path().display())));
    }
    out
}

impl Drop for World {
    fn drop(&mut self) {
        self.kill_sidecar();
    }
}

/// The web service (connect-time path and node port) with b3's weight.
pub fn web(b3_weight: u32) -> String {
    format!(
        "[[service]]\nname = \"web\"\nvip = \"{WEB_VIP}\"\nport = {WEB_PORT}\nnode_port = {NODE_PORT}\n\
         backends = [\"{}:8080\", \"{}:8080\", {{ address = \"{}:8080\", weight = {b3_weight} }}]\n\
         health_check = {{ kind = \"tcp\", interval = \"300ms\", timeout = \"200ms\", rise = 1, fall = 2 }}\n",
        BACKENDS[0], BACKENDS[1], BACKENDS[2]
    )
}

/// The dns service (UDP: the veth path).
pub fn dns() -> String {
    format!(
        "[[service]]\nname = \"dns\"\nvip = \"{DNS_VIP}\"\nport = {DNS_PORT}\nprotocol = \"udp\"\n\
         backends = [\"{}:5353\", \"{}:5353\", \"{}:5353\"]\n\
         health_check = {{ kind = \"udp\", send = \"ping\", interval = \"300ms\", timeout = \"200ms\", rise = 1, fall = 2 }}\n",
        BACKENDS[0], BACKENDS[1], BACKENDS[2]
    )
}

/// Makes a file's mode what hostmesh requires (for files written in
/// pieces by hand).
pub fn chmod_644(p: &std::path::Path) {
    let _ = fs::set_permissions(p, fs::Permissions::from_mode(0o644));
}
