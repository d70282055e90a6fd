//! The one table of maps: every map the probe objects declare, by a typed
//! name, with its kind, key and value sizes, flags, the capacity the
//! probes declare and the `[daemon]` capacity that sizes it. The loader,
//! the pins, the reconciler, the conntrack sweeper, explain and the
//! metrics all name maps through `HmMap`; `layout_tests` checks every row
//! against the BTF of the compiled objects (a map a probe declares and the
//! table lacks, or a row no probe declares, fails `cargo test`).

use std::mem::size_of;

use aya_obj::generated::bpf_map_type::*;
use aya_obj::generated::BPF_F_NO_PREALLOC;

use super::*;

/// A family of maps one `[daemon]` size key sizes (`config/capacity.rs`
/// has the keys, their defaults and ranges).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Capacity {
    /// HM_SERVICES and HM_SVC_AFFINITY (VIP:port/protocol entries).
    Services,
    /// HM_BACKENDS and HM_SNAT (distinct backend addresses) and
    /// HM_BACKEND_STATS ((service, backend) pairs that carried traffic).
    Backends,
    /// HM_MAGLEV (chunks of `MAGLEV_CHUNK` slots of Maglev tables).
    MaglevChunks,
    /// HM_CT and HM_CT_CLOSING (veth-path flows, two entries each), HM_NAT
    /// (flows from the network, two entries each).
    Conntrack,
    /// HM_REVERSE_SOCK (connect-time LB's UDP sockets, for their replies).
    ReverseSock,
    /// HM_AFFINITY (clients of services with affinity, one entry per
    /// client and service).
    Affinity,
    /// HM_MESH and HM_MESH_SOCKETS (mesh entries, sidecar listeners).
    Mesh,
}

/// Every map of the probes, named as in the objects (which is also the
/// name of its pin). The order is the table's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HmMap {
    Config,
    Services,
    BackendStats,
    Backends,
    Maglev,
    Ct,
    CtClosing,
    Nat,
    Snat,
    HostAddrs,
    SvcAffinity,
    Affinity,
    ReverseSock,
    Mesh,
    MeshSockets,
    GwConfig,
    Peers,
    Members,
    PeerEndpoints,
    GwCt,
    GwProbes,
    /// probes/netns_cookie.c's own map: loaded alone, never pinned.
    NetnsCookie,
    /// service_nat.c's scratch, one entry per CPU: the new flow whose
    /// source port `snat_port_take` tries. Each load has its own; the
    /// daemon never reads it.
    SnatProbe,
}

/// Maps earlier builds pinned that this one no longer has: their pins are
/// removed when the probes are loaded, and by teardown. Programs of an
/// earlier build still attached keep their map until this build's replace
/// them.
/// - HM_SVC_STATS: per-service packet counters, written on every packet
///   and connect, that nothing read (the metrics sum HM_BACKEND_STATS).
pub const RETIRED_MAPS: [&str; 1] = ["HM_SVC_STATS"];

/// One row of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapDef {
    pub map: HmMap,
    pub name: &'static str,
    /// `bpf_map_type`.
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    /// As the probes declare it; the configured capacity replaces it for
    /// maps `sized_by` a `[daemon]` key.
    pub max_entries: u32,
    pub flags: u32,
    pub sized_by: Option<Capacity>,
    /// Shared by every object through its pin under the pin dir.
    pub pinned: bool,
    /// Value sizes of earlier builds whose bytes begin this layout: a pin
    /// of one is migrated (each value followed by zeros, which the probes
    /// read as "not known") instead of replaced by an empty map.
    pub grown_from: &'static [u32],
}

#[allow(clippy::too_many_arguments)]
const fn row(
    map: HmMap,
    name: &'static str,
    map_type: aya_obj::generated::bpf_map_type,
    key: usize,
    value: usize,
    max_entries: u32,
    flags: u32,
    sized_by: Option<Capacity>,
) -> MapDef {
    MapDef {
        map,
        name,
        map_type: map_type as u32,
        key_size: key as u32,
        value_size: value as u32,
        max_entries,
        flags,
        sized_by,
        pinned: true,
        grown_from: &[],
    }
}

