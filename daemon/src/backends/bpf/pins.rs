//! hostmesh's bpffs dir (`--bpffs`, default /sys/fs/bpf/hostmesh):
//!
//! ```text
//! <dir>/maps/HM_SERVICES             pinned maps, adopted on restart
//! <dir>/links/hm_natout@tc-ingress@hm-natout   pinned program links
//! <dir>/progs/hm_natout@tc-ingress@hm-natout   the program each hook runs
//! <dir>/qdiscs/7                     clsact qdiscs hostmesh created (ifindex)
//! ```
//!
//! Pinned links keep programs attached while the daemon is down or
//! restarting; pinned maps keep their contents. Both are adopted on start.
//! TC programs attached as clsact filters (kernels without TCX) need no
//! link: the filter belongs to the qdisc and outlives the daemon. The
//! program behind every hook is pinned too, because reading a program by
//! the id a link or filter reports needs CAP_SYS_ADMIN, which the daemon
//! does not have. `qdiscs/` holds an empty dir per clsact qdisc hostmesh
//! added, so teardown removes only those (and only when nothing else is
//! on them); it lives on the bpffs because it shares the qdiscs' lifetime.

use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// Where systemd mounts the host's bpffs.
const SYS_FS_BPF: &str = "/sys/fs/bpf";

/// The pin dir cannot be used: the daemon does not start.
#[derive(Debug, thiserror::Error)]
#[error("pin dir {}: {cause}; hostmesh keeps its programs and maps on a bpffs there: mount one (mount -t bpf bpf /sys/fs/bpf) or pass --bpffs with a dir on one", dir.display())]
pub(crate) struct PinDirError {
    pub dir: PathBuf,
    pub cause: String,
}

fn mount_bpffs(dir: &Path) -> io::Result<()> {
    nix::mount::mount(Some("bpf"), dir, Some("bpf"), nix::mount::MsFlags::empty(), Some("mode=0700"))
        .map_err(|e| io::Error::other(format!("cannot mount a bpffs on {}: {e}", dir.display())))
}

#[derive(Debug, Clone)]
pub(crate) struct PinDir {
    pub root: PathBuf,
}

impl PinDir {
    pub(crate) fn new(root: &Path) -> Self {
        PinDir { root: root.to_path_buf() }
    }

    /// Removes the (emptied) pin dir; when hostmesh mounted the bpffs on
    /// it, unmounts that first. Says what it did, a line each.
    pub(crate) fn remove(&self) -> io::Result<Vec<String>> {
        let ctx = |what: String| move |e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"));
        let mut done = Vec::new();
        for sub in ["maps", "links", "progs", "qdiscs"] {
            let p = self.root.join(sub);
            if p.exists() {
                fs::remove_dir(&p).map_err(ctx(format!("remove {}", p.display())))?;
            }
        }
        let dir = &self.root;
        let own_mount = is_bpffs(dir).unwrap_or(false) && !dir.parent().is_some_and(|p| is_bpffs(p).unwrap_or(false));
        if own_mount {
            nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH)
                .map_err(|e| ctx(format!("unmount {}", dir.display()))(e.into()))?;
            done.push(format!("unmounted bpffs {}", dir.display()));
        }
        match fs::remove_dir(dir) {
            Ok(()) => done.push(format!("removed {}", dir.display())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(ctx(format!("remove {}", dir.display()))(e)),
        }
        Ok(done)
    }

    pub(crate) fn maps(&self) -> PathBuf {
        self.root.join("maps")
    }

    pub(crate) fn links(&self) -> PathBuf {
        self.root.join("links")
    }

    /// The capacity of the pinned maps of `c`, `None` when none is pinned.
    pub(crate) fn capacity_of(&self, c: crate::abi::Capacity) -> Option<u32> {
        let map = crate::abi::HmMap::pinned().find(|m| m.def().sized_by == Some(c))?;
        let fd = super::sys::obj_get(&self.map(map)).ok()?;
        super::sys::map_info(std::os::fd::AsFd::as_fd(&fd)).ok().map(|i| i.max_entries)
    }

