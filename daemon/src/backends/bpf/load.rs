//! The loader owns the probe objects and the pinned maps: it loads the
//! objects against the pins when they are this build's layout (adopted),
//! resizes or replaces them when not (each map created at its configured
//! size), verifies each program once, and hands out the maps and
//! programs by their typed names. Loading is lazy: a host with nothing
//! configured gets no BPF state at all, and a program is verified only
//! when it is attached or compared with an attached one (the veth path's
//! two largest take the verifier 30 ms each, for nothing on a host whose
//! services are all balanced at connect time). A sync that will need the
//! probes starts their load ahead (`preload`), on a thread of its own,
//! with the programs it will likely attach verified there too, while it
//! compiles; the first use waits for it.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::thread::JoinHandle;

use aya::{Ebpf, EbpfLoader};

use super::pins::{unpin, PinDir};
use super::sys::{self, ProgInfo};
use super::verify::{self, load_program};
use super::{bpf_err, chain, create, objects, resize};
use crate::abi::{HmMap, MapDef, ProbeObject};
use crate::backends::{BackendError, MapSizes, Result};
use crate::model::{KernelFeatures, Program};

pub(super) struct Loader {
    pub(super) pins: PinDir,
    features: KernelFeatures,
    pub(super) sizes: MapSizes,
    loaded: Option<Loaded>,
    /// A load `preload` started, and whether maps were pinned when it did
    /// (if not, what it loads is new and empty, and reading the maps need
    /// not wait for it).
    pending: Option<(Preloading, bool)>,
    /// Why the preload failed, for the first use to report.
    preload_failed: Option<BackendError>,
    /// The objects' loader, made ahead (`Warm::start`).
    warm: Option<Warm>,
    /// Whether sk_lookup programs load here (probed once, without pins).
    sk_lookup: Option<Option<String>>,
    /// Pinned maps that did not match this build's layout and were
    /// replaced, as sentences for the log.
    notes: Vec<String>,
}

/// A preload's thread: what it loaded (or why not), and its notes.
type Preloading = JoinHandle<(Result<Loaded>, Vec<String>)>;

/// A thread making the objects' loader and the programs' marks, work no
/// configuration changes: making a loader parses the kernel's BTF
/// (/sys/kernel/btf/vmlinux, 5 MiB), 40 ms here and 2 to 3 s of a CPU
/// in the emulated VMs. The daemon starts it first, so that it is done
/// while the kernel is probed and the configuration read.
pub(crate) struct Warm(JoinHandle<EbpfLoader<'static>>);

impl Warm {
    /// Starts the thread (`None` if none could be made: the load makes
    /// its loader then).
    pub(crate) fn start() -> Option<Warm> {
        let spawned = std::thread::Builder::new().name("hm-bpf-warm".into()).spawn(|| {
            objects::mark_of(crate::abi::ProbeObject::Mesh);
            EbpfLoader::new()
        });
        spawned.ok().map(Warm)
    }
}

/// The loader `warm` made, or a new one.
fn loader_from(warm: Option<Warm>) -> EbpfLoader<'static> {
    warm.and_then(|t| t.0.join().ok()).unwrap_or_default()
}

pub(super) struct Loaded {
    /// Each object as its programs name it (`Program::object`).
    objects: BTreeMap<ProbeObject, Ebpf>,
    /// Our loaded copy of each program verified so far: its tag and maps
    /// say whether what is attached is this build's program.
    programs: BTreeMap<Program, ProgInfo>,
    maps: BTreeMap<HmMap, OwnedFd>,
    /// The ids of `maps`. A program's other maps are its object's own
    /// constants (`.rodata*`), created anew by every load: comparing
    /// programs, only these count.
    pinned_ids: BTreeSet<u32>,
    /// Maps a resize replaced, until `finish_migration`.
    retired: Vec<resize::Retired>,
}

impl Loader {
    pub(super) fn new(pins: PinDir, features: KernelFeatures) -> Self {
        Loader {
            pins,
            features,
            sizes: MapSizes::default(),
            loaded: None,
            pending: None,
            preload_failed: None,
            warm: None,
            sk_lookup: None,
            notes: Vec::new(),
        }
    }

