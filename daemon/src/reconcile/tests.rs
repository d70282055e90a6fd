//! plan + apply + sync against the in-memory kernel, without root.

use std::collections::BTreeMap;

use super::*;
use crate::backends::fake::FakeKernel;
use std::sync::Arc;

use crate::abi::{self, Pod};
use crate::config::Config;
use crate::model::*;

/// The configuration `text` says, shared as the daemon shares it.
fn config(text: &str) -> Arc<Config> {
    Arc::new(crate::config::from_text(text))
}

const WEB: &str = "[[service]]\nname = \"web\"\nvip = \"10.96.0.10\"\nport = 80\nbackends = [\"192.168.1.1:80\"]\n";
const API: &str = "[[service]]\nname = \"api\"\nvip = \"10.96.0.20\"\nport = 443\n";

fn kernel() -> FakeKernel {
    let k = FakeKernel::new();
    {
        let mut s = k.state();
        s.facts.interfaces = ["lo", "eth0"].map(String::from).into();
        s.facts.default_route_interfaces = vec!["eth0".into()];
        s.facts.netns_cookie = 7;
        s.facts.cgroup2_root = Some("/sys/fs/cgroup".into());
        s.host_sysctls.insert("net/ipv4/conf/all/rp_filter".into(), "2".into());
        s.host_sysctls.insert("net/ipv4/conf/eth0/rp_filter".into(), "1".into());
    }
    k
}

fn reconciler(k: &FakeKernel) -> Reconciler {
    Reconciler::new(k.backends(), SysctlOriginals::in_memory())
}

#[test]
fn first_sync_builds_bottom_up_and_a_second_sync_does_nothing() {
    let k = kernel();
    let mut r = reconciler(&k);
    let out = r.sync(&config(WEB), false).unwrap();
    assert!(out.full, "the first sync observes the kernel");
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    // Bottom-up: links, sysctls, neighbours, map entries, programs, routes.
    let log = k.state().log.clone();
    let phase = |line: &str| match line.split(' ').next().unwrap() {
        "create_link" => 0,
        "set_sysctl" => 1,
        "replace_neighbour" => 2,
        "put_map_entry" => 3,
        "attach" => 4,
        "replace_route" => 5,
        other => panic!("unexpected step {other}"),
    };
    let phases: Vec<u8> = log.iter().map(|l| phase(l)).collect();
    assert!(phases.windows(2).all(|w| w[0] <= w[1]), "out of order: {log:?}");
    assert_eq!(log.first().unwrap(), "create_link hm-natin");
    assert_eq!(log.last().unwrap(), "replace_route 10.96.0.10/32");
    // Within the maps: the config, backends and Maglev chunks before the
    // service that refers to them.
    let maps: Vec<&String> = log.iter().filter(|l| l.starts_with("put_map_entry")).collect();
    assert_eq!(maps.first().unwrap().as_str(), "put_map_entry HM_CONFIG");
    assert_eq!(maps.last().unwrap().as_str(), "put_map_entry HM_SERVICES");
    assert!(log.contains(&"attach hm_natout@tc-ingress@hm-natout".to_string()));
    assert!(log.contains(&"attach hm_reply@tc-ingress@eth0".to_string()));
    assert!(log.contains(&"attach hm_connect4@cgroup@%2Fsys%2Ffs%2Fcgroup".to_string()));
    k.state().log.clear();
    let again = r.sync(&config(WEB), false).unwrap();
    assert!(!again.full);
    assert!(again.steps.is_empty(), "{:?}", again.steps);
    let full = r.sync(&config(WEB), true).unwrap();
    assert!(full.steps.is_empty(), "a full resync of a converged kernel changes nothing: {:?}", full.steps);
    assert!(k.state().log.is_empty());
}

