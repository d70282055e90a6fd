//! The probes this binary carries (compiled by build.rs) and the layout of
//! every map they declare. The table is checked against the compiled
//! objects' BTF by abi's layout test, and against pinned maps before
//! adopting them.

use crate::abi;
use crate::backends::MapSizes;
use crate::config::Capacity;
use crate::model::{BpfMap, Feature, KernelFeatures, Program};

/// probes/service_nat.c: the bpfnat veth path.
pub static SERVICE_NAT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/service_nat.o"));
/// probes/service_ctlb.c: connect-time load balancing.
pub static SERVICE_CTLB: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/service_ctlb.o"));
/// The same without bpf_set_retval(), for kernels that lack it.
pub static SERVICE_CTLB_EPERM: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/service_ctlb_eperm.o"));

/// Every object this kernel gets, with a name for errors, in the order
/// `object_of` numbers them. All share one set of pinned maps.
pub fn objects(features: &KernelFeatures) -> [(&'static str, &'static [u8]); 4] {
    let ctlb = if features.has(Feature::SetRetval) {
        ("probes/service_ctlb.c", SERVICE_CTLB)
    } else {
        ("probes/service_ctlb.c (without bpf_set_retval)", SERVICE_CTLB_EPERM)
    };
    [("probes/service_nat.c", SERVICE_NAT), ctlb, ("probes/mesh.c", MESH), ("probes/gateway.c", GATEWAY)]
}
/// probes/gateway.c: gateway peers over hm-tun0.
pub static GATEWAY: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/gateway.o"));
pub const GATEWAY_OBJECT: usize = 3;
/// probes/mesh.c: sk_lookup mesh redirects.
pub static MESH: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/mesh.o"));
pub const MESH_OBJECT: usize = 2;

pub const BPF_MAP_TYPE_HASH: u32 = 1;
pub const BPF_MAP_TYPE_ARRAY: u32 = 2;
pub const BPF_MAP_TYPE_PERCPU_HASH: u32 = 5;
pub const BPF_MAP_TYPE_PERCPU_ARRAY: u32 = 6;
pub const BPF_MAP_TYPE_LRU_HASH: u32 = 9;
pub const BPF_MAP_TYPE_LPM_TRIE: u32 = 11;
pub const BPF_MAP_TYPE_SOCKHASH: u32 = 18;
pub const BPF_F_NO_PREALLOC: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapDef {
    pub name: &'static str,
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub flags: u32,
}

const fn def(
    name: &'static str,
    map_type: u32,
    key_size: usize,
    value_size: usize,
    max_entries: u32,
    flags: u32,
) -> MapDef {
    MapDef { name, map_type, key_size: key_size as u32, value_size: value_size as u32, max_entries, flags }
}

use std::mem::size_of;

