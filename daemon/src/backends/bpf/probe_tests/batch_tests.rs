//! Map entries written and deleted in batches and one at a time (a kernel
//! without the batch commands, forced by leaving `map_batch` out of the
//! features): the maps hold the same afterwards, and an entry the kernel
//! refuses is reported as its own while the rest of its run is written.

use std::collections::BTreeMap;

use super::*;
use crate::model::{BpfMap, Feature, KernelFeatures, MapEntryKey, MapValue};

/// 1,400 services of three backends: Maglev chunks and backends past four
/// batches (1,024 entries) of each map, which several threads write at
/// once (`batch::update`); and a gateway's peers, whose map
/// (an LPM trie) some kernels write in batches and others (5.10) only
/// one entry at a time.
fn config() -> String {
    let mut s = String::from(
        "[daemon]\nconnect_time_lb = \"all\"\n[gateway]\nrole = \"gateway\"\nlocal_ip = \"198.51.100.1\"\nvni = 7\n\
         [[peer]]\nname = \"b\"\nendpoint = \"198.51.100.2\"\ncidrs = [\"10.20.0.0/16\", \"10.21.0.0/16\"]\n\
         [[peer]]\nname = \"c\"\nendpoint = \"198.51.100.3\"\ncidrs = [\"10.30.0.0/16\"]\n",
    );
    for i in 0..1400u32 {
        s += &format!(
            "[[service]]\nname = \"s{i}\"\nvip = \"10.96.{}.{}\"\nport = 80\nbackends = [\"192.168.{}.{}:8080\", \
             \"192.169.{}.{}:8080\", \"192.170.{}.{}:8080\"]\n",
            i >> 8,
            i & 255,
            i >> 8,
            i & 255,
            i >> 8,
            i & 255,
            i >> 8,
            i & 255,
        );
    }
    s
}

/// The probes loaded, nothing written, with `features` as the kernel's.
fn loaded(features: KernelFeatures) -> Probes {
    assert!(nix::unistd::geteuid().is_root(), "the probe tests load BPF programs: run them as root");
    own_netns();
    let dir = tempfile::tempdir().unwrap();
    let pins = dir.path().join("bpf");
    PinDir::new(&pins).prepare().unwrap();
    super::super::raise_memlock_limit();
    let mut bpf = PinnedBpf::new(&pins, features);
    bpf.prepare().unwrap();
    Probes { bpf, dir }
}

fn written_and_deleted(features: KernelFeatures) {
    let facts = HostFacts { netns_cookie: 1, features: features.clone(), ..Default::default() };
    let desired: Desired = crate::model::compile(&crate::config::from_text(&config()), &facts, &Prior::default());
    let mut p = loaded(features);
    let want: BTreeMap<&MapEntryKey, MapValue> = desired.map_entries.iter().map(|(k, v)| (k, v.spec.clone())).collect();
    let chunks = want.keys().filter(|k| k.map == BpfMap::Maglev).count();
    assert!(chunks > 4 * 1024, "more Maglev chunks than four batches hold: {chunks}");
    assert_eq!(want.keys().filter(|k| k.map == BpfMap::Peers).count(), 3, "the peers' CIDRs");

    let bytes: Vec<(&MapEntryKey, Vec<u8>)> = want.iter().map(|(k, v)| (*k, v.bytes().unwrap().into_owned())).collect();
    let puts: Vec<(&MapEntryKey, &[u8])> = bytes.iter().map(|(k, v)| (*k, &v[..])).collect();
    let failed = p.bpf.put_map_entries(&puts);
    assert!(failed.is_empty(), "{failed:?}");
    let have = p.bpf.map_entries().unwrap();
    assert_eq!(have.len(), want.len(), "every entry written, nothing else");
    for (k, v) in &want {
        assert_eq!(have.get(*k), Some(v), "{} entry {:?}", k.map.name(), k.key);
    }

    // Half the services' entries deleted, and keys that are not there.
    let mut gone: Vec<&MapEntryKey> = want.keys().copied().filter(|k| k.key[0] % 2 == 0).collect();
    let absent =
        MapEntryKey { map: BpfMap::Services, key: vec![0xee; BpfMap::Services.map().def().key_size as usize].into() };
    gone.insert(gone.len() / 2, &absent);
    let failed = p.bpf.delete_map_entries(&gone);
    assert!(failed.is_empty(), "a missing key is deleted already: {failed:?}");
    let have = p.bpf.map_entries().unwrap();
    for (k, v) in &want {
        let kept = (k.key[0] % 2 != 0).then_some(v);
        assert_eq!(have.get(*k), kept, "{} entry {:?}", k.map.name(), k.key);
    }
    assert_eq!(have.len(), want.len() - (gone.len() - 1));
}

#[test]
fn entries_go_in_and_out_in_batches() {
    std::thread::spawn(|| written_and_deleted(KernelFeatures::complete())).join().unwrap();
}

#[test]
fn entries_go_in_and_out_one_at_a_time_on_a_kernel_without_batches() {
    std::thread::spawn(|| written_and_deleted(KernelFeatures::lacking([Feature::MapBatch]))).join().unwrap();
}

/// HM_CONFIG has one entry: key 7 is past its end (E2BIG).
fn a_refused_entry_is_its_own(features: KernelFeatures) {
    let mut p = loaded(features);
    let size = BpfMap::Config.map().def().value_size as usize;
    let key = |i: u32| MapEntryKey { map: BpfMap::Config, key: i.to_ne_bytes().to_vec().into() };
    let (good, bad, value) = (key(0), key(7), vec![1u8; size]);
    let run: Vec<(&MapEntryKey, &[u8])> = vec![(&bad, &value), (&good, &value), (&bad, &value)];
    let failed = p.bpf.put_map_entries(&run);
    let at: Vec<usize> = failed.iter().map(|(i, _)| *i).collect();
    assert_eq!(at, [0, 2]);
    assert!(failed[0].1.to_string().contains("update HM_CONFIG"), "{}", failed[0].1);
    let have = p.bpf.map_entries().unwrap();
    let written = MapValue::from(value);
    assert_eq!(have.get(&good), Some(&written), "the good entry between the bad ones is written");
}

#[test]
fn an_entry_the_kernel_refuses_is_reported_alone_and_the_rest_of_its_run_is_written() {
    std::thread::spawn(|| a_refused_entry_is_its_own(KernelFeatures::complete())).join().unwrap();
    std::thread::spawn(|| a_refused_entry_is_its_own(KernelFeatures::lacking([Feature::MapBatch]))).join().unwrap();
}