#[test]
fn removing_everything_goes_top_down_and_restores_sysctls() {
    let k = kernel();
    let mut r = reconciler(&k);
    r.sync(&config(&format!("{WEB}{API}")), false).unwrap();
    k.state().log.clear();

    let out = r.sync(&Arc::default(), false).unwrap();
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    // Top-down: routes, programs, map entries (services first), neighbour,
    // sysctls, link.
    let order: Vec<&str> = out
        .steps
        .iter()
        .map(|s| match s.as_str() {
            x if x.starts_with("delete route") => "route",
            x if x.starts_with("detach") => "program",
            x if x.starts_with("delete HM_") => "map",
            x if x.starts_with("delete neighbour") => "neighbour",
            x if x.starts_with("restore sysctl") => "sysctl",
            x if x.starts_with("delete link") => "link",
            x => panic!("unexpected step {x}"),
        })
        .collect();
    let mut dedup = order.clone();
    dedup.dedup();
    assert_eq!(dedup, ["route", "program", "map", "neighbour", "sysctl", "link"], "{:?}", out.steps);
    let first_map = out.steps.iter().find(|s| s.starts_with("delete HM_")).unwrap();
    assert_eq!(first_map, "delete HM_SERVICES entry");
    // Only sysctls that existed before hostmesh are restored; the veth's own
    // go away with it.
    assert_eq!(order.iter().filter(|k| **k == "sysctl").count(), 2);
    let s = k.state();
    assert!(s.links.is_empty() && s.routes.is_empty() && s.maps.is_empty() && s.neighbours.is_empty());
    assert!(s.attachments.is_empty());
    assert_eq!(s.host_sysctls["net/ipv4/conf/all/rp_filter"], "2", "restored to its original");
    assert_eq!(s.host_sysctls["net/ipv4/conf/eth0/rp_filter"], "1");
}

#[test]
fn teardown_reconciles_to_empty_through_the_plan_and_leaves_maps_whole() {
    let k = kernel();
    let mut originals = SysctlOriginals::in_memory();
    let mut r = Reconciler::new(k.backends(), SysctlOriginals::in_memory());
    let mesh = "[[mesh]]\nname = \"m\"\nvip = \"10.96.0.60\"\nport = 80\nredirect_port = 15001\n";
    r.sync(&config(&format!("{WEB}{API}{mesh}")), false).unwrap();
    // The daemon's record of the sysctls it changed, as its state dir keeps it.
    originals.record("net/ipv4/conf/all/rp_filter", "2");
    originals.record("net/ipv4/conf/eth0/rp_filter", "1");
    let entries = k.state().maps.len();
    assert!(entries > 0 && !k.state().attachments.is_empty() && !k.state().routes.is_empty());
    k.state().log.clear();

    let emptied = crate::reconcile::reconcile_to_empty(&mut k.backends(), &mut originals).unwrap();
    assert!(emptied.errors.is_empty(), "{:?}", emptied.errors);
    let s = k.state();
    assert!(s.links.is_empty() && s.routes.is_empty() && s.neighbours.is_empty() && s.attachments.is_empty());
    assert_eq!(s.host_sysctls["net/ipv4/conf/all/rp_filter"], "2", "put back");
    assert!(originals.values().is_empty(), "and forgotten");
    // The plan's order: routes, programs, neighbours, sysctls, links; map
    // entries are not deleted one by one (the maps go whole after it).
    let kinds: Vec<&str> = s.log.iter().map(|l| l.split(' ').next().unwrap()).collect();
    let mut order = kinds.clone();
    order.dedup();
    assert_eq!(order, ["delete_route", "detach", "delete_neighbour", "set_sysctl", "delete_link"], "{:?}", s.log);
    assert_eq!(s.maps.len(), entries);
}

#[test]
fn a_full_resync_repairs_drift_an_incremental_one_trusts_its_record() {
    let k = kernel();
    let mut r = reconciler(&k);
    r.sync(&config(WEB), false).unwrap();
    {
        let mut s = k.state();
        s.routes.clear();
        s.host_sysctls.insert("net/ipv4/conf/all/rp_filter".into(), "1".into());
        s.sysctls.remove("net/ipv4/conf/all/rp_filter");
    }
    let trusted = r.sync(&config(WEB), false).unwrap();
    assert!(trusted.steps.is_empty(), "{:?}", trusted.steps);
    let out = r.sync(&config(WEB), true).unwrap();
    assert_eq!(
        out.steps,
        [
            "set sysctl net.ipv4.conf.all.rp_filter = 0",
            "set route 10.96.0.10/32 via 169.254.1.1 dev hm-natin table 254"
        ]
    );
    assert_eq!(k.state().routes.len(), 1);
    // The original recorded at first change (2) is kept, not the drifted 1.
    r.sync(&Arc::default(), false).unwrap();
    assert_eq!(k.state().host_sysctls["net/ipv4/conf/all/rp_filter"], "2");
}

