//! observe_until(): read back everything hostmesh owns from the kernel.

use std::collections::{BTreeMap, BTreeSet};

use crate::backends::{Backends, Result};
use crate::model::{Desired, MapEntryKey, MapValue, Observed, Owned};

/// Reads owned links, routes, neighbours, map entries and attachments;
/// `None` when `give_up` said so part way (the map entries, most of the
/// reading, are read in parts, and it is asked between them). Sysctls are
/// read separately: which ones matter depends on what is desired, see
/// `observe_sysctls`.
/// Read `against` a desired state, the map entries equal to its are not
/// kept (`Observed::map_entries_missing`).
pub(crate) fn observe_until(
    b: &mut Backends,
    give_up: &dyn Fn() -> bool,
    against: Option<&Desired>,
) -> Result<Option<Observed>> {
    // The nft tool starts while the rest is read; its listing is read
    // however the rest ends, so none is left over to be taken, stale, by
    // a later read.
    b.nft.prefetch_mesh_table();
    let rest = observe_all_but_nft(b, give_up, against);
    let nft_table = b.nft.mesh_table();
    let Some(mut observed) = rest? else { return Ok(None) };
    observed.nft_table = nft_table?;
    Ok(Some(observed))
}

fn observe_all_but_nft(
    b: &mut Backends,
    give_up: &dyn Fn() -> bool,
    against: Option<&Desired>,
) -> Result<Option<Observed>> {
    let links = b.net.links()?;
    let neighbours = b.net.neighbours()?;
    let (map_entries, map_entries_missing) = match against {
        None => {
            let Some(all) = b.bpf.map_entries_until(give_up)? else { return Ok(None) };
            (all, None)
        }
        Some(want) => {
            let mut diff =
                Against { want: want.map_entries.iter().peekable(), differ: Vec::new(), missing: Vec::new() };
            if !b.bpf.map_entries_each_until(give_up, &mut |entries| diff.read(entries))? {
                return Ok(None);
            }
            diff.missing.extend(diff.want.map(|(k, _)| k.clone()));
            (diff.differ.into_iter().collect(), Some(diff.missing))
        }
    };
    Ok(Some(Observed {
        links,
        sysctls: BTreeMap::new(),
        neighbours,
        map_entries,
        attachments: b.bpf.attachments()?,
        routes: b.net.routes()?,
        rules: b.net.rules()?,
        nft_table: None,
        map_entries_missing,
    }))
}

/// The kernel's map entries read against the desired ones: both in key
/// order, one walk side by side.
struct Against<'a> {
    want: std::iter::Peekable<std::collections::btree_map::Iter<'a, MapEntryKey, Owned<MapValue>>>,
    /// The kernel's entries that differ from the desired ones, or that
    /// are not desired.
    differ: Vec<(MapEntryKey, MapValue)>,
    /// Desired keys the kernel lacks.
    missing: Vec<MapEntryKey>,
}

impl Against<'_> {
    /// One map's entries, in key order, after the maps before it.
    fn read(&mut self, kernel: Vec<(MapEntryKey, MapValue)>) {
        for (k, v) in kernel {
            while let Some((w, _)) = self.want.next_if(|(w, _)| **w < k) {
                self.missing.push(w.clone());
            }
            match self.want.next_if(|(w, _)| **w == k) {
                Some((_, w)) if w.spec == v => {}
                _ => self.differ.push((k, v)),
            }
        }
    }
}

/// Reads the given sysctls; ones that do not exist are left out.
pub(crate) fn observe_sysctls(b: &mut Backends, paths: &BTreeSet<String>, into: &mut Observed) -> Result<()> {
    for path in paths {
        if let Some(value) = b.sysctl.get(path)? {
            into.sysctls.insert(path.clone(), value);
        }
    }
    Ok(())
}
