//! The values sysctls had before hostmesh changed them, so they can be put
//! back when no longer needed (and by `hostmesh teardown`). Persisted in
//! the state dir: it survives a daemon restart, and is cleared by a reboot
//! together with the kernel state it describes.
//!
//! The file is input like any other: an entry whose path is not a sysctl
//! under /proc/sys/net (`backends::sysctl::check_path`) is dropped, and a
//! file that does not parse is moved aside, so neither a crafted nor a
//! truncated file stops the daemon or makes root write elsewhere.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::backends::sysctl::check_path;

#[derive(Debug, Default)]
pub(crate) struct SysctlOriginals {
    file: Option<PathBuf>,
    values: BTreeMap<String, String>,
}

pub(crate) const FILE_NAME: &str = "sysctl-originals.json";
/// The longest value a sysctl hostmesh sets can have had.
const VALUE_MAX: usize = 64;

impl SysctlOriginals {
    /// In memory only (tests).
    #[cfg(test)]
    pub(crate) fn in_memory() -> Self {
        Self::default()
    }

    /// Loads `state_dir/sysctl-originals.json` if present. Returns the
    /// originals and a sentence for each thing that was wrong with the
    /// file (a corrupt file is renamed to `*.corrupt` and ignored).
    pub(crate) fn load(state_dir: &Path) -> io::Result<(Self, Vec<String>)> {
        let file = state_dir.join(FILE_NAME);
        let mut notes = Vec::new();
        // Sysctl values of a few paths: a megabyte is far more than enough.
        let bytes = match crate::state::read_state_file(&file, 1 << 20) {
            Ok(b) => Some(b),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        let mut values = BTreeMap::new();
        if let Some(bytes) = bytes {
            match serde_json::from_slice::<BTreeMap<String, String>>(&bytes) {
                Ok(read) => {
                    for (path, value) in read {
                        match check_path(&path) {
                            Err(why) => notes.push(format!("{}: ignored an entry: {why}", file.display())),
                            Ok(()) if value.len() > VALUE_MAX || value.chars().any(char::is_control) => notes
                                .push(format!("{}: ignored the entry for {path}: not a sysctl value", file.display())),
                            Ok(()) => {
                                values.insert(path, value);
                            }
                        }
                    }
                }
                Err(e) => {
                    let aside = state_dir.join(format!("{FILE_NAME}.corrupt"));
                    fs::rename(&file, &aside)?;
                    notes.push(format!(
                        "{} is corrupt ({e}); moved it to {} — sysctls hostmesh changed before may not be put back",
                        file.display(),
                        aside.display()
                    ));
                }
            }
        }
        Ok((SysctlOriginals { file: Some(file), values }, notes))
    }

    pub(crate) fn values(&self) -> &BTreeMap<String, String> {
        &self.values
    }

    pub(crate) fn record(&mut self, path: &str, value: &str) {
        if !self.values.contains_key(path) {
            self.values.insert(path.to_string(), value.to_string());
            self.save();
        }
    }

    pub(crate) fn forget(&mut self, path: &str) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_with(name: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("hm-originals-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(FILE_NAME), text).unwrap();
        dir
    }

    #[test]
    fn entries_outside_proc_sys_net_are_dropped() {
        let dir = dir_with(
            "crafted",
            r#"{"net/ipv4/conf/hm-natin/rp_filter": "2", "../../../etc/passwd": "x", "/etc/shadow": "y", "kernel/core_pattern": "|/tmp/x"}"#,
        );
        let (o, notes) = SysctlOriginals::load(&dir).unwrap();
        assert_eq!(o.values().keys().collect::<Vec<_>>(), ["net/ipv4/conf/hm-natin/rp_filter"]);
        assert_eq!(notes.len(), 3, "{notes:?}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_truncated_file_is_moved_aside() {
        let dir = dir_with("truncated", r#"{"net/ipv4/conf/hm-natin/rp_fi"#);
        let (o, notes) = SysctlOriginals::load(&dir).unwrap();
        assert!(o.values().is_empty());
        assert!(notes[0].contains("is corrupt"), "{notes:?}");
        assert!(dir.join(format!("{FILE_NAME}.corrupt")).exists());
        assert!(!dir.join(FILE_NAME).exists());
        fs::remove_dir_all(&dir).unwrap();
    }
}
