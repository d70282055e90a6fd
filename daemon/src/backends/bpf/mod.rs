//! The BPF backend: maps pinned under hostmesh's bpffs dir (adopted on
//! restart, checked for layout first), programs attached through pinned
//! TCX links, and byte-level map access for the reconciler.
//!
//! The object is loaded lazily, the first time a map or program is needed:
//! a host with nothing configured gets no BPF state at all.

pub mod objects;
pub mod pins;
pub mod sys;

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use aya::programs::links::{FdLink, PinnedLink};
use aya::programs::tc::{SchedClassifierLink, TcAttachOptions};
use aya::programs::{LinkOrder, SchedClassifier, TcAttachType};
use aya::{Ebpf, EbpfLoader};

use self::objects::{def_of, MapDef, MAPS};
use self::pins::{unpin, PinDir};
use super::{BackendError, BpfBackend, Result};
use crate::model::*;

pub struct PinnedBpf {
    pins: PinDir,
    loaded: Option<Loaded>,
    /// Pinned maps that did not match this build's layout and were
    /// replaced, as sentences for the log.
    pub notes: Vec<String>,
}

struct Loaded {
    ebpf: Ebpf,
    tags: BTreeMap<Program, [u8; 8]>,
    maps: BTreeMap<&'static str, OwnedFd>,
}

fn bpf_err(op: impl Into<String>, detail: impl ToString) -> BackendError {
    BackendError::Bpf { op: op.into(), detail: detail.to_string() }
}

impl PinnedBpf {
    pub fn new(dir: &Path) -> Self {
        PinnedBpf { pins: PinDir::new(dir), loaded: None, notes: Vec::new() }
    }

    pub fn pins(&self) -> &PinDir {
        &self.pins
    }

    /// Whether any map is pinned (nothing to observe otherwise).
    fn has_pins(&self) -> bool {
        MAPS.iter().any(|m| self.pins.map(m.name).exists()) || !self.pins.link_names().unwrap_or_default().is_empty()
    }

    fn ensure_loaded(&mut self) -> Result<&mut Loaded> {
        if self.loaded.is_none() {
            self.loaded = Some(self.load()?);
        }
        Ok(self.loaded.as_mut().expect("just loaded"))
    }

