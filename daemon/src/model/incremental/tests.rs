//! The incremental compile against the full one: same `Desired`, same
//! plan, and work only for what changed.

use std::path::PathBuf;

use proptest::prelude::*;

use super::*;
use crate::model::{compile, KernelFeatures};
use crate::reconcile::plan;

fn facts() -> HostFacts {
    HostFacts {
        interfaces: ["lo", "eth0"].map(String::from).into(),
        default_route_interfaces: vec!["eth0".into()],
        netns_cookie: 7,
        cgroup2_root: Some(PathBuf::from("/sys/fs/cgroup")),
        features: KernelFeatures::complete(),
        ..Default::default()
    }
}

/// One service as the fuzzer makes it: a name, a VIP and port from small
/// ranges (so edits collide with other services' keys and backends), its
/// backends, and maybe its own table size.
#[derive(Debug, Clone)]
struct Svc {
    name: u8,
    vip: u8,
    v6: bool,
    port: u16,
    udp: bool,
    backends: Vec<(u8, u32)>,
    table: Option<u32>,
}

fn svc() -> impl Strategy<Value = Svc> {
    (
        0u8..40,
        0u8..12,
        prop::bool::weighted(0.2),
        prop::sample::select(vec![53u16, 80, 443]),
        any::<bool>(),
        prop::collection::vec((0u8..16, prop::sample::select(vec![1u32, 1, 2, 5])), 0..4),
        prop::option::weighted(0.2, prop::sample::select(vec![7u32, 251, 1021])),
    )
        .prop_map(|(name, vip, v6, port, udp, backends, table)| Svc { name, vip, v6, port, udp, backends, table })
}

/// The services as TOML, dropping repeated names, keys and backends (the
/// loader rejects those).
fn text(mode: &str, services: &[Svc]) -> String {
    let mut out = format!("[daemon]\nconnect_time_lb = \"{mode}\"\n");
    let mut names = BTreeSet::new();
    let mut keys = BTreeSet::new();
    for s in services {
        let vip = if s.v6 { format!("fd00::{}", s.vip + 1) } else { format!("10.96.0.{}", s.vip + 1) };
        let proto = if s.udp { "udp" } else { "tcp" };
        if !names.insert(s.name) || !keys.insert((vip.clone(), s.port, proto)) {
            continue;
        }
        let mut seen = BTreeSet::new();
        let backends: Vec<String> = s
            .backends
            .iter()
            .filter(|(b, _)| seen.insert(*b))
            .map(|(b, w)| {
                let addr = if s.v6 { format!("[fd01::{}]", b + 1) } else { format!("192.168.1.{}", b + 1) };
                format!("{{ address = \"{addr}:8080\", weight = {w} }}")
            })
            .collect();
        out.push_str(&format!(
            "[[service]]\nname = \"s{}\"\nvip = \"{vip}\"\nport = {}\nprotocol = \"{proto}\"\nbackends = [{}]\n",
            s.name,
            s.port,
            backends.join(", ")
        ));
        if let Some(t) = s.table {
            out.push_str(&format!("maglev_table_size = {t}\n"));
        }
    }
    out
}

fn config(text: &str) -> Config {
    crate::config::from_text(text)
}

/// A copy of `config`, shared as the daemon shares the one it loaded.
fn shared(config: &Config) -> Arc<Config> {
    Arc::new(config.clone())
}

/// An edit: some services replaced, removed or added.
#[derive(Debug, Clone)]
enum Edit {
    Replace(usize, Svc),
    Remove(usize),
    Add(Svc),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), svc()).prop_map(|(i, s)| Edit::Replace(i, s)),
        any::<usize>().prop_map(Edit::Remove),
        svc().prop_map(Edit::Add),
    ]
}

fn edited(services: &[Svc], edits: &[Edit]) -> Vec<Svc> {
    let mut out = services.to_vec();
    for e in edits {
        match e {
            Edit::Replace(i, s) if !out.is_empty() => {
                let i = i % out.len();
                out[i] = s.clone();
            }
            Edit::Remove(i) if !out.is_empty() => {
                let i = i % out.len();
                out.remove(i);
            }
            Edit::Add(s) => out.push(s.clone()),
            _ => {}
        }
    }
    out
}

