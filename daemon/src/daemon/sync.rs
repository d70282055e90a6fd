//! One sync, through each owner in turn: read the config, follow peer and
//! backend health, reconcile, drop what left, record the outcome, then
//! sidecars, the HTTP endpoints, the status file and systemd.

use slog::info;

pub(super) use super::sync_runner::Sync;
use super::sync_runner::{Ran, SyncRunner};
use super::Daemon;

impl Daemon {
    /// One sync. Returns false if it could not complete (the kernel could
    /// not be read, or it was told to stop), in which case it is retried
    /// soon as a full resync. A resync (`Sync::Resync`) may give way to
    /// an event that asks for a sync: it returns false too, and the loop
    /// runs it again after that sync (`gave_way` says which it was).
    pub(super) fn sync(&mut self, how: Sync) -> bool {
        let full = how != Sync::Incremental;
        self.config.read(full, &self.log, self.metrics.counters());
        self.runner.generation += 1;
        let config = std::sync::Arc::clone(self.config.config());
        self.peers.track(&config, &self.events, &self.log);
        self.key_watch.track(&config, &self.events, &self.log);
        self.runner.reconciler.set_gateways(self.peers.chosen());
        let states = self.backend_health.track(&config, &self.events, &self.log);
        let serving = crate::health::serving_config(&config, &states);
        let result = self.runner.sync(&serving, how);
        if let Some(full) = SyncRunner::clean(&result) {
            let first = !self.runner.ready;
            self.leaving.after_clean_sync(&mut self.runner.reconciler, &serving, &config, first, full, &self.log);
        }
        drop(serving);
        self.backend_health.save(&states, &self.paths.state_dir, &self.log);
        self.peers.save(&self.log);
        let ran = self.runner.record(
            result,
            full,
            &self.config.loaded,
            self.config.load_time,
            &self.log,
            self.metrics.counters(),
        );
        if matches!(ran, Ran::Stopped | Ran::GaveWay) || self.runner.start_failure.is_some() {
            return false;
        }
        self.drift.settle(&self.log);
        if ran != Ran::Failed {
            self.drift.remember_hosts(self.runner.reconciler.desired());
        }
        self.sidecars.tick(&config, self.runner.reconciler.desired(), &self.log);
        // After the sync, so the endpoints' first answers are of it.
        self.metrics.track_server(&config, &self.log);
        if matches!(ran, Ran::Done { .. }) {
            self.service_health.publish(self.runner.reconciler.desired());
        }
        self.service_health.track_server(&config, &self.log);
        let line = self.write_status();
        match ran {
            // A change's sync while a reload waits (its resync gave way to
            // the change, or comes next) does not end the reload: that is
            // the READY=1 after the reload's own sync.
            Ran::Done { .. } if how == Sync::Incremental && self.notifier.ends_reload() => {
                self.notifier.status(&line);
                true
            }
            Ran::Done { first_ready } => {
                // READY=1 after every completed sync: the first tells
                // systemd we started; later ones end a RELOADING=1. Before
                // the READY=1 of the start or of a reload the status file
                // shows the sync, so `systemctl start` or `reload`
                // followed by `hostmesh status` sees what it did; an
                // edit's or a periodic resync's status follows it on the
                // writer's thread.
                if first_ready || self.notifier.ends_reload() {
                    self.status_writer.flush();
                }
                self.notifier.ready(&line);
                if first_ready {
                    info!(self.log, "ready"; "status" => line);
                }
                true
            }
            _ => {
                self.notifier.status(&line);
                false
            }
        }
    }
}
