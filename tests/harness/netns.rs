use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, FromRawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Output};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{setns, unshare, CloneFlags};

/// A network namespace, deleted on drop (with every link in it).
pub struct Netns {
    name: String,
}

impl Netns {
    /// What `ip netns add` and `ip -n NAME link set lo up` do, done in
    /// this process: each spawned `ip` costs a test a fifth of a second in
    /// an emulated VM, and every test makes several namespaces.
    pub fn new() -> Netns {
        crate::require_root();
        let name = crate::unique("hmt");
        let path = format!("{NETNS_DIR}/{name}");
        std::thread::spawn(move || create_netns(&path).unwrap_or_else(|e| panic!("create the netns {path}: {e}")))
            .join()
            .expect("the thread creating a netns panicked");
        Netns { name }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn path(&self) -> String {
        format!("{NETNS_DIR}/{}", self.name)
    }

    /// The namespace file, for setns(2) from threads the caller owns.
    pub fn file(&self) -> File {
        File::open(self.path()).expect("open netns")
    }

    /// A command that runs in this namespace. Only the network namespace
    /// changes (not the mount namespace, unlike `ip netns exec`), so
    /// bpffs and cgroup paths stay as the test sees them.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        let ns = self.file();
        // SAFETY: setns is async-signal-safe; the fd stays open until exec.
        unsafe {
            cmd.pre_exec(move || {
                setns(ns.as_fd(), CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)?;
                Ok(())
            });
        }
        cmd
    }

    /// A command that runs in this namespace and in `cgroup` (a cgroup v2
    /// dir), where a test's connect-time programs are attached.
    pub fn command_in_cgroup(&self, program: &str, cgroup: &std::path::Path) -> Command {
        let mut cmd = self.command(program);
        // Built before fork: the child must not allocate (another thread of
        // the test may hold the allocator's lock at fork time).
        let procs = std::ffi::CString::new(cgroup.join("cgroup.procs").into_os_string().into_encoded_bytes())
            .expect("cgroup path without NUL");
        // SAFETY: open(2), write(2) and close(2) are async-signal-safe; "0"
        // names the calling process.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let written = libc::write(fd, b"0".as_ptr() as *const libc::c_void, 1);
                libc::close(fd);
                if written != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd
    }

