//! Kernel change notifications: an rtnetlink socket subscribed to link,
//! route, neighbour and address events, read on a thread of its own. Each message
//! becomes a `KernelChange`; the daemon compares it with what it wants
//! (`daemon::drift`) and repairs at once what moved away — a deleted veth,
//! a deleted route, a host interface re-created under a new index —
//! instead of waiting for the periodic resync. Its own changes arrive here
//! too, and match what it wants, so they cost a comparison.

use std::io;
use std::net::IpAddr;
use std::thread;

use ipnet::IpNet;
use netlink_packet_core::{NetlinkMessage, NetlinkPayload};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

/// One change the kernel announced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KernelChange {
    /// A link appeared or changed (RTM_NEWLINK).
    Link { name: String, index: u32, up: bool },
    /// A link is gone.
    LinkGone { name: String },
    /// A route is gone.
    RouteGone { table: u32, dst: IpNet, protocol: u8 },
    /// A neighbour entry is gone.
    NeighbourGone { ip: IpAddr, ifindex: u32 },
    /// An address was added to a link (or refreshed), or removed.
    Address { ifindex: u32, ip: IpAddr, added: bool },
    /// The socket overran: events were lost, so anything may have changed.
    Lost,
}

/// Starts the monitor thread; `on_change` runs on it for every change.
pub(crate) fn spawn_monitor(on_change: impl Fn(KernelChange) + Send + 'static) -> io::Result<()> {
    let mut socket = Socket::new(NETLINK_ROUTE)?;
    socket.bind(&SocketAddr::new(0, 0))?;
    for group in [
        libc::RTNLGRP_LINK,
        libc::RTNLGRP_NEIGH,
        libc::RTNLGRP_IPV4_ROUTE,
        libc::RTNLGRP_IPV6_ROUTE,
        libc::RTNLGRP_IPV4_IFADDR,
        libc::RTNLGRP_IPV6_IFADDR,
    ] {
        socket.add_membership(group)?;
    }
    thread::Builder::new().name("rtnetlink-events".into()).spawn(move || loop {
        match socket.recv_from_full() {
            Ok((bytes, _)) => {
                for change in parse_all(&bytes) {
                    on_change(change);
                }
            }
            // ENOBUFS: the kernel dropped events for us.
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => on_change(KernelChange::Lost),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => {
                on_change(KernelChange::Lost);
                return;
            }
        }
    })?;
    Ok(())
}

/// Every change in one datagram (several messages may share it).
pub(crate) fn parse_all(bytes: &[u8]) -> Vec<KernelChange> {
    let mut out = Vec::new();
    let mut offset = 0;
    while offset < bytes.len() {
        let Ok(msg) = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&bytes[offset..]) else {
            // A message this crate cannot read (RTM_NEWNETCONF, say): skip
            // it by its length if the header is readable.
            match bytes.get(offset..offset + 4).map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]])) {
                Some(len) if len >= 16 => {
                    offset += (len as usize + 3) & !3;
                    continue;
                }
                _ => break,
            }
        };
        let len = msg.header.length as usize;
        if len == 0 {
            break;
        }
        offset += (len + 3) & !3;
        if let NetlinkPayload::InnerMessage(m) = msg.payload {
            out.extend(change_of(&m));
        } else if let NetlinkPayload::Overrun(_) = msg.payload {
            out.push(KernelChange::Lost);
        }
    }
    out
}

fn change_of(m: &RouteNetlinkMessage) -> Option<KernelChange> {
    match m {
        RouteNetlinkMessage::NewLink(l) => {
            let l = super::link::parse(l);
            Some(KernelChange::Link { name: l.name, index: l.index, up: l.up })
        }
        RouteNetlinkMessage::DelLink(l) => Some(KernelChange::LinkGone { name: super::link::parse(l).name }),
        RouteNetlinkMessage::DelRoute(r) => {
            let r = super::route::parse(r)?;
            Some(KernelChange::RouteGone { table: r.table, dst: r.dst, protocol: r.protocol })
        }
        RouteNetlinkMessage::NewAddress(a) => address_change(a, true),
        RouteNetlinkMessage::DelAddress(a) => address_change(a, false),
        RouteNetlinkMessage::DelNeighbour(n) => {
            let n = super::neigh::parse(n)?;
            Some(KernelChange::NeighbourGone { ip: n.ip, ifindex: n.ifindex })
        }
        _ => None,
    }
}

/// An address event, by its local address.
fn address_change(a: &netlink_packet_route::address::AddressMessage, added: bool) -> Option<KernelChange> {
    Some(KernelChange::Address { ifindex: a.header.index, ip: super::local_address(a)?, added })
}

/// What a link is like right now, to tell a change that still holds from
/// one already undone (hostmesh creates a link down, then sets it up: the
/// first event alone would look like drift).
pub(crate) trait LinkLookup {
    fn index(&self, name: &str) -> Option<u32>;
    fn name(&self, index: u32) -> Option<String>;
    fn up(&self, name: &str) -> Option<bool>;
}

/// The daemon's namespace as it is now (`backends::ifaces`).
pub(crate) struct CurrentLinks;

impl LinkLookup for CurrentLinks {
    fn index(&self, name: &str) -> Option<u32> {
        crate::backends::ifaces::index(name)
    }

    fn name(&self, index: u32) -> Option<String> {
        crate::backends::ifaces::name(index)
    }

    fn up(&self, name: &str) -> Option<bool> {
        crate::backends::ifaces::is_up(name)
    }
}
