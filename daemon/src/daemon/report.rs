//! Turns a sync's results into the status file and systemd's one-line
//! STATUS=.

use crate::config::{ConfigError, FileState, Gateway, GatewayRole, Loaded, Peer, TcAttachPref};
use crate::model::Via;
use crate::model::{
    gateway, Desired, Hook, KernelFeatures, MeshPath, Object, Program, RouteKey, RouteSpec, TcAttach, NATIN,
    RT_TABLE_MAIN,
};
use crate::peer_health::{Choice, PeerProbe};
use crate::reconcile::{StepError, SyncOutcome};
use crate::sidecars::{self, Registration};
use crate::state::*;

/// `uname -r`.
pub(crate) fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|r| r.trim().to_string()).unwrap_or_default()
}

/// The kernel section of the status: how TC programs are attached and
/// every feature the probes found missing, with what that changes.
pub(crate) fn kernel(features: &KernelFeatures, tc_attach: TcAttachPref) -> KernelStatus {
    KernelStatus {
        release: kernel_release(),
        tc_attach: TcAttach::choose(tc_attach, features),
        missing: features
            .missing
            .iter()
            .map(|f| MissingFeature {
                feature: *f,
                what: f.what().to_string(),
                since: f.since().to_string(),
                without: f.without().to_string(),
            })
            .collect(),
    }
}

fn entry(e: &ConfigError) -> ErrorEntry {
    ErrorEntry { line: e.line, column: e.column, key: e.key.clone(), message: e.message.clone(), text: e.to_string() }
}

pub(crate) fn files(loaded: &Loaded) -> Vec<FileStatus> {
    loaded
        .files
        .iter()
        .map(|f| FileStatus { path: f.path.clone(), state: f.state, errors: f.errors.iter().map(entry).collect() })
        .collect()
}

/// The most step errors shown per object; the rest are counted.
const ERRORS_PER_OBJECT: usize = 5;

/// Step errors by the config object they are charged to, built once per
/// status: looking an object's errors up costs its own errors, not all of
/// them (30,000 services with 30,000 errors would otherwise compare 10^9
/// pairs at every status write).
pub(super) struct ErrorIndex<'a> {
    errors: &'a [StepError],
    by_owner: std::collections::HashMap<&'a str, Vec<usize>>,
}

impl<'a> ErrorIndex<'a> {
    pub(super) fn new(errors: &'a [StepError]) -> Self {
        let mut by_owner: std::collections::HashMap<&str, Vec<usize>> = std::collections::HashMap::new();
        for (i, e) in errors.iter().enumerate() {
            for o in e.owners.iter() {
                by_owner.entry(o).or_default().push(i);
            }
        }
        ErrorIndex { errors, by_owner }
    }

    /// Whether no error is charged to anyone (a clean sync).
    pub(super) fn is_empty(&self) -> bool {
        self.by_owner.is_empty()
    }

    /// How many errors are charged to any of `owners`; None when none is.
    pub(super) fn count_of(&self, owners: &[Object]) -> Option<usize> {
        let n = self.indices(owners).len();
        (n > 0).then_some(n)
    }

    /// The errors charged to any of `owners`, in plan order, at most
    /// ERRORS_PER_OBJECT of them and then how many more.
    pub(super) fn for_owners(&self, owners: &[Object]) -> Vec<String> {
        step_errors(self.indices(owners).iter().map(|&i| &self.errors[i]), ERRORS_PER_OBJECT)
    }

    /// The errors charged to any of `owners`, by their place in plan order.
    fn indices(&self, owners: &[Object]) -> Vec<usize> {
        let mut idx: Vec<usize> =
            owners.iter().filter_map(|o| self.by_owner.get(o.to_string().as_str())).flatten().copied().collect();
        idx.sort_unstable();
        idx.dedup();
        idx
    }
}

/// "step: error" for at most `max` step errors, then "and N more"; the
/// error alone when it names its step already (a kernel call's error
/// says what it was doing: "bpf: attach hm_connect4 on cgroup …").
pub(crate) fn step_errors<'a>(errors: impl ExactSizeIterator<Item = &'a StepError>, max: usize) -> Vec<String> {
    let total = errors.len();
    let mut out: Vec<String> = errors
        .take(max)
        .map(|e| if e.error.contains(e.step.as_str()) { e.error.clone() } else { format!("{}: {}", e.step, e.error) })
        .collect();
    if total > max {
        out.push(format!("and {} more", total - max));
    }
    out
}

