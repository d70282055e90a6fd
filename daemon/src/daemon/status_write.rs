//! The status file `hostmesh status` reads, written from what each owner
//! reports, and handed on to the metrics endpoint.

use std::time::Instant;

use slog::warn;

use super::{report, Daemon};
use crate::state::{Status, STATUS_VERSION};

impl Daemon {
    /// Writes the status file from the last sync and the sidecar
    /// registrations; returns the one-line STATUS=.
    pub(super) fn write_status(&mut self) -> String {
        let started = Instant::now();
        let status = self.status();
        if let Err(e) = status.write(&self.paths.state_dir) {
            warn!(self.log, "cannot write the status file"; "path" => Status::path(&self.paths.state_dir).display().to_string(), "error" => e.to_string());
        }
        let line = report::status_line(&status);
        let config = std::sync::Arc::clone(self.config.config());
        self.metrics.publish(&config, status, self.runner.reconciler.desired(), self.runner.generation);
        // bench/scale reads this (HOSTMESH_DEBUG=1): the status of every
        // object is part of an edit's cost.
        slog::debug!(self.log, "status written"; "duration_ms" => started.elapsed().as_millis() as u64);
        line
    }

    fn status(&self) -> Status {
        let loaded = &self.config.loaded;
        let outcome = self.runner.last_outcome.as_ref();
        // The desired state of that sync (the reconciler keeps it).
        let desired = outcome.and(self.runner.reconciler.desired());
        let peers = self.peers.probe();
        let backends = crate::health::report(&loaded.config, self.backend_health.applied());
        let mut counts = report::counts(loaded, desired, peers, &self.sweeper.last);
        counts.backends_down = backends.iter().filter(|b| b.state == crate::state::BackendState::Down).count();
        Status {
            version: STATUS_VERSION,
            pid: std::process::id(),
            started_at: self.started_at,
            updated_at: crate::clock::now_unix(),
            config_dir: self.paths.config_dir.clone(),
            bpffs: self.paths.bpffs.clone(),
            generation: self.runner.generation,
            resync_interval_ms: self.resync_interval().as_millis() as u64,
            ready: self.runner.ready,
            stopped: false,
            last_sync: self.runner.last_summary.clone(),
            counts,
            files: report::files(loaded),
            skipped: loaded
                .skipped
                .iter()
                .map(|s| crate::state::SkippedEntry { path: s.path.clone(), reason: s.reason.clone() })
                .collect(),
            objects: outcome
                .zip(desired)
                .map(|(o, d)| report::objects(loaded, o, d, self.sidecars.report(), peers))
                .unwrap_or_default(),
            warnings: desired
                .map(|d| d.warnings.clone())
                .unwrap_or_default()
                .into_iter()
                .chain(self.runner.reconciler.backend_warnings())
                .chain(self.metrics.listening.error.clone())
                .chain(self.service_health.listening.error.clone())
                .collect(),
            kernel: Some(report::kernel(&self.features, loaded.config.daemon.tc_attach)),
            backends,
        }
    }
}
