//! Incremental compile: when only `[[service]]` entries changed since the
//! last compile, that compile's `Desired` is patched — the changed
//! services' items taken out, their new ones put in — instead of compiling
//! every service again, and `Touched` says which items may differ, so the
//! planner diffs only those. An edit then costs what it changes (plus a
//! pass over the service list to find the changes), not what is configured.
//!
//! Anything else that changed (`[daemon]`, meshes, the gateway, the host's
//! facts), a change of most services, or anything that makes compile warn
//! falls back to the full compile (`recompile` returns `None`). A patched
//! `Desired` is the one the full compile gives with the same prior ids:
//! `tests.rs` compares them over random edits.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::Hash;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::abi::SvcKey;
use crate::config::{Backend, Config, DaemonSettings, Service};

use super::bpfnat;
use super::services::{chunks_of, key_of, owner_of, service_entries, service_keys, table_size_of};
use super::state::*;
use super::{HostFacts, Prior};

mod touched;
pub(crate) use touched::Touched;

/// The indexes' maps: foldhash (seeded per process) hashes 100,000 keys
/// several times faster than the standard SipHash.
type Hashed<K, V> = HashMap<K, V, foldhash::quality::RandomState>;

/// The last compile, with what it was compiled from and the indexes an
/// edit needs: ids in use and free, the services using each backend, the
/// Maglev chunks in use.
#[derive(Debug, Clone)]
pub(crate) struct Compiled {
    pub desired: Desired,
    /// Shared with the daemon (the configuration it loaded), not copied:
    /// an edit costs what it changes.
    config: Arc<Config>,
    facts: HostFacts,
    service_ids: IdPool<SvcKey>,
    /// With how many services list each backend address (one table, not
    /// a second of the same keys: 5 MB at 100,000 backends).
    backend_ids: IdPool<SocketAddr, u32>,
    chunks_used: usize,
    v6_services: usize,
    /// The entries of each map in `desired`, kept by patches (the metrics
    /// report them after every sync).
    entry_counts: BTreeMap<BpfMap, usize>,
}

/// Ids in use, each with what its user keeps beside it (`U`), and the
/// free ones below the highest: the lowest free id is found without a
/// scan, and it is the one `ids::assign` would pick.
#[derive(Debug, Clone)]
struct IdPool<K, U = ()> {
    ids: Hashed<K, (u32, U)>,
    free: BTreeSet<u32>,
    next: u32,
}

impl IdPool<SocketAddr, u32> {
    /// The ids of a service's backends, in its order; `None` if one has none.
    fn of(&self, backends: &[Backend]) -> Option<Vec<u32>> {
        backends.iter().map(|b| self.get(&b.addr)).collect()
    }

    /// How many services list `a`; `None` when it has no id.
    fn users_mut(&mut self, a: &SocketAddr) -> Option<&mut u32> {
        self.ids.get_mut(a).map(|(_, users)| users)
    }
}

impl<K: Eq + Hash + Clone, U: Copy + Default> IdPool<K, U> {
    fn new(ids: impl IntoIterator<Item = (K, u32)>) -> Self {
        let ids: Hashed<K, (u32, U)> = ids.into_iter().map(|(k, id)| (k, (id, U::default()))).collect();
        let mut used: Vec<u32> = ids.values().map(|(id, _)| *id).collect();
        used.sort_unstable();
        let next = used.last().map_or(0, |&m| m + 1);
        // The gaps between the used ids, found in one walk.
        let mut free = Vec::new();
        let mut expect = 0;
        for &id in &used {
            free.extend(expect..id);
            expect = id + 1;
        }
        IdPool { ids, free: free.into_iter().collect(), next }
    }

    fn get(&self, k: &K) -> Option<u32> {
        self.ids.get(k).map(|(id, _)| *id)
    }

    fn len(&self) -> usize {
        self.ids.len()
    }

    fn release(&mut self, k: &K) {
        if let Some((id, _)) = self.ids.remove(k) {
            self.free.insert(id);
        }
    }

    /// The lowest free id for `k` (kept with `with`), or `None` when all
    /// `capacity` are taken.
    fn assign(&mut self, k: K, capacity: u32, with: U) -> Option<u32> {
        let id = match self.free.pop_first() {
            Some(id) => id,
            None if self.next < capacity => {
                self.next += 1;
                self.next - 1
            }
            None => return None,
        };
        self.ids.insert(k, (id, with));
        Some(id)
    }
}

