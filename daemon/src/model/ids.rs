//! Stable service ids. A service's id indexes the per-service BPF arrays,
//! so it must not move when other services come and go: ids in use are
//! kept, new services get the lowest free id.

use std::collections::{BTreeMap, BTreeSet};

use crate::abi::{Pod, SvcKey, SvcValue};

use super::state::{BpfMap, MapEntryKey};

pub type ServiceIds = BTreeMap<SvcKey, u32>;

/// Assigns ids to `keys`, keeping those in `prior`.
pub fn assign(keys: &BTreeSet<SvcKey>, prior: &ServiceIds, capacity: u32) -> Result<ServiceIds, u32> {
    let mut out = ServiceIds::new();
    let mut used = BTreeSet::new();
    for k in keys {
        if let Some(&id) = prior.get(k) {
            if id < capacity && used.insert(id) {
                out.insert(*k, id);
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
        if next >= capacity {
            return Err(capacity);
        }
        used.insert(next);
        out.insert(*k, next);
    }
    Ok(out)
}

/// The ids recorded in `HM_SERVICES` entries (observed or desired).
pub fn from_entries<'a, V: 'a + AsRef<[u8]>>(
    entries: impl IntoIterator<Item = (&'a MapEntryKey, &'a V)>,
) -> ServiceIds {
    entries
        .into_iter()
        .filter(|(k, _)| k.map == BpfMap::Services)
        .filter_map(|(k, v)| Some((SvcKey::from_bytes(&k.key)?, SvcValue::from_bytes(v.as_ref())?.id)))
        .collect()
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
