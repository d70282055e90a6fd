//! The BPF backend: maps pinned under hostmesh's bpffs dir (adopted on
//! restart, checked for layout first), programs attached through pinned
//! bpf links (cgroups, the netns) or at TC hooks (`tc.rs`: TCX links, or
//! clsact filters where the kernel has no TCX), and byte-level map access
//! for the reconciler.
//!
//! The objects are loaded lazily, the first time a map or program is
//! needed: a host with nothing configured gets no BPF state at all.

mod affinity;
pub mod asm;
pub(crate) mod attached;
mod conntrack;
pub(crate) mod features;
mod flows_drop;
pub(crate) mod inspect;
mod load;
pub(crate) mod netns_cookie;
pub mod objects;
pub(crate) mod pins;
mod resize;
mod stats_prune;
pub mod sys;
mod tc;
pub(crate) mod traffic;

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use aya::programs::links::FdLink;
use aya::programs::CgroupAttachMode;
use aya::{Ebpf, EbpfLoader};

use self::load::program_fd;
use self::pins::{unpin, PinDir};
use self::sys::ProgInfo;
use super::ifaces;
use super::netlink::RouteSocket;
use super::{BackendError, BpfBackend, BpfSettings, MapSizes, Result, Sweep};
use crate::abi::{HmMap, ProbeObject};
use crate::model::*;

pub(crate) struct PinnedBpf {
    pins: PinDir,
    features: KernelFeatures,
    sizes: MapSizes,
    /// How TC programs are attached (TCX, or clsact filters).
    tc_mode: TcAttach,
    /// rtnetlink for clsact filters, opened when first needed.
    tc_sock: Option<RouteSocket>,
    loaded: Option<Loaded>,
    /// Whether sk_lookup programs load here (probed once, without pins).
    sk_lookup: Option<Option<String>>,
    /// Pinned maps that did not match this build's layout and were
    /// replaced, as sentences for the log.
    pub(crate) notes: Vec<String>,
}

