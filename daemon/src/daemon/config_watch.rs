//! Config watching, the daemon's part: reads the config dir (every file
//! for a full sync, the changed ones otherwise), keeps the configuration
//! in force when the dir cannot be read, and logs each rejected file's
//! errors. (inotify itself is `events::watch_config_dir`.)

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use slog::{error, warn, Logger};

use crate::config::{Config, ConfigStore, FileState, Loaded};
use crate::metrics::Metrics;

pub(super) struct ConfigWatch {
    dir: PathBuf,
    store: ConfigStore,
    /// The configuration in force and the files it came from.
    pub(super) loaded: Loaded,
    /// How long the last read took.
    pub(super) load_time: Duration,
}

impl ConfigWatch {
    pub(super) fn new(dir: PathBuf) -> Self {
        ConfigWatch {
            dir,
            store: ConfigStore::new(),
            loaded: Loaded { config: Default::default(), files: vec![], skipped: vec![], parsed_files: 0 },
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
        let loaded = if full { self.store.load(&self.dir) } else { self.store.load_changed(&self.dir) };
        match loaded {
            Ok(loaded) => {
                self.loaded = loaded;
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
