//! An in-memory `SidecarBackend` for the registrar's unit tests: listeners
//! and their holders as a test sets them, `HM_MESH_SOCKETS` as a map of
//! cookies, and what the registrar did, in order.

use std::collections::{BTreeMap, BTreeSet};
use std::io;

use super::{Holder, Install, Listener, RegisterError, SidecarBackend};
use crate::abi::SockKey;

#[derive(Debug, Default)]
pub(crate) struct FakeSidecars {
    /// What sock_diag would find, per key.
    pub listeners: BTreeMap<SockKey, Listener>,
    /// Who holds each socket inode.
    pub holders: BTreeMap<u32, Holder>,
    /// `HM_MESH_SOCKETS`, key -> socket cookie; `None`: not loaded.
    pub map: Option<BTreeMap<SockKey, u64>>,
    /// Cookies of sockets marked IP_TRANSPARENT.
    pub transparent: BTreeSet<u64>,
    /// pids whose descriptors cannot be taken (no CAP_SYS_PTRACE).
    pub untakeable: BTreeSet<u32>,
    /// When set, listing sockets fails with this.
    pub diag_error: Option<io::ErrorKind>,
    /// Every register and unregister, in order ("register 15001 pid 7", ...).
    pub log: Vec<String>,
}

impl FakeSidecars {
    /// A fake whose HM_MESH_SOCKETS is loaded and empty.
    pub(crate) fn loaded() -> Self {
        FakeSidecars { map: Some(BTreeMap::new()), ..Self::default() }
    }

    /// A sidecar listening for `key`: socket `inode` (cookie = inode + 1000)
    /// held by `pid` as fd 3.
    pub(crate) fn listen(&mut self, key: SockKey, inode: u32, pid: u32, comm: &str) {
        let addr = crate::sidecars::expected_addr(&key);
        self.listeners.insert(key, Listener { addr, inode, cookie: u64::from(inode) + 1000 });
        self.holders.insert(inode, Holder { pid, fd: 3, comm: comm.to_string() });
    }

    /// The sidecar for `key` exits: its socket closes and leaves the map.
    pub(crate) fn exit(&mut self, key: &SockKey) {
        if let Some(l) = self.listeners.remove(key) {
            self.holders.remove(&l.inode);
            if let Some(map) = &mut self.map {
                map.retain(|_, cookie| *cookie != l.cookie);
            }
        }
    }
}

impl SidecarBackend for FakeSidecars {
    fn find_listener(&mut self, key: &SockKey) -> io::Result<Option<Listener>> {
        match self.diag_error {
            Some(kind) => Err(io::Error::from(kind)),
            None => Ok(self.listeners.get(key).cloned()),
        }
    }

    fn holder(&mut self, inode: u32) -> Option<Holder> {
        self.holders.get(&inode).cloned()
    }

    fn registered(&mut self) -> Option<BTreeMap<SockKey, u64>> {
        self.map.clone()
    }

    fn register(&mut self, key: &SockKey, holder: &Holder, how: Install) -> Result<(), RegisterError> {
        if self.untakeable.contains(&holder.pid) {
            return Err(RegisterError::Take(io::Error::from(io::ErrorKind::PermissionDenied)));
        }
        let Some(l) = self.listeners.values().find(|l| self.holders.get(&l.inode) == Some(holder)) else {
            return Err(RegisterError::Take(io::Error::from(io::ErrorKind::NotFound)));
        };
        let cookie = l.cookie;
        match how {
            Install::SockMap => {
                let map = self.map.as_mut().ok_or_else(|| RegisterError::Install(io::Error::other("not loaded")))?;
                map.insert(*key, cookie);
            }
            Install::Transparent => {
                self.transparent.insert(cookie);
            }
        }
        self.log.push(format!("register {} pid {} {how:?}", key.port, holder.pid));
        Ok(())
    }

    fn unregister(&mut self, key: &SockKey) {
        if let Some(map) = &mut self.map {
            map.remove(key);
        }
        self.log.push(format!("unregister {}", key.port));
    }
}
