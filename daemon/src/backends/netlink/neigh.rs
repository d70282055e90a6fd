//! Typed neighbour helpers: permanent entries only.

use std::io;
use std::net::IpAddr;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_REPLACE};
use netlink_packet_route::neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState};
use netlink_packet_route::route::RouteType;
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::socket::errno;
use super::socket::RouteSocket as NetlinkSocket;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Neighbour {
    pub ifindex: u32,
    pub ip: IpAddr,
    pub lladdr: Option<[u8; 6]>,
    pub permanent: bool,
}

pub(super) fn dump(sock: &mut NetlinkSocket) -> io::Result<Vec<Neighbour>> {
    let mut out = Vec::new();
    for family in [AddressFamily::Inet, AddressFamily::Inet6] {
        let mut req = NeighbourMessage::default();
        req.header.family = family;
        for m in sock.dump(RouteNetlinkMessage::GetNeighbour(req))? {
            let RouteNetlinkMessage::NewNeighbour(n) = m else { continue };
            out.extend(parse(&n));
        }
    }
    Ok(out)
}

/// A neighbour message as hostmesh sees it; None without a destination.
pub(super) fn parse(n: &NeighbourMessage) -> Option<Neighbour> {
    let mut ip = None;
    let mut lladdr = None;
    for attr in &n.attributes {
        match attr {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(v4)) => ip = Some(IpAddr::V4(*v4)),
            NeighbourAttribute::Destination(NeighbourAddress::Inet6(v6)) => ip = Some(IpAddr::V6(*v6)),
            NeighbourAttribute::LinkLayerAddress(a) if a.len() == 6 => {
                lladdr = Some(a.as_slice().try_into().expect("length checked"))
            }
            _ => {}
        }
    }
    Some(Neighbour {
        ifindex: n.header.ifindex,
        ip: ip?,
        lladdr,
        permanent: n.header.state == NeighbourState::Permanent,
    })
}

fn message(ifindex: u32, ip: IpAddr) -> NeighbourMessage {
    let mut m = NeighbourMessage::default();
    m.header.family = if ip.is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 };
    m.header.ifindex = ifindex;
    m.header.kind = RouteType::Unicast;
    let addr = match ip {
        IpAddr::V4(v4) => NeighbourAddress::Inet(v4),
        IpAddr::V6(v6) => NeighbourAddress::Inet6(v6),
    };
    m.attributes.push(NeighbourAttribute::Destination(addr));
    m
}

pub(super) fn replace_permanent(sock: &mut NetlinkSocket, ifindex: u32, ip: IpAddr, lladdr: [u8; 6]) -> io::Result<()> {
    let mut m = message(ifindex, ip);
    m.header.state = NeighbourState::Permanent;
    m.attributes.push(NeighbourAttribute::LinkLayerAddress(lladdr.to_vec()));
    sock.request(RouteNetlinkMessage::NewNeighbour(m), NLM_F_CREATE | NLM_F_REPLACE)
}

pub(super) fn delete(sock: &mut NetlinkSocket, ifindex: u32, ip: IpAddr) -> io::Result<()> {
    match sock.request(RouteNetlinkMessage::DelNeighbour(message(ifindex, ip)), 0) {
        Err(e) if matches!(errno(&e), Some(libc::ENOENT) | Some(libc::ESRCH) | Some(libc::ENODEV)) => Ok(()),
        r => r,
    }
}
