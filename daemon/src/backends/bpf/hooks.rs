//! The hooks: where hostmesh's programs run. This owner attaches the
//! loader's programs through pinned bpf links (cgroups, the netns, TCX) or
//! clsact filters (`tc.rs`, kernels without TCX), pins the program behind
//! each hook, reads back what is attached and judges whether it is this
//! build's program with this build's maps, and detaches.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use aya::programs::links::FdLink;
use aya::programs::CgroupAttachMode;

use super::load::{program_fd, Loader};
use super::pins::{unpin, PinDir};
use super::sys::{self, ProgInfo};
use super::tc::{attach_tcx, TcFilters};
use super::{bpf_err, chain};
use crate::backends::{ifaces, Result};
use crate::model::{AttachStatus, Attachment, Hook, TcAttach, TcAttachPref};

pub(super) struct Hooks {
    pins: PinDir,
    /// How TC programs are attached (TCX, or clsact filters).
    pub(super) tc_mode: TcAttach,
    filters: TcFilters,
}

impl Hooks {
    pub(super) fn new(pins: PinDir, loader: &Loader) -> Self {
        Hooks {
            tc_mode: TcAttach::choose(TcAttachPref::default(), loader.features()),
            filters: TcFilters::new(pins.clone()),
            pins,
        }
    }

    /// Every hook hostmesh has a program at, and whether it runs this
    /// build's program with this build's maps.
    pub(super) fn attachments(&mut self, loader: &mut Loader) -> Result<BTreeMap<Attachment, AttachStatus>> {
        let mut out = BTreeMap::new();
        let names = self.pins.link_names().map_err(|e| bpf_err("list pinned links", e))?;
        for name in names {
            // A name this build does not write (another build's) is left
            // alone rather than guessed at.
            if let Some(a) = Attachment::from_pin_name(&name) {
                let mut status = self.link_status(loader, &a, &self.pins.link(&name))?;
                // A TCX link where clsact filters are wanted: re-attach
                // (the filter goes in before the link goes).
                if a.device().is_some() && self.tc_mode == TcAttach::Netlink && status == AttachStatus::Current {
                    status = AttachStatus::Outdated;
                }
                out.insert(a, status);
            }
        }
        for found in self.filters.observe()? {
            let a = found.attachment;
            let status = match self.tc_mode {
                // A filter where TCX is wanted, or not where it should be
                // (first, unless another tool holds that slot): re-attach
                // (the new one goes in before the old goes).
                TcAttach::Tcx => AttachStatus::Outdated,
                TcAttach::Netlink if found.misplaced => AttachStatus::Outdated,
                TcAttach::Netlink => self.program_status(loader, &a, found.prog_id, &found.what)?,
            };
            // A link and a filter: a move that was cut short; attach
            // finishes it.
            out.entry(a).and_modify(|s| *s = AttachStatus::Outdated).or_insert(status);
        }
        // A TC program pinned but attached nowhere: its interface went
        // away, taking the filter with it.
        let pinned = self.pins.prog_names().map_err(|e| bpf_err("list pinned programs", e))?;
        for a in pinned.iter().filter_map(|n| Attachment::from_pin_name(n)) {
            if a.device().is_some() {
                out.entry(a).or_insert(AttachStatus::Defunct);
            }
        }
        Ok(out)
    }

    /// Every hook hostmesh has a program at, whatever runs there, read
    /// without loading anything: what teardown removes.
    pub(super) fn present(&mut self) -> Result<std::collections::BTreeSet<Attachment>> {
        let names = self.pins.link_names().map_err(|e| bpf_err("list pinned links", e))?;
        let mut out: std::collections::BTreeSet<Attachment> =
            names.iter().filter_map(|n| Attachment::from_pin_name(n)).collect();
        out.extend(self.filters.observe()?.into_iter().map(|f| f.attachment));
        Ok(out)
    }

