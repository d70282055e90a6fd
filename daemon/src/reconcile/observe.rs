//! observe_until(): read back everything hostmesh owns from the kernel.

use std::collections::{BTreeMap, BTreeSet};

use crate::backends::{Backends, Result};
use crate::model::Observed;

/// Reads owned links, routes, neighbours, map entries and attachments;
/// `None` when `give_up` said so part way (the map entries, most of the
/// reading, are read in parts, and it is asked between them). Sysctls are
/// read separately: which ones matter depends on what is desired, see
/// `observe_sysctls`.
pub(crate) fn observe_until(b: &mut Backends, give_up: &dyn Fn() -> bool) -> Result<Option<Observed>> {
    // The nft tool starts while the rest is read; its listing is read
    // however the rest ends, so none is left over to be taken, stale, by
    // a later read.
    b.nft.prefetch_mesh_table();
    let rest = observe_all_but_nft(b, give_up);
    let nft_table = b.nft.mesh_table();
    let Some(mut observed) = rest? else { return Ok(None) };
    observed.nft_table = nft_table?;
    Ok(Some(observed))
}

fn observe_all_but_nft(b: &mut Backends, give_up: &dyn Fn() -> bool) -> Result<Option<Observed>> {
    let links = b.net.links()?;
    let neighbours = b.net.neighbours()?;
    let Some(map_entries) = b.bpf.map_entries_until(give_up)? else { return Ok(None) };
    Ok(Some(Observed {
        links,
        sysctls: BTreeMap::new(),
        neighbours,
        map_entries,
        attachments: b.bpf.attachments()?,
        routes: b.net.routes()?,
        nft_table: None,
    }))
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
