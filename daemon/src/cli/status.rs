//! `hostmesh status`: what the daemon last applied, read from the state
//! dir, so it works while the daemon is down (and says so).

use std::path::Path;
use std::process::ExitCode;

use crate::clock::now_unix;
use crate::state::{FileState, Status};

/// Exit codes: 0 running and everything applied; 1 something rejected or
/// failed; 3 not running (what is shown is the last state it wrote).
pub(super) fn run(state_dir: &Path, json: bool) -> ExitCode {
    let status = match Status::read(state_dir) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("hostmesh has not run here: no {}", Status::path(state_dir).display());
            return ExitCode::from(3);
        }
        Err(e) => {
            eprintln!("hostmesh status: cannot read {}: {e}", Status::path(state_dir).display());
            return ExitCode::FAILURE;
        }
    };
    let liveness = liveness(&status);
    let wireguard = wireguard_peers();
    if json {
        let mut value = serde_json::to_value(&status).expect("status serialises");
        value["liveness"] = serde_json::Value::String(liveness.label().into());
        if let Some(peers) = &wireguard {
            value["wireguard"] = serde_json::to_value(peers).expect("peers serialise");
        }
        println!("{}", serde_json::to_string_pretty(&value).expect("json"));
    } else {
        print!("{}", render(&status, &liveness));
        if let Some(peers) = &wireguard {
            print!("{}", render_wireguard(peers));
        }
    }
    let problems = !status.last_sync.ok || status.files.iter().any(|f| f.state != FileState::Applied);
    match liveness {
        Liveness::Running => {
            if problems {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Liveness::Stale(_) => ExitCode::FAILURE,
        _ => ExitCode::from(3),
    }
}

/// The peers of `hm-wg0` as the kernel has them now (read live: the
/// handshakes and counters move between syncs); `None` without the device.
fn wireguard_peers() -> Option<Vec<crate::backends::netlink::wireguard::PeerState>> {
    crate::backends::netlink::wireguard::peers(crate::model::encryption::WG).ok()
}

/// `wireguard hm-wg0:` and a line per peer: its endpoint, key, last
/// handshake and bytes.
fn render_wireguard(peers: &[crate::backends::netlink::wireguard::PeerState]) -> String {
    let mut out = format!("wireguard {}: {} peer(s)\n", crate::model::encryption::WG, peers.len());
    for p in peers {
        let endpoint = p.endpoint.map_or("no endpoint".to_string(), |e| e.to_string());
        let key = p.key.map(|k| k.to_string()).unwrap_or_default();
        let handshake = match u64::try_from(p.last_handshake_s) {
            Ok(at) if at > 0 => format!("last handshake {}", ago(at)),
            _ => "no handshake yet".to_string(),
        };
        out.push_str(&format!(
            "  {endpoint}  key {key}  {handshake}, received {} B, sent {} B\n",
            p.rx_bytes, p.tx_bytes
        ));
    }
    out
}

pub(super) enum Liveness {
    Running,
    /// Running but the status has not been updated for this many seconds.
    Stale(u64),
    Stopped,
    Gone,
}

impl Liveness {
    fn label(&self) -> &'static str {
        match self {
            Liveness::Running => "running",
            Liveness::Stale(_) => "stale",
            Liveness::Stopped => "stopped",
            Liveness::Gone => "gone",
        }
    }
}

fn pid_is_hostmesh(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "hostmesh")
}

pub(super) fn liveness(s: &Status) -> Liveness {
    if s.stopped {
        return Liveness::Stopped;
    }
    if !pid_is_hostmesh(s.pid) {
        return Liveness::Gone;
    }
    // The file is rewritten at every resync; allow three missed ones.
    let age = now_unix().saturating_sub(s.updated_at);
    let limit = 3 * s.resync_interval_ms / 1000 + 10;
    if age > limit {
        Liveness::Stale(age)
    } else {
        Liveness::Running
    }
}

/// The pid of a hostmesh daemon that wrote this state dir and still runs.
pub(super) fn running_daemon(state_dir: &Path) -> Option<u32> {
    let s = Status::read(state_dir).ok()?;
    (!s.stopped && pid_is_hostmesh(s.pid)).then_some(s.pid)
}

fn ago(at: u64) -> String {
    let secs = now_unix().saturating_sub(at);
    match secs {
        0..=119 => format!("{secs}s ago"),
        120..=7199 => format!("{}m ago", secs / 60),
        _ => format!("{}h ago", secs / 3600),
    }
}

pub(super) fn render(s: &Status, liveness: &Liveness) -> String {
    let mut out = String::new();
    out.push_str(&format!("hostmesh: {}\n", headline(s, liveness)));
    render_sync(s, &mut out);
    render_files(s, &mut out);
    render_objects(s, &mut out);
    render_backends(s, &mut out);
    let c = &s.counts;
    out.push_str(&format!(
        "kernel: {} link(s), {} route(s), {} map entr{}, {} program(s)\n",
        c.links,
        c.routes,
        c.map_entries,
        if c.map_entries == 1 { "y" } else { "ies" },
        c.programs
    ));
    if c.conntrack_capacity > 0 {
        out.push_str(&format!(
            "conntrack: {} entries of open flows, {} of closed ones, of {} each (two per flow, bpfnat veth path)\n",
            c.conntrack_open, c.conntrack_closed, c.conntrack_capacity
        ));
    }
    if c.conntrack_external > 0 {
        out.push_str(&format!(
            "external flows: {} entries, of {} (two per flow, node ports and external VIPs); {} source ports of snat_port_range in use\n",
            c.conntrack_external, c.conntrack_capacity, c.snat_ports
        ));
    }
    for w in &s.warnings {
        out.push_str(&format!("warning: {w}\n"));
    }
    out
}