/// Every map in the objects, as the probes define them.
pub const MAPS: &[MapDef] = &[
    def("HM_CONFIG", BPF_MAP_TYPE_ARRAY, 4, size_of::<abi::HmConfig>(), 1, 0),
    def(
        "HM_SERVICES",
        BPF_MAP_TYPE_HASH,
        size_of::<abi::SvcKey>(),
        size_of::<abi::SvcValue>(),
        abi::MAX_SERVICES,
        BPF_F_NO_PREALLOC,
    ),
    def("HM_SVC_STATS", BPF_MAP_TYPE_PERCPU_ARRAY, 4, size_of::<abi::SvcStats>(), abi::MAX_SERVICES, 0),
    def(
        "HM_BACKEND_STATS",
        BPF_MAP_TYPE_PERCPU_HASH,
        size_of::<abi::BackendStatsKey>(),
        size_of::<abi::BackendStats>(),
        abi::MAX_BACKENDS,
        BPF_F_NO_PREALLOC,
    ),
    def("HM_BACKENDS", BPF_MAP_TYPE_HASH, 4, size_of::<abi::BackendValue>(), abi::MAX_BACKENDS, BPF_F_NO_PREALLOC),
    def(
        "HM_MAGLEV",
        BPF_MAP_TYPE_HASH,
        size_of::<abi::MaglevKey>(),
        size_of::<abi::MaglevChunk>(),
        abi::MAX_MAGLEV_CHUNKS,
        BPF_F_NO_PREALLOC,
    ),
    def("HM_CT", BPF_MAP_TYPE_LRU_HASH, size_of::<abi::CtKey>(), size_of::<abi::CtValue>(), abi::CONNTRACK_SIZE, 0),
    def(
        "HM_CT_CLOSING",
        BPF_MAP_TYPE_LRU_HASH,
        size_of::<abi::CtKey>(),
        size_of::<abi::CtValue>(),
        abi::CONNTRACK_SIZE,
        0,
    ),
    def("HM_SVC_AFFINITY", BPF_MAP_TYPE_HASH, 4, size_of::<abi::SvcAffinity>(), abi::MAX_SERVICES, BPF_F_NO_PREALLOC),
    def(
        "HM_AFFINITY",
        BPF_MAP_TYPE_LRU_HASH,
        size_of::<abi::AffKey>(),
        size_of::<abi::AffValue>(),
        abi::MAX_AFFINITY,
        0,
    ),
    def(
        "HM_REVERSE_SOCK",
        BPF_MAP_TYPE_LRU_HASH,
        size_of::<abi::RevSkKey>(),
        size_of::<abi::RevSkValue>(),
        abi::MAX_REVERSE_SOCK,
        0,
    ),
    def(
        "HM_MESH",
        BPF_MAP_TYPE_HASH,
        size_of::<abi::MeshKey>(),
        size_of::<abi::MeshValue>(),
        abi::MESH_MAP_SIZE,
        BPF_F_NO_PREALLOC,
    ),
    def("HM_MESH_SOCKETS", BPF_MAP_TYPE_SOCKHASH, size_of::<abi::SockKey>(), 8, abi::MESH_MAP_SIZE, 0),
    def("HM_GW_CONFIG", BPF_MAP_TYPE_ARRAY, 4, size_of::<abi::GwConfig>(), 1, 0),
    def(
        "HM_PEERS",
        BPF_MAP_TYPE_LPM_TRIE,
        size_of::<abi::LpmKey>(),
        size_of::<abi::Endpoint>(),
        abi::MAX_GW_ROUTES,
        BPF_F_NO_PREALLOC,
    ),
    def(
        "HM_MEMBERS",
        BPF_MAP_TYPE_LPM_TRIE,
        size_of::<abi::LpmKey>(),
        size_of::<abi::Endpoint>(),
        abi::MAX_GW_ROUTES,
        BPF_F_NO_PREALLOC,
    ),
    def("HM_PEER_ENDPOINTS", BPF_MAP_TYPE_HASH, size_of::<abi::Endpoint>(), 4, abi::MAX_GW_ROUTES, BPF_F_NO_PREALLOC),
    def(
        "HM_GW_CT",
        BPF_MAP_TYPE_LRU_HASH,
        size_of::<abi::CtKey>(),
        size_of::<abi::GwCtValue>(),
        abi::MAX_GW_CONNTRACK,
        0,
    ),
];

/// The capacity key that sizes a map, if the configuration sizes it.
pub fn sized_by(name: &str) -> Option<Capacity> {
    Some(match name {
        "HM_SERVICES" | "HM_SVC_STATS" | "HM_SVC_AFFINITY" => Capacity::Services,
        "HM_AFFINITY" => Capacity::Affinity,
        "HM_BACKENDS" | "HM_BACKEND_STATS" => Capacity::Backends,
        "HM_MAGLEV" => Capacity::MaglevChunks,
        "HM_CT" | "HM_CT_CLOSING" => Capacity::Conntrack,
        "HM_REVERSE_SOCK" => Capacity::ReverseSock,
        "HM_MESH" | "HM_MESH_SOCKETS" => Capacity::Mesh,
        _ => return None,
    })
}