#[test]
fn a_failed_step_is_charged_to_its_owner_and_forces_a_full_resync() {
    let k = kernel();
    let mut r = reconciler(&k);
    k.state().fail_next = Some("replace_route 10.96.0.20".into());
    let out = r.sync(&config(&format!("{WEB}{API}")), false).unwrap();
    assert_eq!(out.errors.len(), 1, "{:?}", out.errors);
    assert_eq!(out.errors[0].owners, ["service/api"].into());
    assert!(out.errors[0].error.contains("Input/output error"), "{}", out.errors[0].error);
    // Everything else still applied.
    assert!(k.state().routes.keys().any(|r| r.dst.to_string() == "10.96.0.10/32"));

    let next = r.sync(&config(&format!("{WEB}{API}")), false).unwrap();
    assert!(next.full, "a failed sync makes the next one full");
    assert_eq!(next.steps, ["set route 10.96.0.20/32 via 169.254.1.1 dev hm-natin table 254"]);
    assert!(next.errors.is_empty());
}

#[test]
fn a_failed_entry_in_a_run_of_map_writes_is_charged_to_its_owner_and_the_rest_of_the_run_is_written() {
    let services = |k: &FakeKernel| k.state().maps.keys().filter(|e| e.map == BpfMap::Services).count();
    let clean = kernel();
    reconciler(&clean).sync(&config(&format!("{WEB}{API}")), false).unwrap();
    let all = services(&clean);
    assert!(all >= 2, "one entry per service at least: {all}");

    let k = kernel();
    let mut r = reconciler(&k);
    k.state().fail_next = Some("put_map_entry HM_SERVICES".into());
    let out = r.sync(&config(&format!("{WEB}{API}")), false).unwrap();
    assert_eq!(out.errors.len(), 1, "{:?}", out.errors);
    assert_eq!(out.errors[0].step, "update HM_SERVICES entry");
    assert_eq!(out.errors[0].owners.len(), 1, "one service's entry: {:?}", out.errors[0].owners);
    assert_eq!(services(&k), all - 1, "the run's other entries are written");

    let next = r.sync(&config(&format!("{WEB}{API}")), false).unwrap();
    assert!(next.full && next.errors.is_empty());
    assert_eq!(next.steps, ["update HM_SERVICES entry"]);
    assert_eq!(services(&k), all);
}

#[test]
fn a_full_resync_of_the_same_configuration_keeps_the_last_compile_and_still_repairs_the_kernel() {
    let k = kernel();
    let mut r = reconciler(&k);
    let both = config(&format!("{WEB}{API}"));
    r.sync(&both, false).unwrap();
    let services = |k: &FakeKernel| k.state().maps.keys().filter(|e| e.map == BpfMap::Services).count();
    let all = services(&k);
    // Someone deletes an entry by hand.
    let gone = k.state().maps.keys().find(|e| e.map == BpfMap::Services).cloned().unwrap();
    k.state().maps.remove(&gone);

    // The same text loaded again: an equal configuration, not the same Arc.
    let out = r.sync(&config(&format!("{WEB}{API}")), true).unwrap();
    assert!(out.full && out.patched, "nothing changed: the last compile is kept");
    assert_eq!(out.steps, ["update HM_SERVICES entry"], "the kernel is still read and repaired");
    assert_eq!(services(&k), all);

    // A changed service: a full sync compiles again.
    let out = r.sync(&config(&format!("{WEB}{}", API.replace("443", "8443"))), true).unwrap();
    assert!(out.full && !out.patched && out.errors.is_empty());
    assert!(k.state().maps.keys().filter(|e| e.map == BpfMap::Services).count() >= all);
}