    fn load(&mut self) -> Result<Loaded> {
        self.pins.ensure().map_err(|e| bpf_err(format!("prepare {}", self.pins.root.display()), e))?;
        for def in MAPS {
            self.retire_incompatible(def)?;
        }
        let mut loader = EbpfLoader::new();
        let paths: Vec<(&'static str, std::path::PathBuf)> =
            MAPS.iter().map(|m| (m.name, self.pins.map(m.name))).collect();
        for (name, path) in &paths {
            loader.map_pin_path(name, path.as_path());
        }
        let mut ebpf =
            loader.load(objects::SERVICE_NAT).map_err(|e| bpf_err("load probes/service_nat.c", error_chain(&e)))?;
        let mut tags = BTreeMap::new();
        for program in Program::ALL {
            let prog: &mut SchedClassifier = ebpf
                .program_mut(program.name())
                .ok_or_else(|| bpf_err(format!("find program {}", program.name()), "not in the object"))?
                .try_into()
                .map_err(|e| bpf_err(format!("program {}", program.name()), error_chain(&e)))?;
            prog.load().map_err(|e| bpf_err(format!("verify program {}", program.name()), error_chain(&e)))?;
            let fd = prog.fd().map_err(|e| bpf_err(program.name(), e))?;
            let info = sys::prog_info(fd.as_fd()).map_err(|e| bpf_err(format!("info of {}", program.name()), e))?;
            tags.insert(program, info.tag);
        }
        let mut maps = BTreeMap::new();
        for def in MAPS {
            let fd = sys::obj_get(&self.pins.map(def.name))
                .map_err(|e| bpf_err(format!("open pinned map {}", def.name), e))?;
            maps.insert(def.name, fd);
        }
        Ok(Loaded { ebpf, tags, maps })
    }

    /// A pinned map with another layout (an upgrade changed it) is unpinned
    /// so a new one is created. Programs still attached keep using the old
    /// map until the new programs replace them, so traffic keeps flowing.
    fn retire_incompatible(&mut self, def: &MapDef) -> Result<()> {
        let path = self.pins.map(def.name);
        let fd = match sys::obj_get(&path) {
            Ok(fd) => fd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(bpf_err(format!("open pinned map {}", path.display()), e)),
        };
        let info = sys::map_info(fd.as_fd()).map_err(|e| bpf_err(format!("info of {}", path.display()), e))?;
        let same = info.map_type == def.map_type
            && info.key_size == def.key_size
            && info.value_size == def.value_size
            && info.max_entries == def.max_entries
            && info.flags == def.flags;
        if !same {
            self.notes.push(format!(
                "pinned map {} has another layout (type {} key {} value {} entries {}); replacing it with this build's (type {} key {} value {} entries {})",
                def.name, info.map_type, info.key_size, info.value_size, info.max_entries,
                def.map_type, def.key_size, def.value_size, def.max_entries
            ));
            unpin(&path).map_err(|e| bpf_err(format!("unpin {}", path.display()), e))?;
        }
        Ok(())
    }

    fn map_fd(&mut self, map: BpfMap) -> Result<&OwnedFd> {
        let loaded = self.ensure_loaded()?;
        Ok(&loaded.maps[map.name()])
    }

    /// Status of the pinned link for `a`: attached to the right interface,
    /// and running this build's program?
    fn link_status(&mut self, a: &Attachment, pin: &Path) -> Result<AttachStatus> {
        let fd = sys::obj_get(pin).map_err(|e| bpf_err(format!("open pinned link {}", pin.display()), e))?;
        let info = sys::link_info(fd.as_fd()).map_err(|e| bpf_err(format!("info of {}", pin.display()), e))?;
        let Hook::TcIngress(dev) = &a.hook;
        if info.link_type != sys::BPF_LINK_TYPE_TCX || info.tcx_ifindex == 0 || ifindex(dev) != Some(info.tcx_ifindex) {
            return Ok(AttachStatus::Defunct);
        }
        let want = self.ensure_loaded()?.tags[&a.program];
        let have = sys::prog_info_by_id(info.prog_id).map_err(|e| bpf_err(format!("program {}", info.prog_id), e))?;
        Ok(match have {
            Some(p) if p.tag == want => AttachStatus::Current,
            Some(_) => AttachStatus::Outdated,
            None => AttachStatus::Defunct,
        })
    }

    /// Unpins everything and drops loaded objects: `hostmesh teardown`.
    pub fn remove_all(&mut self) -> io::Result<Vec<String>> {
        self.loaded = None;
        let mut removed = Vec::new();
        for name in self.pins.link_names()? {
            unpin(&self.pins.link(&name))?;
            removed.push(format!("link {name}"));
        }
        for def in MAPS {
            let p = self.pins.map(def.name);
            if p.exists() {
                unpin(&p)?;
                removed.push(format!("map {}", def.name));
            }
        }
        Ok(removed)
    }
}

/// TCX (BPF links for TC) arrived in Linux 6.6.
fn has_tcx() -> bool {
    use aya::util::KernelVersion;
    KernelVersion::current().is_ok_and(|v| v >= KernelVersion::new(6, 6, 0))
}

fn ifindex(dev: &str) -> Option<u32> {
    nix::net::if_::if_nametoindex(dev).ok()
}

/// aya errors nest their cause (the verifier log among them); show it all.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

impl BpfBackend for PinnedBpf {
    fn map_entries(&mut self) -> Result<BTreeMap<MapEntryKey, Vec<u8>>> {
        let mut out = BTreeMap::new();
        if self.loaded.is_none() && !self.has_pins() {
            return Ok(out);
        }
        for map in BpfMap::ALL {
            let def = def_of(map);
            let fd = self.map_fd(map)?;
            let entries = sys::map_dump(fd.as_fd(), def.key_size as usize, def.value_size as usize)
                .map_err(|e| bpf_err(format!("read map {}", def.name), e))?;
            for (key, value) in entries {
                out.insert(MapEntryKey { map, key }, value);
            }
        }
        Ok(out)
    }

