//! Reading one drop-in as the daemon may trust it: a regular file, owned
//! by root (or the daemon's uid), writable by nobody else (the rule is
//! `trust::check_trusted`), and whole: a file some process still has open
//! for writing is not read now — its writer's close (IN_CLOSE_WRITE)
//! brings another sync. Whether anyone has it open for writing is asked
//! of the kernel with a read lease (fcntl F_SETLEASE), which the kernel
//! grants only when no one does.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Why a drop-in was not read.
#[derive(Debug)]
pub(crate) enum Unread {
    /// Some process has it open for writing; read it once it is closed.
    BeingWritten,
    /// Not a regular file (a FIFO, a dir, a device named `*.toml`).
    NotAFile(&'static str),
    /// Others could have written it: rejected.
    Unsafe(crate::trust::Unsafe),
    Io(io::Error),
}

/// The whole text of `path` (following a symlink to its target).
pub(crate) fn read_drop_in(path: &Path) -> Result<Vec<u8>, Unread> {
    read_drop_in_with(path, |f, len| {
        let mut bytes = Vec::with_capacity(len);
        f.read_to_end(&mut bytes)?;
        Ok(bytes)
    })
}

/// The length and `TextHash` of `path`'s text, read as `read_drop_in`
/// reads it but a piece at a time: a file of 100,000 services (9 MB) is
/// never held whole to learn that it did not change.
pub(super) fn hash_drop_in(path: &Path) -> Result<(usize, u64), Unread> {
    copy_drop_in(path, &mut io::sink())
}

/// Copies `path`'s text, read as `read_drop_in` reads it, to `out` a
/// piece at a time; returns its length and `TextHash`.
pub(crate) fn copy_drop_in(path: &Path, out: &mut dyn io::Write) -> Result<(usize, u64), Unread> {
    read_drop_in_with(path, |f, _| {
        let mut hash = TextHash::default();
        let mut piece = vec![0u8; 64 << 10];
        loop {
            match f.read(&mut piece) {
                Ok(0) => return Ok(hash.finish()),
                Ok(n) => {
                    hash.add(&piece[..n]);
                    out.write_all(&piece[..n])?;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    })
}

/// A hash of a file's text (SipHash, as the standard library's), fed in
/// pieces: the same however the text is cut.
#[derive(Default)]
pub(crate) struct TextHash {
    hasher: std::collections::hash_map::DefaultHasher,
    len: usize,
}

impl TextHash {
    pub(crate) fn of(bytes: &[u8]) -> (usize, u64) {
        let mut h = TextHash::default();
        h.add(bytes);
        h.finish()
    }

    pub(super) fn add(&mut self, bytes: &[u8]) {
        use std::hash::Hasher;
        self.hasher.write(bytes);
        self.len += bytes.len();
    }

    /// The text's length and hash.
    pub(super) fn finish(mut self) -> (usize, u64) {
        use std::hash::Hasher;
        self.hasher.write_usize(self.len);
        (self.len, self.hasher.finish())
    }
}

/// Opens `path` as a drop-in may be opened and, if it may be read now,
/// hands it and its length to `read`.
fn read_drop_in_with<T>(path: &Path, read: impl FnOnce(&mut File, usize) -> io::Result<T>) -> Result<T, Unread> {
    // O_NONBLOCK: opening a FIFO put in place of a file must not hang.
    let mut f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(Unread::Io)?;
    let meta = f.metadata().map_err(Unread::Io)?;
    if !meta.is_file() {
        return Err(Unread::NotAFile(kind_of(&meta)));
    }
    crate::trust::check_trusted(path, meta.uid(), meta.mode()).map_err(Unread::Unsafe)?;
    let leased = take_read_lease(&f)?;
    let got = read(&mut f, meta.len() as usize);
    if leased {
        release_lease(&f);
    }
    got.map_err(Unread::Io)
}

/// What kind of non-regular file this is, for the message.
pub(super) fn kind_of(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() || t.is_char_device() {
        "a device"
    } else {
        "not a regular file"
    }
}

/// Takes a read lease: Ok(true) if taken, Ok(false) where leases are not
/// available (another filesystem, no right to them), BeingWritten if a
/// writer has the file open.
fn take_read_lease(f: &File) -> Result<bool, Unread> {
    // A writer opening the file while the lease is held makes the kernel
    // signal the holder (SIGIO, whose default action ends the process):
    // `main` ignores SIGIO for the whole process before anything reads a
    // config file. (Unit tests have no `main`: they set the same here.)
    #[cfg(test)]
    {
        static IGNORE_SIGIO: std::sync::Once = std::sync::Once::new();
        // SAFETY: setting a disposition to SIG_IGN has no handler to race.
        IGNORE_SIGIO.call_once(|| unsafe {
            libc::signal(libc::SIGIO, libc::SIG_IGN);
        });
    }
    // SAFETY: fcntl on an fd this function borrows, no pointers.
    let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLEASE, libc::F_RDLCK) };
    if r == 0 {
        return Ok(true);
    }
    match io::Error::last_os_error().raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EBUSY) => Err(Unread::BeingWritten),
        _ => Ok(false),
    }
}

fn release_lease(f: &File) {
    // SAFETY: as above.
    unsafe {
        libc::fcntl(f.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_file_open_for_writing_is_not_read_until_closed() {
        let dir = std::env::temp_dir().join(format!("hm-read-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("10-web.toml");
        let mut w = File::create(&p).unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
        w.write_all(b"[[service]]\n").unwrap();
        assert!(matches!(read_drop_in(&p), Err(Unread::BeingWritten)));
        drop(w);
        assert_eq!(read_drop_in(&p).unwrap(), b"[[service]]\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