#[test]
fn a_resync_gives_way_to_a_waiting_change_and_leaves_everything_as_it_was() {
    let k = kernel();
    let waiting = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut r = reconciler(&k).with_waiting_flag(Arc::clone(&waiting));
    let web = config(WEB);
    r.sync_giving_way(&web).unwrap();
    assert!(k.state().maps.keys().any(|e| e.map == BpfMap::Services), "the first sync never gives way");

    // Drift, then a resync while a change waits: it gives way, touching nothing.
    let gone = k.state().maps.keys().find(|e| e.map == BpfMap::Services).cloned().unwrap();
    k.state().maps.remove(&gone);
    waiting.store(true, std::sync::atomic::Ordering::Relaxed);
    let before = k.state().log.len();
    let out = r.sync_giving_way(&web).unwrap();
    assert!(out.gave_way && out.steps.is_empty() && out.errors.is_empty(), "{out:?}");
    assert_eq!(k.state().log.len(), before, "nothing written");

    // The change it gave way to is patched as if the resync had not begun.
    let both = config(&format!("{WEB}{API}"));
    let out = r.sync(&both, false).unwrap();
    assert!(!out.full && out.patched && out.errors.is_empty(), "{out:?}");
    // The resync again, nothing waiting: it repairs the drift.
    waiting.store(false, std::sync::atomic::Ordering::Relaxed);
    let out = r.sync_giving_way(&both).unwrap();
    assert!(out.full && !out.gave_way && out.patched, "kept its compile: {out:?}");
    assert_eq!(out.steps, ["update HM_SERVICES entry"]);
    assert!(k.state().maps.contains_key(&gone));

    // A resync that read a change already waiting gives way too: the
    // change's own sync patches it in.
    waiting.store(true, std::sync::atomic::Ordering::Relaxed);
    let out = r.sync_giving_way(&web).unwrap();
    assert!(out.gave_way, "{out:?}");
    let out = r.sync(&web, false).unwrap();
    assert!(!out.full && out.patched && out.errors.is_empty(), "{out:?}");
    waiting.store(false, std::sync::atomic::Ordering::Relaxed);
    let out = r.sync_giving_way(&web).unwrap();
    assert!(out.full && !out.gave_way && out.patched && out.steps.is_empty(), "{out:?}");
}

#[test]
fn a_resync_gives_way_during_its_plan_too() {
    let k = kernel();
    let waiting = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut r = reconciler(&k).with_waiting_flag(Arc::clone(&waiting));
    let all = config(&many_services(2_000, None));
    r.sync_giving_way(&all).unwrap();
    let gone = k.state().maps.keys().find(|e| e.map == BpfMap::Services).cloned().unwrap();
    k.state().maps.remove(&gone);
    // The change arrives after the resync read the maps, before it plans.
    k.state().raise_on_sysctl_read = Some(Arc::clone(&waiting));
    let before = k.state().log.len();
    let out = r.sync_giving_way(&all).unwrap();
    assert!(out.gave_way && out.steps.is_empty() && out.errors.is_empty(), "{out:?}");
    assert_eq!(k.state().log.len(), before, "nothing written");
    // The change's sync patches the kept compile; the resync then repairs.
    let out = r.sync(&all, false).unwrap();
    assert!(!out.full && out.patched && out.errors.is_empty(), "{out:?}");
    waiting.store(false, std::sync::atomic::Ordering::Relaxed);
    let out = r.sync_giving_way(&all).unwrap();
    assert!(out.full && !out.gave_way && out.patched, "{out:?}");
    assert_eq!(out.steps, ["update HM_SERVICES entry"]);
}

