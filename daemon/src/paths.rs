//! Where hostmesh keeps things. Flags with production defaults, so tests
//! run several daemons side by side.

use std::path::PathBuf;

pub(crate) const DEFAULT_CONFIG_DIR: &str = "/etc/hostmesh";
pub(crate) const DEFAULT_STATE_DIR: &str = "/run/hostmesh";
pub(crate) const DEFAULT_BPFFS: &str = "/sys/fs/bpf/hostmesh";

#[derive(Debug, Clone)]
pub(crate) struct Paths {
    pub config_dir: PathBuf,
    pub state_dir: PathBuf,
    pub bpffs: PathBuf,
}

impl Default for Paths {
    fn default() -> Self {
        Paths {
            config_dir: DEFAULT_CONFIG_DIR.into(),
            state_dir: DEFAULT_STATE_DIR.into(),
            bpffs: DEFAULT_BPFFS.into(),
        }
    }
}
