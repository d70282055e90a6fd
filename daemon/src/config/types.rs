//! Typed, validated configuration. Produced by `validate`, consumed by
//! `model::compile`. Every object remembers where it was declared.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ipnet::IpNet;
use serde::Serialize;

pub(crate) use crate::keys::{KeySource, PublicKey};

use super::capacity::MapSizes;
use super::error::Origin;
pub(crate) use super::health_check::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    pub(crate) const ALL: [Protocol; 2] = [Protocol::Tcp, Protocol::Udp];

    /// The IP protocol number (IPPROTO_TCP, IPPROTO_UDP).
    pub(crate) fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
        }
    }

    /// The protocol of a number as the probes store it, if it is one of
    /// these.
    pub(crate) fn from_number(n: u8) -> Option<Protocol> {
        Protocol::ALL.into_iter().find(|p| p.number() == n)
    }

    /// The name of a stored protocol number: "tcp", "udp", or the number.
    pub(crate) fn name_of(n: u8) -> String {
        Protocol::from_number(n).map_or_else(|| n.to_string(), |p| p.to_string())
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        })
    }
}

/// `[daemon] connect_time_lb`: which protocols the connect-time programs
/// handle; the rest goes through the bpfnat veth.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub(crate) enum CtlbMode {
    All,
    #[default]
    Tcp,
    Off,
}

impl CtlbMode {
    pub(crate) const ALL: [CtlbMode; 3] = [CtlbMode::All, CtlbMode::Tcp, CtlbMode::Off];

    /// Whether connect-time load balancing handles this protocol (the rest
    /// takes the bpfnat veth): the one statement of the rule.
    pub(crate) fn handles(self, protocol: Protocol) -> bool {
        match self {
            CtlbMode::All => true,
            CtlbMode::Tcp => protocol == Protocol::Tcp,
            CtlbMode::Off => false,
        }
    }

    /// The protocols it handles.
    pub(crate) fn protocols(self) -> impl Iterator<Item = Protocol> {
        Protocol::ALL.into_iter().filter(move |p| self.handles(*p))
    }

    /// Whether some protocol is left to the bpfnat veth.
    pub(crate) fn leaves_some(self) -> bool {
        Protocol::ALL.into_iter().any(|p| !self.handles(p))
    }

    /// Its value in `[daemon] connect_time_lb`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            CtlbMode::All => "all",
            CtlbMode::Tcp => "tcp",
            CtlbMode::Off => "off",
        }
    }
}

/// `[daemon] tc_attach`: how TC programs are attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum TcAttachPref {
    /// TCX where the kernel has it, clsact filters otherwise.
    #[default]
    Auto,
    /// clsact filters even where TCX exists.
    Netlink,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub(crate) enum MeshBackend {
    #[default]
    Auto,
    SkLookup,
    Nftables,
}

/// Kubernetes' ClientIP affinity default.
pub(crate) const DEFAULT_AFFINITY_TIMEOUT: Duration = Duration::from_secs(3 * 3600);

/// `[daemon] metrics_listen`: loopback only, on a port outside those of
/// the well-known exporters (node 9100, blackbox 9115, ...).
pub(crate) const DEFAULT_METRICS_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9853);
pub(crate) const DEFAULT_METRICS_BACKEND_LIMIT: u32 = 1000;

pub(crate) const DEFAULT_RESYNC_INTERVAL: Duration = Duration::from_secs(30);
/// The probes' defaults (`HM_CT_*_TIMEOUT_DEFAULT_S` in hostmesh_abi.h).
pub(crate) const DEFAULT_CONNTRACK_TCP_TIMEOUT: Duration = Duration::from_secs(crate::abi::CT_TCP_TIMEOUT_DEFAULT_S);
pub(crate) const DEFAULT_CONNTRACK_UDP_TIMEOUT: Duration = Duration::from_secs(crate::abi::CT_UDP_TIMEOUT_DEFAULT_S);

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct DaemonSettings {
    pub connect_time_lb: CtlbMode,
    /// `None`: the interfaces holding a default route.
    pub host_interfaces: Option<Vec<String>>,
    /// `None`: the cgroup2 root.
    pub cgroup: Option<PathBuf>,
    pub mesh_backend: MeshBackend,
    pub resync_interval: Duration,
    /// Maglev table size for services that do not set their own; `None`:
    /// sized from each service's backend count (`table_size::table_size_for`).
    pub maglev_table_size: Option<u32>,
    pub conntrack_tcp_timeout: Duration,
    pub conntrack_udp_timeout: Duration,
    /// Capacities of the maps (config/capacity.rs).
    pub sizes: MapSizes,
    /// How TC programs are attached.
    pub tc_attach: TcAttachPref,
    /// Where the Prometheus endpoint listens; `None`: "off".
    pub metrics_listen: Option<SocketAddr>,
    /// Above this many backends in all, per-backend series are summed per
    /// service.
    pub metrics_backend_limit: u32,
    /// Node ports must fall in it; reserved for the host
    /// (`ip_local_reserved_ports`) while any service has one.
    pub node_port_range: PortRange,
    /// The source ports of flows from the network to a backend on another
    /// host; reserved for the host while any service is external.
    pub snat_port_range: PortRange,
    /// Where `GET /services/NAME` answers how many of an
    /// external_policy = "local" service's backends serve here; `None`: off.
    pub service_health_listen: Option<SocketAddr>,
    pub origin: Option<Origin>,
}

