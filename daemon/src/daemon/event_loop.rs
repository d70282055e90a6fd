//! The daemon's loop: one thread waits for events (files, signals, peer
//! health, kernel changes) and for the next due job (full resync, sweep,
//! sysctl check, watchdog, sidecars), coalesces bursts behind a debounce,
//! and runs one sync at a time.

use super::*;

/// When the loop next does each of its jobs.
struct Timers {
    watchdog: Option<Duration>,
    next_watchdog: Option<Instant>,
    /// The first sync is full and happens right away.
    next_full: Instant,
    pending_incremental: bool,
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
            next_sidecars: now,
            next_sweep: now + CONNTRACK_SWEEP,
            next_sysctl_check: now + SYSCTL_CHECK,
        }
    }
}

impl Daemon {
    pub(super) fn run_loop(&mut self, rx: Receiver<Event>) -> Result<(), RunError> {
        let mut t = Timers::new(self.notifier.watchdog_interval());
        loop {
            if self.due_work(&mut t)? {
                continue;
            }
            let deadline = self.keepalive(&mut t);
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(event) => {
                    if let Some(end) = self.handle(event, &rx, &mut t) {
                        return end;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return self.stop(),
            }
        }
    }

    /// Runs the sync or check that is due, if one is; true when it did
    /// (the loop then looks again before it waits).
    fn due_work(&mut self, t: &mut Timers) -> Result<bool, RunError> {
        let now = Instant::now();
        if now >= t.next_full {
            let ok = self.sync(true);
            if let Some(why) = self.start_failure.take() {
                // READY means working: a first sync that could not build
                // the dataplane is a failed start.
                self.notifier.status(&why);
                return Err(RunError::FirstSync(why));
            }
            t.next_full = Instant::now() + if ok { self.resync_interval() } else { RETRY_AFTER_FAILURE };
            t.pending_incremental = false;
            return Ok(true);
        }
        if self.leaving.next_drop().is_some_and(|at| now >= at) {
            self.drop_drained();
        }
        if now >= t.next_sweep {
            self.expire_flows();
            t.next_sweep = Instant::now() + CONNTRACK_SWEEP;
        }
        if now >= t.next_sysctl_check {
            t.next_sysctl_check = Instant::now() + SYSCTL_CHECK;
            if let Some(why) = self.reconciler.sysctl_drift() {
                self.note_drift(why, &mut t.next_full);
                return Ok(true);
            }
        }
        if t.pending_incremental {
            t.pending_incremental = false;
            if !self.sync(false) {
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
        let next_sidecar_check = if self.loaded.config.meshes.is_empty() {
            None
        } else {
            if now >= t.next_sidecars {
                self.check_sidecars();
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

    /// One event; `Some` ends the loop with that result.
    fn handle(&mut self, event: Event, rx: &Receiver<Event>, t: &mut Timers) -> Option<Result<(), RunError>> {
        match event {
            Event::ConfigChanged => match self.debounce(rx, Settled::Quiet) {
                Settled::Stop => return Some(self.stop()),
                Settled::Full => t.next_full = Instant::now(),
                Settled::Quiet => t.pending_incremental = true,
            },
            Event::Reload => {
                info!(self.log, "reload requested (SIGHUP)");
                self.notifier.reloading();
                // An operator's reload re-reads everything, once for a
                // burst of signals: they settle like file events do.
                match self.debounce(rx, Settled::Full) {
                    Settled::Stop => return Some(self.stop()),
                    Settled::Full | Settled::Quiet => t.next_full = Instant::now(),
                }
            }
            Event::Stop => return Some(self.stop()),
            Event::PeersChanged => {
                // Routes change with the next (immediate) sync, which also
                // rewrites the status.
                self.log_peer_changes();
                t.pending_incremental = true;
            }
            Event::BackendsChanged => {
                // No debounce: a backend that went down leaves its tables now.
                self.log_backend_changes();
                t.pending_incremental = true;
            }
            Event::Kernel(change) => {
                if let Some(why) = self.drift_of(&change) {
                    self.note_drift(why, &mut t.next_full);
                }
            }
            Event::WatchError(e) => {
                warn!(self.log, "config dir watch failed; changes apply at the next resync or SIGHUP"; "error" => e)
            }
        }
        None
    }

    /// Waits until events have been quiet for DEBOUNCE_QUIET (at most
    /// DEBOUNCE_MAX), noting a stop, a reload or drift that arrives
    /// meanwhile. `settled` is what the burst started as.
    fn debounce(&mut self, rx: &Receiver<Event>, mut settled: Settled) -> Settled {
        let start = Instant::now();
        loop {
            let left = DEBOUNCE_MAX.saturating_sub(start.elapsed());
            if left.is_zero() {
                return settled;
            }
            match rx.recv_timeout(DEBOUNCE_QUIET.min(left)) {
                Ok(Event::Stop) | Err(RecvTimeoutError::Disconnected) => return Settled::Stop,
                Ok(Event::Reload) => {
                    if settled != Settled::Full {
                        info!(self.log, "reload requested (SIGHUP)");
                        self.notifier.reloading();
                    }
                    settled = Settled::Full;
                }
                // Drift during a burst makes its sync a full one.
                Ok(Event::Kernel(change)) => {
                    if let Some(why) = self.drift_of(&change) {
                        self.log_drift(why);
                        settled = Settled::Full;
                    }
                }
                // A peer or backend change during a burst rides along with
                // its sync.
                Ok(Event::BackendsChanged) => self.log_backend_changes(),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => return settled,
            }
        }
    }
}
