//! The kernel backends the reconciler drives, behind small traits so the
//! planner and sync loop are tested with `fake::FakeKernel`:
//!
//! - `HostBackend`: facts about the host (interfaces, netns cookie, MTUs);
//! - `NetBackend`: links, routes, neighbours (rtnetlink);
//! - `SysctlBackend`: /proc/sys, read-compare-write;
//! - `BpfBackend`: pinned maps and attached programs (aya);
//! - `NftBackend`: hostmesh's own nftables table (the mesh fallback);
//! - `SidecarBackend`: mesh sidecar listeners and `HM_MESH_SOCKETS`, for
//!   the registrar (`sidecars/`), which is tested with `fake::FakeSidecars`.
//!
//! Observation returns only what hostmesh owns: links named `hm-*`, routes
//! with hostmesh's route protocol, neighbours on `hm-*` links, maps and
//! links pinned under hostmesh's bpffs dir.

pub mod bpf;
#[cfg(test)]
pub(crate) mod fake;
#[cfg(test)]
pub(crate) mod fake_sidecars;
pub(crate) mod host;
pub(crate) mod ifaces;
pub mod netlink;
pub(crate) mod nft;
pub(crate) mod probe_wire;
pub(crate) mod sidecar;
pub(crate) mod sockopt;
pub(crate) mod sysctl;

use std::collections::BTreeMap;
use std::io;

use crate::abi;
use crate::model::*;

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("netlink: {op}: {source}")]
    Netlink {
        op: String,
        #[source]
        source: io::Error,
    },
    #[error("sysctl {path}: {source}")]
    Sysctl {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("bpf: {op}: {detail}")]
    Bpf { op: String, detail: String },
    #[error("nftables: {op}: {detail}")]
    Nft { op: String, detail: String },
}

pub type Result<T> = std::result::Result<T, BackendError>;

/// Owned link names start with this.
pub const LINK_PREFIX: &str = "hm-";

pub trait HostBackend {
    fn facts(&mut self) -> Result<HostFacts>;
    /// The MTU of the path to each address (the route's, or its link's);
    /// addresses with no route are left out.
    fn path_mtus(&mut self, to: &[std::net::IpAddr]) -> Result<BTreeMap<std::net::IpAddr, u32>>;
    /// The route to each address; addresses with no route are left out.
    fn backend_routes(
        &mut self,
        to: &[std::net::IpAddr],
    ) -> Result<BTreeMap<std::net::IpAddr, crate::model::BackendRoute>>;
    /// Every interface's addresses, by name.
    fn addresses(&mut self) -> Result<BTreeMap<String, std::collections::BTreeSet<std::net::IpAddr>>>;
}

pub trait NetBackend {
    fn links(&mut self) -> Result<BTreeMap<String, LinkSpec>>;
    fn create_link(&mut self, name: &str, spec: &LinkSpec) -> Result<()>;
    fn set_link_up(&mut self, name: &str) -> Result<()>;
    /// Sets an existing link's configuration to `spec` in place (a
    /// WireGuard device's key, port, MTU and exact peers, and up).
    fn configure_link(&mut self, name: &str, spec: &LinkSpec) -> Result<()>;
    /// Deleting a link that does not exist succeeds.
    fn delete_link(&mut self, name: &str) -> Result<()>;
    fn routes(&mut self) -> Result<BTreeMap<RouteKey, RouteSpec>>;
    /// Creates or replaces.
    fn replace_route(&mut self, key: &RouteKey, spec: &RouteSpec) -> Result<()>;
    fn delete_route(&mut self, key: &RouteKey) -> Result<()>;
    /// hostmesh's policy rules (`proto hostmesh`).
    fn rules(&mut self) -> Result<std::collections::BTreeSet<RuleSpec>>;
    /// Adding a rule that exists already succeeds.
    fn add_rule(&mut self, rule: &RuleSpec) -> Result<()>;
    /// Deleting a rule that is gone already succeeds.
    fn delete_rule(&mut self, rule: &RuleSpec) -> Result<()>;
    fn neighbours(&mut self) -> Result<BTreeMap<NeighKey, NeighSpec>>;
    fn replace_neighbour(&mut self, key: &NeighKey, spec: &NeighSpec) -> Result<()>;
    fn delete_neighbour(&mut self, key: &NeighKey) -> Result<()>;
}