pub(super) fn object(
    kind: ObjectKind,
    name: &str,
    origin: Option<String>,
    detail: String,
    errors: Vec<String>,
) -> ObjectStatus {
    ObjectStatus {
        kind,
        name: name.into(),
        origin,
        state: if errors.is_empty() { ObjectState::Applied } else { ObjectState::Error },
        detail,
        errors,
        since: None,
        in_use: None,
    }
}

/// Per-object status: every configured object but the services (whose
/// rows `ServiceRows` renders off the sync loop, to go at the index
/// returned), plus the shared connect-time programs and bpfnat veth when
/// they are in use.
pub(crate) fn objects(
    loaded: &Loaded,
    outcome: &SyncOutcome,
    d: &Desired,
    registrations: &std::collections::BTreeMap<crate::abi::SockKey, Registration>,
    health: Option<&dyn PeerProbe>,
) -> (Vec<ObjectStatus>, usize) {
    let index = ErrorIndex::new(&outcome.errors);
    let mut out = shared_objects(d, &index);
    let services_at = out.len();
    out.extend(mesh_objects(loaded, d, registrations, &index));
    if let Some(g) = &loaded.config.gateway {
        out.extend(gateway_objects(loaded, g, d, health, &index));
    }
    (out, services_at)
}

/// The connect-time programs (on their cgroup) and the bpfnat veth, when
/// the desired state has them.
fn shared_objects(d: &Desired, index: &ErrorIndex) -> Vec<ObjectStatus> {
    let mut out = Vec::new();
    let cgroups: std::collections::BTreeSet<String> = d
        .attachments
        .keys()
        .filter_map(|a| match &a.hook {
            Hook::Cgroup(p) => Some(p.display().to_string()),
            _ => None,
        })
        .collect();
    if let Some(cgroup) = cgroups.first() {
        let protocols: Vec<String> = d.connect_time.protocols().map(|p| p.to_string().to_uppercase()).collect();
        let programs = d.attachments.keys().filter(|a| Program::CONNECT_TIME.contains(&a.program)).count();
        out.push(object(
            ObjectKind::ConnectTime,
            cgroup,
            None,
            format!("{programs} programs on cgroup {cgroup} (for {})", protocols.join(" and ")),
            index.for_owners(&[Object::Services]),
        ));
    }
    if d.links.contains_key(NATIN) {
        let programs = d
            .attachments
            .keys()
            .filter(|a| matches!(a.program, Program::NatIn | Program::NatOut | Program::Reply | Program::Direct))
            .count();
        let routes = d.routes.values().filter(|r| r.spec.dev() == Some(NATIN)).count();
        out.push(object(
            ObjectKind::Bpfnat,
            "hm-natin/hm-natout",
            None,
            format!("veth pair, {routes} VIP routes, {programs} program(s) attached"),
            index.for_owners(&[Object::Bpfnat]),
        ));
    }
    out
}

/// An address as it goes before `:port`: IPv6 in brackets.
pub(super) fn bracketed(ip: std::net::IpAddr) -> String {
    match ip {
        std::net::IpAddr::V6(v6) => format!("[{v6}]"),
        v4 => v4.to_string(),
    }
}

fn mesh_objects(
    loaded: &Loaded,
    d: &Desired,
    registrations: &std::collections::BTreeMap<crate::abi::SockKey, Registration>,
    index: &ErrorIndex,
) -> Vec<ObjectStatus> {
    let how = match &d.mesh_path {
        Some(MeshPath::SkLookup) => "sk_lookup".to_string(),
        Some(MeshPath::Nftables { reason }) => format!("nftables tproxy, because {reason}"),
        None => String::new(),
    };
    let mut out = Vec::new();
    for m in &loaded.config.meshes {
        let reg = registrations.get(&sidecars::sock_key(m));
        let port = if m.port == 0 { "*".to_string() } else { m.port.to_string() };
        let sidecar = match reg {
            Some(Registration { listener: Some(l), .. }) => format!("sidecar {} (pid {}, {})", l.addr, l.pid, l.comm),
            Some(Registration { problem: Some(p), .. }) => p.clone(),
            _ => "sidecar not checked yet".to_string(),
        };
        let errors = index.for_owners(&[Object::Mesh(&m.name), Object::Meshes]);
        let detail = format!("{}:{port}/{} -> {sidecar} ({how})", bracketed(m.vip), m.protocol);
        let mut o = object(ObjectKind::Mesh, &m.name, Some(m.origin.to_string()), detail, errors);
        if o.state == ObjectState::Applied && reg.is_none_or(|r| r.listener.is_none()) {
            o.state = ObjectState::NoSidecar;
        }
        out.push(o);
    }
    out
}

