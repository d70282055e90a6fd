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

use foldhash::quality::RandomState;

/// The registry's maps: hashed with foldhash (seeded per process), several
/// times cheaper than SipHash on 100,000 names and addresses per load.
type HashMap<K, V> = std::collections::HashMap<K, V, RandomState>;
type HashSet<T> = std::collections::HashSet<T, RandomState>;
use std::net::IpAddr;
use std::path::PathBuf;

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

/// What the files merged so far claim, borrowed from them (a merge of
/// 100,000 services copies none of their names).
#[derive(Default)]
struct Registry<'a> {
    names: HashMap<(&'static str, &'a str), &'a Origin>,
    services: HashMap<(IpAddr, u16, Protocol), (&'a str, &'a Origin)>,
    meshes: HashMap<(IpAddr, u16, Protocol), (&'a str, &'a Origin)>,
    /// (node port, protocol, IPv6): a node port answers on the addresses
    /// of its service's family.
    node_ports: HashMap<(u16, Protocol, bool), (&'a str, &'a Origin)>,
    daemon: Option<&'a Origin>,
    gateway: Option<&'a Origin>,
    /// The capacities of the [daemon] section in force.
    limits: Limits,
    /// Capacity: services, mesh entries and Maglev chunks in force, and
    /// the distinct backend addresses.
    service_count: usize,
    mesh_count: usize,
    chunk_count: usize,
    backends: HashSet<std::net::SocketAddr>,
}

