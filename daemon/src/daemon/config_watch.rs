//! Config watching, the daemon's part: reads the config dirs (every file
//! for a full sync, the changed ones otherwise), keeps the configuration
//! in force when the admin's dir cannot be read, and logs each rejected
//! file's errors, and keeps the copies of the files in force that
//! `hostmesh diff` reads (`applied.rs`). (inotify itself is
//! `events::watch_config_dirs`.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use slog::{error, warn, Logger};

use crate::config::{Config, ConfigDirs, ConfigStore, FileState, Loaded};
use crate::metrics::Metrics;

pub(super) struct ConfigWatch {
    dirs: ConfigDirs,
    store: ConfigStore,
    copies: super::applied::AppliedCopies,
    /// The configuration in force and the files it came from.
    pub(super) loaded: Loaded,
    /// How long the last read took.
    pub(super) load_time: Duration,
}

impl ConfigWatch {
    pub(super) fn new(dirs: ConfigDirs, state_dir: &std::path::Path) -> Self {
        ConfigWatch {
            dirs,
            store: ConfigStore::new(),
            copies: super::applied::AppliedCopies::new(state_dir),
            loaded: Loaded {
                config: Default::default(),
                files: vec![],
                skipped: vec![],
                masked: vec![],
                parsed_files: 0,
            },
            load_time: Duration::ZERO,
        }
    }

    /// The configuration in force.
    pub(super) fn config(&self) -> &Arc<Config> {
        &self.loaded.config
    }

    /// Reads the dir (all of it when `full`). A dir that cannot be read
    /// keeps the configuration in force: a vanished dir must not tear
    /// down every service.
    pub(super) fn read(&mut self, full: bool, log: &Logger, metrics: &Metrics) {
        let reading = Instant::now();
        let loaded = if full { self.store.load(&self.dirs) } else { self.store.load_changed(&self.dirs) };
        match loaded {
            Ok(loaded) => {
                self.loaded = loaded;
                for p in self.copies.update(&self.loaded, &self.store) {
                    warn!(log, "hostmesh diff will not see the configuration in force"; "problem" => p);
                }
                metrics.reload(if self.loaded.rejected().next().is_some() { "rejected" } else { "applied" });
            }
            Err(e) => {
                metrics.reload("failed");
                error!(log, "cannot read the config dir; keeping the configuration in force"; "error" => e.to_string());
            }
        }
        for f in self.loaded.rejected() {
            for e in &f.errors {
                warn!(log, "config file rejected"; "file" => f.path.display().to_string(), "line" => e.line,
                    "column" => e.column, "key" => e.key.clone().unwrap_or_default(), "error" => e.message.clone(),
                    "in_force" => if f.state == FileState::Rejected { "nothing" } else { "last good version" });
            }
        }
        self.load_time = reading.elapsed();
    }
}
