//! `plan(have, want)`: the ordered steps that take the kernel from what is
//! observed to what is desired, without misrouting traffic on the way.
//!
//! Adds go bottom-up: links, sysctls, neighbours, the WireGuard steering
//! (its routes, then its rules, then hm-wg0's program), map entries,
//! programs, and routes last,
//! most specific first — a route only starts steering traffic once
//! everything behind it is ready. Removals go top-down: routes first (most
//! general first), then programs, map entries, the WireGuard steering
//! (rules, then their routes), neighbours, sysctls, and links last.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::model::encryption;
use crate::model::*;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Delete a link that is in the way (wrong kind or peer) or unwanted.
    DeleteLink(String),
    CreateLink(String, LinkSpec),
    /// Set a link's configuration in place (a WireGuard device's key,
    /// port, MTU and peers): nothing on it is lost.
    ConfigureLink(String, LinkSpec),
    SetLinkUp(String),
    /// Set a sysctl; `original` is the value to restore later, recorded
    /// the first time hostmesh changes it.
    SetSysctl {
        path: String,
        value: String,
        original: Option<String>,
    },
    ReplaceNeighbour(NeighKey, NeighSpec),
    PutMapEntry(MapEntryKey, MapValue),
    Attach(Attachment),
    /// Replace `table inet hostmesh` with these rules, in one transaction.
    ReplaceNftTable(BTreeSet<NftRule>),
    ReplaceRoute(RouteKey, RouteSpec),
    DeleteRoute(RouteKey),
    AddRule(RuleSpec),
    DeleteRule(RuleSpec),
    Detach(Attachment),
    DeleteNftTable,
    DeleteMapEntry(MapEntryKey),
    DeleteNeighbour(NeighKey),
    /// Put back a sysctl hostmesh no longer needs, if it still exists and
    /// differs, and forget its original.
    RestoreSysctl {
        path: String,
        original: String,
        current: Option<String>,
    },
}

