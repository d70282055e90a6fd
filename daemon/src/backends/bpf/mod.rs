//! The BPF backend, two owners and the runtime maps' keepers:
//!
//! - the loader (`load.rs`) owns the probe objects and the maps pinned
//!   under hostmesh's bpffs dir (adopted on restart, checked for layout
//!   first, resized without losing flows); it loads lazily, so a host with
//!   nothing configured gets no BPF state at all;
//! - the hooks (`hooks.rs`) own where programs run: pinned bpf links
//!   (cgroups, the netns, TCX) or clsact filters (`tc.rs`, kernels without
//!   TCX), each judged this build's or not;
//! - the maps the probes write have one keeper each, which alone deletes
//!   from them: conntrack's sweep (`conntrack.rs`), the flows of backends
//!   that left (`flows_drop.rs`), affinity (`affinity.rs`), traffic
//!   counters (`stats_prune.rs`).
//!
//! `PinnedBpf` joins them behind the reconciler's `BpfBackend`; the
//! reconciler writes every map the configuration fills, byte for byte.

mod affinity;
pub mod asm;
pub(crate) mod attached;
mod batch;
mod conntrack;
mod create;
pub(crate) mod features;
mod flows_drop;
mod held_signals;
mod hooks;
pub(crate) use hooks::cgroup_dir_problem;
pub(crate) mod inspect;
mod load;
pub(crate) mod netns_cookie;
pub mod objects;
pub(crate) use load::Warm;
pub(crate) mod pins;
#[cfg(test)]
mod probe_tests;
mod resize;
mod stats_prune;
pub mod sys;
mod tc;
pub(crate) mod traffic;
mod verify;

use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use self::batch::{Batching, Written};
use self::hooks::Hooks;
use self::load::Loader;
use self::pins::PinDir;
use super::{BackendError, BpfBackend, BpfSettings, Result, Sweep};
use crate::abi::HmMap;
use crate::model::*;

pub(crate) struct PinnedBpf {
    maps: Loader,
    hooks: Hooks,
    /// How map entries are written: in batches where the kernel has the
    /// batch commands (`Feature::MapBatch`), but not to the maps whose
    /// type refused them.
    batching: Batching,
    batch_refused: std::collections::BTreeSet<BpfMap>,
}

fn bpf_err(op: impl Into<String>, detail: impl ToString) -> BackendError {
    BackendError::Bpf { op: op.into(), detail: detail.to_string() }
}

/// aya errors nest their cause (the verifier log among them); show it all.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

/// Kernels before 5.11 charge BPF maps and programs to RLIMIT_MEMLOCK;
/// systemd's unit lifts it (LimitMEMLOCK=infinity), and so does this when
/// hostmesh runs by hand. Where the hard limit may not be raised, the soft
/// one goes up to it.
pub fn raise_memlock_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource, RLIM_INFINITY};
    if setrlimit(Resource::RLIMIT_MEMLOCK, RLIM_INFINITY, RLIM_INFINITY).is_err() {
        if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_MEMLOCK) {
            let _ = setrlimit(Resource::RLIMIT_MEMLOCK, hard, hard);
        }
    }
}

impl PinnedBpf {
    pub(crate) fn new(dir: &Path, features: KernelFeatures) -> Self {
        let pins = PinDir::new(dir);
        let batching = if features.has(Feature::MapBatch) { Batching::Batched } else { Batching::OneAtATime };
        let maps = Loader::new(pins.clone(), features);
        PinnedBpf { hooks: Hooks::new(pins, &maps), maps, batching, batch_refused: Default::default() }
    }

    /// With the objects' loader `warm` is making (`Warm::start`, at the
    /// daemon's start, before the kernel is probed).
    pub(crate) fn warmed(mut self, warm: Option<Warm>) -> Self {
        self.maps.warmed(warm);
        self
    }

