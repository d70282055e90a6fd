//! The status file's view of backends: every backend of a checked service
//! with its health, and every draining one.

use std::collections::BTreeMap;

use super::{BackendHealth, BackendKey, Health};
use crate::config::Config;
use crate::state::{BackendState, BackendStatus};

pub(crate) fn backends(config: &Config, states: &BTreeMap<BackendKey, BackendHealth>) -> Vec<BackendStatus> {
    let mut out = Vec::new();
    for s in &config.services {
        for b in &s.backends {
            if s.health_check.is_none() && b.weight > 0 {
                continue;
            }
            let key = BackendKey { service: s.name.clone(), backend: b.addr };
            let health = s.health_check.as_ref().and_then(|_| states.get(&key));
            let state = match (b.weight, health.map(|h| h.health)) {
                (0, _) => BackendState::Draining,
                (_, Some(Health::Up)) => BackendState::Up,
                (_, Some(Health::Down)) => BackendState::Down,
                (_, Some(Health::Unknown) | None) => BackendState::Unknown,
            };
            out.push(BackendStatus {
                service: s.name.clone(),
                address: b.addr,
                state,
                since: health.map(|h| h.since),
                last_check: health.and_then(|h| h.last_check),
                last_passed: health.and_then(|h| h.last_passed),
                reason: health.and_then(|h| h.reason.clone()),
            });
        }
    }
    out
}
