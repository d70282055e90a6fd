//! `[[service]]` -> the service maps every path reads (HM_CONFIG,
//! HM_BACKENDS, HM_MAGLEV, HM_SERVICES) and the connect-time programs on
//! the configured cgroup (README.md, "Service IPs"). The bpfnat veth is
//! `bpfnat.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::abi::{self, BackendValue, HmConfig, MaglevKey, Pod, SvcAffinity, SvcKey, SvcValue, MAGLEV_CHUNK};
use crate::config::{Config, CtlbMode, DaemonSettings, Mesh, Protocol, Service};

use super::ids::{self, Prior};
use super::maglev::Entry;
use super::mesh;
use super::reach::Reach;
use std::sync::atomic::{AtomicBool, Ordering};

use super::state::*;
use super::HostFacts;
use super::{Feature, KernelFeatures};

const OWNER: Object<'static> = Object::Services;

/// How many services are compiled between looks at the stop flag.
const STOP_CHECK_EVERY: usize = 256;

/// `reach`: where backends are, when a service is reached from the network.
pub(super) fn compile(
    config: &Config,
    facts: &HostFacts,
    prior: &Prior,
    reach: Option<&Reach>,
    out: &mut Desired,
    stopping: &AtomicBool,
) {
    if config.services.is_empty() {
        return;
    }
    let Some((svc_ids, backend_ids)) = assign_ids(config, prior, &mut out.warnings) else { return };
    let d = &config.daemon;
    let cfg = HmConfig {
        netns_cookie: facts.netns_cookie,
        flags: ctlb_flags(out.connect_time)
            | if config.services.iter().any(|s| s.serves_network()) { abi::CFG_EXTERNAL } else { 0 },
        tcp_timeout_s: abi::secs(d.conntrack_tcp_timeout),
        udp_timeout_s: abi::secs(d.conntrack_udp_timeout),
        snat_port_min: d.snat_port_range.first,
        snat_port_max: d.snat_port_range.last,
    };
    want(&mut out.map_entries, MapEntryKey { map: BpfMap::Config, key: 0u32.to_bytes().into() }, cfg.to_bytes(), OWNER);

    // Made into the tree at once (`wanted_all`), after the entries before.
    let mut entries = ByMap::default();
    std::mem::take(&mut out.map_entries).into_iter().for_each(|e| entries.push(e));
    let mut chunks_left = d.sizes.maglev_chunks as usize;
    let ids_in_order = service_ids_in_order(&config.services, &svc_ids);
    for (n, svc) in config.services.iter().enumerate() {
        if n % STOP_CHECK_EVERY == 0 && stopping.load(Ordering::Relaxed) {
            return;
        }
        let table_size = table_size_of(svc, d);
        // external_policy = "local": the backends on this host, which get a
        // table of their own.
        let here = reach.and_then(|r| r.local_backends(svc, facts));
        let chunks = chunks_of(svc, table_size)
            + here.as_ref().map_or(0, |h| crate::table_size::chunks_for(h.len(), table_size));
        if chunks > chunks_left {
            out.warnings.push(format!(
                "service \"{}\" not applied: Maglev tables are full ({} chunks of {MAGLEV_CHUNK} slots); raise [daemon] {} or use a smaller maglev_table_size",
                svc.name,
                d.sizes.maglev_chunks,
                crate::config::Capacity::MaglevChunks.key().key
            ));
            continue;
        }
        chunks_left -= chunks;
        let (owner, id) = (owner_of(svc), ids_in_order[n]);
        // Each backend's id looked up once, not once per slot (a quarter of
        // a 60,000-service compile went to those lookups).
        let ids: Vec<u32> = svc.backends.iter().map(|b| backend_ids[&b.addr]).collect();
        let owned =
            |(k, v): (MapEntryKey, MapValue)| (k, Owned { spec: v, owners: [owner.clone()].into_iter().collect() });
        service_entries(svc, id, &ids, table_size, &config.meshes).into_iter().for_each(|e| entries.push(owned(e)));
        if svc.serves_network() {
            network_entries(svc, id, &ids, table_size, here.as_deref())
                .into_iter()
                .for_each(|e| entries.push(owned(e)));
        }
        if let Some(here) = here {
            out.local_backends.insert(svc.name.clone(), here.len());
        }
    }
    out.map_entries = wanted_all(entries.into_vec());
    out.ids = AssignedIds(Some(std::sync::Arc::new((svc_ids, backend_ids))));
    attach_connect_time(config, facts, out);
}

