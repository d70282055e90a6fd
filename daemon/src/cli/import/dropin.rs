//! What an import makes: services as drop-ins (one file each), and what
//! could not be mapped, each with where it was read.

use std::fmt::{self, Write as _};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::config::{show_duration, Protocol};

/// Where something was read: a file (or "-") and a line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Where {
    pub file: String,
    pub line: usize,
}

impl fmt::Display for Where {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

/// An input that is not what the import reads: nothing is imported.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct ParseError {
    pub at: Where,
    pub why: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.at, self.why)
    }
}

/// The longest client-ip affinity hostmesh keeps.
const MAX_AFFINITY: Duration = Duration::from_secs(24 * 3600);

/// IPVS persistence of `secs` as client-ip affinity: at least a second,
/// at most hostmesh's longest (with a note when cut).
pub(super) fn affinity(secs: u64, notes: &mut Vec<String>) -> Duration {
    let t = Duration::from_secs(secs.max(1));
    if t > MAX_AFFINITY {
        notes.push(format!("persistence of {secs} s kept for hostmesh's longest affinity, 24h"));
    }
    t.min(MAX_AFFINITY)
}

/// hostmesh's largest backend weight (config/validate: MAX_WEIGHT).
pub(super) const MAX_WEIGHT: u32 = 1000;

/// One imported service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Imported {
    pub name: String,
    pub vip: IpAddr,
    pub port: u16,
    pub protocol: Protocol,
    /// Address and weight (0: draining).
    pub backends: Vec<(SocketAddr, u32)>,
    /// `affinity = "client-ip"` for this long.
    pub affinity: Option<Duration>,
    pub health: Option<Health>,
    pub from: Where,
    /// Where the import differs from the original, one sentence each.
    pub notes: Vec<String>,
}

/// A service's `health_check`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Health {
    /// "tcp", "http", "udp" or "exec", and that kind's keys (values as
    /// TOML, quoted where strings).
    pub kind: &'static str,
    pub keys: Vec<(&'static str, String)>,
    pub interval: Duration,
    pub timeout: Duration,
    pub rise: u32,
    pub fall: u32,
    /// `initial = "up"` (keepalived's real servers start up unless `alpha`).
    pub initial_up: bool,
}

impl Health {
    fn render(&self) -> String {
        let mut s = format!("{{ kind = \"{}\"", self.kind);
        for (k, v) in &self.keys {
            let _ = write!(s, ", {k} = {v}");
        }
        let _ = write!(
            s,
            ", interval = \"{}\", timeout = \"{}\", rise = {}, fall = {}",
            show_duration(self.interval),
            show_duration(self.timeout),
            self.rise,
            self.fall
        );
        if self.initial_up {
            s.push_str(", initial = \"up\"");
        }
        s + " }"
    }
}

/// `s` as a TOML string (quoted, escaped).
pub(super) fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// How a scheduler of IPVS differs from hostmesh's Maglev with weights.
pub(super) fn scheduler_note(scheduler: &str) -> String {
    match scheduler {
        "rr" | "wrr" => {
            format!("scheduler {scheduler}: hostmesh's Maglev hash spreads connections by weight, not in turn")
        }
        "sh" | "mh" => format!("scheduler {scheduler}: Maglev also hashes each client to a backend, with another hash"),
        other => format!("scheduler {other}: hostmesh balances by Maglev hash with weights, not by connection counts"),
    }
}

/// Something read that has no hostmesh equivalent; the rest still imports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Unmapped {
    pub at: Where,
    pub what: String,
    pub why: String,
}

impl fmt::Display for Unmapped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: not imported: {}: {}", self.at, self.what, self.why)
    }
}

/// What an import read: the services, and what was left out.
#[derive(Debug, Default)]
pub(super) struct Import {
    pub services: Vec<Imported>,
    pub unmapped: Vec<Unmapped>,
}

/// A service name hostmesh accepts (lowercase letters, digits and '-',
/// at most 63): `PREFIX-PROTO-VIP-PORT`, the address's separators as '-'.
pub(super) fn service_name(prefix: &str, protocol: Protocol, vip: IpAddr, port: u16) -> String {
    let addr: String = vip.to_string().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    let name = format!("{prefix}-{protocol}-{addr}-{port}").to_ascii_lowercase();
    name.chars().take(63).collect()
}

/// Weights above hostmesh's largest, scaled down together (keeping their
/// proportions as nearly as whole numbers can, and every non-zero weight
/// at least 1); a note says so.
pub(super) fn fit_weights(s: &mut Imported) {
    let top = s.backends.iter().map(|b| b.1).max().unwrap_or(0);
    if top <= MAX_WEIGHT {
        return;
    }
    for b in &mut s.backends {
        if b.1 > 0 {
            b.1 = ((b.1 as u64 * MAX_WEIGHT as u64).div_ceil(top as u64) as u32).max(1);
        }
    }
    s.notes.push(format!("weights scaled to hostmesh's largest, {MAX_WEIGHT} (the largest was {top})"));
}

impl Imported {
    /// The drop-in: a comment saying where it came from and how it
    /// differs, then the service.
    pub(super) fn render(&self, tool: &str) -> String {
        let mut s = format!("# Imported by `hostmesh import {tool}` from {}.\n", self.from);
        for n in &self.notes {
            let _ = writeln!(s, "# Note: {n}");
        }
        let _ = writeln!(s, "[[service]]\nname = \"{}\"\nvip = \"{}\"\nport = {}", self.name, self.vip, self.port);
        if self.protocol == Protocol::Udp {
            s.push_str("protocol = \"udp\"\n");
        }
        let backends: Vec<String> = self
            .backends
            .iter()
            .map(|(a, w)| match w {
                1 => format!("\"{a}\""),
                w => format!("{{ address = \"{a}\", weight = {w} }}"),
            })
            .collect();
        let _ = writeln!(s, "backends = [{}]", backends.join(", "));
        if let Some(t) = self.affinity {
            let _ = writeln!(s, "affinity = \"client-ip\"\naffinity_timeout = \"{}\"", show_duration(t));
        }
        if let Some(h) = &self.health {
            let _ = writeln!(s, "health_check = {}", h.render());
        }
        s
    }
}