#[test]
fn a_link_in_the_way_is_recreated_with_everything_on_it() {
    let k = kernel();
    let mut r = reconciler(&k);
    r.sync(&config(WEB), false).unwrap();
    // Someone replaced our veth with one whose peer is wrong.
    {
        let mut s = k.state();
        s.links.insert(
            "hm-natin".into(),
            LinkSpec::Veth { peer: "other".into(), mac: NATIN_MAC, peer_mac: NATOUT_MAC, up: true },
        );
    }
    let out = r.sync(&config(WEB), true).unwrap();
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    assert_eq!(out.steps[0], "delete link hm-natin");
    assert_eq!(out.steps[1], "create veth hm-natin peer hm-natout");
    for wanted in ["set neighbour 169.254.1.1", "attach hm_natout", "set route 10.96.0.10/32"] {
        assert!(out.steps.iter().any(|s| s.starts_with(wanted)), "{wanted} missing from {:?}", out.steps);
    }
}

#[test]
fn a_defunct_or_outdated_program_is_reattached() {
    let k = kernel();
    let mut r = reconciler(&k);
    r.sync(&config(WEB), false).unwrap();
    let natout = Attachment { program: Program::NatOut, hook: Hook::TcIngress(NATOUT.into()) };
    for status in [AttachStatus::Outdated, AttachStatus::Defunct] {
        k.state().attachments.insert(natout.clone(), status);
        let out = r.sync(&config(WEB), true).unwrap();
        assert_eq!(out.steps, ["attach hm_natout on tc ingress of hm-natout"]);
    }
}

#[test]
fn routes_are_added_most_specific_first_and_removed_most_general_first() {
    let owned = |spec: RouteSpec| Owned { spec, owners: Owners::new() };
    let via = RouteSpec::Via { gateway: GATEWAY_V4.into(), dev: NATIN.into(), mtu: None, encap: None };
    let key = |dst: &str| RouteKey { table: RT_TABLE_MAIN, dst: dst.parse().unwrap() };
    let mut want = Desired::default();
    for dst in ["10.0.0.0/8", "10.1.0.0/16", "10.1.1.0/24"] {
        want.routes.insert(key(dst), owned(via.clone()));
    }
    let steps: Vec<String> =
        plan(&Observed::default(), &want, &BTreeMap::new()).iter().map(|s| s.step().to_string()).collect();
    assert_eq!(
        steps,
        [
            "set route 10.1.1.0/24 via 169.254.1.1 dev hm-natin table 254",
            "set route 10.1.0.0/16 via 169.254.1.1 dev hm-natin table 254",
            "set route 10.0.0.0/8 via 169.254.1.1 dev hm-natin table 254",
        ]
    );
    let have = want.as_observed();
    let steps: Vec<String> =
        plan(&have, &Desired::default(), &BTreeMap::new()).iter().map(|s| s.step().to_string()).collect();
    assert_eq!(
        steps,
        [
            "delete route 10.0.0.0/8 table 254",
            "delete route 10.1.0.0/16 table 254",
            "delete route 10.1.1.0/24 table 254"
        ]
    );
}

#[test]
fn a_changed_service_updates_its_entry_in_place() {
    let k = kernel();
    let mut r = reconciler(&k);
    r.sync(&config(WEB), false).unwrap();
    let out = r
        .sync(&config(&WEB.replace("[\"192.168.1.1:80\"]", "[\"192.168.1.1:80\", \"192.168.1.2:80\"]")), false)
        .unwrap();
    // A new backend, web's Maglev chunks, then web's entry: updated in place.
    assert_eq!(out.steps.first().unwrap(), "update HM_BACKENDS entry");
    assert_eq!(out.steps.last().unwrap(), "update HM_SERVICES entry");
    assert!(out.steps.iter().all(|s| s.starts_with("update HM_")), "{:?}", out.steps);
}

