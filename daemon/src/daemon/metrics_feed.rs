//! The metrics feed, the daemon's part: the counters every owner records
//! into, the endpoint following `[daemon] metrics_listen`, and after every
//! status write what the endpoint's snapshot is built from (that status
//! and the configuration).

use std::collections::BTreeMap;
use std::sync::Arc;

use slog::{info, warn, Logger};

use crate::abi::{HmMap, MAPS};
use crate::backends::bpf::objects::sized;
use crate::config::Config;
use crate::metrics::{MapRow, Metrics, MetricsServer, Published};
use crate::model::Desired;
use crate::state::Status;

pub(super) struct MetricsFeed {
    metrics: Metrics,
    server: Option<MetricsServer>,
    /// The address last tried (`Some(None)`: "off"), so a port that is
    /// taken is reported once, not at every sync.
    tried: Option<Option<std::net::SocketAddr>>,
    /// Why the endpoint is not serving, for the status.
    pub(super) error: Option<String>,
    /// Entries per map in the desired state, and the generation they are of.
    entries: (u64, BTreeMap<HmMap, u64>),
}

impl MetricsFeed {
    pub(super) fn new(metrics: Metrics) -> Self {
        MetricsFeed { metrics, server: None, tried: None, error: None, entries: (0, BTreeMap::new()) }
    }

    /// What syncs, reloads and peer transitions are counted in.
    pub(super) fn counters(&self) -> &Metrics {
        &self.metrics
    }

    /// (Re)starts the endpoint when `[daemon] metrics_listen` changed.
    pub(super) fn track_server(&mut self, config: &Config, log: &Logger) {
        let want = config.daemon.metrics_listen;
        if self.tried == Some(want) {
            return;
        }
        self.tried = Some(want);
        // The old one closes its port before a new one binds.
        self.server = None;
        self.error = None;
        let Some(addr) = want else { return };
        match MetricsServer::start(addr, self.metrics.clone()) {
            Ok(s) => {
                info!(log, "serving metrics"; "listen" => s.addr().to_string(), "path" => "/metrics");
                self.server = Some(s);
            }
            Err(e) => {
                warn!(log, "no metrics endpoint; the dataplane is unaffected"; "error" => e.to_string());
                self.error = Some(e.to_string());
            }
        }
    }

    /// Hands the endpoint `status` and the configuration (nothing while it
    /// is off); the scrape thread builds its snapshot from them.
    pub(super) fn publish(&mut self, config: &Arc<Config>, status: Status, want: Option<&Desired>, generation: u64) {
        if self.server.is_none() {
            return;
        }
        let maps = self.map_rows(config, &status, want, generation);
        self.metrics.publish(Published::new(config, status, maps));
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
