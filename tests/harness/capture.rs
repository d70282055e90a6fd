//! A packet capture on one link of a namespace, as tcpdump would take it
//! (an AF_PACKET socket, both directions), for the tests that must show
//! what crossed a link: open it, make the traffic, then `take` every frame
//! it holds. Frames are summarised (protocol and ports) and searched for
//! markers (bytes that must not cross in clear: a payload, an inner
//! address); nothing is kept beyond that.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::Netns;

/// What one captured frame was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// IPPROTO_* of an IPv4 or IPv6 packet; `None` for anything else
    /// (ARP).
    pub proto: Option<u8>,
    /// The Ethernet source: which host sent it onto the link.
    pub src_mac: Option<[u8; 6]>,
    /// Source and destination addresses of an IPv4 or IPv6 packet.
    pub addrs: Option<(std::net::IpAddr, std::net::IpAddr)>,
    /// The UDP or TCP ports.
    pub ports: Option<(u16, u16)>,
    /// One of the markers the capture looks for is somewhere in the frame.
    pub has_marker: bool,
    /// Sent by the link's own host (PACKET_OUTGOING), not received.
    pub outgoing: bool,
}

impl Frame {
    /// The link's own IPv6 housekeeping (ICMPv6: neighbour discovery,
    /// router solicitations, MLD), which any IPv6 link carries, that
    /// holds none of the markers: no traffic of anyone's.
    pub fn is_link_housekeeping(&self) -> bool {
        self.proto == Some(58) && !self.has_marker
    }
}

pub struct Capture {
    fd: OwnedFd,
    markers: Vec<Vec<u8>>,
}

impl Capture {
    /// Starts capturing every frame in and out of `link` in `ns`.
    pub fn start(ns: &Netns, link: &str, markers: &[&[u8]]) -> Capture {
        let link = std::ffi::CString::new(link).expect("link name");
        let fd = ns.run(move || -> std::io::Result<OwnedFd> {
            let all = (libc::ETH_P_ALL as u16).to_be();
            // SAFETY: plain syscalls on a socket this closure owns.
            unsafe {
                // Protocol 0: a packet socket made with ETH_P_ALL hears
                // every link of the namespace until bind() narrows it to
                // one, and frames of other links (a member's VXLAN on the
                // LAN, a probe decapsulated on hm-tun0) queued in between
                // were read as this link's (seen in the 6.12 VM under
                // load). Bound with the protocol, it hears `link` alone.
                let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, 0);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let fd = OwnedFd::from_raw_fd(fd);
                let size: libc::c_int = 8 << 20;
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_RCVBUFFORCE,
                    (&size as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as u32,
                );
                let index = libc::if_nametoindex(link.as_ptr());
                if index == 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let mut addr: libc::sockaddr_ll = std::mem::zeroed();
                addr.sll_family = libc::AF_PACKET as u16;
                addr.sll_protocol = all;
                addr.sll_ifindex = index as i32;
                let r = libc::bind(
                    fd.as_raw_fd(),
                    (&addr as *const libc::sockaddr_ll).cast(),
                    std::mem::size_of::<libc::sockaddr_ll>() as u32,
                );
                if r < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(fd)
            }
        });
        Capture { fd: fd.expect("an AF_PACKET capture"), markers: markers.iter().map(|m| m.to_vec()).collect() }
    }

    /// Every frame captured so far (and no longer held).
    pub fn take(&self) -> Vec<Frame> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 65536];
        loop {
            // SAFETY: reads into a buffer of its length, and the sender's
            // address into a sockaddr_ll of its size.
            let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            let n = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_TRUNC,
                    (&mut from as *mut libc::sockaddr_ll).cast(),
                    &mut len,
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                // A link that went down says so once; what it captured
                // before is still there to read.
                if e.raw_os_error() == Some(libc::ENETDOWN) {
                    continue;
                }
                assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "capture: {e}");
                return out;
            }
            let frame = &buf[..(n as usize).min(buf.len())];
            let mut f = summarise(frame, &self.markers);
            f.outgoing = from.sll_pkttype == libc::PACKET_OUTGOING;
            out.push(f);
        }
    }
}

fn summarise(f: &[u8], markers: &[Vec<u8>]) -> Frame {
    let has_marker = markers.iter().any(|m| !m.is_empty() && f.windows(m.len()).any(|w| w == m.as_slice()));
    let ethertype = f.get(12..14).map(|t| u16::from_be_bytes([t[0], t[1]]));
    let (proto, l4) = match ethertype {
        Some(0x0800) if f.len() >= 34 => (Some(f[23]), 14 + usize::from(f[14] & 0x0f) * 4),
        Some(0x86dd) if f.len() >= 54 => (Some(f[20]), 54),
        _ => (None, 0),
    };
    let addrs = match (ethertype, proto) {
        (Some(0x0800), Some(_)) => {
            let a = |at: usize| std::net::IpAddr::from(<[u8; 4]>::try_from(&f[at..at + 4]).expect("4 bytes"));
            Some((a(26), a(30)))
        }
        (Some(0x86dd), Some(_)) => {
            let a = |at: usize| std::net::IpAddr::from(<[u8; 16]>::try_from(&f[at..at + 16]).expect("16 bytes"));
            Some((a(22), a(38)))
        }
        _ => None,
    };
    let ports = match proto {
        Some(6) | Some(17) if f.len() >= l4 + 4 => {
            Some((u16::from_be_bytes([f[l4], f[l4 + 1]]), u16::from_be_bytes([f[l4 + 2], f[l4 + 3]])))
        }
        _ => None,
    };
    let src_mac = f.get(6..12).map(|m| <[u8; 6]>::try_from(m).expect("6 bytes"));
    Frame { proto, src_mac, addrs, ports, has_marker, outgoing: false }
}
