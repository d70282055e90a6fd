//! The metrics feed, the daemon's part: the counters every owner records
//! into, the endpoint following `[daemon] metrics_listen`, and after every
//! status write what the endpoint's snapshot is built from (that status
//! and the configuration).

use std::collections::BTreeMap;
use std::sync::Arc;

use slog::Logger;

use crate::abi::{HmMap, MAPS};
use crate::backends::bpf::objects::sized;
use crate::config::{Config, MapSizes};
use crate::http_endpoint::Listening;
use crate::metrics::{MapRow, Metrics, Published};
use crate::model::BpfMap;
use crate::state::Status;

pub(super) struct MetricsFeed {
    metrics: Metrics,
    /// The endpoint, following `[daemon] metrics_listen`.
    pub(super) listening: Listening,
}

impl MetricsFeed {
    pub(super) fn new(metrics: Metrics) -> Self {
        MetricsFeed { metrics, listening: Listening::default() }
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
    pub(super) fn publish(
        &mut self,
        config: &Arc<Config>,
        status: &Status,
        entries: Option<&BTreeMap<BpfMap, usize>>,
        sizes: Option<MapSizes>,
    ) {
        if !self.listening.serving() {
            return;
        }
        let maps = self.map_rows(status, entries, &sizes.unwrap_or(config.daemon.sizes));
        self.metrics.publish(Published::new(config, status.clone(), maps));
    }

    /// Every map's capacity (`sizes`, the maps'); the entries of those the
    /// daemon writes (the desired state's, which the compile counts and
    /// patches keep) and conntrack's (from the last sweep).
    fn map_rows(&self, status: &Status, entries: Option<&BTreeMap<BpfMap, usize>>, sizes: &MapSizes) -> Vec<MapRow> {
        let count = |map: BpfMap| entries.and_then(|e| e.get(&map)).copied().unwrap_or(0) as u64;
        MAPS.iter()
            .filter(|m| m.pinned)
            .map(|m| {
                let entries = match m.map {
                    HmMap::Ct => Some(status.counts.conntrack_open as u64),
                    HmMap::CtClosing => Some(status.counts.conntrack_closed as u64),
                    HmMap::Nat => Some(status.counts.conntrack_external as u64),
                    map => BpfMap::of(map).map(count),
                };
                MapRow { map: m.name, entries, capacity: u64::from(sized(m.map, sizes).max_entries) }
            })
            .collect()
    }
}
