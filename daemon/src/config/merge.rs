//! Merging files into the configuration in force, enforcing what must be
//! unique across the whole config dir: object names per kind, a service's
//! (VIP, port, protocol), a mesh entry's (VIP, port, protocol), and the
//! single `[daemon]` and `[gateway]` sections.
//!
//! Files are taken in lexical order; the earlier file keeps a contested
//! name. Each file offers its versions in order of preference (the new text,
//! then its last good version): the first that fits is used, so a file that
//! becomes invalid keeps its last good version in force, and the config in
//! force is always consistent.
//!
//! Each file's claims are indexed once per parse (`FileIndex`, kept with
//! the parse, so a file read again unchanged keeps it). A file is checked
//! against each file accepted before it, iterating the smaller index of
//! the two and looking up in the larger: a load that changed a small file
//! beside one of 100,000 services costs what the small file holds.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use foldhash::quality::RandomState;
use hashbrown::HashTable;

/// The indexes' maps: hashed with foldhash (seeded per process), several
/// times cheaper than SipHash on 100,000 names and addresses.
type HashMap<K, V> = std::collections::HashMap<K, V, RandomState>;
type HashSet<T> = std::collections::HashSet<T, RandomState>;

use super::capacity::{Capacity, MapSizes};
use super::error::{ConfigError, Origin};
use super::types::*;
use crate::abi::MAGLEV_CHUNK;
use crate::table_size::service_chunks;

/// The outcome for one file: which of its offered versions is in force
/// (if any), and why the preferred one was not.
#[derive(Debug)]
pub(super) struct MergedFile {
    pub accepted: Option<usize>,
    pub conflicts: Vec<ConfigError>,
}

/// (VIP, port, protocol): a service's or a mesh entry's.
type Key = (IpAddr, u16, Protocol);
/// (node port, protocol, IPv6): a node port answers on the addresses of
/// its service's family.
type PortKey = (u16, Protocol, bool);

/// The kinds of object whose names are unique across the config dir.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Service,
    Mesh,
    Peer,
    Member,
}

impl Kind {
    const ALL: [Kind; 4] = [Kind::Service, Kind::Mesh, Kind::Peer, Kind::Member];

    fn text(self) -> &'static str {
        match self {
            Kind::Service => "service",
            Kind::Mesh => "mesh",
            Kind::Peer => "peer",
            Kind::Member => "member",
        }
    }

    /// The object's name and where it was declared.
    fn object(self, f: &FileConfig, i: u32) -> (&str, &Origin) {
        let i = i as usize;
        match self {
            Kind::Service => (&f.services[i].name, &f.services[i].origin),
            Kind::Mesh => (&f.meshes[i].name, &f.meshes[i].origin),
            Kind::Peer => (&f.peers[i].name, &f.peers[i].origin),
            Kind::Member => (&f.members[i].name, &f.members[i].origin),
        }
    }

    fn count(self, f: &FileConfig) -> usize {
        match self {
            Kind::Service => f.services.len(),
            Kind::Mesh => f.meshes.len(),
            Kind::Peer => f.peers.len(),
            Kind::Member => f.members.len(),
        }
    }
}

/// What one claim is on: an object's name, a service's or a mesh entry's
/// key, a node port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Claimed {
    Name(Kind),
    Service,
    Mesh,
    NodePort,
}

impl Claimed {
    /// Where the claim of object `i` comes in its file: errors are
    /// reported in this order ([daemon], [gateway], then each service's
    /// name, key and node port, each mesh entry's name and key, peers,
    /// members).
    fn order(self, i: u32) -> (u8, u32, u8) {
        match self {
            Claimed::Name(Kind::Service) => (2, i, 0),
            Claimed::Service => (2, i, 1),
            Claimed::NodePort => (2, i, 2),
            Claimed::Name(Kind::Mesh) => (3, i, 0),
            Claimed::Mesh => (3, i, 1),
            Claimed::Name(Kind::Peer) => (4, i, 0),
            Claimed::Name(Kind::Member) => (5, i, 0),
        }
    }
}