/// One step of a plan. A cold start at 100,000 services writes 265,000
/// map entries: each is planned as the desired state's entry it writes,
/// borrowed (32 bytes a step, where a step of its own with its owners was
/// 136), and the few other steps are boxed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PlannedStep<'a> {
    /// Write a desired map entry.
    Put(&'a MapEntryKey, &'a Owned<MapValue>),
    /// Delete a map entry no longer desired.
    Delete(MapEntryKey),
    Other(Box<OtherStep>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OtherStep {
    pub step: Step,
    /// Config objects affected if the step fails.
    pub owners: Owners,
    /// The link (a veth by its first name) this step builds, or, for a
    /// route, steers traffic into: a route runs only if every step that
    /// builds its link succeeded (apply's gate).
    pub link: Option<String>,
    /// The step needs hostmesh's BPF programs and maps loaded: programs,
    /// map entries, and links that run programs.
    pub needs_bpf: bool,
}

/// The owners of a step that has none (a removal).
static NO_OWNERS: Owners = Owners::new();

impl PlannedStep<'_> {
    pub(crate) fn step(&self) -> std::borrow::Cow<'_, Step> {
        match self {
            PlannedStep::Put(k, w) => std::borrow::Cow::Owned(Step::PutMapEntry((*k).clone(), w.spec.clone())),
            PlannedStep::Delete(k) => std::borrow::Cow::Owned(Step::DeleteMapEntry(k.clone())),
            PlannedStep::Other(o) => std::borrow::Cow::Borrowed(&o.step),
        }
    }

    pub(crate) fn into_step(self) -> Step {
        match self {
            PlannedStep::Other(o) => o.step,
            other => other.step().into_owned(),
        }
    }

    pub(crate) fn owners(&self) -> &Owners {
        match self {
            PlannedStep::Put(_, w) => &w.owners,
            PlannedStep::Delete(_) => &NO_OWNERS,
            PlannedStep::Other(o) => &o.owners,
        }
    }

    pub(crate) fn link(&self) -> Option<&String> {
        match self {
            PlannedStep::Other(o) => o.link.as_ref(),
            PlannedStep::Put(..) | PlannedStep::Delete(_) => None,
        }
    }

    pub(crate) fn needs_bpf(&self) -> bool {
        match self {
            PlannedStep::Put(..) => true,
            PlannedStep::Delete(_) => false,
            PlannedStep::Other(o) => o.needs_bpf,
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::DeleteLink(n) => write!(f, "delete link {n}"),
            Step::CreateLink(n, LinkSpec::Veth { peer, .. }) => write!(f, "create veth {n} peer {peer}"),
            Step::CreateLink(n, LinkSpec::Vxlan { port, .. }) => write!(f, "create vxlan {n} external dstport {port}"),
            Step::CreateLink(n, LinkSpec::Wireguard(w)) => write!(f, "create wireguard {n} listen-port {}", w.port),
            Step::CreateLink(n, LinkSpec::Foreign { link_kind }) => write!(f, "create {link_kind} link {n}"),
            Step::ConfigureLink(n, LinkSpec::Wireguard(w)) => {
                write!(f, "set wireguard {n} listen-port {} mtu {} ({} peers)", w.port, w.mtu, w.peers.len())
            }
            Step::ConfigureLink(n, _) => write!(f, "set link {n}"),
            Step::SetLinkUp(n) => write!(f, "set link {n} up"),
            Step::SetSysctl { path, value, .. } => write!(f, "set sysctl {} = {value}", path.replace('/', ".")),
            Step::ReplaceNeighbour(k, s) => {
                write!(f, "set neighbour {} lladdr {} dev {}", k.ip, fmt_mac(&s.lladdr), k.dev)
            }
            Step::PutMapEntry(k, _) => write!(f, "update {} entry", k.map.name()),
            Step::Attach(a) => write!(f, "attach {a}"),
            Step::ReplaceRoute(k, RouteSpec::Via { gateway, dev, encap, .. }) => {
                let encap = encap.map(|e| format!(" encap id {} dst {}", e.id, e.dst)).unwrap_or_default();
                write!(f, "set route {} via {gateway} dev {dev}{encap} table {}", k.dst, k.table)
            }
            Step::ReplaceRoute(k, RouteSpec::Local { dev, src }) => {
                write!(f, "set route local {} dev {dev} src {src} table {}", k.dst, k.table)
            }
            Step::ReplaceRoute(k, RouteSpec::Unreachable) => {
                write!(f, "set route unreachable {} table {}", k.dst, k.table)
            }
            Step::ReplaceRoute(k, RouteSpec::Dev { dev, src }) => {
                write!(f, "set route {} dev {dev} src {src} table {}", k.dst, k.table)
            }
            Step::AddRule(r) => write!(f, "add rule {}", fmt_rule(r)),
            Step::DeleteRule(r) => write!(f, "delete rule {}", fmt_rule(r)),
            Step::ReplaceNftTable(rules) => write!(f, "set table inet hostmesh ({} rules)", rules.len()),
            Step::DeleteNftTable => write!(f, "delete table inet hostmesh"),
            Step::DeleteRoute(k) => write!(f, "delete route {} table {}", k.dst, k.table),
            Step::Detach(a) => write!(f, "detach {a}"),
            Step::DeleteMapEntry(k) => write!(f, "delete {} entry", k.map.name()),
            Step::DeleteNeighbour(k) => write!(f, "delete neighbour {} dev {}", k.ip, k.dev),
            Step::RestoreSysctl { path, original, .. } => {
                write!(f, "restore sysctl {} = {original}", path.replace('/', "."))
            }
        }
    }
}

/// As `ip rule` prints it.
fn fmt_rule(r: &RuleSpec) -> String {
    let family = if r.v6 { "-6 " } else { "" };
    format!("{family}priority {} not fwmark {:#x} lookup {}", r.priority, r.not_fwmark, r.table)
}

/// `/proc/sys/net/ipv4/conf/<dev>/...` -> dev
fn sysctl_dev(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("net/ipv4/conf/").or_else(|| path.strip_prefix("net/ipv6/conf/"))?;
    rest.split('/').next()
}

fn link_names(name: &str, spec: &LinkSpec) -> Vec<String> {
    match spec {
        LinkSpec::Veth { peer, .. } => vec![name.to_string(), peer.clone()],
        LinkSpec::Vxlan { .. } | LinkSpec::Wireguard(_) | LinkSpec::Foreign { .. } => vec![name.to_string()],
    }
}

/// The steps from `have` to `want`, in the order that never misroutes:
/// links first (a changed link is recreated and everything on it starts
/// over), then what sits on them and what traffic will be steered to,
/// then the routes that steer it; removals last, top-down.
pub(crate) fn plan<'a>(
    have: &Observed,
    want: &'a Desired,
    sysctl_originals: &BTreeMap<String, String>,
) -> Vec<PlannedStep<'a>> {
    plan_until(have, want, sysctl_originals, &|| false).expect("never gives up")
}

