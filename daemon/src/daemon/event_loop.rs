//! The daemon's loop: one thread waits for events (files, signals, peer
//! and backend health, kernel changes) and for the next due job (full
//! resync, sweep, sysctl check, watchdog, sidecars, drained flows), and
//! runs one sync at a time. Every event goes through `on_event`, whether
//! it arrives alone or in a burst: a burst of file events (or SIGHUPs) is
//! settled behind a short debounce, and whatever else arrives meanwhile
//! is handled exactly as it would be alone, riding along with the burst's
//! sync.

use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use slog::{info, warn};

use super::drift::REPAIR_SETTLE;
use super::sync::Sync;
use super::{Daemon, Event, Events, RunError, CONNTRACK_SWEEP, RETRY_AFTER_FAILURE};

/// How long the config dir must be quiet before a sync...
const DEBOUNCE_QUIET: Duration = Duration::from_millis(150);
/// ...but a steady stream of events never delays a sync longer than this.
const DEBOUNCE_MAX: Duration = Duration::from_secs(1);
/// How often sidecar listeners are checked while mesh entries exist: a
/// restarted sidecar is registered within this (plus a little).
const SIDECAR_CHECK: Duration = Duration::from_millis(250);
/// How often the sysctls hostmesh set are read back.
const SYSCTL_CHECK: Duration = Duration::from_secs(1);

/// When the loop next does each of its jobs, and what is pending.
struct Timers {
    watchdog: Option<Duration>,
    next_watchdog: Option<Instant>,
    /// The first sync is full and happens right away.
    next_full: Instant,
    pending_incremental: bool,
    /// A SIGHUP arrived in the burst being settled: its sync is full.
    reload_pending: bool,
    /// Since when the due resync has been giving way to changes (it stays
    /// due meanwhile).
    giving_way_since: Option<Instant>,
    next_sidecars: Instant,
    next_sweep: Instant,
    next_sysctl_check: Instant,
}

impl Timers {
    fn new(watchdog: Option<Duration>) -> Self {
        let now = Instant::now();
        Timers {
            watchdog,
            next_watchdog: watchdog.map(|w| now + w),
            next_full: now,
            pending_incremental: false,
            reload_pending: false,
            giving_way_since: None,
            next_sidecars: now,
            next_sweep: now + CONNTRACK_SWEEP,
            next_sysctl_check: now + SYSCTL_CHECK,
        }
    }

    /// A full resync repairs drift REPAIR_SETTLE from now (or sooner).
    fn repair_soon(&mut self) {
        self.next_full = self.next_full.min(Instant::now() + REPAIR_SETTLE);
    }
}

/// What the loop does after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    /// Go on: anything due runs next.
    Go,
    /// Settle a burst first (file events, SIGHUP).
    Settle,
    Stop,
}

