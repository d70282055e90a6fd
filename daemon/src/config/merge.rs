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
//! Each file's claims are indexed once per parse (`file_index`, kept with
//! the parse, so a file read again unchanged keeps it). A file is checked
//! against each file accepted before it, iterating the smaller index of
//! the two and looking up in the larger: a load that changed a small file
//! beside one of 100,000 services costs what the small file holds.

use std::path::PathBuf;

use foldhash::quality::RandomState;

type HashMap<K, V> = std::collections::HashMap<K, V, RandomState>;
type HashSet<T> = std::collections::HashSet<T, RandomState>;

use super::capacity::{Capacity, MapSizes};
use super::error::{ConfigError, Origin};
use super::file_index::{index_of, shared, Claimed, FileIndex, Kind};
use super::types::*;
use crate::abi::MAGLEV_CHUNK;

/// The outcome for one file: which of its offered versions is in force
/// (if any), and why the preferred one was not.
#[derive(Debug)]
pub(super) struct MergedFile {
    pub accepted: Option<usize>,
    pub conflicts: Vec<ConfigError>,
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
            for (i, j) in ix.shared_services(f, theirs, other) {
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
        let new = self.new_backends(f, ix);
        let backends = self.backend_count + new;
        let what = format!("this file's backends would make {backends} distinct backend addresses in all");
        over(&first.origin, "backends", backends, sizes.backends, what, Capacity::Backends)?;
        Ok((own_chunks, new))
    }

    /// The backend addresses of `ix`'s file that no accepted file has,
    /// counted from the smaller side.
    fn new_backends(&self, f: &FileConfig, ix: &FileIndex) -> usize {
        let earlier: usize = self.accepted.iter().map(|a| index_of(a).backends.len()).sum();
        if earlier <= ix.backends.len() {
            let mut seen = HashSet::with_capacity_and_hasher(earlier, RandomState::default());
            let known = self
                .accepted
                .iter()
                .flat_map(|a| index_of(a).backends.iter(a))
                .filter(|b| seen.insert(*b) && ix.backends.contains(f, b))
                .count();
            ix.backends.len() - known
        } else {
            ix.backends.iter(f).filter(|b| !self.accepted.iter().any(|a| index_of(a).backends.contains(a, b))).count()
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
