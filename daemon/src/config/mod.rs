//! Configuration: TOML drop-ins in the config dir -> `Config`.
//!
//! `schema` is the file format as written, `validate` checks one file on
//! its own (a large one in the parts `split` finds), `merge` enforces what
//! must be unique across files, and `store` reads the dir and keeps each
//! file's last good version.

mod capacity;
mod duration;
mod error;
mod merge;
mod read;
mod schema;
mod split;
mod store;
mod types;
mod validate;

pub use capacity::{Capacity, MapSizes, SizeKey, SIZE_KEYS};
pub use duration::{format_duration, parse_duration};
pub use error::{clip, ConfigError, Origin, Source, QUOTE_MAX};
pub use store::{
    check_dir, list_drop_ins, ConfigStore, DirError, FileReport, FileState, Loaded, Skipped, ERRORS_PER_FILE,
};
pub use types::*;
pub use validate::{is_object_name, is_unicast, parse_file};

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod tests;

/// One valid file's text as the whole configuration, for other modules'
/// unit tests.
#[cfg(test)]
pub fn from_text(text: &str) -> Config {
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