    fn put_map_entry(&mut self, key: &MapEntryKey, value: &[u8]) -> Result<()> {
        let fd = self.map_fd(key.map)?;
        sys::map_update(fd.as_fd(), &key.key, value).map_err(|e| bpf_err(format!("update {}", key.map.name()), e))
    }

    fn delete_map_entry(&mut self, key: &MapEntryKey) -> Result<()> {
        let fd = self.map_fd(key.map)?;
        sys::map_delete(fd.as_fd(), &key.key).map_err(|e| bpf_err(format!("delete from {}", key.map.name()), e))
    }

    fn attachments(&mut self) -> Result<BTreeMap<Attachment, AttachStatus>> {
        let mut out = BTreeMap::new();
        let names = self.pins.link_names().map_err(|e| bpf_err("list pinned links", e))?;
        for name in names {
            let pin = self.pins.link(&name);
            // A name this build does not write (another build's) is left
            // alone rather than guessed at.
            if let Some(a) = Attachment::from_pin_name(&name) {
                let status = self.link_status(&a, &pin)?;
                out.insert(a, status);
            }
        }
        Ok(out)
    }

    fn attach(&mut self, a: &Attachment) -> Result<()> {
        let pin = self.pins.link(&a.pin_name());
        let status = if pin.exists() { Some(self.link_status(a, &pin)?) } else { None };
        let Hook::TcIngress(dev) = &a.hook;
        let loaded = self.ensure_loaded()?;
        let prog: &mut SchedClassifier = loaded
            .ebpf
            .program_mut(a.program.name())
            .expect("loaded programs are in the object")
            .try_into()
            .map_err(|e| bpf_err(format!("attach {a}"), error_chain(&e)))?;

        if matches!(status, Some(AttachStatus::Current) | Some(AttachStatus::Outdated)) {
            // Swap the program behind the existing link atomically: no
            // packet sees the hook empty.
            let link =
                PinnedLink::from_pin(&pin).map_err(|e| bpf_err(format!("open {}", pin.display()), error_chain(&e)))?;
            let link = SchedClassifierLink::try_from(FdLink::from(link))
                .map_err(|e| bpf_err(format!("open {}", pin.display()), error_chain(&e)))?;
            let id = prog.attach_to_link(link).map_err(|e| bpf_err(format!("replace {a}"), error_chain(&e)))?;
            // The link stays pinned; drop our handle without detaching.
            let link = prog.take_link(id).map_err(|e| bpf_err(format!("replace {a}"), error_chain(&e)))?;
            drop(FdLink::try_from(link).map_err(|e| bpf_err(format!("replace {a}"), error_chain(&e)))?);
            return Ok(());
        }
        if status == Some(AttachStatus::Defunct) {
            unpin(&pin).map_err(|e| bpf_err(format!("unpin {}", pin.display()), e))?;
        }
        if !has_tcx() {
            return Err(bpf_err(
                format!("attach {a}"),
                "hostmesh attaches TC programs with TCX, which needs Linux 6.6 or newer",
            ));
        }
        let id = prog
            .attach_with_options(dev, TcAttachType::Ingress, TcAttachOptions::TcxOrder(LinkOrder::default()))
            .map_err(|e| bpf_err(format!("attach {a}"), error_chain(&e)))?;
        let link = prog.take_link(id).map_err(|e| bpf_err(format!("attach {a}"), error_chain(&e)))?;
        let link = FdLink::try_from(link).map_err(|e| bpf_err(format!("attach {a}"), error_chain(&e)))?;
        link.pin(&pin).map_err(|e| bpf_err(format!("pin {}", pin.display()), error_chain(&e)))?;
        Ok(())
    }

    fn detach(&mut self, a: &Attachment) -> Result<()> {
        let pin = self.pins.link(&a.pin_name());
        unpin(&pin).map_err(|e| bpf_err(format!("unpin {}", pin.display()), e))
    }
}