/// `plan`, or `None` as soon as `give_up` says so: it is asked first, and
/// every GIVE_UP_EVERY map entries of the walks (a plan from everything the
/// kernel holds at 100,000 services compares 265,000 entries a side).
pub(crate) fn plan_until<'a>(
    have: &Observed,
    want: &'a Desired,
    sysctl_originals: &BTreeMap<String, String>,
    give_up: &dyn Fn() -> bool,
) -> Option<Vec<PlannedStep<'a>>> {
    // A change that came while the kernel was read goes first.
    if give_up() {
        return None;
    }
    // Sized for the map entries a cold start writes (600,000 at 100,000
    // services): growing by doubling would hold up to twice that.
    let capacity = want.map_entries.len().saturating_sub(have.map_entries.len()) + 64;
    let mut steps = Steps::new(want, capacity);
    let gone = plan_links(&mut steps, have, want);
    plan_additions(&mut steps, have, want, sysctl_originals, &gone, give_up)?;
    plan_removals(&mut steps, have, want, sysctl_originals, give_up)?;
    Some(steps.steps)
}

/// How many map entries the plan walks between two looks at `give_up`.
const GIVE_UP_EVERY: usize = 4096;

/// The plan being built: each step tagged with its link group (a veth's
/// ends are one, named by its first end) and whether it needs the BPF
/// objects loaded.
struct Steps<'a> {
    want: &'a Desired,
    /// Link groups that carry programs: creating one waits for the BPF gate.
    with_programs: BTreeSet<String>,
    steps: Vec<PlannedStep<'a>>,
}

impl<'a> Steps<'a> {
    fn new(want: &'a Desired, capacity: usize) -> Self {
        let mut s = Steps { want, with_programs: BTreeSet::new(), steps: Vec::with_capacity(capacity) };
        s.with_programs = want.attachments.keys().filter_map(|a| a.device()).map(|d| s.group(d)).collect();
        s
    }

    fn group(&self, dev: &str) -> String {
        self.want
            .links
            .iter()
            .find(|(_, w)| matches!(&w.spec, LinkSpec::Veth { peer, .. } if peer == dev))
            .map_or(dev.to_string(), |(n, _)| n.clone())
    }

    fn push(&mut self, step: Step, owners: &Owners) {
        let link = match &step {
            Step::CreateLink(n, _) | Step::ConfigureLink(n, _) | Step::SetLinkUp(n) => Some(self.group(n)),
            Step::Attach(a) => a.device().map(|d| self.group(d)),
            Step::ReplaceRoute(_, spec) => spec.dev().map(|d| self.group(d)),
            _ => None,
        };
        let needs_bpf = match &step {
            Step::Attach(_) | Step::PutMapEntry(..) => true,
            Step::CreateLink(..) | Step::SetLinkUp(_) => link.as_ref().is_some_and(|l| self.with_programs.contains(l)),
            _ => false,
        };
        self.steps.push(PlannedStep::Other(Box::new(OtherStep { step, owners: owners.clone(), link, needs_bpf })))
    }

    fn put(&mut self, k: &'a MapEntryKey, w: &'a Owned<MapValue>) {
        self.steps.push(PlannedStep::Put(k, w));
    }
}

/// Links: which are (re)created or set up. Returns the names of links
/// that are new or recreated: nothing on them survives.
fn plan_links(steps: &mut Steps, have: &Observed, want: &Desired) -> BTreeSet<String> {
    let mut gone: BTreeSet<String> = BTreeSet::new();
    let mut create = Vec::new();
    let mut set_up = Vec::new();
    let mut configure = Vec::new();
    for (name, w) in &want.links {
        match have.links.get(name) {
            Some(h) if h == &w.spec => {}
            Some(h) if same_except_up(h, &w.spec) => set_up.push((name, &w.owners)),
            Some(LinkSpec::Wireguard(_)) if matches!(w.spec, LinkSpec::Wireguard(_)) => configure.push((name, w)),
            Some(h) => {
                steps.push(Step::DeleteLink(name.clone()), &w.owners);
                gone.extend(link_names(name, h));
                gone.extend(link_names(name, &w.spec));
                create.push((name, w));
            }
            None => {
                gone.extend(link_names(name, &w.spec));
                create.push((name, w));
            }
        }
    }
    for (name, w) in create {
        steps.push(Step::CreateLink(name.clone(), w.spec.clone()), &w.owners);
    }
    for (name, w) in configure {
        steps.push(Step::ConfigureLink(name.clone(), w.spec.clone()), &w.owners);
    }
    for (name, owners) in set_up {
        steps.push(Step::SetLinkUp(name.clone()), owners);
    }
    gone
}

