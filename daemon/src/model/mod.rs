//! The model: a pure `compile(Config) -> Desired`, and the types both
//! sides of the reconciler speak. No I/O here; facts about the host that
//! compile needs (which interfaces exist) are passed in.

mod bpf_map;
mod bpfnat;
pub(crate) mod encryption;
pub(crate) mod external;
pub(crate) mod flow_hash;
pub(crate) mod gateway;
pub(crate) mod ids;
pub(crate) mod incremental;
mod kernel;
pub(crate) mod maglev;
mod map_key;
mod map_value;
mod mesh;
mod owners;
mod program;
mod reach;
mod services;
mod state;
mod wireguard_state;

use std::collections::BTreeSet;

pub(crate) use bpfnat::NATIN;
#[cfg(test)]
pub(crate) use bpfnat::{GATEWAY_V4, GATEWAY_V6, NATIN_MAC, NATOUT, NATOUT_MAC};
pub(crate) use ids::Prior;
pub use kernel::{Feature, TcAttach};
pub(crate) use kernel::{KernelFeatures, TcAttachPref};
pub(crate) use state::*;

use crate::config::{Config, CtlbMode};

/// What compile needs to know about the host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostFacts {
    /// Every interface name in the namespace.
    pub interfaces: BTreeSet<String>,
    /// Interfaces holding a default route (IPv4 or IPv6).
    pub default_route_interfaces: Vec<String>,
    /// The daemon's network namespace (SO_NETNS_COOKIE): connect-time
    /// programs act only there.
    pub netns_cookie: u64,
    /// Where cgroup2 is mounted: the default attach point of the
    /// connect-time programs.
    pub cgroup2_root: Option<std::path::PathBuf>,
    /// Why the sk_lookup program cannot be used here, if it cannot.
    pub sk_lookup_unavailable: Option<String>,
    /// The MTU of the path to each underlay address gateway peers use.
    pub underlay_mtu: std::collections::BTreeMap<std::net::IpAddr, u32>,
    /// The gateway the probes chose for each list of gateways (a
    /// member's own site, each peer): `None` when every one is down. A
    /// list missing here is unprobed: its first gateway carries traffic.
    pub gateways: std::collections::BTreeMap<Via, Option<std::net::IpAddr>>,
    /// What the kernel lacks (probed at start).
    pub features: KernelFeatures,
    /// The route to each backend of a service clients on other machines
    /// reach (node ports, external VIPs): whether it is this host's, and
    /// the source address the host would use towards it.
    pub backend_routes: std::collections::BTreeMap<std::net::IpAddr, BackendRoute>,
    /// Every interface's addresses (read when a service has a node port).
    pub addresses: std::collections::BTreeMap<String, BTreeSet<std::net::IpAddr>>,
    /// This gateway's WireGuard key, from `[gateway] private_key_file`
    /// read as the trust rules allow (it compares by its public half; the
    /// private half goes to the kernel only), or why it could not be read;
    /// `None` when no peer is encrypted.
    pub wireguard_key: Option<Result<crate::keys::DeviceKey, String>>,
}

/// A list of gateways traffic goes through: on a member, its own site's
/// (`gateway_ips`); on a gateway, a peer site's (`endpoints`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub enum Via {
    Site,
    Peer(String),
}

impl Via {
    /// The metrics' `path` label: "site", or "peer/NAME".
    pub fn label(&self) -> String {
        match self {
            Via::Site => "site".to_string(),
            Via::Peer(name) => format!("peer/{name}"),
        }
    }
}

impl std::fmt::Display for Via {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Via::Site => f.write_str("this site"),
            Via::Peer(name) => write!(f, "peer \"{name}\""),
        }
    }
}

impl HostFacts {
    /// The gateway of `list` (in order of preference) that carries the
    /// traffic of `via`: the probes' choice, or the first when unprobed;
    /// `None` when every one is down.
    pub fn gateway_in_use(&self, via: &Via, list: &[std::net::IpAddr]) -> Option<std::net::IpAddr> {
        match self.gateways.get(via) {
            Some(chosen) => chosen.filter(|ip| list.contains(ip)),
            None => list.first().copied(),
        }
    }
}

/// What `ip route get BACKEND` says, as far as flows from the network care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendRoute {
    /// A local route: the backend is an address of this host.
    pub local: bool,
    /// The interface the route leaves through.
    pub dev: Option<String>,
    /// The route's preferred source address.
    pub src: Option<std::net::IpAddr>,
}

