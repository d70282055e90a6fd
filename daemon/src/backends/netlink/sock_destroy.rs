//! TCP and UDP sockets of this network namespace by peer, and destroying
//! one (sock_diag SOCK_DESTROY, CONFIG_INET_DIAG_DESTROY): its owner's
//! next call fails (a TCP peer also gets a RST). What `ss -K` does.

use std::collections::BTreeSet;
use std::io;
use std::net::SocketAddr;

use netlink_packet_sock_diag::constants::{AF_INET, AF_INET6, IPPROTO_UDP};

use netlink_packet_sock_diag::inet::{ExtensionFlags, InetRequest, SocketId, StateFlags};
use netlink_packet_sock_diag::SockDiagMessage;
use netlink_sys::protocols::NETLINK_SOCK_DIAG;

use super::NetlinkSocket;

use netlink_packet_sock_diag::constants::SOCK_DESTROY;

/// A connected socket as sock_diag names it.
#[derive(Debug, Clone)]
pub(crate) struct SocketRef {
    pub peer: SocketAddr,
    pub cookie: u64,
    id: SocketId,
    family: u8,
    protocol: u8,
}

/// Every socket of `protocol` (IPPROTO_TCP or IPPROTO_UDP; both families)
/// connected to one of `peers`.
pub(crate) fn sockets_to(protocol: u8, peers: &BTreeSet<SocketAddr>) -> io::Result<Vec<SocketRef>> {
    let mut sock: NetlinkSocket<SockDiagMessage> = NetlinkSocket::open_protocol(NETLINK_SOCK_DIAG)?;
    let mut out = Vec::new();
    for (family, v6) in [(AF_INET, false), (AF_INET6, true)] {
        // IPv4 peers are reached by IPv4 sockets and by IPv6 ones
        // (v4-mapped); IPv6 peers by IPv6 sockets only.
        if !v6 && !peers.iter().any(SocketAddr::is_ipv4) {
            continue;
        }
        let request = InetRequest {
            family,
            protocol,
            extensions: ExtensionFlags::empty(),
            states: StateFlags::all() - StateFlags::LISTEN,
            socket_id: if v6 { SocketId::new_v6() } else { SocketId::new_v4() },
        };
        for msg in sock.dump(SockDiagMessage::InetRequest(request))? {
            let SockDiagMessage::InetResponse(r) = msg else { continue };
            let id = r.header.socket_id.clone();
            // An IPv6 socket connected to an IPv4 peer shows it v4-mapped.
            let peer_ip = match id.destination_address {
                std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(v6.into(), Into::into),
                v4 => v4,
            };
            let peer = SocketAddr::new(peer_ip, id.destination_port);
            if peers.contains(&peer) {
                out.push(SocketRef { peer, cookie: u64::from_ne_bytes(id.cookie), id, family, protocol });
            }
        }
    }
    Ok(out)
}

/// Whether this kernel destroys sockets: asked to destroy a UDP socket
/// that does not exist, it answers ENOENT; without
/// CONFIG_INET_DIAG_DESTROY, EOPNOTSUPP.
pub(crate) fn supported() -> bool {
    let socket = SocketRef {
        peer: SocketAddr::from(([0, 0, 0, 0], 0)),
        cookie: 0,
        id: SocketId::new_v4(),
        family: AF_INET,
        protocol: IPPROTO_UDP,
    };
    !matches!(destroy(&socket), Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP))
}

/// Destroys one socket found by `sockets_to` (ENOENT: it is gone).
pub(crate) fn destroy(socket: &SocketRef) -> io::Result<()> {
    let mut sock: NetlinkSocket<SockDiagMessage> = NetlinkSocket::open_protocol(NETLINK_SOCK_DIAG)?;
    let request = InetRequest {
        family: socket.family,
        protocol: socket.protocol,
        extensions: ExtensionFlags::empty(),
        states: StateFlags::all(),
        socket_id: socket.id.clone(),
    };
    sock.request_typed(SockDiagMessage::InetRequest(request), SOCK_DESTROY)
}
