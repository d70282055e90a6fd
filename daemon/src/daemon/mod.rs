//! `hostmesh run`: the daemon. One sync loop does all the work; file
//! events, SIGHUP and the resync timer only wake it (docs/design.md,
//! "The pipeline"). Bursts of file events are coalesced: the loop waits for the
//! config dir to be quiet for a moment, so 1,000 drop-ins written at once
//! cost one sync.

mod backend_health;
mod drift;
mod event_loop;
mod events;
mod leaving;
mod metrics_feed;
pub(crate) use events::Event;
mod notify;
pub(crate) mod report;
mod status_write;

use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use slog::{error, info, warn, Logger};

use crate::backends::bpf::{features, PinnedBpf};
use crate::backends::host::LiveHost;
use crate::backends::netlink::{monitor, Rtnetlink};
use crate::backends::nft::NftCli;
use crate::backends::sidecar::LiveSidecars;
use crate::backends::sysctl::ProcSys;
use crate::backends::Backends;
use crate::config::{ConfigStore, Loaded};
use crate::model::KernelFeatures;
use crate::paths::Paths;
use crate::peer_health::{self, PeerHealth};
use crate::reconcile::{Reconciler, SyncOutcome, SysctlOriginals};
use crate::sidecars::{self, Registrar};
use crate::state::{InstanceLock, Status, SyncSummary, STATUS_VERSION};

pub(crate) use notify::Notifier;

