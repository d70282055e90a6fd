//! The few bpf(2) commands hostmesh issues itself, on objects aya loaded:
//! opening pins, byte-level map access (the reconciler diffs maps as
//! bytes), link/program/map info, and the feature probes' loads. aya
//! issues these too but keeps them crate-private, so the calls are here;
//! every layout and constant is aya-obj's bindings of the kernel's
//! `include/uapi/linux/bpf.h`, none copied by hand.

use std::ffi::CString;
use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;

use aya_obj::generated::bpf_cmd::{self, *};
pub use aya_obj::generated::bpf_insn as Insn;
pub use aya_obj::generated::{bpf_attach_type, bpf_link_type, bpf_prog_type};
use aya_obj::generated::{bpf_attr, bpf_link_info, bpf_map_info, bpf_prog_info, BPF_ANY, BPF_F_RDONLY, BPF_NOEXIST};

/// A zeroed `bpf_attr`: the kernel requires every byte a command does not
/// use to be zero.
pub(super) fn attr() -> bpf_attr {
    // SAFETY: bpf_attr is a union of integer-only structs; all zeroes is a
    // valid value of each.
    unsafe { zeroed() }
}

pub(super) fn bpf(cmd: bpf_cmd, attr: &mut bpf_attr) -> io::Result<i64> {
    // SAFETY: attr is a whole, zero-initialised bpf_attr, and every pointer
    // set in it outlives the call.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd as libc::c_long, attr as *mut bpf_attr, size_of::<bpf_attr>()) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

pub(super) fn fd_from(rc: i64) -> OwnedFd {
    // SAFETY: the kernel just returned this fd to us and nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(rc as i32) }
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path has a NUL byte"))
}

/// Pins an object (map, program or link) at `path`.
pub fn obj_pin(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    let c = c_path(path)?;
    let mut a = attr();
    a.__bindgen_anon_4.pathname = c.as_ptr() as u64;
    a.__bindgen_anon_4.bpf_fd = fd.as_raw_fd() as u32;
    bpf(BPF_OBJ_PIN, &mut a).map(|_| ())
}

/// Opens a pinned object (map, program or link).
pub fn obj_get(path: &Path) -> io::Result<OwnedFd> {
    let c = c_path(path)?;
    let mut a = attr();
    a.__bindgen_anon_4.pathname = c.as_ptr() as u64;
    bpf(BPF_OBJ_GET, &mut a).map(fd_from)
}

/// A map of no name, held only by the returned fd (the batch probe, tests).
pub fn map_create(map_type: u32, key_size: u32, value_size: u32, max_entries: u32) -> io::Result<OwnedFd> {
    let mut a = attr();
    a.__bindgen_anon_1.map_type = map_type;
    a.__bindgen_anon_1.key_size = key_size;
    a.__bindgen_anon_1.value_size = value_size;
    a.__bindgen_anon_1.max_entries = max_entries;
    bpf(BPF_MAP_CREATE, &mut a).map(fd_from)
}

/// The element commands' attributes: map, key, value (or next key), flags.
fn elem_attr(fd: BorrowedFd<'_>, key: u64, value: u64, flags: u64) -> bpf_attr {
    let mut a = attr();
    a.__bindgen_anon_2.map_fd = fd.as_raw_fd() as u32;
    a.__bindgen_anon_2.key = key;
    a.__bindgen_anon_2.__bindgen_anon_1.value = value;
    a.__bindgen_anon_2.flags = flags;
    a
}

pub fn map_lookup(fd: BorrowedFd<'_>, key: &[u8], value: &mut [u8]) -> io::Result<bool> {
    let mut a = elem_attr(fd, key.as_ptr() as u64, value.as_mut_ptr() as u64, 0);
    match bpf(BPF_MAP_LOOKUP_ELEM, &mut a) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Creates or replaces.
pub fn map_update(fd: BorrowedFd<'_>, key: &[u8], value: &[u8]) -> io::Result<()> {
    map_update_with(fd, key, value, Update::Any)
}

/// How an update treats a key that is there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Update {
    /// Create or replace (`BPF_ANY`).
    Any,
    /// Create only: EEXIST when the key is there (`BPF_NOEXIST`).
    NoExist,
}

pub fn map_update_with(fd: BorrowedFd<'_>, key: &[u8], value: &[u8], how: Update) -> io::Result<()> {
    let flags = match how {
        Update::Any => BPF_ANY,
        Update::NoExist => BPF_NOEXIST,
    };
    let mut a = elem_attr(fd, key.as_ptr() as u64, value.as_ptr() as u64, u64::from(flags));
    bpf(BPF_MAP_UPDATE_ELEM, &mut a).map(|_| ())
}

/// Deleting a missing key succeeds.
pub fn map_delete(fd: BorrowedFd<'_>, key: &[u8]) -> io::Result<()> {
    let mut a = elem_attr(fd, key.as_ptr() as u64, 0, 0);
    match bpf(BPF_MAP_DELETE_ELEM, &mut a) {
        Err(e) if e.raw_os_error() != Some(libc::ENOENT) => Err(e),
        _ => Ok(()),
    }
}

/// Every key of a map. When a program deletes the key we stand on (an LRU
/// eviction), the kernel restarts from the first key; the walk stops at
/// the first key it has already seen rather than going round again.
pub fn map_keys(fd: BorrowedFd<'_>, key_size: usize) -> io::Result<Vec<Vec<u8>>> {
    let mut out: Vec<Vec<u8>> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    loop {
        let mut next = vec![0u8; key_size];
        let mut a = elem_attr(fd, out.last().map_or(0, |k| k.as_ptr() as u64), next.as_mut_ptr() as u64, 0);
        match bpf(BPF_MAP_GET_NEXT_KEY, &mut a) {
            Ok(_) if seen.insert(next.clone()) => out.push(next),
            Ok(_) => return Ok(out),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(out),
            Err(e) => return Err(e),
        }
    }
}

/// Every (key, value) of a map. `value_size` is the total size the kernel
/// copies out (per-CPU maps: rounded size times CPUs). In batches where
/// the kernel and the map type have them (BPF_MAP_LOOKUP_BATCH, Linux 5.6:
/// a few system calls for a whole map), key by key otherwise (LPM tries,
/// older kernels: two calls per entry).
pub fn map_dump(fd: BorrowedFd<'_>, key_size: usize, value_size: usize) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut out = Vec::new();
    map_for_each(fd, key_size, value_size, |k, v| out.push((k.to_vec(), v.to_vec())))?;
    Ok(out)
}

/// `map_dump`, each (key, value) handed to `each` as it is read instead of
/// collected: observe keeps a digest of the 400,000 Maglev chunks of
/// 100,000 services, not a copy. When the batch call turns out not to be
/// supported on its first call, nothing has been handed over yet and the
/// walk starts again key by key.
pub fn map_for_each(
    fd: BorrowedFd<'_>,
    key_size: usize,
    value_size: usize,
    each: impl FnMut(&[u8], &[u8]),
) -> io::Result<()> {
    map_for_each_until(fd, key_size, value_size, each, &|| false).map(|_| ())
}

/// `map_for_each` that gives up between batches (or keys) once `give_up`
/// says so: Ok(false) then, Ok(true) when every entry was handed over.
pub fn map_for_each_until(
    fd: BorrowedFd<'_>,
    key_size: usize,
    value_size: usize,
    mut each: impl FnMut(&[u8], &[u8]),
    give_up: &dyn Fn() -> bool,
) -> io::Result<bool> {
    match map_for_each_batched(fd, key_size, value_size, &mut each, give_up) {
        Err(e) if batch_not_supported(&e) => map_for_each_by_key(fd, key_size, value_size, &mut each, give_up),
        r => r,
    }
}

/// The kernel's own "not supported" (not a userspace errno, but returned
/// by some map types for batch operations).
const ENOTSUPP: i32 = 524;

/// The kernel's answers to a batch command it lacks: EINVAL from kernels
/// that do not know it, ENOTSUPP or EOPNOTSUPP from map types without it
/// (5.10's LPM tries).
pub(super) fn batch_not_supported(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) | Some(ENOTSUPP))
}

