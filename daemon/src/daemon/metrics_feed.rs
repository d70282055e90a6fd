//! The metrics feed, the daemon's part: the counters every owner records
//! into, the endpoint following `[daemon] metrics_listen`, and after every
//! status write what the endpoint's snapshot is built from (that status
//! and the configuration).

use std::collections::BTreeMap;
use std::sync::Arc;

use slog::Logger;

use crate::abi::{HmMap, MAPS};
use crate::backends::bpf::objects::sized;
use crate::config::Config;
use crate::http_endpoint::Listening;
use crate::metrics::{MapRow, Metrics, Published};
use crate::model::Desired;
use crate::state::Status;

pub(super) struct MetricsFeed {
    metrics: Metrics,
    /// The endpoint, following `[daemon] metrics_listen`.
    pub(super) listening: Listening,
    /// Entries per map in the desired state, and the generation they are of.
    entries: (u64, BTreeMap<HmMap, u64>),
}

impl MetricsFeed {
    pub(super) fn new(metrics: Metrics) -> Self {
        MetricsFeed { metrics, listening: Listening::default(), entries: (0, BTreeMap::new()) }
    }

    /// What syncs, reloads and peer transitions are counted in.
    pub(super) fn counters(&self) -> &Metrics {
        &self.metrics
    }

    /// (Re)starts the endpoint when `[daemon] metrics_listen` changed.
    pub(super) fn track_server(&mut self, config: &Config, log: &Logger) {
        self.listening.follow(config.daemon.metrics_listen, log, |addr| self.metrics.serve(addr));
    }

    /// Hands the endpoint `status` (a copy: the services' rows, which the
    /// endpoint does not use, are not in it yet) and the configuration
    /// (nothing while it is off); the scrape thread builds its snapshot
    /// from them.
    pub(super) fn publish(&mut self, config: &Arc<Config>, status: &Status, want: Option<&Desired>, generation: u64) {
        if !self.listening.serving() {
            return;
        }
        let maps = self.map_rows(config, status, want, generation);
        self.metrics.publish(Published::new(config, status.clone(), maps));
    }

    /// Every map's capacity; the entries of those the daemon writes (from
    /// the desired state, counted once per generation) and conntrack's
    /// (from the last sweep).
    fn map_rows(&mut self, config: &Config, status: &Status, want: Option<&Desired>, generation: u64) -> Vec<MapRow> {
        if self.entries.0 != generation {
            let mut counts = BTreeMap::new();
            for k in want.map(|d| d.map_entries.keys()).into_iter().flatten() {
                *counts.entry(k.map.map()).or_default() += 1;
            }
            self.entries = (generation, counts);
        }
        let counts = &self.entries.1;
        let sizes = &config.daemon.sizes;
        MAPS.iter()
            .filter(|m| m.pinned)
            .map(|m| {
                let entries = match m.map {
                    HmMap::Ct => Some(status.counts.conntrack_open as u64),
                    HmMap::CtClosing => Some(status.counts.conntrack_closed as u64),
                    HmMap::Nat => Some(status.counts.conntrack_external as u64),
                    map if crate::model::BpfMap::of(map).is_some() => Some(counts.get(&map).copied().unwrap_or(0)),
                    _ => None,
                };
                MapRow { map: m.name, entries, capacity: u64::from(sized(m.map, sizes).max_entries) }
            })
            .collect()
    }
}
