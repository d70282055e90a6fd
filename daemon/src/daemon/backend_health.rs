//! The daemon's side of backend health: it hands the checker the backends
//! to check, compiles with only the serving ones, logs each change of
//! health, and keeps the states in the state dir for the next start.

use std::collections::BTreeMap;

use super::*;
use crate::health::{self, BackendHealth, BackendKey, Health, HealthMonitor};

/// What is saved of a state: a change of these rewrites the file, a new
/// check result alone does not.
type Saved = BTreeMap<BackendKey, (Health, u64)>;

#[derive(Default)]
pub(super) struct BackendHealthState {
    monitor: Option<HealthMonitor>,
    /// The states of the last run, until the checker starts with them.
    restored: BTreeMap<BackendKey, BackendHealth>,
    saved: Saved,
}

impl BackendHealthState {
    pub(super) fn restore(state_dir: &std::path::Path, log: &Logger) -> Self {
        let restored = health::load_saved(state_dir).unwrap_or_else(|e| {
            warn!(log, "cannot read the saved backend health; every checked backend starts unknown"; "error" => e.to_string());
            BTreeMap::new()
        });
        let saved = restored.iter().map(|(k, h)| (k.clone(), (h.health, h.since))).collect();
        BackendHealthState { monitor: None, restored, saved }
    }

    /// Every checked backend's health now.
    pub(super) fn states(&self) -> BTreeMap<BackendKey, BackendHealth> {
        self.monitor.as_ref().map(HealthMonitor::states).unwrap_or_default()
    }
}

impl Daemon {
    /// The configuration compile sees: only the backends that take new
    /// connections; the loaded one itself, shared, when all of them do.
    pub(super) fn serving(
        &self,
        states: &BTreeMap<BackendKey, BackendHealth>,
    ) -> std::sync::Arc<crate::config::Config> {
        match crate::health::serving(&self.loaded.config, states) {
            std::borrow::Cow::Borrowed(_) => std::sync::Arc::clone(&self.loaded.config),
            std::borrow::Cow::Owned(c) => std::sync::Arc::new(c),
        }
    }

    /// Starts, updates or stops the checker for the configuration in
    /// force; returns the states compile goes by.
    pub(super) fn track_backends(&mut self) -> BTreeMap<BackendKey, BackendHealth> {
        let targets = health::targets(&self.loaded.config);
        let h = &mut self.backend_health;
        if targets.is_empty() {
            h.monitor = None;
            return BTreeMap::new();
        }
        if h.monitor.is_none() {
            let events = self.events.clone();
            match HealthMonitor::start(std::mem::take(&mut h.restored), move || {
                events.send(Event::BackendsChanged).is_ok()
            }) {
                Ok(m) => {
                    info!(self.log, "checking backends"; "backends" => targets.len());
                    h.monitor = Some(m);
                }
                Err(e) => {
                    // Without checks nothing is known up: checked backends
                    // get no traffic, and the status says why.
                    error!(self.log, "cannot start the health checker; checked backends take no traffic"; "error" => e.to_string());
                    return BTreeMap::new();
                }
            }
        }
        let monitor = h.monitor.as_mut().expect("started above");
        monitor.set_targets(targets);
        monitor.states()
    }

    /// One log line per change of health since the last call.
    pub(super) fn log_backend_changes(&mut self) {
        let Some(m) = &self.backend_health.monitor else { return };
        for t in m.take_transitions() {
            let (service, backend) = (t.key.service, t.key.backend.to_string());
            match t.to {
                Health::Up => info!(self.log, "backend up; it takes new connections"; "service" => service,
                    "backend" => backend, "was" => t.from.to_string(), "check" => t.reason),
                _ => warn!(self.log, "backend down; no new connections go to it"; "service" => service,
                    "backend" => backend, "was" => t.from.to_string(), "reason" => t.reason),
            }
        }
    }

    /// Saves the states when a backend's health changed since the last save.
    pub(super) fn save_backend_health(&mut self, states: &BTreeMap<BackendKey, BackendHealth>) {
        let now: Saved = states.iter().map(|(k, h)| (k.clone(), (h.health, h.since))).collect();
        if now == self.backend_health.saved {
            return;
        }
        match health::save(&self.paths.state_dir, states) {
            Ok(()) => self.backend_health.saved = now,
            Err(e) => warn!(self.log, "cannot save the backends' health; a restart starts them unknown";
                "path" => self.paths.state_dir.join(health::SAVED_FILE).display().to_string(), "error" => e.to_string()),
        }
    }
}