    /// Takes the loader `warm` is making, for the first load. A
    /// configuration without services lets it go (`cool_down`).
    pub(super) fn warmed(&mut self, warm: Option<Warm>) {
        self.warm = warm;
    }

    /// Lets what `warmed` gave go: nothing will be loaded.
    pub(super) fn cool_down(&mut self) {
        if let Some(t) = self.warm.take() {
            let _ = t.0.join();
        }
    }

    /// Whether nothing `warmed` gave waits to be used (tests).
    #[cfg(test)]
    pub(super) fn warm_taken(&self) -> bool {
        self.warm.is_none()
    }

    /// Starts loading the probes on a thread of its own unless they are
    /// loaded or loading, verifying `likely` (the programs the caller
    /// expects to attach) there too: the caller will need them, and has
    /// other work to do meanwhile (a first sync compiles 100,000 services
    /// for as long as the load takes). Their first use waits for the load.
    pub(super) fn preload(&mut self, likely: &BTreeSet<Program>) {
        if self.loaded.is_some() || self.pending.is_some() {
            return;
        }
        let over_pins = self.has_pins();
        let (pins, features, sizes, likely) = (self.pins.clone(), self.features.clone(), self.sizes, likely.clone());
        let warm = self.warm.take();
        let spawned = std::thread::Builder::new().name("hm-bpf-load".into()).spawn(move || {
            let mut notes = Vec::new();
            let loaded = load(&pins, &features, &sizes, &mut notes, warm).and_then(|mut loaded| {
                loaded.verify_all(&likely)?;
                Ok(loaded)
            });
            (loaded, notes)
        });
        // Without a thread the first use loads, as without a preload.
        self.pending = spawned.ok().map(|thread| (thread, over_pins));
    }

    /// Waits for a preload and keeps what it loaded, or why it failed.
    fn settle(&mut self) {
        let Some((pending, _)) = self.pending.take() else { return };
        match pending.join() {
            Ok((loaded, notes)) => {
                self.notes.extend(notes);
                match loaded {
                    Ok(loaded) => self.loaded = Some(loaded),
                    Err(e) => self.preload_failed = Some(e),
                }
            }
            Err(_) => self.preload_failed = Some(bpf_err("load the probes", "the loading thread panicked")),
        }
    }

    pub(super) fn features(&self) -> &KernelFeatures {
        &self.features
    }

    /// Whether anything is pinned (nothing to observe otherwise).
    pub(super) fn has_pins(&self) -> bool {
        HmMap::pinned().any(|m| self.pins.map(m).exists())
            || !self.pins.link_names().unwrap_or_default().is_empty()
            || !self.pins.prog_names().unwrap_or_default().is_empty()
    }

    /// Whether the maps exist, loaded or pinned: the runtime maps' owners
    /// have nothing to do before. A preload that started with nothing
    /// pinned creates new, empty maps: none exist for them yet (the pins
    /// it is making are not looked at).
    pub(super) fn any(&self) -> bool {
        match self.pending {
            Some((_, over_pins)) => over_pins,
            None => self.loaded.is_some() || self.has_pins(),
        }
    }

    /// The size the maps of `c` have: `sizes`' while loaded or loading,
    /// else the pinned one's (a restart's), `None` when none exists.
    pub(super) fn current_size(&self, c: crate::abi::Capacity) -> Option<u32> {
        let loading = self.loaded.is_some() || self.pending.is_some();
        if loading {
            Some(self.sizes.get(c))
        } else {
            self.pins.capacity_of(c)
        }
    }

    /// Drops what is loaded: the next use loads again (new sizes).
    /// Returns whether anything was loaded.
    pub(super) fn unload(&mut self) -> bool {
        self.settle();
        self.preload_failed = None;
        self.loaded.take().is_some()
    }

