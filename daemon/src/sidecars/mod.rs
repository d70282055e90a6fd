//! Sidecar listeners for mesh redirects (docs/design.md, "Facts the seeds got
//! wrong", 1).
//!
//! For every redirect port in use, the registrar finds the socket the
//! sidecar listens on (sock_diag), takes it from its owner (pidfd_getfd),
//! and, for sk_lookup, puts it into HM_MESH_SOCKETS; for the nftables
//! fallback it marks it IP_TRANSPARENT so tproxy may hand it traffic. It
//! then closes its own copy at once: the sidecar alone keeps the socket
//! open, so when the sidecar exits the socket closes, leaves the map, and
//! a restarted sidecar can bind the port again. The registrar runs a few
//! times a second and picks up the new listener.

mod listeners;
mod take;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::abi::{self, Pod, SockKey};
use crate::backends::bpf::sys;
use crate::config::{Config, Mesh};
use crate::model::MeshPath;

pub use listeners::expected_addr;

/// What the registrar knows about one redirect port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Registration {
    /// Where the sidecar should listen.
    pub expected: SocketAddr,
    /// The registered listener.
    pub listener: Option<Registered>,
    /// Why there is none, in a sentence.
    pub problem: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Registered {
    pub addr: SocketAddr,
    pub pid: u32,
    pub comm: String,
    #[serde(skip)]
    pub cookie: u64,
}

pub struct Registrar {
    sockets_pin: PathBuf,
    entries: BTreeMap<SockKey, Registration>,
}

/// The listener keys the configuration needs: one per (family, protocol,
/// redirect port).
pub fn wanted(config: &Config) -> BTreeSet<SockKey> {
    config.meshes.iter().map(sock_key).collect()
}

/// The listener a mesh entry's traffic goes to.
pub fn sock_key(m: &Mesh) -> SockKey {
    SockKey {
        port: m.redirect_port,
        family: if m.vip.is_ipv4() { abi::AF_INET } else { abi::AF_INET6 },
        proto: m.protocol.number(),
    }
}

fn proto_name(key: &SockKey) -> &'static str {
    if key.proto == 17 {
        "udp"
    } else {
        "tcp"
    }
}

impl Registrar {
    pub fn new(bpffs: &Path) -> Self {
        Registrar { sockets_pin: bpffs.join("maps/HM_MESH_SOCKETS"), entries: BTreeMap::new() }
    }

    pub fn report(&self) -> &BTreeMap<SockKey, Registration> {
        &self.entries
    }

    /// Brings registrations in line with `wanted`. Returns true when what
    /// `report` says changed.
    pub fn tick(&mut self, wanted: &BTreeSet<SockKey>, path: Option<&MeshPath>) -> bool {
        let before = self.entries.clone();
        self.entries.retain(|k, _| wanted.contains(k));
        match path {
            Some(MeshPath::SkLookup) => self.tick_sockmap(wanted),
            Some(MeshPath::Nftables { .. }) => {
                for key in wanted {
                    self.tick_transparent(key);
                }
            }
            None => self.entries.clear(),
        }
        self.entries != before
    }

    fn tick_sockmap(&mut self, wanted: &BTreeSet<SockKey>) {
        let Ok(map) = sys::obj_get(&self.sockets_pin) else {
            // Not loaded yet: the next sync creates it.
            return;
        };
        for key in wanted {
            let mut cookie = [0u8; 8];
            let in_map = sys::map_lookup(map.as_fd(), &key.to_bytes(), &mut cookie)
                .ok()
                .filter(|found| *found)
                .map(|_| u64::from_ne_bytes(cookie));
            let entry = self.entry(key);
            match listeners::find(key) {
                Err(e) => entry.problem = Some(format!("cannot list sockets: {e}")),
                Ok(None) => {
                    if in_map.is_some() {
                        // A socket of some other namespace: not ours to serve.
                        let _ = sys::map_delete(map.as_fd(), &key.to_bytes());
                    }
                    entry.listener = None;
                    entry.problem = Some(no_listener(key));
                }
                Ok(Some(l))
                    if in_map == Some(l.cookie) && entry.listener.as_ref().is_some_and(|r| r.cookie == l.cookie) => {}
                Ok(Some(l)) if in_map == Some(l.cookie) => {
                    // Registered by an earlier run of the daemon: learn whose.
                    let owner = take::find_owner(l.inode);
                    entry.listener =
                        owner.map(|o| Registered { addr: l.addr, pid: o.pid, comm: o.comm, cookie: l.cookie });
                    entry.problem = None;
                }
                Ok(Some(l)) => {
                    let result = register(key, &l, |fd| {
                        let value = (fd.as_raw_fd() as u64).to_ne_bytes();
                        sys::map_update(map.as_fd(), &key.to_bytes(), &value)
                    });
                    apply(entry, l, result);
                }
            }
        }
        // Keys nobody wants any more.
        if let Ok(keys) = sys::map_keys(map.as_fd(), std::mem::size_of::<SockKey>()) {
            for k in keys {
                if SockKey::from_bytes(&k).is_some_and(|k| !wanted.contains(&k)) {
                    let _ = sys::map_delete(map.as_fd(), &k);
                }
            }
        }
    }