/// A claim that repeats one made earlier in the same file.
#[derive(Debug, Clone, Copy)]
struct Repeat {
    what: Claimed,
    /// The object that repeats it, and the one that made it first.
    idx: u32,
    first: u32,
}

/// One file's claims, indexed: each name, key and node port with the
/// first object that claims it, the distinct backend addresses, and the
/// map entries it takes. Built once per parse.
#[derive(Debug)]
pub(crate) struct FileIndex {
    names: [HashTable<u32>; 4],
    services: HashMap<Key, u32>,
    meshes: HashMap<Key, u32>,
    node_ports: HashMap<PortKey, u32>,
    backends: HashSet<SocketAddr>,
    repeats: Vec<Repeat>,
    /// Service map entries: one a service, one more for a node port and
    /// for an external VIP.
    service_entries: usize,
    /// The HM_MAGLEV chunks its services take at a `[daemon]
    /// maglev_table_size`: the last one asked for.
    chunks: Mutex<Option<(Option<u32>, usize)>>,
}

/// A file's index, made at its first merge and kept with the parse. It
/// is derived from the file: two files compare equal whatever their
/// cells hold, and a copy starts empty.
#[derive(Default)]
pub(crate) struct IndexCell(OnceLock<FileIndex>);

impl std::fmt::Debug for IndexCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() { "IndexCell(built)" } else { "IndexCell(empty)" })
    }
}

impl Clone for IndexCell {
    fn clone(&self) -> Self {
        IndexCell::default()
    }
}

impl PartialEq for IndexCell {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for IndexCell {}

/// One hash of names for every index of the process: two files' indexes
/// are looked up with each other's names.
fn name_hash(name: &str) -> u64 {
    use std::hash::BuildHasher;
    static STATE: OnceLock<RandomState> = OnceLock::new();
    STATE.get_or_init(RandomState::default).hash_one(name)
}

fn index_of(f: &FileConfig) -> &FileIndex {
    f.index.0.get_or_init(|| FileIndex::build(f))
}

impl FileIndex {
    fn build(f: &FileConfig) -> FileIndex {
        let mut ix = FileIndex {
            names: Kind::ALL.map(|k| HashTable::with_capacity(k.count(f))),
            services: HashMap::with_capacity_and_hasher(f.services.len(), RandomState::default()),
            meshes: HashMap::with_capacity_and_hasher(f.meshes.len(), RandomState::default()),
            node_ports: HashMap::default(),
            backends: HashSet::with_capacity_and_hasher(f.services.len(), RandomState::default()),
            repeats: Vec::new(),
            service_entries: f.services.len()
                + f.services
                    .iter()
                    .map(|s| usize::from(s.node_port.is_some()) + usize::from(s.external))
                    .sum::<usize>(),
            chunks: Mutex::new(None),
        };
        for (i, s) in f.services.iter().enumerate() {
            let i = i as u32;
            ix.add_name(f, Kind::Service, i);
            add_key(&mut ix.services, &mut ix.repeats, (s.vip, s.port, s.protocol), Claimed::Service, i);
            if let Some(port) = s.node_port {
                add_key(&mut ix.node_ports, &mut ix.repeats, (port, s.protocol, s.vip.is_ipv6()), Claimed::NodePort, i);
            }
            ix.backends.extend(s.backends.iter().map(|b| b.addr));
        }
        for (i, m) in f.meshes.iter().enumerate() {
            let i = i as u32;
            ix.add_name(f, Kind::Mesh, i);
            add_key(&mut ix.meshes, &mut ix.repeats, (m.vip, m.port, m.protocol), Claimed::Mesh, i);
        }
        for kind in [Kind::Peer, Kind::Member] {
            for i in 0..kind.count(f) as u32 {
                ix.add_name(f, kind, i);
            }
        }
        ix
    }

    fn add_name(&mut self, f: &FileConfig, kind: Kind, i: u32) {
        let name = kind.object(f, i).0;
        let h = name_hash(name);
        let table = &mut self.names[kind as usize];
        match table.find(h, |&j| kind.object(f, j).0 == name) {
            Some(&first) => self.repeats.push(Repeat { what: Claimed::Name(kind), idx: i, first }),
            None => {
                table.insert_unique(h, i, |&j| name_hash(kind.object(f, j).0));
            }
        }
    }