/// Compiles `before` whole, then `after` both ways; returns both results
/// and the kernel state `before` left.
fn both_ways(before: &Config, after: &Config) -> (Desired, Option<(Compiled, Touched)>, Observed) {
    let facts = facts();
    let first = compile(before, &facts, &Prior::default());
    let have = first.as_observed();
    let prior = Prior::from_entries(have.map_entries.iter());
    let full = compile(after, &facts, &prior);
    let patched = recompile(Compiled::new(first, &shared(before), &facts), &shared(after), &facts).ok();
    (full, patched, have)
}

/// Each service of `after` equal to one of `before` (where it was written
/// too) becomes that one, shared, as an unchanged file's parse is.
fn share_unchanged(before: &Config, after: &mut Config) {
    for s in &mut after.services {
        if let Some(b) = before.services.iter().find(|b| ***b == **s) {
            *s = Arc::clone(b);
        }
    }
}

const MESH: &str = "[[mesh]]\nname = \"m\"\nvip = \"10.96.0.1\"\nport = 80\nredirect_port = 15001\n";

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    /// Wherever the patch applies, it is the full compile, and planning
    /// only its touched items gives the full plan.
    #[test]
    fn a_patch_is_the_full_compile_and_plans_the_same_steps(
        mode in prop::sample::select(vec!["tcp", "off", "all"]),
        mesh in any::<bool>(),
        services in prop::collection::vec(svc(), 1..24),
        edits in prop::collection::vec(edit(), 1..4),
        share in any::<bool>(),
    ) {
        // A mesh entry on one of the VIPs: its services are the sidecar's.
        let mesh = if mesh { MESH } else { "" };
        let before = config(&format!("{}{mesh}", text(mode, &services)));
        let mut after = config(&format!("{}{mesh}", text(mode, &edited(&services, &edits))));
        if share {
            share_unchanged(&before, &mut after);
        }
        let (full, patched, have) = both_ways(&before, &after);
        if let Some((c, touched)) = patched {
            prop_assert_eq!(&c.desired, &full);
            prop_assert_eq!(c.entry_counts(), &count_entries(&full));
            // The ids it keeps, and how many services list each backend,
            // are those the full compile's index has.
            let rebuilt = Compiled::new(full.clone(), &shared(&after), &facts());
            prop_assert_eq!(&c.service_ids.ids, &rebuilt.service_ids.ids);
            prop_assert_eq!(&c.backend_ids.ids, &rebuilt.backend_ids.ids);
            let none = BTreeMap::new();
            let whole = plan(&have, &full, &none);
            // What the patch says its items were is what the kernel held.
            let was = touched.before(&c.desired);
            let held = |keys: &BTreeSet<MapEntryKey>| {
                keys.iter().filter_map(|k| have.map_entries.get(k).map(|v| (k.clone(), v.clone()))).collect()
            };
            prop_assert_eq!(&was.map_entries, &held(&touched.map_entries));
            let routes = touched.routes.iter().filter_map(|k| have.routes.get(k).map(|v| (k.clone(), v.clone())));
            prop_assert_eq!(&was.routes, &routes.collect());
            let touched_want = touched.desired(&c.desired);
            let part = plan(&was, &touched_want, &none);
            prop_assert_eq!(part, whole);
            // And the patched compile patches again.
            let again = recompile(c, &shared(&before), &facts());
            if let Ok((c, _)) = again {
                let back = compile(&before, &facts(), &Prior::from_entries(full.as_observed().map_entries.iter()));
                prop_assert_eq!(c.desired, back);
            }
        }
    }
}

/// `n` services of one backend each (`many_services` in reconcile's tests
/// does the same for the reconciler).
fn many(n: u32, extra: &str) -> Config {
    let mut out = String::new();
    for i in 0..n {
        out.push_str(&format!(
            "[[service]]\nname = \"s{i}\"\nvip = \"10.{}.{}.{}\"\nport = 80\nbackends = [\"192.168.1.{}:80\"]\n",
            100 + (i >> 16),
            (i >> 8) & 255,
            i & 255,
            i % 250 + 1
        ));
    }
    out.push_str(extra);
    config(&out)
}

