//! The Rust mirror of `probes/hostmesh_abi.h`: map keys and values exactly
//! as the probes read them, and the header's constants. `layout_tests`
//! compares every struct (size, each field's offset and size) and every
//! constant with the BTF of the compiled probes, so a change on one side
//! only fails `cargo test`, without root.

#[cfg(test)]
pub(crate) mod btf;
mod gateway;
#[cfg(test)]
mod layout_tests;
mod maps;
mod mesh;
mod objects;

pub use gateway::*;
pub use maps::{Capacity, HmMap, MapDef, MAPS, RETIRED_MAPS};
pub use mesh::{MeshKey, MeshValue};
pub use objects::{ObjectDef, ProbeObject, OBJECTS};

/// The struct `name` as an object's BTF lays it out (tests).
#[cfg(test)]
pub(crate) fn btf_struct(object: &[u8], name: &str) -> Option<btf::Struct> {
    btf::Btf::of_object(object).ok()?.structs().ok()?.remove(name)
}

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// (VIP, port, protocol, scope): the key of `HM_SERVICES`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct SvcKey {
    /// IPv6, or IPv4-mapped IPv6 (::ffff:a.b.c.d).
    pub addr: [u8; 16],
    /// Network byte order.
    pub port_be: u16,
    pub proto: u8,
    /// `SVC_SCOPE_HOST` or `SVC_SCOPE_NETWORK`.
    pub scope: u8,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct SvcValue {
    pub id: u32,
    /// 0: the service refuses connections.
    pub backend_count: u32,
    pub flags: u32,
    /// Maglev table size (prime).
    pub table_size: u32,
}

/// `HM_BACKEND_STATS` key: a (service, backend) pair.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct BackendStatsKey {
    pub addr: [u8; 16],
    pub port_be: u16,
    pub pad: u16,
    pub svc_id: u32,
}

/// One CPU's counters in `HM_BACKEND_STATS`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct BackendStats {
    /// connect() and unconnected UDP sendmsg() calls rewritten to it.
    pub ctlb_connections: u64,
    /// New flows of the veth path.
    pub veth_connections: u64,
    /// Veth path and flows from the network: bytes client -> backend,
    /// each packet's length at TC (with its Ethernet header).
    pub bytes_to: u64,
    /// The same, backend -> client.
    pub bytes_from: u64,
}

/// `HM_CONFIG[0]`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct HmConfig {
    pub netns_cookie: u64,
    pub flags: u32,
    pub tcp_timeout_s: u32,
    pub udp_timeout_s: u32,
    /// `[daemon] snat_port_range`, host byte order.
    pub snat_port_min: u16,
    pub snat_port_max: u16,
}

/// `SvcValue::flags`: the VIP:port is also a mesh entry; connect-time LB
/// leaves it to the sidecar.
pub const SVC_F_MESH: u32 = 1 << 0;
/// `SvcValue::flags`: affinity = "client-ip" (its timeout in
/// `HM_SVC_AFFINITY`).
pub const SVC_F_AFFINITY: u32 = 1 << 1;
/// `SvcValue::flags`: external = true; packets from the network to the
/// VIP:port are balanced at the host interfaces too.
pub const SVC_F_EXTERNAL: u32 = 1 << 2;
/// `SvcValue::flags`: a node port's entry (the family's unspecified
/// address, the node port): packets from the network to any address of
/// this host on that port.
pub const SVC_F_NODE_PORT: u32 = 1 << 3;
/// `SvcValue::flags`: external_policy = "local"; the entry's table (chunks
/// keyed with `MAGLEV_LOCAL`) holds this host's backends only.
pub const SVC_F_LOCAL: u32 = 1 << 4;
/// `SvcKey::scope`: this host's clients (connect-time LB, the veth path).
pub const SVC_SCOPE_HOST: u8 = 0;
/// `SvcKey::scope`: clients on other machines (an external VIP's and a
/// node port's entries).
pub const SVC_SCOPE_NETWORK: u8 = 1;
/// `MaglevKey::chunk`: set on the chunks of a service's table of this
/// host's backends.
pub const MAGLEV_LOCAL: u32 = 1 << 31;

/// `HM_SVC_AFFINITY`: service id -> affinity settings.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct SvcAffinity {
    pub timeout_s: u32,
    pub pad: u32,
}

/// `HM_AFFINITY` key: a client of a service.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct AffKey {
    /// IPv6, or IPv4-mapped; zero: the host (an unbound socket).
    pub client: [u8; 16],
    pub svc_id: u32,
}

