//! Dropping the flows of backends that left a service: the veth path's
//! flows to them are forgotten (the next datagram of a UDP flow is
//! balanced afresh, onto a serving backend; the next segment of a TCP
//! flow meets a backend that resets it), and the connected sockets that
//! connect-time LB pointed at them (their cookie and backend are in
//! HM_REVERSE_SOCK) are destroyed with sock_diag, so their owner gets an
//! error and reconnects. UDP flows are dropped as soon as their backend
//! leaves; TCP flows only after the service's `drain_timeout`.

use std::collections::BTreeSet;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};

use crate::abi::*;
use crate::backends::netlink::sock_destroy;
use crate::backends::StoppedBackend;
use crate::config::Protocol;

use super::load::Loader;
use super::{bpf_err, sys};
use crate::backends::Forgotten;
use crate::model::Feature;

/// Forgets the veth path's flows to backends that left and destroys the
/// connected sockets connect-time LB pointed at them.
pub(super) fn drop_flows(loader: &mut Loader, stopped: &[StoppedBackend]) -> crate::backends::Result<Forgotten> {
    let mut out = Forgotten::default();
    if stopped.is_empty() || !loader.any() {
        return Ok(out);
    }
    let stopped: BTreeSet<_> = stopped.iter().copied().collect();
    let ct = loader.map_fd_owned(HmMap::Ct)?;
    out.flow_entries =
        forget_flows(ct.as_fd(), &stopped).map_err(|e| bpf_err(format!("drop flows in {}", HmMap::Ct), e))?;
    let services = loader.map_fd_owned(HmMap::Services)?;
    let nat = loader.map_fd_owned(HmMap::Nat)?;
    out.flow_entries += forget_external_flows(nat.as_fd(), services.as_fd(), &stopped)
        .map_err(|e| bpf_err(format!("drop flows in {}", HmMap::Nat), e))?;
    if !loader.features().has(Feature::SockDestroy) {
        // `hostmesh status` lists the feature as missing, with its cost.
        return Ok(out);
    }
    let revsk = loader.map_fd_owned(HmMap::ReverseSock)?;
    match destroy_sockets(revsk.as_fd(), &stopped) {
        Ok(n) => out.sockets = n,
        Err(e) => out.sockets_error = Some(format!("cannot destroy connected sockets: {e}")),
    }
    Ok(out)
}

/// Deletes both entries of every flow from a VIP to a stopped backend (of
/// its protocol); returns how many entries.
pub(super) fn forget_flows(fd: BorrowedFd<'_>, stopped: &BTreeSet<StoppedBackend>) -> io::Result<usize> {
    let entries = sys::map_dump(fd, std::mem::size_of::<CtKey>(), std::mem::size_of::<CtValue>())?;
    let mut gone = 0;
    for (k, v) in entries {
        let (Some(key), Some(value)) = (CtKey::from_bytes(&k), CtValue::from_bytes(&v)) else { continue };
        let Some(protocol) = Protocol::from_number(key.proto) else { continue };
        // Forward: client -> VIP, holding the backend; reverse: backend ->
        // client, holding the VIP.
        let pair = if key.dir == CT_FORWARD {
            StoppedBackend {
                vip: socket_addr16(key.dst, key.dport_be),
                protocol,
                backend: socket_addr16(value.nat_addr, value.nat_port_be),
            }
        } else {
            StoppedBackend {
                vip: socket_addr16(value.nat_addr, value.nat_port_be),
                protocol,
                backend: socket_addr16(key.src, key.sport_be),
            }
        };
        if stopped.contains(&pair) {
            // A key gone meanwhile deletes fine (sys::map_delete).
            sys::map_delete(fd, &k)?;
            gone += 1;
        }
    }
    Ok(gone)
}

/// Deletes both entries of every flow from the network (HM_NAT) to a
/// stopped backend of its service; returns how many entries. The entries
/// carry the service's id, not its VIP (a node port's flow is to a host
/// address): each stopped pair's service id is looked up in HM_SERVICES,
/// and a service no longer there has no flows left to keep either.
pub(super) fn forget_external_flows(
    fd: BorrowedFd<'_>,
    services: BorrowedFd<'_>,
    stopped: &BTreeSet<StoppedBackend>,
) -> io::Result<usize> {
    let mut gone_from: BTreeSet<(u32, Protocol, SocketAddr)> = BTreeSet::new();
    let mut value = vec![0u8; std::mem::size_of::<SvcValue>()];
    for s in stopped {
        let key = SvcKey::new(s.vip.ip(), s.vip.port(), s.protocol.number());
        if sys::map_lookup(services, &key.to_bytes(), &mut value)? {
            if let Some(svc) = SvcValue::from_bytes(&value) {
                gone_from.insert((svc.id, s.protocol, s.backend));
            }
        }
    }
    if gone_from.is_empty() {
        return Ok(0);
    }
    let entries = sys::map_dump(fd, std::mem::size_of::<CtKey>(), std::mem::size_of::<NatValue>())?;
    let mut gone = 0;
    for (k, v) in entries {
        let (Some(key), Some(value)) = (CtKey::from_bytes(&k), NatValue::from_bytes(&v)) else { continue };
        let Some(protocol) = Protocol::from_number(key.proto) else { continue };
        // The client's entry is rewritten to the backend; the backend's
        // entry is keyed by it.
        let backend = if value.flags & NAT_F_REPLY == 0 {
            socket_addr16(value.dst, value.dport_be)
        } else {
            socket_addr16(key.src, key.sport_be)
        };
        if gone_from.contains(&(value.svc_id, protocol, backend)) {
            sys::map_delete(fd, &k)?;
            gone += 1;
        }
    }
    Ok(gone)
}

/// Destroys connected sockets whose peer is a stopped backend that
/// connect-time LB chose for the socket's VIP; returns how many.
pub(super) fn destroy_sockets(revsk: BorrowedFd<'_>, stopped: &BTreeSet<StoppedBackend>) -> io::Result<usize> {
    let mut destroyed = 0;
    for protocol in Protocol::ALL {
        let backends: BTreeSet<SocketAddr> =
            stopped.iter().filter(|s| s.protocol == protocol).map(|s| s.backend).collect();
        if !backends.is_empty() {
            destroyed += destroy_sockets_of(revsk, protocol, &backends, stopped)?;
        }
    }
    Ok(destroyed)
}

fn destroy_sockets_of(
    revsk: BorrowedFd<'_>,
    protocol: Protocol,
    backends: &BTreeSet<SocketAddr>,
    stopped: &BTreeSet<StoppedBackend>,
) -> io::Result<usize> {
    let mut destroyed = 0;
    for socket in sock_destroy::sockets_to(protocol.number(), backends)? {
        let key = RevSkKey {
            cookie: socket.cookie,
            addr: addr16(socket.peer.ip()),
            port_be: socket.peer.port().to_be(),
            pad: [0; 3],
        };
        let mut value = vec![0u8; std::mem::size_of::<RevSkValue>()];
        if !sys::map_lookup(revsk, &key.to_bytes(), &mut value)? {
            continue; // not one hostmesh steered
        }
        let Some(vip) = RevSkValue::from_bytes(&value) else { continue };
        let pair = StoppedBackend { vip: socket_addr16(vip.addr, vip.port_be), protocol, backend: socket.peer };
        if stopped.contains(&pair) {
            match sock_destroy::destroy(&socket) {
                Ok(()) => destroyed += 1,
                // Closed meanwhile.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(destroyed)
}
