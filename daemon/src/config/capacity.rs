//! Map capacities: which `[daemon]` key sizes what, its default and its
//! range. This is the one table of them: validation, the capacity checks
//! of the merge and the compile, the BPF backend (which sizes the maps
//! when it creates them, and migrates pinned ones of another size) and the
//! README follow it.

use serde::Serialize;

/// What one capacity key sizes: a family of maps (the table of maps,
/// `abi::MAPS`, says which).
pub use crate::abi::Capacity;

/// One capacity key: its name in `[daemon]`, default and accepted range.
pub struct SizeKey {
    pub capacity: Capacity,
    pub key: &'static str,
    pub default: u32,
    pub min: u32,
    pub max: u32,
}

/// Every capacity key. The defaults are the sizes the probes declare
/// (`HM_MAX_*` in probes/hostmesh_abi.h); the maximum of the service and
/// backend maps is past the 1,000,000 services large fleets plan for.
pub const SIZE_KEYS: [SizeKey; 7] = [
    SizeKey { capacity: Capacity::Services, key: "service_map_size", default: 65_536, min: 1024, max: 1 << 24 },
    SizeKey { capacity: Capacity::Backends, key: "backend_map_size", default: 65_536, min: 1024, max: 1 << 24 },
    SizeKey { capacity: Capacity::MaglevChunks, key: "maglev_map_size", default: 1 << 20, min: 1024, max: 1 << 26 },
    SizeKey { capacity: Capacity::Conntrack, key: "conntrack_size", default: 131_072, min: 4096, max: 1 << 24 },
    SizeKey {
        capacity: Capacity::ReverseSock,
        key: "reverse_sock_map_size",
        default: 131_072,
        min: 4096,
        max: 1 << 24,
    },
    SizeKey { capacity: Capacity::Affinity, key: "affinity_map_size", default: 131_072, min: 4096, max: 1 << 24 },
    SizeKey { capacity: Capacity::Mesh, key: "mesh_map_size", default: 16_384, min: 4096, max: 1 << 20 },
];

impl Capacity {
    pub fn key(self) -> &'static SizeKey {
        SIZE_KEYS.iter().find(|k| k.capacity == self).expect("every capacity has a key")
    }
}

/// The capacity of every configurable map, in entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MapSizes {
    pub services: u32,
    pub backends: u32,
    pub maglev_chunks: u32,
    pub conntrack: u32,
    pub reverse_sock: u32,
    pub affinity: u32,
    pub mesh: u32,
}

impl MapSizes {
    pub fn get(&self, c: Capacity) -> u32 {
        match c {
            Capacity::Services => self.services,
            Capacity::Backends => self.backends,
            Capacity::MaglevChunks => self.maglev_chunks,
            Capacity::Conntrack => self.conntrack,
            Capacity::ReverseSock => self.reverse_sock,
            Capacity::Affinity => self.affinity,
            Capacity::Mesh => self.mesh,
        }
    }

    pub fn set(&mut self, c: Capacity, n: u32) {
        let slot = match c {
            Capacity::Services => &mut self.services,
            Capacity::Backends => &mut self.backends,
            Capacity::MaglevChunks => &mut self.maglev_chunks,
            Capacity::Conntrack => &mut self.conntrack,
            Capacity::ReverseSock => &mut self.reverse_sock,
            Capacity::Affinity => &mut self.affinity,
            Capacity::Mesh => &mut self.mesh,
        };
        *slot = n;
    }
}

impl Default for MapSizes {
    fn default() -> Self {
        let mut s = MapSizes {
            services: 0,
            backends: 0,
            maglev_chunks: 0,
            conntrack: 0,
            reverse_sock: 0,
            affinity: 0,
            mesh: 0,
        };
        for k in &SIZE_KEYS {
            s.set(k.capacity, k.default);
        }
        s
    }
}

/// The capacities whose maps the kernel allocates whole when they are
/// created (LRU hashes: the conntrack maps, connect-time LB's reverse map,
/// client affinity), 121 MiB at the default sizes. A configuration that
/// does not use one has its maps created at the key's minimum, and grown
/// to the key's size when it comes to use them (`MapSizes::to_create`).
const ALLOCATED_WHOLE: [Capacity; 3] = [Capacity::Conntrack, Capacity::ReverseSock, Capacity::Affinity];

/// A set of capacities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capacities(u8);

impl Capacities {
    pub fn with(self, c: Capacity) -> Self {
        Capacities(self.0 | 1 << c as u8)
    }

    pub fn contains(self, c: Capacity) -> bool {
        self.0 & 1 << c as u8 != 0
    }
}

impl MapSizes {
    /// The sizes to create the maps at, `self` being the configured ones:
    /// a capacity the configuration leaves `unused` among those allocated
    /// whole gets its key's minimum, unless its maps already have the
    /// configured size (`current`, `None` when they do not exist). So a
    /// map grows when the configuration comes to use it, and is never
    /// shrunk (nor its programs replaced) for going unused.
    pub fn to_create(&self, unused: Capacities, current: impl Fn(Capacity) -> Option<u32>) -> MapSizes {
        let mut out = *self;
        for c in ALLOCATED_WHOLE {
            if unused.contains(c) && current(c) != Some(self.get(c)) {
                out.set(c, c.key().min);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_sizes_the_probes_declare() {
        let d = MapSizes::default();
        assert_eq!(d.services, crate::abi::MAX_SERVICES);
        assert_eq!(d.backends, crate::abi::MAX_BACKENDS);
        assert_eq!(d.maglev_chunks, crate::abi::MAX_MAGLEV_CHUNKS);
        assert_eq!(d.conntrack, crate::abi::CONNTRACK_SIZE);
        assert_eq!(d.reverse_sock, crate::abi::MAX_REVERSE_SOCK);
        assert_eq!(d.affinity, crate::abi::MAX_AFFINITY);
        assert_eq!(d.mesh, crate::abi::MESH_MAP_SIZE);
        for k in &SIZE_KEYS {
            assert!(k.min <= k.default && k.default <= k.max, "{}", k.key);
        }
    }

    #[test]
    fn unused_maps_allocated_whole_are_created_at_their_minimum_and_never_shrunk() {
        let configured = MapSizes { conntrack: 1 << 18, affinity: 1 << 18, services: 1 << 20, ..MapSizes::default() };
        let none = |_: Capacity| None;
        assert_eq!(configured.to_create(Capacities::default(), none), configured, "everything used");

        let unused = Capacities::default().with(Capacity::Conntrack).with(Capacity::Affinity).with(Capacity::Services);
        let fresh = configured.to_create(unused, none);
        assert_eq!(fresh.conntrack, 4096);
        assert_eq!(fresh.affinity, 4096);
        assert_eq!(fresh.services, 1 << 20, "a map allocated as it fills is created at its size");
        assert_eq!(fresh.reverse_sock, configured.reverse_sock, "used");

        // Maps that have the configured size keep it when unused; maps of
        // another size (the minimum, an earlier key's) are made small.
        let current = |c: Capacity| match c {
            Capacity::Conntrack => Some(1 << 18),
            Capacity::Affinity => Some(1 << 17),
            _ => None,
        };
        let kept = configured.to_create(unused, current);
        assert_eq!(kept.conntrack, 1 << 18);
        assert_eq!(kept.affinity, 4096);
    }
}