/// The tunnel (on a member, with its site's gateways), each peer (on a
/// gateway: every endpoint, which carries traffic and since when) and each
/// member.
fn gateway_objects(
    loaded: &Loaded,
    g: &Gateway,
    d: &Desired,
    health: Option<&dyn PeerProbe>,
    index: &ErrorIndex,
) -> Vec<ObjectStatus> {
    let role = if g.role == GatewayRole::Gateway { "gateway" } else { "member" };
    let lists = health.map(|h| h.report()).unwrap_or_default();
    let gw = match (g.gateway_ips.as_slice(), lists.get(&Via::Site)) {
        ([], _) => String::new(),
        (_, Some(c)) => format!(", gateways {}", gateway_list(c)),
        ([one], None) => format!(", gateway {one}"),
        (many, None) => format!(", gateways {}", many.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")),
    };
    let mut tun = object(
        ObjectKind::Gateway,
        gateway::TUN,
        Some(g.origin.to_string()),
        format!("{role}, VNI {}, UDP port {}, local {}{gw}", g.vni, g.udp_port, g.local_ip),
        index.for_owners(&[Object::Gateway]),
    );
    if let Some(e) = health.and_then(|h| h.error()) {
        tun.errors.push(e);
        tun.state = ObjectState::Error;
    }
    if let Some(c) = lists.get(&Via::Site) {
        tun.since = Some(c.active_since);
        tun.in_use = c.active;
        if c.active.is_none() && tun.state == ObjectState::Applied {
            tun.state = ObjectState::Down;
        }
    }
    let mut out = vec![tun];
    for p in &loaded.config.peers {
        out.push(peer_object(p, g, d, lists.get(&Via::Peer(p.name.clone())), index));
    }
    for m in &loaded.config.members {
        let errors = index.for_owners(&[Object::Member(&m.name), Object::Gateway]);
        let detail = if g.role == GatewayRole::Gateway {
            format!("{} via member {}{}", cidr_list(&m.cidrs), m.endpoint, route_mtus(d, &m.cidrs))
        } else {
            "for gateways; this host is a member: not applied".to_string()
        };
        out.push(object(ObjectKind::Member, &m.name, Some(m.origin.to_string()), detail, errors));
    }
    out
}

/// A peer: how it is reached, and on a gateway whether it answers.
fn peer_object(p: &Peer, g: &Gateway, d: &Desired, health: Option<&Choice>, index: &ErrorIndex) -> ObjectStatus {
    let errors = index.for_owners(&[Object::Peer(&p.name), Object::Gateway]);
    let via = match (g.role, p.endpoints.as_slice(), health) {
        (GatewayRole::Member, _, _) => "via this site's gateway".to_string(),
        (GatewayRole::Gateway, [], _) => "no endpoint: not applied".to_string(),
        (GatewayRole::Gateway, _, Some(c)) => format!("via peer gateways {}", gateway_list(c)),
        (GatewayRole::Gateway, eps, None) => {
            format!("via peer gateway {}", eps.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))
        }
    };
    let encrypted = if p.encrypted() { ", encrypted (WireGuard)" } else { "" };
    let detail = format!("{} {via}{}{encrypted}", cidr_list(&p.cidrs), route_mtus(d, &p.cidrs));
    let mut o = object(ObjectKind::Peer, &p.name, Some(p.origin.to_string()), detail, errors);
    if let Some(why) = d.refused_peers.get(&p.name) {
        o.state = ObjectState::Refused;
        o.detail = format!("{}: encrypted (WireGuard) but {why}: not applied, routes unreachable", cidr_list(&p.cidrs));
        return o;
    }
    if let Some(c) = health {
        o.since = Some(c.active_since);
        o.in_use = c.active;
        if o.state == ObjectState::Applied {
            o.state = if c.active.is_some() { ObjectState::Up } else { ObjectState::Down };
        }
        if c.active.is_none() {
            o.detail = format!("{} via peer gateways {}: routes unreachable", cidr_list(&p.cidrs), gateway_list(c));
        }
    }
    o
}

