//! The shape of kernel state hostmesh owns, as plain data: what compile
//! wants (`Desired`, each item tagged with the config objects that need it)
//! and what observe finds (`Observed`). Both use the same keys and specs so
//! the planner can diff them.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::Serialize;

/// The config objects an item exists for: `service/web`, `bpfnat`.
pub type Owners = BTreeSet<String>;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Owned<T> {
    pub spec: T,
    pub owners: Owners,
}

/// The route protocol number marking hostmesh's routes (`proto hostmesh`
/// once iproute2's rt_protos.d entry is installed).
pub const RTPROT_HOSTMESH: u8 = 0x68;
pub const RT_TABLE_MAIN: u32 = 254;

/// Links are keyed by name. A veth pair is one item, keyed by the
/// lexicographically smaller end (`hm-natin` < `hm-natout`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LinkSpec {
    Veth {
        peer: String,
        mac: [u8; 6],
        peer_mac: [u8; 6],
        /// Both ends administratively up.
        up: bool,
    },
    /// Something named like ours that is not what we create; observed only.
    Foreign { link_kind: String },
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct NeighKey {
    pub dev: String,
    pub ip: IpAddr,
}

/// A permanent neighbour entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NeighSpec {
    pub lladdr: [u8; 6],
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct RouteKey {
    pub table: u32,
    pub dst: IpNet,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RouteSpec {
    /// `dst via gateway dev dev onlink`
    Via { gateway: IpAddr, dev: String, mtu: Option<u32> },
}

/// The BPF maps whose contents are configuration (reconciled). Runtime
/// maps (counters, conntrack) are not listed: the probes own those.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum BpfMap {
    Services,
}

impl BpfMap {
    pub const ALL: [BpfMap; 1] = [BpfMap::Services];

    /// The map's name in the probe object, which is also its pin name.
    pub fn name(self) -> &'static str {
        match self {
            BpfMap::Services => "HM_SERVICES",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct MapEntryKey {
    pub map: BpfMap,
    pub key: Vec<u8>,
}

/// A probe program, by its function name in the object file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Program {
    /// TC ingress on hm-natout: service NAT for the bpfnat veth path.
    NatOut,
}

impl Program {
    pub const ALL: [Program; 1] = [Program::NatOut];

    pub fn name(self) -> &'static str {
        match self {
            Program::NatOut => "hm_natout",
        }
    }

    pub fn from_name(name: &str) -> Option<Program> {
        Program::ALL.into_iter().find(|p| p.name() == name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(tag = "kind", content = "target", rename_all = "snake_case")]
pub enum Hook {
    TcIngress(String),
}

/// A program attached at a hook.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Attachment {
    pub program: Program,
    pub hook: Hook,
}

impl Attachment {
    /// A file name for the pinned link: `hm_natout@tc-ingress@hm-natout`.
    pub fn pin_name(&self) -> String {
        match &self.hook {
            Hook::TcIngress(dev) => format!("{}@tc-ingress@{dev}", self.program.name()),
        }
    }

    pub fn from_pin_name(name: &str) -> Option<Attachment> {
        let mut parts = name.split('@');
        let program = Program::from_name(parts.next()?)?;
        let hook = match (parts.next()?, parts.next()?) {
            ("tc-ingress", dev) if !dev.is_empty() => Hook::TcIngress(dev.to_string()),
            _ => return None,
        };
        parts.next().is_none().then_some(Attachment { program, hook })
    }
}

impl fmt::Display for Attachment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.hook {
            Hook::TcIngress(dev) => write!(f, "{} on tc ingress of {dev}", self.program.name()),
        }
    }
}

/// What observe finds at an attachment point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AttachStatus {
    /// Attached, running the program this binary carries.
    Current,
    /// Attached, running another build of the program (an upgrade).
    Outdated,
    /// Pinned but no longer attached (its interface went away).
    Defunct,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Desired {
    pub links: BTreeMap<String, Owned<LinkSpec>>,
    /// Path under /proc/sys -> value.
    pub sysctls: BTreeMap<String, Owned<String>>,
    pub neighbours: BTreeMap<NeighKey, Owned<NeighSpec>>,
    pub map_entries: BTreeMap<MapEntryKey, Owned<Vec<u8>>>,
    pub attachments: BTreeMap<Attachment, Owned<()>>,
    pub routes: BTreeMap<RouteKey, Owned<RouteSpec>>,
    /// Things compile could not honour, in plain sentences.
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Observed {
    pub links: BTreeMap<String, LinkSpec>,
    pub sysctls: BTreeMap<String, String>,
    pub neighbours: BTreeMap<NeighKey, NeighSpec>,
    pub map_entries: BTreeMap<MapEntryKey, Vec<u8>>,
    pub attachments: BTreeMap<Attachment, AttachStatus>,
    pub routes: BTreeMap<RouteKey, RouteSpec>,
}

impl Desired {
    /// The kernel state this describes, as observe would report it once
    /// applied: the baseline for the next incremental sync.
    pub fn as_observed(&self) -> Observed {
        fn specs<K: Ord + Clone, V: Clone>(m: &BTreeMap<K, Owned<V>>) -> BTreeMap<K, V> {
            m.iter().map(|(k, v)| (k.clone(), v.spec.clone())).collect()
        }
        Observed {
            links: specs(&self.links),
            sysctls: specs(&self.sysctls),
            neighbours: specs(&self.neighbours),
            map_entries: specs(&self.map_entries),
            attachments: self.attachments.keys().map(|a| (a.clone(), AttachStatus::Current)).collect(),
            routes: specs(&self.routes),
        }
    }

    pub fn owners_of_all(&self) -> Owners {
        let mut all = Owners::new();
        for o in self
            .links
            .values()
            .map(|o| &o.owners)
            .chain(self.sysctls.values().map(|o| &o.owners))
            .chain(self.neighbours.values().map(|o| &o.owners))
            .chain(self.map_entries.values().map(|o| &o.owners))
            .chain(self.attachments.values().map(|o| &o.owners))
            .chain(self.routes.values().map(|o| &o.owners))
        {
            all.extend(o.iter().cloned());
        }
        all
    }
}

/// Adds `owner` to the item at `key`, inserting `spec` if it is new.
pub fn want<K: Ord, T>(map: &mut BTreeMap<K, Owned<T>>, key: K, spec: T, owner: &str) {
    map.entry(key).or_insert_with(|| Owned { spec, owners: Owners::new() }).owners.insert(owner.to_string());
}

pub fn fmt_mac(mac: &[u8; 6]) -> String {
    mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}
