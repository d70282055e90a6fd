//! Typed route helpers. hostmesh's routes carry its own route protocol
//! number, which is how they are found again (and nobody else's touched).

use std::collections::BTreeMap;
use std::io;
use std::net::IpAddr;

use ipnet::IpNet;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};
pub(super) use netlink_packet_route::route::RouteType;
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteIp6Tunnel, RouteIp6TunnelFlags, RouteIpTunnel, RouteIpTunnelFlags,
    RouteLwEnCapType, RouteLwTunnelEncap, RouteMessage, RouteMetric, RouteProtocol, RouteScope,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use crate::model::{TunnelEncap, RTPROT_HOSTMESH};

use super::socket::errno;
use super::socket::RouteSocket as NetlinkSocket;

/// A route as read back, with the fields hostmesh compares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Route {
    pub table: u32,
    pub dst: IpNet,
    pub protocol: u8,
    pub kind: RouteType,
    pub gateway: Option<IpAddr>,
    pub oif: Option<u32>,
    /// Every output interface, including multipath next hops.
    pub oifs: Vec<u32>,
    pub mtu: Option<u32>,
    pub prefsrc: Option<IpAddr>,
    /// The tunnel key of an `encap ip` / `encap ip6` route.
    pub encap: Option<TunnelEncap>,
}

pub(super) fn dump(sock: &mut NetlinkSocket) -> io::Result<Vec<Route>> {
    let mut out = Vec::new();
    for family in [AddressFamily::Inet, AddressFamily::Inet6] {
        let mut req = RouteMessage::default();
        req.header.address_family = family;
        // Table 0 with strict checking: every table.
        req.header.table = 0;
        for m in sock.dump(RouteNetlinkMessage::GetRoute(req))? {
            if let RouteNetlinkMessage::NewRoute(r) = m {
                if let Some(route) = parse(&r) {
                    out.push(route);
                }
            }
        }
    }
    Ok(out)
}