/// Entries per BPF_MAP_LOOKUP_BATCH: more than any hash bucket holds.
const BATCH: usize = 4096;

fn map_for_each_batched(
    fd: BorrowedFd<'_>,
    key_size: usize,
    value_size: usize,
    each: &mut impl FnMut(&[u8], &[u8]),
    give_up: &dyn Fn() -> bool,
) -> io::Result<bool> {
    // The position between calls: a bucket (u32) for hash maps, a key
    // for arrays.
    let token = key_size.max(8);
    let (mut position, mut next) = (vec![0u8; token], vec![0u8; token]);
    let mut keys = vec![0u8; key_size * BATCH];
    let mut values = vec![0u8; value_size * BATCH];
    let mut first = true;
    loop {
        if !first && give_up() {
            return Ok(false);
        }
        let mut a = attr();
        a.batch.in_batch = if first { 0 } else { position.as_ptr() as u64 };
        a.batch.out_batch = next.as_mut_ptr() as u64;
        a.batch.keys = keys.as_mut_ptr() as u64;
        a.batch.values = values.as_mut_ptr() as u64;
        a.batch.count = BATCH as u32;
        a.batch.map_fd = fd.as_raw_fd() as u32;
        let result = bpf(BPF_MAP_LOOKUP_BATCH, &mut a);
        // SAFETY: the kernel writes back the batch view it was given.
        let count = (unsafe { a.batch.count } as usize).min(BATCH);
        match &result {
            Ok(_) => {}
            // The end; the last entries came with it.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            // "Not supported" falls back to key by key only while nothing
            // has been handed over; later, any error is the walk's.
            Err(_) if first => return result.map(|_| true),
            Err(e) => return Err(io::Error::other(format!("batch lookup failed part way: {e}"))),
        }
        for i in 0..count {
            each(&keys[i * key_size..(i + 1) * key_size], &values[i * value_size..(i + 1) * value_size]);
        }
        if result.is_err() {
            return Ok(true);
        }
        position.copy_from_slice(&next);
        first = false;
    }
}