/// `HM_AFFINITY` value: the backend that client reached last.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct AffValue {
    pub backend_id: u32,
    pub pad: u32,
    pub last_seen_ns: u64,
}

pub const CFG_CTLB_TCP: u32 = 1 << 0;
pub const CFG_CTLB_UDP: u32 = 1 << 1;
/// A service is reached from the network: hm_reply and hm_direct look
/// packets up in HM_NAT only then.
pub const CFG_EXTERNAL: u32 = 1 << 2;

/// `HM_BACKENDS`: backend id -> address.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct BackendValue {
    pub addr: [u8; 16],
    pub port_be: u16,
    pub pad: u16,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct MaglevKey {
    pub svc_id: u32,
    pub chunk: u32,
}

pub const MAGLEV_CHUNK: usize = 64;

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct MaglevChunk {
    pub backend: [u32; MAGLEV_CHUNK],
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct CtKey {
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub sport_be: u16,
    pub dport_be: u16,
    pub proto: u8,
    pub dir: u8,
    pub pad: u16,
}

pub const CT_FORWARD: u8 = 0;
pub const CT_REVERSE: u8 = 1;

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct CtValue {
    pub nat_addr: [u8; 16],
    pub nat_port_be: u16,
    pub flags: u8,
    pub pad: u8,
    pub svc_id: u32,
    pub last_seen_ns: u64,
    /// A forward entry's next hop (probes/service_nat.c, find_hop): the
    /// epoch it was found in, the interface (0: not known), both MACs.
    pub fib_epoch: u32,
    pub fib_ifindex: u32,
    pub fib_macs: [u8; 12],
    pub pad2: u32,
}

pub const CT_F_REPLIED: u8 = 1 << 0;
pub const CT_F_CLOSING: u8 = 1 << 1;
pub const CT_F_FIN_OUT: u8 = 1 << 2;
pub const CT_F_FIN_BACK: u8 = 1 << 3;
/// A RST: a packet's news. Builds before this one stored it in the closed
/// entries of a reset flow, which they kept a second; this one forgets a
/// reset flow at once (probes/conntrack.h).
pub const CT_F_RESET: u8 = 1 << 4;
/// A TCP flow opened by a packet that was not a SYN: it lives
/// `CT_PICKUP_TIMEOUT_S` until the backend answers. `CtValue`s only: in a
/// `NatValue` the bit is `NAT_F_REPLY`.
pub const CT_F_PICKUP: u8 = 1 << 5;
/// The bits of the flag byte `CtValue`s and `NatValue`s share: the flow's
/// state. Above them each map has its own (`CT_F_PICKUP`, `NAT_F_*`), so
/// what the two share reads flags through `FlowState`.
pub const FLOW_STATE_MASK: u8 = CT_F_REPLIED | CT_F_CLOSING | CT_F_FIN_OUT | CT_F_FIN_BACK | CT_F_RESET;
const _: () = assert!(CT_F_PICKUP & FLOW_STATE_MASK == 0, "HM_CT's own bits are outside the shared state");
const _: () = assert!(
    (NAT_F_REPLY | NAT_F_SNAT | NAT_F_HOST) & FLOW_STATE_MASK == 0,
    "HM_NAT's own bits are outside the shared state"
);

/// A flow's state, as both conntrack maps' entries hold it: their flags
/// through `FLOW_STATE_MASK`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowState(u8);

impl FlowState {
    pub fn of(flags: u8) -> FlowState {
        FlowState(flags & FLOW_STATE_MASK)
    }

    /// Whether it has every bit of `bits` (`CT_F_*` states).
    pub fn has(self, bits: u8) -> bool {
        self.0 & bits == bits
    }
}
/// Conntrack timeouts fixed in the probes.
pub const CT_SYN_TIMEOUT_S: u64 = 60;
pub const CT_PICKUP_TIMEOUT_S: u64 = 2;
pub const CT_CLOSING_TIMEOUT_S: u64 = 10;
/// The defaults of `[daemon] conntrack_tcp_timeout` / `conntrack_udp_timeout`.
pub const CT_TCP_TIMEOUT_DEFAULT_S: u64 = 86_400;
pub const CT_UDP_TIMEOUT_DEFAULT_S: u64 = 60;

/// `HM_NAT`: a flow from the network, one entry per direction, keyed by
/// `CtKey` with `dir` `NAT_IN` or `NAT_OUT` (hostmesh_abi.h): what a
/// packet the key matches is rewritten to.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct NatValue {
    pub dst: [u8; 16],
    pub src: [u8; 16],
    pub dport_be: u16,
    pub sport_be: u16,
    pub flags: u8,
    pub pad: [u8; 3],
    pub svc_id: u32,
    pub fib_epoch: u32,
    pub last_seen_ns: u64,
    pub fib_ifindex: u32,
    pub fib_macs: [u8; 12],
}

