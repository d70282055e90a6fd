//! Finding a sidecar's listener with sock_diag (NETLINK_SOCK_DIAG): the
//! socket bound to the redirect port on loopback (or the wildcard address)
//! in this network namespace, listening (TCP) or unconnected (UDP).

use std::io;
use std::net::SocketAddr;

use netlink_packet_sock_diag::constants::{AF_INET, AF_INET6, IPPROTO_TCP, TCP_LISTEN};
use netlink_packet_sock_diag::inet::{ExtensionFlags, InetRequest, SocketId, StateFlags};
use netlink_packet_sock_diag::SockDiagMessage;
use netlink_sys::protocols::NETLINK_SOCK_DIAG;

use crate::abi::{self, SockKey};
use crate::backends::netlink::NetlinkSocket;
use crate::backends::Listener;

/// The listener a mesh redirect port should reach, if one exists.
pub(super) fn find(key: &SockKey) -> io::Result<Option<Listener>> {
    let mut sock: NetlinkSocket<SockDiagMessage> = NetlinkSocket::open_protocol(NETLINK_SOCK_DIAG)?;
    let v6 = key.family == abi::AF_INET6;
    let tcp = key.proto == IPPROTO_TCP;
    let request = InetRequest {
        family: if v6 { AF_INET6 } else { AF_INET },
        protocol: key.proto,
        extensions: ExtensionFlags::empty(),
        states: if tcp { StateFlags::LISTEN } else { StateFlags::all() },
        socket_id: if v6 { SocketId::new_v6() } else { SocketId::new_v4() },
    };
    let mut candidates = Vec::new();
    for msg in sock.dump(SockDiagMessage::InetRequest(request))? {
        let SockDiagMessage::InetResponse(r) = msg else { continue };
        let id = &r.header.socket_id;
        let bound = id.source_address;
        let fits = id.source_port == key.port
            && (!tcp || r.header.state == TCP_LISTEN)
            && (tcp || id.destination_port == 0)
            && (bound.is_loopback() || bound.is_unspecified());
        if fits {
            candidates.push(Listener {
                addr: SocketAddr::new(bound, id.source_port),
                inode: r.header.inode,
                cookie: u64::from_ne_bytes(id.cookie),
            });
        }
    }
    // Loopback first: that is where sidecars are told to listen.
    candidates.sort_by_key(|l| !l.addr.ip().is_loopback());
    Ok(candidates.into_iter().next())
}