    /// Attaches, or atomically replaces what runs at the hook.
    pub(super) fn attach(&mut self, loader: &mut Loader, a: &Attachment) -> Result<()> {
        if let (Some(dev), TcAttach::Netlink) = (a.device(), self.tc_mode) {
            let prog = program_fd(loader, a.program)?;
            self.filters.attach(a, dev, prog.as_fd())?;
            self.pin_program(loader, a)?;
            // A TCX link left from TCX mode goes once the filter runs.
            let link = self.pins.link(&a.pin_name());
            return unpin(&link).map_err(|e| bpf_err(format!("unpin {}", link.display()), e));
        }
        let pin = self.pins.link(&a.pin_name());
        let status = if pin.exists() { Some(self.link_status(loader, a, &pin)?) } else { None };
        if matches!(status, Some(AttachStatus::Current) | Some(AttachStatus::Outdated)) {
            // Swap the program behind the existing link atomically: no
            // packet or connect() sees the hook empty.
            let link = sys::obj_get(&pin).map_err(|e| bpf_err(format!("open {}", pin.display()), e))?;
            let prog = program_fd(loader, a.program)?;
            sys::link_update(link.as_fd(), prog.as_fd()).map_err(|e| bpf_err(format!("replace {a}"), e))?;
            self.pin_program(loader, a)?;
            // A clsact filter left from netlink mode goes once the link runs.
            return self.filters.remove_filter(a);
        }
        if status == Some(AttachStatus::Defunct) {
            unpin(&pin).map_err(|e| bpf_err(format!("unpin {}", pin.display()), e))?;
        }
        let link = new_link(loader, a)?;
        link.pin(&pin).map_err(|e| bpf_err(format!("pin {}", pin.display()), chain(&e)))?;
        self.pin_program(loader, a)?;
        if a.device().is_some() {
            self.filters.remove_filter(a)?;
        }
        Ok(())
    }

    pub(super) fn detach(&mut self, a: &Attachment) -> Result<()> {
        let pin = self.pins.link(&a.pin_name());
        unpin(&pin).map_err(|e| bpf_err(format!("unpin {}", pin.display()), e))?;
        if a.device().is_some() {
            self.filters.remove(a)?;
        }
        let prog = self.pins.prog(&a.pin_name());
        unpin(&prog).map_err(|e| bpf_err(format!("unpin {}", prog.display()), e))
    }

    /// Where other tools' clsact filters run before hostmesh's, as
    /// sentences for the status.
    pub(super) fn warnings(&self) -> Vec<String> {
        self.filters.warnings()
    }

    /// Teardown: every filter and the qdiscs hostmesh added, every link
    /// and program pin. Says what it did, a line each.
    pub(super) fn remove_all(&mut self) -> Result<Vec<String>> {
        let mut removed = self.filters.remove_all()?;
        let root = self.pins.root.display().to_string();
        let err = |e| bpf_err(format!("remove pins in {root}"), e);
        for name in self.pins.link_names().map_err(err)? {
            unpin(&self.pins.link(&name)).map_err(err)?;
            removed.push(format!("unpinned link {name}"));
        }
        for name in self.pins.prog_names().map_err(err)? {
            unpin(&self.pins.prog(&name)).map_err(err)?;
        }
        Ok(removed)
    }

    /// Is the pinned link for `a` attached where it should be, running
    /// this build's program with this build's maps?
    fn link_status(&mut self, loader: &mut Loader, a: &Attachment, pin: &Path) -> Result<AttachStatus> {
        let fd = sys::obj_get(pin).map_err(|e| bpf_err(format!("open pinned link {}", pin.display()), e))?;
        let info = sys::link_info(fd.as_fd()).map_err(|e| bpf_err(format!("info of {}", pin.display()), e))?;
        if !link_in_place(&a.hook, &info) {
            return Ok(AttachStatus::Defunct);
        }
        self.program_status(loader, a, info.prog_id, &pin.display().to_string())
    }

