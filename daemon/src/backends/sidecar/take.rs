//! Taking a sidecar's socket into the daemon: find the process holding it
//! (a scan of /proc/*/fd for its inode), then duplicate it with
//! pidfd_open(2) + pidfd_getfd(2), which needs CAP_SYS_PTRACE over the
//! sidecar.

use std::fs;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use crate::backends::Holder;

/// The first process (other than this one) with the socket open.
pub(super) fn find_holder(inode: u32) -> Option<Holder> {
    let target = format!("socket:[{inode}]");
    let me = std::process::id();
    for entry in fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        if pid == me {
            continue;
        }
        let Ok(fds) = fs::read_dir(entry.path().join("fd")) else { continue };
        for fd in fds.flatten() {
            if fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == target.as_str()) {
                let Ok(fd_num) = fd.file_name().to_string_lossy().parse::<RawFd>() else { continue };
                let comm = fs::read_to_string(entry.path().join("comm")).unwrap_or_default().trim().to_string();
                return Some(Holder { pid, fd: fd_num, comm });
            }
        }
    }
    None
}

/// A duplicate of `owner`'s descriptor in this process.
pub(super) fn take(owner: &Holder) -> io::Result<OwnedFd> {
    // SAFETY: plain syscalls; each returned fd is owned exactly once below.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, owner.pid as libc::c_int, 0);
        if pidfd < 0 {
            return Err(io::Error::last_os_error());
        }
        let pidfd = OwnedFd::from_raw_fd(pidfd as RawFd);
        let fd = libc::syscall(libc::SYS_pidfd_getfd, std::os::fd::AsRawFd::as_raw_fd(&pidfd), owner.fd, 0);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(fd as RawFd))
    }
}

/// Lets tproxy hand the socket traffic for other local addresses (the
/// nftables fallback). Setting it on our duplicate sets it on the socket.
pub(super) fn set_transparent(fd: &OwnedFd, v6: bool) -> io::Result<()> {
    let (level, name) =
        if v6 { (libc::SOL_IPV6, libc::IPV6_TRANSPARENT) } else { (libc::SOL_IP, libc::IP_TRANSPARENT) };
    crate::backends::sockopt::set(std::os::fd::AsFd::as_fd(fd), level, name, &(1 as libc::c_int))
}
