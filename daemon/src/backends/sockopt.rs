//! getsockopt(2) and setsockopt(2) for the few options neither std nor nix
//! offers: IPV6_TRANSPARENT (with IP_TRANSPARENT, on a sidecar's listener),
//! and the socket and network namespace cookies.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

// libc and nix lack these two socket options (include/uapi/asm-generic/socket.h).
pub(crate) const SO_COOKIE: libc::c_int = 57;
pub(crate) const SO_NETNS_COOKIE: libc::c_int = 71;

/// Reads option `name` at `level`, a `T`.
pub(crate) fn get<T: Default>(fd: BorrowedFd<'_>, level: libc::c_int, name: libc::c_int) -> io::Result<T> {
    let mut value = T::default();
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: a valid fd and a buffer of the size passed.
    let rc =
        unsafe { libc::getsockopt(fd.as_raw_fd(), level, name, &mut value as *mut T as *mut libc::c_void, &mut len) };
    if rc == 0 {
        Ok(value)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The kernel's cookie of a socket (what sock_diag and the probes see).
pub(crate) fn socket_cookie(fd: BorrowedFd<'_>) -> io::Result<u64> {
    get(fd, libc::SOL_SOCKET, SO_COOKIE)
}

/// Sets option `name` at `level` to `value`.
pub(crate) fn set<T>(fd: BorrowedFd<'_>, level: libc::c_int, name: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: a valid fd and a pointer to `size_of::<T>()` readable bytes.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            value as *const T as *const libc::c_void,
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