/// How long the config dir must be quiet before a sync...
const DEBOUNCE_QUIET: Duration = Duration::from_millis(150);
/// ...but a steady stream of events never delays a sync longer than this.
const DEBOUNCE_MAX: Duration = Duration::from_secs(1);
/// Step errors logged (and kept in the status's last sync) per sync; the
/// rest are counted, and listed per object in the status.
const LOGGED_ERRORS: usize = 20;
/// Retry delay when a sync could not even read the kernel.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(1);
/// How often sidecar listeners are checked while mesh entries exist: a
/// restarted sidecar is registered within this (plus a little).
const SIDECAR_CHECK: Duration = Duration::from_millis(250);
/// A repair waits this long for the rest of a burst of kernel events (a
/// deleted veth takes its routes with it): one resync repairs them all.
const REPAIR_SETTLE: Duration = Duration::from_millis(100);
/// How often the sysctls hostmesh set are read back.
const SYSCTL_CHECK: Duration = Duration::from_secs(1);
/// Repairs named in the log per burst; the rest are counted.
const REPAIRS_LOGGED: usize = 5;
/// How often conntrack is swept for flows past their timeout: a closed
/// flow leaves the map at most this long after its timeout ran out.
pub(crate) const CONNTRACK_SWEEP: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub(crate) enum RunError {
    #[error("config dir {0} does not exist; create it (it may be empty) or pass --config-dir")]
    NoConfigDir(String),
    #[error("{0}")]
    StateDir(#[from] crate::state::StateDirError),
    #[error("{0}")]
    Locked(#[from] crate::state::LockError),
    #[error("{0}")]
    PinDir(#[from] crate::backends::bpf::pins::PinDirError),
    #[error("cannot open rtnetlink: {0}")]
    Netlink(std::io::Error),
    #[error("cannot watch signals: {0}")]
    Signals(std::io::Error),
    #[error("cannot read sysctl originals in {dir}: {source}")]
    Originals { dir: String, source: std::io::Error },
    #[error("{0}")]
    NoBpf(#[from] crate::backends::bpf::features::NoBpf),
    #[error("the first sync failed, so nothing is steered to hostmesh: {0}")]
    FirstSync(String),
}

/// How a burst of events ended.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Settled {
    /// File changes only: an incremental sync.
    Quiet,
    /// A full sync is due: a SIGHUP, or drift seen during the burst.
    Full,
    Stop,
}

struct Daemon {
    paths: Paths,
    log: Logger,
    notifier: Notifier,
    store: ConfigStore,
    reconciler: Reconciler,
    loaded: Loaded,
    generation: u64,
    started_at: u64,
    ready: bool,
    last_summary: SyncSummary,
    /// How long the last sync took to read and merge the config dir.
    load_time: Duration,
    last_outcome: Option<SyncOutcome>,
    registrar: Registrar<LiveSidecars>,
    /// Probes peer gateways (gateways with peers only).
    health: Option<PeerHealth>,
    /// Checks the backends of services with a `health_check`.
    backend_health: backend_health::BackendHealthState,
    /// Flows and affinity of backends that left their services.
    leaving: leaving::Leaving,
    /// For threads started later (peer health) to wake the loop.
    events: Sender<Event>,
    /// What the kernel offers (probed once, at start).
    features: KernelFeatures,
    /// The last conntrack sweep, and the error of the last failed one.
    sweep: crate::backends::Sweep,
    sweep_error: Option<String>,
    /// Why the first sync could not build the dataplane (the start fails).
    start_failure: Option<String>,
    /// Host interfaces carrying hostmesh's programs, by index, as of the
    /// last sync (one that comes back under a new index is re-attached).
    host_indexes: drift::HostIndexes,
    /// Drift found since the last sync, not yet repaired.
    drift_seen: usize,
    /// What the metrics endpoint shows, and the endpoint.
    metrics: crate::metrics::Metrics,
    metrics_endpoint: metrics_feed::MetricsEndpoint,
}

pub(crate) fn run(paths: Paths, log: Logger) -> Result<(), RunError> {
    if !paths.config_dir.is_dir() {
        return Err(RunError::NoConfigDir(paths.config_dir.display().to_string()));
    }
    crate::state::prepare_state_dir(&paths.state_dir)?;
    // One daemon per state dir and pin dir, before either is touched.
    let mut lock = InstanceLock::acquire(&paths.state_dir, &paths.bpffs)?;
    let (originals, notes) = SysctlOriginals::load(&paths.state_dir)
        .map_err(|source| RunError::Originals { dir: paths.state_dir.display().to_string(), source })?;
    for note in notes {
        warn!(log, "sysctl originals"; "problem" => note);
    }
    // The dataplane lives on the bpffs: without one there is no start.
    crate::backends::bpf::pins::PinDir::new(&paths.bpffs).prepare()?;
    lock.add_pin_dir(&paths.bpffs)?;
    crate::backends::bpf::raise_memlock_limit();
    let features = features::probe()?;
    info!(log, "kernel features probed"; "release" => report::kernel_release(), "result" => features.summary());
    let backends = Backends {
        host: Box::new(LiveHost::new(&paths.state_dir, features.clone()).map_err(RunError::Netlink)?),
        net: Box::new(Rtnetlink::open().map_err(RunError::Netlink)?),
        sysctl: Box::new(ProcSys::new()),
        bpf: Box::new(PinnedBpf::new(&paths.bpffs, features.clone())),
        nft: Box::new(NftCli::new()),
    };

    let (tx, rx) = channel();
    // SIGTERM also raises this flag, which a sync checks between steps.
    let stopping = Arc::new(AtomicBool::new(false));
    events::spawn_signal_thread(tx.clone(), stopping.clone()).map_err(RunError::Signals)?;
    let monitor_tx = tx.clone();
    if let Err(e) = crate::backends::netlink::monitor::spawn_monitor(move |c| {
        let _ = monitor_tx.send(Event::Kernel(c));
    }) {
        warn!(log, "cannot follow kernel events; drift is repaired at the periodic resync"; "error" => e.to_string());
    }
    let _watcher = match events::watch_config_dir(&paths.config_dir, tx.clone()) {
        Ok(w) => Some(w),
        Err(e) => {
            warn!(log, "cannot watch the config dir; changes apply at the next resync or SIGHUP"; "dir" => paths.config_dir.display().to_string(), "error" => e.to_string());
            None
        }
    };

    info!(log, "starting"; "version" => env!("CARGO_PKG_VERSION"), "config_dir" => paths.config_dir.display().to_string(),
        "state_dir" => paths.state_dir.display().to_string(), "bpffs" => paths.bpffs.display().to_string());
    let mut d = Daemon {
        reconciler: Reconciler::new(backends, originals).with_stop_flag(stopping),
        store: ConfigStore::new(),
        loaded: Loaded { config: Default::default(), files: vec![], skipped: vec![], parsed_files: 0 },
        notifier: Notifier::from_env(),
        generation: 0,
        started_at: crate::clock::now_unix(),
        ready: false,
        last_summary: SyncSummary::default(),
        load_time: Duration::ZERO,
        last_outcome: None,
        registrar: Registrar::new(LiveSidecars::new(&paths.bpffs)),
        health: None,
        backend_health: backend_health::BackendHealthState::restore(&paths.state_dir, &log),
        leaving: Default::default(),
        events: tx,
        features,
        sweep: Default::default(),
        sweep_error: None,
        start_failure: None,
        host_indexes: Default::default(),
        drift_seen: 0,
        metrics: crate::metrics::Metrics::new(crate::backends::bpf::traffic::TrafficReader::new(&paths.bpffs)),
        metrics_endpoint: Default::default(),
        paths,
        log,
    };
    d.run_loop(rx)
}

impl Daemon {
    /// Logs a move away from what hostmesh wants and brings the full
    /// resync that repairs it forward to REPAIR_SETTLE from now.
    fn note_drift(&mut self, why: String, next_full: &mut Instant) {
        self.log_drift(why);
        *next_full = (*next_full).min(Instant::now() + REPAIR_SETTLE);
    }

    fn log_drift(&mut self, why: String) {
        self.drift_seen += 1;
        if self.drift_seen <= REPAIRS_LOGGED {
            warn!(self.log, "repairing drift"; "what" => why);
        }
    }

    /// Why a kernel change needs a repair, if it does (`drift::drift`
    /// against the last sync's desired state).
    fn drift_of(&self, change: &crate::backends::netlink::monitor::KernelChange) -> Option<String> {
        drift::drift(change, self.reconciler.desired()?, &self.host_indexes, &monitor::CurrentLinks)
    }

    /// Conntrack housekeeping, every CONNTRACK_SWEEP. The status follows
    /// the entry count; a failure is logged when it starts and when it
    /// changes, not at every sweep.
    fn expire_flows(&mut self) {
        match self.reconciler.expire_flows() {
            Ok(sweep) => {
                if sweep.removed > 0 {
                    slog::debug!(self.log, "expired flows"; "entries" => sweep.removed, "open" => sweep.open, "closed" => sweep.closed);
                }
                self.sweep_error = None;
                if sweep != self.sweep {
                    self.sweep = sweep;
                    self.write_status();
                }
            }
            Err(e) => {
                let e = e.to_string();
                if self.sweep_error.as_ref() != Some(&e) {
                    warn!(self.log, "cannot expire flows from conntrack"; "error" => e.clone());
                    self.sweep_error = Some(e);
                }
            }
        }
    }

    fn resync_interval(&self) -> Duration {
        self.loaded.config.daemon.resync_interval
    }

    /// One sync. Returns false if it could not complete (the kernel could
    /// not be read), in which case it is retried soon as a full resync.
    fn sync(&mut self, full: bool) -> bool {
        self.read_config(full);
        self.generation += 1;
        self.track_peers();
        let states = self.track_backends();
        let serving = self.serving(&states);
        let result = self.reconciler.sync(&serving, full);
        // What left, for after a clean sync (services with UDP, a drain
        // timeout or affinity only: cheap beside the sync).
        let left = (crate::health::drop_sets(&serving), crate::health::affinity_serving(&serving));
        drop(serving);
        if let Some(full) = result.as_ref().ok().filter(|o| !o.stopped && o.errors.is_empty()).map(|o| o.full) {
            self.after_clean_sync(left, !self.ready, full);
        }
        self.save_backend_health(&states);
        if let Ok(o) = &result {
            if o.stopped {
                // Told to stop mid-sync: what was applied stays; the status
                // keeps describing the last complete sync.
                info!(self.log, "sync stopped early: stopping"; "generation" => self.generation);
                return false;
            }
        }
        let ok = result.is_ok();
        if let Ok(o) = &result {
            self.metrics.sync_done(o.full, o.duration, o.errors.iter().flat_map(|e| e.owners.iter()));
        }
        match &result {
            Ok(outcome) => self.log_outcome(outcome),
            Err(e) => {
                error!(self.log, "sync failed; retrying"; "generation" => self.generation, "error" => e.to_string())
            }
        }
        self.last_summary = status_write::summary(&result, full);
        if !self.ready {
            self.start_failure = match &result {
                Err(e) => Some(e.to_string()),
                Ok(o) => o.bpf_unavailable.as_ref().map(|e| format!("cannot load the BPF programs: {e}")),
            };
            if self.start_failure.is_some() {
                return false;
            }
        }
        let first_ready = ok && !self.ready;
        self.ready |= ok;
        if self.drift_seen > REPAIRS_LOGGED {
            warn!(self.log, "repaired more drift than was logged"; "changes" => self.drift_seen);
        }
        self.drift_seen = 0;
        if let Ok(outcome) = result {
            self.host_indexes = self
                .reconciler
                .desired()
                .map(drift::host_devices)
                .unwrap_or_default()
                .into_iter()
                .filter_map(|d| crate::backends::ifaces::index(&d).map(|i| (d, i)))
                .collect();
            self.last_outcome = Some(outcome);
        }
        self.tick_sidecars();
        // After the sync, so the endpoint's first snapshot is of it.
        self.track_metrics_server();
        let line = self.write_status();
        if ok {
            // READY=1 after every completed sync: the first tells systemd we
            // started; later ones end a RELOADING=1.
            self.notifier.ready(&line);
            if first_ready {
                info!(self.log, "ready"; "status" => line);
            }
        } else {
            self.notifier.status(&line);
        }
        ok
    }

    /// Reads the config dir (every file for a full sync, the changed ones
    /// otherwise) and logs each rejected file's errors. A dir that cannot
    /// be read keeps the configuration in force.
    fn read_config(&mut self, full: bool) {
        let reading = Instant::now();
        let loaded = if full {
            self.store.load(&self.paths.config_dir)
        } else {
            self.store.load_changed(&self.paths.config_dir)
        };
        match loaded {
            Ok(loaded) => {
                self.loaded = loaded;
                self.metrics.reload(if self.loaded.rejected().next().is_some() { "rejected" } else { "applied" });
            }
            Err(e) => {
                self.metrics.reload("failed");
                // A vanished dir must not tear down every service.
                error!(self.log, "cannot read the config dir; keeping the configuration in force"; "error" => e.to_string());
            }
        }
        for f in self.loaded.rejected() {
            for e in &f.errors {
                warn!(self.log, "config file rejected"; "file" => f.path.display().to_string(), "line" => e.line,
                    "column" => e.column, "key" => e.key.clone().unwrap_or_default(), "error" => e.message.clone(),
                    "in_force" => if f.state == crate::config::FileState::Rejected { "nothing" } else { "last good version" });
            }
        }
        self.load_time = reading.elapsed();
    }

    /// (Re)starts the peer prober when what it should probe changed, and
    /// hands the reconciler the peers that are down now.
    fn track_peers(&mut self) {
        let want = peer_health::Settings::from_config(&self.loaded.config);
        if self.health.as_ref().map(|h| &h.settings) != want.as_ref() {
            // Dropping the old prober joins its thread before the new one
            // binds the probe port.
            self.health = None;
            if let Some(settings) = want {
                info!(self.log, "probing peer gateways"; "peers" => settings.peers.len(), "port" => settings.port,
                    "interval_ms" => settings.interval.as_millis() as u64, "loss" => settings.loss);
                let events = self.events.clone();
                self.health = Some(PeerHealth::start(settings, move || events.send(Event::PeersChanged).is_ok()));
            }
        }
        let down = self.health.as_ref().map(|h| h.down()).unwrap_or_default();
        self.reconciler.set_peers_down(down);
    }

    fn log_peer_changes(&mut self) {
        let Some(h) = &self.health else { return };
        for (name, p) in h.report() {
            let was_down = self.reconciler.peers_down().contains(&name);
            self.metrics.peer_state(&name, p.up);
            if p.up && was_down {
                info!(self.log, "peer gateway up; routes to its sites restored"; "peer" => name, "endpoint" => p.endpoint.to_string());
            } else if !p.up && !was_down {
                warn!(self.log, "peer gateway down; routes to its sites are unreachable until it answers";
                    "peer" => name, "endpoint" => p.endpoint.to_string(), "missed_probes" => p.missed);
            }
        }
    }

    /// Registers sidecar listeners; rewrites the status when that changed.
    fn check_sidecars(&mut self) {
        if self.tick_sidecars() {
            let line = self.write_status();
            self.notifier.status(&line);
        }
    }

    /// Returns true when a registration changed (and logs it).
    fn tick_sidecars(&mut self) -> bool {
        let wanted = sidecars::wanted(&self.loaded.config);
        let path = self.reconciler.desired().and_then(|d| d.mesh_path.clone());
        let before = self.registrar.report().clone();
        if !self.registrar.tick(&wanted, path.as_ref()) {
            return false;
        }
        for (key, reg) in self.registrar.report() {
            if before.get(key) == Some(reg) {
                continue;
            }
            match (&reg.listener, &reg.problem) {
                (Some(l), _) => info!(self.log, "sidecar listener registered"; "listener" => l.addr.to_string(),
                    "protocol" => crate::config::Protocol::name_of(key.proto), "pid" => l.pid, "process" => l.comm.clone()),
                (None, Some(p)) => {
                    warn!(self.log, "sidecar listener missing"; "redirect_port" => key.port, "reason" => p.clone())
                }
                (None, None) => {}
            }
        }
        true
    }

    fn stop(&mut self) -> Result<(), RunError> {
        self.notifier.stopping();
        info!(self.log, "stopping; programs, maps, routes and links stay in place"; "generation" => self.generation);
        if let Ok(mut status) = Status::read(&self.paths.state_dir) {
            status.stopped = true;
            status.updated_at = crate::clock::now_unix();
            let _ = status.write(&self.paths.state_dir);
        }
        Ok(())
    }
}
