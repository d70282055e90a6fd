//! The values sysctls had before hostmesh changed them, so they can be put
//! back when no longer needed (and by `hostmesh teardown`). Persisted in
//! the state dir: it survives a daemon restart, and is cleared by a reboot
//! together with the kernel state it describes.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

#[derive(Debug, Default)]
pub struct SysctlOriginals {
    file: Option<PathBuf>,
    values: BTreeMap<String, String>,
}

pub const FILE_NAME: &str = "sysctl-originals.json";

impl SysctlOriginals {
    /// In memory only (tests).
    pub fn in_memory() -> Self {
        Self::default()
    }

    /// Loads `state_dir/sysctl-originals.json` if present.
    pub fn load(state_dir: &Path) -> io::Result<Self> {
        let file = state_dir.join(FILE_NAME);
        let values = match fs::read(&file) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", file.display())))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(e),
        };
        Ok(SysctlOriginals { file: Some(file), values })
    }

    pub fn values(&self) -> &BTreeMap<String, String> {
        &self.values
    }

    pub fn record(&mut self, path: &str, value: &str) {
        if !self.values.contains_key(path) {
            self.values.insert(path.to_string(), value.to_string());
            self.save();
        }
    }

    pub fn forget(&mut self, path: &str) {
        if self.values.remove(path).is_some() {
            self.save();
        }
    }

    fn save(&self) {
        if let Some(file) = &self.file {
            let json = serde_json::to_vec_pretty(&self.values).expect("string map serialises");
            // Best effort: losing this file only means a sysctl is not put
            // back later; it never affects forwarding.
            let _ = crate::state::write_atomic(file, &json);
        }
    }
}
