//! A synchronous netlink socket: send one request, collect its answer (an
//! ACK, or every part of a dump). It speaks any netlink family whose
//! messages netlink-packet-core can (de)serialise: rtnetlink for links,
//! routes and neighbours, sock_diag for finding sidecar listeners. Typed
//! helpers build the messages; nothing above them sees raw netlink.

use std::fmt::Debug;
use std::io;
use std::marker::PhantomData;
use std::os::fd::AsRawFd;
use std::time::Duration;

use netlink_packet_core::{
    NetlinkDeserializable, NetlinkHeader, NetlinkMessage, NetlinkPayload, NetlinkSerializable, NLM_F_ACK, NLM_F_DUMP,
    NLM_F_REQUEST,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

/// No netlink answer takes this long unless something is badly wrong; the
/// daemon must not hang on it.
const RECV_TIMEOUT: Duration = Duration::from_secs(10);

pub struct NetlinkSocket<M> {
    socket: Socket,
    seq: u32,
    messages: PhantomData<fn() -> M>,
}

/// rtnetlink: links, routes, neighbours.
pub type RouteSocket = NetlinkSocket<RouteNetlinkMessage>;

impl RouteSocket {
    pub fn open() -> io::Result<Self> {
        Self::open_protocol(NETLINK_ROUTE)
    }
}

impl<M> NetlinkSocket<M>
where
    M: NetlinkSerializable + NetlinkDeserializable + Debug,
    NetlinkPayload<M>: From<M>,
{
    pub fn open_protocol(protocol: isize) -> io::Result<Self> {
        let mut socket = Socket::new(protocol)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        // Extended acks make the kernel explain EINVAL; strict checking makes
        // it honour dump filters.
        let _ = socket.set_ext_ack(true);
        let _ = socket.set_netlink_get_strict_chk(true);
        // Errors echo only the request's header, so the extended-ack
        // message sits at a fixed offset (see `extack_message`).
        let _ = socket.set_cap_ack(true);
        set_recv_timeout(&socket, RECV_TIMEOUT)?;
        Ok(NetlinkSocket { socket, seq: 0, messages: PhantomData })
    }

    /// Sends a request that expects only an acknowledgement.
    pub fn request(&mut self, msg: M, flags: u16) -> io::Result<()> {
        self.exchange(msg, NLM_F_REQUEST | NLM_F_ACK | flags, false).map(|_| ())
    }

    /// Sends a request answered by messages (not a dump), e.g. a route
    /// get; the ACK that follows them marks the end.
    pub fn query(&mut self, msg: M) -> io::Result<Vec<M>> {
        self.exchange(msg, NLM_F_REQUEST | NLM_F_ACK, false)
    }

    /// Sends a dump request and returns every message of the answer.
    pub fn dump(&mut self, msg: M) -> io::Result<Vec<M>> {
        self.exchange(msg, NLM_F_REQUEST | NLM_F_DUMP, true)
    }

    /// As `request`, under another message type than the payload's own
    /// (sock_diag's SOCK_DESTROY carries a SOCK_DIAG_BY_FAMILY request).
    pub fn request_typed(&mut self, msg: M, message_type: u16) -> io::Result<()> {
        self.exchange_as(msg, NLM_F_REQUEST | NLM_F_ACK, false, Some(message_type)).map(|_| ())
    }

    fn exchange(&mut self, msg: M, flags: u16, dump: bool) -> io::Result<Vec<M>> {
        self.exchange_as(msg, flags, dump, None)
    }

    fn exchange_as(&mut self, msg: M, flags: u16, dump: bool, message_type: Option<u16>) -> io::Result<Vec<M>> {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        header.sequence_number = self.seq;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(msg));
        packet.finalize();
        if let Some(t) = message_type {
            packet.header.message_type = t;
        }
        let mut buf = vec![0; packet.buffer_len()];
        packet.serialize(&mut buf);
        self.socket.send(&buf, 0)?;

        let mut out = Vec::new();
        loop {
            let (bytes, _) = self.socket.recv_from_full()?;
            let mut offset = 0;
            while offset < bytes.len() {
                let msg = NetlinkMessage::<M>::deserialize(&bytes[offset..]).map_err(|e| {
                    io::Error::new(io::ErrorKind::InvalidData, format!("malformed netlink message: {e}"))
                })?;
                let len = msg.header.length as usize;
                if len == 0 {
                    break;
                }
                let raw = &bytes[offset..(offset + len).min(bytes.len())];
                offset += len;
                if msg.header.sequence_number != self.seq {
                    continue; // an answer to an earlier, abandoned request
                }
                match msg.payload {
                    NetlinkPayload::Done(_) => return Ok(out),
                    NetlinkPayload::Error(e) => {
                        return match e.code {
                            None if !dump => Ok(out),
                            None => continue,
                            Some(_) => Err(with_extack(e.to_io(), raw)),
                        };
                    }
                    NetlinkPayload::InnerMessage(inner) => out.push(inner),
                    NetlinkPayload::Noop | NetlinkPayload::Overrun(_) => {}
                    _ => {}
                }
            }
        }
    }
}

