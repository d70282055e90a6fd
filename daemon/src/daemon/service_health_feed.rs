//! The service health endpoint, the daemon's part: it follows `[daemon]
//! service_health_listen`, and after every completed sync it is told how
//! many backends of each external_policy = "local" service serve here.

use slog::Logger;

use crate::config::Config;
use crate::http_endpoint::Listening;
use crate::model::Desired;
use crate::service_health::ServiceHealth;

#[derive(Default)]
pub(super) struct ServiceHealthFeed {
    health: ServiceHealth,
    /// The endpoint, following `[daemon] service_health_listen`.
    pub(super) listening: Listening,
}

impl ServiceHealthFeed {
    /// (Re)starts the endpoint when `[daemon] service_health_listen` changed.
    pub(super) fn track_server(&mut self, config: &Config, log: &Logger) {
        self.listening.follow(config.daemon.service_health_listen, log, |addr| self.health.serve(addr));
    }

    /// The counts of a sync that completed (a failed one's may not be in
    /// the kernel: the last stand).
    pub(super) fn publish(&self, applied: Option<&Desired>) {
        if let Some(d) = applied {
            self.health.publish(&d.local_backends);
        }
    }
}