    /// The object of `f` (this index's file) named `name`.
    fn find_name(&self, f: &FileConfig, kind: Kind, name: &str) -> Option<u32> {
        self.names[kind as usize].find(name_hash(name), |&j| kind.object(f, j).0 == name).copied()
    }

    /// The HM_MAGLEV chunks the file's services take.
    fn chunks(&self, f: &FileConfig, default: Option<u32>) -> usize {
        let mut cached = self.chunks.lock().unwrap_or_else(|e| e.into_inner());
        match *cached {
            Some((d, n)) if d == default => n,
            _ => {
                let n = f.services.iter().map(|s| service_chunks(s.maglev_table_size, default, s.backends.len())).sum();
                *cached = Some((default, n));
                n
            }
        }
    }
}

fn add_key<K: std::hash::Hash + Eq>(
    map: &mut HashMap<K, u32>,
    repeats: &mut Vec<Repeat>,
    key: K,
    what: Claimed,
    i: u32,
) {
    match map.entry(key) {
        std::collections::hash_map::Entry::Occupied(e) => repeats.push(Repeat { what, idx: i, first: *e.get() }),
        std::collections::hash_map::Entry::Vacant(v) => {
            v.insert(i);
        }
    }
}

/// The keys two indexes share: (this one's object, the other's), from
/// the smaller of the two.
fn shared<'m, K: std::hash::Hash + Eq>(
    mine: &'m HashMap<K, u32>,
    theirs: &'m HashMap<K, u32>,
) -> Box<dyn Iterator<Item = (&'m K, u32, u32)> + 'm> {
    if mine.len() <= theirs.len() {
        Box::new(mine.iter().filter_map(|(k, &i)| theirs.get(k).map(|&j| (k, i, j))))
    } else {
        Box::new(theirs.iter().filter_map(|(k, &j)| mine.get(k).map(|&i| (k, i, j))))
    }
}

fn conflict(origin: &Origin, key: &str, message: String) -> ConfigError {
    ConfigError {
        file: origin.file.to_path_buf(),
        line: origin.line,
        column: origin.column,
        key: Some(key.to_string()),
        message,
    }
}

/// What a full map holds and how to make room, for the capacity messages.
fn capacity_text(c: Capacity, n: u32) -> String {
    let (map, also) = match c {
        Capacity::Mesh => ("mesh", ""),
        Capacity::MaglevChunks => ("Maglev", ", or use a smaller maglev_table_size"),
        Capacity::Services => ("service", ""),
        Capacity::Backends => ("backend", ""),
        Capacity::Conntrack => ("conntrack", ""),
        Capacity::ReverseSock => ("reverse-socket", ""),
        Capacity::Affinity => ("affinity", ""),
    };
    format!("the {map} map holds {n} (raise [daemon] {}{also})", c.key().key)
}

fn port_text(port: u16) -> String {
    if port == 0 {
        "every port".to_string()
    } else {
        format!("port {port}")
    }
}

/// The message of claim `what` of object `idx` of `f`, taken first by
/// object `other` of `of` (`f` itself for a repeat).
fn taken_error(f: &FileConfig, what: Claimed, idx: u32, of: &FileConfig, other: u32) -> ConfigError {
    match what {
        Claimed::Name(kind) => {
            let (name, origin) = kind.object(f, idx);
            let first = kind.object(of, other).1;
            conflict(origin, "name", format!("{} name \"{name}\" is already used at {first}", kind.text()))
        }
        Claimed::Service => {
            let (s, o) = (&f.services[idx as usize], &of.services[other as usize]);
            conflict(
                &s.origin,
                "vip",
                format!(
                    "service \"{}\": vip {} {}/{} is already used by service \"{}\" at {}",
                    s.name,
                    s.vip,
                    port_text(s.port),
                    s.protocol,
                    o.name,
                    o.origin
                ),
            )
        }
        Claimed::Mesh => {
            let (m, o) = (&f.meshes[idx as usize], &of.meshes[other as usize]);
            conflict(
                &m.origin,
                "vip",
                format!(
                    "mesh \"{}\": vip {} {}/{} is already used by mesh \"{}\" at {}",
                    m.name,
                    m.vip,
                    port_text(m.port),
                    m.protocol,
                    o.name,
                    o.origin
                ),
            )
        }
        Claimed::NodePort => {
            let (s, o) = (&f.services[idx as usize], &of.services[other as usize]);
            let family = if s.vip.is_ipv6() { "IPv6" } else { "IPv4" };
            conflict(
                &s.origin,
                "node_port",
                format!(
                    "service \"{}\": node_port {}/{} ({family}) is already used by service \"{}\" at {}",
                    s.name,
                    s.node_port.unwrap_or_default(),
                    s.protocol,
                    o.name,
                    o.origin
                ),
            )
        }
    }
}

/// The files accepted so far, in order, and what they take together.
struct Merge<'a> {
    limits: Limits,
    accepted: Vec<&'a FileConfig>,
    daemon: Option<&'a Origin>,
    gateway: Option<&'a Origin>,
    /// Capacity: service map entries, mesh entries and Maglev chunks in
    /// force, and the distinct backend addresses.
    service_count: usize,
    mesh_count: usize,
    chunk_count: usize,
    backend_count: usize,
}

