//! The shape of kernel state hostmesh owns, as plain data: what compile
//! wants (`Desired`, each item tagged with the config objects that need it)
//! and what observe finds (`Observed`). Both use the same keys and specs so
//! the planner can diff them.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;

use ipnet::IpNet;
use serde::Serialize;

pub(crate) use super::owners::{IntoOwner, Object, Owner, Owners};
pub(crate) use super::wireguard_state::{RuleSpec, WireguardPeer, WireguardSpec};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Owned<T> {
    pub spec: T,
    pub owners: Owners,
}

/// The route protocol number marking hostmesh's routes (`proto hostmesh`
/// once iproute2's rt_protos.d entry is installed).
pub(crate) const RTPROT_HOSTMESH: u8 = 0x68;
pub(crate) const RT_TABLE_MAIN: u32 = 254;

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
    /// A flow-based VXLAN device (`external`): the tunnel key comes from
    /// the TC programs on it.
    Vxlan { port: u16, mac: [u8; 6], up: bool },
    /// A WireGuard device, whole: its key, port and peers are set with it.
    Wireguard(WireguardSpec),
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
    /// `dst via gateway dev dev onlink [encap ...]`
    Via { gateway: IpAddr, dev: String, mtu: Option<u32>, encap: Option<TunnelEncap> },
    /// `local dst dev dev src src` (in the local table): deliver to this
    /// host. `src` is what local clients of dst send from.
    Local { dev: String, src: IpAddr },
    /// `unreachable dst`: fail at once (a peer that is down).
    Unreachable,
    /// `dst dev dev src src`: straight into a device with no next hop
    /// (WireGuard), leaving from `src` (the tunnel's `local_ip`: where the
    /// kernel cannot set a tunnel's source, the route's is used, and the
    /// peer accepts only that one).
    Dev { dev: String, src: IpAddr },
}

/// The tunnel key of a route into a flow-based tunnel device (`encap ip id
/// ID dst DST src SRC ttl 64`; `encap ip6` over IPv6): the device sends the
/// route's packets to `dst` (a gateway's or member's underlay address) and
/// keeps their outer route cached (model/gateway.rs). `src` is `local_ip`,
/// when of `dst`'s family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TunnelEncap {
    pub id: u32,
    pub dst: IpAddr,
    pub src: Option<IpAddr>,
}

impl RouteSpec {
    /// The link the route depends on, if any.
    pub fn dev(&self) -> Option<&str> {
        match self {
            RouteSpec::Via { dev, .. } | RouteSpec::Local { dev, .. } | RouteSpec::Dev { dev, .. } => Some(dev),
            RouteSpec::Unreachable => None,
        }
    }
}

pub(crate) const RT_TABLE_LOCAL: u32 = 255;

pub(crate) use super::bpf_map::BpfMap;
pub(crate) use super::map_value::{MaglevTable, MapValue};

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct MapEntryKey {
    pub map: BpfMap,
    pub key: super::map_key::KeyBytes,
}

/// By map, then by key: as numbers for the maps keyed by ids (a backend's
/// id, a service's id and chunk), whose ids a compile hands out in order,
/// so its entries go in at the end of the tree, not all over it; as bytes
/// for the others.
impl Ord for MapEntryKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.map.cmp(&other.map).then_with(|| {
            if self.map.keyed_by_ids() && self.key.len() == other.key.len() && self.key.len().is_multiple_of(4) {
                fn words(k: &[u8]) -> impl Iterator<Item = u32> + '_ {
                    k.chunks_exact(4).map(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
                }
                words(&self.key).cmp(words(&other.key))
            } else {
                self.key.cmp(&other.key)
            }
        })
    }
}

impl PartialOrd for MapEntryKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

pub(crate) use super::program::Program;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(tag = "kind", content = "target", rename_all = "snake_case")]
pub enum Hook {
    /// TC ingress of an interface (TCX).
    TcIngress(String),
    /// TC egress of an interface (TCX).
    TcEgress(String),
    /// A cgroup v2 dir, for the program's own attach type.
    Cgroup(PathBuf),
    /// The daemon's own network namespace (sk_lookup).
    Netns,
}

/// A program attached at a hook.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Attachment {
    pub program: Program,
    pub hook: Hook,
}

/// '/' cannot appear in a pin name: paths are percent-escaped.
fn escape(path: &std::path::Path) -> String {
    path.to_string_lossy().replace('%', "%25").replace('/', "%2F")
}

