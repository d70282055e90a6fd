//! The Prometheus endpoint (`[daemon] metrics_listen`). The daemon hands
//! over what it knows after every status write (the status, and the
//! configuration by reference), and counts syncs and reloads as
//! they happen; a scrape builds a snapshot from the last of those (once
//! per publication), renders it and
//! reads the probes' traffic counters from the pinned maps. The endpoint
//! runs on a thread of its own, so a scrape never waits for a sync and a
//! slow scraper never holds up the daemon (docs/design.md, "Metrics").

mod encode;
mod snapshot;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::backends::bpf::traffic::TrafficReader;

use crate::http_endpoint::{Endpoint, Kind, Reply, ServeError};
pub(crate) use snapshot::{MapRow, Published, Snapshot};

/// Buckets of `hostmesh_sync_duration_seconds`: 1 ms to ~65 s.
fn sync_buckets() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(0.001, 2.0, 17))
}

/// Counts of events since the daemon started.
#[derive(Debug, Default, Clone)]
struct Events {
    /// Step errors of syncs, by the kind of object they were for.
    sync_errors: BTreeMap<&'static str, u64>,
    /// Config reads, by outcome.
    reloads: BTreeMap<&'static str, u64>,
    /// Up/down changes of each gateway peer, and its last state.
    peer_transitions: BTreeMap<String, u64>,
    peer_up: BTreeMap<String, bool>,
    /// Moves of traffic to another gateway, and the gateway in use, by
    /// list of gateways (`Via::label`).
    failovers: BTreeMap<String, u64>,
    gateway_in_use: BTreeMap<String, Option<std::net::IpAddr>>,
}

#[derive(Debug)]
struct Shared {
    /// What the daemon published last, until a scrape builds it.
    published: Mutex<Option<Published>>,
    /// The snapshot scrapes render, built on the scrape thread from the
    /// last publication (so the daemon never pays for it); scrapes take
    /// it in turn, and the daemon never takes it.
    snapshot: Mutex<Arc<Snapshot>>,
    events: Mutex<Events>,
    sync_full: Histogram,
    sync_incremental: Histogram,
    traffic: TrafficReader,
}

/// The daemon's side: what it records. Cheap to clone (shared).
#[derive(Debug, Clone)]
pub(crate) struct Metrics {
    shared: Arc<Shared>,
    registry: Arc<Registry>,
}

impl Metrics {
    pub(crate) fn new(traffic: TrafficReader) -> Self {
        let shared = Arc::new(Shared {
            published: Mutex::new(None),
            snapshot: Mutex::new(Arc::new(Snapshot::default())),
            events: Mutex::new(Events::default()),
            sync_full: sync_buckets(),
            sync_incremental: sync_buckets(),
            traffic,
        });
        let mut registry = Registry::default();
        registry.register_collector(Box::new(encode::Collector(shared.clone())));
        Metrics { shared, registry: Arc::new(registry) }
    }

    /// What the daemon knows now: O(1) here, the snapshot is built at the
    /// next scrape.
    pub(crate) fn publish(&self, published: Published) {
        *self.shared.published.lock().unwrap_or_else(PoisonError::into_inner) = Some(published);
    }

    /// A snapshot built already (tests).
    #[cfg(test)]
    pub(crate) fn publish_snapshot(&self, snapshot: Snapshot) {
        *self.shared.published.lock().unwrap_or_else(PoisonError::into_inner) = None;
        *self.shared.snapshot.lock().unwrap_or_else(PoisonError::into_inner) = Arc::new(snapshot);
    }

    /// A gateway peer's health as the prober reports it; a change from the
    /// last state told (peers start up) counts a transition, whether or
    /// not a snapshot showed the state before.
    pub(crate) fn peer_state(&self, peer: &str, up: bool) {
        let mut events = self.events();
        let was = events.peer_up.insert(peer.to_string(), up).unwrap_or(true);
        if was != up {
            *events.peer_transitions.entry(peer.to_string()).or_default() += 1;
        }
    }

    /// The gateway a list uses now, and the moves it made since last told.
    pub(crate) fn gateway_choice(&self, via: &crate::model::Via, in_use: Option<std::net::IpAddr>, moves: u64) {
        let mut events = self.events();
        *events.failovers.entry(via.label()).or_default() += moves;
        events.gateway_in_use.insert(via.label(), in_use);
    }

    /// How many times `peer` went up or down (tests).
    #[cfg(test)]
    pub(crate) fn peer_transitions(&self, peer: &str) -> u64 {
        self.events().peer_transitions.get(peer).copied().unwrap_or(0)
    }

    /// One sync: its duration, and the owners of each failed step.
    pub(crate) fn sync_done<'a>(&self, full: bool, took: Duration, owners: impl Iterator<Item = &'a str>) {
        let h = if full { &self.shared.sync_full } else { &self.shared.sync_incremental };
        h.observe(took.as_secs_f64());
        let mut events = self.events();
        for owner in owners {
            *events.sync_errors.entry(crate::model::Object::kind_of(owner)).or_default() += 1;
        }
    }

    /// One read of the config dir: "applied" (every file), "rejected"
    /// (some file was rejected) or "failed" (the dir could not be read).
    pub(crate) fn reload(&self, outcome: &'static str) {
        *self.events().reloads.entry(outcome).or_default() += 1;
    }

    /// Serves GET /metrics on `addr` until the endpoint is dropped.
    pub(crate) fn serve(&self, addr: std::net::SocketAddr) -> Result<Endpoint, ServeError> {
        const KIND: Kind = Kind { what: "metrics", key: "metrics_listen", thread: "hm-metrics" };
        let metrics = self.clone();
        let handler = move |path: &str| match path {
            "/metrics" => Reply {
                status: hyper::StatusCode::OK,
                content_type: prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
                body: metrics.render(),
            },
            _ => Reply::text(hyper::StatusCode::NOT_FOUND, "hostmesh serves /metrics only\n".into()),
        };
        Endpoint::start(KIND, addr, std::sync::Arc::new(handler))
    }

    /// The text exposition format, as a scrape gets it.
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail; the collector's own errors are
        // fmt::Error from the same writer.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry);
        out
    }

    fn events(&self) -> std::sync::MutexGuard<'_, Events> {
        self.shared.events.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Shared {
    /// The snapshot to render: the last one, or one built now from what
    /// was published since.
    fn current(&self) -> Arc<Snapshot> {
        let mut snapshot = self.snapshot.lock().unwrap_or_else(PoisonError::into_inner);
        let next = self.published.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(s) = next.and_then(Published::build) {
            *snapshot = Arc::new(s);
        }
        snapshot.clone()
    }
}
