//! Backends that left a service (down, draining, removed), after the
//! clean sync that took them out of its tables: the flows they still have
//! are dropped — UDP ones at once (a datagram flow never sticks to a
//! backend that left), TCP ones after the service's `drain_timeout` if it
//! has one (else they finish) — and clients that affinity remembered at
//! them are forgotten. After a full sync, the traffic counters of backends
//! no longer configured go too.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::SocketAddr;
use std::time::Instant;

use slog::{info, warn, Logger};

use crate::abi::SvcKey;
use crate::backends::StoppedBackend;
use crate::config::Config;
use crate::health::{self, DropSets};
use crate::reconcile::Reconciler;

#[derive(Default)]
pub(super) struct Leaving {
    /// The serving backends of services whose leavers' flows are dropped,
    /// as of the last clean sync.
    drop_sets: DropSets,
    /// TCP backends that left, and when their flows are dropped.
    pending: BTreeMap<StoppedBackend, Instant>,
    /// Each affinity service's serving backends as of the last prune.
    affinity: BTreeMap<SvcKey, BTreeSet<SocketAddr>>,
}

impl Leaving {
    /// When the next pending drop is due.
    pub(super) fn next_drop(&self) -> Option<Instant> {
        self.pending.values().min().copied()
    }

    /// After a clean sync (`full`, or the `first`) of `serving` (what it
    /// compiled) from `config` (what is configured).
    pub(super) fn after_clean_sync(
        &mut self,
        rec: &mut Reconciler,
        serving: &Config,
        config: &Config,
        first: bool,
        full: bool,
        log: &Logger,
    ) {
        let (sets, affinity) = (health::drop_sets(serving), health::affinity_serving(serving));
        let stopped = health::stopped(&self.drop_sets, &sets);
        let now = Instant::now();
        let mut at_once = Vec::new();
        for (b, delay) in stopped {
            match delay {
                None => at_once.push(b),
                Some(d) => {
                    self.pending.insert(b, now + d);
                }
            }
        }
        // A backend back before its drain timeout keeps its flows.
        self.pending.retain(|b, _| !health::serves(&sets, b));
        self.drop_sets = sets;
        drop_flows(rec, &at_once, "left", log);
        self.prune_affinity(rec, affinity, first, log);
        if full || first {
            prune_backend_stats(rec, config, log);
        }
    }

    /// Drops the flows whose drain timeout ran out.
    pub(super) fn drop_drained(&mut self, rec: &mut Reconciler, log: &Logger) {
        let now = Instant::now();
        let due: Vec<StoppedBackend> = self.pending.iter().filter(|(_, at)| **at <= now).map(|(b, _)| *b).collect();
        for b in &due {
            self.pending.remove(b);
        }
        drop_flows(rec, &due, "drain timeout ran out", log);
    }

    /// Clients remembered at a backend that left their service are
    /// forgotten, so they move to a serving one and stick there; after the
    /// first sync, and whenever an affinity service's backends changed.
    fn prune_affinity(
        &mut self,
        rec: &mut Reconciler,
        now: BTreeMap<SvcKey, BTreeSet<SocketAddr>>,
        first: bool,
        log: &Logger,
    ) {
        if now == self.affinity && !first {
            return;
        }
        match rec.prune_affinity(&now) {
            Ok(n) => {
                if n > 0 {
                    info!(log, "clients of backends that left moved on (affinity)"; "entries" => n);
                }
                self.affinity = now;
            }
            Err(e) => warn!(log, "cannot prune affinity entries; retried at the next sync"; "error" => e.to_string()),
        }
    }
}

/// The traffic counters of (service, backend) pairs no longer configured,
/// whatever their state: O(services + counters), so only after a full
/// sync, which costs that anyway.
fn prune_backend_stats(rec: &mut Reconciler, config: &Config, log: &Logger) {
    let configured = |named: &HashSet<SvcKey>| -> HashSet<(SvcKey, SocketAddr)> {
        config
            .services
            .iter()
            .filter_map(|s| {
                let key = SvcKey::new(s.vip, s.port, s.protocol.number());
                named.contains(&key).then_some((key, s))
            })
            .flat_map(|(key, s)| s.backends.iter().map(move |b| (key, b.addr)))
            .collect()
    };
    match rec.prune_backend_stats(&configured) {
        Ok(0) => {}
        Ok(n) => info!(log, "traffic counters of backends no longer configured deleted"; "entries" => n),
        Err(e) => {
            warn!(log, "cannot prune traffic counters; retried at the next full sync"; "error" => e.to_string())
        }
    }
}

/// Drops the flows of `backends`, logging what it did.
fn drop_flows(rec: &mut Reconciler, backends: &[StoppedBackend], why: &str, log: &Logger) {
    if backends.is_empty() {
        return;
    }
    match rec.drop_flows(backends) {
        Ok(f) => {
            info!(log, "flows of backends that left dropped"; "why" => why, "backends" => backends.len(),
                "flow_entries" => f.flow_entries, "sockets_destroyed" => f.sockets);
            if let Some(e) = f.sockets_error {
                warn!(log, "connected sockets of backends that left not destroyed"; "reason" => e);
            }
        }
        Err(e) => warn!(log, "cannot drop the flows of backends that left; they end at their idle timeout";
            "why" => why, "error" => e.to_string()),
    }
}
