//! The daemon's loop on fakes: the in-memory kernel, sidecars and peer
//! prober, a config dir in a temp dir, events sent by the test. No root.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::sync::mpsc::channel;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::*;
use crate::backends::fake::FakeKernel;
use crate::backends::fake_sidecars::FakeSidecars;
use crate::metrics::Metrics;
use crate::model::Via;
use crate::model::{RouteKey, RouteSpec};
use crate::peer_health::{Choice, PeerProbe, Settings};

/// Each list's state, as the test sets it.
type PeerStates = Arc<Mutex<BTreeMap<Via, Choice>>>;

struct FakeProbe(PeerStates);

impl PeerProbe for FakeProbe {
    fn report(&self) -> BTreeMap<Via, Choice> {
        self.0.lock().unwrap().clone()
    }
    fn error(&self) -> Option<String> {
        None
    }
}

/// Starts "probing" as the live prober does: from the saved judgements of
/// the same lists, every gateway up otherwise.
struct FakeProber(PeerStates);

impl PeerProber for FakeProber {
    fn start(
        &mut self,
        settings: Settings,
        mut saved: BTreeMap<Via, Choice>,
        _changed: Box<dyn Fn() -> bool + Send>,
    ) -> Box<dyn PeerProbe> {
        let mut lists = self.0.lock().unwrap();
        for (via, addrs) in settings.lists {
            let c = Choice::resume(&addrs, saved.remove(&via), 0);
            lists.insert(via, c);
        }
        Box::new(FakeProbe(Arc::clone(&self.0)))
    }
}

/// What the daemon logged, as one string.
#[derive(Clone, Default)]
struct LogBuf(Arc<Mutex<Vec<u8>>>);

impl Write for LogBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogBuf {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    fn count(&self, what: &str) -> usize {
        self.text().matches(what).count()
    }