/// Whether compile sees the same host in both: every fact, except that of
/// the interfaces only the configured host interfaces matter (hostmesh's
/// own hm-* links appear after the first sync).
fn same_facts(a: &HostFacts, b: &HostFacts, config: &Config) -> bool {
    let configured_exist = |f: &HostFacts| -> Vec<bool> {
        let names = config.daemon.host_interfaces.iter().flatten();
        names.map(|n| f.interfaces.contains(n)).collect()
    };
    a.default_route_interfaces == b.default_route_interfaces
        && a.netns_cookie == b.netns_cookie
        && a.cgroup2_root == b.cgroup2_root
        && a.sk_lookup_unavailable == b.sk_lookup_unavailable
        && a.underlay_mtu == b.underlay_mtu
        && a.gateways == b.gateways
        && a.backend_routes == b.backend_routes
        && a.addresses == b.addresses
        && a.features == b.features
        && a.wireguard_key == b.wireguard_key
        && configured_exist(a) == configured_exist(b)
}

/// The compile-relevant content of a service: everything but where it was
/// written (a line moved by an edit above it changes nothing).
fn same_service(a: &Service, b: &Service) -> bool {
    a.vip == b.vip
        && a.port == b.port
        && a.protocol == b.protocol
        && a.backends == b.backends
        && a.maglev_table_size == b.maglev_table_size
        && a.affinity == b.affinity
        && a.node_port == b.node_port
        && a.external == b.external
        && a.external_policy == b.external_policy
}

impl Compiled {
    /// How many entries `desired` has in each map.
    pub(crate) fn entry_counts(&self) -> &BTreeMap<BpfMap, usize> {
        &self.entry_counts
    }

    /// Indexes a full compile of `config` on `facts`.
    pub(crate) fn new(mut desired: Desired, config: &Arc<Config>, facts: &HostFacts) -> Compiled {
        // The ids the compile gave, else as its entries say.
        let (services, backends) = match desired.ids.0.take() {
            Some(ids) => Arc::try_unwrap(ids).unwrap_or_else(|shared| (*shared).clone()),
            None => {
                let prior = Prior::from_entries(desired.map_entries.iter().map(|(k, v)| (k, &v.spec)));
                (prior.services, prior.backends)
            }
        };
        let mut backend_ids = IdPool::new(backends);
        // A backend without an id (a compile that applied no service)
        // makes every patch fall back to the full compile.
        for b in config.services.iter().flat_map(|s| &s.backends) {
            if let Some(users) = backend_ids.users_mut(&b.addr) {
                *users += 1;
            }
        }
        let d = &config.daemon;
        Compiled {
            entry_counts: count_entries(&desired),
            chunks_used: config.services.iter().map(|s| chunks_of(s, table_size_of(s, d))).sum(),
            v6_services: config.services.iter().filter(|s| s.vip.is_ipv6()).count(),
            service_ids: IdPool::new(services),
            backend_ids,
            config: Arc::clone(config),
            facts: facts.clone(),
            desired,
        }
    }
}

/// Patches `prev` to `config`, if only services changed. When it cannot,
/// the caller compiles in full, and gets back `prev`'s desired state (what
/// the kernel holds after a clean sync) to give the same ids and to plan
/// from.
pub(crate) fn recompile(
    mut prev: Compiled,
    config: &Arc<Config>,
    facts: &HostFacts,
) -> Result<(Compiled, Touched), Box<Desired>> {
    match patch(&mut prev, config, facts) {
        Some(touched) => Ok((prev, touched)),
        None => Err(Box::new(prev.desired)),
    }
}

