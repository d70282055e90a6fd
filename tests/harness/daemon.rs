use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::{Netns, NotifyListener, TempDir};

/// Where a daemon keeps its files, all inside one TempDir.
pub struct DaemonOptions {
    pub bin: PathBuf,
    pub config_dir: PathBuf,
    /// The runtime and vendor config dirs: the test's own, not made until
    /// a test wants them (the host's /run/hostmesh.d and /usr/lib/hostmesh
    /// are never read by a test).
    pub runtime_config_dir: PathBuf,
    pub vendor_config_dir: PathBuf,
    pub state_dir: PathBuf,
    pub bpffs: PathBuf,
    pub log: PathBuf,
}

impl DaemonOptions {
    /// Paths under `dir`: conf/, state/, bpf/, daemon.log. Creates conf/.
    pub fn in_dir(bin: &str, dir: &TempDir) -> DaemonOptions {
        let o = DaemonOptions {
            bin: PathBuf::from(bin),
            config_dir: dir.join("conf"),
            runtime_config_dir: dir.join("run-conf"),
            vendor_config_dir: dir.join("vendor-conf"),
            state_dir: dir.join("state"),
            bpffs: dir.join("bpf"),
            log: dir.join("daemon.log"),
        };
        fs::create_dir_all(&o.config_dir).expect("create config dir");
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&o.config_dir, fs::Permissions::from_mode(0o755)).expect("chmod config dir");
        o
    }

    /// The three config dirs' flags.
    pub fn config_args(&self) -> Vec<String> {
        vec![
            "--config-dir".into(),
            self.config_dir.display().to_string(),
            "--runtime-config-dir".into(),
            self.runtime_config_dir.display().to_string(),
            "--vendor-config-dir".into(),
            self.vendor_config_dir.display().to_string(),
        ]
    }

    pub fn path_args(&self) -> Vec<String> {
        let mut args = self.config_args();
        args.extend([
            "--state-dir".into(),
            self.state_dir.display().to_string(),
            "--bpffs".into(),
            self.bpffs.display().to_string(),
        ]);
        args
    }

    /// Writes a drop-in into the config dir, 0644 whatever the umask
    /// (hostmesh refuses drop-ins that others can write).
    pub fn write_config(&self, name: &str, text: &str) {
        use std::os::unix::fs::PermissionsExt;
        let path = self.config_dir.join(name);
        fs::write(&path, text).expect("write drop-in");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).expect("chmod drop-in");
    }
}

/// `hostmesh run` in a namespace, with its own NOTIFY_SOCKET. Dropping it
/// sends SIGTERM, then SIGKILL if it has not exited within 5 s.
pub struct Daemon {
    child: Option<Child>,
    pub notify: NotifyListener,
    pub log: PathBuf,
}

impl Daemon {
    pub fn start(ns: &Netns, opts: &DaemonOptions) -> Daemon {
        Self::start_with_env(ns, opts, &[])
    }

    /// Starts with extra environment variables (`WATCHDOG_USEC`, say).
    pub fn start_with_env(ns: &Netns, opts: &DaemonOptions, env: &[(&str, &str)]) -> Daemon {
        let sock = opts.state_dir.with_file_name(format!("notify-{}.sock", crate::unique("n")));
        let notify = NotifyListener::bind(&sock);
        let log = fs::OpenOptions::new().create(true).append(true).open(&opts.log).expect("open daemon log");
        let mut cmd = ns.command(opts.bin.to_str().expect("utf-8 path"));
        // If the test process dies without running its guards (SIGKILL, the
        // OOM killer), the daemon is told to stop rather than orphaned.
        // SAFETY: prctl is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .arg("run")
            .args(opts.path_args())
            .env("NOTIFY_SOCKET", notify.path())
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .expect("spawn hostmesh run");
        Daemon { child: Some(child), notify, log: opts.log.clone() }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn signal(&self, sig: Signal) {
        kill(Pid::from_raw(self.pid() as i32), sig).expect("signal daemon");
    }

    /// What the daemon has logged so far.
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for READY=1 (the first one by default) and returns its index.
    pub fn wait_ready(&self, timeout: Duration) -> usize {
        self.notify.wait_for("READY=1", 0, timeout).unwrap_or_else(|e| panic!("{e}\ndaemon log:\n{}", self.log_text()))
    }

    /// Sends SIGTERM and waits for the exit (at most `timeout`, scaled).
    pub fn stop(&mut self, timeout: Duration) -> ExitStatus {
        let timeout = crate::scaled(timeout);
        self.signal(Signal::SIGTERM);
        self.wait_exit(timeout)
            .unwrap_or_else(|| panic!("hostmesh did not exit within {timeout:?}\n{}", self.log_text()))
    }

    /// Waits at most `timeout` (not scaled) for the daemon to exit on its own.
    pub fn exited_within(&mut self, timeout: Duration) -> Option<ExitStatus> {
        self.wait_exit(timeout)
    }

    fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            let pid = Pid::from_raw(child.id() as i32);
            let _ = kill(pid, Signal::SIGTERM);
            if self.wait_exit(crate::scaled(Duration::from_secs(5))).is_none() {
                if let Some(mut child) = self.child.take() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
        }
    }
}

/// Runs a hostmesh CLI command in the namespace.
pub fn cli(ns: &Netns, bin: &Path, args: &[&str]) -> std::process::Output {
    ns.command(bin.to_str().expect("utf-8 path")).args(args).output().expect("run hostmesh")
}