    fn wait_for(&self, what: &str, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.count(what) < n {
            assert!(Instant::now() < deadline, "no {n} × {what:?} within 10 s:\n{}", self.text());
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

const SITE: &str = r#"
[daemon]
metrics_listen = "off"

[gateway]
role = "gateway"
local_ip = "198.51.100.1"
vni = 7001

[[peer]]
name = "site-b"
endpoint = "198.51.100.2"
cidrs = ["10.20.0.0/16"]
"#;

/// A daemon on fakes, running its loop on a thread of its own.
struct Running {
    dir: tempfile::TempDir,
    kernel: FakeKernel,
    peers: PeerStates,
    log: LogBuf,
    metrics: Metrics,
    events: super::events::EventSender,
    /// What it told systemd, with the status file's generation then.
    notified: super::notify::Sent,
    thread: Option<std::thread::JoinHandle<Result<(), RunError>>>,
}

impl Running {
    fn start(config: &str) -> Running {
        let dir = tempfile::tempdir().unwrap();
        let paths = Paths {
            config: crate::config::ConfigDirs::new(
                dir.path().join("conf"),
                dir.path().join("run-conf"),
                dir.path().join("vendor-conf"),
            ),
            state_dir: dir.path().join("state"),
            bpffs: dir.path().join("bpf"),
        };
        std::fs::create_dir(paths.config.admin()).unwrap();
        std::fs::create_dir(&paths.state_dir).unwrap();
        let running_dir = dir.path().to_path_buf();
        write_file(&running_dir, "10-site.toml", config);
        let kernel = FakeKernel::new();
        {
            let mut s = kernel.state();
            s.facts.interfaces = ["lo", "eth0"].map(String::from).into();
            s.facts.default_route_interfaces = vec!["eth0".into()];
            s.facts.netns_cookie = 7;
        }
        let peers = PeerStates::default();
        let log = LogBuf::default();
        let logger =
            slog::Logger::root(slog::Fuse(crate::log::LogfmtDrain::new(log.clone(), slog::Level::Info)), slog::o!());
        let (tx, rx) = channel();
        let tx = super::events::EventSender::new(tx);
        let (notifier, notified) = Notifier::recording(paths.state_dir.clone());
        let parts = Parts {
            backends: kernel.backends(),
            originals: SysctlOriginals::default(),
            sidecars: Box::new(FakeSidecars::loaded()),
            prober: Box::new(FakeProber(Arc::clone(&peers))),
            notifier,
            features: KernelFeatures::complete(),
            stopping: Default::default(),
            events: tx.clone(),
        };
        let mut daemon = Daemon::new(paths, logger, parts);
        let metrics = daemon.metrics.counters().clone();
        let thread = std::thread::spawn(move || daemon.run_loop(rx));
        Running { dir, kernel, peers, log, metrics, events: tx, notified, thread: Some(thread) }
    }

    fn write(&self, name: &str, text: &str) {
        write_file(self.dir.path(), name, text);
    }

    fn set_peer(&self, name: &str, up: bool) {
        let mut lists = self.peers.lock().unwrap();
        let c = lists.get_mut(&Via::Peer(name.to_string())).expect("a probed peer");
        for t in &mut c.targets {
            t.up = up;
        }
        c.active = if up { c.targets.first().map(|t| t.addr) } else { None };
    }

    fn send(&self, e: Event) {
        self.events.send(e).unwrap();
    }

    fn stop(&mut self) {
        self.send(Event::Stop);
        let result = self.thread.take().unwrap().join().unwrap();
        assert!(result.is_ok(), "{result:?}");
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = self.events.send(Event::Stop);
            let _ = t.join();
        }
    }
}

fn write_file(dir: &std::path::Path, name: &str, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("conf").join(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
}

fn service(n: u32) -> String {
    format!("[[service]]\nname = \"s{n}\"\nvip = \"10.96.0.{n}\"\nport = 80\nbackends = [\"192.168.1.1:80\"]\n")
}

#[test]
fn a_peer_that_goes_down_in_a_burst_of_file_events_is_logged_and_counted_once() {
    let mut d = Running::start(SITE);
    d.log.wait_for("msg=ready", 1);
    // A burst: files change; amid them the prober finds site-b down.
    for n in 1..=3 {
        d.write(&format!("20-s{n}.toml"), &service(n));
        d.send(Event::ConfigChanged);
    }
    d.set_peer("site-b", false);
    d.send(Event::PeersChanged);
    for n in 4..=6 {
        d.write(&format!("20-s{n}.toml"), &service(n));
        d.send(Event::ConfigChanged);
    }
    // The burst's sync applies the files and the peer's state together.
    d.log.wait_for("msg=\"sync done\"", 2);
    d.stop();
    let log = d.log.text();
    assert_eq!(d.log.count("msg=\"gateway down"), 1, "{log}");
    assert_eq!(d.log.count("msg=\"traffic moved to another gateway\""), 1, "{log}");
    assert_eq!(d.log.count("msg=\"sync done\""), 2, "the burst cost one sync:\n{log}");
    assert_eq!(d.metrics.peer_transitions("site-b"), 1, "hostmesh_gateway_peer_transitions_total");
    let route = RouteKey { table: 254, dst: "10.20.0.0/16".parse().unwrap() };
    assert_eq!(d.kernel.state().routes.get(&route), Some(&RouteSpec::Unreachable), "{log}");
    let services: BTreeSet<_> = (1..=6).map(|n| format!("s{n}")).collect();
    assert!(log.contains(&format!("services={}", services.len())), "{log}");
}

/// Connect-time LB for everything, on a cgroup: nothing the fake kernel
/// lacks, so every sync is clean.
const CLEAN: &str = "[daemon]\nconnect_time_lb = \"all\"\ncgroup = \"/sys/fs/cgroup\"\nmetrics_listen = \"off\"\n";

#[test]
fn a_reload_ends_with_one_ready_sent_once_the_status_shows_the_reload_s_sync() {
    let mut d = Running::start(&format!("{CLEAN}{}", service(1)));
    d.log.wait_for("msg=ready", 1);
    // A reload, and a change right behind it.
    d.send(Event::Reload);
    d.write("20-s2.toml", &service(2));
    d.send(Event::ConfigChanged);
    d.log.wait_for("services=2 ", 1);
    let notified = Arc::clone(&d.notified);
    let sent = || notified.lock().unwrap().clone();
    let after_reload = |sent: &[(String, Option<u64>)]| -> Vec<(String, Option<u64>)> {
        let at = sent.iter().position(|(m, _)| m == "RELOADING=1").expect("RELOADING=1 sent");
        sent[at + 1..].iter().filter(|(m, _)| m == "READY=1").cloned().collect()
    };
    let end = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while after_reload(&sent()).is_empty() {
        assert!(std::time::Instant::now() < end, "no READY=1 after RELOADING=1: {:?}", sent());
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    d.stop();
    let log = d.log.text();
    let sent = sent();
    // The start's READY=1 came with the status of its sync (generation 1).
    assert_eq!(sent.iter().find(|(m, _)| m == "READY=1"), Some(&("READY=1".to_string(), Some(1))), "{sent:?}");
    // One READY=1 ends the reload, once the status shows the reload's own
    // full sync: the last full one in the log.
    let readies = after_reload(&sent);
    assert_eq!(readies.len(), 1, "{sent:?}");
    let reload_sync: u64 = log
        .split("reload requested")
        .nth(1)
        .and_then(|after| after.lines().find(|l| l.contains("msg=\"sync done\"") && l.contains("full=true")))
        .and_then(|l| l.split("generation=").nth(1)?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no full sync after the reload:\n{log}"));
    assert!(
        readies[0].1 >= Some(reload_sync),
        "READY=1 with status generation {:?}, the reload's sync is {reload_sync}:\n{log}",
        readies[0].1
    );
}