struct Loaded {
    /// Each object as its programs name it (`Program::object`).
    objects: BTreeMap<ProbeObject, Ebpf>,
    /// Our loaded copy of each program: its tag and maps say whether what
    /// is attached is this build's program.
    programs: BTreeMap<Program, ProgInfo>,
    maps: BTreeMap<HmMap, OwnedFd>,
    /// The ids of `maps`. A program's other maps are its object's own
    /// constants (`.rodata*`), created anew by every load: comparing
    /// programs, only these count.
    pinned_ids: std::collections::BTreeSet<u32>,
    /// Maps a resize replaced, until `finish_migration`.
    retired: Vec<resize::Retired>,
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
        PinnedBpf {
            pins: PinDir::new(dir),
            tc_mode: TcAttach::choose(TcAttachPref::default(), &features),
            features,
            sizes: MapSizes::default(),
            tc_sock: None,
            loaded: None,
            sk_lookup: None,
            notes: Vec::new(),
        }
    }

    /// Whether anything is pinned (nothing to observe otherwise).
    fn has_pins(&self) -> bool {
        HmMap::pinned().any(|m| self.pins.map(m).exists())
            || !self.pins.link_names().unwrap_or_default().is_empty()
            || !self.pins.prog_names().unwrap_or_default().is_empty()
    }

    fn map_fd(&mut self, map: HmMap) -> Result<&OwnedFd> {
        let loaded = self.ensure_loaded()?;
        loaded.maps.get(&map).ok_or_else(|| bpf_err(format!("open {map}"), "not among the loaded maps"))
    }

    /// `map_fd`, a descriptor of its own (to use beside another map).
    fn map_fd_owned(&mut self, map: HmMap) -> Result<OwnedFd> {
        self.map_fd(map)?.try_clone().map_err(|e| bpf_err(format!("open {map}"), e))
    }

    /// Is the pinned link for `a` attached where it should be, running
    /// this build's program with this build's maps?
    fn link_status(&mut self, a: &Attachment, pin: &Path) -> Result<AttachStatus> {
        let fd = sys::obj_get(pin).map_err(|e| bpf_err(format!("open pinned link {}", pin.display()), e))?;
        let info = sys::link_info(fd.as_fd()).map_err(|e| bpf_err(format!("info of {}", pin.display()), e))?;
        let attached = link_in_place(&a.hook, &info);
        if !attached {
            return Ok(AttachStatus::Defunct);
        }
        self.program_status(a, info.prog_id, &pin.display().to_string())
    }

    /// Is program `prog_id`, attached at `a` (by the link or filter named
    /// `what`), this build's program with this build's maps?
    fn program_status(&mut self, a: &Attachment, prog_id: u32, what: &str) -> Result<AttachStatus> {
        let loaded = self.ensure_loaded()?;
        let want = loaded
            .programs
            .get(&a.program)
            .cloned()
            .ok_or_else(|| bpf_err(format!("check {a}"), "the program is not loaded"))?;
        let ours = loaded.pinned_ids.clone();
        let pinned = |ids: &[u32]| -> Vec<u32> { ids.iter().copied().filter(|id| ours.contains(id)).collect() };
        let want_maps = pinned(&want.map_ids);
        let have = match self.pinned_program(a, prog_id) {
            Some(p) => Some(p),
            // No pin of the program that runs there (an older build's
            // attachment): ask by id, which needs CAP_SYS_ADMIN; without
            // it, replace the program (atomically) rather than guess.
            None => match sys::prog_info_by_id(prog_id) {
                Ok(p) => p,
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => return Ok(AttachStatus::Outdated),
                Err(e) => return Err(bpf_err(format!("program {prog_id} behind {what}"), e)),
            },
        };
        Ok(match have {
            Some(p) if p.tag == want.tag && pinned(&p.map_ids) == want_maps => AttachStatus::Current,
            Some(_) => AttachStatus::Outdated,
            None => AttachStatus::Defunct,
        })
    }

    /// The info of the program pinned next to `a`'s link, if that pin is
    /// the program the link runs (`prog_id`).
    fn pinned_program(&self, a: &Attachment, prog_id: u32) -> Option<ProgInfo> {
        let fd = sys::obj_get(&self.pins.prog(&a.pin_name())).ok()?;
        sys::prog_info(fd.as_fd()).ok().filter(|p| p.id == prog_id)
    }

    /// Pins the program `a`'s link now runs, replacing an older pin.
    fn pin_program(&mut self, a: &Attachment) -> Result<()> {
        let path = self.pins.prog(&a.pin_name());
        let prog = program_fd(self.ensure_loaded()?, a.program)?;
        unpin(&path).map_err(|e| bpf_err(format!("unpin {}", path.display()), e))?;
        sys::obj_pin(prog.as_fd(), &path).map_err(|e| bpf_err(format!("pin {}", path.display()), e))
    }

    /// Removes hostmesh's clsact filters (and the qdiscs it added, when
    /// nothing else is on them), unpins everything, removes the pin dir
    /// and drops loaded objects: `hostmesh teardown`.
    pub(crate) fn remove_all(&mut self) -> Result<Vec<String>> {
        self.loaded = None;
        let mut removed = self.remove_all_filters()?;
        let root = self.pins.root.display().to_string();
        removed.extend(self.unpin_all().map_err(|e| bpf_err(format!("remove pins in {root}"), e))?);
        if self.pins.root.exists() {
            removed.extend(self.pins.remove().map_err(|e| bpf_err("remove the pin dir", e))?);
        }
        Ok(removed)
    }

    fn unpin_all(&mut self) -> io::Result<Vec<String>> {
        let mut removed = Vec::new();
        for name in self.pins.link_names()? {
            unpin(&self.pins.link(&name))?;
            removed.push(format!("unpinned link {name}"));
        }
        for name in self.pins.prog_names()? {
            unpin(&self.pins.prog(&name))?;
        }
        for map in HmMap::pinned() {
            let p = self.pins.map(map);
            if p.exists() {
                unpin(&p)?;
                removed.push(format!("unpinned map {map}"));
            }
        }
        Ok(removed)
    }

    /// Entry 0 of a config array map; None if it was never written (an
    /// array entry never written reads as zeros).
    fn config_entry<T: crate::abi::Pod>(&mut self, map: HmMap) -> Result<Option<T>> {
        let fd = self.map_fd(map)?;
        let mut value = vec![0u8; std::mem::size_of::<T>()];
        let found = sys::map_lookup(fd.as_fd(), &0u32.to_ne_bytes(), &mut value)
            .map_err(|e| bpf_err(format!("read {map}"), e))?;
        Ok(if found && value.iter().any(|b| *b != 0) { T::from_bytes(&value) } else { None })
    }

    /// The conntrack map, if anything is pinned yet.
    fn conntrack_fd(&mut self) -> Result<Option<&OwnedFd>> {
        if self.loaded.is_none() && !self.has_pins() {
            return Ok(None);
        }
        self.map_fd(HmMap::Ct).map(Some)
    }
}

