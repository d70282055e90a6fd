//! An in-memory kernel for unit tests of plan, apply and the sync loop.
//! It enforces the dependencies the real kernel does (a route, neighbour,
//! sysctl or TC program needs its link; deleting a link takes them along),
//! so ordering mistakes fail here the way they would for real.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::*;

#[derive(Debug, Default)]
pub(crate) struct KernelState {
    pub links: BTreeMap<String, LinkSpec>,
    pub sysctls: BTreeMap<String, String>,
    pub neighbours: BTreeMap<NeighKey, NeighSpec>,
    pub maps: BTreeMap<MapEntryKey, Vec<u8>>,
    pub attachments: BTreeMap<Attachment, AttachStatus>,
    pub routes: BTreeMap<RouteKey, RouteSpec>,
    pub rules: std::collections::BTreeSet<RuleSpec>,
    pub nft_table: Option<std::collections::BTreeSet<NftRule>>,
    pub facts: HostFacts,
    /// Every mutating call, in order ("create_link hm-natin", ...).
    pub log: Vec<String>,
    /// Fail the next mutating call whose log line starts with this.
    pub fail_next: Option<String>,
    /// When set, the BPF programs "cannot be loaded" for this reason.
    pub bpf_broken: Option<String>,
    /// Host sysctls (not on hm-* links) that exist, with their values.
    pub host_sysctls: BTreeMap<String, String>,
    /// A flag the next sysctl read raises: a full sync reads sysctls
    /// after the maps, so a test makes something happen between its
    /// observe and its plan.
    pub raise_on_sysctl_read: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// The table as a prefetch found it, until read (as the nft tool's
    /// listing: what the table was when it started).
    pub nft_listing: Option<Option<std::collections::BTreeSet<NftRule>>>,
}

/// Cheap to clone: every clone sees the same state, so a test keeps one
/// and hands the others to the reconciler as each of its backends.
#[derive(Debug, Clone, Default)]
pub(crate) struct FakeKernel(pub Arc<Mutex<KernelState>>);

impl FakeKernel {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn backends(&self) -> Backends {
        Backends {
            host: Box::new(self.clone()),
            net: Box::new(self.clone()),
            sysctl: Box::new(self.clone()),
            bpf: Box::new(self.clone()),
            nft: Box::new(self.clone()),
        }
    }

    pub(crate) fn state(&self) -> std::sync::MutexGuard<'_, KernelState> {
        self.0.lock().unwrap()
    }

    fn mutate(&self, what: String) -> Result<std::sync::MutexGuard<'_, KernelState>> {
        let mut s = self.state();
        if let Some(prefix) = &s.fail_next {
            if what.starts_with(prefix.as_str()) {
                s.fail_next = None;
                return Err(BackendError::Netlink { op: what, source: io::Error::from_raw_os_error(libc::EIO) });
            }
        }
        s.log.push(what);
        Ok(s)
    }
}

fn missing(op: String, errno: i32) -> BackendError {
    BackendError::Netlink { op, source: io::Error::from_raw_os_error(errno) }
}

/// A link hostmesh made, or one of the host's (from the facts).
fn link_exists(s: &KernelState, dev: &str) -> bool {
    s.facts.interfaces.contains(dev)
        || s.links.iter().any(|(name, spec)| name == dev || matches!(spec, LinkSpec::Veth { peer, .. } if peer == dev))
}

fn sysctl_dev(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("net/ipv4/conf/").or_else(|| path.strip_prefix("net/ipv6/conf/"))?;
    rest.split('/').next()
}

impl HostBackend for FakeKernel {
    fn facts(&mut self) -> Result<HostFacts> {
        Ok(self.state().facts.clone())
    }

    fn path_mtus(&mut self, to: &[std::net::IpAddr]) -> Result<BTreeMap<std::net::IpAddr, u32>> {
        let s = self.state();
        Ok(to.iter().filter_map(|ip| s.facts.underlay_mtu.get(ip).map(|m| (*ip, *m))).collect())
    }

    fn backend_routes(
        &mut self,
        to: &[std::net::IpAddr],
    ) -> Result<BTreeMap<std::net::IpAddr, crate::model::BackendRoute>> {
        let s = self.state();
        Ok(to.iter().filter_map(|ip| s.facts.backend_routes.get(ip).map(|r| (*ip, r.clone()))).collect())
    }

    fn addresses(&mut self) -> Result<BTreeMap<String, std::collections::BTreeSet<std::net::IpAddr>>> {
        Ok(self.state().facts.addresses.clone())
    }
}

impl NetBackend for FakeKernel {
    fn links(&mut self) -> Result<BTreeMap<String, LinkSpec>> {
        Ok(self.state().links.clone())
    }