impl<'a> Merge<'a> {
    fn new(limits: Limits) -> Self {
        Merge {
            limits,
            accepted: Vec::new(),
            daemon: None,
            gateway: None,
            service_count: 0,
            mesh_count: 0,
            chunk_count: 0,
            backend_count: 0,
        }
    }

    /// Accepts `f` if it fits beside the files accepted so far; else
    /// returns why not.
    fn try_add(&mut self, f: &'a FileConfig) -> Vec<ConfigError> {
        let ix = index_of(f);
        let (chunks, new_backends) = match self.over_capacity(f, ix) {
            Ok(counts) => counts,
            Err(e) => return vec![e],
        };
        let errors = self.conflicts(f, ix);
        if errors.is_empty() {
            if let Some(origin) = f.daemon.as_ref().and_then(|d| d.origin.as_ref()) {
                self.daemon = Some(origin);
            }
            if let Some(g) = &f.gateway {
                self.gateway = Some(&g.origin);
            }
            self.service_count += ix.service_entries;
            self.mesh_count += f.meshes.len();
            self.chunk_count += chunks;
            self.backend_count += new_backends;
            self.accepted.push(f);
        }
        errors
    }

    /// Every claim of `f` that an accepted file made first, that `f`
    /// repeats, or that is out of range, in the file's claim order.
    fn conflicts(&self, f: &FileConfig, ix: &FileIndex) -> Vec<ConfigError> {
        let mut errors: Vec<((u8, u32, u8), ConfigError)> = Vec::new();
        if let (Some(origin), Some(first)) = (f.daemon.as_ref().and_then(|d| d.origin.as_ref()), self.daemon) {
            let message = format!("[daemon] is already declared at {first}; only one file may have it");
            errors.push(((0, 0, 0), conflict(origin, "daemon", message)));
        }
        if let (Some(g), Some(first)) = (&f.gateway, self.gateway) {
            let message = format!("[gateway] is already declared at {first}; only one file may have it");
            errors.push(((1, 0, 0), conflict(&g.origin, "gateway", message)));
        }
        // A node port outside the range is only that: it claims nothing.
        let range = self.limits.node_port_range;
        let mut out_of_range = HashSet::default();
        let outside = |i: u32, port: u16| {
            let s = &f.services[i as usize];
            let message =
                format!("service \"{}\": node_port {port} is outside [daemon] node_port_range {range}", s.name);
            (Claimed::NodePort.order(i), conflict(&s.origin, "node_port", message))
        };
        for (&(port, ..), &i) in ix.node_ports.iter().filter(|((port, ..), _)| !range.contains(*port)) {
            out_of_range.insert(port);
            errors.push(outside(i, port));
        }
        // Claims an accepted file made first: (what, object of f) -> (that
        // file, its object).
        let mut taken: HashMap<(Claimed, u32), (&FileConfig, u32)> = HashMap::default();
        for &other in &self.accepted {
            let theirs = index_of(other);
            for kind in Kind::ALL {
                let (mine_n, theirs_n) = (ix.names[kind as usize].len(), theirs.names[kind as usize].len());
                if mine_n <= theirs_n {
                    for &i in &ix.names[kind as usize] {
                        if let Some(j) = theirs.find_name(other, kind, kind.object(f, i).0) {
                            taken.insert((Claimed::Name(kind), i), (other, j));
                        }
                    }
                } else {
                    for &j in &theirs.names[kind as usize] {
                        if let Some(i) = ix.find_name(f, kind, kind.object(other, j).0) {
                            taken.insert((Claimed::Name(kind), i), (other, j));
                        }
                    }
                }
            }
            for (_, i, j) in shared(&ix.services, &theirs.services) {
                taken.insert((Claimed::Service, i), (other, j));
            }
            for (_, i, j) in shared(&ix.meshes, &theirs.meshes) {
                taken.insert((Claimed::Mesh, i), (other, j));
            }
            for ((port, ..), i, j) in shared(&ix.node_ports, &theirs.node_ports) {
                if !out_of_range.contains(port) {
                    taken.insert((Claimed::NodePort, i), (other, j));
                }
            }
        }
        for (&(what, i), &(of, j)) in &taken {
            errors.push((what.order(i), taken_error(f, what, i, of, j)));
        }
        for r in &ix.repeats {
            if r.what == Claimed::NodePort {
                if let Some(port) = f.services[r.idx as usize].node_port.filter(|p| !range.contains(*p)) {
                    errors.push(outside(r.idx, port));
                    continue;
                }
            }
            // A repeat of a claim another file made first is that file's
            // too: the first claim never took it.
            let (of, first) = taken.get(&(r.what, r.first)).copied().unwrap_or((f, r.first));
            errors.push((r.what.order(r.idx), taken_error(f, r.what, r.idx, of, first)));
        }
        errors.sort_by_key(|(order, _)| *order);
        errors.into_iter().map(|(_, e)| e).collect()
    }