    fn tick_transparent(&mut self, key: &SockKey) {
        let entry = self.entry(key);
        match listeners::find(key) {
            Err(e) => entry.problem = Some(format!("cannot list sockets: {e}")),
            Ok(None) => {
                entry.listener = None;
                entry.problem = Some(no_listener(key));
            }
            Ok(Some(l)) if entry.listener.as_ref().is_some_and(|r| r.cookie == l.cookie) => {}
            Ok(Some(l)) => {
                let v6 = key.family == abi::AF_INET6;
                let result = register(key, &l, |fd| take::set_transparent(fd, v6));
                apply(entry, l, result);
            }
        }
    }

    fn entry(&mut self, key: &SockKey) -> &mut Registration {
        self.entries.entry(*key).or_insert_with(|| Registration {
            expected: expected_addr(key),
            listener: None,
            problem: None,
        })
    }
}

fn no_listener(key: &SockKey) -> String {
    format!("no sidecar listens on {}/{}: connections are refused", expected_addr(key), proto_name(key))
}

/// Takes the listener from its owner and hands our copy to `install`;
/// the copy is closed when this returns.
fn register(
    key: &SockKey,
    l: &listeners::Listener,
    install: impl FnOnce(&std::os::fd::OwnedFd) -> std::io::Result<()>,
) -> Result<Registered, String> {
    let owner = take::find_owner(l.inode)
        .ok_or_else(|| format!("a listener on {}/{} exists but no process here holds it", l.addr, proto_name(key)))?;
    let fd = take::take(&owner).map_err(|e| {
        format!("cannot take the listener of pid {} ({}): {e} (hostmesh needs CAP_SYS_PTRACE)", owner.pid, owner.comm)
    })?;
    install(&fd).map_err(|e| format!("cannot register the listener of pid {} ({}): {e}", owner.pid, owner.comm))?;
    Ok(Registered { addr: l.addr, pid: owner.pid, comm: owner.comm, cookie: l.cookie })
}

fn apply(entry: &mut Registration, _l: listeners::Listener, result: Result<Registered, String>) {
    match result {
        Ok(r) => {
            entry.listener = Some(r);
            entry.problem = None;
        }
        Err(problem) => {
            entry.listener = None;
            entry.problem = Some(problem);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{parse_file, Source};

    #[test]
    fn one_listener_key_per_family_protocol_and_port() {
        let f = parse_file(&Source::new(
            Path::new("t.toml"),
            "[[mesh]]\nname = \"a\"\nvip = \"10.0.0.1\"\nport = 80\nredirect_port = 15001\n\
             [[mesh]]\nname = \"b\"\nvip = \"10.0.0.2\"\nport = 0\nredirect_port = 15001\n\
             [[mesh]]\nname = \"c\"\nvip = \"fd00::1\"\nport = 53\nprotocol = \"udp\"\nredirect_port = 15001\n",
        ))
        .unwrap();
        let config = Config { meshes: f.meshes, ..Config::default() };
        let keys: Vec<SockKey> = wanted(&config).into_iter().collect();
        assert_eq!(
            keys,
            [
                SockKey { port: 15001, family: abi::AF_INET, proto: 6 },
                SockKey { port: 15001, family: abi::AF_INET6, proto: 17 },
            ]
        );
        assert_eq!(expected_addr(&keys[1]).to_string(), "[::1]:15001");
    }
}
