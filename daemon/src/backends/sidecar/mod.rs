//! The live `SidecarBackend`: sock_diag finds listeners (`listeners`), a
//! scan of /proc finds their holder and pidfd_getfd duplicates the socket
//! (`take`), and the duplicate goes into the pinned `HM_MESH_SOCKETS` or
//! is marked IP_TRANSPARENT, then is closed at once: the sidecar alone
//! keeps the socket open.

mod listeners;
mod take;

use crate::abi::HmMap;
use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use super::bpf::sys;
use super::{Holder, Install, Listener, RegisterError, SidecarBackend};
use crate::abi::{self, Pod, SockKey};

pub(crate) struct LiveSidecars {
    sockets_pin: PathBuf,
}

impl LiveSidecars {
    /// `bpffs` is the daemon's pin dir (`maps/HM_MESH_SOCKETS` under it).
    pub(crate) fn new(bpffs: &Path) -> Self {
        LiveSidecars { sockets_pin: crate::backends::bpf::pins::PinDir::new(bpffs).map(HmMap::MeshSockets) }
    }

    fn map(&self) -> Option<OwnedFd> {
        sys::obj_get(&self.sockets_pin).ok()
    }
}

impl SidecarBackend for LiveSidecars {
    fn find_listener(&mut self, key: &SockKey) -> io::Result<Option<Listener>> {
        listeners::find(key)
    }

    fn holder(&mut self, inode: u32) -> Option<Holder> {
        take::find_holder(inode)
    }

    fn registered(&mut self) -> Option<BTreeMap<SockKey, u64>> {
        let map = self.map()?;
        let keys = sys::map_keys(map.as_fd(), std::mem::size_of::<SockKey>()).ok()?;
        let mut out = BTreeMap::new();
        for k in keys {
            let mut cookie = [0u8; 8];
            if let (Some(key), Ok(true)) = (SockKey::from_bytes(&k), sys::map_lookup(map.as_fd(), &k, &mut cookie)) {
                out.insert(key, u64::from_ne_bytes(cookie));
            }
        }
        Some(out)
    }

    fn register(&mut self, key: &SockKey, holder: &Holder, how: Install) -> Result<(), RegisterError> {
        let fd = take::take(holder).map_err(RegisterError::Take)?;
        let installed = match how {
            Install::SockMap => {
                let map = self.map().ok_or_else(|| io::Error::other(format!("{} is not loaded", HmMap::MeshSockets)));
                map.and_then(|map| {
                    let value = (fd.as_raw_fd() as u64).to_ne_bytes();
                    sys::map_update(map.as_fd(), &key.to_bytes(), &value)
                })
            }
            Install::Transparent => take::set_transparent(&fd, key.family == abi::AF_INET6),
        };
        installed.map_err(RegisterError::Install)
    }

    fn unregister(&mut self, key: &SockKey) {
        if let Some(map) = self.map() {
            // ENOENT: already gone, which is what was asked.
            let _ = sys::map_delete(map.as_fd(), &key.to_bytes());
        }
    }
}