impl MapDef {
    const fn grown_from(mut self, sizes: &'static [u32]) -> MapDef {
        self.grown_from = sizes;
        self
    }
}

const NO_PREALLOC: u32 = BPF_F_NO_PREALLOC;
use Capacity as C;
use HmMap as M;

/// Every map, in `HmMap`'s order.
pub const MAPS: [MapDef; HmMap::COUNT] = [
    row(M::Config, "HM_CONFIG", BPF_MAP_TYPE_ARRAY, 4, size_of::<HmConfig>(), 1, 0, None),
    row(
        M::Services,
        "HM_SERVICES",
        BPF_MAP_TYPE_HASH,
        size_of::<SvcKey>(),
        size_of::<SvcValue>(),
        MAX_SERVICES,
        NO_PREALLOC,
        Some(C::Services),
    ),
    row(
        M::BackendStats,
        "HM_BACKEND_STATS",
        BPF_MAP_TYPE_PERCPU_HASH,
        size_of::<BackendStatsKey>(),
        size_of::<BackendStats>(),
        MAX_BACKENDS,
        NO_PREALLOC,
        Some(C::Backends),
    ),
    row(
        M::Backends,
        "HM_BACKENDS",
        BPF_MAP_TYPE_HASH,
        4,
        size_of::<BackendValue>(),
        MAX_BACKENDS,
        NO_PREALLOC,
        Some(C::Backends),
    ),
    row(
        M::Maglev,
        "HM_MAGLEV",
        BPF_MAP_TYPE_HASH,
        size_of::<MaglevKey>(),
        size_of::<MaglevChunk>(),
        MAX_MAGLEV_CHUNKS,
        NO_PREALLOC,
        Some(C::MaglevChunks),
    ),
    // 32 bytes before the next hop was kept in each flow's forward entry.
    row(
        M::Ct,
        "HM_CT",
        BPF_MAP_TYPE_LRU_HASH,
        size_of::<CtKey>(),
        size_of::<CtValue>(),
        CONNTRACK_SIZE,
        0,
        Some(C::Conntrack),
    )
    .grown_from(&[32]),
    row(
        M::CtClosing,
        "HM_CT_CLOSING",
        BPF_MAP_TYPE_LRU_HASH,
        size_of::<CtKey>(),
        size_of::<CtValue>(),
        CONNTRACK_SIZE,
        0,
        Some(C::Conntrack),
    )
    .grown_from(&[32]),
    // 56 bytes before the next hop was kept in each flow's entry.
    row(
        M::Nat,
        "HM_NAT",
        BPF_MAP_TYPE_LRU_HASH,
        size_of::<CtKey>(),
        size_of::<NatValue>(),
        CONNTRACK_SIZE,
        0,
        Some(C::Conntrack),
    )
    .grown_from(&[56]),
    row(
        M::Snat,
        "HM_SNAT",
        BPF_MAP_TYPE_HASH,
        size_of::<Addr>(),
        size_of::<SnatValue>(),
        MAX_BACKENDS,
        NO_PREALLOC,
        Some(C::Backends),
    ),
    row(M::HostAddrs, "HM_HOST_ADDRS", BPF_MAP_TYPE_HASH, size_of::<Addr>(), 4, MAX_HOST_ADDRS, NO_PREALLOC, None),
    row(
        M::SvcAffinity,
        "HM_SVC_AFFINITY",
        BPF_MAP_TYPE_HASH,
        4,
        size_of::<SvcAffinity>(),
        MAX_SERVICES,
        NO_PREALLOC,
        Some(C::Services),
    ),
    row(
        M::Affinity,
        "HM_AFFINITY",
        BPF_MAP_TYPE_LRU_HASH,
        size_of::<AffKey>(),
        size_of::<AffValue>(),
        MAX_AFFINITY,
        0,
        Some(C::Affinity),
    ),
    row(
        M::ReverseSock,
        "HM_REVERSE_SOCK",
        BPF_MAP_TYPE_LRU_HASH,
        size_of::<RevSkKey>(),
        size_of::<RevSkValue>(),
        MAX_REVERSE_SOCK,
        0,
        Some(C::ReverseSock),
    ),
    row(
        M::Mesh,
        "HM_MESH",
        BPF_MAP_TYPE_HASH,
        size_of::<MeshKey>(),
        size_of::<MeshValue>(),
        MESH_MAP_SIZE,
        NO_PREALLOC,
        Some(C::Mesh),
    ),
    row(
        M::MeshSockets,
        "HM_MESH_SOCKETS",
        BPF_MAP_TYPE_SOCKHASH,
        size_of::<SockKey>(),
        8,
        MESH_MAP_SIZE,
        0,
        Some(C::Mesh),
    ),
    row(M::GwConfig, "HM_GW_CONFIG", BPF_MAP_TYPE_ARRAY, 4, size_of::<GwConfig>(), 1, 0, None),
    row(
        M::Peers,
        "HM_PEERS",
        BPF_MAP_TYPE_LPM_TRIE,
        size_of::<LpmKey>(),
        size_of::<Endpoint>(),
        MAX_GW_ROUTES,
        NO_PREALLOC,
        None,
    ),
    row(
        M::Members,
        "HM_MEMBERS",
        BPF_MAP_TYPE_LPM_TRIE,
        size_of::<LpmKey>(),
        size_of::<Endpoint>(),
        MAX_GW_ROUTES,
        NO_PREALLOC,
        None,
    ),
    row(
        M::PeerEndpoints,
        "HM_PEER_ENDPOINTS",
        BPF_MAP_TYPE_HASH,
        size_of::<Endpoint>(),
        4,
        MAX_GW_ROUTES,
        NO_PREALLOC,
        None,
    ),
    row(
        M::GwCt,
        "HM_GW_CT",
        BPF_MAP_TYPE_LRU_HASH,
        size_of::<CtKey>(),
        size_of::<GwCtValue>(),
        MAX_GW_CONNTRACK,
        0,
        None,
    ),
    row(M::GwProbes, "HM_GW_PROBES", BPF_MAP_TYPE_ARRAY, 4, size_of::<GwProbe>(), MAX_GW_PROBES, 0, None),
    MapDef { pinned: false, ..row(M::NetnsCookie, "HM_NETNS_COOKIE", BPF_MAP_TYPE_LRU_HASH, 8, 8, 64, 0, None) },
    // struct snat_probe: a backend's HM_NAT entry, two addresses, a port,
    // the protocol and the family, padded to the entry's 8-byte alignment.
    MapDef {
        pinned: false,
        ..row(M::SnatProbe, "HM_SNAT_PROBE", BPF_MAP_TYPE_PERCPU_ARRAY, 4, size_of::<NatValue>() + 40, 1, 0, None)
    },
];

// The table is in `HmMap`'s order: `HmMap::def` indexes it.
const _: () = {
    let mut i = 0;
    while i < MAPS.len() {
        assert!(MAPS[i].map as usize == i, "MAPS is in HmMap's order");
        i += 1;
    }
};

impl HmMap {
    pub const COUNT: usize = 23;

    /// Every map, in the table's order.
    pub const ALL: [HmMap; HmMap::COUNT] = {
        let mut all = [HmMap::Config; HmMap::COUNT];
        let mut i = 0;
        while i < HmMap::COUNT {
            all[i] = MAPS[i].map;
            i += 1;
        }
        all
    };

    /// Its row of the table.
    pub const fn def(self) -> &'static MapDef {
        &MAPS[self as usize]
    }

    /// Its name in the objects, which is also its pin's name.
    pub const fn name(self) -> &'static str {
        self.def().name
    }

    /// The maps every object shares through their pins.
    pub fn pinned() -> impl Iterator<Item = HmMap> {
        HmMap::ALL.into_iter().filter(|m| m.def().pinned)
    }
}

impl std::fmt::Display for HmMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
