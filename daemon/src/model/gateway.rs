//! `[gateway]`, `[[peer]]`, `[[member]]` -> gateway peers (README.md,
//! "Gateway peers"): the flow-based VXLAN device `hm-tun0`, routes for remote
//! CIDRs through it with an MTU reduced by the encapsulation, and the maps
//! its TC programs read (who is a peer, which CIDR is behind which
//! endpoint).
//!
//! Every host's `hm-tun0` has the same MAC and reaches its next hop
//! through a permanent neighbour, so the Ethernet header inside the tunnel
//! always fits the receiver; the tunnel destination itself comes from the
//! route (`encap ip`), or from the TC program on egress (a learned reply
//! path, or a kernel without keys on routes).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

use crate::abi::{self, addr16, Endpoint, GwConfig, LpmKey, Pod};
use crate::config::{Config, Gateway, GatewayRole, Peer};

use super::encryption;
use super::kernel::Feature;

use super::state::*;
use super::{HostFacts, Via};

pub(crate) const TUN: &str = "hm-tun0";
pub(crate) const TUN_MAC: [u8; 6] = [0x02, 0x68, 0x6d, 0x00, 0x01, 0x00];
pub(crate) const TUN_NEXT_HOP_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 2, 1);
pub(crate) const TUN_NEXT_HOP_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 2, 1);
/// VXLAN encapsulation: outer IP + UDP + VXLAN + inner Ethernet.
pub(crate) const OVERHEAD_V4: u32 = 50;
pub(crate) const OVERHEAD_V6: u32 = 70;
/// Assumed when the underlay's MTU cannot be learned.
pub(crate) const DEFAULT_UNDERLAY_MTU: u32 = 1500;

const OWNER: Object<'static> = Object::Gateway;

pub(crate) fn compile(config: &Config, facts: &HostFacts, out: &mut Desired) {
    let Some(g) = &config.gateway else {
        if !config.peers.is_empty() || !config.members.is_empty() {
            out.warnings.push("[[peer]] and [[member]] entries need a [gateway] section; not applied".into());
        }
        return;
    };

    want(&mut out.links, TUN.to_string(), LinkSpec::Vxlan { port: g.udp_port, mac: TUN_MAC, up: true }, OWNER);

    let cidrs =
        || config.peers.iter().flat_map(|p| p.cidrs.iter()).chain(config.members.iter().flat_map(|m| m.cidrs.iter()));
    let any_v6 = cidrs().any(|c| c.addr().is_ipv6());
    // Traffic of remote sites enters on hm-tun0 with sources only routes
    // through it know (or none: learned return paths).
    let mut sysctls =
        vec![("net/ipv4/conf/all/rp_filter".to_string(), "0"), (format!("net/ipv4/conf/{TUN}/rp_filter"), "0")];
    if g.role == GatewayRole::Gateway {
        sysctls.push((format!("net/ipv4/conf/{TUN}/forwarding"), "1"));
        // A gateway forwards from hm-tun0 back into hm-tun0. Where a device
        // may send ICMP redirects (`send_redirects`, all OR the device's
        // own), the kernel checks every such packet's source with a second
        // FIB lookup (fib_validate_source); a tunnel has no use for
        // redirects. Off for hm-tun0 alone: other devices keep their own
        // setting (1 unless changed), which the OR now reads by itself.
        // Measured (bench/gateway): TCP requests 0.86 -> 0.89, UDP 0.88 ->
        // 0.92 x kernel VXLAN, in one run.
        sysctls.push(("net/ipv4/conf/all/send_redirects".to_string(), "0"));
        sysctls.push((format!("net/ipv4/conf/{TUN}/send_redirects"), "0"));
    }
    if any_v6 {
        sysctls.push((format!("net/ipv6/conf/{TUN}/disable_ipv6"), "0"));
        if g.role == GatewayRole::Gateway {
            // IPv6 forwards only with forwarding on for the whole host.
            sysctls.push(("net/ipv6/conf/all/forwarding".to_string(), "1"));
        }
    }
    for (path, value) in sysctls {
        want(&mut out.sysctls, path, value.to_string(), OWNER);
    }
    let mut hops: Vec<IpAddr> = vec![TUN_NEXT_HOP_V4.into()];
    if any_v6 {
        hops.push(TUN_NEXT_HOP_V6.into());
    }
    for hop in hops {
        want(&mut out.neighbours, NeighKey { dev: TUN.to_string(), ip: hop }, NeighSpec { lladdr: TUN_MAC }, OWNER);
    }

    let role = if g.role == GatewayRole::Gateway { abi::ROLE_GATEWAY } else { abi::ROLE_MEMBER };
    let cfg = GwConfig {
        vni: g.vni,
        role,
        gateway: site_gateway(g, facts).map(addr16).unwrap_or_default(),
        local: addr16(g.local_ip),
        tcp_timeout_s: abi::secs(config.daemon.conntrack_tcp_timeout),
        udp_timeout_s: abi::secs(config.daemon.conntrack_udp_timeout),
    };
    want(
        &mut out.map_entries,
        MapEntryKey { map: BpfMap::GwConfig, key: 0u32.to_bytes().into() },
        cfg.to_bytes(),
        OWNER,
    );
    for (program, hook) in
        [(Program::TunIn, Hook::TcIngress(TUN.into())), (Program::TunOut, Hook::TcEgress(TUN.into()))]
    {
        want(&mut out.attachments, Attachment { program, hook }, (), OWNER);
    }

    match g.role {
        GatewayRole::Member => member(config, g, facts, out),
        GatewayRole::Gateway => gateway(config, g, facts, out),
    }
}

