//! What a sync leaves behind for operators: the log lines of its outcome
//! and the status file `hostmesh status` reads.

use super::*;

impl Daemon {
    /// Writes the status file from the last sync and the sidecar
    /// registrations; returns the one-line STATUS=.
    pub(super) fn write_status(&mut self) -> String {
        let started = Instant::now();
        let status = self.status(self.last_outcome.as_ref(), false);
        if let Err(e) = status.write(&self.paths.state_dir) {
            warn!(self.log, "cannot write the status file"; "path" => Status::path(&self.paths.state_dir).display().to_string(), "error" => e.to_string());
        }
        let line = report::status_line(&status);
        self.publish_metrics(status);
        // bench/scale reads this (HOSTMESH_DEBUG=1): the status of every
        // object is part of an edit's cost.
        slog::debug!(self.log, "status written"; "duration_ms" => started.elapsed().as_millis() as u64);
        line
    }

    pub(super) fn log_outcome(&self, o: &SyncOutcome) {
        for step in &o.steps {
            slog::debug!(self.log, "step"; "step" => step.clone());
        }
        if o.step_count > o.steps.len() {
            slog::debug!(self.log, "more steps not listed"; "more" => o.step_count - o.steps.len());
        }
        for e in o.errors.iter().take(LOGGED_ERRORS) {
            error!(self.log, "apply failed"; "step" => e.step.clone(), "objects" => e.owners.iter().collect::<Vec<_>>().join(","), "error" => e.error.clone());
        }
        if o.errors.len() > LOGGED_ERRORS {
            error!(self.log, "apply failed for more steps; `hostmesh status` lists them per object"; "more" => o.errors.len() - LOGGED_ERRORS);
        }
        for n in &o.notes {
            warn!(self.log, "repaired"; "what" => n.clone());
        }
        for w in self.reconciler.desired().map_or(&[][..], |d| &d.warnings) {
            warn!(self.log, "config not applied"; "reason" => w.clone());
        }
        info!(self.log, "sync done"; "generation" => self.generation, "full" => o.full, "patched" => o.patched, "steps" => o.step_count,
            "errors" => o.errors.len(), "duration_ms" => o.duration.as_millis() as u64,
            "config_read_ms" => self.load_time.as_millis() as u64, "observe_ms" => o.phases.observe.as_millis() as u64,
            "compile_ms" => o.phases.compile.as_millis() as u64, "plan_ms" => o.phases.plan.as_millis() as u64,
            "apply_ms" => o.phases.apply.as_millis() as u64, "record_ms" => o.phases.record.as_millis() as u64,
            "services" => self.loaded.config.services.len(), "rejected_files" => self.loaded.rejected().count(),
            "parsed_files" => self.loaded.parsed_files);
    }

    pub(super) fn status(&self, outcome: Option<&SyncOutcome>, stopped: bool) -> Status {
        // The desired state of that sync (the reconciler keeps it).
        let desired = outcome.and(self.reconciler.desired());
        let backends = crate::health::report(&self.loaded.config, &self.backend_health.states());
        let mut counts = report::counts(&self.loaded, desired, self.health.as_ref(), &self.sweep);
        counts.backends_down = backends.iter().filter(|b| b.state == crate::state::BackendState::Down).count();
        Status {
            version: STATUS_VERSION,
            pid: std::process::id(),
            started_at: self.started_at,
            updated_at: crate::clock::now_unix(),
            config_dir: self.paths.config_dir.clone(),
            bpffs: self.paths.bpffs.clone(),
            generation: self.generation,
            resync_interval_ms: self.resync_interval().as_millis() as u64,
            ready: self.ready,
            stopped,
            last_sync: self.last_summary.clone(),
            counts,
            files: report::files(&self.loaded),
            skipped: self
                .loaded
                .skipped
                .iter()
                .map(|s| crate::state::SkippedEntry { path: s.path.clone(), reason: s.reason.clone() })
                .collect(),
            objects: outcome
                .zip(desired)
                .map(|(o, d)| report::objects(&self.loaded, o, d, self.registrar.report(), self.health.as_ref()))
                .unwrap_or_default(),
            warnings: desired
                .map(|d| d.warnings.clone())
                .unwrap_or_default()
                .into_iter()
                .chain(self.metrics_endpoint.error.clone())
                .collect(),
            kernel: Some(report::kernel(&self.features, self.loaded.config.daemon.tc_attach)),
            backends,
        }
    }
}

/// What the status file says of a sync.
pub(super) fn summary(result: &Result<SyncOutcome, crate::backends::BackendError>, full: bool) -> SyncSummary {
    match result {
        Ok(o) => SyncSummary {
            ok: o.errors.is_empty(),
            full: o.full,
            patched: o.patched,
            at: crate::clock::now_unix(),
            duration_ms: o.duration.as_millis() as u64,
            steps: o.step_count,
            errors: report::step_errors(o.errors.iter(), LOGGED_ERRORS),
        },
        Err(e) => SyncSummary {
            ok: false,
            full,
            at: crate::clock::now_unix(),
            errors: vec![e.to_string()],
            ..Default::default()
        },
    }
}