fn unescape(s: &str) -> PathBuf {
    PathBuf::from(s.replace("%2F", "/").replace("%25", "%"))
}

impl Attachment {
    /// A file name for the pinned link: `hm_natout@tc-ingress@hm-natout`,
    /// `hm_connect4@cgroup@%2Fsys%2Ffs%2Fcgroup`.
    pub fn pin_name(&self) -> String {
        match &self.hook {
            Hook::TcIngress(dev) => format!("{}@tc-ingress@{dev}", self.program.name()),
            Hook::TcEgress(dev) => format!("{}@tc-egress@{dev}", self.program.name()),
            Hook::Cgroup(path) => format!("{}@cgroup@{}", self.program.name(), escape(path)),
            Hook::Netns => format!("{}@netns", self.program.name()),
        }
    }

    pub fn from_pin_name(name: &str) -> Option<Attachment> {
        let mut parts = name.splitn(3, '@');
        let program = Program::from_name(parts.next()?)?;
        let kind = parts.next()?;
        if kind == "netns" {
            return parts.next().is_none().then_some(Attachment { program, hook: Hook::Netns });
        }
        let hook = match (kind, parts.next()?) {
            ("tc-ingress", dev) if !dev.is_empty() && !dev.contains('@') => Hook::TcIngress(dev.to_string()),
            ("tc-egress", dev) if !dev.is_empty() && !dev.contains('@') => Hook::TcEgress(dev.to_string()),
            ("cgroup", path) if path.starts_with("%2F") => Hook::Cgroup(unescape(path)),
            _ => return None,
        };
        Some(Attachment { program, hook })
    }

    /// The interface a TC attachment depends on.
    pub fn device(&self) -> Option<&str> {
        match &self.hook {
            Hook::TcIngress(dev) | Hook::TcEgress(dev) => Some(dev),
            Hook::Cgroup(_) | Hook::Netns => None,
        }
    }
}

impl fmt::Display for Attachment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.hook {
            Hook::TcIngress(dev) => write!(f, "{} on tc ingress of {dev}", self.program.name()),
            Hook::TcEgress(dev) => write!(f, "{} on tc egress of {dev}", self.program.name()),
            Hook::Cgroup(path) => write!(f, "{} on cgroup {}", self.program.name(), path.display()),
            Hook::Netns => write!(f, "{} on this network namespace", self.program.name()),
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

/// A mesh entry as an nftables tproxy rule in `table inet hostmesh` (the
/// fallback when sk_lookup is not available).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct NftRule {
    pub vip: IpAddr,
    /// 0: every port.
    pub port: u16,
    /// IPPROTO_TCP or IPPROTO_UDP.
    pub proto: u8,
    pub redirect_port: u16,
}

/// How mesh redirects are carried out, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "backend", rename_all = "snake_case")]
pub(crate) enum MeshPath {
    SkLookup,
    Nftables { reason: String },
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Desired {
    pub links: BTreeMap<String, Owned<LinkSpec>>,
    /// Path under /proc/sys -> value.
    pub sysctls: BTreeMap<String, Owned<String>>,
    pub neighbours: BTreeMap<NeighKey, Owned<NeighSpec>>,
    pub map_entries: BTreeMap<MapEntryKey, Owned<MapValue>>,
    pub attachments: BTreeMap<Attachment, Owned<()>>,
    pub routes: BTreeMap<RouteKey, Owned<RouteSpec>>,
    /// Policy routing rules.
    pub rules: BTreeMap<RuleSpec, Owned<()>>,
    /// The tproxy rules of `table inet hostmesh`; the table exists only
    /// when there are some.
    pub nft_rules: BTreeMap<NftRule, Owned<()>>,
    /// How mesh entries are carried out, when there are any.
    pub mesh_path: Option<MeshPath>,
    /// The connect-time mode in force (`model::ctlb_mode`).
    pub connect_time: crate::config::CtlbMode,
    /// Things compile could not honour, in plain sentences.
    pub warnings: Vec<String>,
    /// Peers not applied because their encryption cannot be carried here,
    /// with why (`model::encryption::refuse`).
    pub refused_peers: BTreeMap<String, String>,
    /// Services with external_policy = "local": how many of their backends
    /// serve on this host (`[daemon] service_health_listen` answers it).
    pub local_backends: BTreeMap<String, usize>,
    /// The ids compile gave, for `Compiled::new` to take.
    #[serde(skip)]
    pub ids: AssignedIds,
}

/// The ids a full compile gave services and backends: what `Compiled`
/// indexes, which would otherwise read them back from 265,000 entries at
/// 100,000 services. They are what the entries say, so two desired
/// states compare equal whatever theirs hold.
#[derive(Clone, Default)]
pub(crate) struct AssignedIds(pub Option<std::sync::Arc<Ids>>);

/// Service keys' and backend addresses' ids.
pub(crate) type Ids = (BTreeMap<crate::abi::SvcKey, u32>, BTreeMap<std::net::SocketAddr, u32>);

impl PartialEq for AssignedIds {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for AssignedIds {}

impl std::fmt::Debug for AssignedIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "AssignedIds(kept)" } else { "AssignedIds(none)" })
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Observed {
    pub links: BTreeMap<String, LinkSpec>,
    pub sysctls: BTreeMap<String, String>,
    pub neighbours: BTreeMap<NeighKey, NeighSpec>,
    pub map_entries: BTreeMap<MapEntryKey, MapValue>,
    pub attachments: BTreeMap<Attachment, AttachStatus>,
    pub routes: BTreeMap<RouteKey, RouteSpec>,
    pub rules: BTreeSet<RuleSpec>,
    /// `table inet hostmesh`'s rules; `None` when the table does not exist.
    pub nft_table: Option<BTreeSet<NftRule>>,
    /// `Some` when the map entries were read against a desired state
    /// (`observe_until` given one): `map_entries` then holds only the
    /// kernel's entries that differ from its or that it lacks, and this
    /// its keys the kernel lacks, in order. Entries equal to its are not
    /// kept: a resync at 100,000 services reads 265,000.
    pub map_entries_missing: Option<Vec<MapEntryKey>>,
}