/// The connect-time mode in force: the configured one, unless this kernel
/// lacks one of the two service paths (model/kernel.rs), in which case the
/// other takes everything and a warning says so.
pub(crate) fn ctlb_mode(config: &Config, facts: &HostFacts, warnings: &mut Vec<String>) -> CtlbMode {
    let wanted = config.daemon.connect_time_lb;
    let (forced, missing) = if !facts.features.has(Feature::ConnectTimeHooks) {
        (CtlbMode::Off, Feature::ConnectTimeHooks)
    } else if !facts.features.has(Feature::RedirectNeigh) {
        (CtlbMode::All, Feature::RedirectNeigh)
    } else {
        return wanted;
    };
    if wanted != forced && !config.services.is_empty() {
        warnings.push(format!(
            "connect_time_lb = \"{}\" cannot be honoured: this kernel lacks {} ({}), so {}",
            wanted.name(),
            missing.what(),
            missing.name(),
            missing.without()
        ));
    }
    forced
}

/// The programs a compile of `config` on a kernel with `features` will
/// likely attach: what the configuration alone says, before the host's
/// interfaces and the mesh's path are known. The probes' preload verifies
/// these ahead, beside the compile; any other is verified when it is
/// first used, so this is a hint, kept true by a test against compile.
pub(crate) fn programs_likely(config: &Config, features: &KernelFeatures) -> BTreeSet<Program> {
    let facts = HostFacts { features: features.clone(), ..Default::default() };
    let mode = ctlb_mode(config, &facts, &mut Vec::new());
    let mut out = BTreeSet::new();
    if !config.services.is_empty() && mode != CtlbMode::Off {
        out.extend(services::connect_time_programs(features));
    }
    if bpfnat::carries_services(config, mode) {
        out.extend([Program::NatIn, Program::NatOut]);
    }
    if bpfnat::carries_services(config, mode) || config.services.iter().any(|s| s.serves_network()) {
        out.extend([Program::Reply, Program::Direct]);
    }
    if !config.meshes.is_empty() && config.daemon.mesh_backend != crate::config::MeshBackend::Nftables {
        out.insert(Program::Mesh);
    }
    if config.gateway.is_some() {
        out.extend([Program::TunIn, Program::TunOut]);
        let encrypted = config.peers.iter().any(|p| p.encrypted());
        if encrypted && features.has(Feature::Wireguard) {
            out.insert(Program::WgIn);
        }
    }
    out
}

/// The capacities among those allocated whole (`config::ALLOCATED_WHOLE`)
/// whose maps a compile of `config` leaves unused, `programs` being what
/// `programs_likely` says it attaches: conntrack without the veth path and
/// flows from the network, connect-time LB's reverse map without
/// connect-time LB, client affinity without a service that has it. Their
/// maps are created small until the configuration uses them. Kept true by
/// a test against compile; where the hint names a program compile does
/// not attach, the map is only larger.
pub(crate) fn unused_capacities(config: &Config, programs: &BTreeSet<Program>) -> crate::config::Capacities {
    use crate::config::Capacity;
    let mut unused = crate::config::Capacities::default();
    if ![Program::NatIn, Program::NatOut, Program::Reply, Program::Direct].iter().any(|p| programs.contains(p)) {
        unused = unused.with(Capacity::Conntrack);
    }
    if !Program::CONNECT_TIME.iter().any(|p| programs.contains(p)) {
        unused = unused.with(Capacity::ReverseSock);
    }
    if !config.services.iter().any(|s| s.affinity.is_some()) {
        unused = unused.with(Capacity::Affinity);
    }
    unused
}

use std::sync::atomic::AtomicBool;

/// Config -> the kernel state it needs. `prior` keeps ids stable. The
/// daemon compiles through `compile_unless_stopped`; tests use this.
#[cfg(test)]
pub(crate) fn compile(config: &Config, facts: &HostFacts, prior: &Prior) -> Desired {
    compile_unless_stopped(config, facts, prior, &AtomicBool::new(false))
}

/// `compile`, giving up early once `stopping` is raised (a daemon told to
/// stop does not finish compiling 100,000 services first). What it returns
/// then is partial: the caller checks `stopping` and discards it.
pub(crate) fn compile_unless_stopped(
    config: &Config,
    facts: &HostFacts,
    prior: &Prior,
    stopping: &AtomicBool,
) -> Desired {
    let mut out = Desired::default();
    out.connect_time = ctlb_mode(config, facts, &mut out.warnings);
    // Where backends are, for services reached from the network
    // (`external::compile` reports host interfaces that do not exist).
    let reach = config
        .services
        .iter()
        .any(|s| s.serves_network())
        .then(|| reach::Reach::new(bpfnat::host_interfaces(config, facts, &mut Vec::new())));
    services::compile(config, facts, prior, reach.as_ref(), &mut out, stopping);
    bpfnat::compile(config, facts, &mut out);
    external::compile(config, facts, &mut out);
    mesh::compile(config, facts, &mut out);
    gateway::compile(config, facts, &mut out);
    out
}

#[cfg(test)]
mod tests;
