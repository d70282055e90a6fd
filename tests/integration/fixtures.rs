//! A test host: a network namespace with a daemon's dirs, and the config
//! snippets tests share.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use hm_testkit::{cli, Cgroup, Daemon, DaemonOptions, Netns, TempDir};
use hostmesh::state::Status;

pub const BIN: &str = env!("CARGO_BIN_EXE_hostmesh");

/// The integration tests run one at a time: their timing claims (a sidecar
/// within 1 s, a removal within 2 s) are about hostmesh, and on a 2-CPU
/// machine another test's daemon, namespaces and clients would be measured
/// too. Every test holds this from its first line.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One TCP request from inside `ns`: connect (300 ms at most), send a line,
/// read the answer line. In-process, so timing it measures the network,
/// not a client's start-up.
pub fn tcp_ask(ns: &Netns, addr: &str) -> std::io::Result<String> {
    use std::io::{BufRead, Write};
    let addr: std::net::SocketAddr = addr.parse().expect("address");
    ns.run(move || {
        let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300))?;
        s.set_read_timeout(Some(Duration::from_millis(500)))?;
        s.write_all(b"hello\n")?;
        let mut line = String::new();
        std::io::BufReader::new(s).read_line(&mut line)?;
        Ok(line.trim().to_string())
    })
}
pub const READY_TIMEOUT: Duration = Duration::from_secs(15);

pub const WEB: &str = r#"
[[service]]
name = "web"
vip = "10.96.0.10"
port = 80
backends = ["192.168.10.11:8080", { address = "192.168.10.12:8080", weight = 2 }]
"#;

pub const API: &str = r#"
[[service]]
name = "api"
vip = "10.96.0.20"
port = 443
backends = ["192.168.10.21:8443"]
"#;

/// A namespace with a daemon's dirs and a cgroup of its own for the
/// connect-time programs (`00-daemon.toml` points there: tests never attach
/// to the machine's cgroups). Fields drop in order: the daemon's dir
/// (unmounting its bpffs, which releases pins and programs), the cgroup,
/// then the namespace.
pub struct Host {
    pub opts: DaemonOptions,
    /// Held for its Drop: removes the daemon's files and bpffs.
    _dir: TempDir,
    pub cgroup: Cgroup,
    pub ns: Netns,
}

impl Host {
    pub fn new() -> Host {
        Self::with_daemon_config("")
    }

    /// A host whose `[daemon]` section has these extra lines.
    pub fn with_daemon_config(extra: &str) -> Host {
        let ns = Netns::new();
        let cgroup = Cgroup::new();
        let dir = TempDir::new("hm-it");
        let opts = DaemonOptions::in_dir(BIN, &dir);
        let host = Host { opts, _dir: dir, cgroup, ns };
        host.set_daemon_config(extra);
        host
    }

    /// Rewrites `00-daemon.toml`: the test cgroup plus `extra` lines.
    pub fn set_daemon_config(&self, extra: &str) {
        self.write("00-daemon.toml", &format!("[daemon]\ncgroup = \"{}\"\n{extra}\n", self.cgroup.path().display()));
    }

    pub fn start(&self) -> Daemon {
        Daemon::start(&self.ns, &self.opts)
    }

    /// Starts a daemon and waits for its first READY=1.
    pub fn start_ready(&self) -> Daemon {
        let d = self.start();
        d.wait_ready(READY_TIMEOUT);
        d
    }

    pub fn write(&self, name: &str, text: &str) {
        self.opts.write_config(name, text);
    }

    pub fn hostmesh(&self, args: &[&str]) -> Output {
        cli(&self.ns, Path::new(BIN), args)
    }

    /// `hostmesh status` (text) with this host's state dir.
    pub fn status_text(&self) -> (String, i32) {
        let out = self.hostmesh(&["status", "--state-dir", self.opts.state_dir.to_str().unwrap()]);
        (String::from_utf8_lossy(&out.stdout).into_owned(), out.status.code().unwrap_or(-1))
    }

    pub fn status(&self) -> Status {
        Status::read(&self.opts.state_dir).expect("status file")
    }

    /// Destinations of routes carrying hostmesh's protocol.
    pub fn owned_routes(&self) -> Vec<String> {
        let mut v: Vec<String> = ["hostmesh", "104"]
            .iter()
            .flat_map(|p| self.ns.routes_with_proto(p))
            .filter_map(|r| r["dst"].as_str().map(str::to_string))
            .collect();
        v.sort();
        v.dedup();
        v
    }

    pub fn has_route(&self, dst: &str) -> bool {
        self.owned_routes().iter().any(|r| r == dst)
    }

    pub fn teardown(&self) -> Output {
        let mut args = vec!["teardown".to_string()];
        args.extend(self.opts.path_args());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.hostmesh(&args)
    }
}
