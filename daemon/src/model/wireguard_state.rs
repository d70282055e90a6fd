//! The kernel objects of encrypted peers (`model::encryption`), as plain
//! data like the rest of `state`: a WireGuard device and the policy rules
//! that steer into it.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Serialize;

/// A WireGuard device as hostmesh sets it (`wg set`), and as observe reads
/// it back (with no private key: the kernel's is compared by its public
/// half).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WireguardSpec {
    pub port: u16,
    /// The mark on the device's own UDP packets, which the policy rules
    /// let through to the main table (`model::gateway`).
    pub fwmark: u32,
    pub mtu: u32,
    /// `None`: the device has no private key (observed only).
    pub key: Option<crate::keys::DeviceKey>,
    /// Each peer by its gateway's underlay address, which is also the one
    /// address it may send from and be sent to through the device.
    pub peers: BTreeMap<IpAddr, WireguardPeer>,
    pub up: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WireguardPeer {
    pub public_key: crate::keys::PublicKey,
    /// The UDP port it listens on, at its underlay address.
    pub port: u16,
}

/// A policy routing rule of hostmesh's (`proto hostmesh`): `not fwmark
/// FWMARK lookup TABLE` at `priority`, for IPv4 or IPv6.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct RuleSpec {
    pub v6: bool,
    pub priority: u32,
    pub not_fwmark: u32,
    pub table: u32,
}
