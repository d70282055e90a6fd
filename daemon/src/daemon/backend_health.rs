//! Backend health, the daemon's part: hands the checker the backends to
//! check, logs each change of health, and keeps the states in the state
//! dir for the next start. (Compile sees only the serving backends:
//! `health::serving_config`.)

use std::collections::BTreeMap;
use std::path::Path;

use slog::{error, info, warn, Logger};

use super::Event;
use crate::config::Config;
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
    /// The states the last sync compiled with: what the dataplane follows,
    /// and what the status reports (a change the checker saw since is
    /// applied, and reported, by the sync it wakes).
    applied: BTreeMap<BackendKey, BackendHealth>,
}

impl BackendHealthState {
    pub(super) fn restore(state_dir: &Path, log: &Logger) -> Self {
        let restored = health::load_saved(state_dir).unwrap_or_else(|e| {
            warn!(log, "cannot read the saved backend health; every checked backend starts unknown"; "error" => e.to_string());
            BTreeMap::new()
        });
        let saved = restored.iter().map(|(k, h)| (k.clone(), (h.health, h.since))).collect();
        BackendHealthState { monitor: None, restored, saved, applied: BTreeMap::new() }
    }

    /// Every checked backend's health as the last sync applied it.
    pub(super) fn applied(&self) -> &BTreeMap<BackendKey, BackendHealth> {
        &self.applied
    }

    /// Starts, updates or stops the checker for `config`; a change of
    /// health is announced on `events`. Returns the states compile goes by.
    pub(super) fn track(
        &mut self,
        config: &Config,
        events: &super::events::EventSender,
        log: &Logger,
    ) -> BTreeMap<BackendKey, BackendHealth> {
        let targets = health::targets(config);
        if targets.is_empty() {
            self.monitor = None;
            self.applied.clear();
            return BTreeMap::new();
        }
        if self.monitor.is_none() {
            let events = events.clone();
            match HealthMonitor::start(std::mem::take(&mut self.restored), move || {
                events.send(Event::BackendsChanged).is_ok()
            }) {
                Ok(m) => {
                    info!(log, "checking backends"; "backends" => targets.len());
                    self.monitor = Some(m);
                }
                Err(e) => {
                    // Without checks nothing is known up: checked backends
                    // get no traffic, and the status says why.
                    error!(log, "cannot start the health checker; checked backends take no traffic"; "error" => e.to_string());
                    self.applied.clear();
                    return BTreeMap::new();
                }
            }
        }
        let monitor = self.monitor.as_mut().expect("started above");
        monitor.set_targets(targets);
        self.applied = monitor.states();
        self.applied.clone()
    }

    /// One log line per change of health since the last call.
    pub(super) fn log_changes(&self, log: &Logger) {
        let Some(m) = &self.monitor else { return };
        for t in m.take_transitions() {
            let (service, backend) = (t.key.service, t.key.backend.to_string());
            match t.to {
                Health::Up => info!(log, "backend up; it takes new connections"; "service" => service,
                    "backend" => backend, "was" => t.from.to_string(), "check" => t.reason),
                _ => warn!(log, "backend down; no new connections go to it"; "service" => service,
                    "backend" => backend, "was" => t.from.to_string(), "reason" => t.reason),
            }
        }
    }

    /// Saves the states when a backend's health changed since the last save.
    pub(super) fn save(&mut self, states: &BTreeMap<BackendKey, BackendHealth>, state_dir: &Path, log: &Logger) {
        let now: Saved = states.iter().map(|(k, h)| (k.clone(), (h.health, h.since))).collect();
        if now == self.saved {
            return;
        }
        match health::save(state_dir, states) {
            Ok(()) => self.saved = now,
            Err(e) => warn!(log, "cannot save the backends' health; a restart starts them unknown";
                "path" => state_dir.join(health::SAVED_FILE).display().to_string(), "error" => e.to_string()),
        }
    }
}
