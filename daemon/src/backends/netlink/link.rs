//! Typed link helpers: dump, create a veth pair, set up, delete.

use std::io;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVeth, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::RouteNetlinkMessage;

use super::socket::errno;
use super::socket::RouteSocket as NetlinkSocket;

/// What hostmesh needs to know about a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub kind: Option<String>,
    /// IFLA_LINK: for a veth, the peer's index (in `peer_netns` if set).
    pub link: Option<u32>,
    /// The peer lives in another namespace.
    pub peer_other_netns: bool,
    pub mac: Option<[u8; 6]>,
    pub up: bool,
    /// VXLAN devices: (destination port, flow-based).
    pub vxlan: Option<(u16, bool)>,
    pub mtu: Option<u32>,
}

pub(super) fn dump_links(sock: &mut NetlinkSocket) -> io::Result<Vec<Link>> {
    let msgs = sock.dump(RouteNetlinkMessage::GetLink(LinkMessage::default()))?;
    Ok(msgs
        .into_iter()
        .filter_map(|m| match m {
            RouteNetlinkMessage::NewLink(l) => Some(parse(&l)),
            _ => None,
        })
        .collect())
}

pub(super) fn parse(m: &LinkMessage) -> Link {
    let mut link = Link {
        index: m.header.index,
        name: String::new(),
        kind: None,
        link: None,
        peer_other_netns: false,
        mac: None,
        up: m.header.flags.contains(LinkFlags::Up),
        vxlan: None,
        mtu: None,
    };
    for attr in &m.attributes {
        match attr {
            LinkAttribute::IfName(n) => link.name = n.clone(),
            LinkAttribute::Link(i) => link.link = Some(*i),
            LinkAttribute::Mtu(m) => link.mtu = Some(*m),
            LinkAttribute::LinkNetNsId(_) => link.peer_other_netns = true,
            LinkAttribute::Address(a) if a.len() == 6 => {
                link.mac = Some(a.as_slice().try_into().expect("length checked"));
            }
            LinkAttribute::LinkInfo(infos) => {
                for info in infos {
                    match info {
                        LinkInfo::Kind(kind) => link.kind = Some(kind.to_string()),
                        LinkInfo::Data(InfoData::Vxlan(attrs)) => {
                            let (mut port, mut external) = (0, false);
                            for a in attrs {
                                match a {
                                    InfoVxlan::Port(p) => port = *p,
                                    InfoVxlan::CollectMetadata(c) => external = *c,
                                    _ => {}
                                }
                            }
                            link.vxlan = Some((port, external));
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    link
}

pub(super) fn create_veth(
    sock: &mut NetlinkSocket,
    name: &str,
    mac: [u8; 6],
    peer: &str,
    peer_mac: [u8; 6],
) -> io::Result<()> {
    let mut peer_msg = LinkMessage::default();
    peer_msg.attributes.push(LinkAttribute::IfName(peer.to_string()));
    peer_msg.attributes.push(LinkAttribute::Address(peer_mac.to_vec()));

    let mut msg = LinkMessage::default();
    msg.attributes.push(LinkAttribute::IfName(name.to_string()));
    msg.attributes.push(LinkAttribute::Address(mac.to_vec()));
    msg.attributes.push(LinkAttribute::LinkInfo(vec![
        LinkInfo::Kind(InfoKind::Veth),
        LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer_msg))),
    ]));
    sock.request(RouteNetlinkMessage::NewLink(msg), NLM_F_CREATE | NLM_F_EXCL)
}

/// `ip link add name address mac type vxlan external dstport port nolearning`
pub(super) fn create_vxlan(sock: &mut NetlinkSocket, name: &str, mac: [u8; 6], port: u16) -> io::Result<()> {
    let mut msg = LinkMessage::default();
    msg.attributes.push(LinkAttribute::IfName(name.to_string()));
    msg.attributes.push(LinkAttribute::Address(mac.to_vec()));
    msg.attributes.push(LinkAttribute::LinkInfo(vec![
        LinkInfo::Kind(InfoKind::Vxlan),
        LinkInfo::Data(InfoData::Vxlan(vec![
            InfoVxlan::CollectMetadata(true),
            InfoVxlan::Port(port),
            InfoVxlan::Learning(false),
        ])),
    ]));
    sock.request(RouteNetlinkMessage::NewLink(msg), NLM_F_CREATE | NLM_F_EXCL)
}

/// `ip link add name mtu mtu type wireguard`
pub(super) fn create_wireguard(sock: &mut NetlinkSocket, name: &str, mtu: u32) -> io::Result<()> {
    let mut msg = LinkMessage::default();
    msg.attributes.push(LinkAttribute::IfName(name.to_string()));
    msg.attributes.push(LinkAttribute::Mtu(mtu));
    msg.attributes.push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Wireguard)]));
    sock.request(RouteNetlinkMessage::NewLink(msg), NLM_F_CREATE | NLM_F_EXCL)
}

/// `ip link set dev INDEX mtu MTU`
pub(super) fn set_mtu(sock: &mut NetlinkSocket, index: u32, mtu: u32) -> io::Result<()> {
    let mut msg = LinkMessage::default();
    msg.header.index = index;
    msg.attributes.push(LinkAttribute::Mtu(mtu));
    sock.request(RouteNetlinkMessage::SetLink(msg), 0)
}

pub(super) fn set_up(sock: &mut NetlinkSocket, index: u32) -> io::Result<()> {
    let mut msg = LinkMessage::default();
    msg.header.index = index;
    msg.header.flags = LinkFlags::Up;
    msg.header.change_mask = LinkFlags::Up;
    sock.request(RouteNetlinkMessage::SetLink(msg), 0)
}

/// The link the WireGuard probe makes and deletes at once.
const WG_PROBE: &str = "hm-wgprobe";

/// Whether this kernel makes WireGuard links (built in, or a module it
/// loads on request): `ip link add hm-wgprobe type wireguard`, deleted at
/// once; a kernel without WireGuard refuses the kind.
pub(crate) fn wireguard_supported() -> bool {
    let Ok(mut sock) = NetlinkSocket::open() else { return false };
    // One left by a daemon killed between the two requests.
    let _ = delete(&mut sock, WG_PROBE);
    let mut msg = LinkMessage::default();
    msg.attributes.push(LinkAttribute::IfName(WG_PROBE.to_string()));
    msg.attributes.push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Wireguard)]));
    let made = sock.request(RouteNetlinkMessage::NewLink(msg), NLM_F_CREATE | NLM_F_EXCL).is_ok();
    if made {
        let _ = delete(&mut sock, WG_PROBE);
    }
    made
}

/// Deleting a link that is already gone succeeds.
pub(super) fn delete(sock: &mut NetlinkSocket, name: &str) -> io::Result<()> {
    let mut msg = LinkMessage::default();
    msg.attributes.push(LinkAttribute::IfName(name.to_string()));
    match sock.request(RouteNetlinkMessage::DelLink(msg), 0) {
        Err(e) if errno(&e) == Some(libc::ENODEV) => Ok(()),
        r => r,
    }
}
