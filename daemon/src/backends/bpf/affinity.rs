//! Session affinity's memory (HM_AFFINITY, written by the probes) kept to
//! backends that serve: an entry whose backend left its service (down,
//! draining, removed), or whose service no longer has affinity, is
//! deleted, so the client's next connection is balanced afresh and then
//! sticks to its new backend.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};

use crate::abi::*;

use super::load::Loader;
use super::{bpf_err, sys};

/// Deletes the clients remembered at a backend not in `serving` for their
/// service; returns how many.
pub(super) fn prune_entries(
    loader: &mut Loader,
    serving: &BTreeMap<SvcKey, BTreeSet<SocketAddr>>,
) -> crate::backends::Result<usize> {
    if !loader.any() {
        return Ok(0);
    }
    let (services, backends, table) = (
        loader.map_fd_owned(HmMap::Services)?,
        loader.map_fd_owned(HmMap::Backends)?,
        loader.map_fd_owned(HmMap::Affinity)?,
    );
    let maps = Maps { services: services.as_fd(), backends: backends.as_fd(), affinity: table.as_fd() };
    prune(maps, serving).map_err(|e| bpf_err(format!("prune {}", HmMap::Affinity), e))
}

/// The maps it reads and the one it prunes.
struct Maps<'a> {
    pub services: BorrowedFd<'a>,
    pub backends: BorrowedFd<'a>,
    pub affinity: BorrowedFd<'a>,
}

/// Deletes every entry not pointing at a backend in `serving` for its
/// service; returns how many.
fn prune(maps: Maps<'_>, serving: &BTreeMap<SvcKey, BTreeSet<SocketAddr>>) -> io::Result<usize> {
    let entries = sys::map_dump(maps.affinity, std::mem::size_of::<AffKey>(), std::mem::size_of::<AffValue>())?;
    if entries.is_empty() {
        return Ok(0);
    }
    let services = super::inspect::service_keys_by_id(maps.services)?;
    let mut backends: HashMap<u32, Option<SocketAddr>> = HashMap::new();
    let mut gone = 0;
    for (k, v) in entries {
        let (Some(key), Some(value)) = (AffKey::from_bytes(&k), AffValue::from_bytes(&v)) else { continue };
        let backend = *backends.entry(value.backend_id).or_insert_with(|| {
            let mut b = vec![0u8; std::mem::size_of::<BackendValue>()];
            let found = sys::map_lookup(maps.backends, &value.backend_id.to_ne_bytes(), &mut b).unwrap_or(false);
            Some(found.then(|| BackendValue::from_bytes(&b)).flatten()?.socket_addr())
        });
        let serves = services
            .get(&key.svc_id)
            .and_then(|svc| serving.get(svc))
            .zip(backend)
            .is_some_and(|(set, addr)| set.contains(&addr));
        if !serves {
            // A key gone meanwhile deletes fine (sys::map_delete).
            sys::map_delete(maps.affinity, &k)?;
            gone += 1;
        }
    }
    Ok(gone)
}
