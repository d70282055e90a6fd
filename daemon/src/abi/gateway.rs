//! The gateway programs' map layouts (probes/gateway.c, model/gateway.rs,
//! peer_health): the configuration, the LPM tries of sites, the learned
//! return paths, and the probes' payload.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// `HM_GW_CONFIG[0]`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct GwConfig {
    pub vni: u32,
    pub role: u32,
    /// Members: this site's gateway (underlay), as 16 bytes.
    pub gateway: [u8; 16],
    /// This host's underlay address (`local_ip`): the tunnel source.
    pub local: [u8; 16],
    /// Learned return paths expire when idle this long.
    pub tcp_timeout_s: u32,
    pub udp_timeout_s: u32,
}

pub const ROLE_MEMBER: u32 = 1;
pub const ROLE_GATEWAY: u32 = 2;

/// An LPM trie key: IPv4 /n is /(96 + n) of the mapped address.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct LpmKey {
    pub prefixlen: u32,
    pub addr: [u8; 16],
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Endpoint {
    pub addr: [u8; 16],
    pub flags: u32,
}

pub const EP_UP: u32 = 1 << 0;

/// `HM_PEER_ENDPOINTS` values: a peer gateway's address, and whether it is
/// an encrypted peer's, whose VXLAN is taken only through `hm-wg0`.
pub const PEER_EP_KNOWN: u32 = 1 << 0;
pub const PEER_EP_ENCRYPTED: u32 = 1 << 1;
/// The mark `hm_wg_in` gives what `hm-wg0` receives, for `hm_tun_in`.
pub const WG_RX_MARK: u32 = 0x686d_7772;

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct GwCtValue {
    pub member: [u8; 16],
    pub last_seen_ns: u64,
}

/// A gateway probe's payload (probes/hostmesh_abi.h, struct hm_gw_probe):
/// fields in network byte order; HM_GW_PROBES[slot] holds the last answer.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct GwProbe {
    pub magic: u32,
    pub kind: u32,
    pub slot: u32,
    pub pad: u32,
    pub seq: u64,
    pub nonce: u64,
    pub target: [u8; 16],
}

pub const PROBE_MAGIC: u32 = 0x686d_7072;
pub const PROBE_ASK: u32 = 1;
pub const PROBE_ACK: u32 = 2;
pub const PROBE_ADDR: std::net::Ipv4Addr = std::net::Ipv4Addr::new(169, 254, 2, 2);
pub const PROBE_PORT: u16 = 26733;
pub const MAX_GW_PROBES: u32 = 1024;

pub const MAX_GW_ROUTES: u32 = 16384;
pub const MAX_GW_CONNTRACK: u32 = 131072;