impl Daemon {
    pub(super) fn run_loop(&mut self, rx: Events) -> Result<(), RunError> {
        let mut t = Timers::new(self.notifier.watchdog_interval());
        loop {
            if self.due_work(&mut t)? {
                continue;
            }
            let deadline = self.keepalive(&mut t);
            self.events.looking();
            let then = match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(event) => self.on_event(event, &mut t),
                Err(RecvTimeoutError::Timeout) => Then::Go,
                Err(RecvTimeoutError::Disconnected) => Then::Stop,
            };
            let then = if then == Then::Settle { self.settle(&rx, &mut t) } else { then };
            if then == Then::Stop {
                return self.stop();
            }
        }
    }

    /// Every event, alone or in a burst: what it means, logged and
    /// counted here once.
    fn on_event(&mut self, event: Event, t: &mut Timers) -> Then {
        match event {
            Event::ConfigChanged => {
                t.pending_incremental = true;
                Then::Settle
            }
            Event::Reload => {
                // An operator's reload re-reads everything, once for a
                // burst of signals: they settle like file events do.
                if !t.reload_pending {
                    info!(self.log, "reload requested (SIGHUP)");
                    self.notifier.reloading();
                    t.reload_pending = true;
                }
                Then::Settle
            }
            Event::Stop => Then::Stop,
            Event::PeersChanged => {
                // Routes change with the next (immediate) sync.
                self.peers.take_changes(&self.log, self.metrics.counters());
                t.pending_incremental = true;
                Then::Go
            }
            Event::BackendsChanged => {
                // No debounce: a backend that went down leaves its tables now.
                self.backend_health.log_changes(&self.log);
                t.pending_incremental = true;
                Then::Go
            }
            Event::Kernel(change) => {
                if let Some(why) = self.drift.of(&change, self.runner.reconciler.desired()) {
                    self.drift.log(why, &self.log);
                    t.repair_soon();
                }
                Then::Go
            }
            Event::WatchError(e) => {
                warn!(self.log, "config dir watch failed; changes apply at the next resync or SIGHUP"; "error" => e);
                Then::Go
            }
        }
    }

    /// Handles events until they have been quiet for DEBOUNCE_QUIET (at
    /// most DEBOUNCE_MAX); a reload in the burst makes its sync full.
    fn settle(&mut self, rx: &Events, t: &mut Timers) -> Then {
        let start = Instant::now();
        loop {
            let left = DEBOUNCE_MAX.saturating_sub(start.elapsed());
            if left.is_zero() {
                break;
            }
            self.events.looking();
            match rx.recv_timeout(DEBOUNCE_QUIET.min(left)) {
                Ok(event) => {
                    if self.on_event(event, t) == Then::Stop {
                        return Then::Stop;
                    }
                }
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => return Then::Stop,
            }
        }
        if std::mem::take(&mut t.reload_pending) {
            t.next_full = Instant::now();
        }
        Then::Go
    }

    /// Runs the sync or check that is due, if one is; true when it did
    /// (the loop then looks again before it waits).
    fn due_work(&mut self, t: &mut Timers) -> Result<bool, RunError> {
        let now = Instant::now();
        // A change waiting goes before a resync that is due (one that gave
        // way to it, or came due meanwhile): its sync costs what it
        // changes, the resync a read of the whole kernel. Not before the
        // first sync, which is the start.
        let change_first = t.pending_incremental && self.runner.ready;
        if now >= t.next_full && !change_first {
            // It gives way to changes for at most one resync interval after
            // it first did; then it runs whole, so a steady stream of edits
            // never keeps drift unrepaired for more than two intervals.
            let may_give_way = t.giving_way_since.is_none_or(|since| since.elapsed() < self.resync_interval());
            let ok = self.sync(if may_give_way { Sync::Resync } else { Sync::Full });
            if let Some(why) = self.runner.start_failure.take() {
                // READY means working: a first sync that could not build
                // the dataplane is a failed start.
                self.notifier.status(&why);
                return Err(RunError::FirstSync(why));
            }
            if self.runner.gave_way {
                // Still due: the loop takes the change in first.
                t.giving_way_since.get_or_insert(now);
                return Ok(false);
            }
            t.giving_way_since = None;
            t.next_full = Instant::now() + if ok { self.resync_interval() } else { RETRY_AFTER_FAILURE };
            t.pending_incremental = false;
            return Ok(true);
        }
        if self.leaving.next_drop().is_some_and(|at| now >= at) {
            self.leaving.drop_drained(&mut self.runner.reconciler, &self.log);
        }
        if now >= t.next_sweep {
            if self.sweeper.sweep(&mut self.runner.reconciler, &self.log) {
                self.write_status();
            }
            t.next_sweep = Instant::now() + CONNTRACK_SWEEP;
        }
        if now >= t.next_sysctl_check {
            t.next_sysctl_check = Instant::now() + SYSCTL_CHECK;
            if let Some(why) = self.runner.reconciler.sysctl_drift() {
                self.drift.log(why, &self.log);
                t.repair_soon();
                return Ok(true);
            }
        }
        if t.pending_incremental {
            t.pending_incremental = false;
            if !self.sync(Sync::Incremental) {
                t.next_full = Instant::now() + RETRY_AFTER_FAILURE;
            }
            return Ok(true);
        }
        Ok(false)
    }

    /// Pets the watchdog and checks sidecars when due; returns when the
    /// loop must wake next.
    fn keepalive(&mut self, t: &mut Timers) -> Instant {
        let now = Instant::now();
        if let (Some(w), Some(at)) = (t.watchdog, t.next_watchdog) {
            if now >= at {
                self.notifier.watchdog();
                t.next_watchdog = Some(now + w);
            }
        }
        let next_sidecar_check = if self.config.config().meshes.is_empty() {
            None
        } else {
            if now >= t.next_sidecars {
                let config = std::sync::Arc::clone(self.config.config());
                if self.sidecars.tick(&config, self.runner.reconciler.desired(), &self.log) {
                    let line = self.write_status();
                    self.notifier.status(&line);
                }
                t.next_sidecars = Instant::now() + SIDECAR_CHECK;
            }
            Some(t.next_sidecars)
        };
        let mut deadline = t.next_full.min(t.next_sweep).min(t.next_sysctl_check);
        for at in [t.next_watchdog, next_sidecar_check, self.leaving.next_drop()].into_iter().flatten() {
            deadline = deadline.min(at);
        }
        deadline
    }
}