/// One claim a file makes on something that must be unique.
enum Claim<'a> {
    Name(&'static str, &'a str, &'a Origin),
    Service((IpAddr, u16, Protocol), &'a str, &'a Origin),
    Mesh((IpAddr, u16, Protocol), &'a str, &'a Origin),
    NodePort((u16, Protocol, bool), &'a str, &'a Origin),
    Daemon(&'a Origin),
    Gateway(&'a Origin),
}

fn claims(f: &FileConfig) -> Vec<Claim<'_>> {
    let mut out = Vec::with_capacity(2 * (f.services.len() + f.meshes.len()) + f.peers.len() + f.members.len() + 2);
    if let Some(origin) = f.daemon.as_ref().and_then(|d| d.origin.as_ref()) {
        out.push(Claim::Daemon(origin));
    }
    if let Some(g) = &f.gateway {
        out.push(Claim::Gateway(&g.origin));
    }
    for s in &f.services {
        out.push(Claim::Name("service", &s.name, &s.origin));
        out.push(Claim::Service((s.vip, s.port, s.protocol), &s.name, &s.origin));
        if let Some(port) = s.node_port {
            out.push(Claim::NodePort((port, s.protocol, s.vip.is_ipv6()), &s.name, &s.origin));
        }
    }
    for m in &f.meshes {
        out.push(Claim::Name("mesh", &m.name, &m.origin));
        out.push(Claim::Mesh((m.vip, m.port, m.protocol), &m.name, &m.origin));
    }
    for p in &f.peers {
        out.push(Claim::Name("peer", &p.name, &p.origin));
    }
    for m in &f.members {
        out.push(Claim::Name("member", &m.name, &m.origin));
    }
    out
}

/// The service map entries a file's services take: one each, and one
/// more for a node port and for an external VIP.
fn service_entries(f: &FileConfig) -> usize {
    f.services.len()
        + f.services.iter().map(|s| usize::from(s.node_port.is_some()) + usize::from(s.external)).sum::<usize>()
}

fn conflict(origin: &Origin, key: &str, message: String) -> ConfigError {
    ConfigError {
        file: origin.file.clone(),
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

impl<'a> Registry<'a> {
    /// Adds every claim of `f`, or none of them and returns why.
    fn try_add(&mut self, f: &'a FileConfig) -> Vec<ConfigError> {
        let chunks = match self.over_capacity(f) {
            Ok(chunks) => chunks,
            Err(e) => return vec![e],
        };
        let claims = claims(f);
        let mut errors = Vec::new();
        let mut added = Vec::new();
        for claim in claims {
            match self.check_and_insert(&claim) {
                Ok(()) => added.push(claim),
                Err(e) => errors.push(e),
            }
        }
        if !errors.is_empty() {
            for claim in added {
                self.remove(&claim);
            }
        } else {
            self.service_count += service_entries(f);
            self.mesh_count += f.meshes.len();
            self.chunk_count += chunks;
            self.backends.extend(f.services.iter().flat_map(|s| &s.backends).map(|b| b.addr));
        }
        errors
    }

    /// The file that would overflow the mesh, Maglev, service or backend
    /// map is rejected, and the files before it stay in force. Returns
    /// the file's Maglev chunks, for `try_add` to count.
    fn over_capacity(&self, f: &FileConfig) -> Result<usize, ConfigError> {
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
        let Some(first) = f.services.first() else { return Ok(0) };
        let own_chunks = self.chunks_of(f);
        let chunks = self.chunk_count + own_chunks;
        let what = format!("this file's Maglev tables would make {chunks} chunks of {MAGLEV_CHUNK} slots in all");
        over(&first.origin, "service", chunks, sizes.maglev_chunks, what, Capacity::MaglevChunks)?;
        // A node port is an entry of the service map of its own.
        let services = self.service_count + service_entries(f);
        let what = format!("this file's {} services would make {services} in all", f.services.len());
        over(&first.origin, "service", services, sizes.services, what, Capacity::Services)?;
        let new: HashSet<_> = f
            .services
            .iter()
            .flat_map(|s| &s.backends)
            .map(|b| b.addr)
            .filter(|a| !self.backends.contains(a))
            .collect();
        let backends = self.backends.len() + new.len();
        let what = format!("this file's backends would make {backends} distinct backend addresses in all");
        over(&first.origin, "backends", backends, sizes.backends, what, Capacity::Backends)?;
        Ok(own_chunks)
    }

    /// The HM_MAGLEV chunks a file's services take.
    fn chunks_of(&self, f: &FileConfig) -> usize {
        f.services
            .iter()
            .map(|s| service_chunks(s.maglev_table_size, self.limits.maglev_table_size, s.backends.len()))
            .sum()
    }

    fn check_and_insert(&mut self, claim: &Claim<'a>) -> Result<(), ConfigError> {
        match claim {
            Claim::Name(kind, name, origin) => {
                if let Some(first) = self.names.get(&(*kind, *name)) {
                    return Err(conflict(origin, "name", format!("{kind} name \"{name}\" is already used at {first}")));
                }
                self.names.insert((*kind, name), origin);
            }
            Claim::Service(key, name, origin) => {
                if let Some((other, at)) = self.services.get(key) {
                    return Err(conflict(
                        origin,
                        "vip",
                        format!(
                            "service \"{name}\": vip {} {}/{} is already used by service \"{other}\" at {at}",
                            key.0,
                            port_text(key.1),
                            key.2
                        ),
                    ));
                }
                self.services.insert(*key, (name, origin));
            }
            Claim::NodePort(key, name, origin) => self.claim_node_port(*key, name, origin)?,
            Claim::Mesh(key, name, origin) => {
                if let Some((other, at)) = self.meshes.get(key) {
                    return Err(conflict(
                        origin,
                        "vip",
                        format!(
                            "mesh \"{name}\": vip {} {}/{} is already used by mesh \"{other}\" at {at}",
                            key.0,
                            port_text(key.1),
                            key.2
                        ),
                    ));
                }
                self.meshes.insert(*key, (name, origin));
            }
            Claim::Daemon(origin) => {
                if let Some(first) = self.daemon {
                    return Err(conflict(
                        origin,
                        "daemon",
                        format!("[daemon] is already declared at {first}; only one file may have it"),
                    ));
                }
                self.daemon = Some(origin);
            }
            Claim::Gateway(origin) => {
                if let Some(first) = self.gateway {
                    return Err(conflict(
                        origin,
                        "gateway",
                        format!("[gateway] is already declared at {first}; only one file may have it"),
                    ));
                }
                self.gateway = Some(origin);
            }
        }
        Ok(())
    }

    /// A node port: inside the range, and one service's per protocol and
    /// family.
    fn claim_node_port(
        &mut self,
        key: (u16, Protocol, bool),
        name: &'a str,
        origin: &'a Origin,
    ) -> Result<(), ConfigError> {
        let range = self.limits.node_port_range;
        if !range.contains(key.0) {
            return Err(conflict(
                origin,
                "node_port",
                format!("service \"{name}\": node_port {} is outside [daemon] node_port_range {range}", key.0),
            ));
        }
        if let Some((other, at)) = self.node_ports.get(&key) {
            let family = if key.2 { "IPv6" } else { "IPv4" };
            return Err(conflict(
                origin,
                "node_port",
                format!(
                    "service \"{name}\": node_port {}/{} ({family}) is already used by service \"{other}\" at {at}",
                    key.0, key.1
                ),
            ));
        }
        self.node_ports.insert(key, (name, origin));
        Ok(())
    }

    fn remove(&mut self, claim: &Claim<'a>) {
        match claim {
            Claim::Name(kind, name, _) => {
                self.names.remove(&(*kind, *name));
            }
            Claim::Service(key, ..) => {
                self.services.remove(key);
            }
            Claim::Mesh(key, ..) => {
                self.meshes.remove(key);
            }
            Claim::NodePort(key, ..) => {
                self.node_ports.remove(key);
            }
            Claim::Daemon(_) => self.daemon = None,
            Claim::Gateway(_) => self.gateway = None,
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
    // Sized once for every file's objects: growing maps of 100,000 names
    // rehash them again and again.
    let (services, meshes) = files
        .iter()
        .filter_map(|(_, v)| v.first())
        .fold((0, 0), |(s, m), f| (s + f.services.len(), m + f.meshes.len()));
    let mut registry = Registry {
        limits,
        names: HashMap::with_capacity_and_hasher(services + meshes, RandomState::default()),
        services: HashMap::with_capacity_and_hasher(services, RandomState::default()),
        meshes: HashMap::with_capacity_and_hasher(meshes, RandomState::default()),
        backends: HashSet::with_capacity_and_hasher(services, RandomState::default()),
        ..Registry::default()
    };
    let mut config = Config::default();
    let mut report = Vec::new();
    for (_path, versions) in files {
        let mut accepted = None;
        let mut first_conflicts = Vec::new();
        for (i, version) in versions.iter().enumerate() {
            let errors = registry.try_add(version);
            if errors.is_empty() {
                accepted = Some(i);
                append(&mut config, version);
                break;
            }
            if i == 0 {
                first_conflicts = errors;
            }
        }
        report.push(MergedFile { accepted, conflicts: first_conflicts });
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
