//! Where hostmesh keeps things. Flags with production defaults, so tests
//! run several daemons side by side.

use std::path::PathBuf;

pub(crate) const DEFAULT_CONFIG_DIR: &str = "/etc/hostmesh";
/// Runtime drop-ins (tools' until the next boot): beside the state dir,
/// not in it, so that state and configuration never mix.
pub(crate) const DEFAULT_RUNTIME_CONFIG_DIR: &str = "/run/hostmesh.d";
/// The vendor's (packages') drop-ins.
pub(crate) const DEFAULT_VENDOR_CONFIG_DIR: &str = "/usr/lib/hostmesh";
pub(crate) const DEFAULT_STATE_DIR: &str = "/run/hostmesh";
pub(crate) const DEFAULT_BPFFS: &str = "/sys/fs/bpf/hostmesh";

#[derive(Debug, Clone)]
pub(crate) struct Paths {
    pub config: crate::config::ConfigDirs,
    pub state_dir: PathBuf,
    pub bpffs: PathBuf,
}

impl Default for Paths {
    fn default() -> Self {
        Paths {
            config: crate::config::ConfigDirs::new(
                DEFAULT_CONFIG_DIR.into(),
                DEFAULT_RUNTIME_CONFIG_DIR.into(),
                DEFAULT_VENDOR_CONFIG_DIR.into(),
            ),
            state_dir: DEFAULT_STATE_DIR.into(),
            bpffs: DEFAULT_BPFFS.into(),
        }
    }
}
