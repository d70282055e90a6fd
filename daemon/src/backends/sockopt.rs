//! setsockopt(2) for the few options std does not offer (receive timeouts
//! on netlink sockets, IP_TRANSPARENT on a sidecar's listener).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

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