    /// Runs a command in the namespace; panics with its output if it fails.
    pub fn exec(&self, program: &str, args: &[&str]) -> String {
        let out = run_ok(self.command(program).args(args));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs a command in the namespace with `input` on its stdin (`nft -f
    /// -`); panics with its output if it fails.
    pub fn exec_with_input(&self, program: &str, args: &[&str], input: &str) -> String {
        use std::io::Write;
        let mut child = self
            .command(program)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {program}: {e}"));
        child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("write stdin");
        let out = child.wait_with_output().expect("wait for the command");
        assert!(
            out.status.success(),
            "{program} {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs a command in the namespace and returns its output, failed or not.
    pub fn exec_output(&self, program: &str, args: &[&str]) -> Output {
        self.command(program).args(args).output().expect("spawn command")
    }

    /// `ip -n <ns> <args>`; panics on failure.
    pub fn ip(&self, args: &[&str]) -> String {
        let mut full = vec!["-n", &self.name];
        full.extend_from_slice(args);
        let out = run_ok(Command::new("ip").args(&full));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Several `ip -n <ns>` commands in one process (`ip -batch`): each
    /// spawned `ip` costs a tenth of a second under emulation. Panics if
    /// one fails.
    pub fn ip_batch(&self, commands: &[&[&str]]) {
        let script: String = commands.iter().map(|c| c.join(" ") + "\n").collect();
        let mut child = Command::new("ip")
            .args(["-n", &self.name, "-batch", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn ip -batch");
        use std::io::Write;
        child.stdin.take().expect("stdin").write_all(script.as_bytes()).expect("write ip -batch");
        let out = child.wait_with_output().expect("wait for ip -batch");
        assert!(
            out.status.success(),
            "ip -n {} -batch failed on:\n{script}{}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `ip -j -n <ns> <args>` parsed.
    pub fn ip_json(&self, args: &[&str]) -> Vec<serde_json::Value> {
        let mut full = vec!["-j"];
        full.extend_from_slice(args);
        let text = self.ip(&full);
        if text.trim().is_empty() {
            return Vec::new();
        }
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("ip -j {args:?}: {e}: {text}"))
    }

    /// Runs `f` on a thread inside this namespace; sockets it creates
    /// belong to the namespace and may be used from anywhere afterwards.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let ns = self.file();
        std::thread::spawn(move || {
            setns(ns.as_fd(), CloneFlags::CLONE_NEWNET).expect("setns");
            f()
        })
        .join()
        .expect("thread in netns panicked")
    }

    /// Reads a sysctl of this namespace (`net/ipv4/conf/all/rp_filter`).
    pub fn sysctl(&self, path: &str) -> Option<String> {
        let path = format!("/proc/sys/{path}");
        self.run(move || std::fs::read_to_string(path).ok().map(|v| v.trim().to_string()))
    }

    pub fn set_sysctl(&self, path: &str, value: &str) {
        let (path, value) = (format!("/proc/sys/{path}"), value.to_string());
        self.run(move || std::fs::write(&path, value).unwrap_or_else(|e| panic!("write {path}: {e}")))
    }

    /// Link names in the namespace.
    pub fn links(&self) -> Vec<String> {
        self.ip_json(&["link", "show"]).iter().filter_map(|l| l["ifname"].as_str().map(str::to_string)).collect()
    }

    /// `ip route show table all` entries with this protocol (a name from
    /// rt_protos, or the number).
    pub fn routes_with_proto(&self, proto: &str) -> Vec<serde_json::Value> {
        ["-4", "-6"]
            .iter()
            .flat_map(|fam| self.ip_json(&[fam, "route", "show", "table", "all"]))
            .filter(|r| {
                r["protocol"].as_str() == Some(proto)
                    || r["protocol"].as_u64().map(|n| n.to_string()).as_deref() == Some(proto)
            })
            .collect()
    }

    /// Connects this namespace to `other` with a veth pair and addresses
    /// (`10.0.0.1/24` style).
    pub fn veth_to(&self, other: &Netns, here: (&str, &str), there: (&str, &str)) {
        self.ip_batch(&[
            &["link", "add", here.0, "type", "veth", "peer", "name", there.0, "netns", other.name.as_str()],
            &["addr", "add", here.1, "dev", here.0],
            &["link", "set", here.0, "up"],
        ]);
        other.ip_batch(&[&["addr", "add", there.1, "dev", there.0], &["link", "set", there.0, "up"]]);
    }
}

impl Default for Netns {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Netns {
    /// `ip netns del`: the namespace goes (with its links) when nothing
    /// else holds it.
    fn drop(&mut self) {
        let path = self.path();
        let _ = umount2(path.as_str(), MntFlags::MNT_DETACH);
        let _ = std::fs::remove_file(&path);
    }
}

/// Where `ip` finds named namespaces (`ip -n NAME`).
const NETNS_DIR: &str = "/run/netns";

/// On a thread of its own (it moves to the new namespace): a new network
/// namespace, bound to `path` as `ip netns add` binds it, with its
/// loopback up.
fn create_netns(path: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(NETNS_DIR)?;
    File::options().write(true).create_new(true).open(path)?;
    let made = unshare(CloneFlags::CLONE_NEWNET).and_then(|()| {
        // thread-self: /proc/self is the process's first thread's.
        mount(Some("/proc/thread-self/ns/net"), path, None::<&str>, MsFlags::MS_BIND, None::<&str>)
    });
    let made = made.map_err(std::io::Error::from).and_then(|()| loopback_up());
    if made.is_err() {
        // Nothing left behind for a Netns never made (its Drop never runs).
        let _ = umount2(path, MntFlags::MNT_DETACH);
        let _ = std::fs::remove_file(path);
    }
    made
}

/// `ip link set lo up` in the calling thread's namespace.
fn loopback_up() -> std::io::Result<()> {
    // SAFETY: a socket whose descriptor OwnedFd then owns; ioctl with an
    // ifreq that outlives both calls.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let sock = std::os::fd::OwnedFd::from_raw_fd(fd);
        let mut req: libc::ifreq = std::mem::zeroed();
        for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
            *dst = *src as libc::c_char;
        }
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) < 0 {
            return Err(std::io::Error::last_os_error());
        }
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