/// The gateway of its site a member sends through: the probes' choice
/// among `gateway_ips` (the first when unprobed); `None` on a gateway, or
/// when every one of the member's gateways is down.
fn site_gateway(g: &Gateway, facts: &HostFacts) -> Option<IpAddr> {
    facts.gateway_in_use(&Via::Site, &g.gateway_ips)
}

/// A member routes every peer CIDR to the gateway of its site in use; with
/// every gateway down, its routes are `unreachable` so traffic fails at once.
fn member(config: &Config, g: &Gateway, facts: &HostFacts, out: &mut Desired) {
    let in_use = site_gateway(g, facts).map(|gw| (gw, route_mtu(facts, gw, &mut out.warnings)));
    for p in &config.peers {
        if !p.endpoints.is_empty() {
            out.warnings.push(format!(
                "peer \"{}\": endpoint is for gateways; a member sends everything to its gateway",
                p.name
            ));
        }
        for cidr in &p.cidrs {
            want(
                &mut out.routes,
                RouteKey { table: RT_TABLE_MAIN, dst: *cidr },
                in_use.map_or(RouteSpec::Unreachable, |(gw, mtu)| via_tunnel(cidr, mtu, gw, g, facts)),
                &format!("peer/{}", p.name),
            );
        }
    }
    for m in &config.members {
        out.warnings.push(format!("member \"{}\" is for gateways; this host is a member: not applied", m.name));
    }
}

/// A gateway routes each peer's CIDRs to the peer's endpoint in use and
/// each member's CIDRs to that member.
fn gateway(config: &Config, g: &Gateway, facts: &HostFacts, out: &mut Desired) {
    let mut device = encryption::Device::default();
    for p in &config.peers {
        peer(p, g, facts, &mut device, out);
    }
    device.finish(g, out);
    for m in &config.members {
        let owner = Object::Member(&m.name).into_owner();
        if m.endpoint.is_ipv4() != g.local_ip.is_ipv4() {
            out.warnings.push(format!(
                "member \"{}\": endpoint {} is {} but local_ip {} is {}; the tunnel runs from local_ip: not applied",
                m.name,
                m.endpoint,
                family(m.endpoint),
                g.local_ip,
                family(g.local_ip)
            ));
            continue;
        }
        let mtu = route_mtu(facts, m.endpoint, &mut out.warnings);
        for cidr in &m.cidrs {
            let value = Endpoint { addr: addr16(m.endpoint), flags: 0 };
            want(
                &mut out.map_entries,
                MapEntryKey { map: BpfMap::Members, key: LpmKey::of(cidr).to_bytes().into() },
                value.to_bytes(),
                &owner,
            );
            let spec = via_tunnel(cidr, mtu, m.endpoint, g, facts);
            want(&mut out.routes, RouteKey { table: RT_TABLE_MAIN, dst: *cidr }, spec, &owner);
        }
    }
}

fn family(ip: IpAddr) -> &'static str {
    if ip.is_ipv4() {
        "IPv4"
    } else {
        "IPv6"
    }
}