pub trait SysctlBackend {
    /// `None` when the sysctl does not exist (an interface that is gone).
    fn get(&mut self, path: &str) -> Result<Option<String>>;
    fn set(&mut self, path: &str, value: &str) -> Result<()>;
}

/// What takes one map's entries at a time (`map_entries_each_until`).
pub type MapEntriesSink<'a> = dyn FnMut(Vec<(MapEntryKey, MapValue)>) + 'a;

pub trait BpfBackend {
    /// Loads the programs and maps (once): the gate before any step that
    /// needs them.
    fn prepare(&mut self) -> Result<()>;
    /// Starts loading the programs and maps in the background, for
    /// `prepare` (or any other use) to wait for, and verifying `likely`,
    /// the programs the caller expects to attach (any other is verified
    /// when first used): the caller will need them and has other work to
    /// do first.
    fn preload(&mut self, _likely: &std::collections::BTreeSet<crate::model::Program>) {}
    /// Lets the part of a load that no configuration changes, started
    /// with the backend (`PinnedBpf::warmed`), go: nothing will be loaded.
    fn cool_down(&mut self) {}
    /// Repairs and replacements made on the way (a lost pin pinned again,
    /// a map of another layout replaced), as sentences for the log.
    fn take_notes(&mut self) -> Vec<String> {
        Vec::new()
    }
    /// What keeps programs from seeing every packet, as sentences for the
    /// status (another tool's clsact filter ahead of hostmesh's).
    fn warnings(&self) -> Vec<String> {
        Vec::new()
    }
    /// Every configuration map entry (`BpfMap`), as `MapValue::read_back`
    /// keeps it.
    fn map_entries(&mut self) -> Result<BTreeMap<MapEntryKey, MapValue>>;
    /// `map_entries`, handed to `each` one map at a time (in `BpfMap`
    /// order, each map's sorted by key: all of them in key order); false
    /// when `give_up` said so part way (checked between maps and between
    /// batches of a map).
    fn map_entries_each_until(&mut self, give_up: &dyn Fn() -> bool, each: &mut MapEntriesSink<'_>) -> Result<bool> {
        if give_up() {
            return Ok(false);
        }
        let mut run: Vec<(MapEntryKey, MapValue)> = Vec::new();
        for (k, v) in self.map_entries()? {
            if run.last().is_some_and(|(last, _)| last.map != k.map) {
                each(std::mem::take(&mut run));
            }
            run.push((k, v));
        }
        if !run.is_empty() {
            each(run);
        }
        Ok(true)
    }
    /// `map_entries`, or `None` when `give_up` said so part way.
    fn map_entries_until(&mut self, give_up: &dyn Fn() -> bool) -> Result<Option<BTreeMap<MapEntryKey, MapValue>>> {
        // Made into the tree at once: inserted one by one at its end, its
        // nodes would stay half empty.
        let mut all = Vec::new();
        let whole = self.map_entries_each_until(give_up, &mut |mut entries| all.append(&mut entries))?;
        Ok(whole.then(|| all.into_iter().collect()))
    }
    fn put_map_entry(&mut self, key: &MapEntryKey, value: &[u8]) -> Result<()>;
    fn delete_map_entry(&mut self, key: &MapEntryKey) -> Result<()>;
    /// Creates or replaces each entry, in order, as `put_map_entry` on
    /// each would, in as few system calls as the kernel allows. Every
    /// entry is tried; returns those that failed, by index, with their
    /// errors.
    fn put_map_entries(&mut self, entries: &[(&MapEntryKey, &[u8])]) -> Vec<(usize, BackendError)> {
        let put = |(i, (k, v)): (usize, &(&MapEntryKey, &[u8]))| self.put_map_entry(k, v).err().map(|e| (i, e));
        entries.iter().enumerate().filter_map(put).collect()
    }
    /// `delete_map_entry` of each key, in order, as `put_map_entries`.
    fn delete_map_entries(&mut self, keys: &[&MapEntryKey]) -> Vec<(usize, BackendError)> {
        let delete = |(i, k): (usize, &&MapEntryKey)| self.delete_map_entry(k).err().map(|e| (i, e));
        keys.iter().enumerate().filter_map(delete).collect()
    }
    fn attachments(&mut self) -> Result<BTreeMap<Attachment, AttachStatus>>;
    /// Every hook hostmesh has a program at, without judging (or loading)
    /// the program: what teardown detaches.
    fn present(&mut self) -> Result<std::collections::BTreeSet<Attachment>>;
    /// Attaches, or atomically replaces what is attached at the hook.
    fn attach(&mut self, attachment: &Attachment) -> Result<()>;
    fn detach(&mut self, attachment: &Attachment) -> Result<()>;
    /// Removes flows past their timeout from the conntrack maps (closed
    /// TCP, idle UDP); says how many, and what is left.
    fn expire_flows(&mut self) -> Result<Sweep>;
    /// Drops the flows of backends that left their service: forgets the
    /// veth path's flows to them and destroys the connected sockets
    /// connect-time LB pointed at them, so the next datagram reaches a
    /// serving backend and a connected socket's owner gets an error and
    /// reconnects. The daemon calls it for UDP at once and for TCP after
    /// `drain_timeout`.
    fn drop_flows(&mut self, stopped: &[StoppedBackend]) -> Result<Forgotten>;
    /// After a sync that changed a service with affinity: deletes the
    /// clients' remembered backends that are not in `serving` (each
    /// affinity service's serving backends) for their service; returns how
    /// many.
    fn prune_affinity(
        &mut self,
        serving: &BTreeMap<abi::SvcKey, std::collections::BTreeSet<std::net::SocketAddr>>,
    ) -> Result<usize>;
    /// After a clean full sync: deletes the traffic counters
    /// (HM_BACKEND_STATS) of (service, backend) pairs not configured;
    /// returns how many. `configured` is asked once, about the services
    /// the counters name only.
    fn prune_backend_stats(&mut self, configured: ConfiguredPairs<'_>) -> Result<usize>;
    /// Sets the capacity of configurable maps and how TC programs are
    /// attached. Returns true when that replaced loaded maps or changed the
    /// TC mode (the kernel must then be re-read).
    fn configure(&mut self, settings: &BpfSettings) -> Result<bool>;
    /// The capacities the maps have (or are created at), where they differ
    /// from the configured ones: `BpfSettings::unused`. `None`: as
    /// configured.
    fn map_sizes(&self) -> Option<MapSizes> {
        None
    }
    /// Why the sk_lookup program cannot be used here, if it cannot.
    fn sk_lookup_unavailable(&mut self) -> Option<String>;
    /// After a sync that attached this build's programs: copies the flows
    /// that the programs they replaced kept writing into maps retired by a
    /// resize, then lets those maps go. Returns what it did, as sentences.
    fn finish_migration(&mut self) -> Result<Vec<String>> {
        Ok(Vec::new())
    }
}

pub use crate::config::MapSizes;

/// Of the services asked about, the (service, backend) pairs configured.
/// Asked rather than given whole: counters exist for the pairs that carried
/// traffic only, and the set of every pair at 100,000 services is 10 MB.
pub type ConfiguredPairs<'a> = &'a dyn Fn(
    &std::collections::HashSet<abi::SvcKey>,
) -> std::collections::HashSet<(abi::SvcKey, std::net::SocketAddr)>;

/// A backend that left a service's Maglev table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct StoppedBackend {
    pub(crate) vip: std::net::SocketAddr,
    pub(crate) protocol: crate::config::Protocol,
    pub(crate) backend: std::net::SocketAddr,
}