    pub(crate) fn map(&self, map: crate::abi::HmMap) -> PathBuf {
        self.maps().join(map.name())
    }

    /// The pins of maps this build no longer has that are still there.
    pub(crate) fn retired_maps(&self) -> Vec<PathBuf> {
        crate::abi::RETIRED_MAPS.iter().map(|name| self.maps().join(name)).filter(|p| p.exists()).collect()
    }

    pub(crate) fn link(&self, name: &str) -> PathBuf {
        self.links().join(name)
    }

    pub(crate) fn progs(&self) -> PathBuf {
        self.root.join("progs")
    }

    /// The pin of the program behind the link pinned as `name`.
    pub(crate) fn prog(&self, name: &str) -> PathBuf {
        self.progs().join(name)
    }

    pub(crate) fn qdiscs(&self) -> PathBuf {
        self.root.join("qdiscs")
    }

    /// The mark of a clsact qdisc hostmesh added to interface `ifindex`.
    pub(crate) fn qdisc(&self, ifindex: u32) -> PathBuf {
        self.qdiscs().join(ifindex.to_string())
    }

    /// Interfaces whose clsact qdisc hostmesh added.
    pub(crate) fn qdisc_marks(&self) -> io::Result<Vec<u32>> {
        Ok(names(&self.qdiscs())?.iter().filter_map(|n| n.parse().ok()).collect())
    }

    /// At start, before anything is loaded: the pin dir exists on a
    /// bpffs. Where nothing is mounted on /sys/fs/bpf (plain `ip netns
    /// exec`, containers) a bpffs is mounted there first, as systemd and
    /// Cilium do; if the dir is still not on one, a bpffs goes on the dir.
    pub(crate) fn prepare(&self) -> Result<(), PinDirError> {
        let err = |cause: String| PinDirError { dir: self.root.clone(), cause };
        let sys_bpf = Path::new(SYS_FS_BPF);
        if self.root.starts_with(sys_bpf) && sys_bpf.is_dir() && !is_bpffs(sys_bpf).unwrap_or(true) {
            mount_bpffs(sys_bpf).map_err(|e| err(e.to_string()))?;
        }
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.root)
            .map_err(|e| err(format!("cannot create it: {e}")))?;
        if !is_bpffs(&self.root).map_err(|e| err(e.to_string()))? {
            mount_bpffs(&self.root).map_err(|e| err(e.to_string()))?;
        }
        Ok(())
    }

    /// Creates the dir on a bpffs, mounting one on it if it is not on one
    /// (hosts without systemd's /sys/fs/bpf mount, tests).
    pub(crate) fn ensure(&self) -> io::Result<()> {
        fs::create_dir_all(&self.root)?;
        if !is_bpffs(&self.root)? {
            mount_bpffs(&self.root)?;
        }
        fs::create_dir_all(self.maps())?;
        fs::create_dir_all(self.links())?;
        fs::create_dir_all(self.progs())?;
        fs::create_dir_all(self.qdiscs())?;
        Ok(())
    }

    /// Pin file names under `links/`.
    pub(crate) fn link_names(&self) -> io::Result<Vec<String>> {
        names(&self.links())
    }

    /// Pin file names under `progs/`.
    pub(crate) fn prog_names(&self) -> io::Result<Vec<String>> {
        names(&self.progs())
    }
}

fn names(dir: &Path) -> io::Result<Vec<String>> {
    match fs::read_dir(dir) {
        Ok(entries) => Ok(entries.filter_map(|e| e.ok()).filter_map(|e| e.file_name().into_string().ok()).collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

pub(crate) fn is_bpffs(path: &Path) -> io::Result<bool> {
    let st = nix::sys::statfs::statfs(path).map_err(io::Error::from)?;
    Ok(st.filesystem_type() == nix::sys::statfs::BPF_FS_MAGIC)
}

/// Removes a pin; one that is gone already is fine.
pub(crate) fn unpin(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
