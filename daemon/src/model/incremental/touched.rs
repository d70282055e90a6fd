//! What a patch touched: the map entries and routes it may have changed,
//! and what they were before it, for the plan of a patch.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::state::*;

/// The map entries and routes a patch may have changed (nothing else
/// did), and what they were before it: the kernel held the last compile,
/// so the plan of a patch needs no copy of it beside the compile.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Touched {
    pub map_entries: BTreeSet<MapEntryKey>,
    pub routes: BTreeSet<RouteKey>,
    /// The touched entries and routes the last compile had, as specs.
    was_entries: BTreeMap<MapEntryKey, MapValue>,
    was_routes: BTreeMap<RouteKey, RouteSpec>,
}

impl Touched {
    /// What the kernel held of the touched items before the patch (it held
    /// the last compile), with everything that is not per service (links,
    /// sysctls, programs...) as `now` has it, which a patch leaves alone.
    pub(crate) fn before(&self, now: &Desired) -> Observed {
        now.as_observed_with(self.was_entries.clone(), self.was_routes.clone())
    }

    /// The same part of `want`.
    pub(crate) fn desired(&self, want: &Desired) -> Desired {
        Desired {
            links: want.links.clone(),
            sysctls: want.sysctls.clone(),
            neighbours: want.neighbours.clone(),
            map_entries: pick(&want.map_entries, &self.map_entries),
            attachments: want.attachments.clone(),
            routes: pick(&want.routes, &self.routes),
            rules: want.rules.clone(),
            nft_rules: want.nft_rules.clone(),
            mesh_path: want.mesh_path.clone(),
            connect_time: want.connect_time,
            warnings: want.warnings.clone(),
            refused_peers: want.refused_peers.clone(),
            local_backends: want.local_backends.clone(),
            ids: Default::default(),
        }
    }

    /// The items a patch touches, with what `d` (the compile it patches)
    /// has at them.
    pub(super) fn of(map_entries: BTreeSet<MapEntryKey>, routes: BTreeSet<RouteKey>, d: &Desired) -> Touched {
        let was_entries =
            map_entries.iter().filter_map(|k| d.map_entries.get(k).map(|v| (k.clone(), v.spec.clone()))).collect();
        let was_routes = routes.iter().filter_map(|k| d.routes.get(k).map(|v| (k.clone(), v.spec.clone()))).collect();
        Touched { map_entries, routes, was_entries, was_routes }
    }
}

fn pick<K: Ord + Clone, V: Clone>(m: &BTreeMap<K, V>, keys: &BTreeSet<K>) -> BTreeMap<K, V> {
    keys.iter().filter_map(|k| m.get(k).map(|v| (k.clone(), v.clone()))).collect()
}