impl Desired {
    /// The kernel state this describes, as observe would report it once
    /// applied: what an edit that is no patch plans from.
    pub(crate) fn as_observed(&self) -> Observed {
        self.as_observed_with(specs(&self.map_entries), specs(&self.routes))
    }

    /// `as_observed`, with `map_entries` and `routes` for its own (a
    /// patch's plan holds only the items it touched).
    pub(crate) fn as_observed_with(
        &self,
        map_entries: BTreeMap<MapEntryKey, MapValue>,
        routes: BTreeMap<RouteKey, RouteSpec>,
    ) -> Observed {
        Observed {
            links: specs(&self.links),
            sysctls: specs(&self.sysctls),
            neighbours: specs(&self.neighbours),
            map_entries,
            attachments: self.attachments.keys().map(|a| (a.clone(), AttachStatus::Current)).collect(),
            routes,
            rules: self.rules.keys().cloned().collect(),
            nft_table: (!self.nft_rules.is_empty()).then(|| self.nft_rules.keys().cloned().collect()),
            map_entries_missing: None,
        }
    }
}

/// Each item's spec, without its owners.
fn specs<K: Ord + Clone, V: Clone>(m: &BTreeMap<K, Owned<V>>) -> BTreeMap<K, V> {
    m.iter().map(|(k, v)| (k.clone(), v.spec.clone())).collect()
}

/// Adds `owner` to the item at `key`, inserting `spec` if it is new. A
/// caller adding many items for one object passes its `Owner` (shared);
/// a `&str` makes a new one.
pub(crate) fn want<K: Ord, T>(map: &mut BTreeMap<K, Owned<T>>, key: K, spec: impl Into<T>, owner: impl IntoOwner) {
    map.entry(key)
        .or_insert_with(|| Owned { spec: spec.into(), owners: Owners::new() })
        .owners
        .insert(owner.into_owner());
}

/// The items `want` one at a time would make of `items` (any order, keys
/// repeated: one item with every owner and the first spec), built at once.
/// A tree filled by ascending inserts, as a compile's are, keeps its nodes
/// about half empty (36 MB instead of 19 for the 265,000 map entries of
/// 100,000 services); one built from sorted items fills them.
pub(crate) fn wanted_all<K: Ord, T>(mut items: Vec<(K, Owned<T>)>) -> BTreeMap<K, Owned<T>> {
    // Stable: of equal keys the first stays first, as `want` keeps it.
    items.sort_by(|a, b| a.0.cmp(&b.0));
    items.dedup_by(|next, kept| {
        let same = next.0 == kept.0;
        if same {
            kept.1.owners.extend_from(&next.1.owners);
        }
        same
    });
    items.into_iter().collect()
}

pub(crate) fn fmt_mac(mac: &[u8; 6]) -> String {
    mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}
