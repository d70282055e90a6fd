//! Backends that left a service (down, draining, removed), after the
//! clean sync that took them out of its tables: the flows they still have
//! are dropped — UDP ones at once (a datagram flow never sticks to a
//! backend that left), TCP ones after the service's `drain_timeout` if it
//! has one (else they finish) — and clients that affinity remembered at
//! them are forgotten. After a full sync, the traffic counters of backends
//! no longer configured go too.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::SocketAddr;

use super::*;
use crate::abi::SvcKey;
use crate::backends::StoppedBackend;
use crate::health::{self, DropSets};

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
}

impl Daemon {
    /// After a clean sync (`full`, or the `first`), with the `drop_sets`
    /// and `affinity_serving` of the configuration it compiled.
    pub(super) fn after_clean_sync(
        &mut self,
        (sets, affinity): (DropSets, BTreeMap<SvcKey, BTreeSet<SocketAddr>>),
        first: bool,
        full: bool,
    ) {
        let stopped = health::stopped(&self.leaving.drop_sets, &sets);
        let now = Instant::now();
        let mut at_once = Vec::new();
        for (b, delay) in stopped {
            match delay {
                None => at_once.push(b),
                Some(d) => {
                    self.leaving.pending.insert(b, now + d);
                }
            }
        }
        // A backend back before its drain timeout keeps its flows.
        self.leaving.pending.retain(|b, _| !health::serves(&sets, b));
        self.leaving.drop_sets = sets;
        self.drop_flows(&at_once, "left");
        self.prune_affinity(affinity, first);
        if full || first {
            self.prune_backend_stats();
        }
    }

    /// The traffic counters of (service, backend) pairs no longer
    /// configured, whatever their state: O(services + counters), so only
    /// after a full sync, which costs that anyway.
    fn prune_backend_stats(&mut self) {
        let configured: HashSet<(SvcKey, SocketAddr)> = self
            .loaded
            .config
            .services
            .iter()
            .flat_map(|s| {
                let key = SvcKey::new(s.vip, s.port, s.protocol.number());
                s.backends.iter().map(move |b| (key, b.addr))
            })
            .collect();
        match self.reconciler.prune_backend_stats(&configured) {
            Ok(0) => {}
            Ok(n) => info!(self.log, "traffic counters of backends no longer configured deleted"; "entries" => n),
            Err(e) => {
                warn!(self.log, "cannot prune traffic counters; retried at the next full sync"; "error" => e.to_string())
            }
        }
    }

    /// Drops the flows whose drain timeout ran out.
    pub(super) fn drop_drained(&mut self) {
        let now = Instant::now();
        let due: Vec<StoppedBackend> =
            self.leaving.pending.iter().filter(|(_, at)| **at <= now).map(|(b, _)| *b).collect();
        for b in &due {
            self.leaving.pending.remove(b);
        }
        self.drop_flows(&due, "drain timeout ran out");
    }

    fn drop_flows(&mut self, backends: &[StoppedBackend], why: &str) {
        if backends.is_empty() {
            return;
        }
        match self.reconciler.drop_flows(backends) {
            Ok(f) => {
                info!(self.log, "flows of backends that left dropped"; "why" => why, "backends" => backends.len(),
                    "flow_entries" => f.flow_entries, "sockets_destroyed" => f.sockets);
                if let Some(e) = f.sockets_error {
                    warn!(self.log, "connected sockets of backends that left not destroyed"; "reason" => e);
                }
            }
            Err(e) => warn!(self.log, "cannot drop the flows of backends that left; they end at their idle timeout";
                "why" => why, "error" => e.to_string()),
        }
    }

    /// Clients remembered at a backend that left their service are
    /// forgotten, so they move to a serving one and stick there; after the
    /// first sync, and whenever an affinity service's backends changed.
    fn prune_affinity(&mut self, now: BTreeMap<SvcKey, BTreeSet<SocketAddr>>, first: bool) {
        if now == self.leaving.affinity && !first {
            return;
        }
        match self.reconciler.prune_affinity(&now) {
            Ok(n) => {
                if n > 0 {
                    info!(self.log, "clients of backends that left moved on (affinity)"; "entries" => n);
                }
                self.leaving.affinity = now;
            }
            Err(e) => {
                warn!(self.log, "cannot prune affinity entries; retried at the next sync"; "error" => e.to_string())
            }
        }
    }
}