    pub(super) fn take_notes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notes)
    }

    pub(super) fn map_fd(&mut self, map: HmMap) -> Result<&OwnedFd> {
        let loaded = self.ensure_loaded()?;
        loaded.maps.get(&map).ok_or_else(|| bpf_err(format!("open {map}"), "not among the loaded maps"))
    }

    /// `map_fd`, a descriptor of its own (to use beside another map).
    pub(super) fn map_fd_owned(&mut self, map: HmMap) -> Result<OwnedFd> {
        self.map_fd(map)?.try_clone().map_err(|e| bpf_err(format!("open {map}"), e))
    }

    /// Entry 0 of a config array map; None if it was never written (an
    /// array entry never written reads as zeros).
    pub(super) fn config_entry<T: crate::abi::Pod>(&mut self, map: HmMap) -> Result<Option<T>> {
        let fd = self.map_fd(map)?;
        let mut value = vec![0u8; std::mem::size_of::<T>()];
        let found = sys::map_lookup(fd.as_fd(), &0u32.to_ne_bytes(), &mut value)
            .map_err(|e| bpf_err(format!("read {map}"), e))?;
        Ok(if found && value.iter().any(|b| *b != 0) { T::from_bytes(&value) } else { None })
    }

    /// This build's copy of `program`: its id, tag and maps (verified
    /// now if it was not yet).
    pub(super) fn program_info(&mut self, program: Program) -> Result<ProgInfo> {
        let loaded = self.ensure_loaded()?;
        loaded.verify(program)?;
        loaded.programs.get(&program).cloned().ok_or_else(|| bpf_err(program.name(), "the program is not loaded"))
    }

    /// The ids of the pinned maps: of a program's maps, only these say
    /// whose it is.
    pub(super) fn pinned_ids(&mut self) -> Result<BTreeSet<u32>> {
        Ok(self.ensure_loaded()?.pinned_ids.clone())
    }

    /// The program's loaded object, the program verified, to attach it.
    pub(super) fn object_of(&mut self, program: Program) -> Result<&mut Ebpf> {
        let loaded = self.ensure_loaded()?;
        loaded.verify(program)?;
        loaded.objects.get_mut(&program.object()).ok_or_else(|| bpf_err(program.name(), "its object is not loaded"))
    }

    /// Why sk_lookup programs cannot be used here, if they cannot.
    pub(super) fn sk_lookup_unavailable(&mut self) -> Option<String> {
        self.sk_lookup.get_or_insert_with(probe_sk_lookup).clone()
    }

    /// Unpins every map: teardown. Says what it did, a line each.
    pub(super) fn unpin_maps(&mut self) -> io::Result<Vec<String>> {
        self.settle();
        self.loaded = None;
        let mut removed = Vec::new();
        for map in HmMap::pinned() {
            let p = self.pins.map(map);
            if p.exists() {
                unpin(&p)?;
                removed.push(format!("unpinned map {map}"));
            }
        }
        for p in self.pins.retired_maps() {
            unpin(&p)?;
            removed.push(format!("unpinned map {} (an earlier build's)", p.display()));
        }
        Ok(removed)
    }

    /// After a sync that attached this build's programs: copies the flows
    /// that the programs they replaced kept writing into maps retired by a
    /// resize, then lets those maps go.
    pub(super) fn finish_migration(&mut self) -> Result<Vec<String>> {
        self.settle();
        let Some(loaded) = self.loaded.as_mut() else { return Ok(Vec::new()) };
        let mut notes = Vec::new();
        for r in std::mem::take(&mut loaded.retired) {
            if !resize::written_by_programs(&r.def) {
                continue;
            }
            let new =
                loaded.maps.get(&r.def.map).ok_or_else(|| bpf_err(format!("open {}", r.def.name), "not loaded"))?;
            let copied = r
                .copy_into(new.as_fd(), true)
                .map_err(|e| bpf_err(format!("copy late flows of {} into its new map", r.def.name), e))?;
            if copied.copied > 0 {
                notes.push(format!(
                    "map {}: {} flows the replaced programs wrote during the resize were copied",
                    r.def.name, copied.copied
                ));
            }
        }
        Ok(notes)
    }

    fn ensure_loaded(&mut self) -> Result<&mut Loaded> {
        self.settle();
        if let Some(e) = self.preload_failed.take() {
            return Err(e);
        }
        if self.loaded.is_none() {
            let warm = self.warm.take();
            self.loaded = Some(load(&self.pins, &self.features, &self.sizes, &mut self.notes, warm)?);
        }
        Ok(self.loaded.as_mut().expect("just loaded"))
    }

    /// A map whose pin someone removed lives on while the daemon holds it:
    /// pin it again, so a restart adopts it instead of starting empty.
    pub(super) fn repin_missing_maps(&mut self) -> Result<()> {
        let Some(loaded) = &self.loaded else { return Ok(()) };
        for (map, fd) in &loaded.maps {
            let path = self.pins.map(*map);
            if !path.exists() {
                sys::obj_pin(fd.as_fd(), &path).map_err(|e| bpf_err(format!("pin {}", path.display()), e))?;
                self.notes.push(format!("map {map} had lost its pin {}; pinned it again", path.display()));
            }
        }
        Ok(())
    }
}

