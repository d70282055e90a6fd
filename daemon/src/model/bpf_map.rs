//! The maps hostmesh reconciles, by name: a leaf of the model that the
//! desired/observed state and the map values both name.

use serde::Serialize;

/// The BPF maps whose contents are configuration (reconciled). Runtime
/// maps (counters, conntrack) are not listed: the probes own those.
///
/// The order is the order entries are written in: what an entry refers to
/// (a backend, a Maglev chunk) exists before the entry that refers to it
/// (the service); deletions go the other way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum BpfMap {
    Config,
    Backends,
    Maglev,
    SvcAffinity,
    Services,
    Mesh,
    GwConfig,
    PeerEndpoints,
    Members,
    Peers,
}

impl BpfMap {
    pub const ALL: [BpfMap; 10] = [
        BpfMap::Config,
        BpfMap::Backends,
        BpfMap::Maglev,
        BpfMap::SvcAffinity,
        BpfMap::Services,
        BpfMap::Mesh,
        BpfMap::GwConfig,
        BpfMap::PeerEndpoints,
        BpfMap::Members,
        BpfMap::Peers,
    ];

    /// The map's name in the probe objects, which is also its pin name.
    pub fn name(self) -> &'static str {
        match self {
            BpfMap::Config => "HM_CONFIG",
            BpfMap::Backends => "HM_BACKENDS",
            BpfMap::Maglev => "HM_MAGLEV",
            BpfMap::SvcAffinity => "HM_SVC_AFFINITY",
            BpfMap::Services => "HM_SERVICES",
            BpfMap::Mesh => "HM_MESH",
            BpfMap::GwConfig => "HM_GW_CONFIG",
            BpfMap::PeerEndpoints => "HM_PEER_ENDPOINTS",
            BpfMap::Members => "HM_MEMBERS",
            BpfMap::Peers => "HM_PEERS",
        }
    }
}
