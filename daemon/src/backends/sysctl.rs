//! Sysctls through /proc/sys: read first, write only on change (the
//! planner already compares; the write re-checks so a concurrent change
//! is not clobbered needlessly). /proc/sys/net reflects the network
//! namespace of the process, which is the daemon's own. Only paths under
//! /proc/sys/net are ever read or written (`check_path`): a path that
//! comes from a file in the state dir can name nothing else.

use std::fs;
use std::io;
use std::path::PathBuf;

use super::{BackendError, Result, SysctlBackend};

pub(crate) struct ProcSys {
    root: PathBuf,
}

impl ProcSys {
    pub(crate) fn new() -> Self {
        ProcSys { root: PathBuf::from("/proc/sys") }
    }
}

impl Default for ProcSys {
    fn default() -> Self {
        Self::new()
    }
}

/// The rule for a sysctl path hostmesh may touch: relative to /proc/sys,
/// under `net/`, plain names only (no `.`, `..` or empty parts).
pub(crate) fn check_path(path: &str) -> std::result::Result<(), String> {
    let parts: Vec<&str> = path.split('/').collect();
    let plain =
        |p: &&str| !p.is_empty() && *p != "." && *p != ".." && p.chars().all(|c| !c.is_control() && !c.is_whitespace());
    if parts.len() < 2 || parts[0] != "net" || !parts.iter().all(plain) || path.len() > 200 {
        return Err(format!("{:?} is not a sysctl under /proc/sys/net", crate::config::clip(path)));
    }
    Ok(())
}

fn checked(path: &str) -> Result<()> {
    check_path(path).map_err(|detail| BackendError::Sysctl {
        path: crate::config::clip(path),
        source: io::Error::new(io::ErrorKind::InvalidInput, detail),
    })
}

impl SysctlBackend for ProcSys {
    fn get(&mut self, path: &str) -> Result<Option<String>> {
        checked(path)?;
        match fs::read_to_string(self.root.join(path)) {
            Ok(v) => Ok(Some(v.trim().to_string())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(BackendError::Sysctl { path: path.replace('/', "."), source }),
        }
    }

    fn set(&mut self, path: &str, value: &str) -> Result<()> {
        checked(path)?;
        if self.get(path)?.as_deref() == Some(value) {
            return Ok(());
        }
        // With a newline, as sysctl(8) and `echo` write: an empty value
        // written as no bytes at all changes nothing (an empty
        // ip_local_reserved_ports would stay set).
        fs::write(self.root.join(path), format!("{value}\n"))
            .map_err(|source| BackendError::Sysctl { path: path.replace('/', "."), source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_net_sysctls_are_touched() {
        assert!(check_path("net/ipv4/conf/hm-natin/rp_filter").is_ok());
        assert!(check_path("net/ipv4/ip_forward").is_ok());
        for bad in ["/etc/passwd", "net/../../etc/passwd", "kernel/core_pattern", "net", "net//x", "net/./x", ""] {
            assert!(check_path(bad).is_err(), "{bad}");
        }
        let e = ProcSys::new().set("../../etc/shadow", "x").unwrap_err();
        assert!(e.to_string().contains("not a sysctl under /proc/sys/net"), "{e}");
    }
}