/// Each service's id, in the order of `services`: the services sorted
/// by key (in the order a configuration is often written, which the sort
/// finds in one pass) walked beside the ids, instead of a search of the
/// ids' tree per service, whose comparisons grew faster than the
/// services (at 1,000,000, a tenth of a compile).
fn service_ids_in_order(services: &[std::sync::Arc<Service>], ids: &BTreeMap<SvcKey, u32>) -> Vec<u32> {
    let mut order: Vec<usize> = (0..services.len()).collect();
    order.sort_by_key(|&i| key_of(&services[i]));
    let mut out = vec![0; services.len()];
    let mut next = ids.iter().peekable();
    for i in order {
        let key = key_of(&services[i]);
        while next.next_if(|(k, _)| **k < key).is_some() {}
        // Every service's key has an id (assign_ids gave one to each).
        out[i] = next.peek().map_or(0, |(_, id)| **id);
    }
    out
}

/// A compile's map entries, gathered map by map. A compile makes them
/// service by service, each service's in several maps; the tree holds
/// them map by map, and within a map they come mostly in order (ids are
/// handed out in order; VIPs are often written so). Gathered apart, the
/// sort in `wanted_all` finds long runs already in order instead of
/// moving every entry: at 1,000,000 services that sort was a twentieth
/// of a start, and grew faster than the services did.
#[derive(Default)]
struct ByMap(BTreeMap<BpfMap, Vec<(MapEntryKey, Owned<MapValue>)>>);

impl ByMap {
    fn push(&mut self, entry: (MapEntryKey, Owned<MapValue>)) {
        self.0.entry(entry.0.map).or_default().push(entry);
    }

    /// Every entry, the maps in order.
    fn into_vec(self) -> Vec<(MapEntryKey, Owned<MapValue>)> {
        let mut all = Vec::with_capacity(self.0.values().map(Vec::len).sum());
        for (map, mut v) in self.0 {
            if map == BpfMap::Backends {
                v = by_id(v);
            }
            all.append(&mut v);
        }
        all
    }
}

/// HM_BACKENDS' entries in id order, each id once with every owner and
/// its first spec, as `wanted_all` makes them, but placed by id instead
/// of sorted: services share backends, so a compile makes each id as
/// often as services name it, in the services' order, where no long run
/// is in order (at 1,000,000 services on 65,536 backends, sixteen runs
/// of them to merge). Entries whose key is not an id are left as they are.
fn by_id(entries: Vec<(MapEntryKey, Owned<MapValue>)>) -> Vec<(MapEntryKey, Owned<MapValue>)> {
    let id = |k: &MapEntryKey| -> Option<usize> { Some(u32::from_ne_bytes(k.key[..].try_into().ok()?) as usize) };
    let Some(max) = entries.iter().try_fold(0, |max, (k, _)| id(k).map(|i| max.max(i))) else { return entries };
    // Where each id's entry is in `kept` (u32::MAX: none yet).
    let mut at = vec![u32::MAX; max + 1];
    let mut kept: Vec<Option<(MapEntryKey, Owned<MapValue>)>> = Vec::new();
    for e in entries {
        let slot = &mut at[id(&e.0).unwrap_or_default()];
        match kept.get_mut(*slot as usize) {
            Some(Some(first)) => first.1.owners.extend_from(&e.1.owners),
            _ => {
                *slot = kept.len() as u32;
                kept.push(Some(e));
            }
        }
    }
    at.into_iter().filter_map(|i| kept.get_mut(i as usize).and_then(Option::take)).collect()
}

/// Stable ids for every service key and backend address, within the
/// maps' capacities; `None` (and a warning) when either overflows: no
/// service is applied then.
fn assign_ids(
    config: &Config,
    prior: &Prior,
    warnings: &mut Vec<String>,
) -> Option<(BTreeMap<SvcKey, u32>, BTreeMap<SocketAddr, u32>)> {
    let d = &config.daemon;
    let keys: BTreeSet<SvcKey> = config.services.iter().map(|s| key_of(s)).collect();
    let backends: BTreeSet<SocketAddr> =
        config.services.iter().flat_map(|s| s.backends.iter().map(|b| b.addr)).collect();
    match (
        ids::assign(&keys, &prior.services, d.sizes.services),
        ids::assign(&backends, &prior.backends, d.sizes.backends),
    ) {
        (Ok(s), Ok(b)) => Some((s, b)),
        (Err(cap), _) => {
            warnings.push(format!(
                "{} services are configured but the service map holds {cap} (raise [daemon] service_map_size); no service is applied",
                keys.len()
            ));
            None
        }
        (_, Err(cap)) => {
            warnings.push(format!(
                "{} distinct backends are configured but the backend map holds {cap} (raise [daemon] backend_map_size); no service is applied",
                backends.len()
            ));
            None
        }
    }
}

