//! The WireGuard private key's file, watched like a drop-in: a new key
//! written and renamed into place (or a fixed mode or owner) is read at
//! the sync it wakes, so a rotation applies within the debounce. The dir
//! holding the file is watched (a rename replaces the file itself); only
//! events naming the file wake the loop. A credential
//! (`credential:NAME`) is fixed for the life of the unit: not watched.

use std::path::PathBuf;

use notify::{RecursiveMode, Watcher};
use slog::{warn, Logger};

use super::events::{Event, EventSender};
use crate::config::Config;
use crate::keys::KeySource;

#[derive(Default)]
pub(super) struct KeyWatch {
    /// The file watched, and the watcher of its dir.
    watching: Option<(PathBuf, notify::RecommendedWatcher)>,
}

impl KeyWatch {
    /// Follows the key file `config` names (when a peer is encrypted).
    pub(super) fn track(&mut self, config: &Config, events: &EventSender, log: &Logger) {
        let file =
            config.gateway.as_ref().filter(|_| config.peers.iter().any(|p| p.encrypted())).and_then(|g| {
                match &g.private_key {
                    Some(KeySource::File(path)) => Some(path.clone()),
                    _ => None,
                }
            });
        if self.watching.as_ref().map(|(p, _)| p) == file.as_ref() {
            return;
        }
        self.watching = None;
        let Some(file) = file else { return };
        match watch(&file, events.clone()) {
            Ok(w) => self.watching = Some((file, w)),
            Err(e) => warn!(log, "cannot watch the private key file; a new key applies at the next resync or SIGHUP";
                "file" => file.display().to_string(), "error" => e.to_string()),
        }
    }
}

fn watch(file: &std::path::Path, tx: EventSender) -> notify::Result<notify::RecommendedWatcher> {
    let dir = file.parent().unwrap_or(std::path::Path::new("/")).to_path_buf();
    let name = file.to_path_buf();
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        let Ok(e) = res else { return };
        if super::events::file_settled(&e.kind) && e.paths.contains(&name) {
            let _ = tx.send(Event::ConfigChanged);
        }
    })?;
    watcher.watch(&dir, RecursiveMode::NonRecursive)?;
    Ok(watcher)
}