/// `recompile`'s patch, in place: `prev.desired` is changed only when it
/// returns the touched items (its indexes may be changed either way).
fn patch(prev: &mut Compiled, config: &Arc<Config>, facts: &HostFacts) -> Option<Touched> {
    if !only_services_changed(prev, config, facts) {
        return None;
    }
    let (gone, came) = changed_services(&prev.config, config);
    // A change of most services is a new configuration: compile it whole.
    if gone.len() + came.len() > config.services.len() / 2 + 8 {
        return None;
    }
    let connect_time = prev.desired.connect_time;
    if came.iter().any(|s| bpfnat::mesh_vip_warning(&config.meshes, connect_time, s).is_some()) {
        return None;
    }
    account(prev, config, &gone, &came)?;
    let d = &config.daemon;
    let routes = bpfnat::carries_services(config, connect_time);
    // What the changed services had, under their old ids.
    let mut take_out = Vec::new();
    for s in &gone {
        let id = prev.service_ids.get(&key_of(s))?;
        let keys = service_keys(s, id, &prev.backend_ids.of(&s.backends)?, table_size_of(s, d));
        let route = if routes { bpfnat::service_route(&config.meshes, s).map(|(k, _)| k) } else { None };
        take_out.push((owner_of(s), keys, route));
    }
    reassign_ids(prev, d, &gone, &came)?;

    // What the new versions want, built before anything is taken out so
    // the entry counts can be kept from the touched keys' presence.
    let mut put = Vec::with_capacity(came.len());
    for s in &came {
        let id = prev.service_ids.get(&key_of(s))?;
        let ids = prev.backend_ids.of(&s.backends)?;
        put.push((owner_of(s), service_entries(s, id, &ids, table_size_of(s, d), &config.meshes)));
    }
    let keys = take_out
        .iter()
        .flat_map(|(_, keys, _)| keys.iter().cloned())
        .chain(put.iter().flat_map(|(_, entries)| entries.iter().map(|(k, _)| k.clone())))
        .collect();
    let new_routes = came.iter().filter(|_| routes).filter_map(|s| bpfnat::service_route(&config.meshes, s));
    let route_keys = take_out.iter().filter_map(|(_, _, r)| r.clone()).chain(new_routes.map(|(k, _)| k)).collect();
    let touched = Touched::of(keys, route_keys, &prev.desired);
    let was: Vec<bool> = touched.map_entries.iter().map(|k| prev.desired.map_entries.contains_key(k)).collect();

    let out = &mut prev.desired;
    for (owner, keys, route) in take_out {
        for k in keys {
            disown(&mut out.map_entries, &k, &owner);
        }
        if let Some(k) = route {
            disown(&mut out.routes, &k, &owner);
        }
    }
    for (s, (owner, entries)) in came.iter().zip(put) {
        for (k, v) in entries {
            want(&mut out.map_entries, k, v, &owner);
        }
        if routes {
            if let Some((k, spec)) = bpfnat::service_route(&config.meshes, s) {
                want(&mut out.routes, k, spec, &owner);
            }
        }
    }
    recount(&mut prev.entry_counts, &touched.map_entries, was, &prev.desired.map_entries);
    prev.config = Arc::clone(config);
    Some(touched)
}

/// How many entries `d` has in each map: the keys are sorted by map, so
/// each map's entries are one run of them (a counter per key looked up in
/// a map took 16 ms at 100,000 services).
pub(super) fn count_entries(d: &Desired) -> BTreeMap<BpfMap, usize> {
    let mut counts = BTreeMap::new();
    let mut keys = d.map_entries.keys().map(|k| k.map).peekable();
    while let Some(map) = keys.next() {
        let mut n = 1;
        while keys.next_if_eq(&map).is_some() {
            n += 1;
        }
        counts.insert(map, n);
    }
    counts
}

/// Keeps the entry counts across a patch: `keys` are the entries it
/// touched, `was` whether each was in the desired state before it, and
/// `now` the desired state after.
fn recount(
    counts: &mut BTreeMap<BpfMap, usize>,
    keys: &BTreeSet<MapEntryKey>,
    was: Vec<bool>,
    now: &BTreeMap<MapEntryKey, Owned<MapValue>>,
) {
    for (k, was) in keys.iter().zip(was) {
        match (was, now.contains_key(k)) {
            (false, true) => *counts.entry(k.map).or_default() += 1,
            (true, false) => {
                if let Some(n) = counts.get_mut(&k.map) {
                    *n -= 1;
                    if *n == 0 {
                        counts.remove(&k.map);
                    }
                }
            }
            _ => {}
        }
    }
}

/// Whether everything but `[[service]]` entries is as `prev` compiled it
/// (and that compile was clean, with services before and after).
/// The last compile, kept for `config` and `facts` when nothing it was
/// compiled from changed (what a full compile would give; a full sync
/// then reads the kernel again without compiling), or None.
pub(crate) fn keep(mut prev: Compiled, config: &Arc<Config>, facts: &HostFacts) -> Option<Compiled> {
    let same = Arc::ptr_eq(&prev.config, config) || prev.config.services == config.services;
    if !(same && only_services_changed(&prev, config, facts)) {
        return None;
    }
    prev.config = Arc::clone(config);
    prev.facts = facts.clone();
    Some(prev)
}

fn only_services_changed(prev: &Compiled, config: &Config, facts: &HostFacts) -> bool {
    let old = &prev.config;
    prev.desired.warnings.is_empty()
        && same_facts(&prev.facts, facts, config)
        && old.daemon == config.daemon
        && old.meshes == config.meshes
        && old.gateway == config.gateway
        && old.peers == config.peers
        && old.members == config.members
        && !old.services.is_empty()
        && !config.services.is_empty()
        && !serves_network(old)
        && !serves_network(config)
}

/// Services clients on other machines reach take the full compile: their
/// entries in HM_SNAT and the host interfaces' programs and sysctls hang
/// on every such service and on the routes to their backends.
fn serves_network(config: &Config) -> bool {
    config.services.iter().any(|s| s.serves_network())
}