    fn create_link(&mut self, name: &str, spec: &LinkSpec) -> Result<()> {
        let mut s = self.mutate(format!("create_link {name}"))?;
        if link_exists(&s, name) {
            return Err(missing(format!("create link {name}"), libc::EEXIST));
        }
        s.links.insert(name.to_string(), spec.clone());
        Ok(())
    }

    fn set_link_up(&mut self, name: &str) -> Result<()> {
        let mut s = self.mutate(format!("set_link_up {name}"))?;
        match s.links.get_mut(name) {
            Some(LinkSpec::Veth { up, .. })
            | Some(LinkSpec::Vxlan { up, .. })
            | Some(LinkSpec::Wireguard(WireguardSpec { up, .. })) => {
                *up = true;
                Ok(())
            }
            _ => Err(missing(format!("set link {name} up"), libc::ENODEV)),
        }
    }

    fn configure_link(&mut self, name: &str, spec: &LinkSpec) -> Result<()> {
        let mut s = self.mutate(format!("configure_link {name}"))?;
        match s.links.get_mut(name) {
            Some(have @ LinkSpec::Wireguard(_)) if matches!(spec, LinkSpec::Wireguard(_)) => {
                *have = spec.clone();
                Ok(())
            }
            _ => Err(missing(format!("configure link {name}"), libc::ENODEV)),
        }
    }

    fn delete_link(&mut self, name: &str) -> Result<()> {
        let mut s = self.mutate(format!("delete_link {name}"))?;
        let Some(spec) = s.links.remove(name) else { return Ok(()) };
        let mut devs = vec![name.to_string()];
        if let LinkSpec::Veth { peer, .. } = spec {
            devs.push(peer);
        }
        s.routes.retain(|_, r| !r.dev().is_some_and(|d| devs.iter().any(|x| x == d)));
        s.neighbours.retain(|k, _| !devs.contains(&k.dev));
        s.sysctls.retain(|p, _| !sysctl_dev(p).is_some_and(|d| devs.iter().any(|x| x == d)));
        for (a, status) in s.attachments.iter_mut() {
            if a.device().is_some_and(|d| devs.iter().any(|x| x == d)) {
                *status = AttachStatus::Defunct;
            }
        }
        Ok(())
    }

    fn routes(&mut self) -> Result<BTreeMap<RouteKey, RouteSpec>> {
        Ok(self.state().routes.clone())
    }

    fn replace_route(&mut self, key: &RouteKey, spec: &RouteSpec) -> Result<()> {
        let mut s = self.mutate(format!("replace_route {}", key.dst))?;
        if let Some(dev) = spec.dev() {
            if !link_exists(&s, dev) {
                return Err(missing(format!("add route {} dev {dev}", key.dst), libc::ENODEV));
            }
        }
        s.routes.insert(key.clone(), spec.clone());
        Ok(())
    }

    fn delete_route(&mut self, key: &RouteKey) -> Result<()> {
        self.mutate(format!("delete_route {}", key.dst))?.routes.remove(key);
        Ok(())
    }

    fn rules(&mut self) -> Result<std::collections::BTreeSet<RuleSpec>> {
        Ok(self.state().rules.clone())
    }

    fn add_rule(&mut self, rule: &RuleSpec) -> Result<()> {
        self.mutate(format!("add_rule {}", rule.table))?.rules.insert(rule.clone());
        Ok(())
    }

    fn delete_rule(&mut self, rule: &RuleSpec) -> Result<()> {
        self.mutate(format!("delete_rule {}", rule.table))?.rules.remove(rule);
        Ok(())
    }

    fn neighbours(&mut self) -> Result<BTreeMap<NeighKey, NeighSpec>> {
        Ok(self.state().neighbours.clone())
    }

    fn replace_neighbour(&mut self, key: &NeighKey, spec: &NeighSpec) -> Result<()> {
        let mut s = self.mutate(format!("replace_neighbour {} {}", key.dev, key.ip))?;
        if !link_exists(&s, &key.dev) {
            return Err(missing(format!("add neighbour dev {}", key.dev), libc::ENODEV));
        }
        s.neighbours.insert(key.clone(), spec.clone());
        Ok(())
    }

    fn delete_neighbour(&mut self, key: &NeighKey) -> Result<()> {
        self.mutate(format!("delete_neighbour {} {}", key.dev, key.ip))?.neighbours.remove(key);
        Ok(())
    }
}