/// Everything wanted and not in place, links aside: what sits on links
/// and what traffic is steered to before the routes that steer it.
fn plan_additions<'a>(
    steps: &mut Steps<'a>,
    have: &Observed,
    want: &'a Desired,
    sysctl_originals: &BTreeMap<String, String>,
    gone: &BTreeSet<String>,
    give_up: &dyn Fn() -> bool,
) -> Option<()> {
    let on_gone_link = |dev: &str| gone.contains(dev);
    for (path, w) in &want.sysctls {
        let current = if sysctl_dev(path).is_some_and(on_gone_link) { None } else { have.sysctls.get(path) };
        if current != Some(&w.spec) {
            let original = if sysctl_originals.contains_key(path) { None } else { current.cloned() };
            steps.push(Step::SetSysctl { path: path.clone(), value: w.spec.clone(), original }, &w.owners);
        }
    }
    for (k, w) in &want.neighbours {
        let current = if on_gone_link(&k.dev) { None } else { have.neighbours.get(k) };
        if current != Some(&w.spec) {
            steps.push(Step::ReplaceNeighbour(k.clone(), w.spec.clone()), &w.owners);
        }
    }
    // The steering into WireGuard before any entry or route that sends
    // traffic its way (`model::encryption`): its routes, then its rules.
    let changed = |k: &RouteKey, w: &Owned<RouteSpec>| {
        let current = if w.spec.dev().is_some_and(on_gone_link) { None } else { have.routes.get(k) };
        current != Some(&w.spec)
    };
    for (k, w) in want.routes.iter().filter(|(k, w)| encryption::is_guard_table(k.table) && changed(k, w)) {
        steps.push(Step::ReplaceRoute(k.clone(), w.spec.clone()), &w.owners);
    }
    for (r, w) in want.rules.iter().filter(|(r, _)| !have.rules.contains(*r)) {
        steps.push(Step::AddRule(r.clone()), &w.owners);
    }
    // Programs after the entries they read, but hm-wg0's first: hm_wg_in
    // reads none, and marks what the device receives, which is all an
    // encrypted peer's entry lets hm_tun_in take from that peer.
    let attach = |steps: &mut Steps<'a>, on_wg: bool| {
        for (a, w) in want.attachments.iter().filter(|(a, _)| (a.device() == Some(encryption::WG)) == on_wg) {
            let current = if a.device().is_some_and(on_gone_link) { None } else { have.attachments.get(a) };
            if current != Some(&AttachStatus::Current) {
                steps.push(Step::Attach(a.clone()), &w.owners);
            }
        }
    };
    attach(steps, true);
    plan_map_puts(steps, have, want, give_up)?;
    attach(steps, false);
    // The mesh fallback's rules, before the local routes that bring them
    // traffic.
    let want_nft: BTreeSet<NftRule> = want.nft_rules.keys().cloned().collect();
    let mut nft_owners = Owners::new();
    for rule in want.nft_rules.values() {
        nft_owners.extend_from(&rule.owners);
    }
    if !want_nft.is_empty() && have.nft_table.as_ref() != Some(&want_nft) {
        steps.push(Step::ReplaceNftTable(want_nft), &nft_owners);
    }
    // Routes: most specific first.
    let mut routes: Vec<_> =
        want.routes.iter().filter(|(k, w)| !encryption::is_guard_table(k.table) && changed(k, w)).collect();
    routes.sort_by_key(|(k, _)| std::cmp::Reverse(k.dst.prefix_len()));
    for (k, w) in routes {
        steps.push(Step::ReplaceRoute(k.clone(), w.spec.clone()), &w.owners);
    }
    Some(())
}

