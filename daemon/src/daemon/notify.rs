//! sd_notify(3) messages to systemd (`Type=notify`). Without
//! NOTIFY_SOCKET (run by hand) every call is a no-op.

use std::time::Duration;

use sd_notify::NotifyState;

pub(crate) struct Notifier {
    enabled: bool,
}

impl Notifier {
    pub(crate) fn from_env() -> Self {
        Notifier { enabled: std::env::var_os("NOTIFY_SOCKET").is_some() }
    }

    /// Says nothing (the daemon's unit tests).
    #[cfg(test)]
    pub(crate) fn off() -> Self {
        Notifier { enabled: false }
    }

    fn send(&self, states: &[NotifyState<'_>]) {
        if self.enabled {
            // Losing a notification must never stop the daemon; systemd
            // notices a missing READY or WATCHDOG on its own.
            let _ = sd_notify::notify(states);
        }
    }

    pub(crate) fn ready(&self, status: &str) {
        self.send(&[NotifyState::Ready, NotifyState::Status(status)]);
    }

    pub(crate) fn status(&self, status: &str) {
        self.send(&[NotifyState::Status(status)]);
    }

    /// `RELOADING=1` with the time of the reload, as systemd requires.
    pub(crate) fn reloading(&self) {
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