/// A peer on a gateway: its CIDRs to its endpoint in use; `unreachable`
/// routes when every endpoint is down, so its traffic fails at once.
/// Every endpoint of a peer is known as the peer's (HM_PEER_ENDPOINTS),
/// whichever carries its traffic: after a failover on the other side,
/// packets arrive from another of them. An encrypted peer goes through
/// `device` (`model::encryption`), or is refused.
fn peer(p: &Peer, g: &Gateway, facts: &HostFacts, device: &mut encryption::Device, out: &mut Desired) {
    let owner = Object::Peer(&p.name).into_owner();
    let Some(&endpoint) = p.endpoints.first() else {
        out.warnings.push(format!(
            "peer \"{}\" has no endpoint; a gateway needs the remote gateway's address: not applied",
            p.name
        ));
        return;
    };
    let key = match encryption::device_key(p, g, facts) {
        Ok(key) => key,
        Err(why) => return encryption::refuse(p, &why, &owner, out),
    };
    if endpoint.is_ipv4() != g.local_ip.is_ipv4() {
        out.warnings.push(format!(
            "peer \"{}\": endpoint {endpoint} is {} but local_ip {} is {}; the tunnel runs from local_ip: not applied",
            p.name,
            family(endpoint),
            g.local_ip,
            family(g.local_ip)
        ));
        return;
    }
    // The steering into WireGuard, before any entry sends to the endpoints.
    if let Some(key) = key {
        let mtus: Vec<u32> = p.endpoints.iter().map(|ep| underlay_mtu(facts, *ep, &mut out.warnings)).collect();
        device.add(p, g, key, &mtus, &owner, out);
    }
    // An encrypted peer's VXLAN is taken only through hm-wg0 (hm_wg_in's
    // mark): clear VXLAN that claims its address is forged.
    let known = if key.is_some() { abi::PEER_EP_KNOWN | abi::PEER_EP_ENCRYPTED } else { abi::PEER_EP_KNOWN };
    for ep in &p.endpoints {
        let ep = Endpoint { addr: addr16(*ep), flags: 0 };
        want(
            &mut out.map_entries,
            MapEntryKey { map: BpfMap::PeerEndpoints, key: ep.to_bytes().into() },
            known.to_bytes(),
            &owner,
        );
    }
    let in_use = facts.gateway_in_use(&Via::Peer(p.name.clone()), &p.endpoints);
    let up = in_use.is_some();
    // A peer that is down stays in the trie, marked down.
    let endpoint = in_use.unwrap_or(endpoint);
    let mut mtu = route_mtu(facts, endpoint, &mut out.warnings);
    if key.is_some() {
        mtu = mtu.saturating_sub(encryption::overhead(endpoint));
    }
    for cidr in &p.cidrs {
        let value = Endpoint { addr: addr16(endpoint), flags: if up { abi::EP_UP } else { 0 } };
        want(
            &mut out.map_entries,
            MapEntryKey { map: BpfMap::Peers, key: LpmKey::of(cidr).to_bytes().into() },
            value.to_bytes(),
            &owner,
        );
        let spec = if up { via_tunnel(cidr, mtu, endpoint, g, facts) } else { RouteSpec::Unreachable };
        want(&mut out.routes, RouteKey { table: RT_TABLE_MAIN, dst: *cidr }, spec, &owner);
    }
}

/// `cidr` into the tunnel, to the underlay address `far` (a gateway's or a
/// member's). The route carries the tunnel key (`encap ip`, where the
/// kernel has it): the device then keeps each route's outer route cached,
/// where a key `hm_tun_out` sets is looked up again for every packet
/// (bench/gateway, TCP requests: 0.856 -> 0.86-0.90 x kernel VXLAN). The
/// program still overrides it for a reply whose path it learned, and sets
/// the key itself where the route has none.
fn via_tunnel(cidr: &IpNet, mtu: u32, far: IpAddr, g: &Gateway, facts: &HostFacts) -> RouteSpec {
    let gateway = if cidr.addr().is_ipv4() { IpAddr::V4(TUN_NEXT_HOP_V4) } else { IpAddr::V6(TUN_NEXT_HOP_V6) };
    let encap = facts.features.has(Feature::RouteEncap).then(|| TunnelEncap {
        id: g.vni,
        dst: far,
        src: (g.local_ip.is_ipv4() == far.is_ipv4()).then_some(g.local_ip),
    });
    RouteSpec::Via { gateway, dev: TUN.to_string(), mtu: Some(mtu), encap }
}

/// The MTU of a route into the tunnel towards `underlay`: the underlay's
/// MTU less the encapsulation, so TCP picks the right MSS by itself.
pub(crate) fn route_mtu(facts: &HostFacts, underlay: IpAddr, warnings: &mut Vec<String>) -> u32 {
    let overhead = if underlay.is_ipv4() { OVERHEAD_V4 } else { OVERHEAD_V6 };
    underlay_mtu(facts, underlay, warnings).saturating_sub(overhead)
}

/// The MTU of the underlay's path to `underlay` (outside any tunnel), or
/// the default, said once, when it cannot be learned.
pub(crate) fn underlay_mtu(facts: &HostFacts, underlay: IpAddr, warnings: &mut Vec<String>) -> u32 {
    facts.underlay_mtu.get(&underlay).copied().unwrap_or_else(|| {
        let note = format!("no route to {underlay} to learn the underlay's MTU; assuming {DEFAULT_UNDERLAY_MTU}");
        if !warnings.contains(&note) {
            warnings.push(note);
        }
        DEFAULT_UNDERLAY_MTU
    })
}

/// The underlay addresses whose MTU compile needs.
pub(crate) fn underlay_addresses(config: &Config) -> Vec<IpAddr> {
    let Some(g) = &config.gateway else { return Vec::new() };
    let mut out: Vec<IpAddr> = g.gateway_ips.clone();
    out.extend(config.peers.iter().flat_map(|p| p.endpoints.iter().copied()));
    out.extend(config.members.iter().map(|m| m.endpoint));
    out.sort();
    out.dedup();
    out
}
