//! Sidecar listeners for mesh redirects (docs/design.md, "Facts the seeds got
//! wrong", 1).
//!
//! For every redirect port in use, the registrar finds the socket the
//! sidecar listens on, takes it from its holder, and, for sk_lookup, puts
//! it into HM_MESH_SOCKETS; for the nftables fallback it marks it
//! IP_TRANSPARENT so tproxy may hand it traffic. It then closes its own
//! copy at once: the sidecar alone keeps the socket open, so when the
//! sidecar exits the socket closes, leaves the map, and a restarted
//! sidecar can bind the port again. The registrar runs a few times a
//! second and picks up the new listener. The kernel work is a
//! `SidecarBackend` (backends/sidecar/); this module decides.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use serde::Serialize;

use crate::abi::{self, SockKey};
use crate::backends::{Install, Listener, RegisterError, SidecarBackend};
use crate::config::{Config, Mesh, Protocol};
use crate::model::MeshPath;

/// What the registrar knows about one redirect port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Registration {
    /// Where the sidecar should listen.
    pub expected: SocketAddr,
    /// The registered listener.
    pub listener: Option<Registered>,
    /// Why there is none, in a sentence.
    pub problem: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Registered {
    pub addr: SocketAddr,
    pub pid: u32,
    pub comm: String,
    #[serde(skip)]
    pub cookie: u64,
}

pub(crate) struct Registrar<S> {
    kernel: S,
    entries: BTreeMap<SockKey, Registration>,
}

/// The listener keys the configuration needs: one per (family, protocol,
/// redirect port).
pub(crate) fn wanted(config: &Config) -> BTreeSet<SockKey> {
    config.meshes.iter().map(sock_key).collect()
}

/// The listener a mesh entry's traffic goes to.
pub(crate) fn sock_key(m: &Mesh) -> SockKey {
    SockKey {
        port: m.redirect_port,
        family: if m.vip.is_ipv4() { abi::AF_INET } else { abi::AF_INET6 },
        proto: m.protocol.number(),
    }
}

/// Where the sidecar for a key is expected: 127.0.0.1 or [::1].
pub(crate) fn expected_addr(key: &SockKey) -> SocketAddr {
    let ip: IpAddr = if key.family == abi::AF_INET6 { Ipv6Addr::LOCALHOST.into() } else { Ipv4Addr::LOCALHOST.into() };
    SocketAddr::new(ip, key.port)
}

fn proto_name(key: &SockKey) -> String {
    Protocol::name_of(key.proto)
}

impl<S: SidecarBackend> Registrar<S> {
    pub(crate) fn new(kernel: S) -> Self {
        Registrar { kernel, entries: BTreeMap::new() }
    }

    pub(crate) fn report(&self) -> &BTreeMap<SockKey, Registration> {
        &self.entries
    }

    /// Brings registrations in line with `wanted`. Returns true when what
    /// `report` says changed.
    pub(crate) fn tick(&mut self, wanted: &BTreeSet<SockKey>, path: Option<&MeshPath>) -> bool {
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
        let Some(in_map) = self.kernel.registered() else {
            // Not loaded yet: the next sync creates it.
            return;
        };
        for key in wanted {
            let found = self.kernel.find_listener(key);
            let entry = entry(&mut self.entries, key);
            let mapped = in_map.get(key).copied();
            match found {
                Err(e) => entry.problem = Some(format!("cannot list sockets: {e}")),
                Ok(None) => {
                    if mapped.is_some() {
                        // A socket of some other namespace: not ours to serve.
                        self.kernel.unregister(key);
                    }
                    entry.listener = None;
                    entry.problem = Some(no_listener(key));
                }
                Ok(Some(l))
                    if mapped == Some(l.cookie) && entry.listener.as_ref().is_some_and(|r| r.cookie == l.cookie) => {}
                Ok(Some(l)) if mapped == Some(l.cookie) => {
                    // Registered by an earlier run of the daemon: learn whose.
                    let holder = self.kernel.holder(l.inode);
                    entry.listener =
                        holder.map(|h| Registered { addr: l.addr, pid: h.pid, comm: h.comm, cookie: l.cookie });
                    entry.problem = None;
                }
                Ok(Some(l)) => settle(entry, register(&mut self.kernel, key, &l, Install::SockMap)),
            }
        }
        // Keys nobody wants any more.
        for key in in_map.keys().filter(|k| !wanted.contains(k)) {
            self.kernel.unregister(key);
        }
    }

    fn tick_transparent(&mut self, key: &SockKey) {
        let found = self.kernel.find_listener(key);
        let entry = entry(&mut self.entries, key);
        match found {
            Err(e) => entry.problem = Some(format!("cannot list sockets: {e}")),
            Ok(None) => {
                entry.listener = None;
                entry.problem = Some(no_listener(key));
            }
            Ok(Some(l)) if entry.listener.as_ref().is_some_and(|r| r.cookie == l.cookie) => {}
            Ok(Some(l)) => settle(entry, register(&mut self.kernel, key, &l, Install::Transparent)),
        }
    }

    /// The backend, for tests that look at what the registrar did.
    #[cfg(test)]
    pub(crate) fn kernel(&mut self) -> &mut S {
        &mut self.kernel
    }
}

fn entry<'a>(entries: &'a mut BTreeMap<SockKey, Registration>, key: &SockKey) -> &'a mut Registration {
    entries.entry(*key).or_insert_with(|| Registration { expected: expected_addr(key), listener: None, problem: None })
}

fn no_listener(key: &SockKey) -> String {
    format!("no sidecar listens on {}/{}: connections are refused", expected_addr(key), proto_name(key))
}

/// Takes the listener from its holder and installs it.
fn register(kernel: &mut impl SidecarBackend, key: &SockKey, l: &Listener, how: Install) -> Result<Registered, String> {
    let holder = kernel
        .holder(l.inode)
        .ok_or_else(|| format!("a listener on {}/{} exists but no process here holds it", l.addr, proto_name(key)))?;
    kernel.register(key, &holder, how).map_err(|e| match e {
        RegisterError::Take(e) => format!(
            "cannot take the listener of pid {} ({}): {e} (hostmesh needs CAP_SYS_PTRACE)",
            holder.pid, holder.comm
        ),
        RegisterError::Install(e) => {
            format!("cannot register the listener of pid {} ({}): {e}", holder.pid, holder.comm)
        }
    })?;
    Ok(Registered { addr: l.addr, pid: holder.pid, comm: holder.comm, cookie: l.cookie })
}

fn settle(entry: &mut Registration, result: Result<Registered, String>) {
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
mod tests;
