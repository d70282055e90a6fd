//! Kernel change notifications: an rtnetlink socket subscribed to link,
//! route and neighbour events, read on a thread of its own. Each message
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
use netlink_packet_route::neighbour::{NeighbourAddress, NeighbourAttribute};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

/// rtnetlink multicast groups (linux/rtnetlink.h, RTNLGRP_*).
const RTNLGRP_LINK: u32 = 1;
const RTNLGRP_NEIGH: u32 = 3;
const RTNLGRP_IPV4_ROUTE: u32 = 7;
const RTNLGRP_IPV6_ROUTE: u32 = 11;

/// One change the kernel announced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelChange {
    /// A link appeared or changed (RTM_NEWLINK).
    Link { name: String, index: u32, up: bool },
    /// A link is gone.
    LinkGone { name: String },
    /// A route is gone.
    RouteGone { table: u32, dst: IpNet, protocol: u8 },
    /// A neighbour entry is gone.
    NeighbourGone { ip: IpAddr, ifindex: u32 },
    /// The socket overran: events were lost, so anything may have changed.
    Lost,
}

/// Starts the monitor thread; `on_change` runs on it for every change.
pub fn spawn_monitor(on_change: impl Fn(KernelChange) + Send + 'static) -> io::Result<()> {
    let mut socket = Socket::new(NETLINK_ROUTE)?;
    socket.bind(&SocketAddr::new(0, 0))?;
    for group in [RTNLGRP_LINK, RTNLGRP_NEIGH, RTNLGRP_IPV4_ROUTE, RTNLGRP_IPV6_ROUTE] {
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
pub fn parse_all(bytes: &[u8]) -> Vec<KernelChange> {
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
        RouteNetlinkMessage::DelNeighbour(n) => {
            let ip = n.attributes.iter().find_map(|a| match a {
                NeighbourAttribute::Destination(NeighbourAddress::Inet(v4)) => Some(IpAddr::V4(*v4)),
                NeighbourAttribute::Destination(NeighbourAddress::Inet6(v6)) => Some(IpAddr::V6(*v6)),
                _ => None,
            })?;
            Some(KernelChange::NeighbourGone { ip, ifindex: n.header.ifindex })
        }
        _ => None,
    }
}

/// What a link is like right now, to tell a change that still holds from
/// one already undone (hostmesh creates a link down, then sets it up: the
/// first event alone would look like drift).
pub trait LinkLookup {
    fn index(&self, name: &str) -> Option<u32>;
    fn name(&self, index: u32) -> Option<String>;
    fn up(&self, name: &str) -> Option<bool>;
}

/// The daemon's namespace, asked through if_nametoindex, if_indextoname
/// and SIOCGIFFLAGS.
pub struct CurrentLinks;

impl LinkLookup for CurrentLinks {
    fn index(&self, name: &str) -> Option<u32> {
        current_index(name)
    }

    fn name(&self, index: u32) -> Option<String> {
        let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
        // SAFETY: buf has IF_NAMESIZE bytes, as if_indextoname requires.
        let p = unsafe { libc::if_indextoname(index, buf.as_mut_ptr()) };
        if p.is_null() {
            return None;
        }
        // SAFETY: on success buf holds a NUL-terminated name.
        Some(unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
    }

    fn up(&self, name: &str) -> Option<bool> {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        if name.len() >= libc::IF_NAMESIZE {
            return None;
        }
        // SAFETY: a plain socket call; the fd is owned right away.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return None;
        }
        // SAFETY: fd was just returned by socket().
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: ifreq is plain data; zeroed is a valid value.
        let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
        for (d, s) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
            *d = s as libc::c_char;
        }
        // SAFETY: SIOCGIFFLAGS reads the name and writes the flags of ifr.
        if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr) } < 0 {
            return None;
        }
        // SAFETY: SIOCGIFFLAGS filled the flags member.
        let flags = unsafe { ifr.ifr_ifru.ifru_flags };
        Some(flags as i32 & libc::IFF_UP != 0)
    }
}

/// A link's index now; None when there is no such link.
pub fn current_index(name: &str) -> Option<u32> {
    nix::net::if_::if_nametoindex(name).ok()
}
