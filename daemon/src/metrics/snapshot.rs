//! What a scrape shows of the daemon's state, built from the status it
//! has just written and the configuration in force. Pure: the daemon
//! hands both to `Metrics::publish` after each status write, and the
//! first scrape after that builds the snapshot.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Weak};

use crate::abi::SvcKey;
use crate::config::Config;
use crate::state::{BackendState, FileState, ObjectKind, ObjectState, Status};

/// What the daemon publishes: its last status, the configuration in
/// force and the maps' rows.
#[derive(Debug, Clone)]
pub(crate) struct Published {
    /// Not held: once the daemon loads another configuration this one is
    /// freed at once (not kept through the sync that follows, the peak of
    /// the daemon's memory), and a scrape until the next publication shows
    /// the snapshot before.
    pub config: Weak<Config>,
    pub status: Status,
    pub maps: Vec<MapRow>,
}

impl Published {
    /// Keeps of `status` only what `Snapshot::build` reads: of its objects
    /// the meshes and peers (a few), not every service's.
    pub(crate) fn new(config: &Arc<Config>, mut status: Status, maps: Vec<MapRow>) -> Published {
        status.objects.retain(|o| matches!(o.kind, ObjectKind::Mesh | ObjectKind::Peer));
        status.objects.shrink_to_fit();
        status.warnings = Vec::new();
        status.skipped = Vec::new();
        Published { config: Arc::downgrade(config), status, maps }
    }

    /// The snapshot, if the configuration is still the daemon's.
    pub(crate) fn build(self) -> Option<Snapshot> {
        let config = self.config.upgrade()?;
        Some(Snapshot::build(&config, &self.status, self.maps))
    }
}

/// One backend of one service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BackendRow {
    pub service: String,
    pub backend: SocketAddr,
    /// Unchecked backends with a weight are up: they take connections.
    pub state: BackendState,
}

/// A map's entries (where the daemon knows them without reading the map)
/// and its capacity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MapRow {
    pub map: &'static str,
    pub entries: Option<u64>,
    pub capacity: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Snapshot {
    /// `uname -r` and the TC attach mode, once the kernel is probed.
    pub kernel: Option<(String, String)>,
    /// Services by the path that handles them ("connect_time", "veth").
    pub services: BTreeMap<&'static str, u64>,
    pub backends: Vec<BackendRow>,
    /// Config files by state ("applied", "rejected").
    pub files: BTreeMap<&'static str, u64>,
    pub maps: Vec<MapRow>,
    /// Flows in the veth path's conntrack (open and closing).
    pub conntrack_veth: u64,
    /// Entries of flows from the network (HM_NAT), and the source ports
    /// of snat_port_range they hold.
    pub conntrack_external: u64,
    pub snat_ports: u64,
    /// Mesh entries: whether a sidecar listener is registered.
    pub meshes: BTreeMap<String, bool>,
    /// Gateway peers: whether they answer.
    pub peers: BTreeMap<String, bool>,
    /// The service of each VIP:port/protocol, to name the probes' counters.
    pub names: HashMap<SvcKey, String>,
    /// Above this many backends in all, per-backend series are summed per
    /// service (`[daemon] metrics_backend_limit`).
    pub backend_limit: usize,
}

impl Snapshot {
    pub(crate) fn build(config: &Config, status: &Status, maps: Vec<MapRow>) -> Snapshot {
        let mode = config.daemon.connect_time_lb;
        let mut services = BTreeMap::from([("connect_time", 0), ("veth", 0)]);
        let mut names = HashMap::with_capacity(config.services.len());
        let mut backends = Vec::new();
        let checked: HashMap<(&str, SocketAddr), BackendState> =
            status.backends.iter().map(|b| ((b.service.as_str(), b.address), b.state)).collect();
        for s in &config.services {
            *services.entry(if mode.handles(s.protocol) { "connect_time" } else { "veth" }).or_default() += 1;
            names.insert(SvcKey::new(s.vip, s.port, s.protocol.number()), s.name.clone());
            for b in &s.backends {
                let state = checked.get(&(s.name.as_str(), b.addr)).copied().unwrap_or(BackendState::Up);
                backends.push(BackendRow { service: s.name.clone(), backend: b.addr, state });
            }
        }
        let mut files = BTreeMap::from([("applied", 0), ("rejected", 0)]);
        for f in &status.files {
            *files.entry(if f.state == FileState::Applied { "applied" } else { "rejected" }).or_default() += 1;
        }
        let objects = |kind: ObjectKind| status.objects.iter().filter(move |o| o.kind == kind);
        Snapshot {
            kernel: status.kernel.as_ref().map(|k| (k.release.clone(), k.tc_attach.to_string())),
            services,
            backends,
            files,
            maps,
            conntrack_veth: (status.counts.conntrack_open + status.counts.conntrack_closed) as u64,
            conntrack_external: status.counts.conntrack_external as u64,
            snat_ports: status.counts.snat_ports as u64,
            meshes: objects(ObjectKind::Mesh).map(|o| (o.name.clone(), o.state == ObjectState::Applied)).collect(),
            peers: objects(ObjectKind::Peer).map(|o| (o.name.clone(), o.state == ObjectState::Up)).collect(),
            names,
            backend_limit: config.daemon.metrics_backend_limit as usize,
        }
    }

    /// Whether per-backend series are summed per service.
    pub(crate) fn collapsed(&self) -> bool {
        self.backends.len() > self.backend_limit
    }
}