    /// The file that would overflow the mesh, Maglev, service or backend
    /// map is rejected, and the files before it stay in force. Returns
    /// the file's Maglev chunks and the backend addresses it adds.
    fn over_capacity(&self, f: &FileConfig, ix: &FileIndex) -> Result<(usize, usize), ConfigError> {
        let sizes = &self.limits.sizes;
        let over = |origin: &Origin, key: &str, total: usize, capacity: u32, what: String, raise: Capacity| {
            if total > capacity as usize {
                Err(conflict(origin, key, format!("{what}; {}", capacity_text(raise, capacity))))
            } else {
                Ok(())
            }
        };
        if let Some(first) = f.meshes.first() {
            let meshes = self.mesh_count + f.meshes.len();
            let what = format!("this file's {} mesh entries would make {meshes} in all", f.meshes.len());
            over(&first.origin, "mesh", meshes, sizes.mesh, what, Capacity::Mesh)?;
        }
        let Some(first) = f.services.first() else { return Ok((0, 0)) };
        let own_chunks = ix.chunks(f, self.limits.maglev_table_size);
        let chunks = self.chunk_count + own_chunks;
        let what = format!("this file's Maglev tables would make {chunks} chunks of {MAGLEV_CHUNK} slots in all");
        over(&first.origin, "service", chunks, sizes.maglev_chunks, what, Capacity::MaglevChunks)?;
        // A node port is an entry of the service map of its own.
        let services = self.service_count + ix.service_entries;
        let what = format!("this file's {} services would make {services} in all", f.services.len());
        over(&first.origin, "service", services, sizes.services, what, Capacity::Services)?;
        let new = self.new_backends(ix);
        let backends = self.backend_count + new;
        let what = format!("this file's backends would make {backends} distinct backend addresses in all");
        over(&first.origin, "backends", backends, sizes.backends, what, Capacity::Backends)?;
        Ok((own_chunks, new))
    }

