//! A test host: a network namespace with a daemon's dirs, and the config
//! snippets tests share.

use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Output, Stdio};
use std::time::Duration;

use hm_testkit::{cli, Cgroup, Daemon, DaemonOptions, Netns, TempDir};
use hostmesh::state::Status;

/// The hostmesh binary under test: the one cargo built for this test
/// binary, or `HM_TEST_DAEMON` (scripts/test-kernels runs a copy, so a
/// build meanwhile changes nothing under a running suite).
pub fn bin() -> String {
    std::env::var("HM_TEST_DAEMON").unwrap_or_else(|_| env!("CARGO_BIN_EXE_hostmesh").to_string())
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

#[allow(dead_code)]
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
        let opts = DaemonOptions::in_dir(&bin(), &dir);
        let host = Host { opts, _dir: dir, cgroup, ns };
        host.set_daemon_config(extra);
        host
    }

    /// Rewrites `00-daemon.toml`: the test cgroup plus `extra` lines (and
    /// the TC attach mode of `HM_TEST_TC_ATTACH`, when the suite runs in
    /// one, unless `extra` sets it).
    pub fn set_daemon_config(&self, extra: &str) {
        self.set_daemon_config_in(self.cgroup.path(), extra);
    }

    /// As `set_daemon_config`, with the connect-time programs on `cgroup`.
    pub fn set_daemon_config_in(&self, cgroup: &Path, extra: &str) {
        let tc = match std::env::var("HM_TEST_TC_ATTACH") {
            Ok(mode) if !extra.contains("tc_attach") => format!("tc_attach = \"{mode}\"\n"),
            _ => String::new(),
        };
        self.write("00-daemon.toml", &format!("[daemon]\ncgroup = \"{}\"\n{tc}{extra}\n", cgroup.display()));
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
        cli(&self.ns, Path::new(&bin()), args)
    }

    /// `hostmesh check FLAGS` of this host's config dirs.
    pub fn check(&self, flags: &[&str]) -> Output {
        let mut args = vec!["check".to_string()];
        args.extend(flags.iter().map(|f| f.to_string()));
        args.extend(self.opts.config_args());
        self.hostmesh(&args.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// `hostmesh status` (text) with this host's state dir.
    pub fn status_text(&self) -> (String, i32) {
        let out = self.hostmesh(&["status", "--state-dir", self.opts.state_dir.to_str().unwrap()]);
        (String::from_utf8_lossy(&out.stdout).into_owned(), out.status.code().unwrap_or(-1))
    }

    pub fn status(&self) -> Status {
        Status::read(&self.opts.state_dir).expect("status file")
    }

    /// The error connect() to a VIP with no backends gets from the
    /// connect-time programs: ECONNREFUSED where the kernel has
    /// bpf_set_retval(), EPERM where it has not (the running daemon's
    /// status says which; README, Kernels).
    pub fn refused_at_connect(&self) -> &'static str {
        let kernel = self.status().kernel.expect("a kernel section");
        if kernel.missing.iter().any(|m| m.feature == hostmesh::Feature::SetRetval) {
            "EPERM"
        } else {
            "ECONNREFUSED"
        }
    }

    /// Destinations of routes carrying hostmesh's protocol.
    /// Every route with hostmesh's protocol, in any table, as `ip route`
    /// names its destination (a host route by its address alone); read
    /// over rtnetlink, so polling it spawns nothing.
    pub fn owned_routes(&self) -> Vec<String> {
        let mut v: Vec<String> = self.ns.run(|| {
            let mut net = hostmesh::backends::netlink::Rtnetlink::open().expect("rtnetlink");
            net.owned_routes()
                .expect("dump routes")
                .into_iter()
                .map(|k| {
                    if k.dst.prefix_len() == k.dst.max_prefix_len() {
                        k.dst.addr().to_string()
                    } else {
                        k.dst.to_string()
                    }
                })
                .collect()
        });
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

/// A filter on a clsact qdisc, as `tc -j filter show` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcFilter {
    pub dev: String,
    /// "ingress" or "egress".
    pub dir: String,
    pub pref: u64,
    pub kind: String,
    /// "0x1" (hexadecimal, as tc prints it).
    pub handle: String,
    /// bpf filters: the name given at attach time (`bpf_name`).
    pub name: Option<String>,
    /// bpf filters: the program's id.
    pub prog: Option<u32>,
}

impl TcFilter {
    /// At one of hostmesh's priorities with its handle, a bpf filter named
    /// `hm_*`.
    pub fn is_hostmesh(&self) -> bool {
        use hostmesh::backends::netlink::tc::{PRIO_AFTER, PRIO_FIRST};
        [u64::from(PRIO_FIRST), u64::from(PRIO_AFTER)].contains(&self.pref)
            && self.handle == "0x1"
            && self.kind == "bpf"
            && self.name.as_deref().is_some_and(|n| n.starts_with("hm_"))
    }
}

/// Interfaces of `ns` with a clsact qdisc (`tc qdisc show`).
pub fn clsact_devices(ns: &hm_testkit::Netns) -> Vec<String> {
    let text = ns.exec("tc", &["-j", "qdisc", "show"]);
    let qdiscs: Vec<serde_json::Value> =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("tc qdisc: {e}: {text}"));
    qdiscs.iter().filter(|q| q["kind"] == "clsact").filter_map(|q| q["dev"].as_str().map(String::from)).collect()
}