#[test]
fn the_mesh_fallback_table_comes_before_its_routes_and_goes_after_them() {
    let k = kernel();
    k.state().facts.sk_lookup_unavailable = Some("old kernel".into());
    let mut r = reconciler(&k);
    let mesh = "[[mesh]]\nname = \"m\"\nvip = \"10.96.0.60\"\nport = 80\nredirect_port = 15001\n";
    let with_mesh = config(mesh);
    let out = r.sync(&with_mesh, false).unwrap();
    assert_eq!(
        out.steps,
        ["set table inet hostmesh (1 rules)", "set route local 10.96.0.60/32 dev lo src 127.0.0.1 table 255"]
    );
    assert!(k.state().nft_table.as_ref().is_some_and(|t| t.len() == 1));
    // Someone flushes the table: the next full resync puts it back.
    k.state().nft_table = Some(Default::default());
    assert_eq!(r.sync(&with_mesh, true).unwrap().steps, ["set table inet hostmesh (1 rules)"]);
    let out = r.sync(&Arc::default(), false).unwrap();
    assert_eq!(out.steps, ["delete route 10.96.0.60/32 table 255", "delete table inet hostmesh"]);
    assert!(k.state().nft_table.is_none());
}

#[test]
fn a_failed_program_attach_blocks_the_routes_into_its_veth() {
    let k = kernel();
    let mut r = reconciler(&k);
    k.state().fail_next = Some("attach hm_natout@tc-ingress@hm-natout".into());
    let out = r.sync(&config(WEB), false).unwrap();
    assert!(k.state().routes.is_empty(), "a route into hm-natin with no program behind it: {:?}", k.state().routes);
    let route_err = out.errors.iter().find(|e| e.step.starts_with("set route 10.96.0.10/32")).expect("route refused");
    assert!(route_err.error.contains("not steering traffic into hm-natin"), "{}", route_err.error);
    assert_eq!(route_err.owners, ["service/web"].into());
    // Once the program attaches, the next (full) sync adds the route.
    let next = r.sync(&config(WEB), false).unwrap();
    assert!(next.errors.is_empty(), "{:?}", next.errors);
    assert!(k.state().routes.keys().any(|r| r.dst.to_string() == "10.96.0.10/32"));
}

#[test]
fn programs_that_cannot_load_hold_back_the_veth_its_maps_and_routes() {
    let k = kernel();
    let mut r = reconciler(&k);
    k.state().bpf_broken = Some("pinned map HM_CT is not a map".into());
    let out = r.sync(&config(WEB), false).unwrap();
    assert!(out.bpf_unavailable.as_deref().is_some_and(|e| e.contains("HM_CT")), "{:?}", out.bpf_unavailable);
    let s = k.state();
    assert!(s.links.is_empty(), "no veth without its programs: {:?}", s.links);
    assert!(s.routes.is_empty() && s.maps.is_empty() && s.attachments.is_empty());
    // One error for everything held back, not one per step.
    let bpf: Vec<_> = out.errors.iter().filter(|e| e.error.contains("HM_CT")).collect();
    assert_eq!(bpf.len(), 1, "{:?}", out.errors);
    assert!(bpf[0].step.starts_with("load the BPF programs ("), "{}", bpf[0].step);
}

/// `n` services of one backend each, service `i` at 10.{100+i/65536}.x.y.
fn many_services(n: u32, changed: Option<u32>) -> String {
    (0..n)
        .map(|i| {
            let backend = if Some(i) == changed { 2 } else { 1 };
            format!(
                "[[service]]\nname = \"s{i}\"\nvip = \"10.{}.{}.{}\"\nport = 80\nbackends = [\"192.168.{}.{}:80\"]\n",
                100 + (i >> 16),
                (i >> 8) & 255,
                i & 255,
                backend,
                i % 250 + 1
            )
        })
        .collect()
}

#[test]
fn one_changed_service_among_100000_plans_only_its_own_entries() {
    const N: u32 = 100_000;
    const SIZED: &str = "[daemon]\nservice_map_size = 131072\n";
    let k = kernel();
    let mut r = reconciler(&k);
    let first = r.sync(&config(&format!("{SIZED}{}", many_services(N, None))), false).unwrap();
    assert!(first.errors.is_empty(), "{:?}", &first.errors[..3.min(first.errors.len())]);
    assert!(r.desired().unwrap().warnings.is_empty(), "{:?}", r.desired().unwrap().warnings);
    // Service 77,777 moves to another backend.
    let out = r.sync(&config(&format!("{SIZED}{}", many_services(N, Some(77_777)))), false).unwrap();
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    assert!(!out.full);
    // Its backend entry, its table's chunk (one slot: one backend), and the
    // old backend's entry when no other service uses it: nothing else.
    assert!(!out.steps.is_empty() && out.steps.len() <= 8, "{} steps: {:?}", out.steps.len(), out.steps);
    assert!(out.steps.iter().all(|s| s.contains("HM_BACKENDS") || s.contains("HM_MAGLEV")), "{:?}", out.steps);
    assert!(out.patched, "only that service was compiled");
}

