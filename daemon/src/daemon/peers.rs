//! Peer probing, the daemon's part: it starts the prober a gateway's
//! configuration asks for (and restarts it when that changes), hands the
//! reconciler the peers that are down, and logs and counts every change
//! of a peer's state exactly once, against what it last told — never
//! against what the last sync applied, which a burst of events can skip.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::mpsc::Sender;

use slog::{info, warn, Logger};

use super::Event;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::peer_health::{PeerProbe, PeerProber, Settings};

pub(super) struct PeerProbing {
    prober: Box<dyn PeerProber>,
    running: Option<(Settings, Box<dyn PeerProbe>)>,
    /// Each peer's state (up) as last logged; peers start up.
    told: BTreeMap<String, bool>,
}

impl PeerProbing {
    pub(super) fn new(prober: Box<dyn PeerProber>) -> Self {
        PeerProbing { prober, running: None, told: BTreeMap::new() }
    }

    /// The running prober, if the configuration asks for one.
    pub(super) fn probe(&self) -> Option<&dyn PeerProbe> {
        self.running.as_ref().map(|(_, p)| p.as_ref())
    }

    /// The peers that are down now.
    pub(super) fn down(&self) -> BTreeSet<String> {
        self.probe().map(|p| p.down()).unwrap_or_default()
    }

    /// (Re)starts the prober when what it should probe changed; a change
    /// of peers is announced on `events`.
    pub(super) fn track(&mut self, config: &Config, events: &Sender<Event>, log: &Logger) {
        let want = Settings::from_config(config);
        if self.running.as_ref().map(|(s, _)| s) == want.as_ref() {
            return;
        }
        // Dropping the old prober joins its thread before the new one
        // binds the probe port.
        self.running = None;
        self.told.clear();
        if let Some(settings) = want {
            info!(log, "probing peer gateways"; "peers" => settings.peers.len(), "port" => settings.port,
                "interval_ms" => settings.interval.as_millis() as u64, "loss" => settings.loss);
            let events = events.clone();
            let probe = self.prober.start(settings.clone(), Box::new(move || events.send(Event::PeersChanged).is_ok()));
            self.running = Some((settings, probe));
        }
    }

    /// Logs each peer whose state changed since the last call and counts
    /// the transition; returns how many changed.
    pub(super) fn take_changes(&mut self, log: &Logger, metrics: &Metrics) -> usize {
        let Some(report) = self.probe().map(|p| p.report()) else { return 0 };
        let mut changed = 0;
        for (name, p) in report {
            let was_up = self.told.insert(name.clone(), p.up).unwrap_or(true);
            metrics.peer_state(&name, p.up);
            if was_up == p.up {
                continue;
            }
            changed += 1;
            if p.up {
                info!(log, "peer gateway up; routes to its sites restored"; "peer" => name, "endpoint" => p.endpoint.to_string());
            } else {
                warn!(log, "peer gateway down; routes to its sites are unreachable until it answers";
                    "peer" => name, "endpoint" => p.endpoint.to_string(), "missed_probes" => p.missed);
            }
        }
        changed
    }
}
