//! `hostmesh diff`: what the daemon would do if these config dirs were its
//! configuration — the objects it would add, change and remove, against
//! the configuration in force (the copies of the files in force that the
//! daemon keeps in the state dir, `daemon/src/daemon/applied.rs`, which stay there
//! whether it runs or not), the files it would reject and the capacity
//! used. It touches nothing. Exit 0: nothing would change; 1: something
//! would; 2: a dir or the state could not be read, or a file would be
//! rejected.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::process::ExitCode;

use serde::Serialize;
use serde_json::Value;

use crate::config::{check_dir, Capacity, Config, ConfigDirs, ConfigStore};

pub(super) fn run(dirs: &ConfigDirs, state_dir: &Path) -> ExitCode {
    let want = match check_dir(dirs) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("hostmesh diff: {e}");
            return ExitCode::from(2);
        }
    };
    let applied = state_dir.join(crate::state::APPLIED_DIR);
    let have = if applied.is_dir() {
        match ConfigStore::new().load(&ConfigDirs::only(applied.clone())) {
            Ok(l) => {
                // The daemon copies only what it accepted: a copy that does
                // not load means the state dir was written by another hand.
                for f in l.rejected() {
                    eprintln!("hostmesh diff: the copy {} does not load; it is left out", f.path.display());
                }
                l.config
            }
            Err(e) => {
                eprintln!("hostmesh diff: the configuration in force: {e}");
                return ExitCode::from(2);
            }
        }
    } else {
        println!("nothing is in force here ({} does not exist): every object would be added", applied.display());
        Default::default()
    };
    let mut rejected = 0;
    for f in want.rejected() {
        rejected += 1;
        for e in &f.errors {
            eprintln!("{e}");
        }
    }
    for m in &want.masked {
        println!("{}", super::check::masked_line(m));
    }
    let changes = compare(&have, &want.config);
    for c in &changes {
        println!("{c}");
    }
    let count = |w: What| changes.iter().filter(|c| c.what == w).count();
    let (added, changed, removed) = (count(What::Added), count(What::Changed), count(What::Removed));
    if changes.is_empty() {
        println!("no change: the daemon would keep what is in force");
    } else {
        println!("{added} added, {changed} changed, {removed} removed");
    }
    println!("{}", capacity_line(&want.config));
    if rejected > 0 {
        eprintln!("hostmesh diff: {rejected} file(s) would be rejected (their errors are above)");
        return ExitCode::from(2);
    }
    if changes.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// What becomes of one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum What {
    Added,
    Changed,
    Removed,
}

/// One object that would change, and the keys of its definition that
/// differ (for a change).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Change {
    pub what: What,
    pub kind: &'static str,
    pub name: String,
    pub keys: Vec<String>,
    /// Where the new definition is (added and changed objects).
    pub origin: Option<String>,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = match self.what {
            What::Added => '+',
            What::Changed => '~',
            What::Removed => '-',
        };
        write!(f, "{sign} {} {}", self.kind, self.name)?;
        if !self.keys.is_empty() {
            write!(f, ": {}", self.keys.join(", "))?;
        }
        if let Some(o) = &self.origin {
            write!(f, " ({o})")?;
        }
        Ok(())
    }
}

/// One object's definition without where it was written: moving a
/// service to another file changes nothing.
struct Definition {
    fields: serde_json::Map<String, Value>,
    origin: Option<String>,
}

fn definition(object: &impl Serialize, origin: Option<String>) -> Definition {
    let mut fields = match serde_json::to_value(object) {
        Ok(Value::Object(m)) => m,
        other => [("value".to_string(), other.unwrap_or(Value::Null))].into_iter().collect(),
    };
    fields.remove("origin");
    Definition { fields, origin }
}

