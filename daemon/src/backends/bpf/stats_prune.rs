//! HM_BACKEND_STATS kept to the (service, backend) pairs configured, at
//! every full sync (start, SIGHUP, the periodic resync): the probes add an
//! entry for every pair that carries traffic, and nothing else removes
//! one. Without this a removed backend's or service's counters would stay
//! until the map filled (and new pairs went uncounted), and a service
//! given a freed id would go on inheriting the counters of the one before
//! it; with it, that lasts until the next full sync at most.

use std::collections::HashSet;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};

use crate::abi::*;

use super::load::Loader;
use super::{bpf_err, sys};
use crate::backends::{ConfiguredPairs, Result};

/// Deletes the counters of pairs not configured; returns how many.
pub(super) fn prune_stats(loader: &mut Loader, configured: ConfiguredPairs<'_>) -> Result<usize> {
    if !loader.any() {
        return Ok(0);
    }
    let services = loader.map_fd_owned(HmMap::Services)?;
    let stats = loader.map_fd(HmMap::BackendStats)?;
    prune(services.as_fd(), stats.as_fd(), configured).map_err(|e| bpf_err(format!("prune {}", HmMap::BackendStats), e))
}

/// Deletes every entry whose service (by id, through HM_SERVICES) does not
/// list its backend among the pairs `configured`, or whose id no service
/// has; returns how many.
fn prune(services: BorrowedFd<'_>, stats: BorrowedFd<'_>, configured: ConfiguredPairs<'_>) -> io::Result<usize> {
    let keys = sys::map_keys(stats, std::mem::size_of::<BackendStatsKey>())?;
    if keys.is_empty() {
        return Ok(0);
    }
    let ids = super::inspect::service_keys_by_id(services)?;
    let keys: Vec<(Vec<u8>, BackendStatsKey)> =
        keys.into_iter().filter_map(|k| BackendStatsKey::from_bytes(&k).map(|key| (k, key))).collect();
    let named: HashSet<SvcKey> = keys.iter().filter_map(|(_, key)| ids.get(&key.svc_id).copied()).collect();
    let configured = configured(&named);
    let mut gone = 0;
    for (k, key) in keys {
        let backend = socket_addr16(key.addr, key.port_be);
        let kept = ids.get(&key.svc_id).is_some_and(|svc| configured.contains(&(*svc, backend)));
        if !kept {
            // A key gone meanwhile deletes fine (sys::map_delete).
            sys::map_delete(stats, &k)?;
            gone += 1;
        }
    }
    Ok(gone)
}
