//! Interfaces of the daemon's network namespace by name and by index, as
//! they are at the moment of asking (the libc calls, no netlink dump).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A link's index; None when there is no such link.
pub(crate) fn index(name: &str) -> Option<u32> {
    nix::net::if_::if_nametoindex(name).ok()
}

/// The name of the link with this index, if there is one.
pub(crate) fn name(index: u32) -> Option<String> {
    let mut buf = [0u8; libc::IF_NAMESIZE];
    // SAFETY: buf has the IF_NAMESIZE bytes if_indextoname writes at most.
    let p = unsafe { libc::if_indextoname(index, buf.as_mut_ptr() as *mut libc::c_char) };
    if p.is_null() {
        return None;
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    Some(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// Whether the link is administratively up (SIOCGIFFLAGS); None when there
/// is no such link.
pub(crate) fn is_up(name: &str) -> Option<bool> {
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
