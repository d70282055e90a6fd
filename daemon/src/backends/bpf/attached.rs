//! What hostmesh has attached, read back for `hostmesh explain`: its
//! pinned links and clsact filters, each with the program's id, tag and
//! build mark (probes/build_mark.h). Nothing here writes.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use super::hooks::link_in_place;
use super::inspect::Inspector;
use super::sys;
use crate::backends::ifaces;
use crate::backends::netlink::RouteSocket;
use crate::model::{Attachment, Program};

/// The name aya gives the mark's map: its section's.
const MARK_MAP: &str = ".rodata.hm_mark";

/// One program hostmesh attached, and whose it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AttachedProgram {
    pub attachment: Attachment,
    /// "link" (pinned bpf link) or "tc filter".
    pub via: &'static str,
    pub prog_id: u32,
    pub tag: Option<[u8; 8]>,
    pub mark: Mark,
    /// False for a link no longer at its hook (its interface, cgroup or
    /// namespace is gone): the program runs nowhere.
    pub live: bool,
}

/// The build mark an attached program carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Mark {
    Build(u64),
    /// The program has no mark map: a build from before marks.
    Unmarked,
    /// It could not be read (reading programs and maps by id needs
    /// CAP_SYS_ADMIN), with why.
    Unreadable(String),
}

impl Inspector {
    /// Every program hostmesh has attached: its pinned links, then its
    /// clsact filters (kernels without TCX).
    pub(crate) fn attached(&self) -> io::Result<Vec<AttachedProgram>> {
        let mut out = Vec::new();
        for name in self.pins().link_names()? {
            let Some(a) = Attachment::from_pin_name(&name) else { continue };
            let link = sys::obj_get(&self.pins().link(&name))?;
            let info = sys::link_info(link.as_fd())?;
            let live = link_in_place(&a.hook, &info);
            out.push(self.describe(a, "link", info.prog_id, live));
        }
        for f in super::tc::hostmesh_filters(&mut RouteSocket::open()?)? {
            let (Some(program), Some(dev)) = (f.name.as_deref().and_then(Program::from_name), ifaces::name(f.ifindex))
            else {
                continue;
            };
            let a = Attachment { program, hook: super::tc::hook(dev, f.direction) };
            out.push(self.describe(a, "tc filter", f.prog_id.unwrap_or(0), true));
        }
        Ok(out)
    }

    fn describe(&self, attachment: Attachment, via: &'static str, prog_id: u32, live: bool) -> AttachedProgram {
        let (tag, mark) = match self.program_fd(&attachment, prog_id) {
            Ok(Some(fd)) => match sys::prog_info(fd.as_fd()) {
                Ok(info) => (Some(info.tag), mark_of(&info.map_ids)),
                Err(e) => (None, Mark::Unreadable(format!("program info: {e}"))),
            },
            Ok(None) => (None, Mark::Unreadable("the program is gone".into())),
            Err(e) => (None, Mark::Unreadable(format!("open program {prog_id}: {e}"))),
        };
        AttachedProgram { attachment, via, prog_id, tag, mark, live }
    }

    /// The program behind an attachment: its pin when that is the one
    /// attached (no privilege needed), else by id.
    fn program_fd(&self, a: &Attachment, prog_id: u32) -> io::Result<Option<OwnedFd>> {
        if let Ok(fd) = sys::obj_get(&self.pins().prog(&a.pin_name())) {
            if sys::prog_info(fd.as_fd()).is_ok_and(|p| p.id == prog_id) {
                return Ok(Some(fd));
            }
        }
        sys::prog_fd_by_id(prog_id)
    }
}

/// The mark in the program's mark map, if it has one.
fn mark_of(map_ids: &[u32]) -> Mark {
    for id in map_ids {
        let fd = match sys::map_fd_by_id(*id) {
            Ok(Some(fd)) => fd,
            Ok(None) => continue,
            Err(e) => return Mark::Unreadable(format!("open map {id}: {e}")),
        };
        let Ok(info) = sys::map_info(fd.as_fd()) else { continue };
        if info.name != MARK_MAP || info.value_size != 8 {
            continue;
        }
        let mut value = [0u8; 8];
        return match sys::map_lookup(fd.as_fd(), &0u32.to_ne_bytes(), &mut value) {
            Ok(true) => Mark::Build(u64::from_ne_bytes(value)),
            Ok(false) => Mark::Unmarked,
            Err(e) => Mark::Unreadable(format!("read map {id}: {e}")),
        };
    }
    Mark::Unmarked
}
