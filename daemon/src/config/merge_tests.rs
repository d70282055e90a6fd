//! The indexed merge against the sequential one it replaced (every claim
//! inserted into one registry, file after file): the same versions in
//! force and the same errors, in the same order, for files whose names,
//! keys and node ports collide within and across files; and the index of
//! an unchanged file is built once.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::config::file_index::{Key, PortKey};
use crate::config::{parse_file, Source};

/// The sequential merge: each claim checked against, and inserted into,
/// one registry of owned keys, node ports checked against the range of
/// the [daemon] section in force. Capacities are left out (the generated
/// files stay far below them).
fn sequential(files: &[(PathBuf, Vec<&FileConfig>)], range: PortRange) -> Vec<(Option<usize>, Vec<String>)> {
    let mut names: HashMap<(&str, String), String> = HashMap::new();
    let mut services: HashMap<Key, (String, String)> = HashMap::new();
    let mut meshes: HashMap<Key, (String, String)> = HashMap::new();
    let mut node_ports: HashMap<PortKey, (String, String)> = HashMap::new();
    let (mut daemon, mut gateway): (Option<String>, Option<String>) = (None, None);
    let mut out = Vec::new();
    for (_, versions) in files {
        let mut accepted = None;
        let mut first_errors = Vec::new();
        for (v, f) in versions.iter().enumerate() {
            let mut errors = Vec::new();
            // Registries as they were before this version, to undo it.
            let saved =
                (names.clone(), services.clone(), meshes.clone(), node_ports.clone(), daemon.clone(), gateway.clone());
            if let Some(o) = f.daemon.as_ref().and_then(|d| d.origin.as_ref()) {
                match &daemon {
                    Some(first) => errors.push(format!("{o}: [daemon] is already declared at {first}")),
                    None => daemon = Some(o.to_string()),
                }
            }
            if let Some(g) = &f.gateway {
                match &gateway {
                    Some(first) => errors.push(format!("{}: [gateway] is already declared at {first}", g.origin)),
                    None => gateway = Some(g.origin.to_string()),
                }
            }
            let mut name = |kind: &'static str, n: &str, o: &Origin, errors: &mut Vec<String>| match names
                .get(&(kind, n.to_string()))
            {
                Some(first) => errors.push(format!("{o}: {kind} name \"{n}\" is already used at {first}")),
                None => {
                    names.insert((kind, n.to_string()), o.to_string());
                }
            };
            for s in &f.services {
                name("service", &s.name, &s.origin, &mut errors);
                match services.get(&(s.vip, s.port, s.protocol)) {
                    Some((other, at)) => {
                        errors.push(format!("{}: service {} vip taken by {other} at {at}", s.origin, s.name))
                    }
                    None => {
                        services.insert((s.vip, s.port, s.protocol), (s.name.clone(), s.origin.to_string()));
                    }
                }
                if let Some(port) = s.node_port {
                    let key = (port, s.protocol, s.vip.is_ipv6());
                    if !range.contains(port) {
                        errors.push(format!("{}: service {} node_port {port} out of range", s.origin, s.name));
                    } else if let Some((other, at)) = node_ports.get(&key) {
                        errors.push(format!("{}: service {} node_port taken by {other} at {at}", s.origin, s.name));
                    } else {
                        node_ports.insert(key, (s.name.clone(), s.origin.to_string()));
                    }
                }
            }
            for m in &f.meshes {
                name("mesh", &m.name, &m.origin, &mut errors);
                match meshes.get(&(m.vip, m.port, m.protocol)) {
                    Some((other, at)) => {
                        errors.push(format!("{}: mesh {} vip taken by {other} at {at}", m.origin, m.name))
                    }
                    None => {
                        meshes.insert((m.vip, m.port, m.protocol), (m.name.clone(), m.origin.to_string()));
                    }
                }
            }
            if errors.is_empty() {
                accepted = Some(v);
                break;
            }
            (names, services, meshes, node_ports, daemon, gateway) = saved;
            if v == 0 {
                first_errors = errors;
            }
        }
        out.push((accepted, first_errors));
    }
    out
}

/// `sequential` under the node port range of the [daemon] section in
/// force, found as `merge` finds it: from the first one offered, merged
/// again while the one in force turns out to be another.
fn sequential_settled(files: &[(PathBuf, Vec<&FileConfig>)]) -> Vec<(Option<usize>, Vec<String>)> {
    let of =
        |d: Option<&DaemonSettings>| d.map_or_else(|| DaemonSettings::default().node_port_range, |d| d.node_port_range);
    let mut range = of(first_daemon(files));
    let mut tried = Vec::new();
    loop {
        let out = sequential(files, range);
        let in_force =
            of(files.iter().zip(&out).filter_map(|((_, v), (a, _))| a.and_then(|a| v[a].daemon.as_ref())).next_back());
        if in_force == range || tried.contains(&in_force) || tried.len() >= 3 {
            return out;
        }
        tried.push(range);
        range = in_force;
    }
}

/// The indexed merge's errors in the sequential one's words.
fn reworded(e: &ConfigError) -> String {
    let at = format!("{}:{}:{}", e.file.file_name().unwrap().to_string_lossy(), e.line, e.column);
    let m = &e.message;
    let quoted = |s: &str| s.split('"').nth(1).unwrap_or_default().to_string();
    let after_at = |s: &str| s.rsplit(" at ").next().unwrap_or_default().to_string();
    if m.starts_with("[daemon]") || m.starts_with("[gateway]") {
        format!("{at}: {}", m.split(';').next().unwrap())
    } else if m.contains(" name \"") {
        format!("{at}: {m}")
    } else if m.contains("node_port_range") {
        let port = m.split("node_port ").nth(1).unwrap().split(' ').next().unwrap().to_string();
        format!("{at}: service {} node_port {port} out of range", quoted(m))
    } else {
        let kind = if m.starts_with("mesh") { "mesh" } else { "service" };
        let what = if m.contains("node_port") { "node_port" } else { "vip" };
        let other = m.rsplit("by ").next().unwrap().split(' ').nth(1).unwrap_or_default();
        format!("{at}: {kind} {} {what} taken by {} at {}", quoted(m), other.trim_matches('"'), after_at(m))
    }
}

