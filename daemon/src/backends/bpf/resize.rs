//! Moving a pinned map's entries into a map of another capacity (a
//! `[daemon]` size key changed, or an upgrade changed a default), or of a
//! value grown at its end (an upgrade added fields, `MapDef::grown_from`):
//! the new map is created and filled from the old one before any program
//! uses it, and after this build's programs replaced the old ones, the
//! flows those wrote in between are copied too. Established flows survive
//! the migration; the old map goes when its last fd does.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use aya_obj::generated::bpf_map_type::{
    BPF_MAP_TYPE_LRU_HASH, BPF_MAP_TYPE_LRU_PERCPU_HASH, BPF_MAP_TYPE_PERCPU_ARRAY, BPF_MAP_TYPE_PERCPU_HASH,
    BPF_MAP_TYPE_SOCKHASH,
};

use super::pins::{unpin, PinDir};
use super::{bpf_err, sys};
use crate::abi::MapDef;
use crate::backends::Result;

/// A pinned map retired by a resize, kept open until the flows written to
/// it after the first copy are moved over.
pub(super) struct Retired {
    pub def: MapDef,
    pub old: OwnedFd,
    pub old_entries: u32,
    /// The old map's value size: `def.value_size`, or one of its
    /// `grown_from`.
    pub old_value_size: u32,
}

impl Retired {
    /// Copies the old map's entries into `to` (see `copy_entries`).
    pub(super) fn copy_into(&self, to: BorrowedFd<'_>, only_missing: bool) -> io::Result<Copied> {
        copy_entries(self.old.as_fd(), to, &self.def, self.old_value_size, only_missing)
    }
}

/// Whether a map of this type can be filled from userspace with what a
/// lookup returns. A sockhash returns socket cookies but takes socket fds:
/// its listeners are registered again by the sidecar registrar instead.
pub(super) fn copyable(def: &MapDef) -> bool {
    def.map_type != BPF_MAP_TYPE_SOCKHASH as u32
}

/// Whether a pin whose values are `value_size` bytes can be migrated to
/// `def` by growing each value: a layout `def` says it grew from, in a map
/// of one value per key (a per-CPU value is one per CPU, each padded).
pub(super) fn grows(def: &MapDef, value_size: u32) -> bool {
    let per_cpu = [BPF_MAP_TYPE_PERCPU_ARRAY, BPF_MAP_TYPE_PERCPU_HASH, BPF_MAP_TYPE_LRU_PERCPU_HASH];
    def.grown_from.contains(&value_size) && !per_cpu.iter().any(|t| *t as u32 == def.map_type)
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

/// Copies the entries of `from` (values of `from_value_size` bytes) into
/// `to` (`def`: the same layout, or one grown from it, at any capacity).
/// A grown value is the old one followed by zeros. `only_missing` keeps
/// what `to` already has (its entries are newer). All-zero array values
/// are left out: they are the empty slots.
fn copy_entries(
    from: BorrowedFd<'_>,
    to: BorrowedFd<'_>,
    def: &MapDef,
    from_value_size: u32,
    only_missing: bool,
) -> io::Result<Copied> {
    let len = value_len(def)?;
    let from_len = value_len(&MapDef { value_size: from_value_size, ..*def })?;
    if from_len > len || (from_len < len && !grows(def, from_value_size)) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} values of {from_value_size} bytes are not a start of this build's", def.name),
        ));
    }
    let array = super::is_array(def);
    let how = if only_missing && !array { sys::Update::NoExist } else { sys::Update::Any };
    let mut out = Copied::default();
    for (key, mut value) in sys::map_dump(from, def.key_size as usize, from_len)? {
        if array && value.iter().all(|b| *b == 0) {
            continue;
        }
        value.resize(len, 0);
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

/// A pinned map with another layout (an upgrade changed it) is unpinned
/// so a new one is created. Programs still attached keep using the old
/// map until this build's programs replace them (they show as
/// outdated: their maps differ), so traffic keeps flowing. A map that
/// differs only in capacity is resized instead: returned, still open,
/// for its entries to be copied into the new one.
pub(super) fn retire_incompatible(pins: &PinDir, def: &MapDef, notes: &mut Vec<String>) -> Result<Option<Retired>> {
    let path = pins.map(def.map);
    let fd = match sys::obj_get(&path) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(bpf_err(format!("open pinned map {}", path.display()), e)),
    };
    let info = sys::map_info(fd.as_fd()).map_err(|e| bpf_err(format!("info of {}", path.display()), e))?;
    let same_kind = info.map_type == def.map_type && info.key_size == def.key_size && info.flags == def.flags;
    let same_layout = same_kind && info.value_size == def.value_size;
    if same_layout && info.max_entries == def.max_entries {
        return Ok(None);
    }
    unpin(&path).map_err(|e| bpf_err(format!("unpin {}", path.display()), e))?;
    let grown = same_kind && grows(def, info.value_size);
    if (same_layout || grown) && copyable(def) {
        return Ok(Some(Retired {
            def: *def,
            old: fd,
            old_entries: info.max_entries,
            old_value_size: info.value_size,
        }));
    }
    notes.push(if same_layout {
        format!(
            "map {} resized from {} to {} entries; sidecar listeners are registered again",
            def.name, info.max_entries, def.max_entries
        )
    } else {
        format!(
            "pinned map {} has another layout (type {} key {} value {} entries {}); replacing it with this build's \
             (type {} key {} value {} entries {})",
            def.name,
            info.map_type,
            info.key_size,
            info.value_size,
            info.max_entries,
            def.map_type,
            def.key_size,
            def.value_size,
            def.max_entries
        )
    });
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::{CtKey, HmMap, NatValue};
    use zerocopy::{FromBytes, IntoBytes};

    /// An anonymous map as the kernel makes it (root).
    fn map(def: &MapDef, value_size: u32) -> OwnedFd {
        sys::map_create(def.map_type, def.key_size, value_size, 64).expect("BPF_MAP_CREATE (root)")
    }

    #[test]
    fn a_flow_in_a_map_of_shorter_values_is_copied_with_the_new_fields_zero() {
        let def = MapDef { max_entries: 64, ..*HmMap::Nat.def() };
        let old_size = def.grown_from[0];
        assert!(old_size < def.value_size, "{def:?}");
        let (old, new) = (map(&def, old_size), map(&def, def.value_size));
        let key = CtKey { sport_be: 4242, proto: 6, ..Default::default() };
        let flow = NatValue { svc_id: 7, flags: 0x21, last_seen_ns: 99, dport_be: 80, ..Default::default() };
        sys::map_update(old.as_fd(), key.as_bytes(), &flow.as_bytes()[..old_size as usize]).unwrap();
        let retired = Retired { def, old, old_entries: 64, old_value_size: old_size };

        assert_eq!(retired.copy_into(new.as_fd(), false).unwrap(), Copied { copied: 1, skipped: 0 });
        let mut got = vec![0u8; def.value_size as usize];
        assert!(sys::map_lookup(new.as_fd(), key.as_bytes(), &mut got).unwrap());
        assert_eq!(NatValue::read_from_bytes(&got).unwrap(), flow, "the same flow, its next hop not known");
        // A copy of late flows keeps what the new map has.
        assert_eq!(retired.copy_into(new.as_fd(), true).unwrap(), Copied { copied: 0, skipped: 1 });
        // A size the layout did not grow from is refused, not garbled.
        let odd = Retired { old_value_size: old_size - 8, old: map(&def, old_size - 8), ..retired };
        assert!(odd.copy_into(new.as_fd(), false).is_err());
        assert!(!grows(&def, old_size - 8) && grows(&def, old_size));
    }
}