pub const NAT_IN: u8 = 0;
pub const NAT_OUT: u8 = 1;
/// `NatValue::flags` (beside the `CT_F_*` states): the backend's entry.
pub const NAT_F_REPLY: u8 = 1 << 5;
/// `NatValue::flags`: the client's address is replaced by this host's.
pub const NAT_F_SNAT: u8 = 1 << 6;
/// `NatValue::flags`: the client is a process of this host (the turnaround).
pub const NAT_F_HOST: u8 = 1 << 7;
/// Ports a new flow tries before it is dropped.
pub const SNAT_TRIES: u32 = 16;
/// HM_HOST_ADDRS' capacity: the addresses of the host interfaces.
pub const MAX_HOST_ADDRS: u32 = 4096;

/// An address alone: `HM_SNAT`'s key.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Addr {
    pub addr: [u8; 16],
}

/// `HM_SNAT`: the source external flows to a backend take; all zero for a
/// backend on this host.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct SnatValue {
    pub src: [u8; 16],
}

/// `HM_REVERSE_SOCK` key: what connect-time LB rewrote a socket to.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct RevSkKey {
    /// The socket's cookie.
    pub cookie: u64,
    /// The backend it was sent to.
    pub addr: [u8; 16],
    /// Network byte order.
    pub port_be: u16,
    pub pad: [u16; 3],
}

/// `HM_REVERSE_SOCK` value: the VIP the socket asked for.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct RevSkValue {
    pub addr: [u8; 16],
    /// Network byte order.
    pub port_be: u16,
    pub pad: u16,
}

/// `HM_MESH_SOCKETS` key: the sidecar listener for a redirect port.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct SockKey {
    /// Host byte order.
    pub port: u16,
    pub family: u8,
    pub proto: u8,
}

pub const AF_INET: u8 = 2;
pub const AF_INET6: u8 = 10;

/// A timeout as the probes' u32 seconds (saturating).
pub fn secs(d: std::time::Duration) -> u32 {
    d.as_secs().min(u64::from(u32::MAX)) as u32
}

/// Map capacities the probes declare (`HM_MAX_*` in the header); the
/// defaults of the `[daemon]` size keys (config/capacity.rs), which the
/// daemon applies when it creates the maps.
pub const MAX_SERVICES: u32 = 65536;
pub const MAX_BACKENDS: u32 = 65536;
pub const MAX_MAGLEV_CHUNKS: u32 = 1_048_576;
pub const CONNTRACK_SIZE: u32 = 131072;
pub const MAX_REVERSE_SOCK: u32 = 131072;
pub const MAX_AFFINITY: u32 = 131072;
pub const MESH_MAP_SIZE: u32 = 16384;

/// probes/netns_cookie.c answers sockets that connect here over UDP
/// (`HM_NETNS_COOKIE_ADDR`, `HM_NETNS_COOKIE_PORT`).
pub const NETNS_COOKIE_ADDR: std::net::Ipv4Addr = std::net::Ipv4Addr::new(127, 0, 0, 1);
pub const NETNS_COOKIE_PORT: u16 = 9;

/// `sizeof(struct bpf_tunnel_key)` with the tunnel's source address
/// (`HM_TUNNEL_KEY_SIZE`): what the tunnel-source feature probe passes.
pub const TUNNEL_KEY_SIZE: u32 = 44;

/// What the programs return (`HM_TC_ACT_*`, `HM_SK_PASS`): TC programs
/// let classification go on, end it passing the packet, or redirect it;
/// sk_lookup programs let the lookup go on.
pub const TC_ACT_UNSPEC: i32 = -1;
pub const TC_ACT_OK: i32 = 0;
pub const TC_ACT_REDIRECT: i32 = 7;
pub const TC_ACT_SHOT: i32 = 2;
pub const SK_PASS: i32 = 1;

