//! Map capacities from `[daemon]`: the maps the kernel holds have them, a
//! resize keeps established flows, and a configuration of fleet size
//! (100,000 services) applies and takes edits beside it.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use hostmesh::backends::bpf::sys;
use hostmesh::state::FileState;
use hostmesh::{Capacity, MapSizes};

use crate::topology::*;

/// Every map a capacity key sizes, with its key.
const SIZED: [(&str, Capacity); 11] = [
    ("HM_SERVICES", Capacity::Services),
    ("HM_BACKENDS", Capacity::Backends),
    ("HM_BACKEND_STATS", Capacity::Backends),
    ("HM_MAGLEV", Capacity::MaglevChunks),
    ("HM_CT", Capacity::Conntrack),
    ("HM_CT_CLOSING", Capacity::Conntrack),
    ("HM_REVERSE_SOCK", Capacity::ReverseSock),
    ("HM_MESH", Capacity::Mesh),
    ("HM_MESH_SOCKETS", Capacity::Mesh),
    ("HM_SVC_AFFINITY", Capacity::Services),
    ("HM_AFFINITY", Capacity::Affinity),
];

/// `[daemon]` lines setting every capacity key to `n` times its minimum.
fn sizes_config(n: u32) -> (String, MapSizes) {
    let mut sizes = MapSizes::default();
    let mut text = String::new();
    for k in &hostmesh::SIZE_KEYS {
        sizes.set(k.capacity, k.min * n);
        text.push_str(&format!("{} = {}\n", k.key, k.min * n));
    }
    (text, sizes)
}

/// The capacity of a pinned map, as the kernel reports it.
fn max_entries(t: &Topology, map: &str) -> u32 {
    let fd = sys::obj_get(&t.host.opts.bpffs.join("maps").join(map)).unwrap_or_else(|e| panic!("pinned {map}: {e}"));
    sys::map_info(fd.as_fd()).unwrap().max_entries
}

/// Every sized map has its configured capacity, but for `unused` ones
/// (allocated whole and unused by the configuration: their key's minimum).
fn assert_sizes(t: &Topology, sizes: &MapSizes, unused: &[Capacity], when: &str) {
    for (map, capacity) in SIZED {
        let want = if unused.contains(&capacity) { capacity.key().min } else { sizes.get(capacity) };
        assert_eq!(max_entries(t, map), want, "{when}: max_entries of {map}");
    }
    assert_eq!(max_entries(t, "HM_CONFIG"), 1, "{when}: HM_CONFIG is not sized by the config");
}

/// Mode "off", no service with affinity: no connect-time LB, no client
/// affinity.
const OFF_UNUSED: [Capacity; 2] = [Capacity::ReverseSock, Capacity::Affinity];

#[test]
fn size_keys_set_max_entries_and_a_resize_keeps_an_established_veth_flow() {
    let (small, small_sizes) = sizes_config(1);
    let t = Topology::new(&format!("connect_time_lb = \"off\"\n{small}"));
    let mut d = t.host.start_ready();
    assert_sizes(&t, &small_sizes, &OFF_UNUSED, "at start");
    let mut held = t.hold("10.96.0.10", 80);
    let first = held.answer();
    let flows = |t: &Topology| t.conntrack(hostmesh::abi::HmMap::Ct).into_iter().filter(|(k, _)| k.proto == 6).count();
    assert!(flows(&t) >= 2, "the held flow is in conntrack");

    // A restart with larger maps: the new maps are filled from the old
    // ones before this build's programs use them.
    d.stop(hm_testkit::SOON);
    let (large, large_sizes) = sizes_config(2);
    t.host.set_daemon_config(&format!("connect_time_lb = \"off\"\n{large}"));
    let d = t.host.start_ready();
    assert_sizes(&t, &large_sizes, &OFF_UNUSED, "after a restart with other sizes");
    assert_eq!(held.again(), first, "the established flow kept its backend across the resize");
    assert!(flows(&t) >= 2, "the held flow was copied into the resized conntrack");
    let log = d.log_text();
    assert!(log.contains("map HM_CT resized from 4096 to 8192 entries"), "{log}");

    // And while running: an edit of the [daemon] section resizes again.
    let generation = t.host.status().generation;
    t.host.set_daemon_config(&format!("connect_time_lb = \"off\"\n{small}"));
    t.wait_sync_after(generation);
    assert_sizes(&t, &small_sizes, &OFF_UNUSED, "after a live resize");
    assert_eq!(held.again(), first, "the established flow kept its backend across a live resize");
    let (answers, _, errors) = t.requests("tcp", "10.96.0.10", 80, 20);
    assert!(errors.is_empty(), "new connections after the resize: {errors:?}");
    assert_eq!(answers.iter().map(|(_, n)| n).sum::<u64>(), 20);
}