/// HM_CONFIG's flags: the protocols connect-time LB handles.
fn ctlb_flags(mode: CtlbMode) -> u32 {
    mode.protocols().fold(0, |flags, p| {
        flags
            | match p {
                Protocol::Tcp => abi::CFG_CTLB_TCP,
                Protocol::Udp => abi::CFG_CTLB_UDP,
            }
    })
}

/// The connect-time programs on the configured cgroup (or the cgroup2
/// root) when connect-time LB handles anything.
fn attach_connect_time(config: &Config, facts: &HostFacts, out: &mut Desired) {
    if out.connect_time == CtlbMode::Off {
        return;
    }
    match config.daemon.cgroup.clone().or_else(|| facts.cgroup2_root.clone()) {
        Some(cgroup) => {
            for program in connect_time_programs(&facts.features) {
                want(&mut out.attachments, Attachment { program, hook: Hook::Cgroup(cgroup.clone()) }, (), OWNER);
            }
        }
        None => out
            .warnings
            .push("no cgroup2 mount found: connect-time load balancing is off; set [daemon] cgroup".to_string()),
    }
}

/// The connect-time programs this kernel runs: all of them, but for the
/// socket-close cleanup where the kernel lacks its hook.
pub(super) fn connect_time_programs(features: &KernelFeatures) -> impl Iterator<Item = Program> + '_ {
    Program::CONNECT_TIME.into_iter().filter(|p| *p != Program::SockRelease || features.has(Feature::SockRelease))
}

pub(super) fn key_of(s: &Service) -> SvcKey {
    SvcKey::new(s.vip, s.port, s.protocol.number())
}

/// The owner tag of everything a service needs.
pub(super) fn owner_of(s: &Service) -> Owner {
    Object::Service(&s.name).into_owner()
}

/// The service's Maglev table size: its own, `[daemon]`'s, or sized from
/// its backend count.
pub(super) fn table_size_of(s: &Service, d: &DaemonSettings) -> u32 {
    crate::table_size::resolve(s.maglev_table_size, d.maglev_table_size, s.backends.len())
}

/// The HM_MAGLEV chunks the service takes from the shared capacity (none
/// without backends).
pub(super) fn chunks_of(s: &Service, table_size: u32) -> usize {
    crate::table_size::chunks_for(s.backends.len(), table_size)
}

/// The keys of one service's entries for this host's clients in
/// HM_BACKENDS, HM_MAGLEV, HM_SVC_AFFINITY (with affinity) and
/// HM_SERVICES, in that order (`external::network_entries` adds those of
/// clients on other machines), given its id and its backends' ids (in the
/// order of `svc.backends`). Removing a service needs only these.
pub(super) fn service_keys(svc: &Service, id: u32, backend_ids: &[u32], table_size: u32) -> Vec<MapEntryKey> {
    let backends = backend_ids.iter().map(|b| MapEntryKey { map: BpfMap::Backends, key: b.to_bytes().into() });
    let chunks = (0..chunks_of(svc, table_size) as u32)
        .map(|chunk| MapEntryKey { map: BpfMap::Maglev, key: MaglevKey { svc_id: id, chunk }.to_bytes().into() });
    let affinity = svc.affinity.map(|_| MapEntryKey { map: BpfMap::SvcAffinity, key: id.to_bytes().into() });
    let service = MapEntryKey { map: BpfMap::Services, key: key_of(svc).to_bytes().into() };
    backends.chain(chunks).chain(affinity).chain(std::iter::once(service)).collect()
}

