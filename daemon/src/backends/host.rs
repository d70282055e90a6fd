//! Facts about the host that compile needs: interfaces, default-route
//! interfaces, the network namespace's cookie, the cgroup2 mount and the
//! kernel's features.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::bpf::netns_cookie;
use super::netlink::Rtnetlink;
use super::{BackendError, HostBackend, Result};
use crate::model::{Feature, HostFacts, KernelFeatures};

pub(crate) struct LiveHost {
    net: Rtnetlink,
    cgroup2_root: Option<PathBuf>,
    features: KernelFeatures,
    /// The namespace's cookie, read once (the daemon never changes
    /// namespace).
    cookie: Option<u64>,
}

impl LiveHost {
    /// `state_dir` is where cgroup2 gets mounted on a host that has none.
    pub(crate) fn new(state_dir: &Path, features: KernelFeatures) -> io::Result<Self> {
        Ok(LiveHost { net: Rtnetlink::open()?, cgroup2_root: ensure_cgroup2(state_dir)?, features, cookie: None })
    }

    fn cookie(&mut self) -> Result<u64> {
        if let Some(c) = self.cookie {
            return Ok(c);
        }
        let cookie = if self.features.has(Feature::NetnsCookieSockopt) {
            netns_cookie::read_with_sockopt()
                .map_err(|source| BackendError::Netlink { op: "read the netns cookie".into(), source })?
        } else {
            let read = |root: &Path| netns_cookie::read_with_bpf(&netns_cookie::own_cgroup(root)?);
            let root = self.cgroup2_root.as_deref().ok_or_else(|| io::Error::other("no cgroup2 mount"));
            root.and_then(read).map_err(|e| BackendError::Bpf {
                op: "read the netns cookie (this kernel has no SO_NETNS_COOKIE)".into(),
                detail: e.to_string(),
            })?
        };
        self.cookie = Some(cookie);
        Ok(cookie)
    }
}

impl HostBackend for LiveHost {
    fn facts(&mut self) -> Result<HostFacts> {
        let mut facts = self.net.link_facts()?;
        facts.netns_cookie = self.cookie()?;
        facts.cgroup2_root = self.cgroup2_root.clone();
        facts.features = self.features.clone();
        Ok(facts)
    }

    fn path_mtus(&mut self, to: &[std::net::IpAddr]) -> Result<std::collections::BTreeMap<std::net::IpAddr, u32>> {
        self.net.path_mtus(to)
    }

    fn backend_routes(
        &mut self,
        to: &[std::net::IpAddr],
    ) -> Result<std::collections::BTreeMap<std::net::IpAddr, crate::model::BackendRoute>> {
        self.net.backend_routes(to)
    }

    fn addresses(
        &mut self,
    ) -> Result<std::collections::BTreeMap<String, std::collections::BTreeSet<std::net::IpAddr>>> {
        self.net.addresses()
    }
}

/// Where cgroup2 is mounted. When nothing is, mounts it under the state dir
/// (docs/design.md, "Attach modes").
pub(crate) fn ensure_cgroup2(state_dir: &Path) -> io::Result<Option<PathBuf>> {
    if let Some(root) = cgroup2_mount()? {
        return Ok(Some(root));
    }
    let dir = state_dir.join(CGROUP2_DIR);
    fs::create_dir_all(&dir)?;
    match nix::mount::mount(Some("cgroup2"), &dir, Some("cgroup2"), nix::mount::MsFlags::empty(), None::<&str>) {
        Ok(()) => Ok(Some(dir)),
        Err(_) => Ok(None),
    }
}

/// The dir under the state dir where hostmesh mounts cgroup2 on a host
/// without a cgroup2 mount (teardown unmounts it).
pub(crate) const CGROUP2_DIR: &str = "cgroup2";

/// Every cgroup2 mount point, in /proc/self/mounts' order.
fn cgroup2_mounts() -> io::Result<Vec<PathBuf>> {
    let mounts = fs::read_to_string("/proc/self/mounts")?;
    Ok(mounts
        .lines()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .filter(|f| f.len() > 2 && f[2] == "cgroup2")
        .map(|f| PathBuf::from(f[1].replace("\\040", " ")))
        .collect())
}

fn cgroup2_mount() -> io::Result<Option<PathBuf>> {
    Ok(cgroup2_mounts()?.into_iter().next())
}

/// Whether `dir` is a cgroup2 mount point.
pub(crate) fn is_cgroup2_mount(dir: &Path) -> io::Result<bool> {
    Ok(cgroup2_mounts()?.iter().any(|m| m == dir))
}
