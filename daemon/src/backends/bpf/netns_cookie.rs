//! The daemon's network namespace cookie: the connect-time programs
//! compare `bpf_get_netns_cookie()` with it so they act only in this
//! namespace. SO_NETNS_COOKIE gives it (5.14+); before that a probe does.
//!
//! probes/netns_cookie.c is attached for a moment to the cgroup the daemon
//! runs in (a bpf link next to whatever else is there; it changes no
//! connect()), the daemon connects a UDP socket to 127.0.0.1:9 (a UDP
//! connect sends nothing), the program records the namespace's cookie
//! under the socket's, and dropping the objects detaches it again.

use std::fs::File;
use std::io;
use std::net::UdpSocket;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use aya::maps::HashMap;
use aya::programs::{CgroupAttachMode, CgroupSockAddr};
use aya::EbpfLoader;

use crate::abi::{HmMap, ProbeObject, NETNS_COOKIE_ADDR, NETNS_COOKIE_PORT};
use crate::backends::sockopt;

/// The cookie of the calling thread's network namespace, from
/// SO_NETNS_COOKIE (5.14+).
pub(crate) fn read_with_sockopt() -> io::Result<u64> {
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").or_else(|_| std::net::UdpSocket::bind("[::1]:0"))?;
    sockopt::get(sock.as_fd(), libc::SOL_SOCKET, sockopt::SO_NETNS_COOKIE)
}

/// The cgroup2 dir of the calling process (`0::/path` in /proc/self/cgroup).
pub(crate) fn own_cgroup(cgroup2_root: &Path) -> io::Result<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup")?;
    let rel = text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or_else(|| io::Error::other("/proc/self/cgroup has no cgroup2 entry (0::)"))?;
    Ok(cgroup2_root.join(rel.trim_start_matches('/')))
}

/// Reads this network namespace's cookie through a BPF program attached
/// to `cgroup`, which must hold the calling process.
pub(crate) fn read_with_bpf(cgroup: &Path) -> io::Result<u64> {
    let fail = |what: &str, e: &dyn std::fmt::Display| io::Error::other(format!("{what}: {e}"));
    let object = super::objects::bytes(ProbeObject::NetnsCookie);
    let held = super::held_signals::HeldSignals::new();
    let mut ebpf = EbpfLoader::new().load(object).map_err(|e| fail("load probes/netns_cookie.c", &e))?;
    let program: &mut CgroupSockAddr = ebpf
        .program_mut("hm_netns_cookie")
        .ok_or_else(|| io::Error::other("probes/netns_cookie.c has no hm_netns_cookie"))?
        .try_into()
        .map_err(|e| fail("hm_netns_cookie", &e))?;
    program.load().map_err(|e| fail("verify hm_netns_cookie", &e))?;
    drop(held);
    let dir = File::open(cgroup).map_err(|e| fail(&format!("open cgroup {}", cgroup.display()), &e))?;
    program
        .attach(&dir, CgroupAttachMode::Single)
        .map_err(|e| fail(&format!("attach hm_netns_cookie to cgroup {}", cgroup.display()), &e))?;

    let sock = UdpSocket::bind((NETNS_COOKIE_ADDR, 0)).or_else(|_| UdpSocket::bind("0.0.0.0:0"))?;
    let cookie = sockopt::socket_cookie(sock.as_fd()).map_err(|e| fail("getsockopt(SO_COOKIE)", &e))?;
    // The program runs before the kernel routes the connect(), so even an
    // error here (no loopback) has been seen by it.
    let _ = sock.connect((NETNS_COOKIE_ADDR, NETNS_COOKIE_PORT));

    let name = HmMap::NetnsCookie.name();
    let map = ebpf.map(name).ok_or_else(|| io::Error::other(format!("probes/netns_cookie.c has no {name}")))?;
    let cookies: HashMap<_, u64, u64> = HashMap::try_from(map).map_err(|e| fail(name, &e))?;
    // Dropping `ebpf` afterwards detaches the program (its link is not
    // pinned).
    cookies.get(&cookie, 0).map_err(|_| {
        io::Error::other(format!(
            "hm_netns_cookie on cgroup {} did not see the daemon's connect(); is the daemon in that cgroup?",
            cgroup.display()
        ))
    })
}
