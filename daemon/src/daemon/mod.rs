//! `hostmesh run`: the daemon. One loop (`event_loop.rs`) does all the
//! work; file events, signals, the resync timer, peer and backend health
//! and kernel changes only wake it (docs/design.md, "The pipeline" and
//! "Threads and owners"). Each job has an owner holding its state:
//!
//! | owner | file | holds |
//! |---|---|---|
//! | `ConfigWatch` | `config_watch.rs` | the config store, the configuration in force and its copies for `diff` (`applied.rs`) |
//! | `SyncRunner` | `sync_runner.rs` | the reconciler, the generation, the last sync's outcome |
//! | `PeerProbing` | `peers.rs` | the gateway prober, the judgements last told and saved |
//! | `BackendHealthState` | `backend_health.rs` | the backend checker and the saved states |
//! | `Leaving` | `leaving.rs` | flows and affinity of backends that left |
//! | `DriftWatch` | `drift.rs` | host interfaces' indexes, drift seen since the last sync |
//! | `Sweeper` | `sweeper.rs` | the last conntrack sweep |
//! | `SidecarWatch` | `sidecar_watch.rs` | the sidecar registrar |
//! | `MetricsFeed` | `metrics_feed.rs` | the counters and the endpoint |
//! | `ServiceHealthFeed` | `service_health_feed.rs` | the service health endpoint |
//! | `StatusWriter` | `status_write.rs` | the status file's writer thread and the status it will write next |
//!
//! `Daemon` joins them: `sync.rs` runs one sync through each in turn,
//! `status_write.rs` builds what they report and hands it to the writer. `run` builds the live
//! backends and threads; the loop takes them as `Parts`, so unit tests
//! (`tests.rs`) drive it on fakes.

mod applied;
mod backend_health;
mod config_watch;
mod drift;
mod event_loop;
mod events;
mod key_watch;
mod leaving;
mod metrics_feed;
mod notify;
mod peers;
pub(crate) mod report;
mod service_health_feed;
mod service_rows;
mod sidecar_watch;
mod status_write;
mod sweeper;
mod sync;
mod sync_runner;
#[cfg(test)]
mod tests;

pub(crate) use events::Event;
pub(crate) use notify::Notifier;

use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::Duration;

use slog::{info, warn, Logger};

use crate::backends::bpf::{features, PinnedBpf};
use crate::backends::host::LiveHost;
use crate::backends::netlink::Rtnetlink;
use crate::backends::nft::NftCli;
use crate::backends::sidecar::LiveSidecars;
use crate::backends::sysctl::ProcSys;
use crate::backends::{Backends, SidecarBackend};
use crate::model::KernelFeatures;
use crate::paths::Paths;
use crate::peer_health::{LiveProber, PeerProber};
use crate::reconcile::{Reconciler, SysctlOriginals};
use crate::state::InstanceLock;

/// Retry delay when a sync could not even read the kernel.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(1);
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

/// What the loop works with: the kernel backends and what starts threads
/// or talks to systemd. `run` gives the live ones; tests give fakes.
pub(super) struct Parts {
    pub backends: Backends,
    pub originals: SysctlOriginals,
    pub sidecars: Box<dyn SidecarBackend + Send>,
    pub prober: Box<dyn PeerProber>,
    pub notifier: Notifier,
    pub features: KernelFeatures,
    /// Raised on SIGTERM: a sync stops between steps.
    pub stopping: Arc<AtomicBool>,
    /// For threads started later (peer and backend health) to wake the loop.
    pub events: events::EventSender,
}

pub(super) struct Daemon {
    paths: Paths,
    log: Logger,
    notifier: Notifier,
    started_at: u64,
    /// What the kernel offers (probed once, at start).
    features: KernelFeatures,
    events: events::EventSender,
    config: config_watch::ConfigWatch,
    runner: sync_runner::SyncRunner,
    peers: peers::PeerProbing,
    key_watch: key_watch::KeyWatch,
    backend_health: backend_health::BackendHealthState,
    leaving: leaving::Leaving,
    drift: drift::DriftWatch,
    sweeper: sweeper::Sweeper,
    sidecars: sidecar_watch::SidecarWatch,
    metrics: metrics_feed::MetricsFeed,
    service_health: service_health_feed::ServiceHealthFeed,
    status_writer: status_write::StatusWriter,
}