fn headline(s: &Status, liveness: &Liveness) -> String {
    match liveness {
        Liveness::Running => format!("running (pid {}){}", s.pid, if s.ready { ", ready" } else { ", starting" }),
        Liveness::Stale(age) => format!("running (pid {}) but its status is stale: last written {age}s ago", s.pid),
        Liveness::Stopped => format!(
            "not running: stopped {}; kernel state stays in place; this is what it last applied",
            ago(s.updated_at)
        ),
        Liveness::Gone => {
            format!("not running: pid {} is gone and did not stop cleanly; this is what it last applied", s.pid)
        }
    }
}

/// The last sync and its errors, and the kernel's missing features.
fn render_sync(s: &Status, out: &mut String) {
    let l = &s.last_sync;
    let kind = if l.full {
        "full"
    } else if l.patched {
        "incremental, changed services only"
    } else {
        "incremental"
    };
    let result = if l.ok { ", ok".to_string() } else { format!(", {} error(s)", l.errors.len()) };
    out.push_str(&format!(
        "last sync: {} (generation {}, {kind}, {} step(s), {} ms){result}\n",
        ago(l.at),
        s.generation,
        l.steps,
        l.duration_ms
    ));
    for e in &l.errors {
        out.push_str(&format!("  error: {e}\n"));
    }
    if let Some(k) = &s.kernel {
        out.push_str(&format!("linux: {}; TC programs attached with {}\n", k.release, k.tc_attach.describe()));
        for m in &k.missing {
            out.push_str(&format!("  missing {} ({}, Linux {}): {}\n", m.feature, m.what, m.since, m.without));
        }
    }
}

/// The config dirs, rejected files with their errors, skipped and masked
/// entries, and the files in force from the runtime and vendor dirs.
fn render_files(s: &Status, out: &mut String) {
    let rejected = s.files.iter().filter(|f| f.state != FileState::Applied).count();
    let dirs = if s.config_dirs.is_empty() {
        s.config_dir.display().to_string()
    } else {
        s.config_dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", then ")
    };
    out.push_str(&format!("config: {dirs} ({} file(s), {} rejected)\n", s.files.len(), rejected));
    let beneath: Vec<_> = s.files.iter().filter(|f| !f.path.starts_with(&s.config_dir)).collect();
    for f in beneath.iter().take(FILES_SHOWN) {
        out.push_str(&format!("  in force {}\n", f.path.display()));
    }
    if beneath.len() > FILES_SHOWN {
        out.push_str(&format!(
            "  and {} more in force from the runtime and vendor dirs\n",
            beneath.len() - FILES_SHOWN
        ));
    }
    for f in s.files.iter().filter(|f| f.state != FileState::Applied) {
        let kept = if f.state == FileState::RejectedKeepingLastGood {
            "its last good version stays in force"
        } else {
            "nothing from it is in force"
        };
        out.push_str(&format!("  rejected {}: {kept}\n", f.path.display()));
        for e in &f.errors {
            out.push_str(&format!("    {}\n", e.text));
        }
    }
    for sk in &s.skipped {
        out.push_str(&format!("  skipped {}: {}\n", sk.path.display(), sk.reason));
    }
    for m in &s.masked {
        let how = if m.by_null { " -> /dev/null" } else { "" };
        out.push_str(&format!("  masked {}: by {}{how}\n", m.path.display(), m.by.display()));
    }
}

/// The most files of the runtime and vendor dirs listed by name.
const FILES_SHOWN: usize = 50;

/// Checked and draining backends, one aligned line each: state, since
/// when, the last check and why the last failure failed.
fn render_backends(s: &Status, out: &mut String) {
    if s.backends.is_empty() {
        return;
    }
    out.push_str(&format!("backends: {} checked or draining, {} down\n", s.backends.len(), s.counts.backends_down));
    let w_service = s.backends.iter().map(|b| b.service.len()).max().unwrap_or(0);
    let w_addr = s.backends.iter().map(|b| b.address.to_string().len()).max().unwrap_or(0);
    for b in &s.backends {
        let since = b.since.map(|at| format!(" since {}", ago(at))).unwrap_or_default();
        let last = match (b.last_check, b.last_passed) {
            (Some(at), Some(true)) => format!("; last check passed {}", ago(at)),
            (Some(at), Some(false)) => format!("; last check failed {}", ago(at)),
            _ => String::new(),
        };
        let reason =
            b.reason.as_deref().filter(|_| b.state != crate::state::BackendState::Up || b.last_passed == Some(false));
        let reason = reason.map(|r| format!(" ({r})")).unwrap_or_default();
        out.push_str(&format!(
            "  {:w_service$}  {:w_addr$}  {:8}{since}{last}{reason}\n",
            b.service,
            b.address.to_string(),
            b.state
        ));
    }
}

/// Every object, one aligned line each, with its errors.
fn render_objects(s: &Status, out: &mut String) {
    if s.objects.is_empty() {
        return;
    }
    out.push_str("objects:\n");
    let w_kind = s.objects.iter().map(|o| o.kind.to_string().len()).max().unwrap_or(0);
    let w_name = s.objects.iter().map(|o| o.name.len()).max().unwrap_or(0);
    for o in &s.objects {
        let origin = o.origin.as_deref().map(|x| format!("  [{x}]")).unwrap_or_default();
        let since = o.since.map(|at| format!(" (since {})", ago(at))).unwrap_or_default();
        out.push_str(&format!(
            "  {:w_kind$}  {:w_name$}  {:11}  {}{since}{origin}\n",
            o.kind, o.name, o.state, o.detail
        ));
        for e in &o.errors {
            out.push_str(&format!("      error: {e}\n"));
        }
    }
}
