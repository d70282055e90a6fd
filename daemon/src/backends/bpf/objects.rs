//! The probes this binary carries (compiled by build.rs) and the layout of
//! every map they declare. The table is checked against the compiled
//! object by a kernel test, and against pinned maps before adopting them.

use crate::abi::MAX_SERVICES;
use crate::model::{BpfMap, Program};

/// probes/service_nat.c
pub static SERVICE_NAT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/service_nat.o"));

pub const BPF_MAP_TYPE_HASH: u32 = 1;
pub const BPF_MAP_TYPE_PERCPU_ARRAY: u32 = 6;
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

/// Every map in SERVICE_NAT, as the probes define it.
pub const MAPS: &[MapDef] = &[
    MapDef {
        name: "HM_SERVICES",
        map_type: BPF_MAP_TYPE_HASH,
        key_size: 20,
        value_size: 16,
        max_entries: MAX_SERVICES,
        flags: BPF_F_NO_PREALLOC,
    },
    MapDef {
        name: "HM_SVC_STATS",
        map_type: BPF_MAP_TYPE_PERCPU_ARRAY,
        key_size: 4,
        value_size: 16,
        max_entries: MAX_SERVICES,
        flags: 0,
    },
];

pub fn map_def(name: &str) -> &'static MapDef {
    MAPS.iter().find(|m| m.name == name).expect("every reconciled map is in MAPS")
}

pub fn def_of(map: BpfMap) -> &'static MapDef {
    map_def(map.name())
}

/// The object holding each program.
pub fn object_of(program: Program) -> &'static [u8] {
    match program {
        Program::NatOut => SERVICE_NAT,
    }
}
