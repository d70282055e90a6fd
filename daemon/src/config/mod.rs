//! Configuration: TOML drop-ins in the config dir -> `Config`.
//!
//! `schema` is the file format as written, `validate` checks one file on
//! its own (a large one in the parts `split` finds), `merge` enforces what
//! must be unique across files, `dirs` says which drop-ins of the three
//! config dirs are in force, and `store` reads them and keeps each file's
//! last good version.

mod capacity;
mod dirs;
mod duration;
mod error;
mod file_index;
mod health_check;
mod merge;
mod read;
mod schema;
mod split;
mod store;
mod types;
mod validate;

pub(crate) use capacity::Capacities;
pub use capacity::{Capacity, MapSizes, SizeKey, SIZE_KEYS};
pub(crate) use dirs::{ConfigDirs, DirRole, Masked};
pub(crate) use duration::show_duration;
pub(crate) use error::{clip, ConfigError};
pub(crate) use read::{copy_drop_in, Unread};
pub use store::FileState;
pub(crate) use store::{check_dir, ConfigStore, Loaded};
pub(crate) use types::*;
// What the unit tests of other modules build configurations with.
#[cfg(test)]
pub(crate) use error::Source;
#[cfg(test)]
pub(crate) use validate::parse_file;

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod wireguard_tests;

/// One valid file's text as the whole configuration, for other modules'
/// unit tests.
#[cfg(test)]
pub(crate) fn from_text(text: &str) -> Config {
    let f = parse_file(&Source::new(std::path::Path::new("t.toml"), text)).expect("valid config");
    Config {
        daemon: f.daemon.unwrap_or_default(),
        services: f.services,
        meshes: f.meshes,
        gateway: f.gateway,
        peers: f.peers,
        members: f.members,
    }
}