/// Every object of a configuration by kind and name, in the order they
/// are reported: `[daemon]`, `[gateway]`, services, mesh redirects,
/// peers, members.
fn objects(c: &Config) -> BTreeMap<(u8, &'static str, String), Definition> {
    let mut out = BTreeMap::new();
    let mut add = |rank: u8, kind: &'static str, name: &str, d: Definition| {
        out.insert((rank, kind, name.to_string()), d);
    };
    add(0, "[daemon]", "settings", definition(&c.daemon, c.daemon.origin.as_ref().map(|o| o.to_string())));
    if let Some(g) = &c.gateway {
        add(1, "[gateway]", "gateway", definition(g, Some(g.origin.to_string())));
    }
    for s in &c.services {
        add(2, "service", &s.name, definition(&**s, Some(s.origin.to_string())));
    }
    for m in &c.meshes {
        add(3, "mesh", &m.name, definition(m, Some(m.origin.to_string())));
    }
    for p in &c.peers {
        add(4, "peer", &p.name, definition(p, Some(p.origin.to_string())));
    }
    for m in &c.members {
        add(5, "member", &m.name, definition(m, Some(m.origin.to_string())));
    }
    out
}

/// The objects that `want` adds, changes and removes against `have`.
pub(crate) fn compare(have: &Config, want: &Config) -> Vec<Change> {
    let (mut have, want) = (objects(have), objects(want));
    let mut out = Vec::new();
    for (key, w) in &want {
        let (_, kind, name) = key;
        match have.remove(key) {
            None => {
                out.push(Change { what: What::Added, kind, name: name.clone(), keys: vec![], origin: w.origin.clone() })
            }
            Some(h) => {
                let keys: Vec<String> = w
                    .fields
                    .iter()
                    .filter(|(k, v)| h.fields.get(*k) != Some(*v))
                    .map(|(k, _)| k.clone())
                    .chain(h.fields.keys().filter(|k| !w.fields.contains_key(*k)).cloned())
                    .collect();
                if !keys.is_empty() {
                    out.push(Change { what: What::Changed, kind, name: name.clone(), keys, origin: w.origin.clone() });
                }
            }
        }
    }
    for ((_, kind, name), _) in have {
        out.push(Change { what: What::Removed, kind, name, keys: vec![], origin: None });
    }
    out
}

/// The capacity the configuration takes: services and backends against
/// the maps' sizes.
fn capacity_line(c: &Config) -> String {
    let backends: usize = c.services.iter().map(|s| s.backends.len()).sum();
    format!(
        "capacity: {} of {} services, {} of {} backends",
        c.services.len(),
        c.daemon.sizes.get(Capacity::Services),
        backends,
        c.daemon.sizes.get(Capacity::Backends)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Config {
        crate::config::from_text(text)
    }

    const BASE: &str = r#"
[daemon]
conntrack_tcp_timeout = "10m"

[[service]]
name = "web"
vip = "10.96.0.10"
port = 80
backends = ["192.168.10.11:8080"]

[[service]]
name = "api"
vip = "10.96.0.20"
port = 443
backends = ["192.168.10.21:8443"]
"#;

    #[test]
    fn the_same_configuration_written_elsewhere_changes_nothing() {
        let moved = format!("\n\n# moved down\n{BASE}");
        assert_eq!(compare(&config(BASE), &config(&moved)), vec![]);
    }

    #[test]
    fn added_changed_and_removed_objects_are_named_with_the_keys_that_differ() {
        let want = BASE
            .replace("conntrack_tcp_timeout = \"10m\"", "conntrack_tcp_timeout = \"20m\"")
            .replace(
                "backends = [\"192.168.10.11:8080\"]",
                "backends = [\"192.168.10.11:8080\"]\naffinity = \"client-ip\"",
            )
            .replace("name = \"api\"\nvip = \"10.96.0.20\"", "name = \"dns\"\nvip = \"10.96.0.53\"");
        let changes = compare(&config(BASE), &config(&want));
        let shown: Vec<String> = changes.iter().map(|c| c.to_string()).collect();
        assert_eq!(
            shown,
            [
                "~ [daemon] settings: conntrack_tcp_timeout (t.toml:2:1)",
                "+ service dns (t.toml:13:8)",
                "~ service web: affinity (t.toml:6:8)",
                "- service api",
            ],
            "{shown:#?}"
        );
    }

    #[test]
    fn the_capacity_line_counts_services_and_backends_against_the_maps() {
        assert_eq!(capacity_line(&config(BASE)), "capacity: 2 of 65536 services, 2 of 65536 backends");
    }
}