#[test]
fn a_service_down_to_one_backend_shrinks_its_table_without_a_slot_naming_another_backend() {
    const TWO: &str = "[[service]]\nname = \"web\"\nvip = \"10.96.0.10\"\nport = 80\nbackends = [\"192.168.1.1:80\", \"192.168.1.2:80\"]\n";
    let k = kernel();
    let mut r = reconciler(&k);
    r.sync(&config(TWO), false).unwrap();
    let chunks = |k: &FakeKernel| -> BTreeMap<u32, abi::MaglevChunk> {
        k.state()
            .maps
            .iter()
            .filter(|(key, _)| key.map == BpfMap::Maglev)
            .map(|(key, v)| {
                (abi::MaglevKey::from_bytes(&key.key).unwrap().chunk, abi::MaglevChunk::from_bytes(v).unwrap())
            })
            .collect()
    };
    assert_eq!(chunks(&k).len(), 4, "two backends: 251 slots");
    k.state().log.clear();
    // The backend that stays has id 1: an unfilled slot (id 0) would name
    // the one that leaves.
    let out = r.sync(&config(&TWO.replace("\"192.168.1.1:80\", ", "")), false).unwrap();
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    // Chunk 0 is rewritten while the service still says 251 slots, then the
    // service, then the other chunks and the backend that left go.
    let log = k.state().log.clone();
    assert_eq!(
        log.iter().filter(|l| l.contains("HM_")).map(String::as_str).collect::<Vec<_>>(),
        [
            "put_map_entry HM_MAGLEV",
            "put_map_entry HM_SERVICES",
            "delete_map_entry HM_MAGLEV",
            "delete_map_entry HM_MAGLEV",
            "delete_map_entry HM_MAGLEV",
            "delete_map_entry HM_BACKENDS",
        ],
        "{log:?}"
    );
    // So between those writes every slot a probe can read names a backend
    // of the service: chunk 0 is all the staying backend's.
    let staying = k
        .state()
        .maps
        .iter()
        .find(|(key, _)| key.map == BpfMap::Backends)
        .map(|(key, _)| u32::from_bytes(&key.key).unwrap())
        .unwrap();
    let left = chunks(&k);
    assert_eq!(left.keys().copied().collect::<Vec<_>>(), [0]);
    assert_eq!(staying, 1);
    assert_eq!(left[&0].backend, [staying; abi::MAGLEV_CHUNK]);
}

#[test]
fn services_added_and_removed_by_a_patch_leave_the_kernel_as_a_full_sync_would() {
    const N: u32 = 2_000;
    const NEW: &str = "[[service]]\nname = \"new\"\nvip = \"10.99.0.1\"\nport = 80\nbackends = [\"192.168.7.1:80\"]\n";
    let k = kernel();
    let mut r = reconciler(&k);
    r.sync(&config(&many_services(N, None)), false).unwrap();
    let added = r.sync(&config(&format!("{}{NEW}", many_services(N, None))), false).unwrap();
    assert!(added.patched && added.errors.is_empty(), "{added:?}");
    // A backend, its one chunk (a lone backend's table), the service, its
    // route.
    assert_eq!(added.steps.len(), 4, "{:?}", added.steps);
    assert!(added.steps.last().unwrap().starts_with("set route 10.99.0.1/32"), "{:?}", added.steps);
    let check = r.sync(&config(&format!("{}{NEW}", many_services(N, None))), true).unwrap();
    assert!(check.steps.is_empty(), "a full resync after the patch finds nothing to do: {:?}", check.steps);

    let removed = r.sync(&config(&many_services(N, Some(5))), false).unwrap();
    assert!(removed.patched && removed.errors.is_empty(), "{removed:?}");
    // Service 5's new backend and table first, then the removed service,
    // its route before its entries.
    let deletes: Vec<&String> = removed.steps.iter().filter(|s| s.starts_with("delete")).collect();
    assert!(
        deletes[0].starts_with("delete route 10.99.0.1/32") && deletes[1] == "delete HM_SERVICES entry",
        "{deletes:?}"
    );
    // Its backend stays: service 5 now uses it. One chunk each way.
    assert_eq!(removed.steps.len(), 5, "{:?}", removed.steps);
    let check = r.sync(&config(&many_services(N, Some(5))), true).unwrap();
    assert!(check.steps.is_empty(), "{:?}", check.steps);
    let want: BTreeMap<_, _> = r
        .desired()
        .unwrap()
        .map_entries
        .iter()
        .map(|(k, v)| (k.clone(), v.spec.bytes().unwrap().into_owned()))
        .collect();
    assert!(want == k.state().maps, "the kernel's map entries are the desired ones");
}

