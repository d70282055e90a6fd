//! The sync runner: owns the reconciler and what the daemon remembers of
//! its syncs (the generation, whether a sync ever completed, the last
//! outcome), and logs each sync's outcome.

use std::sync::Arc;

use slog::{error, info, warn, Logger};

use crate::backends::BackendError;
use crate::config::{Config, Loaded};
use crate::metrics::Metrics;
use crate::reconcile::{Reconciler, SyncOutcome};
use crate::state::SyncSummary;

/// Step errors logged (and kept in the status's last sync) per sync; the
/// rest are counted, and listed per object in the status.
const LOGGED_ERRORS: usize = 20;

pub(super) struct SyncRunner {
    pub(super) reconciler: Reconciler,
    pub(super) generation: u64,
    /// A sync completed since the start: READY was sent.
    pub(super) ready: bool,
    pub(super) last_summary: SyncSummary,
    pub(super) last_outcome: Option<SyncOutcome>,
    /// Why the first sync could not build the dataplane (the start fails).
    pub(super) start_failure: Option<String>,
    /// The last sync was a resync that gave way to a change.
    pub(super) gave_way: bool,
}

/// What a sync came to, for the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ran {
    /// Completed (with or without step errors): the kernel was read and
    /// the plan applied.
    Done { first_ready: bool },
    /// The kernel could not be read, or the first sync could not build
    /// the dataplane: retried soon as a full sync.
    Failed,
    /// Told to stop part way: what was applied stays.
    Stopped,
    /// A resync gave way to a sync an event asks for: nothing was done.
    GaveWay,
}

/// Which sync the loop asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sync {
    /// What changed (an edit, a backend or peer that changed): patched
    /// where it can be.
    Incremental,
    /// Everything, from the kernel: the start, a reload, a retry, a
    /// repair of drift.
    Full,
    /// A periodic resync, or a reload: full, but it gives way to an edit
    /// that arrives while it reads the kernel (`Reconciler::sync_giving_way`).
    Resync,
}

impl SyncRunner {
    pub(super) fn new(reconciler: Reconciler) -> Self {
        SyncRunner {
            reconciler,
            generation: 0,
            ready: false,
            last_summary: SyncSummary::default(),
            last_outcome: None,
            start_failure: None,
            gave_way: false,
        }
    }

    /// Whether a sync's result is clean (no step error, not stopped):
    /// `Some(full)` if it is.
    pub(super) fn clean(result: &Result<SyncOutcome, BackendError>) -> Option<bool> {
        result.as_ref().ok().filter(|o| !o.stopped && !o.gave_way && o.errors.is_empty()).map(|o| o.full)
    }

    /// Records a sync's result: counts and logs it, keeps its summary and
    /// outcome, and decides whether the daemon is ready.
    pub(super) fn record(
        &mut self,
        result: Result<SyncOutcome, BackendError>,
        full: bool,
        loaded: &Loaded,
        load_time: std::time::Duration,
        log: &Logger,
        metrics: &Metrics,
    ) -> Ran {
        if result.as_ref().is_ok_and(|o| o.stopped) {
            // The status keeps describing the last complete sync.
            info!(log, "sync stopped early: stopping"; "generation" => self.generation);
            return Ran::Stopped;
        }
        self.gave_way = result.as_ref().is_ok_and(|o| o.gave_way);
        if let Some(o) = result.as_ref().ok().filter(|o| o.gave_way) {
            info!(log, "resync gave way to a change; it runs again after that change's sync";
                "generation" => self.generation, "observe_ms" => o.phases.observe.as_millis() as u64);
            return Ran::GaveWay;
        }
        match &result {
            Ok(o) => {
                metrics.sync_done(o.full, o.duration, o.errors.iter().flat_map(|e| e.owners.iter()));
                self.log_outcome(o, loaded, load_time, log);
            }
            Err(e) => error!(log, "sync failed; retrying"; "generation" => self.generation, "error" => e.to_string()),
        }
        self.last_summary = summary(&result, full);
        if !self.ready {
            self.start_failure = match &result {
                Err(e) => Some(e.to_string()),
                Ok(o) => o.bpf_unavailable.as_ref().map(|e| format!("cannot load the BPF programs: {e}")),
            };
            if self.start_failure.is_some() {
                return Ran::Failed;
            }
        }
        match result {
            Ok(outcome) => {
                self.last_outcome = Some(outcome);
                let first_ready = !self.ready;
                self.ready = true;
                Ran::Done { first_ready }
            }
            Err(_) => Ran::Failed,
        }
    }

    fn log_outcome(&self, o: &SyncOutcome, loaded: &Loaded, load_time: std::time::Duration, log: &Logger) {
        for step in &o.steps {
            slog::debug!(log, "step"; "step" => step.clone());
        }
        if o.step_count > o.steps.len() {
            slog::debug!(log, "more steps not listed"; "more" => o.step_count - o.steps.len());
        }
        for e in o.errors.iter().take(LOGGED_ERRORS) {
            error!(log, "apply failed"; "step" => e.step.clone(), "objects" => e.owners.iter().collect::<Vec<_>>().join(","), "error" => e.error.clone());
        }
        if o.errors.len() > LOGGED_ERRORS {
            error!(log, "apply failed for more steps; `hostmesh status` lists them per object"; "more" => o.errors.len() - LOGGED_ERRORS);
        }
        for n in &o.notes {
            warn!(log, "repaired"; "what" => n.clone());
        }
        for w in self.reconciler.desired().map_or(&[][..], |d| &d.warnings) {
            warn!(log, "config not applied"; "reason" => w.clone());
        }
        info!(log, "sync done"; "generation" => self.generation, "full" => o.full, "patched" => o.patched, "steps" => o.step_count,
            "errors" => o.errors.len(), "duration_ms" => o.duration.as_millis() as u64,
            "config_read_ms" => load_time.as_millis() as u64, "observe_ms" => o.phases.observe.as_millis() as u64,
            "compile_ms" => o.phases.compile.as_millis() as u64, "plan_ms" => o.phases.plan.as_millis() as u64,
            "apply_ms" => o.phases.apply.as_millis() as u64, "record_ms" => o.phases.record.as_millis() as u64,
            "services" => loaded.config.services.len(), "rejected_files" => loaded.rejected().count(),
            "parsed_files" => loaded.parsed_files);
    }

    /// Runs the reconciler on `serving` (the configuration with only the
    /// backends that take new connections).
    pub(super) fn sync(&mut self, serving: &Arc<Config>, how: Sync) -> Result<SyncOutcome, BackendError> {
        match how {
            Sync::Incremental => self.reconciler.sync(serving, false),
            Sync::Full => self.reconciler.sync(serving, true),
            Sync::Resync => self.reconciler.sync_giving_way(serving),
        }
    }
}

/// What the status file says of a sync.
fn summary(result: &Result<SyncOutcome, BackendError>, full: bool) -> SyncSummary {
    match result {
        Ok(o) => SyncSummary {
            ok: o.errors.is_empty(),
            full: o.full,
            patched: o.patched,
            at: crate::clock::now_unix(),
            duration_ms: o.duration.as_millis() as u64,
            steps: o.step_count,
            errors: super::report::step_errors(o.errors.iter(), LOGGED_ERRORS),
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
