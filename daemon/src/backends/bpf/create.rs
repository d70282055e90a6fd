//! Maps created ahead of the objects' load: those a load needs and does
//! not find pinned (all of them on a first start), made and pinned by
//! several threads at once, so the loader finds every pin.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use aya_obj::generated::bpf_cmd::BPF_MAP_CREATE;

use super::pins::PinDir;
use super::{bpf_err, sys};
use crate::abi::MapDef;
use crate::backends::Result;

/// Creates and pins, a share on each of several threads, the maps that
/// are not pinned (all of them on a first start), while `beside` runs on
/// this one: the loader then finds their pins. The conntrack maps are
/// allocated whole, 5 ms each to create; one after another, the maps took
/// half of a first start's load.
pub(super) fn missing_beside<T>(pins: &PinDir, defs: &[MapDef], beside: impl FnOnce() -> T) -> (T, Result<()>) {
    let mut missing: Vec<&MapDef> = defs.iter().filter(|d| !pins.map(d.map).exists()).collect();
    // Largest first, each to the thread with the least so far.
    missing.sort_by_key(|d| std::cmp::Reverse(creation_cost(d)));
    let threads = super::batch::helper_threads().min(missing.len());
    let mut shares: Vec<(u64, Vec<&MapDef>)> = vec![(0, Vec::new()); threads];
    for d in missing {
        let least = shares.iter_mut().min_by_key(|(cost, _)| *cost).expect("a thread for each map or more");
        least.0 += creation_cost(d);
        least.1.push(d);
    }
    let create = |share: &[&MapDef]| -> Result<()> {
        for d in share {
            let path = pins.map(d.map);
            let fd = map_create_as(d).map_err(|e| bpf_err(format!("create map {}", d.name), e))?;
            sys::obj_pin(fd.as_fd(), &path).map_err(|e| bpf_err(format!("pin {}", path.display()), e))?;
        }
        Ok(())
    };
    std::thread::scope(|scope| {
        let creating: Vec<_> = shares.iter().map(|(_, share)| scope.spawn(|| create(share))).collect();
        let out = beside();
        let mut result = Ok(());
        for t in creating {
            let joined = t.join().unwrap_or_else(|_| Err(bpf_err("create the maps", "a creating thread panicked")));
            result = result.and(joined);
        }
        (out, result)
    })
}

/// What creating a map costs, roughly: a map allocated whole (LRU hashes,
/// arrays) its entries' bytes; one that allocates entries as they come,
/// its table of buckets.
fn creation_cost(d: &MapDef) -> u64 {
    let per_entry =
        if d.flags & aya_obj::generated::BPF_F_NO_PREALLOC != 0 { 8 } else { d.key_size + d.value_size + 64 };
    u64::from(d.max_entries) * u64::from(per_entry)
}

/// A map as `def` describes it, named as its pin (the kernel keeps 15
/// bytes of a name).
fn map_create_as(def: &MapDef) -> io::Result<OwnedFd> {
    let mut a = sys::attr();
    a.__bindgen_anon_1.map_type = def.map_type;
    a.__bindgen_anon_1.key_size = def.key_size;
    a.__bindgen_anon_1.value_size = def.value_size;
    a.__bindgen_anon_1.max_entries = def.max_entries;
    a.__bindgen_anon_1.map_flags = def.flags;
    let mut name = [0 as std::ffi::c_char; 16];
    for (to, from) in name.iter_mut().zip(def.name.bytes().take(15)) {
        *to = from as std::ffi::c_char;
    }
    a.__bindgen_anon_1.map_name = name;
    sys::bpf(BPF_MAP_CREATE, &mut a).map(sys::fd_from)
}
