//! Backend health: the `health_check` of each service run against each of
//! its backends (`monitor`, `checks`), results turned into up / down with
//! hysteresis (`tracker`), kept across restarts (`saved`), and what that
//! leaves serving (`serving`: the configuration compile sees). A backend
//! that is down, draining (weight 0) or not yet checked leaves its
//! service's Maglev table, so it gets no new connection; connections it
//! has keep it (docs/design.md, "Backend health").

mod checks;
mod monitor;
mod report;
mod saved;
mod serving;
mod tracker;

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::config::{Config, HealthCheck};

pub(crate) use monitor::HealthMonitor;
pub(crate) use report::backends as report;
pub(crate) use saved::{load as load_saved, save, SAVED_FILE};
pub(crate) use serving::{affinity_serving, drop_sets, serves, serving_config, stopped, DropSets};
pub(crate) use tracker::Health;

/// A backend of a service (the same address in two services is checked
/// for each: their checks may differ).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub(crate) struct BackendKey {
    pub service: String,
    pub backend: SocketAddr,
}

/// What the status shows of a checked backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct BackendHealth {
    pub health: Health,
    /// Unix seconds of the last change of health (or of the first check).
    pub since: u64,
    /// Unix seconds of the last result, and whether it passed.
    pub last_check: Option<u64>,
    pub last_passed: Option<bool>,
    /// Why the last failed check failed.
    pub reason: Option<String>,
}

impl BackendHealth {
    fn new(health: Health, now: u64) -> Self {
        BackendHealth { health, since: now, last_check: None, last_passed: None, reason: None }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    pub key: BackendKey,
    pub check: HealthCheck,
}

/// A change of health, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Transition {
    pub key: BackendKey,
    pub from: Health,
    pub to: Health,
    pub reason: String,
}

/// Every backend of every service with a `health_check` (draining ones
/// too: their state shows, and is known when they come back).
pub(crate) fn targets(config: &Config) -> Vec<Target> {
    let mut out = Vec::new();
    for s in &config.services {
        let Some(check) = &s.health_check else { continue };
        for b in &s.backends {
            out.push(Target { key: BackendKey { service: s.name.clone(), backend: b.addr }, check: (**check).clone() });
        }
    }
    out
}
