//! The daemon's side of the metrics endpoint: it follows `[daemon]
//! metrics_listen`, and after every status write hands the endpoint that
//! status and the configuration.

use std::collections::BTreeMap;

use super::*;
use crate::backends::bpf::objects::{map_def, MAPS};
use crate::metrics::{MapRow, MetricsServer, Published};

/// The endpoint and what the daemon knows of it.
#[derive(Default)]
pub(super) struct MetricsEndpoint {
    pub server: Option<MetricsServer>,
    /// The address last tried (`Some(None)`: "off"), so a port that is
    /// taken is reported once, not at every sync.
    tried: Option<Option<std::net::SocketAddr>>,
    /// Why the endpoint is not serving, for the status.
    pub error: Option<String>,
    /// Entries per map in the desired state, and the generation they are of.
    entries: (u64, BTreeMap<&'static str, u64>),
}

impl Daemon {
    /// (Re)starts the endpoint when `[daemon] metrics_listen` changed.
    pub(super) fn track_metrics_server(&mut self) {
        let want = self.loaded.config.daemon.metrics_listen;
        if self.metrics_endpoint.tried == Some(want) {
            return;
        }
        self.metrics_endpoint.tried = Some(want);
        // The old one closes its port before a new one binds.
        self.metrics_endpoint.server = None;
        self.metrics_endpoint.error = None;
        let Some(addr) = want else { return };
        match MetricsServer::start(addr, self.metrics.clone()) {
            Ok(s) => {
                info!(self.log, "serving metrics"; "listen" => s.addr().to_string(), "path" => "/metrics");
                self.metrics_endpoint.server = Some(s);
            }
            Err(e) => {
                warn!(self.log, "no metrics endpoint; the dataplane is unaffected"; "error" => e.to_string());
                self.metrics_endpoint.error = Some(e.to_string());
            }
        }
    }

    /// Hands the endpoint `status` and the configuration (nothing while it
    /// is off); the scrape thread builds its snapshot from them.
    pub(super) fn publish_metrics(&mut self, status: Status) {
        if self.metrics_endpoint.server.is_none() {
            return;
        }
        let maps = self.map_rows(&status);
        self.metrics.publish(Published::new(&self.loaded.config, status, maps));
    }

    /// Every map's capacity; the entries of those the daemon writes (from
    /// the desired state, counted once per generation) and conntrack's
    /// (from the last sweep).
    fn map_rows(&mut self, status: &Status) -> Vec<MapRow> {
        if self.metrics_endpoint.entries.0 != self.generation {
            let mut counts = BTreeMap::new();
            for k in self.reconciler.desired().map(|d| d.map_entries.keys()).into_iter().flatten() {
                *counts.entry(k.map.name()).or_default() += 1;
            }
            self.metrics_endpoint.entries = (self.generation, counts);
        }
        let counts = &self.metrics_endpoint.entries.1;
        let sizes = &self.loaded.config.daemon.sizes;
        MAPS.iter()
            .map(|m| {
                let entries = match m.name {
                    "HM_CT" => Some(status.counts.conntrack_open as u64),
                    "HM_CT_CLOSING" => Some(status.counts.conntrack_closed as u64),
                    name if crate::model::BpfMap::ALL.iter().any(|b| b.name() == name) => {
                        Some(counts.get(name).copied().unwrap_or(0))
                    }
                    _ => None,
                };
                MapRow { map: m.name, entries, capacity: u64::from(map_def(m.name, sizes).max_entries) }
            })
            .collect()
    }
}