impl SysctlBackend for FakeKernel {
    fn get(&mut self, path: &str) -> Result<Option<String>> {
        let mut s = self.state();
        if let Some(flag) = s.raise_on_sysctl_read.take() {
            flag.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        if let Some(v) = s.sysctls.get(path) {
            return Ok(Some(v.clone()));
        }
        if let Some(v) = s.host_sysctls.get(path) {
            return Ok(Some(v.clone()));
        }
        // A fresh link's sysctls exist with the kernel's defaults.
        Ok(sysctl_dev(path).filter(|d| link_exists(&s, d)).map(|_| "1".to_string()))
    }

    fn set(&mut self, path: &str, value: &str) -> Result<()> {
        let mut s = self.mutate(format!("set_sysctl {path}={value}"))?;
        let exists = s.host_sysctls.contains_key(path) || sysctl_dev(path).is_some_and(|d| link_exists(&s, d));
        if !exists {
            return Err(BackendError::Sysctl { path: path.into(), source: io::Error::from_raw_os_error(libc::ENOENT) });
        }
        if s.host_sysctls.contains_key(path) {
            s.host_sysctls.insert(path.to_string(), value.to_string());
        }
        s.sysctls.insert(path.to_string(), value.to_string());
        Ok(())
    }
}

impl BpfBackend for FakeKernel {
    fn prepare(&mut self) -> Result<()> {
        match &self.state().bpf_broken {
            Some(why) => Err(BackendError::Bpf { op: "load hostmesh.bpf.o".into(), detail: why.clone() }),
            None => Ok(()),
        }
    }

    fn map_entries(&mut self) -> Result<BTreeMap<MapEntryKey, MapValue>> {
        Ok(self.state().maps.iter().map(|(k, v)| (k.clone(), MapValue::read_back(k.map, v.clone()))).collect())
    }

    fn put_map_entry(&mut self, key: &MapEntryKey, value: &[u8]) -> Result<()> {
        self.mutate(format!("put_map_entry {}", key.map.name()))?.maps.insert(key.clone(), value.to_vec());
        Ok(())
    }

    fn delete_map_entry(&mut self, key: &MapEntryKey) -> Result<()> {
        self.mutate(format!("delete_map_entry {}", key.map.name()))?.maps.remove(key);
        Ok(())
    }

    fn attachments(&mut self) -> Result<BTreeMap<Attachment, AttachStatus>> {
        Ok(self.state().attachments.clone())
    }

    fn present(&mut self) -> Result<std::collections::BTreeSet<Attachment>> {
        Ok(self.state().attachments.keys().cloned().collect())
    }

    fn attach(&mut self, a: &Attachment) -> Result<()> {
        let mut s = self.mutate(format!("attach {}", a.pin_name()))?;
        if a.device().is_some_and(|d| !link_exists(&s, d)) {
            return Err(BackendError::Bpf { op: format!("attach {a}"), detail: "no such device".into() });
        }
        s.attachments.insert(a.clone(), AttachStatus::Current);
        Ok(())
    }

    fn detach(&mut self, a: &Attachment) -> Result<()> {
        self.mutate(format!("detach {}", a.pin_name()))?.attachments.remove(a);
        Ok(())
    }

    fn expire_flows(&mut self) -> Result<Sweep> {
        Ok(Sweep::default())
    }

    fn drop_flows(&mut self, _stopped: &[super::StoppedBackend]) -> Result<super::Forgotten> {
        Ok(super::Forgotten::default())
    }

    fn prune_affinity(
        &mut self,
        _serving: &BTreeMap<crate::abi::SvcKey, std::collections::BTreeSet<std::net::SocketAddr>>,
    ) -> Result<usize> {
        Ok(0)
    }

    fn prune_backend_stats(&mut self, _configured: crate::backends::ConfiguredPairs<'_>) -> Result<usize> {
        Ok(0)
    }

    fn configure(&mut self, _settings: &BpfSettings) -> Result<bool> {
        Ok(false)
    }

    fn sk_lookup_unavailable(&mut self) -> Option<String> {
        self.state().facts.sk_lookup_unavailable.clone()
    }
}

impl NftBackend for FakeKernel {
    fn mesh_table(&mut self) -> Result<Option<std::collections::BTreeSet<NftRule>>> {
        let mut s = self.state();
        Ok(s.nft_listing.take().unwrap_or_else(|| s.nft_table.clone()))
    }

    fn prefetch_mesh_table(&mut self) {
        let mut s = self.state();
        s.nft_listing = Some(s.nft_table.clone());
    }

    fn replace_mesh_table(&mut self, rules: &std::collections::BTreeSet<NftRule>) -> Result<()> {
        self.mutate("replace_nft_table".into())?.nft_table = Some(rules.clone());
        Ok(())
    }

    fn delete_mesh_table(&mut self) -> Result<()> {
        self.mutate("delete_nft_table".into())?.nft_table = None;
        Ok(())
    }
}