/// Loads the probe objects against the pins in `pins`, each map at the
/// size `sizes` gives it, with the loader `warm` makes (or a new one);
/// repairs made on the way go to `notes`.
fn load(
    pins: &PinDir,
    features: &KernelFeatures,
    sizes: &MapSizes,
    notes: &mut Vec<String>,
    warm: Option<Warm>,
) -> Result<Loaded> {
    let _held = super::held_signals::HeldSignals::new();
    pins.ensure().map_err(|e| bpf_err(format!("prepare {}", pins.root.display()), e))?;
    // Every map as the configuration sizes it: a pin of another size
    // is retired, and new maps are created at this size.
    let defs: Vec<MapDef> = HmMap::pinned().map(|m| objects::sized(m, sizes)).collect();
    let mut retired = Vec::new();
    for def in &defs {
        retired.extend(resize::retire_incompatible(pins, def, notes)?);
    }
    for p in pins.retired_maps() {
        unpin(&p).map_err(|e| bpf_err(format!("unpin {}", p.display()), e))?;
        notes.push(format!("map {} is not used by this build; unpinned it", p.display()));
    }

    let mut objects = BTreeMap::new();
    let loaded = objects::loaded_objects(features);
    // One loader for every object: each new one parses the kernel's
    // BTF (/sys/kernel/btf/vmlinux, 5 MiB) again, a tenth of a start; it
    // does so while the maps are created.
    let (mut loader, created) = create::missing_beside(pins, &defs, || loader_from(warm));
    created?;
    for def in &defs {
        loader.map_pin_path(def.name, pins.map(def.map));
        loader.map_max_entries(def.name, def.max_entries);
    }
    for (role, variant) in loaded {
        let mark = objects::mark_of(variant).ok_or_else(|| bpf_err(format!("load {variant:?}"), "no build mark"))?;
        let bytes = objects::bytes(variant);
        let source = format!("probes/{} ({})", variant.def().source, variant.def().name);
        loader.override_global("hm_build_mark", mark, true);
        let ebpf = loader.load(bytes).map_err(|e| bpf_err(format!("load {source}"), chain(&e)))?;
        objects.insert(role, ebpf);
    }
    let mut maps = BTreeMap::new();
    for map in HmMap::pinned() {
        let fd = sys::obj_get(&pins.map(map)).map_err(|e| bpf_err(format!("open pinned map {map}"), e))?;
        maps.insert(map, fd);
    }
    let pinned_ids = maps
        .iter()
        .map(|(name, fd)| sys::map_info(fd.as_fd()).map(|i| i.id).map_err(|e| bpf_err(format!("info of {name}"), e)))
        .collect::<Result<_>>()?;
    // Resized maps are filled before any program of this build uses
    // them (the sync attaches those later).
    for r in &retired {
        let new = maps.get(&r.def.map).ok_or_else(|| bpf_err(format!("open {}", r.def.name), "not loaded"))?;
        let copied =
            r.copy_into(new.as_fd(), false).map_err(|e| bpf_err(format!("copy {} into its new map", r.def.name), e))?;
        let what = if r.old_value_size != r.def.value_size {
            format!(
                "map {} migrated from values of {} to {} bytes ({} to {} entries)",
                r.def.name, r.old_value_size, r.def.value_size, r.old_entries, r.def.max_entries
            )
        } else {
            format!("map {} resized from {} to {} entries", r.def.name, r.old_entries, r.def.max_entries)
        };
        notes.push(format!(
            "{what}: {} entries copied{}",
            copied.copied,
            if copied.skipped > 0 { format!(", {} did not fit", copied.skipped) } else { String::new() }
        ));
    }
    Ok(Loaded { objects, programs: BTreeMap::new(), maps, pinned_ids, retired })
}

