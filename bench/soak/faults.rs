//! The faults, on a schedule drawn from a seed (printed, so a failing run
//! can be replayed), and which failures each one explains: a backend
//! killed explains failed connections on the paths that reach it until its
//! health check has taken it out; a daemon restart explains nothing.

use std::fs;
use std::io::Write;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::clients::Path;
use crate::sites::{MA, MB};
use crate::world::*;

/// A small PRNG (xorshift64*): the same seed, the same schedule.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    AddService,
    ChangeService,
    RemoveService,
    DrainAndBack,
    InvalidFile,
    FileInPieces,
    RenamedOver,
    Sighup,
    Restart,
    KillMidSync,
    HostLinkFlap,
    RouteDeleted,
    MapUnpinned,
    RpFilter,
    BackendLinkFlap,
    BackendKilled(usize),
    SidecarRestart,
    Pressure,
    /// The gateway in use of site A or B (the site drawn) loses its links.
    GatewayCut(char),
    /// SIGKILL to the daemon of site A's gateway in use, started again.
    GatewayKilled,
}

const KINDS: [Fault; 20] = [
    Fault::AddService,
    Fault::ChangeService,
    Fault::RemoveService,
    Fault::DrainAndBack,
    Fault::InvalidFile,
    Fault::FileInPieces,
    Fault::RenamedOver,
    Fault::Sighup,
    Fault::Restart,
    Fault::KillMidSync,
    Fault::HostLinkFlap,
    Fault::RouteDeleted,
    Fault::MapUnpinned,
    Fault::RpFilter,
    Fault::BackendLinkFlap,
    Fault::BackendKilled(0),
    Fault::SidecarRestart,
    Fault::Pressure,
    Fault::GatewayCut('A'),
    Fault::GatewayKilled,
];

/// `(seconds into the soak, fault)`, about one every 8 s, none in the
/// first 20 s (the load settles) or the last 30 (the end's checks).
/// `only`: the kinds drawn from (by their names, `BackendKilled` for any
/// backend); all when empty.
pub fn schedule(seed: u64, minutes: u64, only: &[String]) -> Vec<(u64, Fault)> {
    let mut rng = Rng::new(seed);
    let (mut at, end) = (20 * 1000, (minutes * 60).saturating_sub(30) * 1000);
    let kinds: Vec<Fault> = KINDS
        .iter()
        .copied()
        .filter(|k| only.is_empty() || only.iter().any(|o| format!("{k:?}").starts_with(o.as_str())))
        .collect();
    assert!(!kinds.is_empty(), "--only {only:?} names no fault; the faults are {KINDS:?}");
    let mut out = Vec::new();
    while at < end {
        let mut f = kinds[rng.below(kinds.len() as u64) as usize];
        if let Fault::BackendKilled(_) = f {
            f = Fault::BackendKilled(rng.below(BACKENDS.len() as u64) as usize);
        }
        if let Fault::GatewayCut(_) = f {
            f = Fault::GatewayCut(if rng.below(2) == 0 { 'A' } else { 'B' });
        }
        out.push((at / 1000, f));
        at += 4000 + rng.below(8000);
    }
    out
}

/// Failures on `paths` within `[from, until]` (ms) are explained.
#[derive(Debug, Clone)]
pub struct Excuse {
    pub from_ms: u64,
    pub until_ms: u64,
    pub paths: Vec<Path>,
}

/// The paths a backend's fault reaches.
const BACKEND_PATHS: [Path; 4] = [Path::Web, Path::Long, Path::Udp, Path::NodePort];

/// How long after a backend or a link comes back (or goes) its checks and
/// one sync take to catch up: fall 2 × 300 ms + a 200 ms timeout, a sync,
/// and room.
const CATCH_UP: Duration = Duration::from_millis(2500);

