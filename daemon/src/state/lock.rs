//! One hostmesh per state dir and per pin dir: an flock on `lock` in the
//! state dir (which also holds the owner's pid, for the message) and one
//! on the pin dir itself. `hostmesh run` holds both for its lifetime;
//! `hostmesh teardown` takes them too unless forced. The kernel drops the
//! locks when the process exits, however it exits.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

pub const LOCK_FILE: &str = "lock";

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("hostmesh is already running (pid {pid}) on {}", dir.display())]
    Held { pid: String, dir: PathBuf },
    #[error("cannot lock {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
}

/// Held locks; dropping it releases them.
#[derive(Debug)]
pub struct InstanceLock {
    _state: File,
    _pins: Option<File>,
}

impl InstanceLock {
    /// Locks the state dir, then the pin dir if it exists. Writes this
    /// process's pid into the lock file.
    pub fn acquire(state_dir: &Path, pin_dir: &Path) -> Result<InstanceLock, LockError> {
        let path = state_dir.join(LOCK_FILE);
        let io_err = |source| LockError::Io { path: path.clone(), source };
        let mut state = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(io_err)?;
        match state.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut pid = String::new();
                let _ = (&state).take(32).read_to_string(&mut pid);
                let pid = pid.trim().to_string();
                return Err(LockError::Held {
                    pid: if pid.is_empty() { holder(&state).unwrap_or_else(|| "unknown".into()) } else { pid },
                    dir: state_dir.to_path_buf(),
                });
            }
            Err(TryLockError::Error(e)) => return Err(io_err(e)),
        }
        state.set_len(0).map_err(io_err)?;
        state.rewind().map_err(io_err)?;
        writeln!(state, "{}", std::process::id()).map_err(io_err)?;
        let pins = if pin_dir.is_dir() { Some(lock_dir(pin_dir)?) } else { None };
        Ok(InstanceLock { _state: state, _pins: pins })
    }

    /// Locks the pin dir once it exists (the daemon creates it after
    /// taking the state dir's lock).
    pub fn add_pin_dir(&mut self, pin_dir: &Path) -> Result<(), LockError> {
        if self._pins.is_none() {
            self._pins = Some(lock_dir(pin_dir)?);
        }
        Ok(())
    }
}

fn lock_dir(dir: &Path) -> Result<File, LockError> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)
        .map_err(|source| LockError::Io { path: dir.to_path_buf(), source })?;
    match f.try_lock() {
        Ok(()) => Ok(f),
        Err(TryLockError::WouldBlock) => {
            Err(LockError::Held { pid: holder(&f).unwrap_or_else(|| "unknown".into()), dir: dir.to_path_buf() })
        }
        Err(TryLockError::Error(source)) => Err(LockError::Io { path: dir.to_path_buf(), source }),
    }
}

/// The pid holding an flock on `f`, from /proc/locks
/// (`1: FLOCK  ADVISORY  WRITE 4242 00:1f:1234 0 EOF`).
fn holder(f: &File) -> Option<String> {
    let meta = f.metadata().ok()?;
    let ino = meta.ino().to_string();
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    locks.lines().find_map(|l| {
        let parts: Vec<&str> = l.split_whitespace().collect();
        let (kind, pid, dev) = (parts.get(1)?, parts.get(4)?, parts.get(5)?);
        (*kind == "FLOCK" && dev.rsplit(':').next() == Some(ino.as_str())).then(|| pid.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_names_the_holder() {
        let dir = std::env::temp_dir().join(format!("hm-lock-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let pins = dir.join("pins");
        std::fs::create_dir_all(&pins).unwrap();
        let first = InstanceLock::acquire(&dir, &pins).unwrap();
        // flock locks belong to the open file: a second open conflicts
        // even within one process.
        let e = InstanceLock::acquire(&dir, &pins).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("hostmesh is already running (pid {}) on {}", std::process::id(), dir.display())
        );
        let other = dir.join("other-state");
        std::fs::create_dir_all(&other).unwrap();
        let e = InstanceLock::acquire(&other, &pins).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("hostmesh is already running (pid {}) on {}", std::process::id(), pins.display())
        );
        drop(first);
        InstanceLock::acquire(&dir, &pins).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