fn map_for_each_by_key(
    fd: BorrowedFd<'_>,
    key_size: usize,
    value_size: usize,
    each: &mut impl FnMut(&[u8], &[u8]),
    give_up: &dyn Fn() -> bool,
) -> io::Result<bool> {
    let mut value = vec![0u8; value_size];
    for (i, key) in map_keys(fd, key_size)?.iter().enumerate() {
        if i % 4096 == 4095 && give_up() {
            return Ok(false);
        }
        // A key deleted between the two calls is simply skipped.
        if map_lookup(fd, key, &mut value)? {
            each(key, &value);
        }
    }
    Ok(true)
}

/// BPF_OBJ_GET_INFO_BY_FD into `info`, one of the kernel's info structs.
fn info_by_fd<T>(fd: BorrowedFd<'_>, info: &mut T) -> io::Result<()> {
    let mut a = attr();
    a.info.bpf_fd = fd.as_raw_fd() as u32;
    a.info.info_len = size_of::<T>() as u32;
    a.info.info = info as *mut T as u64;
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut a).map(|_| ())
}

/// A zeroed info struct (integers and arrays only, so zeroes are valid).
fn zeroed_info<T: Copy>() -> T {
    // SAFETY: used only for bpf_{map,prog,link}_info, whose fields are
    // integers, arrays of integers and unions of such.
    unsafe { zeroed() }
}