/// Runs `f` and returns what it excuses (nothing, for most faults).
pub fn apply(f: Fault, w: &mut World, rng: &mut Rng, ms: &dyn Fn(Instant) -> u64) -> Option<Excuse> {
    let start = Instant::now();
    let excuse =
        |paths: &[Path], until: Instant| Excuse { from_ms: ms(start), until_ms: ms(until), paths: paths.to_vec() };
    let extra = |i: u64| {
        format!(
            "[[service]]\nname = \"extra\"\nvip = \"10.98.0.1\"\nport = {}\nbackends = [\"192.168.10.12:8080\"]\n",
            8000 + i
        )
    };
    match f {
        Fault::AddService | Fault::ChangeService => w.write("40-extra.toml", &extra(rng.below(1000))),
        Fault::RemoveService => {
            let _ = fs::remove_file(w.conf("40-extra.toml"));
        }
        Fault::DrainAndBack => {
            w.write("10-web.toml", &web(0));
            std::thread::sleep(Duration::from_secs(2));
            w.write("10-web.toml", &web(1));
        }
        Fault::InvalidFile => {
            w.write("50-broken.toml", "[[service]]\nname = \"broken\"\nvip = \"nope\"\n");
            std::thread::sleep(Duration::from_secs(1));
            let _ = fs::remove_file(w.conf("50-broken.toml"));
        }
        Fault::FileInPieces => {
            let text = extra(rng.below(1000));
            let (head, tail) = text.split_at(text.len() / 2);
            let p = w.conf("40-extra.toml");
            if let Ok(mut file) = fs::File::create(&p) {
                chmod_644(&p);
                let _ = file.write_all(head.as_bytes());
                let _ = file.flush();
                std::thread::sleep(Duration::from_millis(300));
                let _ = file.write_all(tail.as_bytes());
            }
        }
        Fault::RenamedOver => {
            let tmp = w.conf(".10-web.toml.new");
            let _ = fs::write(&tmp, web(1));
            chmod_644(&tmp);
            let _ = fs::rename(&tmp, w.conf("10-web.toml"));
        }
        Fault::Sighup => {
            if let Some(d) = &w.daemon {
                d.signal(Signal::SIGHUP);
            }
        }
        Fault::Restart => {
            if let Some(mut d) = w.daemon.take() {
                d.stop(Duration::from_secs(30));
            }
            w.start_daemon();
        }
        Fault::KillMidSync => {
            if let Some(mut d) = w.daemon.take() {
                d.signal(Signal::SIGHUP);
                // A full resync of this world takes 10–30 ms: the kill lands in it or
                // just after.
                std::thread::sleep(Duration::from_millis(rng.below(25)));
                d.signal(Signal::SIGKILL);
                let _ = d.exited_within(Duration::from_secs(10));
            }
            w.start_daemon();
        }
        Fault::HostLinkFlap => {
            w.host.ip(&["link", "set", "eth1", "down"]);
            std::thread::sleep(Duration::from_secs(1));
            w.host.ip(&["link", "set", "eth1", "up"]);
            return Some(excuse(&[Path::NodePort], Instant::now() + CATCH_UP));
        }
        Fault::RouteDeleted => {
            // Whichever of hostmesh's routes to the VIP comes first.
            let _ = w.host.exec_output("ip", &["route", "del", DNS_VIP]);
            return Some(excuse(&[Path::Udp], Instant::now() + CATCH_UP));
        }
        Fault::MapUnpinned => {
            if let Some(pin) = fs::read_dir(w.opts.bpffs.join("maps")).ok().and_then(|d| d.flatten().next()) {
                let _ = fs::remove_file(pin.path());
            }
        }
        Fault::RpFilter => {
            w.host.set_sysctl("net/ipv4/conf/all/rp_filter", "1");
            return Some(excuse(&[Path::Udp], Instant::now() + CATCH_UP));
        }
        Fault::BackendLinkFlap => {
            w.backends_ns.ip(&["link", "set", "eth0", "down"]);
            std::thread::sleep(Duration::from_secs(1));
            w.backends_ns.ip(&["link", "set", "eth0", "up"]);
            // The link going down took the backends' default route with it;
            // their host's network manager would put it back.
            let _ = w.backends_ns.exec_output("ip", &["route", "replace", "default", "via", "192.168.10.1"]);
            return Some(excuse(&BACKEND_PATHS, Instant::now() + CATCH_UP));
        }
        Fault::BackendKilled(i) => {
            w.kill_backend(i);
            let until = Instant::now() + CATCH_UP;
            std::thread::sleep(Duration::from_secs(3));
            w.start_backend(i);
            return Some(excuse(&BACKEND_PATHS, until));
        }
        // The sidecar ends; started again a second later, its listener is
        // registered within about 250 ms (README, "Mesh redirects").
        Fault::SidecarRestart => {
            w.kill_sidecar();
            std::thread::sleep(Duration::from_secs(1));
            w.start_sidecar();
            return Some(excuse(&[Path::Mesh], Instant::now() + Duration::from_secs(1)));
        }
        // A burst past the veth path's conntrack capacity: the LRU map
        // evicts the flows least recently seen, which may be one whose
        // reply is on its way.
        Fault::Pressure => {
            crate::clients::pressure(&w.host, CONNTRACK_SIZE + CONNTRACK_SIZE / 4);
            return Some(excuse(&[Path::Udp], Instant::now() + Duration::from_secs(1)));
        }
        // The member and the peers' gateways move to the other gateway
        // within 2.5 s with the default probes (README, "Several gateways
        // per site"); an attempt begun just before waits out its 1 s
        // timeout. The gateway comes back 5 s after the cut, and `cut`
        // waits until it could be counted up again, so the next fault finds
        // both gateways of the site up.
        Fault::GatewayCut(site) => {
            let member = if site == 'A' { MA } else { MB };
            let until = start + Duration::from_millis(4500);
            w.sites.cut(w.sites.in_use(member), Duration::from_secs(5));
            return Some(excuse(&[Path::Gateway], until));
        }
        // A gateway's daemon restarting moves nothing and loses nothing:
        // its programs keep forwarding and answering probes.
        Fault::GatewayKilled => {
            let gw = w.sites.in_use(MA);
            w.sites.kill_daemon(gw);
        }
    }
    None
}