const NEW: &str = "[[service]]\nname = \"new\"\nvip = \"10.99.0.1\"\nport = 80\nbackends = [\"192.168.2.1:80\"]\n";

#[test]
fn the_ids_a_compile_gave_are_those_its_entries_say() {
    let c = many(2_000, NEW);
    let with = compile(&c, &facts(), &Prior::default());
    assert!(with.ids.0.is_some());
    let mut without = with.clone();
    without.ids = Default::default();
    let (a, b) = (Compiled::new(with, &shared(&c), &facts()), Compiled::new(without, &shared(&c), &facts()));
    assert_eq!((a.service_ids.ids.len(), a.backend_ids.ids.len()), (2_001, 251));
    let same = |x: &Compiled, y: &Compiled| {
        x.service_ids.ids == y.service_ids.ids
            && (&x.service_ids.free, x.service_ids.next) == (&y.service_ids.free, y.service_ids.next)
            && x.backend_ids.ids == y.backend_ids.ids
            && (&x.backend_ids.free, x.backend_ids.next) == (&y.backend_ids.free, y.backend_ids.next)
    };
    assert!(same(&a, &b));
}

#[test]
fn one_added_service_among_ten_thousand_touches_only_its_own_items() {
    let (before, after) = (many(10_000, ""), many(10_000, NEW));
    let (full, patched, _) = both_ways(&before, &after);
    let (c, touched) = patched.expect("an added service patches");
    assert_eq!(c.desired, full);
    // Its backend, its table's one chunk (a lone backend's table is of one
    // slot), its service entry; its route.
    assert_eq!(touched.map_entries.len(), 3, "{:?}", touched.map_entries);
    assert_eq!(touched.routes.len(), 1);
    // Removing it again touches the same items.
    let (c, touched) = recompile(c, &shared(&before), &facts()).expect("a removed service patches");
    assert_eq!(touched.map_entries.len(), 3);
    assert_eq!(c.desired, compile(&before, &facts(), &Prior::from_entries(full.as_observed().map_entries.iter())));
}

#[test]
fn anything_but_services_changing_compiles_in_full() {
    let before = many(10, "");
    let facts = facts();
    let first = || Compiled::new(compile(&before, &facts, &Prior::default()), &shared(&before), &facts);
    let daemon = config("[daemon]\nconnect_time_lb = \"all\"\n");
    let mut after = many(10, "");
    after.daemon = daemon.daemon;
    assert!(recompile(first(), &shared(&after), &facts).is_err(), "[daemon] changed");
    let mut other = facts.clone();
    other.default_route_interfaces.push("eth1".into());
    assert!(recompile(first(), &shared(&many(10, NEW)), &other).is_err(), "the host changed");
    // An interface that appears (hostmesh's own veth after the first sync)
    // changes nothing compile reads, unless it is a configured host
    // interface.
    let mut more = facts.clone();
    more.interfaces.insert("hm-natin".into());
    assert!(recompile(first(), &shared(&many(10, NEW)), &more).is_ok(), "a new interface compile does not read");
    let mut named = many(10, "");
    named.daemon.host_interfaces = Some(vec!["eth0".into(), "eth9".into()]);
    let mut with_eth9 = facts.clone();
    with_eth9.interfaces.insert("eth9".into());
    let first_named = || Compiled::new(compile(&named, &with_eth9, &Prior::default()), &shared(&named), &with_eth9);
    let mut named_new = many(10, NEW);
    named_new.daemon = named.daemon.clone();
    assert!(recompile(first_named(), &shared(&named_new), &with_eth9).is_ok(), "one service added");
    assert!(recompile(first_named(), &shared(&named_new), &facts).is_err(), "a configured host interface went away");
    assert!(recompile(first(), &Arc::default(), &facts).is_err(), "no services left");
    assert!(recompile(first(), &shared(&many(10, NEW)), &facts).is_ok(), "one service added");
}