fn ip_of(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

pub(super) fn parse(m: &RouteMessage) -> Option<Route> {
    let h = &m.header;
    let mut table = u32::from(h.table);
    let mut dst = None;
    let mut gateway = None;
    let mut oif = None;
    let mut oifs = Vec::new();
    let mut mtu = None;
    let mut prefsrc = None;
    let mut encap = None;
    for attr in &m.attributes {
        match attr {
            RouteAttribute::Table(t) => table = *t,
            RouteAttribute::Destination(a) => dst = ip_of(a),
            RouteAttribute::Gateway(a) => gateway = ip_of(a),
            RouteAttribute::PrefSource(a) => prefsrc = ip_of(a),
            RouteAttribute::Oif(i) => {
                oif = Some(*i);
                oifs.push(*i);
            }
            RouteAttribute::MultiPath(hops) => oifs.extend(hops.iter().map(|h| h.interface_index)),
            RouteAttribute::Encap(attrs) => encap = tunnel_encap(attrs),
            RouteAttribute::Metrics(metrics) => {
                for metric in metrics {
                    if let RouteMetric::Mtu(v) = metric {
                        mtu = Some(*v);
                    }
                }
            }
            _ => {}
        }
    }
    let dst = match (h.address_family, dst) {
        (_, Some(ip)) => IpNet::new(ip, h.destination_prefix_length).ok()?,
        (AddressFamily::Inet, None) => IpNet::new(IpAddr::from([0, 0, 0, 0]), 0).ok()?,
        (AddressFamily::Inet6, None) => IpNet::new(IpAddr::from([0u16; 8]), 0).ok()?,
        _ => return None,
    };
    Some(Route { table, dst, protocol: h.protocol.into(), kind: h.kind, gateway, oif, oifs, mtu, prefsrc, encap })
}

/// The tunnel key of an `encap ip` or `encap ip6` route's attributes
/// (`None` for another kind, or one without an id and a destination).
fn tunnel_encap(attrs: &[RouteLwTunnelEncap]) -> Option<TunnelEncap> {
    let (mut id, mut dst, mut src) = (None, None, None);
    for attr in attrs {
        match attr {
            RouteLwTunnelEncap::Ip(RouteIpTunnel::Id(v)) | RouteLwTunnelEncap::Ip6(RouteIp6Tunnel::Id(v)) => {
                id = u32::try_from(*v).ok()
            }
            RouteLwTunnelEncap::Ip(RouteIpTunnel::Destination(a)) => dst = Some(IpAddr::V4(*a)),
            RouteLwTunnelEncap::Ip6(RouteIp6Tunnel::Destination(a)) => dst = Some(IpAddr::V6(*a)),
            RouteLwTunnelEncap::Ip(RouteIpTunnel::Source(a)) if !a.is_unspecified() => src = Some(IpAddr::V4(*a)),
            RouteLwTunnelEncap::Ip6(RouteIp6Tunnel::Source(a)) if !a.is_unspecified() => src = Some(IpAddr::V6(*a)),
            _ => {}
        }
    }
    Some(TunnelEncap { id: id?, dst: dst?, src })
}

/// `encap ip id ID dst DST [src SRC] ttl 64 key`, or `encap ip6 ... hoplimit
/// 64 key csum` over IPv6: the key hm_tun_out would set (probes/gateway.c
/// set_destination), with the same outer UDP checksum choice (none over
/// IPv4, as the kernel's VXLAN devices default to).
fn encap_attributes(e: &TunnelEncap) -> [RouteAttribute; 2] {
    let id = u64::from(e.id);
    match e.dst {
        IpAddr::V4(dst) => {
            let mut key = vec![
                RouteIpTunnel::Id(id),
                RouteIpTunnel::Destination(dst),
                RouteIpTunnel::Ttl(64),
                RouteIpTunnel::Flags(RouteIpTunnelFlags::Key),
            ];
            if let Some(IpAddr::V4(src)) = e.src {
                key.push(RouteIpTunnel::Source(src));
            }
            [
                RouteAttribute::EncapType(RouteLwEnCapType::Ip),
                RouteAttribute::Encap(key.into_iter().map(RouteLwTunnelEncap::Ip).collect()),
            ]
        }
        IpAddr::V6(dst) => {
            let mut key = vec![
                RouteIp6Tunnel::Id(id),
                RouteIp6Tunnel::Destination(dst),
                RouteIp6Tunnel::Hoplimit(64),
                RouteIp6Tunnel::Flags(RouteIp6TunnelFlags::Key | RouteIp6TunnelFlags::Checksum),
            ];
            if let Some(IpAddr::V6(src)) = e.src {
                key.push(RouteIp6Tunnel::Source(src));
            }
            [
                RouteAttribute::EncapType(RouteLwEnCapType::Ip6),
                RouteAttribute::Encap(key.into_iter().map(RouteLwTunnelEncap::Ip6).collect()),
            ]
        }
    }
}

/// The probe of `Feature::RouteEncap`: whether the kernel takes a route
/// with a tunnel key. The route is made in a table no rule looks up (so no
/// packet ever uses it), on `lo`, marked as hostmesh's, and deleted at once.
pub(crate) fn encap_supported() -> bool {
    const PROBE_TABLE: u32 = 0x686d_7072;
    let Ok(mut sock) = NetlinkSocket::open() else { return false };
    let dst = IpNet::from(IpAddr::from([192, 0, 2, 255]));
    // One left by a daemon killed between the two requests.
    let _ = delete(&mut sock, PROBE_TABLE, &dst, RTPROT_HOSTMESH);
    let mut m = message(PROBE_TABLE, &dst, RTPROT_HOSTMESH);
    m.header.scope = RouteScope::Link;
    m.header.kind = RouteType::Unicast;
    m.attributes.push(RouteAttribute::Oif(1));
    let key = TunnelEncap { id: 0, dst: std::net::Ipv4Addr::LOCALHOST.into(), src: None };
    m.attributes.extend(encap_attributes(&key));
    let made = sock.request(RouteNetlinkMessage::NewRoute(m), NLM_F_CREATE | NLM_F_EXCL).is_ok();
    if made {
        let _ = delete(&mut sock, PROBE_TABLE, &dst, RTPROT_HOSTMESH);
    }
    made
}

fn message(table: u32, dst: &IpNet, protocol: u8) -> RouteMessage {
    let mut m = RouteMessage::default();
    m.header.address_family = if dst.addr().is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 };
    m.header.destination_prefix_length = dst.prefix_len();
    m.header.protocol = RouteProtocol::from(protocol);
    if table < 256 {
        m.header.table = table as u8;
    } else {
        m.header.table = 252; // RT_TABLE_COMPAT; the attribute carries the id
    }
    m.attributes.push(RouteAttribute::Table(table));
    m.attributes.push(RouteAttribute::Destination(dst.addr().into()));
    m
}

/// A route's next hop on a link: `via gateway dev oif onlink [mtu N]
/// [encap ...]`.
pub(super) struct ViaHop<'a> {
    pub gateway: IpAddr,
    pub oif: u32,
    pub mtu: Option<u32>,
    pub encap: Option<&'a TunnelEncap>,
}

/// `ip route replace dst via gateway dev oif onlink [mtu N] [encap ...]
/// proto P table T`
pub(super) fn replace_via(
    sock: &mut NetlinkSocket,
    table: u32,
    dst: &IpNet,
    hop: ViaHop<'_>,
    protocol: u8,
) -> io::Result<()> {
    let ViaHop { gateway, oif, mtu, encap } = hop;
    let mut m = message(table, dst, protocol);
    m.header.scope = RouteScope::Universe;
    m.header.kind = RouteType::Unicast;
    // The gateway is a link-local next hop with no address of ours on the
    // link: declare it directly reachable.
    m.header.flags = RouteFlags::Onlink;
    m.attributes.push(RouteAttribute::Gateway(gateway.into()));
    m.attributes.push(RouteAttribute::Oif(oif));
    if let Some(mtu) = mtu {
        m.attributes.push(RouteAttribute::Metrics(vec![RouteMetric::Mtu(mtu)]));
    }
    if let Some(encap) = encap {
        m.attributes.extend(encap_attributes(encap));
    }
    sock.request(RouteNetlinkMessage::NewRoute(m), NLM_F_CREATE | NLM_F_REPLACE)
}