/// An object as the fuzzer makes it: name, VIP, port, node port, mesh.
type Obj = (u8, u8, u8, Option<u16>, bool);

fn text(objects: &[Obj], daemon: bool, name_base: u8) -> String {
    let mut t = String::new();
    if daemon {
        t.push_str("[daemon]\nnode_port_range = \"30000-30010\"\n");
    }
    for &(name, vip, port, node_port, mesh) in objects {
        let name = name % 6 + name_base;
        if mesh {
            t.push_str(&format!(
                "[[mesh]]\nname = \"m{name}\"\nvip = \"10.0.0.{vip}\"\nport = {}\nredirect_port = 15001\n",
                80 + u16::from(port)
            ));
        } else {
            t.push_str(&format!(
                "[[service]]\nname = \"s{name}\"\nvip = \"10.0.0.{vip}\"\nport = {}\n",
                80 + u16::from(port)
            ));
            if let Some(p) = node_port {
                t.push_str(&format!("node_port = {p}\n"));
            }
        }
    }
    t
}

fn object() -> impl Strategy<Value = Obj> {
    (
        0u8..6,
        1u8..4,
        0u8..2,
        prop::option::weighted(0.3, prop::sample::select(vec![30001u16, 30002, 30020])),
        prop::bool::weighted(0.2),
    )
}

/// A file: its new text and maybe a last good one.
fn file() -> impl Strategy<Value = (Vec<Obj>, bool, Option<Vec<Obj>>)> {
    (
        prop::collection::vec(object(), 0..6),
        prop::bool::weighted(0.2),
        prop::option::weighted(0.3, prop::collection::vec(object(), 0..4)),
    )
}

fn parse(path: &Path, text: &str) -> Option<FileConfig> {
    parse_file(&Source::new(path, text)).ok()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn the_indexed_merge_is_the_sequential_one(files in prop::collection::vec(file(), 1..6)) {
        let mut parsed: Vec<(PathBuf, Vec<FileConfig>)> = Vec::new();
        for (n, (new, daemon, old)) in files.iter().enumerate() {
            let path = PathBuf::from(format!("/etc/hostmesh/{n}.toml"));
            let mut versions = Vec::new();
            versions.extend(parse(&path, &text(new, *daemon, 0)));
            if let Some(old) = old {
                versions.extend(parse(&path, &text(old, false, 3)));
            }
            parsed.push((path, versions));
        }
        let offers: Vec<(PathBuf, Vec<&FileConfig>)> =
            parsed.iter().map(|(p, v)| (p.clone(), v.iter().collect())).collect();
        let (config, merged) = merge(&offers);
        let want = sequential_settled(&offers);
        for (n, (m, (accepted, errors))) in merged.iter().zip(&want).enumerate() {
            prop_assert_eq!(m.accepted, *accepted, "file {}", n);
            let got: Vec<String> = m.conflicts.iter().map(reworded).collect();
            prop_assert_eq!(&got, errors, "file {}", n);
        }
        let in_force: usize = offers.iter().zip(&want).filter_map(|((_, v), (a, _))| a.map(|a| v[a].services.len())).sum();
        prop_assert_eq!(config.services.len(), in_force);
    }
}

#[test]
fn an_unchanged_file_is_indexed_once_and_checked_against_the_changed_one() {
    let big: String = (0..1000)
        .map(|i| format!("[[service]]\nname = \"s{i}\"\nvip = \"10.1.{}.{}\"\nport = 80\n", i / 256, i % 256))
        .collect();
    let big = Arc::new(parse(Path::new("/c/10-big.toml"), &big).unwrap());
    let small = |vip: &str| {
        parse(Path::new("/c/20-x.toml"), &format!("[[service]]\nname = \"x\"\nvip = \"{vip}\"\nport = 80\n")).unwrap()
    };
    let (a, b) = (small("10.2.0.1"), small("10.1.0.5"));
    let offers = vec![(PathBuf::from("/c/10-big.toml"), vec![&*big]), (PathBuf::from("/c/20-x.toml"), vec![&a])];
    let (config, report) = merge(&offers);
    assert_eq!((config.services.len(), report[1].accepted), (1001, Some(0)));
    let built = index_of(&big) as *const FileIndex;
    // The same parse merged again with another small file: its index is
    // the one built before, and the clash with it is found.
    let offers = vec![(PathBuf::from("/c/10-big.toml"), vec![&*big]), (PathBuf::from("/c/20-x.toml"), vec![&b])];
    let (config, report) = merge(&offers);
    assert_eq!(index_of(&big) as *const FileIndex, built);
    assert_eq!((config.services.len(), report[1].accepted), (1000, None));
    assert_eq!(
        report[1].conflicts[0].message,
        "service \"x\": vip 10.1.0.5 port 80/tcp is already used by service \"s5\" at 10-big.toml:22:8"
    );
    // A copy of a parse starts without the index; equal all the same.
    let copy = (*big).clone();
    assert!(copy.derived.is_empty() && copy == *big);
}