impl Loaded {
    /// Verifies `program` (loads it into the kernel) unless it is.
    fn verify(&mut self, program: Program) -> Result<()> {
        self.verify_all(&BTreeSet::from([program]))
    }

    /// Verifies each of `wanted` not verified yet, side by side
    /// (`verify::side_by_side`).
    fn verify_all(&mut self, wanted: &BTreeSet<Program>) -> Result<()> {
        let todo: Vec<Program> = wanted.iter().filter(|p| !self.programs.contains_key(p)).copied().collect();
        if let Some(p) = todo.iter().find(|p| !self.objects.contains_key(&p.object())) {
            return Err(bpf_err(p.name(), "its object is not loaded"));
        }
        let mut jobs = Vec::with_capacity(todo.len());
        for (role, ebpf) in self.objects.iter_mut() {
            jobs.extend(ebpf.programs_mut().filter_map(|(name, prog)| {
                todo.iter().find(|p| p.object() == *role && p.name() == name).map(|p| (*p, prog))
            }));
        }
        if let Some(p) = todo.iter().find(|p| !jobs.iter().any(|(j, _)| j == *p)) {
            return Err(bpf_err(format!("load program {}", p.name()), "not in the object"));
        }
        // Every program that passed is kept (aya refuses to load one
        // twice), then the first failure is reported.
        let mut failed = Ok(());
        for (p, info) in verify::side_by_side(jobs) {
            match info {
                Ok(info) => {
                    self.programs.insert(p, info);
                }
                Err(e) => failed = failed.and(Err(e)),
            }
        }
        failed
    }
}

/// Loads the mesh object alone, with throwaway maps, to learn whether
/// this kernel runs sk_lookup programs.
fn probe_sk_lookup() -> Option<String> {
    let _held = super::held_signals::HeldSignals::new();
    let mut loader = EbpfLoader::new();
    let small = crate::config::Capacity::Mesh.key().min;
    for map in HmMap::ALL.into_iter().filter(|m| m.def().sized_by == Some(crate::config::Capacity::Mesh)) {
        loader.map_max_entries(map.name(), small);
    }
    match loader.load(objects::bytes(ProbeObject::Mesh)) {
        Ok(mut ebpf) => load_program(&mut ebpf, Program::Mesh).err().map(|e| e.to_string()),
        Err(e) => Some(chain(&e)),
    }
}

/// A descriptor of this build's copy of `program`.
pub(super) fn program_fd(loader: &mut Loader, program: Program) -> Result<aya::programs::ProgramFd> {
    let ebpf = loader.object_of(program)?;
    let fd = match ebpf.program(program.name()) {
        Some(aya::programs::Program::SchedClassifier(p)) => p.fd().map_err(|e| bpf_err(program.name(), chain(&e)))?,
        Some(aya::programs::Program::CgroupSockAddr(p)) => p.fd().map_err(|e| bpf_err(program.name(), chain(&e)))?,
        Some(aya::programs::Program::SkLookup(p)) => p.fd().map_err(|e| bpf_err(program.name(), chain(&e)))?,
        Some(aya::programs::Program::CgroupSock(p)) => p.fd().map_err(|e| bpf_err(program.name(), chain(&e)))?,
        _ => return Err(bpf_err(program.name(), "not loaded")),
    };
    fd.try_clone().map_err(|e| bpf_err(program.name(), e))
}