/// The nft table's listing, started before the rest of the kernel is read,
/// is read however that ends: an observe that gives way leaves none for a
/// later read to take, stale.
#[test]
fn an_observe_that_gives_way_leaves_no_stale_listing_of_the_nft_table() {
    let k = kernel();
    let mut b = k.backends();
    assert!(super::observe::observe_until(&mut b, &|| true, None).unwrap().is_none(), "gave way");
    let rules = std::collections::BTreeSet::from([crate::model::NftRule {
        vip: "10.96.0.1".parse().unwrap(),
        port: 80,
        proto: 6,
        redirect_port: 15001,
    }]);
    k.state().nft_table = Some(rules.clone());
    assert_eq!(b.nft.mesh_table().unwrap(), Some(rules), "the table as it is now");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..Default::default() })]
    /// A resync reads the kernel against the compile it keeps, keeping
    /// only the entries that differ: it plans what reading every entry
    /// plans, whatever happened to the kernel's entries (some deleted,
    /// some changed, some not hostmesh's desire at all).
    #[test]
    fn a_kernel_read_against_the_desired_state_plans_what_reading_everything_plans(
        deleted in proptest::collection::vec(0usize..1000, 0..6),
        changed in proptest::collection::vec(0usize..1000, 0..6),
        extra in proptest::collection::vec(0u32..64, 0..4),
    ) {
        let k = kernel();
        let mut r = reconciler(&k);
        r.sync(&config(&format!("{WEB}{}", many_services(12, Some(3)))), false).unwrap();
        {
            let mut s = k.state();
            let keys: Vec<MapEntryKey> = s.maps.keys().cloned().collect();
            for i in deleted {
                s.maps.remove(&keys[i % keys.len()]);
            }
            for i in changed {
                if let Some(v) = s.maps.get_mut(&keys[i % keys.len()]) {
                    v[0] ^= 0x5a;
                }
            }
            for id in extra {
                let key = MapEntryKey { map: BpfMap::Backends, key: (5000 + id).to_bytes().into() };
                s.maps.insert(key, vec![1; std::mem::size_of::<abi::BackendValue>()]);
            }
        }
        let want = r.desired().unwrap().clone();
        let mut b = k.backends();
        let everything = super::observe::observe_until(&mut b, &|| false, None).unwrap().unwrap();
        let against = super::observe::observe_until(&mut b, &|| false, Some(&want)).unwrap().unwrap();
        proptest::prop_assert!(against.map_entries.len() <= everything.map_entries.len());
        let originals = BTreeMap::new();
        proptest::prop_assert_eq!(
            super::plan::plan(&against, &want, &originals),
            super::plan::plan(&everything, &want, &originals)
        );
    }
}

/// A cold start's plan holds a step per map entry (265,000 at 100,000
/// services): a step is a borrowed entry, not a copy with its owners.
#[test]
fn a_planned_step_is_small() {
    assert!(std::mem::size_of::<super::plan::PlannedStep>() <= 32);
}