/// The services whose old version goes (`gone`) and whose new version
/// comes (`came`): removed, added, and changed ones in both.
fn changed_services<'c>(old: &Config, config: &'c Config) -> (Vec<Arc<Service>>, Vec<&'c Service>) {
    type ByName<'a> = HashMap<&'a str, usize, foldhash::quality::RandomState>;
    fn by_name(services: &[Arc<Service>]) -> ByName<'_> {
        services.iter().enumerate().map(|(i, s)| (s.name.as_str(), i)).collect()
    }
    // Unchanged files keep their parse: their services are the same ones,
    // in the same order. What lies between the longest shared head and
    // tail is all an edit beside 100,000 unchanged services compares.
    let (o, n) = (&old.services[..], &config.services[..]);
    let head = o.iter().zip(n).take_while(|(a, b)| Arc::ptr_eq(a, b)).count();
    let tail = o[head..].iter().rev().zip(n[head..].iter().rev()).take_while(|(a, b)| Arc::ptr_eq(a, b)).count();
    let (o, n) = (&o[head..o.len() - tail], &n[head..n.len() - tail]);
    let (old_names, new_names) = (by_name(o), by_name(n));
    // A service shared by both (an unchanged file's) is the same one.
    let same = |a: &Arc<Service>, b: &Arc<Service>| Arc::ptr_eq(a, b) || same_service(a, b);
    let gone = o.iter().filter(|s| new_names.get(s.name.as_str()).is_none_or(|&i| !same(s, &n[i]))).cloned().collect();
    let came =
        n.iter().filter(|s| old_names.get(s.name.as_str()).is_none_or(|&i| !same(&o[i], s))).map(|s| &**s).collect();
    (gone, came)
}

/// Updates the counts a patch must stay within (IPv6 services, Maglev
/// chunks); `None` when the change crosses a line a full compile decides
/// (the veth path's IPv6 sysctls, a capacity).
fn account(prev: &mut Compiled, config: &Config, gone: &[Arc<Service>], came: &[&Service]) -> Option<()> {
    let v6 = prev.v6_services + came.iter().filter(|s| s.vip.is_ipv6()).count()
        - gone.iter().filter(|s| s.vip.is_ipv6()).count();
    if (v6 > 0) != (prev.v6_services > 0) {
        // The veth path's IPv6 sysctls and neighbour come or go.
        return None;
    }
    prev.v6_services = v6;
    let d = &config.daemon;
    let chunks = prev.chunks_used + came.iter().map(|s| chunks_of(s, table_size_of(s, d))).sum::<usize>()
        - gone.iter().map(|s| chunks_of(s, table_size_of(s, d))).sum::<usize>();
    if chunks > d.sizes.maglev_chunks as usize || config.services.len() > d.sizes.services as usize {
        return None;
    }
    prev.chunks_used = chunks;
    Some(())
}

/// Ids: a key or backend no longer used frees its id first; new ones then
/// take the lowest free ids in order, as `ids::assign` does.
fn reassign_ids(prev: &mut Compiled, d: &DaemonSettings, gone: &[Arc<Service>], came: &[&Service]) -> Option<()> {
    let came_keys: BTreeSet<SvcKey> = came.iter().map(|s| key_of(s)).collect();
    for s in gone {
        let k = key_of(s);
        if !came_keys.contains(&k) {
            prev.service_ids.release(&k);
        }
        for b in &s.backends {
            *prev.backend_ids.users_mut(&b.addr)? -= 1;
        }
    }
    // Backends no service listed before, with how many list them now.
    let mut new_backends: BTreeMap<SocketAddr, u32> = BTreeMap::new();
    for s in came {
        for b in &s.backends {
            match prev.backend_ids.users_mut(&b.addr) {
                Some(users) => *users += 1,
                None => *new_backends.entry(b.addr).or_default() += 1,
            }
        }
    }
    let unused: Vec<SocketAddr> = gone
        .iter()
        .flat_map(|s| s.backends.iter().map(|b| b.addr))
        .filter(|a| prev.backend_ids.users_mut(a).is_some_and(|u| *u == 0))
        .collect();
    for a in unused {
        prev.backend_ids.release(&a);
    }
    if prev.backend_ids.len() + new_backends.len() > d.sizes.backends as usize {
        return None;
    }
    for k in came_keys {
        if prev.service_ids.get(&k).is_none() {
            prev.service_ids.assign(k, d.sizes.services, ())?;
        }
    }
    for (a, users) in new_backends {
        prev.backend_ids.assign(a, d.sizes.backends, users)?;
    }
    Some(())
}

/// Takes `owner` off the item at `key`, removing the item when nobody
/// else needs it.
fn disown<K: Ord, T>(map: &mut BTreeMap<K, Owned<T>>, key: &K, owner: &str) {
    if let Some(item) = map.get_mut(key) {
        item.owners.remove(owner);
        if item.owners.is_empty() {
            map.remove(key);
        }
    }
}

#[cfg(test)]
mod tests;