    /// Writes or deletes the entries of `keys`, a run of one map each
    /// (split where the map changes), with `write`; failures by index in
    /// `keys`.
    fn in_runs(
        &mut self,
        keys: &[&MapEntryKey],
        op: &str,
        mut write: impl FnMut(&crate::abi::MapDef, BorrowedFd<'_>, std::ops::Range<usize>, Batching) -> Written,
    ) -> Vec<(usize, BackendError)> {
        let mut failed = Vec::new();
        let mut from = 0;
        for run in keys.chunk_by(|a, b| a.map == b.map) {
            let (map, range) = (run[0].map, from..from + run.len());
            from += run.len();
            let how = if self.batch_refused.contains(&map) { Batching::OneAtATime } else { self.batching };
            let written = match self.maps.map_fd(map.map()) {
                Ok(fd) => write(map.map().def(), fd.as_fd(), range.clone(), how),
                Err(e) => {
                    failed.extend(range.map(|i| (i, bpf_err(format!("{op} {}", map.name()), &e))));
                    continue;
                }
            };
            if written.batch_refused {
                self.batch_refused.insert(map);
            }
            let op = |e: std::io::Error| bpf_err(format!("{op} {}", map.name()), e);
            failed.extend(written.failed.into_iter().map(|(i, e)| (range.start + i, op(e))));
        }
        failed
    }

    /// Removes hostmesh's clsact filters (and the qdiscs it added, when
    /// nothing else is on them), unpins everything, removes the pin dir
    /// and drops loaded objects: `hostmesh teardown`.
    pub(crate) fn remove_all(&mut self) -> Result<Vec<String>> {
        let mut removed = self.hooks.remove_all()?;
        let root = self.maps.pins.root.clone();
        removed.extend(self.maps.unpin_maps().map_err(|e| bpf_err(format!("remove pins in {}", root.display()), e))?);
        if root.exists() {
            removed.extend(self.maps.pins.remove().map_err(|e| bpf_err("remove the pin dir", e))?);
        }
        Ok(removed)
    }
}

/// Arrays hold every key: an all-zero value is an unset entry.
pub(super) fn is_array(def: &crate::abi::MapDef) -> bool {
    use aya_obj::generated::bpf_map_type::{BPF_MAP_TYPE_ARRAY, BPF_MAP_TYPE_PERCPU_ARRAY};
    [BPF_MAP_TYPE_ARRAY as u32, BPF_MAP_TYPE_PERCPU_ARRAY as u32].contains(&def.map_type)
}

impl BpfBackend for PinnedBpf {
    fn prepare(&mut self) -> Result<()> {
        self.maps.map_fd(HmMap::Config).map(|_| ())
    }

    fn cool_down(&mut self) {
        self.maps.cool_down();
    }

    fn preload(&mut self, likely: &std::collections::BTreeSet<crate::model::Program>) {
        self.maps.preload(likely);
    }

    fn take_notes(&mut self) -> Vec<String> {
        self.maps.take_notes()
    }

    fn warnings(&self) -> Vec<String> {
        self.hooks.warnings()
    }

    fn map_entries(&mut self) -> Result<BTreeMap<MapEntryKey, MapValue>> {
        Ok(self.map_entries_until(&|| false)?.expect("never gives up"))
    }

    fn map_entries_each_until(
        &mut self,
        give_up: &dyn Fn() -> bool,
        each: &mut crate::backends::MapEntriesSink<'_>,
    ) -> Result<bool> {
        if !self.maps.any() {
            return Ok(true);
        }
        self.maps.repin_missing_maps()?;
        for map in BpfMap::ALL {
            if give_up() {
                return Ok(false);
            }
            let def = map.map().def();
            let fd = self.maps.map_fd(map.map())?;
            // The kernel hands a hash map's entries in hash order.
            let mut entries = Vec::new();
            let whole = sys::map_for_each_until(
                fd.as_fd(),
                def.key_size as usize,
                def.value_size as usize,
                |key, value| {
                    // An array always has every key; all-zero values are unset.
                    if is_array(def) && value.iter().all(|b| *b == 0) {
                        return;
                    }
                    entries.push((MapEntryKey { map, key: key.into() }, MapValue::read_back(map, value.to_vec())));
                },
                give_up,
            )
            .map_err(|e| bpf_err(format!("read map {}", def.name), e))?;
            if !whole {
                return Ok(false);
            }
            entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            each(entries);
        }
        Ok(true)
    }

