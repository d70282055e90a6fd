//! Gateway probing, the daemon's part: it starts the prober the
//! configuration asks for (and restarts it when that changes, resuming
//! every list it probes again), hands the reconciler the gateway each list
//! uses, saves the probes' judgements in the state dir so a restarted
//! daemon resumes them, and logs and counts every change exactly once,
//! against what it last told — never against what the last sync applied,
//! which a burst of events can skip.

use std::collections::BTreeMap;
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use slog::{info, warn, Logger};

use super::Event;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::model::Via;
use crate::peer_health::{Choice, PeerProbe, PeerProber, Settings};

/// The probes' judgements, in the state dir.
pub(crate) const SAVED_FILE: &str = "gateway-probes.json";
/// A file larger than this is not read (it is not one hostmesh wrote).
const MAX_SAVED_BYTES: u64 = 16 << 20;

#[derive(Serialize, Deserialize)]
struct Saved {
    lists: Vec<(Via, Choice)>,
}

pub(super) struct PeerProbing {
    prober: Box<dyn PeerProber>,
    running: Option<(Settings, Box<dyn PeerProbe>)>,
    /// Each list's state as last logged.
    told: BTreeMap<Via, Choice>,
    /// What was saved last.
    saved: BTreeMap<Via, Choice>,
    state_dir: PathBuf,
}

impl PeerProbing {
    pub(super) fn new(prober: Box<dyn PeerProber>, state_dir: &Path) -> Self {
        PeerProbing {
            prober,
            running: None,
            told: BTreeMap::new(),
            saved: BTreeMap::new(),
            state_dir: state_dir.to_path_buf(),
        }
    }

    /// The running prober, if the configuration asks for one.
    pub(super) fn probe(&self) -> Option<&dyn PeerProbe> {
        self.running.as_ref().map(|(_, p)| p.as_ref())
    }

    /// The gateway each probed list uses now.
    pub(super) fn chosen(&self) -> BTreeMap<Via, Option<IpAddr>> {
        self.probe().map(|p| p.chosen()).unwrap_or_default()
    }

    /// (Re)starts the prober when what it should probe changed; a change
    /// is announced on `events`. A new prober resumes the lists the old
    /// one judged (or, at the start, the ones saved by the last run).
    pub(super) fn track(&mut self, config: &Config, events: &super::events::EventSender, log: &Logger) {
        let want = Settings::from_config(config);
        if self.running.as_ref().map(|(s, _)| s) == want.as_ref() {
            return;
        }
        let resume = match self.running.take() {
            Some((_, probe)) => probe.report(),
            None => load(&self.state_dir).unwrap_or_else(|e| {
                warn!(log, "saved gateway probes not read; probing afresh"; "error" => e.to_string());
                BTreeMap::new()
            }),
        };
        // (Dropping the old prober joined its thread before the new one
        // binds the probe port.)
        if let Some(settings) = want {
            info!(log, "probing gateways"; "lists" => settings.lists.len(), "targets" => settings.targets().len(),
                "interval_ms" => settings.interval.as_millis() as u64, "loss" => settings.rules.loss,
                "rise" => settings.rules.rise, "preempt" => settings.rules.preempt);
            let events = events.clone();
            let probe =
                self.prober.start(settings.clone(), resume, Box::new(move || events.send(Event::PeersChanged).is_ok()));
            // What it resumed is what was told: only changes are logged.
            self.told = probe.report();
            self.running = Some((settings, probe));
        } else {
            self.told.clear();
        }
    }

    /// Saves the probes' judgements when they changed since the last save.
    pub(super) fn save(&mut self, log: &Logger) {
        let Some(report) = self.probe().map(|p| p.report()) else { return };
        if report == self.saved {
            return;
        }
        let saved = Saved { lists: report.iter().map(|(v, c)| (v.clone(), c.clone())).collect() };
        match crate::state::save_json(&self.state_dir.join(SAVED_FILE), &saved) {
            Ok(()) => self.saved = report,
            Err(e) => warn!(log, "gateway probes not saved; a restart probes afresh"; "error" => e.to_string()),
        }
    }

    /// Logs each gateway whose state changed and each move of traffic since
    /// the last call, and counts them; returns how many lists changed.
    pub(super) fn take_changes(&mut self, log: &Logger, metrics: &Metrics) -> usize {
        let Some(report) = self.probe().map(|p| p.report()) else { return 0 };
        let mut changed = 0;
        for (via, now) in report {
            let before = self.told.get(&via).cloned().unwrap_or_else(|| {
                Choice::new(&now.targets.iter().map(|t| t.addr).collect::<Vec<_>>(), now.active_since)
            });
            if let Via::Peer(name) = &via {
                metrics.peer_state(name, now.active.is_some());
            }
            metrics.gateway_choice(&via, now.active, now.failovers.saturating_sub(before.failovers));
            if before == now {
                continue;
            }
            changed += 1;
            log_changes(log, &via, &before, &now);
            self.told.insert(via, now);
        }
        changed
    }
}

/// Says what changed between two judgements of one list: gateways down or
/// up, and where the traffic went and why.
fn log_changes(log: &Logger, via: &Via, before: &Choice, now: &Choice) {
    let path = via.to_string();
    for t in &now.targets {
        let was_up = before.target(t.addr).is_none_or(|b| b.up);
        if t.up && !was_up {
            info!(log, "gateway answers again"; "path" => &path, "gateway" => t.addr.to_string(),
                "answered_probes" => t.answered);
        } else if !t.up && was_up {
            warn!(log, "gateway down: its probes went unanswered"; "path" => &path, "gateway" => t.addr.to_string(),
                "missed_probes" => t.missed);
        }
    }
    if before.active == now.active {
        return;
    }
    let name = |ip: Option<IpAddr>| ip.map_or_else(|| "none".to_string(), |ip| ip.to_string());
    let why = match (before.active, now.active) {
        (_, None) => "every gateway is down; routes through them are unreachable until one answers".to_string(),
        (None, Some(to)) => format!("{to} answers again"),
        (Some(from), Some(_)) if now.target(from).is_some_and(|t| t.up) => {
            format!("{from} is up but an earlier gateway answers again (preempt)")
        }
        (Some(from), Some(_)) => format!("{from} stopped answering"),
    };
    warn!(log, "traffic moved to another gateway"; "path" => path, "from" => name(before.active),
        "to" => name(now.active), "why" => why, "failovers" => now.failovers);
}

/// The judgements a previous run saved (none if it saved nothing).
fn load(state_dir: &Path) -> io::Result<BTreeMap<Via, Choice>> {
    let saved: Option<Saved> = crate::state::read_saved_json(&state_dir.join(SAVED_FILE), MAX_SAVED_BYTES)?;
    Ok(saved.map(|s| s.lists.into_iter().collect()).unwrap_or_default())
}