/// An address as the probes store it: IPv6, or IPv4-mapped.
pub fn addr16(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

pub fn ip_from16(addr: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(addr);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

impl LpmKey {
    /// The key for a CIDR (host bits must already be clear).
    pub fn of(net: &ipnet::IpNet) -> LpmKey {
        let extra = if net.addr().is_ipv4() { 96 } else { 0 };
        LpmKey { prefixlen: u32::from(net.prefix_len()) + extra, addr: addr16(net.addr()) }
    }
}

/// An address and port as the probes store them (16 bytes, port in
/// network byte order).
pub fn socket_addr16(addr: [u8; 16], port_be: u16) -> SocketAddr {
    SocketAddr::new(ip_from16(addr), u16::from_be(port_be))
}

impl BackendValue {
    pub fn socket_addr(&self) -> SocketAddr {
        socket_addr16(self.addr, self.port_be)
    }
}

/// Counters add up (over CPUs, over a service's keys); they wrap as the
/// probes' do.
impl std::ops::Add for BackendStats {
    type Output = BackendStats;
    fn add(self, b: BackendStats) -> BackendStats {
        BackendStats {
            ctlb_connections: self.ctlb_connections.wrapping_add(b.ctlb_connections),
            veth_connections: self.veth_connections.wrapping_add(b.veth_connections),
            bytes_to: self.bytes_to.wrapping_add(b.bytes_to),
            bytes_from: self.bytes_from.wrapping_add(b.bytes_from),
        }
    }
}

impl SvcKey {
    pub fn new(vip: IpAddr, port: u16, proto: u8) -> Self {
        SvcKey { addr: addr16(vip), port_be: port.to_be(), proto, scope: SVC_SCOPE_HOST }
    }

    /// The entry of packets from the network to `vip:port` (an external
    /// VIP, or the family's unspecified address for a node port).
    pub fn network(vip: IpAddr, port: u16, proto: u8) -> Self {
        SvcKey { scope: SVC_SCOPE_NETWORK, ..SvcKey::new(vip, port, proto) }
    }

    pub fn vip(&self) -> IpAddr {
        ip_from16(self.addr)
    }

    pub fn port(&self) -> u16 {
        u16::from_be(self.port_be)
    }
}

/// Plain-old-data that crosses into a BPF map as bytes: every type the
/// zerocopy derives accept, which they do only for a struct without
/// padding whose every bit pattern is a value. The derives are the only
/// safe way to get those traits, so safe code cannot make a type `Pod`
/// that would read or write uninitialised or invalid bytes.
///
/// A struct without padding is `Pod` by the derives:
/// ```
/// use zerocopy::{FromBytes, Immutable, IntoBytes};
/// #[derive(Clone, Copy, FromBytes, IntoBytes, Immutable)]
/// #[repr(C)]
/// struct Key { port: u16, proto: u8, family: u8 }
/// fn pod<T: hostmesh::abi::Pod>() {}
/// pod::<Key>();
/// ```
/// one with padding is refused by them:
/// ```compile_fail
/// use zerocopy::{FromBytes, Immutable, IntoBytes};
/// #[derive(Clone, Copy, FromBytes, IntoBytes, Immutable)]
/// #[repr(C)]
/// struct Key { port: u16, proto: u8 }
/// fn pod<T: hostmesh::abi::Pod>() {}
/// pod::<Key>();
/// ```
/// and their traits cannot be implemented by hand (they are `unsafe`,
/// and zerocopy admits only its derives):
/// ```compile_fail
/// use zerocopy::{FromBytes, Immutable, IntoBytes};
/// #[derive(Clone, Copy, Immutable)]
/// #[repr(C)]
/// struct Key { port: u16, proto: u8 }
/// impl FromBytes for Key {}
/// impl IntoBytes for Key {}
/// fn pod<T: hostmesh::abi::Pod>() {}
/// pod::<Key>();
/// ```
pub trait Pod: FromBytes + IntoBytes + Immutable + Copy + 'static {
    fn to_bytes(&self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }

    /// `None` unless `bytes` is exactly one value long (any alignment).
    fn from_bytes(bytes: &[u8]) -> Option<Self> {
        Self::read_from_bytes(bytes).ok()
    }
}

impl<T: FromBytes + IntoBytes + Immutable + Copy + 'static> Pod for T {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_both_families() {
        for (ip, port) in [("10.96.0.10", 80u16), ("fd00::10", 443)] {
            let ip: IpAddr = ip.parse().unwrap();
            let k = SvcKey::new(ip, port, 6);
            let back = SvcKey::from_bytes(&k.to_bytes()).unwrap();
            assert_eq!(back, k);
            assert_eq!(back.vip(), ip);
            assert_eq!(back.port(), port);
        }
    }

    #[test]
    fn ipv4_is_stored_mapped_and_port_big_endian() {
        let k = SvcKey::new("10.96.0.10".parse().unwrap(), 80, 17);
        let b = k.to_bytes();
        assert_eq!(&b[..16], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 96, 0, 10]);
        assert_eq!(&b[16..18], &[0, 80]);
        assert_eq!(b[18], 17);
    }
}