#[test]
fn maps_allocated_whole_are_small_until_the_configuration_uses_them_and_never_shrink() {
    let defaults = MapSizes::default();
    let t = Topology::new("connect_time_lb = \"all\"");
    let mut d = t.host.start_ready();
    // Connect-time LB for every protocol, no flows from the network, no
    // client affinity: 4 of the 5 maps allocated whole are at 4,096.
    assert_sizes(&t, &defaults, &[Capacity::Conntrack, Capacity::Affinity], "connect-time only");
    assert_eq!(max_entries(&t, "HM_NAT"), 4096);

    // A service with client affinity grows its map, which then works.
    let sticky = "[[service]]\nname = \"sticky\"\nvip = \"10.96.0.50\"\nport = 80\nbackends = \
                  [\"192.168.10.11:8080\", \"192.168.10.12:8080\"]\naffinity = \"client-ip\"\n";
    let generation = t.host.status().generation;
    t.host.write("sticky.toml", sticky);
    t.wait_sync_after(generation);
    assert_sizes(&t, &defaults, &[Capacity::Conntrack], "with affinity");
    let (answers, _, errors) = t.requests("tcp", "10.96.0.50", 80, 20);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(answers.len(), 1, "one client, one backend: {answers:?}");

    // The veth path grows conntrack; UDP takes it.
    let generation = t.host.status().generation;
    t.host.set_daemon_config("connect_time_lb = \"tcp\"");
    t.wait_sync_after(generation);
    assert_sizes(&t, &defaults, &[], "with the veth path");
    let (answers, _, errors) = t.requests("udp", "10.96.0.10", 53, 20);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(answers.iter().map(|(_, n)| n).sum::<u64>(), 20);
    assert!(t.conntrack(hostmesh::abi::HmMap::Ct).iter().any(|(k, _)| k.proto == 17), "UDP flows in conntrack");

    // Unused again: the maps keep their size, running or restarted.
    let generation = t.host.status().generation;
    std::fs::remove_file(t.host.opts.config_dir.join("sticky.toml")).unwrap();
    t.host.set_daemon_config("connect_time_lb = \"all\"");
    t.wait_sync_after(generation);
    assert_sizes(&t, &defaults, &[], "unused again");
    d.stop(hm_testkit::SOON);
    let _d = t.host.start_ready();
    assert_sizes(&t, &defaults, &[], "restarted");
}

/// `n` services, service `i` at 10.{100+i/65536}.x.y port 80, its one
/// backend b1 or b2 of the topology (192.168.10.11/12:8080).
fn many_services(n: u32) -> String {
    let mut text = String::with_capacity(n as usize * 96);
    for i in 0..n {
        text.push_str(&format!(
            "[[service]]\nname = \"s{i}\"\nvip = \"10.{}.{}.{}\"\nport = 80\nbackends = [\"192.168.10.{}:8080\"]\n",
            100 + (i >> 16),
            (i >> 8) & 255,
            i & 255,
            11 + i % 2
        ));
    }
    text
}

fn one_service(backend: &str) -> String {
    format!("[[service]]\nname = \"added\"\nvip = \"10.99.0.1\"\nport = 80\nbackends = [\"{backend}\"]\n")
}

/// 100,000 services, as the largest fleets give every host; a tenth of
/// that under software emulation (the kernel matrix's VMs, where the
/// suite's time scale is above 1), which runs the same code against that
/// kernel's maps at a fraction of the cost.
fn fleet() -> u32 {
    if hm_testkit::time_scale() > 1 {
        10_000
    } else {
        100_000
    }
}

