//! Turns a sync's results into the status file and systemd's one-line
//! STATUS=.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::config::{Config, ConfigError, CtlbMode, FileState, Loaded, Protocol};
use crate::model::{Hook, MeshPath, Program};
use crate::reconcile::{StepError, SyncOutcome};
use crate::sidecars::{self, Registration};
use crate::state::*;

pub fn now_unix() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn entry(e: &ConfigError) -> ErrorEntry {
    ErrorEntry { line: e.line, column: e.column, key: e.key.clone(), message: e.message.clone(), text: e.to_string() }
}

pub fn files(loaded: &Loaded) -> Vec<FileStatus> {
    loaded
        .files
        .iter()
        .map(|f| FileStatus {
            path: f.path.clone(),
            state: match f.state {
                FileState::Applied => "applied",
                FileState::RejectedKeepingLastGood => "rejected_keeping_last_good",
                FileState::Rejected => "rejected",
            }
            .to_string(),
            errors: f.errors.iter().map(entry).collect(),
        })
        .collect()
}

fn errors_for(errors: &[StepError], owners: &[String]) -> Vec<String> {
    errors
        .iter()
        .filter(|e| owners.iter().any(|o| e.owners.contains(o)))
        .map(|e| format!("{}: {}", e.step, e.error))
        .collect()
}

fn object(kind: &str, name: &str, origin: Option<String>, detail: String, errors: Vec<String>) -> ObjectStatus {
    ObjectStatus {
        kind: kind.into(),
        name: name.into(),
        origin,
        state: if errors.is_empty() { "applied" } else { "error" }.into(),
        detail,
        errors,
    }
}

fn not_applied(kind: &str, name: &str, origin: String, detail: String) -> ObjectStatus {
    ObjectStatus {
        kind: kind.into(),
        name: name.into(),
        origin: Some(origin),
        state: "not_applied".into(),
        detail,
        errors: vec![],
    }
}