/// A map's definition with the configured capacities applied.
pub fn map_def(name: &str, sizes: &MapSizes) -> MapDef {
    let mut d = *MAPS.iter().find(|m| m.name == name).expect("every map hostmesh touches is in MAPS");
    if let Some(c) = sized_by(name) {
        d.max_entries = sizes.get(c);
    }
    d
}

pub fn def_of(map: BpfMap, sizes: &MapSizes) -> MapDef {
    map_def(map.name(), sizes)
}

/// The object holding each program.
pub fn object_of(program: Program) -> usize {
    match program {
        Program::NatOut | Program::Reply | Program::Direct => 0,
        Program::Mesh => MESH_OBJECT,
        Program::TunIn | Program::TunOut => GATEWAY_OBJECT,
        _ => 1,
    }
}

/// The mark of every object this binary carries (in the order
/// SERVICE_NAT, SERVICE_CTLB, SERVICE_CTLB_EPERM, MESH, GATEWAY), each
/// parsed and hashed once.
fn carried_marks() -> &'static [u64; 5] {
    static MARKS: std::sync::OnceLock<[u64; 5]> = std::sync::OnceLock::new();
    MARKS.get_or_init(|| [SERVICE_NAT, SERVICE_CTLB, SERVICE_CTLB_EPERM, MESH, GATEWAY].map(build_mark))
}

/// The marks this build's programs carry (probes/build_mark.h), for each
/// object `program` can come from: the two connect-time variants for
/// its programs, else the one.
pub fn build_marks(program: Program) -> Vec<u64> {
    let m = carried_marks();
    match object_of(program) {
        0 => vec![m[0]],
        MESH_OBJECT => vec![m[3]],
        GATEWAY_OBJECT => vec![m[4]],
        _ => vec![m[1], m[2]],
    }
}

/// The value of `hm_build_mark` the loader gives every program of
/// `object`: FNV-1a (64 bits) over its functions' names and instructions
/// as compiled, before relocation. A rebuild that changes no code (a
/// comment, the BTF) keeps the mark; a change of code changes it. An
/// object aya cannot parse (it would not load either) is hashed whole.
pub fn build_mark(object: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let fnv = |h: u64, bytes: &[u8]| bytes.iter().fold(h, |h, b| (h ^ u64::from(*b)).wrapping_mul(PRIME));
    let Ok(obj) = aya_obj::Object::parse(object) else { return fnv(OFFSET, object) };
    let mut h = OFFSET;
    for f in obj.functions.values() {
        h = fnv(h, f.name.as_bytes());
        for i in &f.instructions {
            h = fnv(h, &[i.code, i.dst_reg() | (i.src_reg() << 4)]);
            h = fnv(h, &i.off.to_le_bytes());
            h = fnv(h, &i.imm.to_le_bytes());
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `object` with one byte of section `section` (at `at`) changed.
    fn patched(object: &[u8], section: &str, at: usize) -> Vec<u8> {
        use object::{Object, ObjectSection};
        let file = object::File::parse(object).unwrap();
        let (start, _) = file.section_by_name(section).unwrap().file_range().unwrap();
        let mut bytes = object.to_vec();
        bytes[start as usize + at] ^= 0x01;
        bytes
    }

    #[test]
    fn each_object_has_its_own_stable_mark_from_its_code() {
        let marks: Vec<u64> = [SERVICE_NAT, SERVICE_CTLB, SERVICE_CTLB_EPERM, MESH, GATEWAY].map(build_mark).to_vec();
        let mut distinct = marks.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), 5, "{marks:x?}");
        assert_eq!(build_mark(GATEWAY), marks[4], "the same object, the same mark");
        assert_eq!(build_marks(Program::Connect4), [marks[1], marks[2]], "both connect-time variants");
        // One instruction's immediate changed (code): another mark. The
        // license string changed (not code): the same mark.
        assert_ne!(build_mark(&patched(GATEWAY, "classifier", 4)), marks[4]);
        assert_eq!(build_mark(&patched(GATEWAY, "license", 0)), marks[4]);
        // Not an object at all: hashed whole, still a mark.
        assert_ne!(build_mark(b"not an object"), build_mark(b"not an object!"));
    }
}