/// What `drop_flows` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Forgotten {
    /// Conntrack entries deleted (two per flow).
    pub flow_entries: usize,
    pub sockets: usize,
    /// Why connected sockets could not be destroyed, if they could not
    /// (a kernel without CONFIG_INET_DIAG_DESTROY).
    pub sockets_error: Option<String>,
}

/// What a conntrack sweep did and found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sweep {
    /// Entries removed (both maps: the veth path's and the gateway's).
    pub removed: usize,
    /// Entries left in the veth path's conntrack (two per flow): of open
    /// flows, and of closed TCP flows; and the capacity of each of the two
    /// maps. All 0 while they do not exist.
    pub open: usize,
    pub closed: usize,
    pub capacity: u32,
    /// Entries left in HM_NAT (two per flow from the network; same
    /// capacity), and the source ports of snat_port_range they hold.
    pub external: usize,
    pub snat_ports: usize,
}

/// What the configuration decides about the BPF backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BpfSettings {
    /// The configured capacities.
    pub sizes: MapSizes,
    /// Capacities the configuration does not use: maps allocated whole
    /// are created small for them (`MapSizes::to_create`).
    pub unused: crate::config::Capacities,
    pub tc_attach: TcAttachPref,
}

/// `table inet hostmesh`: the nftables fallback of mesh redirects.
pub trait NftBackend {
    /// The table's rules, or `None` when the table does not exist.
    fn mesh_table(&mut self) -> Result<Option<std::collections::BTreeSet<NftRule>>>;
    /// Starts reading the table for the next `mesh_table`, which the
    /// caller asks for after other work (the nft tool takes milliseconds
    /// to start).
    fn prefetch_mesh_table(&mut self) {}
    /// Replaces the whole table in one transaction.
    fn replace_mesh_table(&mut self, rules: &std::collections::BTreeSet<NftRule>) -> Result<()>;
    fn delete_mesh_table(&mut self) -> Result<()>;
}

