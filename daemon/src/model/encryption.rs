//! Encrypted peers (`encryption = "wireguard"`): the gateway-to-gateway
//! leg of their VXLAN goes through WireGuard (README.md, "Encrypted
//! peers").
//!
//! hostmesh owns one device, `hm-wg0`, with a peer per encrypted endpoint
//! (the remote gateway's underlay address, which is also the one address
//! that peer may use inside the tunnel). Policy routing, as wg-quick does
//! it, steers everything for those addresses into the device, VXLAN and
//! probes alike, except WireGuard's own packets, which carry its mark:
//!
//! - `not fwmark WG_FWMARK lookup WG_TABLE` (`ENDPOINT dev hm-wg0` each);
//! - `not fwmark WG_FWMARK lookup WG_GUARD_TABLE` (`unreachable ENDPOINT`
//!   each), after it: with the device gone (deleted by hand, or not yet
//!   made) its routes go with it and a packet for an encrypted endpoint is
//!   refused, never sent in clear by the main table.
//!
//! `reconcile::plan` puts these in place before anything steers traffic
//! to the endpoints and removes them after. An encrypted peer that cannot
//! be carried (no WireGuard, no key) is refused: not applied, its CIDRs
//! unreachable.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::config::{Encryption, Gateway, Peer};
use crate::keys::DeviceKey;

use super::kernel::Feature;
use super::owners::Owner;
use super::state::*;
use super::HostFacts;

pub(crate) const WG: &str = "hm-wg0";
/// The mark WireGuard puts on its own UDP packets ("hmwg").
pub(crate) const WG_FWMARK: u32 = 0x686d_7767;
/// The tables and rule priorities of the steering (before the main
/// table's rule, 32766).
pub(crate) const WG_TABLE: u32 = 26733;
pub(crate) const WG_GUARD_TABLE: u32 = 26734;
pub(crate) const WG_PRIORITY: u32 = 32700;
pub(crate) const WG_GUARD_PRIORITY: u32 = 32701;
/// WireGuard's header over an IPv4 and an IPv6 underlay.
pub(crate) const WG_OVERHEAD_V4: u32 = 60;
pub(crate) const WG_OVERHEAD_V6: u32 = 80;

/// The tables whose routes guard encrypted endpoints: `plan` puts them
/// before anything else that steers traffic, and removes them last.
pub(crate) fn is_guard_table(table: u32) -> bool {
    table == WG_TABLE || table == WG_GUARD_TABLE
}

/// The WireGuard overhead towards `underlay`.
pub(crate) fn overhead(underlay: IpAddr) -> u32 {
    if underlay.is_ipv4() {
        WG_OVERHEAD_V4
    } else {
        WG_OVERHEAD_V6
    }
}

/// Why an encrypted peer cannot be carried through WireGuard here, if it
/// cannot; `Ok(None)` for a peer in clear, `Ok(Some(key))` for one that can.
pub(crate) fn device_key<'a>(p: &Peer, g: &Gateway, facts: &'a HostFacts) -> Result<Option<&'a DeviceKey>, String> {
    if !p.encrypted() {
        return Ok(None);
    }
    if !facts.features.has(Feature::Wireguard) {
        return Err(format!("the kernel lacks {}", Feature::Wireguard.what()));
    }
    let Some(source) = &g.private_key else {
        return Err("[gateway] has no private_key_file".to_string());
    };
    match &facts.wireguard_key {
        Some(Ok(key)) => Ok(Some(key)),
        Some(Err(why)) => Err(why.clone()),
        None => Err(format!("its private key ({source}) was not read")),
    }
}

/// Fail closed: an encrypted peer that cannot be carried is not applied,
/// and its CIDRs are unreachable here, so a member's packets for them are
/// refused, never forwarded by some other route in clear.
pub(crate) fn refuse(p: &Peer, why: &str, owner: &Owner, out: &mut Desired) {
    out.warnings.push(format!(
        "peer \"{}\" is encrypted (WireGuard) but {why}: not applied; its CIDRs are unreachable, so nothing goes to \
         them in clear",
        p.name
    ));
    out.refused_peers.insert(p.name.clone(), why.to_string());
    for cidr in &p.cidrs {
        want(&mut out.routes, RouteKey { table: RT_TABLE_MAIN, dst: *cidr }, RouteSpec::Unreachable, owner);
    }
}

/// The device being built from the encrypted peers, one at a time.
#[derive(Default)]
pub(crate) struct Device {
    key: Option<DeviceKey>,
    peers: BTreeMap<IpAddr, WireguardPeer>,
    mtu: u32,
    owners: Owners,
}

impl Device {
    /// Carries `p` (encrypted, `key` this gateway's) through the device:
    /// a WireGuard peer and the steering for each of its endpoints, whose
    /// underlay MTUs are `mtus` (in the order of `endpoints`).
    pub(crate) fn add(
        &mut self,
        p: &Peer,
        g: &Gateway,
        key: &DeviceKey,
        mtus: &[u32],
        owner: &Owner,
        out: &mut Desired,
    ) {
        let Encryption::Wireguard { public_keys, port } = &p.encryption else { return };
        self.key = Some(key.clone());
        self.owners.insert(owner.clone());
        for ((ep, public_key), underlay) in p.endpoints.iter().zip(public_keys).zip(mtus) {
            let port = port.unwrap_or(g.wireguard_port);
            self.peers.insert(*ep, WireguardPeer { public_key: *public_key, port });
            self.mtu = self.mtu.max(underlay.saturating_sub(overhead(*ep)));
            let host = IpNet::from(*ep);
            let into = RouteSpec::Dev { dev: WG.into(), src: g.local_ip };
            want(&mut out.routes, RouteKey { table: WG_TABLE, dst: host }, into, owner);
            want(&mut out.routes, RouteKey { table: WG_GUARD_TABLE, dst: host }, RouteSpec::Unreachable, owner);
            for (priority, table) in [(WG_PRIORITY, WG_TABLE), (WG_GUARD_PRIORITY, WG_GUARD_TABLE)] {
                let rule = RuleSpec { v6: ep.is_ipv6(), priority, not_fwmark: WG_FWMARK, table };
                want(&mut out.rules, rule, (), owner);
            }
        }
    }

    /// The device itself, if any peer is carried.
    pub(crate) fn finish(self, g: &Gateway, out: &mut Desired) {
        if self.peers.is_empty() {
            return;
        }
        let spec = WireguardSpec {
            port: g.wireguard_port,
            fwmark: WG_FWMARK,
            mtu: self.mtu,
            key: self.key,
            peers: self.peers,
            up: true,
        };
        // What the device receives is marked as having come through it
        // (probes/gateway.c, hm_wg_in): hm_tun_in takes an encrypted
        // peer's VXLAN only so marked (HM_PEER_EP_ENCRYPTED).
        let attachment = Attachment { program: Program::WgIn, hook: Hook::TcIngress(WG.into()) };
        out.attachments.insert(attachment, Owned { spec: (), owners: self.owners.clone() });
        out.links.insert(WG.to_string(), Owned { spec: LinkSpec::Wireguard(spec), owners: self.owners });
    }
}