pub(crate) fn run(paths: Paths, log: Logger) -> Result<(), RunError> {
    if !paths.config.admin().is_dir() {
        return Err(RunError::NoConfigDir(paths.config.admin().display().to_string()));
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
    // The objects' loader is made while the kernel is probed and the
    // configuration read (seconds of a CPU under emulation).
    let warm = crate::backends::bpf::Warm::start();
    let features = features::probe()?;
    info!(log, "kernel features probed"; "release" => report::kernel_release(), "result" => features.summary());
    let backends = Backends {
        host: Box::new(LiveHost::new(&paths.state_dir, features.clone()).map_err(RunError::Netlink)?),
        net: Box::new(Rtnetlink::open().map_err(RunError::Netlink)?),
        sysctl: Box::new(ProcSys::new()),
        bpf: Box::new(PinnedBpf::new(&paths.bpffs, features.clone()).warmed(warm)),
        nft: Box::new(NftCli::new()),
    };

    let (tx, rx) = channel();
    let tx = events::EventSender::new(tx);
    // SIGTERM also raises this flag, which a sync checks between steps.
    let stopping = Arc::new(AtomicBool::new(false));
    events::spawn_signal_thread(tx.clone(), stopping.clone()).map_err(RunError::Signals)?;
    let monitor_tx = tx.clone();
    if let Err(e) = crate::backends::netlink::monitor::spawn_monitor(move |c| {
        let _ = monitor_tx.send(Event::Kernel(c));
    }) {
        warn!(log, "cannot follow kernel events; drift is repaired at the periodic resync"; "error" => e.to_string());
    }
    let _watcher = match events::watch_config_dirs(&paths.config, tx.clone()) {
        Ok(w) => Some(w),
        Err(e) => {
            warn!(log, "cannot watch the config dirs; changes apply at the next resync or SIGHUP"; "dir" => paths.config.admin().display().to_string(), "error" => e.to_string());
            None
        }
    };

    let config_dirs = paths.config.in_order().map(|(_, d)| d.display().to_string()).collect::<Vec<_>>().join(", ");
    info!(log, "starting"; "version" => env!("CARGO_PKG_VERSION"), "config_dirs" => config_dirs,
        "state_dir" => paths.state_dir.display().to_string(), "bpffs" => paths.bpffs.display().to_string());
    let parts = Parts {
        backends,
        originals,
        sidecars: Box::new(LiveSidecars::new(&paths.bpffs)),
        prober: {
            let bpffs = paths.bpffs.clone();
            Box::new(LiveProber {
                open: std::sync::Arc::new(move |s: &crate::peer_health::Settings| {
                    crate::backends::probe_wire::LiveWire::open(s, &bpffs)
                        .map(|w| Box::new(w) as Box<dyn crate::peer_health::Wire>)
                }),
            })
        },
        notifier: Notifier::from_env(),
        features,
        stopping,
        events: tx,
    };
    Daemon::new(paths, log, parts).run_loop(rx)
}

impl Daemon {
    pub(super) fn new(paths: Paths, log: Logger, parts: Parts) -> Self {
        let traffic = crate::backends::bpf::traffic::TrafficReader::new(&paths.bpffs);
        let waiting = parts.events.waiting();
        Daemon {
            notifier: parts.notifier,
            started_at: crate::clock::now_unix(),
            features: parts.features,
            events: parts.events,
            config: config_watch::ConfigWatch::new(paths.config.clone(), &paths.state_dir),
            runner: sync_runner::SyncRunner::new(
                Reconciler::new(parts.backends, parts.originals)
                    .with_stop_flag(parts.stopping)
                    .with_waiting_flag(waiting),
            ),
            peers: peers::PeerProbing::new(parts.prober, &paths.state_dir),
            key_watch: Default::default(),
            backend_health: backend_health::BackendHealthState::restore(&paths.state_dir, &log),
            leaving: Default::default(),
            drift: Default::default(),
            sweeper: Default::default(),
            sidecars: sidecar_watch::SidecarWatch::new(parts.sidecars),
            metrics: metrics_feed::MetricsFeed::new(crate::metrics::Metrics::new(traffic)),
            service_health: Default::default(),
            status_writer: status_write::StatusWriter::start(paths.state_dir.clone(), log.clone()),
            paths,
            log,
        }
    }

    fn resync_interval(&self) -> Duration {
        self.config.config().daemon.resync_interval
    }

    /// Ends the loop: tells systemd and marks the status stopped. Kernel
    /// state stays in place.
    fn stop(&mut self) -> Result<(), RunError> {
        self.notifier.stopping();
        info!(self.log, "stopping; programs, maps, routes and links stay in place"; "generation" => self.runner.generation);
        // The last status again, marked stopped: from what the writer
        // holds, not read back (30 MB at 100,000 services).
        self.status_writer.mark_stopped();
        Ok(())
    }
}

/// Receives the loop's events (kept here so `event_loop.rs` names one type).
pub(super) type Events = Receiver<Event>;