use netlink_packet_core::{NLM_F_ACK_TLVS, NLM_F_CAPPED};
const NLMSGERR_ATTR_MSG: u16 = 1;

/// An errno with the kernel's explanation of it (extended ack).
#[derive(Debug)]
struct Explained {
    errno: i32,
    message: String,
}

impl std::fmt::Display for Explained {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", io::Error::from_raw_os_error(self.errno), self.message)
    }
}

impl std::error::Error for Explained {}

/// Adds the kernel's explanation ("Nexthop has invalid gateway") to an
/// errno, when it sent one; `errno` still finds the number.
fn with_extack(err: io::Error, raw: &[u8]) -> io::Error {
    match (extack_message(raw), err.raw_os_error()) {
        (Some(message), Some(errno)) => io::Error::new(err.kind(), Explained { errno, message }),
        _ => err,
    }
}

/// The errno of a netlink error, explained or not.
pub(super) fn errno(e: &io::Error) -> Option<i32> {
    e.raw_os_error().or_else(|| e.get_ref()?.downcast_ref::<Explained>().map(|x| x.errno))
}

/// The NLMSGERR_ATTR_MSG of an error message: after the 16-byte netlink
/// header, the 4-byte error and (capped) the request's 16-byte header.
fn extack_message(raw: &[u8]) -> Option<String> {
    let flags = u16::from_ne_bytes(raw.get(6..8)?.try_into().ok()?);
    if flags & NLM_F_ACK_TLVS == 0 || flags & NLM_F_CAPPED == 0 {
        return None;
    }
    let mut tlvs = raw.get(36..)?;
    while tlvs.len() >= 4 {
        let len = u16::from_ne_bytes(tlvs[0..2].try_into().ok()?) as usize;
        let kind = u16::from_ne_bytes(tlvs[2..4].try_into().ok()?);
        if len < 4 || len > tlvs.len() {
            return None;
        }
        if kind == NLMSGERR_ATTR_MSG {
            let text = &tlvs[4..len];
            let end = text.iter().position(|&b| b == 0).unwrap_or(text.len());
            return Some(String::from_utf8_lossy(&text[..end]).into_owned());
        }
        tlvs = &tlvs[((len + 3) & !3).min(tlvs.len())..];
    }
    None
}

fn set_recv_timeout(socket: &Socket, timeout: Duration) -> io::Result<()> {
    let tv = nix::sys::time::TimeVal::new(timeout.as_secs() as i64, 0);
    // SAFETY: the socket outlives this borrow.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(socket.as_raw_fd()) };
    nix::sys::socket::setsockopt(&fd, nix::sys::socket::sockopt::ReceiveTimeout, &tv).map_err(io::Error::from)
}
