//! An upgrade in place: a daemon of an older build (`HM_OLD_DAEMON`), with
//! services on both paths, a mesh redirect and a gateway peer, is replaced
//! by this build's while clients make a request every 50 ms to each. Not
//! part of `cargo test` (the target has `test = false`): it needs the older
//! build, which `bench/upgrade` makes from a commit and runs this with.

#[path = "../integration/fixtures.rs"]
#[allow(dead_code)]
mod fixtures;
#[path = "../integration/topology.rs"]
#[allow(dead_code)]
mod topology;

use std::os::fd::AsFd;
use std::path::PathBuf;

use hm_testkit::{wait_soon, Daemon, DaemonOptions, SOON};
use hostmesh::abi::HmMap;
use hostmesh::backends::bpf::sys;
use hostmesh::state::{ObjectKind, ObjectState};

use crate::fixtures::*;
use crate::topology::*;

/// The id of every pinned map, and every pinned link's.
fn pinned_ids(opts: &DaemonOptions) -> (Vec<(HmMap, u32)>, Vec<(String, u32)>) {
    let maps = HmMap::pinned()
        .filter_map(|m| {
            let fd = sys::obj_get(&opts.bpffs.join("maps").join(m.name())).ok()?;
            Some((m, sys::map_info(fd.as_fd()).unwrap().id))
        })
        .collect();
    let mut links: Vec<(String, u32)> = std::fs::read_dir(opts.bpffs.join("links"))
        .map(|d| {
            d.map(|e| {
                let name = e.unwrap().file_name().into_string().unwrap();
                let fd = sys::obj_get(&opts.bpffs.join("links").join(&name)).unwrap();
                (name, sys::link_info(fd.as_fd()).unwrap().id)
            })
            .collect()
        })
        .unwrap_or_default();
    links.sort();
    (maps, links)
}

#[test]
fn an_older_build_is_replaced_in_place_without_a_failed_connection() {
    let old = std::env::var("HM_OLD_DAEMON").expect("HM_OLD_DAEMON names the older build's daemon (bench/upgrade)");
    // TCP by connect-time LB, UDP on the veth path (the default mode), a
    // mesh redirect to a sidecar, and a gateway with a peer.
    let t = Topology::new("");
    t.host.write("mesh.toml", &mesh_and_peer(""));
    let _sidecar = Sidecar::start(&t.host, "sidecar", 15001);
    let old_opts = DaemonOptions { bin: PathBuf::from(&old), ..clone_opts(&t.host.opts) };
    let mut d = Daemon::start(&t.host.ns, &old_opts);
    d.wait_ready(READY_TIMEOUT);
    // The sidecar registered; the peer (which never answers) configured.
    wait_soon("the old build's mesh redirect and peer", || {
        let s = t.host.status();
        s.objects.iter().any(|o| o.kind == ObjectKind::Mesh && o.state == ObjectState::Applied)
            && s.objects.iter().any(|o| o.kind == ObjectKind::Peer)
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}", t.host.status().objects));
    let (maps, links) = pinned_ids(&t.host.opts);
    assert!(maps.len() > 10 && links.len() > 10, "the old build pinned {maps:?} {links:?}");

    let targets = [("tcp", "10.96.0.10", 80), ("udp", "10.96.0.10", 53), ("tcp", "10.96.0.60", 80)];
    let loops = t.loops_to(&targets, 8);
    std::thread::sleep(std::time::Duration::from_secs(1));
    let status = d.stop(SOON);
    assert!(status.success(), "the old build stopped: {status:?}\n{}", d.log_text());
    drop(d);
    let new = t.host.start_ready();
    loops.assert_none_failed(100, "across the upgrade");

    // Every map adopted as it was (same ids: their entries and flows kept),
    // or, where this build grew its values (MapDef::grown_from), migrated
    // with its entries copied, as the log says; every link kept (programs
    // swapped behind them); nothing replaced empty.
    let (maps_after, links_after) = pinned_ids(&t.host.opts);
    let log = new.log_text();
    let this_run = log.rsplit("msg=starting").next().unwrap();
    // (Maps the older build did not have are this build's new ones.)
    let after: std::collections::BTreeMap<HmMap, u32> = maps_after.iter().copied().collect();
    let mut kept = 0;
    for (map, before) in &maps {
        let migrated = format!("map {} migrated from values of", map.name());
        if after.get(map) == Some(before) {
            kept += 1;
        } else {
            assert!(
                after.contains_key(map) && this_run.contains(&migrated),
                "{map:?} neither adopted nor migrated:\n{this_run}"
            );
        }
    }
    // (Links of programs the older build did not have are this build's.)
    let missing: Vec<_> = links.iter().filter(|l| !links_after.contains(l)).collect();
    assert!(missing.is_empty(), "the new build kept every link: {missing:?} gone or replaced, now {links_after:?}");
    let s = t.host.status();
    assert!(s.last_sync.ok, "{:?}", s.last_sync);
    assert!(!this_run.contains("another layout"), "a map was replaced:\n{this_run}");
    // The programs now attached are this build's.
    let generation = s.generation;
    new.signal(nix::sys::signal::Signal::SIGHUP);
    wait_soon("a full resync", || t.host.status().generation > generation).unwrap();
    assert_eq!(t.host.status().last_sync.steps, 0, "a resync finds everything current:\n{}", new.log_text());
    println!(
        "upgraded from {old}: {kept} maps adopted, {} migrated, {} new, {} links kept, {} new, no request failed",
        maps.len() - kept,
        maps_after.len() - maps.len(),
        links.len(),
        links_after.len() - links.len()
    );
}

fn clone_opts(o: &DaemonOptions) -> DaemonOptions {
    DaemonOptions {
        bin: o.bin.clone(),
        config_dir: o.config_dir.clone(),
        state_dir: o.state_dir.clone(),
        bpffs: o.bpffs.clone(),
        log: o.log.clone(),
    }
}