/// A route into a device with no next hop, from `src`: `local` delivers
/// to this host (`ip route replace local dst dev oif src src`, scope
/// host), otherwise straight into the device (`ip route replace dst dev
/// oif src src`, scope link).
pub(super) struct IntoDev {
    pub oif: u32,
    pub src: IpAddr,
    pub local: bool,
}

/// `ip route replace [local] dst dev oif src src proto P table T`
pub(super) fn replace_into(
    sock: &mut NetlinkSocket,
    table: u32,
    dst: &IpNet,
    to: IntoDev,
    protocol: u8,
) -> io::Result<()> {
    let mut m = message(table, dst, protocol);
    (m.header.scope, m.header.kind) =
        if to.local { (RouteScope::Host, RouteType::Local) } else { (RouteScope::Link, RouteType::Unicast) };
    m.attributes.push(RouteAttribute::Oif(to.oif));
    m.attributes.push(RouteAttribute::PrefSource(to.src.into()));
    sock.request(RouteNetlinkMessage::NewRoute(m), NLM_F_CREATE | NLM_F_REPLACE)
}

/// `ip route replace unreachable dst proto P table T`
pub(super) fn replace_unreachable(sock: &mut NetlinkSocket, table: u32, dst: &IpNet, protocol: u8) -> io::Result<()> {
    let mut m = message(table, dst, protocol);
    m.header.scope = RouteScope::Universe;
    m.header.kind = RouteType::Unreachable;
    sock.request(RouteNetlinkMessage::NewRoute(m), NLM_F_CREATE | NLM_F_REPLACE)
}

/// Deletes the route with this protocol; one that is gone already is fine.
pub(super) fn delete(sock: &mut NetlinkSocket, table: u32, dst: &IpNet, protocol: u8) -> io::Result<()> {
    let mut m = message(table, dst, protocol);
    // Any scope (`ip route del` does the same): the default, universe,
    // would not match a `local` route (scope host), and the kernel would
    // answer ESRCH as if it were gone already.
    m.header.scope = RouteScope::NoWhere;
    match sock.request(RouteNetlinkMessage::DelRoute(m), 0) {
        Err(e) if matches!(errno(&e), Some(libc::ESRCH) | Some(libc::ENOENT)) => Ok(()),
        r => r,
    }
}

/// `ip route get dst`: the route the kernel would use, if any.
pub(super) fn get(sock: &mut NetlinkSocket, dst: IpAddr) -> io::Result<Option<Route>> {
    get_with(sock, dst, false, None)
}

/// `ip route get dst mark M`: the route a packet with that mark takes.
pub(super) fn get_marked(sock: &mut NetlinkSocket, dst: IpAddr, mark: Option<u32>) -> io::Result<Option<Route>> {
    get_with(sock, dst, false, mark)
}

/// The FIB entry that `get` used, whole (with its protocol): `ip route get
/// fibmatch`.
pub(super) fn get_fib_match(sock: &mut NetlinkSocket, dst: IpAddr) -> io::Result<Option<Route>> {
    get_with(sock, dst, true, None)
}

fn get_with(sock: &mut NetlinkSocket, dst: IpAddr, fib_match: bool, mark: Option<u32>) -> io::Result<Option<Route>> {
    let mut m = RouteMessage::default();
    if fib_match {
        m.header.flags = RouteFlags::FibMatch;
    }
    m.header.address_family = if dst.is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 };
    m.header.destination_prefix_length = if dst.is_ipv4() { 32 } else { 128 };
    m.attributes.push(RouteAttribute::Destination(dst.into()));
    if let Some(mark) = mark {
        m.attributes.push(RouteAttribute::Mark(mark));
    }
    match sock.query(RouteNetlinkMessage::GetRoute(m)) {
        Ok(answers) => Ok(answers.into_iter().find_map(|a| match a {
            RouteNetlinkMessage::NewRoute(r) => parse(&r),
            _ => None,
        })),
        Err(e) if matches!(errno(&e), Some(libc::ENETUNREACH) | Some(libc::EHOSTUNREACH)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Names of interfaces holding a default route in the main table.
pub(super) fn default_route_oifs(routes: &[Route]) -> Vec<u32> {
    let mut out: BTreeMap<u32, ()> = BTreeMap::new();
    for r in routes {
        if r.table == 254 && r.dst.prefix_len() == 0 && r.kind == RouteType::Unicast {
            for i in &r.oifs {
                out.insert(*i, ());
            }
        }
    }
    out.into_keys().collect()
}