/// Arrays hold every key: an all-zero value is an unset entry.
pub(super) fn is_array(def: &crate::abi::MapDef) -> bool {
    use aya_obj::generated::bpf_map_type::{BPF_MAP_TYPE_ARRAY, BPF_MAP_TYPE_PERCPU_ARRAY};
    [BPF_MAP_TYPE_ARRAY as u32, BPF_MAP_TYPE_PERCPU_ARRAY as u32].contains(&def.map_type)
}

/// The inode number of the daemon's network namespace.
fn own_netns_ino() -> Option<u32> {
    std::fs::metadata("/proc/self/ns/net").ok().map(|m| m.ino() as u32)
}

/// Whether a link is of the hook's kind and still at that hook (its
/// interface, cgroup or namespace is the one named, and alive).
fn link_in_place(hook: &Hook, info: &sys::LinkInfo) -> bool {
    match hook {
        Hook::TcIngress(dev) | Hook::TcEgress(dev) => {
            info.link_type == Some(sys::bpf_link_type::BPF_LINK_TYPE_TCX)
                && info.tcx_ifindex != 0
                && ifaces::index(dev) == Some(info.tcx_ifindex)
        }
        Hook::Cgroup(path) => {
            info.link_type == Some(sys::bpf_link_type::BPF_LINK_TYPE_CGROUP)
                && info.cgroup_id != 0
                && cgroup_id(path) == Some(info.cgroup_id)
        }
        Hook::Netns => {
            info.link_type == Some(sys::bpf_link_type::BPF_LINK_TYPE_NETNS)
                && info.netns_ino != 0
                && own_netns_ino() == Some(info.netns_ino)
        }
    }
}

/// A cgroup's id is its inode number in cgroupfs.
fn cgroup_id(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.ino())
}

impl BpfBackend for PinnedBpf {
    fn prepare(&mut self) -> Result<()> {
        self.ensure_loaded().map(|_| ())
    }