/// The map entries to write: those the kernel lacks or has otherwise.
fn plan_map_puts<'a>(
    steps: &mut Steps<'a>,
    have: &Observed,
    want: &'a Desired,
    give_up: &dyn Fn() -> bool,
) -> Option<()> {
    let mut put = |n: usize, k: &'a MapEntryKey, w: &'a Owned<MapValue>| {
        if n % GIVE_UP_EVERY == GIVE_UP_EVERY - 1 && give_up() {
            return None;
        }
        steps.put(k, w);
        Some(())
    };
    let Some(missing) = &have.map_entries_missing else {
        // Both maps are sorted by key: one walk side by side, not a lookup
        // per entry (565,545 entries at 100,000 services).
        let mut kernel = have.map_entries.iter().peekable();
        for (n, (k, w)) in want.map_entries.iter().enumerate() {
            while kernel.next_if(|(h, _)| *h < k).is_some() {}
            let current = kernel.peek().filter(|(h, _)| *h == k).map(|(_, v)| *v);
            if current != Some(&w.spec) {
                put(n, k, w)?;
            }
        }
        return Some(());
    };
    // Read against `want`: what the kernel lacks, and what it has
    // otherwise, in key order.
    let wanted = |k: &MapEntryKey| want.map_entries.get_key_value(k);
    let mut missing = missing.iter().filter_map(wanted).peekable();
    let mut differ = have.map_entries.keys().filter_map(wanted).peekable();
    for n in 0.. {
        let next = match (missing.peek(), differ.peek()) {
            (Some((m, _)), Some((d, _))) if m > d => differ.next(),
            (Some(_), _) => missing.next(),
            (None, _) => differ.next(),
        };
        let Some((k, w)) = next else { break };
        put(n, k, w)?;
    }
    Some(())
}

/// Removals, top-down. Items on links being deleted go with them, but are
/// removed explicitly first so nothing depends on link teardown.
fn plan_removals(
    steps: &mut Steps,
    have: &Observed,
    want: &Desired,
    sysctl_originals: &BTreeMap<String, String>,
    give_up: &dyn Fn() -> bool,
) -> Option<()> {
    let none = Owners::new();
    let stale = |k: &&RouteKey| !want.routes.contains_key(*k);
    let mut stale_routes: Vec<_> =
        have.routes.keys().filter(stale).filter(|k| !encryption::is_guard_table(k.table)).collect();
    stale_routes.sort_by_key(|k| k.dst.prefix_len());
    for k in stale_routes {
        steps.push(Step::DeleteRoute(k.clone()), &none);
    }
    for a in have.attachments.keys().filter(|a| !want.attachments.contains_key(*a)) {
        steps.push(Step::Detach(a.clone()), &none);
    }
    if want.nft_rules.is_empty() && have.nft_table.is_some() {
        steps.push(Step::DeleteNftTable, &none);
    }
    // Reverse order: a service goes before the table and backends it uses.
    // Both sorted: one walk side by side, as for the puts (read against
    // `want`, the kernel's entries are only those that differ).
    let mut wanted = want.map_entries.keys().rev().peekable();
    for (n, k) in have.map_entries.keys().rev().enumerate() {
        if n % GIVE_UP_EVERY == GIVE_UP_EVERY - 1 && give_up() {
            return None;
        }
        let stale = match have.map_entries_missing {
            Some(_) => !want.map_entries.contains_key(k),
            None => {
                while wanted.next_if(|w| *w > k).is_some() {}
                wanted.peek() != Some(&k)
            }
        };
        if stale {
            steps.steps.push(PlannedStep::Delete(k.clone()));
        }
    }
    // The WireGuard steering once nothing sends its way: rules, then
    // their routes.
    for r in have.rules.iter().filter(|r| !want.rules.contains_key(*r)) {
        steps.push(Step::DeleteRule(r.clone()), &none);
    }
    for k in have.routes.keys().filter(stale).filter(|k| encryption::is_guard_table(k.table)) {
        steps.push(Step::DeleteRoute(k.clone()), &none);
    }
    for k in have.neighbours.keys().filter(|k| !want.neighbours.contains_key(*k)) {
        steps.push(Step::DeleteNeighbour(k.clone()), &none);
    }
    for (path, original) in sysctl_originals.iter().filter(|(p, _)| !want.sysctls.contains_key(*p)) {
        let current = have.sysctls.get(path).cloned();
        steps.push(Step::RestoreSysctl { path: path.clone(), original: original.clone(), current }, &none);
    }
    for name in have.links.keys().filter(|n| !want.links.contains_key(*n)) {
        steps.push(Step::DeleteLink(name.clone()), &none);
    }
    Some(())
}

fn same_except_up(have: &LinkSpec, want: &LinkSpec) -> bool {
    match (have, want) {
        (
            LinkSpec::Veth { peer: p1, mac: m1, peer_mac: pm1, .. },
            LinkSpec::Veth { peer: p2, mac: m2, peer_mac: pm2, .. },
        ) => p1 == p2 && m1 == m2 && pm1 == pm2,
        (LinkSpec::Vxlan { port: p1, mac: m1, .. }, LinkSpec::Vxlan { port: p2, mac: m2, .. }) => p1 == p2 && m1 == m2,
        (LinkSpec::Wireguard(h), LinkSpec::Wireguard(w)) => h == &WireguardSpec { up: h.up, ..w.clone() },
        _ => false,
    }
}