/// Every filter on every clsact qdisc of `ns`.
pub fn tc_filters(ns: &hm_testkit::Netns) -> Vec<TcFilter> {
    let mut out = Vec::new();
    for dev in clsact_devices(ns) {
        for dir in ["ingress", "egress"] {
            let text = ns.exec("tc", &["-j", "filter", "show", "dev", &dev, dir]);
            let list: Vec<serde_json::Value> = if text.trim().is_empty() {
                Vec::new()
            } else {
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("tc filter: {e}: {text}"))
            };
            // Each priority's head entry has no options.
            for f in list.iter().filter(|f| f.get("options").is_some()) {
                let o = &f["options"];
                out.push(TcFilter {
                    dev: dev.clone(),
                    dir: dir.to_string(),
                    pref: f["pref"].as_u64().unwrap_or(0),
                    kind: f["kind"].as_str().unwrap_or("").to_string(),
                    handle: o["handle"].as_str().unwrap_or("").to_string(),
                    name: o["bpf_name"].as_str().map(String::from),
                    prog: o["prog"]["id"].as_u64().map(|id| id as u32),
                });
            }
        }
    }
    out
}

/// hostmesh's own filters in `ns`.
pub fn hostmesh_filters(ns: &hm_testkit::Netns) -> Vec<TcFilter> {
    tc_filters(ns).into_iter().filter(TcFilter::is_hostmesh).collect()
}

impl Host {
    /// How the daemon attaches TC programs here (its status says).
    pub fn tc_mode(&self) -> hostmesh::TcAttach {
        self.status().kernel.expect("the status has a kernel section").tc_attach
    }

    /// Every program hostmesh attached, as `(hook, program id)`: pinned
    /// links by pin name, clsact filters as `name@tc-DIR@DEV`.
    pub fn attached_programs(&self) -> Vec<(String, u32)> {
        use std::os::fd::AsFd;
        let links = self.opts.bpffs.join("links");
        let mut out: Vec<(String, u32)> = std::fs::read_dir(&links)
            .map(|dir| {
                dir.map(|e| {
                    let name = e.unwrap().file_name().into_string().unwrap();
                    let fd = hostmesh::backends::bpf::sys::obj_get(&links.join(&name)).unwrap();
                    (name, hostmesh::backends::bpf::sys::link_info(fd.as_fd()).unwrap().prog_id)
                })
                .collect()
            })
            .unwrap_or_default();
        for f in hostmesh_filters(&self.ns) {
            let id = f.prog.expect("a bpf filter has a program");
            out.push((format!("{}@tc-{}@{}", f.name.unwrap_or_default(), f.dir, f.dev), id));
        }
        out.sort();
        out
    }
}

/// tests/clients/sidecar.py: a mesh sidecar answering with its name.
pub const SIDECAR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/clients/sidecar.py");

/// A sidecar process, killed by PID on drop.
pub struct Sidecar {
    child: Child,
}

impl Sidecar {
    pub fn start(host: &Host, name: &str, port: u16) -> Sidecar {
        let mut child = host
            .ns
            .command("python3")
            .args([SIDECAR, name, &port.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the sidecar");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "the sidecar did not start");
        Sidecar { child }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Another tool's filter on `dev`'s ingress at `pref` that passes every
/// packet and ends classification: `matchall action pass` where the kernel
/// has it, else classic BPF that matches everything (with no action, a
/// match ends classification with TC_ACT_OK just the same). Debian's
/// kernels, which the kernel matrix boots (`HM_KERNEL_LACKS` set), have
/// cls_matchall: there the reported filter itself is the one used.
pub fn pass_everything(ns: &hm_testkit::Netns, dev: &str, pref: &str) {
    let matchall = ["filter", "add", "dev", dev, "ingress", "pref", pref, "matchall", "action", "pass"];
    if std::env::var_os("HM_KERNEL_LACKS").is_some() {
        ns.exec("tc", &matchall);
    } else if !ns.exec_output("tc", &matchall).status.success() {
        let bytecode = ["filter", "add", "dev", dev, "ingress", "pref", pref, "bpf", "bytecode", "1,6 0 0 4294967295,"];
        ns.exec("tc", &bytecode);
    }
}

/// A socket bound to `src` with SO_REUSEADDR (the port may still hold a
/// TIME_WAIT connection), in the caller's namespace.
pub fn bound(kind: nix::sys::socket::SockType, src: std::net::SocketAddr) -> std::io::Result<std::os::fd::OwnedFd> {
    use nix::sys::socket::{self, AddressFamily, SockFlag, SockaddrStorage};
    let family = if src.is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 };
    let fd = socket::socket(family, kind, SockFlag::SOCK_CLOEXEC, None)?;
    socket::setsockopt(&fd, socket::sockopt::ReuseAddr, &true)?;
    socket::bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrStorage::from(src))?;
    Ok(fd)
}

/// Whether this kernel makes WireGuard links: in the kernel matrix, every
/// Debian kernel does (its module, loaded by the harness); here, asked of
/// the kernel itself in a namespace of the test's own.
pub fn kernel_has_wireguard() -> bool {
    if let Ok(lacks) = std::env::var("HM_KERNEL_LACKS") {
        return !lacks.split(',').any(|f| f.trim() == "wireguard");
    }
    hm_testkit::kernel_makes_wireguard_links()
}