/// A socket found listening on a redirect port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    pub addr: std::net::SocketAddr,
    pub inode: u32,
    /// The kernel's socket cookie: what HM_MESH_SOCKETS reports back.
    pub cookie: u64,
}

/// The process holding a socket, and the descriptor it holds it as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    pub fd: i32,
    pub comm: String,
}

/// How a taken listener is put to work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Install {
    /// Into HM_MESH_SOCKETS under its key, for the sk_lookup program.
    SockMap,
    /// Marked IP_TRANSPARENT, so the nftables fallback's tproxy may hand
    /// it traffic for other addresses.
    Transparent,
}

#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// pidfd_open / pidfd_getfd refused (no CAP_SYS_PTRACE over the holder).
    #[error("{0}")]
    Take(io::Error),
    #[error("{0}")]
    Install(io::Error),
}

/// The kernel side of registering sidecar listeners. The live one is the
/// only writer of `HM_MESH_SOCKETS`.
pub trait SidecarBackend {
    /// The socket bound to the key's redirect port on loopback (preferred)
    /// or the wildcard address in this namespace, listening (TCP) or
    /// unconnected (UDP).
    fn find_listener(&mut self, key: &abi::SockKey) -> io::Result<Option<Listener>>;
    /// The first process other than this one that holds the socket.
    fn holder(&mut self, inode: u32) -> Option<Holder>;
    /// `HM_MESH_SOCKETS`: every key with its socket's cookie; `None` while
    /// the map is not loaded.
    fn registered(&mut self) -> Option<BTreeMap<abi::SockKey, u64>>;
    /// Takes the holder's descriptor (a duplicate, closed on return) and
    /// installs it for `key`.
    fn register(&mut self, key: &abi::SockKey, holder: &Holder, how: Install)
        -> std::result::Result<(), RegisterError>;
    /// Takes `key` out of `HM_MESH_SOCKETS`; a missing key is not an error.
    fn unregister(&mut self, key: &abi::SockKey);
}

/// The daemon holds its sidecar backend boxed (live, or a test's fake).
impl<S: SidecarBackend + ?Sized> SidecarBackend for Box<S> {
    fn find_listener(&mut self, key: &abi::SockKey) -> io::Result<Option<Listener>> {
        (**self).find_listener(key)
    }
    fn holder(&mut self, inode: u32) -> Option<Holder> {
        (**self).holder(inode)
    }
    fn registered(&mut self) -> Option<BTreeMap<abi::SockKey, u64>> {
        (**self).registered()
    }
    fn register(
        &mut self,
        key: &abi::SockKey,
        holder: &Holder,
        how: Install,
    ) -> std::result::Result<(), RegisterError> {
        (**self).register(key, holder, how)
    }
    fn unregister(&mut self, key: &abi::SockKey) {
        (**self).unregister(key)
    }
}

/// The backends together, as the reconciler uses them.
pub struct Backends {
    pub host: Box<dyn HostBackend + Send>,
    pub net: Box<dyn NetBackend + Send>,
    pub sysctl: Box<dyn SysctlBackend + Send>,
    pub bpf: Box<dyn BpfBackend + Send>,
    pub nft: Box<dyn NftBackend + Send>,
}
