//! Everything that can wake the sync loop arrives as an `Event` on one
//! channel: file changes from inotify, and signals. Events only trigger a
//! sync; the loop does all the work.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{SendError, Sender};
use std::sync::Arc;
use std::thread;

use notify::{RecursiveMode, Watcher};

use crate::config::{ConfigDirs, DirRole};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    /// Something changed in the config dir.
    ConfigChanged,
    /// SIGHUP: reload now.
    Reload,
    /// SIGTERM or SIGINT.
    Stop,
    /// A peer gateway went down or came back.
    PeersChanged,
    /// A checked backend went down or came back.
    BackendsChanged,
    /// The watcher failed; periodic resync still picks changes up.
    WatchError(String),
    /// The kernel announced a change to links, routes or neighbours.
    Kernel(crate::backends::netlink::monitor::KernelChange),
}

impl Event {
    /// The event asks for a sync that a resync in progress gives way to
    /// (an edit, a peer or a backend that changed).
    fn asks_for_sync(&self) -> bool {
        matches!(self, Event::ConfigChanged | Event::PeersChanged | Event::BackendsChanged)
    }
}

/// The loop's channel as the threads that wake it hold it. An event that
/// asks for a sync also raises `waiting`, which a resync in progress
/// checks to give way (`Reconciler::with_waiting_flag`), and which the
/// loop lowers each time it looks at the channel.
#[derive(Clone)]
pub(crate) struct EventSender {
    tx: Sender<Event>,
    waiting: Arc<AtomicBool>,
}

impl EventSender {
    pub(crate) fn new(tx: Sender<Event>) -> Self {
        EventSender { tx, waiting: Arc::default() }
    }

    pub(crate) fn send(&self, event: Event) -> Result<(), SendError<Event>> {
        if event.asks_for_sync() {
            self.waiting.store(true, Ordering::Relaxed);
        }
        self.tx.send(event)
    }

    /// Raised while an event that asks for a sync waits for the loop.
    pub(crate) fn waiting(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.waiting)
    }

    /// The loop is about to look at the channel: what waits, it sees.
    pub(super) fn looking(&self) {
        self.waiting.store(false, Ordering::Relaxed);
    }
}

/// Signals become events; SIGTERM and SIGINT also raise `stopping`, which
/// a sync in progress checks between steps, so a stop never waits for a
/// long sync to end.
pub(super) fn spawn_signal_thread(tx: EventSender, stopping: Arc<AtomicBool>) -> std::io::Result<()> {
    let mut signals = Signals::new([SIGHUP, SIGTERM, SIGINT])?;
    thread::Builder::new().name("signals".into()).spawn(move || {
        for sig in signals.forever() {
            if sig != SIGHUP {
                stopping.store(true, Ordering::Relaxed);
            }
            let event = if sig == SIGHUP { Event::Reload } else { Event::Stop };
            if tx.send(event).is_err() {
                return;
            }
        }
    })?;
    Ok(())
}

/// Whether a file event says a file is there to read as it will stay: its
/// writer closed it (IN_CLOSE_WRITE), or it was renamed into place,
/// created (a link), removed or had its mode changed; never at each
/// write, so a sync never sees a file half-written. (The config dirs'
/// watch, and the private key's, `key_watch`.)
pub(super) fn file_settled(kind: &notify::EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode, EventKind, ModifyKind};
    matches!(
        kind,
        EventKind::Access(AccessKind::Close(AccessMode::Write))
            | EventKind::Create(_)
            | EventKind::Remove(_)
            | EventKind::Modify(ModifyKind::Name(_) | ModifyKind::Metadata(_))
    )
}

/// Watches the config dirs that exist (not recursively: drop-ins live at
/// their tops); a runtime or vendor dir made later is read at the next
/// resync or SIGHUP. The returned watcher must be kept alive.
pub(super) fn watch_config_dirs(dirs: &ConfigDirs, tx: EventSender) -> notify::Result<notify::RecommendedWatcher> {
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        let event = match res {
            Ok(e) if file_settled(&e.kind) => Event::ConfigChanged,
            Ok(_) => return,
            Err(e) => Event::WatchError(e.to_string()),
        };
        let _ = tx.send(event);
    })?;
    for (role, dir) in dirs.in_order() {
        match watcher.watch(dir, RecursiveMode::NonRecursive) {
            Ok(()) => {}
            // A runtime or vendor dir that does not exist holds nothing.
            Err(_) if role != DirRole::Admin && !dir.exists() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(watcher)
}