/// Waits for the sync of a config change to the second file and says how
/// long it took from the write.
fn wait_patched(t: &Topology, generation: u64, written: Instant, what: &str) -> Duration {
    hm_testkit::wait_soon(what, || {
        let s = t.host.status();
        s.generation > generation && s.last_sync.ok
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}", t.host.status().last_sync));
    let took = written.elapsed();
    let s = t.host.status();
    assert!(s.last_sync.patched, "{what}: one service changed, the sync patched the last compile");
    took
}

#[test]
fn at_100000_services_a_vip_answers_and_one_service_beside_them_comes_changes_and_goes_even_during_a_reload() {
    // No periodic resync: each sync the test waits for is its edit's.
    let t = Topology::new(
        "connect_time_lb = \"all\"\nservice_map_size = 131072\nbackend_map_size = 131072\nresync_interval = \"1h\"",
    );
    let n = fleet();
    t.host.write("fleet.toml", &many_services(n));
    // The router behind the host's default route owns the added service's
    // VIP with nothing listening: once the service is gone, connections
    // go there and are refused.
    t.backends.ip(&["addr", "add", "10.99.0.1/32", "dev", "lo"]);
    let started = Instant::now();
    let d = t.host.start();
    d.wait_ready(hm_testkit::scaled(Duration::from_secs(120)));
    let ready = started.elapsed();
    let s = t.host.status();
    assert!(s.last_sync.ok, "{:?}", s.last_sync);
    // The 8 services of services.toml and the fleet.
    assert_eq!(s.counts.services, n as usize + 8, "every service applied");
    assert!(s.warnings.is_empty(), "{:?}", s.warnings);
    // The last service of the fleet, on b2 (its number is odd).
    let last = n - 1;
    let vip = format!("10.{}.{}.{}", 100 + (last >> 16), (last >> 8) & 255, last & 255);
    let (answers, _, errors) = t.requests("tcp", &vip, 80, 5);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(answers, [("b2".to_string(), 5)], "the last of {n} services answers from its backend");

    let generation = t.host.status().generation;
    let written = Instant::now();
    t.host.write("zz-added.toml", &one_service("192.168.10.11:8080"));
    let added = wait_patched(&t, generation, written, "the added service");
    let (answers, _, errors) = t.requests("tcp", "10.99.0.1", 80, 5);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(answers, [("b1".to_string(), 5)], "the added service answers");

    let generation = t.host.status().generation;
    let written = Instant::now();
    t.host.write("zz-added.toml", &one_service("192.168.10.12:8080"));
    let changed = wait_patched(&t, generation, written, "the changed backend");
    let (answers, _, errors) = t.requests("tcp", "10.99.0.1", 80, 5);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(answers, [("b2".to_string(), 5)], "the changed backend answers");

    let generation = t.host.status().generation;
    let written = Instant::now();
    std::fs::remove_file(t.host.opts.config_dir.join("zz-added.toml")).unwrap();
    let removed = wait_patched(&t, generation, written, "the removed service");
    // Nothing rewrites connections to 10.99.0.1 any more: they reach the
    // router's own 10.99.0.1, where nothing listens on port 80.
    let (answers, _, errors) = t.requests("tcp", "10.99.0.1", 80, 3);
    assert!(answers.is_empty(), "a removed service still answered: {answers:?}");
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(errors.iter().all(|e| e.contains("Connection refused")), "refused at once: {errors:?}");
    // A reload, and an edit made as it runs: the edit's own sync lands
    // before the reload's ends (its resync gives way to the edit, or runs
    // after it when both came in one burst), not with it at its end.
    let sync_lines = |text: &str| -> Vec<String> {
        text.lines().filter(|l| l.contains("msg=\"sync done\"")).map(String::from).collect()
    };
    let log = d.log_text();
    let (syncs_before, reloads) = (sync_lines(&log).len(), log.matches("reload requested").count());
    d.signal(nix::sys::signal::Signal::SIGHUP);
    hm_testkit::wait_soon("the reload requested", || d.log_text().matches("reload requested").count() > reloads)
        .unwrap_or_else(|e| panic!("{e}"));
    t.host.write("zz-added.toml", &one_service("192.168.10.11:8080"));
    let since = || sync_lines(&d.log_text()).split_off(syncs_before);
    hm_testkit::wait_soon("the reload's sync", || since().iter().any(|l| l.contains("full=true")))
        .unwrap_or_else(|e| panic!("{e}: {:#?}", since()));
    let syncs = since();
    let edit = syncs.iter().position(|l| l.contains(&format!("services={} ", n + 9)) && l.contains("full=false"));
    let reload = syncs.iter().position(|l| l.contains("full=true"));
    assert!(
        matches!((edit, reload), (Some(e), Some(r)) if e < r),
        "the edit's own sync, then the reload's: {syncs:#?}"
    );
    let (answers, _, errors) = t.requests("tcp", "10.99.0.1", 80, 3);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(answers, [("b1".to_string(), 3)], "the service added during the reload answers");
    eprintln!(
        "{n} services: READY in {:.2} s; add {} ms, change {} ms, remove {} ms (file written → synced)",
        ready.as_secs_f64(),
        added.as_millis(),
        changed.as_millis(),
        removed.as_millis()
    );
}

#[test]
fn a_file_past_the_service_capacity_is_rejected_alone_and_check_says_so() {
    let t = Topology::new("connect_time_lb = \"all\"\nservice_map_size = 1024");
    // services.toml has 8 services: 1,016 more fill the map.
    t.host.write("fleet.toml", &many_services(1016));
    t.host.write("zz-added.toml", &one_service("192.168.10.11:8080"));
    let _d = t.host.start_ready();
    let s = t.host.status();
    assert_eq!(s.counts.services, 1024, "the files before the overflowing one apply");
    let rejected: Vec<_> = s.files.iter().filter(|f| f.state != FileState::Applied).collect();
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert!(rejected[0].path.ends_with("zz-added.toml"), "{rejected:?}");
    let message: Vec<&str> = rejected[0].errors.iter().map(|e| e.text.as_str()).collect();
    let message = message.join("\n");
    assert!(
        message.contains("would make 1025 in all; the service map holds 1024 (raise [daemon] service_map_size)"),
        "{message}"
    );
    let (answers, _, errors) = t.requests("tcp", "10.100.3.247", 80, 3);
    assert!(errors.is_empty() && answers.len() == 1, "the last fitting service answers: {answers:?} {errors:?}");

    let check = t.host.check(&[]);
    let out = String::from_utf8_lossy(&check.stdout).into_owned() + &String::from_utf8_lossy(&check.stderr);
    assert_eq!(check.status.code(), Some(1), "check exits 1 for the overflowing file: {out}");
    assert!(out.contains("zz-added.toml") && out.contains("the service map holds 1024"), "{out}");
}