/// A list of gateways as probes judge them: each one's state, and which
/// carries traffic ("198.51.100.7 in use, 198.51.100.8 down: 3 probes
/// unanswered").
fn gateway_list(c: &Choice) -> String {
    c.targets
        .iter()
        .map(|t| match (c.active == Some(t.addr), t.up) {
            (true, _) => format!("{} in use", t.addr),
            (false, true) => format!("{} up", t.addr),
            (false, false) => format!("{} down: {} probes unanswered", t.addr, t.missed),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn cidr_list(cidrs: &[ipnet::IpNet]) -> String {
    cidrs.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

/// ", route MTU 1450" (or "1450/1430"), from the routes to `cidrs`.
fn route_mtus(d: &Desired, cidrs: &[ipnet::IpNet]) -> String {
    let mtus: std::collections::BTreeSet<u32> = cidrs
        .iter()
        .filter_map(|c| match d.routes.get(&RouteKey { table: RT_TABLE_MAIN, dst: *c }).map(|w| &w.spec) {
            Some(RouteSpec::Via { mtu: Some(m), .. }) => Some(*m),
            _ => None,
        })
        .collect();
    let list: Vec<String> = mtus.iter().map(u32::to_string).collect();
    if list.is_empty() {
        String::new()
    } else {
        format!(", route MTU {}", list.join("/"))
    }
}

pub(crate) fn counts(
    loaded: &Loaded,
    d: Option<&Desired>,
    health: Option<&dyn PeerProbe>,
    sweep: &crate::backends::Sweep,
) -> Counts {
    let c = &loaded.config;
    Counts {
        services: c.services.len(),
        meshes: c.meshes.len(),
        peers: c.peers.len(),
        peers_down: health.map_or(0, |h| h.down().len()),
        files: loaded.files.len(),
        rejected_files: loaded.rejected().count(),
        routes: d.map_or(0, |d| d.routes.len()),
        links: d.map_or(0, |d| d.links.len()),
        map_entries: d.map_or(0, |d| d.map_entries.len()),
        programs: d.map_or(0, |d| d.attachments.len()),
        conntrack_open: sweep.open,
        conntrack_closed: sweep.closed,
        conntrack_capacity: sweep.capacity,
        conntrack_external: sweep.external,
        snat_ports: sweep.snat_ports,
        // Set by the caller, which has the backends' states.
        backends_down: 0,
    }
}

/// One line for systemd's STATUS=: counts, rejected files, errors.
pub(crate) fn status_line(s: &Status) -> String {
    let c = &s.counts;
    let plural = |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    let mut line = format!(
        "{}, {}, {}",
        plural(c.services, "service", "services"),
        plural(c.meshes, "mesh redirect", "mesh redirects"),
        plural(c.peers, "peer", "peers")
    );
    if c.peers_down > 0 {
        // Which peers, and since when: systemctl status shows this line.
        let down: Vec<String> = s
            .objects
            .iter()
            .filter(|o| o.kind == ObjectKind::Peer && o.state == ObjectState::Down)
            .map(|o| match o.since {
                Some(t) => format!("{} since {}", o.name, utc(t)),
                None => o.name.clone(),
            })
            .collect();
        let more = if down.len() > 3 { ", and others" } else { "" };
        line.push_str(&format!(" ({} down: {}{more})", c.peers_down, down[..down.len().min(3)].join(", ")));
    }
    if c.backends_down > 0 {
        let down: Vec<String> = s
            .backends
            .iter()
            .filter(|b| b.state == crate::state::BackendState::Down)
            .take(3)
            .map(|b| format!("{} of {}", b.address, b.service))
            .collect();
        let more = if c.backends_down > 3 { ", and others" } else { "" };
        line.push_str(&format!("; {} down: {}{more}", plural(c.backends_down, "backend", "backends"), down.join(", ")));
    }
    let rejected: Vec<&FileStatus> = s.files.iter().filter(|f| f.state != FileState::Applied).collect();
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

/// Unix seconds as "2026-11-30 09:31:02 UTC" (days to civil date after
/// Howard Hinnant's algorithm).
fn utc(secs: u64) -> String {
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_s_error_that_names_the_step_is_shown_once() {
        let error =
            |step: &str, error: &str| StepError { step: step.into(), owners: ["services"].into(), error: error.into() };
        let errors = [
            error(
                "attach hm_connect4 on cgroup /x",
                "bpf: attach hm_connect4 on cgroup /x: /x is not a cgroup v2 directory",
            ),
            error("update HM_SERVICES entry", "Argument list too long"),
            error("add route 10.96.0.10/32", "File exists"),
        ];
        assert_eq!(
            step_errors(errors.iter(), 2),
            [
                "bpf: attach hm_connect4 on cgroup /x: /x is not a cgroup v2 directory",
                "update HM_SERVICES entry: Argument list too long",
                "and 1 more"
            ]
        );
    }

    #[test]
    fn utc_formats_unix_seconds() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_796_031_062), "2026-11-30 09:31:02 UTC");
    }
}