/// Per-object status: every configured object, plus the shared
/// connect-time programs and bpfnat veth when they are in use.
pub fn objects(
    loaded: &Loaded,
    outcome: &SyncOutcome,
    registrations: &std::collections::BTreeMap<crate::abi::SockKey, Registration>,
) -> Vec<ObjectStatus> {
    let d = &outcome.desired;
    let veth = !d.links.is_empty();
    let mode = loaded.config.daemon.connect_time_lb;
    let cgroups: std::collections::BTreeSet<String> = d
        .attachments
        .keys()
        .filter_map(|a| match &a.hook {
            Hook::Cgroup(p) => Some(p.display().to_string()),
            _ => None,
        })
        .collect();
    let mut out = Vec::new();
    if let Some(cgroup) = cgroups.first() {
        out.push(object(
            "connect-time",
            cgroup,
            None,
            format!(
                "{} programs on cgroup {cgroup} (for {})",
                Program::CONNECT_TIME.len(),
                if mode == CtlbMode::All { "TCP and UDP" } else { "TCP" }
            ),
            errors_for(&outcome.errors, &["services".to_string()]),
        ));
    }
    if veth {
        out.push(object(
            "bpfnat",
            "hm-natin/hm-natout",
            None,
            format!(
                "veth pair, {} VIP routes, {} program(s) attached",
                d.routes.len(),
                d.attachments.len() - Program::CONNECT_TIME.len() * cgroups.len()
            ),
            errors_for(&outcome.errors, &["bpfnat".to_string()]),
        ));
    }
    for s in &loaded.config.services {
        let mut owners = vec![format!("service/{}", s.name), "services".to_string()];
        if veth {
            owners.push("bpfnat".into());
        }
        let path = match (mode, s.protocol) {
            (CtlbMode::All, _) | (CtlbMode::Tcp, Protocol::Tcp) => "connect-time",
            _ => "bpfnat veth",
        };
        let backends: Vec<String> = s
            .backends
            .iter()
            .map(|b| if b.weight == 1 { b.addr.to_string() } else { format!("{} (weight {})", b.addr, b.weight) })
            .collect();
        let vip = match s.vip {
            std::net::IpAddr::V6(v6) => format!("[{v6}]"),
            v4 => v4.to_string(),
        };
        let detail = format!(
            "{vip}:{}/{} -> {} ({path})",
            s.port,
            s.protocol,
            if backends.is_empty() { "no backends".to_string() } else { backends.join(", ") }
        );
        out.push(object("service", &s.name, Some(s.origin.to_string()), detail, errors_for(&outcome.errors, &owners)));
    }
    let how = match &d.mesh_path {
        Some(MeshPath::SkLookup) => "sk_lookup".to_string(),
        Some(MeshPath::Nftables { reason }) => format!("nftables tproxy, because {reason}"),
        None => String::new(),
    };
    for m in &loaded.config.meshes {
        let key = sidecars::wanted(&Config { meshes: vec![m.clone()], ..Config::default() }).into_iter().next();
        let reg = key.as_ref().and_then(|k| registrations.get(k));
        let vip = match m.vip {
            std::net::IpAddr::V6(v6) => format!("[{v6}]"),
            v4 => v4.to_string(),
        };
        let port = if m.port == 0 { "*".to_string() } else { m.port.to_string() };
        let sidecar = match reg {
            Some(Registration { listener: Some(l), .. }) => format!("sidecar {} (pid {}, {})", l.addr, l.pid, l.comm),
            Some(Registration { problem: Some(p), .. }) => p.clone(),
            _ => "sidecar not checked yet".to_string(),
        };
        let errors = errors_for(&outcome.errors, &[format!("mesh/{}", m.name), "mesh".to_string()]);
        let detail = format!("{vip}:{port}/{} -> {sidecar} ({how})", m.protocol);
        let mut o = object("mesh", &m.name, Some(m.origin.to_string()), detail, errors);
        if o.state == "applied" && reg.is_none_or(|r| r.listener.is_none()) {
            o.state = "no_sidecar".into();
        }
        out.push(o);
    }
    if let Some(g) = &loaded.config.gateway {
        out.push(not_applied(
            "gateway",
            "gateway",
            g.origin.to_string(),
            "gateway peers are not implemented in this build".into(),
        ));
    }
    for p in &loaded.config.peers {
        out.push(not_applied(
            "peer",
            &p.name,
            p.origin.to_string(),
            "gateway peers are not implemented in this build".into(),
        ));
    }
    for m in &loaded.config.members {
        out.push(not_applied(
            "member",
            &m.name,
            m.origin.to_string(),
            "gateway peers are not implemented in this build".into(),
        ));
    }
    out
}

pub fn counts(loaded: &Loaded, outcome: Option<&SyncOutcome>) -> Counts {
    let c = &loaded.config;
    let d = outcome.map(|o| &o.desired);
    Counts {
        services: c.services.len(),
        meshes: c.meshes.len(),
        peers: c.peers.len(),
        files: loaded.files.len(),
        rejected_files: loaded.rejected().count(),
        routes: d.map_or(0, |d| d.routes.len()),
        links: d.map_or(0, |d| d.links.len()),
        map_entries: d.map_or(0, |d| d.map_entries.len()),
        programs: d.map_or(0, |d| d.attachments.len()),
    }
}

/// One line for systemd's STATUS=: counts, rejected files, errors.
pub fn status_line(s: &Status) -> String {
    let c = &s.counts;
    let plural = |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    let mut line = format!(
        "{}, {}, {}",
        plural(c.services, "service", "services"),
        plural(c.meshes, "mesh redirect", "mesh redirects"),
        plural(c.peers, "peer", "peers")
    );
    let rejected: Vec<&FileStatus> = s.files.iter().filter(|f| f.state != "applied").collect();
    if let Some(first) = rejected.first() {
        let name = first.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let at = first.errors.first().map(|e| format!(":{}:{}", e.line, e.column)).unwrap_or_default();
        line.push_str(&format!("; {} rejected: {name}{at}", plural(rejected.len(), "file", "files")));
        if rejected.len() > 1 {
            line.push_str(" and others");
        }
    }
    if !s.last_sync.errors.is_empty() {
        line.push_str(&format!("; {} (see hostmesh status)", plural(s.last_sync.errors.len(), "error", "errors")));
    } else if !s.warnings.is_empty() {
        line.push_str(&format!("; {}", plural(s.warnings.len(), "warning", "warnings")));
    }
    line
}