    fn take_notes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notes)
    }

    fn map_entries(&mut self) -> Result<BTreeMap<MapEntryKey, MapValue>> {
        let mut out = BTreeMap::new();
        if self.loaded.is_none() && !self.has_pins() {
            return Ok(out);
        }
        self.repin_missing_maps()?;
        for map in BpfMap::ALL {
            let def = map.map().def();
            let fd = self.map_fd(map.map())?;
            sys::map_for_each(fd.as_fd(), def.key_size as usize, def.value_size as usize, |key, value| {
                // An array always has every key; all-zero values are unset.
                if is_array(def) && value.iter().all(|b| *b == 0) {
                    return;
                }
                out.insert(MapEntryKey { map, key: key.into() }, MapValue::read_back(map, value.to_vec()));
            })
            .map_err(|e| bpf_err(format!("read map {}", def.name), e))?;
        }
        Ok(out)
    }

    fn put_map_entry(&mut self, key: &MapEntryKey, value: &[u8]) -> Result<()> {
        let fd = self.map_fd(key.map.map())?;
        sys::map_update(fd.as_fd(), &key.key, value).map_err(|e| bpf_err(format!("update {}", key.map.name()), e))
    }

    fn delete_map_entry(&mut self, key: &MapEntryKey) -> Result<()> {
        let def = key.map.map().def();
        let fd = self.map_fd(def.map)?;
        let result = if is_array(def) {
            sys::map_update(fd.as_fd(), &key.key, &vec![0u8; def.value_size as usize])
        } else {
            sys::map_delete(fd.as_fd(), &key.key)
        };
        result.map_err(|e| bpf_err(format!("delete from {}", def.name), e))
    }

    fn attachments(&mut self) -> Result<BTreeMap<Attachment, AttachStatus>> {
        let mut out = BTreeMap::new();
        let names = self.pins.link_names().map_err(|e| bpf_err("list pinned links", e))?;
        for name in names {
            // A name this build does not write (another build's) is left
            // alone rather than guessed at.
            if let Some(a) = Attachment::from_pin_name(&name) {
                let mut status = self.link_status(&a, &self.pins.link(&name))?;
                // A TCX link where clsact filters are wanted: re-attach
                // (the filter goes in before the link goes).
                if a.device().is_some() && self.tc_mode == TcAttach::Netlink && status == AttachStatus::Current {
                    status = AttachStatus::Outdated;
                }
                out.insert(a, status);
            }
        }
        self.observe_filters(&mut out)?;
        Ok(out)
    }

    fn attach(&mut self, a: &Attachment) -> Result<()> {
        if let (Some(dev), TcAttach::Netlink) = (a.device(), self.tc_mode) {
            return self.attach_filter(a, dev);
        }
        let pin = self.pins.link(&a.pin_name());
        let status = if pin.exists() { Some(self.link_status(a, &pin)?) } else { None };
        let loaded = self.ensure_loaded()?;

        if matches!(status, Some(AttachStatus::Current) | Some(AttachStatus::Outdated)) {
            // Swap the program behind the existing link atomically: no
            // packet or connect() sees the hook empty.
            let link = sys::obj_get(&pin).map_err(|e| bpf_err(format!("open {}", pin.display()), e))?;
            let prog = program_fd(loaded, a.program)?;
            sys::link_update(link.as_fd(), prog.as_fd()).map_err(|e| bpf_err(format!("replace {a}"), e))?;
            self.pin_program(a)?;
            // A clsact filter left from netlink mode goes once the link runs.
            return self.remove_filter(a);
        }
        if status == Some(AttachStatus::Defunct) {
            unpin(&pin).map_err(|e| bpf_err(format!("unpin {}", pin.display()), e))?;
        }
        let ebpf = loaded
            .objects
            .get_mut(&a.program.object())
            .ok_or_else(|| bpf_err(format!("attach {a}"), "its object is not loaded"))?;
        let link: FdLink = match (&a.hook, ebpf.program_mut(a.program.name())) {
            (Hook::TcIngress(dev) | Hook::TcEgress(dev), Some(aya::programs::Program::SchedClassifier(p))) => {
                tc::attach_tcx(p, dev, a)?
            }
            (Hook::Cgroup(path), Some(aya::programs::Program::CgroupSockAddr(p))) => {
                let cgroup = File::open(path).map_err(|e| bpf_err(format!("attach {a}: open the cgroup"), e))?;
                // A bpf link: it takes no flags (the kernel rejects
                // BPF_F_ALLOW_MULTI here) and always runs next to other
                // programs on the cgroup.
                let id = p
                    .attach(&cgroup, CgroupAttachMode::Single)
                    .map_err(|e| bpf_err(format!("attach {a}"), chain(&e)))?;
                let link = p.take_link(id).map_err(|e| bpf_err(format!("attach {a}"), chain(&e)))?;
                FdLink::try_from(link)
                    .map_err(|e| bpf_err(format!("attach {a} (needs Linux 5.7 or newer)"), chain(&e)))?
            }
            (Hook::Netns, Some(aya::programs::Program::SkLookup(p))) => {
                let netns =
                    File::open("/proc/self/ns/net").map_err(|e| bpf_err(format!("attach {a}: open the netns"), e))?;
                let id = p.attach(&netns).map_err(|e| bpf_err(format!("attach {a}"), chain(&e)))?;
                let link = p.take_link(id).map_err(|e| bpf_err(format!("attach {a}"), chain(&e)))?;
                FdLink::from(link)
            }
            _ => return Err(bpf_err(format!("attach {a}"), "the program does not fit the hook")),
        };
        link.pin(&pin).map_err(|e| bpf_err(format!("pin {}", pin.display()), chain(&e)))?;
        self.pin_program(a)?;
        if a.device().is_some() {
            self.remove_filter(a)?;
        }
        Ok(())
    }

    fn detach(&mut self, a: &Attachment) -> Result<()> {
        let pin = self.pins.link(&a.pin_name());
        unpin(&pin).map_err(|e| bpf_err(format!("unpin {}", pin.display()), e))?;
        if a.device().is_some() {
            self.remove_filter(a)?;
        }
        let prog = self.pins.prog(&a.pin_name());
        unpin(&prog).map_err(|e| bpf_err(format!("unpin {}", prog.display()), e))
    }

    fn expire_flows(&mut self) -> Result<Sweep> {
        if self.conntrack_fd()?.is_none() {
            return Ok(Sweep::default());
        }
        let now = conntrack::now_ns();
        // The timeouts the probes use, from HM_CONFIG[0].
        let config = self.config_entry::<crate::abi::HmConfig>(HmMap::Config)?;
        let mut sweep = Sweep { capacity: self.sizes.conntrack, ..Sweep::default() };
        for (map, left) in [(HmMap::Ct, &mut sweep.open), (HmMap::CtClosing, &mut sweep.closed)] {
            let fd = self.map_fd_owned(map)?;
            let (removed, n) =
                conntrack::expire(fd.as_fd(), config, now).map_err(|e| bpf_err(format!("expire flows in {map}"), e))?;
            sweep.removed += removed;
            *left = n;
        }
        if let Some(gw) = self.config_entry::<crate::abi::GwConfig>(HmMap::GwConfig)? {
            let fd = self.map_fd_owned(HmMap::GwCt)?;
            sweep.removed += conntrack::expire_gateway(fd.as_fd(), gw, now)
                .map_err(|e| bpf_err("expire learned return paths in HM_GW_CT", e))?
                .0;
        }
        Ok(sweep)
    }

    fn drop_flows(&mut self, stopped: &[crate::backends::StoppedBackend]) -> Result<crate::backends::Forgotten> {
        let mut out = crate::backends::Forgotten::default();
        if stopped.is_empty() || self.conntrack_fd()?.is_none() {
            return Ok(out);
        }
        let stopped: std::collections::BTreeSet<_> = stopped.iter().copied().collect();
        let ct = self.map_fd_owned(HmMap::Ct)?;
        out.flow_entries =
            flows_drop::forget_flows(ct.as_fd(), &stopped).map_err(|e| bpf_err("drop flows in HM_CT", e))?;
        if !self.features.has(crate::model::Feature::SockDestroy) {
            // `hostmesh status` lists the feature as missing, with its cost.
            return Ok(out);
        }
        let revsk = self.map_fd_owned(HmMap::ReverseSock)?;
        match flows_drop::destroy_sockets(revsk.as_fd(), &stopped) {
            Ok(n) => out.sockets = n,
            Err(e) => out.sockets_error = Some(format!("cannot destroy connected sockets: {e}")),
        }
        Ok(out)
    }

    fn prune_affinity(
        &mut self,
        serving: &BTreeMap<crate::abi::SvcKey, std::collections::BTreeSet<std::net::SocketAddr>>,
    ) -> Result<usize> {
        self.prune_affinity_entries(serving)
    }

    fn prune_backend_stats(
        &mut self,
        configured: &std::collections::HashSet<(crate::abi::SvcKey, std::net::SocketAddr)>,
    ) -> Result<usize> {
        self.prune_stats(configured)
    }

    fn configure(&mut self, settings: &BpfSettings) -> Result<bool> {
        let tc_mode = TcAttach::choose(settings.tc_attach, &self.features);
        // Another TC mode: the next (full) sync observes every hook anew
        // and moves each one over.
        let moved = tc_mode != self.tc_mode;
        self.tc_mode = tc_mode;
        if settings.sizes == self.sizes {
            return Ok(moved);
        }
        self.sizes = settings.sizes;
        // Reload at next use: maps of the old size are retired and the
        // programs, now using other maps, show as outdated and are swapped.
        Ok(self.loaded.take().is_some() || self.has_pins() || moved)
    }

    fn sk_lookup_unavailable(&mut self) -> Option<String> {
        self.sk_lookup.get_or_insert_with(Self::probe_sk_lookup).clone()
    }

    fn finish_migration(&mut self) -> Result<Vec<String>> {
        let Some(loaded) = self.loaded.as_mut() else { return Ok(Vec::new()) };
        let mut notes = Vec::new();
        for r in std::mem::take(&mut loaded.retired) {
            if !resize::written_by_programs(&r.def) {
                continue;
            }
            let new =
                loaded.maps.get(&r.def.map).ok_or_else(|| bpf_err(format!("open {}", r.def.name), "not loaded"))?;
            let copied = resize::copy_entries(r.old.as_fd(), new.as_fd(), &r.def, true)
                .map_err(|e| bpf_err(format!("copy late flows of {} into its resized map", r.def.name), e))?;
            if copied.copied > 0 {
                notes.push(format!(
                    "map {}: {} flows the replaced programs wrote during the resize were copied",
                    r.def.name, copied.copied
                ));
            }
        }
        Ok(notes)
    }
}
