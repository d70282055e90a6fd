//! sd_notify(3) messages to systemd (`Type=notify`). Without
//! NOTIFY_SOCKET (run by hand) every call is a no-op.

use std::time::Duration;

use sd_notify::NotifyState;

pub(crate) struct Notifier {
    enabled: bool,
    /// RELOADING=1 was sent, and the READY=1 that ends it not yet.
    reloading: bool,
    /// The daemon's unit tests: every message, with the generation the
    /// status file showed when it was sent.
    #[cfg(test)]
    recorder: Option<Recorder>,
}

#[cfg(test)]
pub(crate) type Sent = std::sync::Arc<std::sync::Mutex<Vec<(String, Option<u64>)>>>;

#[cfg(test)]
struct Recorder {
    state_dir: std::path::PathBuf,
    sent: Sent,
}

impl Notifier {
    pub(crate) fn from_env() -> Self {
        Notifier {
            enabled: std::env::var_os("NOTIFY_SOCKET").is_some(),
            reloading: false,
            #[cfg(test)]
            recorder: None,
        }
    }

    /// Says nothing (the daemon's unit tests).
    #[cfg(test)]
    pub(crate) fn off() -> Self {
        Notifier { enabled: false, reloading: false, recorder: None }
    }

    /// Says nothing, and records what it would say, each message with the
    /// generation of the status file in `state_dir` at that moment.
    #[cfg(test)]
    pub(crate) fn recording(state_dir: std::path::PathBuf) -> (Self, Sent) {
        let sent = Sent::default();
        let recorder = Some(Recorder { state_dir, sent: sent.clone() });
        (Notifier { enabled: false, reloading: false, recorder }, sent)
    }

    fn send(&self, states: &[NotifyState<'_>]) {
        #[cfg(test)]
        if let Some(r) = &self.recorder {
            let generation = crate::state::Status::read(&r.state_dir).ok().map(|s| s.generation);
            let mut sent = r.sent.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            sent.extend(states.iter().map(|s| (s.to_string(), generation)));
        }
        if self.enabled {
            // Losing a notification must never stop the daemon; systemd
            // notices a missing READY or WATCHDOG on its own.
            let _ = sd_notify::notify(states);
        }
    }

    pub(crate) fn ready(&mut self, status: &str) {
        self.reloading = false;
        self.send(&[NotifyState::Ready, NotifyState::Status(status)]);
    }

    /// Whether the next READY=1 ends a reload (`systemctl reload` waits
    /// for it).
    pub(crate) fn ends_reload(&self) -> bool {
        self.reloading
    }

    pub(crate) fn status(&self, status: &str) {
        self.send(&[NotifyState::Status(status)]);
    }

    /// `RELOADING=1` with the time of the reload, as systemd requires.
    pub(crate) fn reloading(&mut self) {
        self.reloading = true;
        match NotifyState::monotonic_usec_now() {
            Ok(now) => self.send(&[NotifyState::Reloading, now]),
            Err(_) => self.send(&[NotifyState::Reloading]),
        }
    }

    pub(crate) fn stopping(&self) {
        self.send(&[NotifyState::Stopping, NotifyState::Status("stopping; kernel state stays in place")]);
    }

    pub(crate) fn watchdog(&self) {
        self.send(&[NotifyState::Watchdog]);
    }

    /// How often to send WATCHDOG=1: half of WATCHDOG_USEC, when set for us.
    pub(crate) fn watchdog_interval(&self) -> Option<Duration> {
        sd_notify::watchdog_enabled().map(|d| d / 2).filter(|d| !d.is_zero())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ready_after_reloading_ends_the_reload_and_only_that_one() {
        let mut n = Notifier::off();
        assert!(!n.ends_reload(), "a start is no reload");
        n.reloading();
        assert!(n.ends_reload());
        n.status("a failed sync says so, and the reload still waits");
        assert!(n.ends_reload());
        n.ready("done");
        assert!(!n.ends_reload(), "a periodic resync's READY=1 ends nothing");
    }
}
