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
    Snat,
    HostAddrs,
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
    pub const ALL: [BpfMap; 12] = [
        BpfMap::Config,
        BpfMap::Backends,
        BpfMap::Snat,
        BpfMap::HostAddrs,
        BpfMap::Maglev,
        BpfMap::SvcAffinity,
        BpfMap::Services,
        BpfMap::Mesh,
        BpfMap::GwConfig,
        BpfMap::PeerEndpoints,
        BpfMap::Members,
        BpfMap::Peers,
    ];

    /// The map in the table of maps (`abi::MAPS`).
    pub fn map(self) -> crate::abi::HmMap {
        use crate::abi::HmMap;
        match self {
            BpfMap::Config => HmMap::Config,
            BpfMap::Backends => HmMap::Backends,
            BpfMap::Snat => HmMap::Snat,
            BpfMap::HostAddrs => HmMap::HostAddrs,
            BpfMap::Maglev => HmMap::Maglev,
            BpfMap::SvcAffinity => HmMap::SvcAffinity,
            BpfMap::Services => HmMap::Services,
            BpfMap::Mesh => HmMap::Mesh,
            BpfMap::GwConfig => HmMap::GwConfig,
            BpfMap::PeerEndpoints => HmMap::PeerEndpoints,
            BpfMap::Members => HmMap::Members,
            BpfMap::Peers => HmMap::Peers,
        }
    }

    /// The reconciled map that `map` is, if the configuration fills it.
    pub fn of(map: crate::abi::HmMap) -> Option<BpfMap> {
        BpfMap::ALL.into_iter().find(|b| b.map() == map)
    }

    /// The map's name in the probe objects, which is also its pin name.
    /// Whether its keys are ids, u32 words (`MapEntryKey`'s order).
    pub fn keyed_by_ids(self) -> bool {
        matches!(self, BpfMap::Backends | BpfMap::Maglev | BpfMap::SvcAffinity)
    }

    pub fn name(self) -> &'static str {
        self.map().name()
    }
}
