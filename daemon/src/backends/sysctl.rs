//! Sysctls through /proc/sys: read first, write only on change (the
//! planner already compares; the write re-checks so a concurrent change
//! is not clobbered needlessly). /proc/sys/net reflects the network
//! namespace of the process, which is the daemon's own.

use std::fs;
use std::io;
use std::path::PathBuf;

use super::{BackendError, Result, SysctlBackend};

pub struct ProcSys {
    root: PathBuf,
}

impl ProcSys {
    pub fn new() -> Self {
        ProcSys { root: PathBuf::from("/proc/sys") }
    }
}

impl Default for ProcSys {
    fn default() -> Self {
        Self::new()
    }
}

impl SysctlBackend for ProcSys {
    fn get(&mut self, path: &str) -> Result<Option<String>> {
        match fs::read_to_string(self.root.join(path)) {
            Ok(v) => Ok(Some(v.trim().to_string())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(BackendError::Sysctl { path: path.replace('/', "."), source }),
        }
    }

    fn set(&mut self, path: &str, value: &str) -> Result<()> {
        if self.get(path)?.as_deref() == Some(value) {
            return Ok(());
        }
        fs::write(self.root.join(path), value)
            .map_err(|source| BackendError::Sysctl { path: path.replace('/', "."), source })
    }
}