/// One service's entries: `service_keys` with their values. The full
/// compile and the incremental one (`incremental/`) both build services
/// with this.
pub(super) fn service_entries(
    svc: &Service,
    id: u32,
    backend_ids: &[u32],
    table_size: u32,
    meshes: &[Mesh],
) -> Vec<(MapEntryKey, MapValue)> {
    let mut values: Vec<MapValue> = Vec::with_capacity(backend_ids.len() + chunks_of(svc, table_size) + 3);
    for b in &svc.backends {
        values.push(
            BackendValue { addr: abi::addr16(b.addr.ip()), port_be: b.addr.port().to_be(), pad: 0 }.to_bytes().into(),
        );
    }
    let entries: Vec<Entry> = svc.backends.iter().map(|b| Entry { addr: b.addr, weight: b.weight }).collect();
    let table = MaglevTable::new(entries, backend_ids.to_vec(), table_size);
    values.extend((0..table.chunks()).map(|chunk| MapValue::chunk(&table, chunk)));
    // The sidecar owns a VIP:port that is also a mesh entry.
    let mut flags = if mesh::covers(meshes, svc.vip, svc.port, svc.protocol) { abi::SVC_F_MESH } else { 0 };
    if let Some(timeout) = svc.affinity {
        flags |= abi::SVC_F_AFFINITY;
        values.push(SvcAffinity { timeout_s: abi::secs(timeout), pad: 0 }.to_bytes().into());
    }
    let value = SvcValue { id, backend_count: svc.backends.len() as u32, flags, table_size };
    values.push(value.to_bytes().into());
    let keys = service_keys(svc, id, backend_ids, table_size);
    debug_assert_eq!(keys.len(), values.len());
    keys.into_iter().zip(values).collect()
}

/// A service's entries for clients on other machines: its external VIP's
/// and its node port's in HM_SERVICES (scope network), and with
/// external_policy = "local" the table of its backends on this host
/// (`local`, indexes in `svc.backends`), whose chunks are keyed with
/// MAGLEV_LOCAL. Without it they share the service's table.
pub(super) fn network_entries(
    svc: &Service,
    id: u32,
    backend_ids: &[u32],
    table_size: u32,
    local: Option<&[usize]>,
) -> Vec<(MapEntryKey, MapValue)> {
    let mut out = Vec::new();
    let mut flags = if svc.affinity.is_some() { abi::SVC_F_AFFINITY } else { 0 };
    let mut backend_count = svc.backends.len() as u32;
    if let Some(local) = local {
        flags |= abi::SVC_F_LOCAL;
        backend_count = local.len() as u32;
        let entries = local.iter().map(|&i| Entry { addr: svc.backends[i].addr, weight: svc.backends[i].weight });
        let ids = local.iter().map(|&i| backend_ids[i]).collect();
        let table = MaglevTable::new(entries.collect(), ids, table_size);
        for chunk in 0..table.chunks() {
            let key = MaglevKey { svc_id: id, chunk: chunk | abi::MAGLEV_LOCAL };
            out.push((MapEntryKey { map: BpfMap::Maglev, key: key.to_bytes().into() }, MapValue::chunk(&table, chunk)));
        }
    }
    let value = SvcValue { id, backend_count, flags, table_size };
    let proto = svc.protocol.number();
    let mut entry = |key: SvcKey, flag: u32| {
        let value = SvcValue { flags: value.flags | flag, ..value };
        out.push((MapEntryKey { map: BpfMap::Services, key: key.to_bytes().into() }, value.to_bytes().into()));
    };
    if svc.external {
        entry(SvcKey::network(svc.vip, svc.port, proto), abi::SVC_F_EXTERNAL);
    }
    if let Some(port) = svc.node_port {
        // Any address of the family: HM_HOST_ADDRS says which answer.
        let any: IpAddr = if svc.vip.is_ipv4() { Ipv4Addr::UNSPECIFIED.into() } else { Ipv6Addr::UNSPECIFIED.into() };
        entry(SvcKey::network(any, port, proto), abi::SVC_F_NODE_PORT);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// HM_BACKENDS' entries placed by id are what sorting them makes:
        /// ids repeated in any order are one entry, with every owner and
        /// the first spec, in id order.
        #[test]
        fn backends_placed_by_id_are_what_wanted_all_makes_of_them(
            items in proptest::collection::vec((0u32..64, 0u8..4, 0usize..3), 0..300)
        ) {
            let owners = ["service/a", "service/b", "service/c"];
            let entries: Vec<_> = items
                .iter()
                .map(|&(id, spec, owner)| {
                    let key = MapEntryKey { map: BpfMap::Backends, key: id.to_bytes().into() };
                    (key, Owned { spec: MapValue::from(vec![spec; 20]), owners: [owners[owner]].into_iter().collect() })
                })
                .collect();
            let placed = by_id(entries.clone());
            proptest::prop_assert!(placed.windows(2).all(|w| w[0].0 < w[1].0), "in id order, each once");
            proptest::prop_assert_eq!(wanted_all(placed), wanted_all(entries));
        }
    }
}