    // One entry is a run of one: the same writes, the same errors.
    fn put_map_entry(&mut self, key: &MapEntryKey, value: &[u8]) -> Result<()> {
        self.put_map_entries(&[(key, value)]).pop().map_or(Ok(()), |(_, e)| Err(e))
    }

    fn delete_map_entry(&mut self, key: &MapEntryKey) -> Result<()> {
        self.delete_map_entries(&[key]).pop().map_or(Ok(()), |(_, e)| Err(e))
    }

    fn put_map_entries(&mut self, entries: &[(&MapEntryKey, &[u8])]) -> Vec<(usize, BackendError)> {
        let keys: Vec<&MapEntryKey> = entries.iter().map(|e| e.0).collect();
        self.in_runs(&keys, "update", |_, fd, range, how| {
            let run: Vec<(&[u8], &[u8])> = entries[range].iter().map(|(k, v)| (&k.key[..], *v)).collect();
            batch::update(fd, &run, how)
        })
    }

    fn delete_map_entries(&mut self, keys: &[&MapEntryKey]) -> Vec<(usize, BackendError)> {
        self.in_runs(keys, "delete from", |def, fd, range, how| {
            let run: Vec<&[u8]> = keys[range].iter().map(|k| &k.key[..]).collect();
            if is_array(def) {
                // An array's entry is deleted by zeroing it.
                let zeros = vec![0u8; def.value_size as usize];
                batch::update(fd, &run.iter().map(|k| (*k, &zeros[..])).collect::<Vec<_>>(), how)
            } else {
                batch::delete(fd, &run, how)
            }
        })
    }

    fn attachments(&mut self) -> Result<BTreeMap<Attachment, AttachStatus>> {
        self.hooks.attachments(&mut self.maps)
    }

    fn present(&mut self) -> Result<std::collections::BTreeSet<Attachment>> {
        self.hooks.present()
    }

    fn attach(&mut self, a: &Attachment) -> Result<()> {
        self.hooks.attach(&mut self.maps, a)
    }

    fn detach(&mut self, a: &Attachment) -> Result<()> {
        self.hooks.detach(a)
    }

    fn expire_flows(&mut self) -> Result<Sweep> {
        conntrack::sweep(&mut self.maps)
    }

    fn drop_flows(&mut self, stopped: &[crate::backends::StoppedBackend]) -> Result<crate::backends::Forgotten> {
        flows_drop::drop_flows(&mut self.maps, stopped)
    }

    fn prune_affinity(
        &mut self,
        serving: &BTreeMap<crate::abi::SvcKey, std::collections::BTreeSet<std::net::SocketAddr>>,
    ) -> Result<usize> {
        affinity::prune_entries(&mut self.maps, serving)
    }

    fn prune_backend_stats(&mut self, configured: crate::backends::ConfiguredPairs<'_>) -> Result<usize> {
        stats_prune::prune_stats(&mut self.maps, configured)
    }

    fn configure(&mut self, settings: &BpfSettings) -> Result<bool> {
        let tc_mode = TcAttach::choose(settings.tc_attach, self.maps.features());
        // Another TC mode: the next (full) sync observes every hook anew
        // and moves each one over.
        let moved = tc_mode != self.hooks.tc_mode;
        self.hooks.tc_mode = tc_mode;
        let sizes = settings.sizes.to_create(settings.unused, |c| self.maps.current_size(c));
        if sizes == self.maps.sizes {
            return Ok(moved);
        }
        self.maps.sizes = sizes;
        // Reload at next use: maps of the old size are retired and the
        // programs, now using other maps, show as outdated and are swapped.
        Ok(self.maps.unload() || self.maps.has_pins() || moved)
    }

    fn map_sizes(&self) -> Option<crate::backends::MapSizes> {
        Some(self.maps.sizes)
    }

    fn sk_lookup_unavailable(&mut self) -> Option<String> {
        self.maps.sk_lookup_unavailable()
    }

    fn finish_migration(&mut self) -> Result<Vec<String>> {
        self.maps.finish_migration()
    }
}