/// A NUL-padded name of bpf_prog_info or bpf_map_info.
fn c_name(b: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = b.iter().map(|c| *c as u8).take_while(|c| *c != 0).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapInfo {
    pub map_type: u32,
    pub id: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub flags: u32,
    /// Its name as created (at most 15 bytes).
    pub name: String,
}

pub fn map_info(fd: BorrowedFd<'_>) -> io::Result<MapInfo> {
    let mut i: bpf_map_info = zeroed_info();
    info_by_fd(fd, &mut i)?;
    Ok(MapInfo {
        map_type: i.type_,
        id: i.id,
        key_size: i.key_size,
        value_size: i.value_size,
        max_entries: i.max_entries,
        flags: i.map_flags,
        name: c_name(&i.name),
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkInfo {
    pub link_type: Option<bpf_link_type>,
    pub id: u32,
    pub prog_id: u32,
    /// TCX links: the interface, 0 once it is gone.
    pub tcx_ifindex: u32,
    /// Cgroup links: the cgroup's id (its inode number), 0 once detached.
    pub cgroup_id: u64,
    /// Netns links: the namespace's inode number, 0 once it is gone.
    pub netns_ino: u32,
}

pub fn link_info(fd: BorrowedFd<'_>) -> io::Result<LinkInfo> {
    use bpf_link_type::*;
    let mut i: bpf_link_info = zeroed_info();
    info_by_fd(fd, &mut i)?;
    let link_type =
        [BPF_LINK_TYPE_CGROUP, BPF_LINK_TYPE_NETNS, BPF_LINK_TYPE_TCX].into_iter().find(|t| *t as u32 == i.type_);
    // SAFETY: each view is read only for the link type that fills it.
    let (tcx_ifindex, cgroup_id, netns_ino) = unsafe {
        match link_type {
            Some(BPF_LINK_TYPE_TCX) => (i.__bindgen_anon_1.tcx.ifindex, 0, 0),
            Some(BPF_LINK_TYPE_CGROUP) => (0, i.__bindgen_anon_1.cgroup.cgroup_id, 0),
            Some(BPF_LINK_TYPE_NETNS) => (0, 0, i.__bindgen_anon_1.netns.netns_ino),
            _ => (0, 0, 0),
        }
    };
    Ok(LinkInfo { link_type, id: i.id, prog_id: i.prog_id, tcx_ifindex, cgroup_id, netns_ino })
}

/// Loads a program from raw instructions (the feature probes). On failure
/// returns the errno and the verifier's log.
pub fn prog_load(
    prog_type: bpf_prog_type,
    expected_attach_type: Option<bpf_attach_type>,
    insns: &[Insn],
) -> Result<OwnedFd, (io::Error, String)> {
    let license = c"GPL";
    let mut log = vec![0u8; 4096];
    let mut a = attr();
    // SAFETY: writing plain integers into the union's prog_load view.
    let load = unsafe { &mut a.__bindgen_anon_3 };
    load.prog_type = prog_type as u32;
    load.insn_cnt = insns.len() as u32;
    load.insns = insns.as_ptr() as u64;
    load.license = license.as_ptr() as u64;
    load.log_level = 1;
    load.log_size = log.len() as u32;
    load.log_buf = log.as_mut_ptr() as u64;
    load.expected_attach_type = expected_attach_type.map_or(0, |t| t as u32);
    let _held = super::held_signals::HeldSignals::new();
    match bpf(BPF_PROG_LOAD, &mut a) {
        Ok(rc) => Ok(fd_from(rc)),
        Err(e) => {
            let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
            Err((e, String::from_utf8_lossy(&log[..end]).trim().to_string()))
        }
    }
}

/// What one BPF_PROG_TEST_RUN gives back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestRun {
    /// The program's return value.
    pub retval: u32,
    /// The packet as the program left it (for packet programs).
    pub data: Vec<u8>,
    /// The context as the program left it (where the kernel copies it out).
    pub ctx: Vec<u8>,
}

/// Runs a loaded program once (BPF_PROG_TEST_RUN) on `packet` and, for
/// programs that take one, the context `ctx` (an `__sk_buff`, a
/// `bpf_sk_lookup`).
pub fn prog_test_run(prog: BorrowedFd<'_>, packet: &[u8], ctx: &[u8]) -> io::Result<TestRun> {
    // Room for the packet to grow (encapsulation).
    let mut data = vec![0u8; packet.len() + 256];
    let mut ctx_out = vec![0u8; ctx.len()];
    let mut a = attr();
    a.test.prog_fd = prog.as_raw_fd() as u32;
    a.test.data_size_in = packet.len() as u32;
    a.test.data_in = if packet.is_empty() { 0 } else { packet.as_ptr() as u64 };
    a.test.data_size_out = if packet.is_empty() { 0 } else { data.len() as u32 };
    a.test.data_out = if packet.is_empty() { 0 } else { data.as_mut_ptr() as u64 };
    a.test.ctx_size_in = ctx.len() as u32;
    a.test.ctx_in = if ctx.is_empty() { 0 } else { ctx.as_ptr() as u64 };
    a.test.ctx_size_out = ctx_out.len() as u32;
    a.test.ctx_out = if ctx.is_empty() { 0 } else { ctx_out.as_mut_ptr() as u64 };
    a.test.repeat = 1;
    bpf(BPF_PROG_TEST_RUN, &mut a)?;
    // SAFETY: the kernel writes back the test view it was given.
    let (retval, data_len, ctx_len) = unsafe { (a.test.retval, a.test.data_size_out, a.test.ctx_size_out) };
    data.truncate(data_len as usize);
    ctx_out.truncate(ctx_len as usize);
    Ok(TestRun { retval, data, ctx: ctx_out })
}

/// BPF_LINK_CREATE for a program on an interface (`target_ifindex`).
pub fn link_create(prog: BorrowedFd<'_>, target: u32, attach_type: bpf_attach_type) -> io::Result<OwnedFd> {
    let mut a = attr();
    a.link_create.__bindgen_anon_1.prog_fd = prog.as_raw_fd() as u32;
    a.link_create.__bindgen_anon_2.target_ifindex = target;
    a.link_create.attach_type = attach_type as u32;
    bpf(BPF_LINK_CREATE, &mut a).map(fd_from)
}

/// Atomically replaces the program behind a link.
pub fn link_update(link: BorrowedFd<'_>, prog: BorrowedFd<'_>) -> io::Result<()> {
    let mut a = attr();
    a.link_update.link_fd = link.as_raw_fd() as u32;
    a.link_update.__bindgen_anon_1.new_prog_fd = prog.as_raw_fd() as u32;
    bpf(BPF_LINK_UPDATE, &mut a).map(|_| ())
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgInfo {
    pub id: u32,
    pub tag: [u8; 8],
    /// The maps the program uses, sorted.
    pub map_ids: Vec<u32>,
    /// Its name as loaded (at most 15 bytes).
    pub name: String,
}

pub fn prog_info(fd: BorrowedFd<'_>) -> io::Result<ProgInfo> {
    // The kernel fills as many map ids as we make room for.
    let mut ids = [0u32; 64];
    let mut i: bpf_prog_info = zeroed_info();
    i.nr_map_ids = ids.len() as u32;
    i.map_ids = ids.as_mut_ptr() as u64;
    info_by_fd(fd, &mut i)?;
    let n = (i.nr_map_ids as usize).min(ids.len());
    let mut map_ids = ids[..n].to_vec();
    map_ids.sort_unstable();
    Ok(ProgInfo { id: i.id, tag: i.tag, map_ids, name: c_name(&i.name) })
}

/// The info of a loaded program by id; `None` once it has been freed.
/// Needs CAP_SYS_ADMIN: hostmesh reads the program a link runs from the
/// program's pin instead, and uses this only for pins of older builds.
pub fn prog_info_by_id(id: u32) -> io::Result<Option<ProgInfo>> {
    match prog_fd_by_id(id)? {
        Some(fd) => prog_info(std::os::fd::AsFd::as_fd(&fd)).map(Some),
        None => Ok(None),
    }
}

/// A loaded program by id; `None` once it has been freed. Needs
/// CAP_SYS_ADMIN.
pub fn prog_fd_by_id(id: u32) -> io::Result<Option<OwnedFd>> {
    fd_by_id(BPF_PROG_GET_FD_BY_ID, id)
}

/// A map by id, opened read-only; `None` once it has been freed. Needs
/// CAP_SYS_ADMIN.
pub fn map_fd_by_id(id: u32) -> io::Result<Option<OwnedFd>> {
    fd_by_id(BPF_MAP_GET_FD_BY_ID, id)
}

fn fd_by_id(cmd: bpf_cmd, id: u32) -> io::Result<Option<OwnedFd>> {
    let mut a = attr();
    a.__bindgen_anon_6.__bindgen_anon_1.start_id = id;
    // Read-only (ignored for programs): a frozen map opens too.
    a.__bindgen_anon_6.open_flags = if cmd == BPF_MAP_GET_FD_BY_ID { BPF_F_RDONLY } else { 0 };
    match bpf(cmd, &mut a) {
        Ok(rc) => Ok(Some(fd_from(rc))),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}
