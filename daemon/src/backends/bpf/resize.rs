//! Moving a pinned map's entries into a map of another capacity (a
//! `[daemon]` size key changed, or an upgrade changed a default): the new
//! map is created at the new size and filled from the old one before any
//! program uses it, and after this build's programs replaced the old ones,
//! the flows those wrote in between are copied too. Established flows
//! survive the resize; the old map goes when its last fd does.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};

use aya_obj::generated::bpf_map_type::{BPF_MAP_TYPE_LRU_HASH, BPF_MAP_TYPE_PERCPU_ARRAY, BPF_MAP_TYPE_SOCKHASH};

use super::sys;
use crate::abi::MapDef;

/// A pinned map retired by a resize, kept open until the flows written to
/// it after the first copy are moved over.
pub(super) struct Retired {
    pub def: MapDef,
    pub old: OwnedFd,
    pub old_entries: u32,
}

/// Whether a map of this type can be filled from userspace with what a
/// lookup returns. A sockhash returns socket cookies but takes socket fds:
/// its listeners are registered again by the sidecar registrar instead.
pub(super) fn copyable(def: &MapDef) -> bool {
    def.map_type != BPF_MAP_TYPE_SOCKHASH as u32
}

/// Whether programs write the map (flow state), so entries can appear in
/// the old map after the first copy.
pub(super) fn written_by_programs(def: &MapDef) -> bool {
    def.map_type == BPF_MAP_TYPE_LRU_HASH as u32
}

/// What one copy did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Copied {
    pub copied: usize,
    /// Entries the new map had no room for (a smaller map), or, when only
    /// missing entries are copied, that the new map already had.
    pub skipped: usize,
}

/// The size of one value as the kernel copies it out: per-CPU maps hold
/// one 8-byte-aligned value per possible CPU.
fn value_len(def: &MapDef) -> io::Result<usize> {
    let v = def.value_size as usize;
    if def.map_type == BPF_MAP_TYPE_PERCPU_ARRAY as u32 {
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| e)?;
        Ok(v.div_ceil(8) * 8 * cpus)
    } else {
        Ok(v)
    }
}

/// Copies the entries of `from` into `to` (the same layout, another
/// capacity). `only_missing` keeps what `to` already has (its entries are
/// newer). All-zero array values are left out: they are the empty slots.
pub(super) fn copy_entries(
    from: BorrowedFd<'_>,
    to: BorrowedFd<'_>,
    def: &MapDef,
    only_missing: bool,
) -> io::Result<Copied> {
    let len = value_len(def)?;
    let array = super::is_array(def);
    let how = if only_missing && !array { sys::Update::NoExist } else { sys::Update::Any };
    let mut out = Copied::default();
    for (key, value) in sys::map_dump(from, def.key_size as usize, len)? {
        if array && value.iter().all(|b| *b == 0) {
            continue;
        }
        match sys::map_update_with(to, &key, &value, how) {
            Ok(()) => out.copied += 1,
            // No room (a smaller hash map, an array index past the new
            // end), or already there when only missing ones are copied.
            Err(e) if matches!(e.raw_os_error(), Some(libc::E2BIG) | Some(libc::EEXIST)) => out.skipped += 1,
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}
