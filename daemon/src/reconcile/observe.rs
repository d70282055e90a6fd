//! observe(): read back everything hostmesh owns from the kernel.

use std::collections::{BTreeMap, BTreeSet};

use crate::backends::{Backends, Result};
use crate::model::Observed;

/// Reads owned links, routes, neighbours, map entries and attachments.
/// Sysctls are read separately: which ones matter depends on what is
/// desired, see `observe_sysctls`.
pub(crate) fn observe(b: &mut Backends) -> Result<Observed> {
    Ok(Observed {
        links: b.net.links()?,
        sysctls: BTreeMap::new(),
        neighbours: b.net.neighbours()?,
        map_entries: b.bpf.map_entries()?,
        attachments: b.bpf.attachments()?,
        routes: b.net.routes()?,
        nft_table: b.nft.mesh_table()?,
    })
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
