//! Stable ids. A service's id indexes the per-service BPF maps and a
//! backend's id is what Maglev tables hold, so neither may move when other
//! services or backends come and go: ids in use are kept, new ones get the
//! lowest free id. The ids in use are read back from the kernel (or the
//! last sync), so they survive daemon restarts.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use crate::abi::{BackendValue, Pod, SvcKey, SvcValue};

use super::state::{BpfMap, MapEntryKey, MapValue};

pub(crate) type ServiceIds = BTreeMap<SvcKey, u32>;
pub(crate) type BackendIds = BTreeMap<SocketAddr, u32>;

/// The ids the kernel holds now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Prior {
    pub services: ServiceIds,
    pub backends: BackendIds,
}

impl Prior {
    /// Reads ids from `HM_SERVICES` and `HM_BACKENDS` entries (observed, or
    /// desired by the last sync).
    pub(crate) fn from_entries<'a>(entries: impl IntoIterator<Item = (&'a MapEntryKey, &'a MapValue)>) -> Prior {
        let mut prior = Prior::default();
        for (k, v) in entries {
            match k.map {
                BpfMap::Services => {
                    if let (Some(key), Some(value)) =
                        (SvcKey::from_bytes(&k.key), v.as_bytes().and_then(SvcValue::from_bytes))
                    {
                        // An external VIP's and a node port's entries
                        // share their service's id.
                        if key.scope == crate::abi::SVC_SCOPE_HOST {
                            prior.services.insert(key, value.id);
                        }
                    }
                }
                BpfMap::Backends => {
                    if let (Some(id), Some(b)) =
                        (u32::from_bytes(&k.key), v.as_bytes().and_then(BackendValue::from_bytes))
                    {
                        prior.backends.insert(b.socket_addr(), id);
                    }
                }
                _ => {}
            }
        }
        prior
    }
}

/// Assigns ids below `capacity` to `keys`, keeping those in `prior`.
/// Fails with the capacity when there are more keys than ids.
pub(crate) fn assign<K: Ord + Clone>(
    keys: &BTreeSet<K>,
    prior: &BTreeMap<K, u32>,
    capacity: u32,
) -> Result<BTreeMap<K, u32>, u32> {
    if keys.len() as u64 > u64::from(capacity) {
        return Err(capacity);
    }
    let mut out = BTreeMap::new();
    let mut used = BTreeSet::new();
    for k in keys {
        if let Some(&id) = prior.get(k) {
            if id < capacity && used.insert(id) {
                out.insert(k.clone(), id);
            }
        }
    }
    let mut next = 0u32;
    for k in keys {
        if out.contains_key(k) {
            continue;
        }
        while used.contains(&next) {
            next += 1;
        }
        used.insert(next);
        out.insert(k.clone(), next);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> SvcKey {
        SvcKey::new(format!("10.0.0.{n}").parse().unwrap(), 80, 6)
    }

    #[test]
    fn ids_are_stable_and_reuse_the_lowest_free() {
        let keys: BTreeSet<_> = [key(1), key(2), key(3)].into();
        let first = assign(&keys, &ServiceIds::new(), 10).unwrap();
        assert_eq!(first.values().copied().collect::<Vec<_>>(), [0, 1, 2]);

        let keys: BTreeSet<_> = [key(1), key(3), key(4)].into();
        let second = assign(&keys, &first, 10).unwrap();
        assert_eq!(second[&key(1)], 0);
        assert_eq!(second[&key(3)], 2);
        assert_eq!(second[&key(4)], 1, "the freed id is reused");
    }

    #[test]
    fn capacity_is_enforced() {
        let keys: BTreeSet<_> = [key(1), key(2), key(3)].into();
        assert_eq!(assign(&keys, &ServiceIds::new(), 2), Err(2));
    }
}