    /// The backend addresses of `ix`'s file that no accepted file has,
    /// counted from the smaller side.
    fn new_backends(&self, ix: &FileIndex) -> usize {
        let earlier: usize = self.accepted.iter().map(|f| index_of(f).backends.len()).sum();
        if earlier <= ix.backends.len() {
            let mut seen = HashSet::with_capacity_and_hasher(earlier, RandomState::default());
            let known = self
                .accepted
                .iter()
                .flat_map(|f| &index_of(f).backends)
                .filter(|a| seen.insert(**a) && ix.backends.contains(*a))
                .count();
            ix.backends.len() - known
        } else {
            ix.backends.iter().filter(|a| !self.accepted.iter().any(|f| index_of(f).backends.contains(*a))).count()
        }
    }
}

/// Merges files (in the given order), each offering versions in order of
/// preference. Returns the configuration in force and, per file, which
/// version was used.
pub(super) fn merge<'a>(files: &'a [(PathBuf, Vec<&'a FileConfig>)]) -> (Config, Vec<MergedFile>) {
    // The capacity checks need the [daemon] section in force, which only
    // the merge decides: start from the first one offered, and merge again
    // in the rare case that the section in force turned out to be another
    // (its file rejected). Each pass changes which section is in force only
    // by rejecting files, so a few passes settle it.
    let mut limits = first_daemon(files).map_or_else(Limits::default, Limits::of);
    let mut tried = Vec::new();
    loop {
        let (config, report) = merge_with(files, limits);
        let in_force = Limits::of(&config.daemon);
        if in_force == limits || tried.contains(&in_force) || tried.len() >= 3 {
            return (config, report);
        }
        tried.push(limits);
        limits = in_force;
    }
}

/// What of the [daemon] section the capacity checks need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Limits {
    sizes: MapSizes,
    maglev_table_size: Option<u32>,
    node_port_range: PortRange,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits::of(&DaemonSettings::default())
    }
}

impl Limits {
    fn of(d: &DaemonSettings) -> Limits {
        Limits { sizes: d.sizes, maglev_table_size: d.maglev_table_size, node_port_range: d.node_port_range }
    }
}

/// The [daemon] section the merge would most likely keep: the preferred
/// version of the first file offering one.
fn first_daemon<'a>(files: &'a [(PathBuf, Vec<&FileConfig>)]) -> Option<&'a DaemonSettings> {
    files.iter().find_map(|(_, versions)| versions.iter().find_map(|v| v.daemon.as_ref()))
}

fn merge_with<'a>(files: &'a [(PathBuf, Vec<&'a FileConfig>)], limits: Limits) -> (Config, Vec<MergedFile>) {
    let mut merge = Merge::new(limits);
    let mut config = Config::default();
    let mut report = Vec::new();
    for (_path, versions) in files {
        let mut accepted = None;
        let mut first_conflicts = Vec::new();
        for (i, version) in versions.iter().enumerate() {
            let errors = merge.try_add(version);
            if errors.is_empty() {
                accepted = Some(i);
                break;
            }
            if i == 0 {
                first_conflicts = errors;
            }
        }
        report.push(MergedFile { accepted, conflicts: first_conflicts });
    }
    // Sized once: 100,000 services are not moved again and again.
    config.services.reserve_exact(merge.accepted.iter().map(|f| f.services.len()).sum());
    for f in &merge.accepted {
        append(&mut config, f);
    }
    (config, report)
}

fn append(config: &mut Config, f: &FileConfig) {
    if let Some(d) = &f.daemon {
        config.daemon = d.clone();
    }
    if let Some(g) = &f.gateway {
        config.gateway = Some(g.clone());
    }
    config.services.extend(f.services.iter().cloned());
    config.meshes.extend(f.meshes.iter().cloned());
    config.peers.extend(f.peers.iter().cloned());
    config.members.extend(f.members.iter().cloned());
}

#[cfg(test)]
#[path = "merge_tests.rs"]
mod tests;