/// An inclusive range of ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    pub(crate) fn contains(&self, port: u16) -> bool {
        (self.first..=self.last).contains(&port)
    }

    pub(crate) fn overlaps(&self, other: &PortRange) -> bool {
        self.first <= other.last && other.first <= self.last
    }
}

impl std::fmt::Display for PortRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

/// Kubernetes' node port range.
pub(crate) const DEFAULT_NODE_PORT_RANGE: PortRange = PortRange { first: 30000, last: 32767 };
/// Above Linux's default ephemeral range (32768-60999), so reserving it
/// takes nothing from the host's own connections.
pub(crate) const DEFAULT_SNAT_PORT_RANGE: PortRange = PortRange { first: 61000, last: 65535 };

impl Default for DaemonSettings {
    fn default() -> Self {
        DaemonSettings {
            connect_time_lb: CtlbMode::default(),
            host_interfaces: None,
            cgroup: None,
            mesh_backend: MeshBackend::default(),
            resync_interval: DEFAULT_RESYNC_INTERVAL,
            maglev_table_size: None,
            conntrack_tcp_timeout: DEFAULT_CONNTRACK_TCP_TIMEOUT,
            conntrack_udp_timeout: DEFAULT_CONNTRACK_UDP_TIMEOUT,
            sizes: MapSizes::default(),
            tc_attach: TcAttachPref::default(),
            metrics_listen: Some(DEFAULT_METRICS_LISTEN),
            metrics_backend_limit: DEFAULT_METRICS_BACKEND_LIMIT,
            node_port_range: DEFAULT_NODE_PORT_RANGE,
            snat_port_range: DEFAULT_SNAT_PORT_RANGE,
            service_health_listen: None,
            origin: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Backend {
    pub addr: SocketAddr,
    /// 0: draining (no new connections; established ones finish).
    pub weight: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Service {
    pub name: String,
    pub vip: IpAddr,
    pub port: u16,
    pub protocol: Protocol,
    pub backends: Vec<Backend>,
    /// `None`: `[daemon] maglev_table_size`.
    pub maglev_table_size: Option<u32>,
    /// `None`: every backend with a weight takes traffic. Boxed: most
    /// services have none, and a service's size counts at 100,000.
    pub health_check: Option<Box<HealthCheck>>,
    /// affinity = "client-ip": its `affinity_timeout`; `None`: no affinity.
    pub affinity: Option<Duration>,
    /// TCP: how long established flows keep a backend that left before
    /// they are dropped; `None`: until they close.
    pub drain_timeout: Option<Duration>,
    /// Every address of the host interfaces (of the VIP's family) answers
    /// on this port too, for clients on other machines.
    pub node_port: Option<u16>,
    /// Packets from the network to vip:port are balanced too.
    pub external: bool,
    /// Which backends clients on other machines reach, and what they see.
    pub external_policy: ExternalPolicy,
    pub origin: Origin,
}

/// `external_policy`: how flows from the network (node ports, external
/// VIPs) are balanced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ExternalPolicy {
    /// Any backend; one on another host sees this host's address.
    #[default]
    Snat,
    /// This host's backends only, which see the client's own address;
    /// with none serving, new flows are refused.
    Local,
}

impl Service {
    /// Whether clients on other machines reach it (a node port, or an
    /// external VIP).
    pub(crate) fn serves_network(&self) -> bool {
        self.external || self.node_port.is_some()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Mesh {
    pub name: String,
    pub vip: IpAddr,
    /// 0: every port of the VIP.
    pub port: u16,
    pub protocol: Protocol,
    pub redirect_port: u16,
    pub origin: Origin,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum GatewayRole {
    Member,
    Gateway,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Gateway {
    pub role: GatewayRole,
    pub local_ip: IpAddr,
    /// A member's gateways, in order of preference (`gateway_ips`, or
    /// `gateway_ip` as a list of one); empty on a gateway.
    pub gateway_ips: Vec<IpAddr>,
    pub vni: u32,
    pub udp_port: u16,
    /// How often a gateway probes each peer.
    pub probe_interval: Duration,
    /// A peer is down after this many probes in a row go unanswered.
    pub probe_loss: u32,
    /// The UDP port gateways probe each other on.
    pub probe_port: u16,
    /// A gateway that is down is up again after this many probes in a row
    /// are answered.
    pub probe_rise: u32,
    /// Whether a recovered gateway earlier in its list takes the traffic
    /// back from the one it moved to.
    pub preempt: bool,
    /// This gateway's WireGuard private key (`private_key_file`), needed
    /// once a peer is encrypted; where it is, never the key.
    pub private_key: Option<KeySource>,
    /// The UDP port this gateway's WireGuard device listens on.
    pub wireguard_port: u16,
    pub origin: Origin,
}

pub(crate) const DEFAULT_WIREGUARD_PORT: u16 = 51820;

pub(crate) const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_secs(1);
pub(crate) const DEFAULT_PROBE_LOSS: u32 = 3;
pub(crate) const DEFAULT_PROBE_RISE: u32 = 2;
pub(crate) const DEFAULT_PROBE_PORT: u16 = 4790;
/// Gateways a member may list, and endpoints a peer may: each is probed.
pub(crate) const MAX_GATEWAYS_PER_SITE: usize = 8;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Peer {
    pub name: String,
    /// The peer site's gateways, in order of preference (`endpoints`, or
    /// `endpoint` as a list of one); empty on a member's peer.
    pub endpoints: Vec<IpAddr>,
    pub cidrs: Vec<IpNet>,
    pub encryption: Encryption,
    pub origin: Origin,
}

impl Peer {
    /// Whether the peer's traffic goes through WireGuard.
    pub(crate) fn encrypted(&self) -> bool {
        self.encryption != Encryption::None
    }
}

/// How a peer's traffic crosses between this site's gateways and its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase", tag = "kind")]
pub(crate) enum Encryption {
    /// VXLAN in clear.
    None,
    /// VXLAN inside WireGuard: each of the peer's gateways' public key
    /// (in the order of `endpoints`), and the port they listen on (`None`:
    /// this gateway's own `wireguard_port`).
    Wireguard { public_keys: Vec<PublicKey>, port: Option<u16> },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Member {
    pub name: String,
    pub endpoint: IpAddr,
    pub cidrs: Vec<IpNet>,
    pub origin: Origin,
}

/// What one drop-in file declares, validated on its own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FileConfig {
    pub daemon: Option<DaemonSettings>,
    pub services: Vec<Arc<Service>>,
    pub meshes: Vec<Mesh>,
    pub gateway: Option<Gateway>,
    pub peers: Vec<Peer>,
    pub members: Vec<Member>,
    /// What is derived from it once and kept with the parse: its claims,
    /// indexed at its first merge (`file_index`).
    pub derived: Derived,
}

/// Data derived from a value, computed at its first use and kept with it
/// (the derived type is its user's business: `file_index` puts a file's
/// claims here). It follows from the value, so two values compare equal
/// whatever their cells hold, and a copy starts empty.
#[derive(Default)]
pub(crate) struct Derived(OnceLock<Box<dyn std::any::Any + Send + Sync>>);

impl Derived {
    /// The derived `T`, made by `make` at the first call.
    pub(crate) fn get_or_init<T: std::any::Any + Send + Sync>(&self, make: impl FnOnce() -> T) -> &T {
        self.0.get_or_init(|| Box::new(make())).downcast_ref().expect("one type of derived data per value")
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.0.get().is_none()
    }
}

impl fmt::Debug for Derived {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.get().is_some() { "Derived(made)" } else { "Derived(empty)" })
    }
}

impl Clone for Derived {
    fn clone(&self) -> Self {
        Derived::default()
    }
}

impl PartialEq for Derived {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Derived {}

/// The configuration in force: every accepted file merged.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Config {
    pub daemon: DaemonSettings,
    pub services: Vec<Arc<Service>>,
    pub meshes: Vec<Mesh>,
    pub gateway: Option<Gateway>,
    pub peers: Vec<Peer>,
    pub members: Vec<Member>,
}