    /// Is program `prog_id`, attached at `a` (by the link or filter named
    /// `what`), this build's program with this build's maps?
    fn program_status(&self, loader: &mut Loader, a: &Attachment, prog_id: u32, what: &str) -> Result<AttachStatus> {
        let want = loader.program_info(a.program)?;
        let ours = loader.pinned_ids()?;
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

    /// Pins the program `a`'s hook now runs, replacing an older pin.
    fn pin_program(&self, loader: &mut Loader, a: &Attachment) -> Result<()> {
        let path = self.pins.prog(&a.pin_name());
        let prog = program_fd(loader, a.program)?;
        unpin(&path).map_err(|e| bpf_err(format!("unpin {}", path.display()), e))?;
        sys::obj_pin(prog.as_fd(), &path).map_err(|e| bpf_err(format!("pin {}", path.display()), e))
    }
}

/// A new bpf link for `a`'s program at its hook.
fn new_link(loader: &mut Loader, a: &Attachment) -> Result<FdLink> {
    let ebpf = loader.object_of(a.program)?;
    Ok(match (&a.hook, ebpf.program_mut(a.program.name())) {
        (Hook::TcIngress(dev) | Hook::TcEgress(dev), Some(aya::programs::Program::SchedClassifier(p))) => {
            attach_tcx(p, dev, a)?
        }
        // A bpf link: it takes no flags (the kernel rejects
        // BPF_F_ALLOW_MULTI here) and always runs next to other programs
        // on the cgroup.
        (Hook::Cgroup(path), Some(aya::programs::Program::CgroupSockAddr(p))) => {
            let cgroup = open_cgroup2(a, path)?;
            let id =
                p.attach(&cgroup, CgroupAttachMode::Single).map_err(|e| bpf_err(format!("attach {a}"), chain(&e)))?;
            let link = p.take_link(id).map_err(|e| bpf_err(format!("attach {a}"), chain(&e)))?;
            FdLink::try_from(link).map_err(|e| bpf_err(format!("attach {a} (needs Linux 5.7 or newer)"), chain(&e)))?
        }
        (Hook::Cgroup(path), Some(aya::programs::Program::CgroupSock(p))) => {
            let cgroup = open_cgroup2(a, path)?;
            let id =
                p.attach(&cgroup, CgroupAttachMode::Single).map_err(|e| bpf_err(format!("attach {a}"), chain(&e)))?;
            let link = p.take_link(id).map_err(|e| bpf_err(format!("attach {a}"), chain(&e)))?;
            FdLink::try_from(link).map_err(|e| bpf_err(format!("attach {a} (needs Linux 5.7 or newer)"), chain(&e)))?
        }
        (Hook::Netns, Some(aya::programs::Program::SkLookup(p))) => {
            let netns =
                File::open("/proc/self/ns/net").map_err(|e| bpf_err(format!("attach {a}: open the netns"), e))?;
            let id = p.attach(&netns).map_err(|e| bpf_err(format!("attach {a}"), chain(&e)))?;
            let link = p.take_link(id).map_err(|e| bpf_err(format!("attach {a}"), chain(&e)))?;
            FdLink::from(link)
        }
        _ => return Err(bpf_err(format!("attach {a}"), "the program does not fit the hook")),
    })
}

/// The cgroup directory `a` attaches to, checked to be of cgroup v2: the
/// kernel's answer for any other directory is EBADF, which says nothing
/// of the cause.
fn open_cgroup2(a: &Attachment, path: &Path) -> Result<File> {
    let cgroup = File::open(path).map_err(|e| bpf_err(format!("attach {a}: open the cgroup"), e))?;
    if !is_cgroup2(&cgroup) {
        return Err(bpf_err(
            format!("attach {a}"),
            format!(
                "{} is not a cgroup v2 directory; set [daemon] cgroup to a directory of the cgroup v2 hierarchy \
                 (where cgroup2 is mounted), or leave it out for that mount's root",
                path.display()
            ),
        ));
    }
    Ok(cgroup)
}

/// Whether `dir` is on a cgroup v2 filesystem (true when that cannot be
/// told: the attach then says what is wrong).
fn is_cgroup2(dir: &File) -> bool {
    use nix::sys::statfs::{fstatfs, CGROUP2_SUPER_MAGIC};
    fstatfs(dir).map_or(true, |s| s.filesystem_type() == CGROUP2_SUPER_MAGIC)
}

/// Why the connect-time programs could not attach to the cgroup `path`
/// (read only, for `hostmesh check`): missing, not a directory, or not of
/// cgroup v2, as open_cgroup2 would find. `None` when they could.
pub(crate) fn cgroup_dir_problem(path: &Path) -> Option<String> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some("does not exist".into()),
        Err(e) => Some(format!("cannot be read ({e})")),
        Ok(m) if !m.is_dir() => Some("is not a directory".into()),
        Ok(_) => match File::open(path) {
            Err(e) => Some(format!("cannot be opened ({e})")),
            Ok(dir) if !is_cgroup2(&dir) => Some("is not a directory of the cgroup v2 hierarchy".into()),
            Ok(_) => None,
        },
    }
}

/// The inode number of the daemon's network namespace.
fn own_netns_ino() -> Option<u32> {
    std::fs::metadata("/proc/self/ns/net").ok().map(|m| m.ino() as u32)
}

/// Whether a link is of the hook's kind and still at that hook (its
/// interface, cgroup or namespace is the one named, and alive).
pub(super) fn link_in_place(hook: &Hook, info: &sys::LinkInfo) -> bool {
    use sys::bpf_link_type::{BPF_LINK_TYPE_CGROUP, BPF_LINK_TYPE_NETNS, BPF_LINK_TYPE_TCX};
    match hook {
        Hook::TcIngress(dev) | Hook::TcEgress(dev) => {
            info.link_type == Some(BPF_LINK_TYPE_TCX)
                && info.tcx_ifindex != 0
                && ifaces::index(dev) == Some(info.tcx_ifindex)
        }
        Hook::Cgroup(path) => {
            info.link_type == Some(BPF_LINK_TYPE_CGROUP)
                && info.cgroup_id != 0
                && cgroup_id(path) == Some(info.cgroup_id)
        }
        Hook::Netns => {
            info.link_type == Some(BPF_LINK_TYPE_NETNS)
                && info.netns_ino != 0
                && own_netns_ino() == Some(info.netns_ino)
        }
    }
}

/// A cgroup's id is its inode number in cgroupfs.
fn cgroup_id(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.ino())
}
