//! The few bpf(2) commands hostmesh issues itself, on objects aya loaded:
//! opening pins, byte-level map access (the reconciler diffs maps as
//! bytes), and link/program/map info. Layouts follow include/uapi/linux/bpf.h.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;

const BPF_MAP_LOOKUP_ELEM: i64 = 1;
const BPF_MAP_UPDATE_ELEM: i64 = 2;
const BPF_MAP_DELETE_ELEM: i64 = 3;
const BPF_MAP_GET_NEXT_KEY: i64 = 4;
const BPF_PROG_LOAD: i64 = 5;
const BPF_OBJ_PIN: i64 = 6;
const BPF_OBJ_GET: i64 = 7;
const BPF_PROG_TEST_RUN: i64 = 10;
const BPF_PROG_GET_FD_BY_ID: i64 = 13;
const BPF_MAP_GET_FD_BY_ID: i64 = 14;
const BPF_MAP_LOOKUP_BATCH: i64 = 24;
const BPF_OBJ_GET_INFO_BY_FD: i64 = 15;
const BPF_LINK_CREATE: i64 = 28;
const BPF_LINK_UPDATE: i64 = 29;

const BPF_F_RDONLY: u32 = 1 << 3;

pub const BPF_LINK_TYPE_CGROUP: u32 = 3;
pub const BPF_LINK_TYPE_NETNS: u32 = 5;
pub const BPF_LINK_TYPE_TCX: u32 = 11;

/// bpf_attr is a union of at most 144 bytes here; commands read a prefix.
#[repr(C, align(8))]
struct Attr([u8; 144]);

impl Attr {
    fn new() -> Self {
        Attr([0; 144])
    }
    fn u32(mut self, off: usize, v: u32) -> Self {
        self.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64(mut self, off: usize, v: u64) -> Self {
        self.0[off..off + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }
}

fn bpf(cmd: i64, attr: &mut Attr) -> io::Result<i64> {
    // SAFETY: attr is a properly aligned, zero-initialised bpf_attr-sized
    // buffer, and every pointer in it outlives the call.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut Attr, std::mem::size_of::<Attr>()) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn fd_from(rc: i64) -> OwnedFd {
    // SAFETY: the kernel just returned this fd to us and nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(rc as i32) }
}

/// Pins an object (map, program or link) at `path`.
pub fn obj_pin(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    let c = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path has a NUL byte"))?;
    let mut attr = Attr::new().u64(0, c.as_ptr() as u64).u32(8, fd.as_raw_fd() as u32);
    bpf(BPF_OBJ_PIN, &mut attr).map(|_| ())
}

/// Opens a pinned object (map, program or link).
pub fn obj_get(path: &Path) -> io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path has a NUL byte"))?;
    let mut attr = Attr::new().u64(0, c.as_ptr() as u64);
    bpf(BPF_OBJ_GET, &mut attr).map(fd_from)
}

pub fn map_lookup(fd: BorrowedFd<'_>, key: &[u8], value: &mut [u8]) -> io::Result<bool> {
    let mut attr =
        Attr::new().u32(0, fd.as_raw_fd() as u32).u64(8, key.as_ptr() as u64).u64(16, value.as_mut_ptr() as u64);
    match bpf(BPF_MAP_LOOKUP_ELEM, &mut attr) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

pub fn map_update(fd: BorrowedFd<'_>, key: &[u8], value: &[u8]) -> io::Result<()> {
    map_update_with(fd, key, value, BPF_ANY)
}

/// Create or replace.
pub const BPF_ANY: u64 = 0;
/// Create only: EEXIST when the key is there.
pub const BPF_NOEXIST: u64 = 1;

pub fn map_update_with(fd: BorrowedFd<'_>, key: &[u8], value: &[u8], flags: u64) -> io::Result<()> {
    let mut attr = Attr::new()
        .u32(0, fd.as_raw_fd() as u32)
        .u64(8, key.as_ptr() as u64)
        .u64(16, value.as_ptr() as u64)
        .u64(24, flags);
    bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map(|_| ())
}

/// Deleting a missing key succeeds.
pub fn map_delete(fd: BorrowedFd<'_>, key: &[u8]) -> io::Result<()> {
    let mut attr = Attr::new().u32(0, fd.as_raw_fd() as u32).u64(8, key.as_ptr() as u64);
    match bpf(BPF_MAP_DELETE_ELEM, &mut attr) {
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
        let mut attr = Attr::new()
            .u32(0, fd.as_raw_fd() as u32)
            .u64(8, out.last().map_or(0, |k| k.as_ptr() as u64))
            .u64(16, next.as_mut_ptr() as u64);
        match bpf(BPF_MAP_GET_NEXT_KEY, &mut attr) {
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
    mut each: impl FnMut(&[u8], &[u8]),
) -> io::Result<()> {
    match map_for_each_batched(fd, key_size, value_size, &mut each) {
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) | Some(ENOTSUPP)) => {
            map_for_each_by_key(fd, key_size, value_size, &mut each)
        }
        r => r,
    }
}

/// The kernel's own "not supported" (not a userspace errno, but returned
/// by some map types for batch operations).
const ENOTSUPP: i32 = 524;

/// Entries per BPF_MAP_LOOKUP_BATCH: more than any hash bucket holds.
const BATCH: usize = 4096;

fn map_for_each_batched(
    fd: BorrowedFd<'_>,
    key_size: usize,
    value_size: usize,
    each: &mut impl FnMut(&[u8], &[u8]),
) -> io::Result<()> {
    // The position between calls: a bucket (u32) for hash maps, a key
    // for arrays.
    let token = key_size.max(8);
    let (mut position, mut next) = (vec![0u8; token], vec![0u8; token]);
    let mut keys = vec![0u8; key_size * BATCH];
    let mut values = vec![0u8; value_size * BATCH];
    let mut first = true;
    loop {
        let mut attr = Attr::new()
            .u64(0, if first { 0 } else { position.as_ptr() as u64 })
            .u64(8, next.as_mut_ptr() as u64)
            .u64(16, keys.as_mut_ptr() as u64)
            .u64(24, values.as_mut_ptr() as u64)
            .u32(32, BATCH as u32)
            .u32(36, fd.as_raw_fd() as u32);
        let result = bpf(BPF_MAP_LOOKUP_BATCH, &mut attr);
        let count = (rd32(&attr.0, 32) as usize).min(BATCH);
        match &result {
            Ok(_) => {}
            // The end; the last entries came with it.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            // "Not supported" falls back to key by key only while nothing
            // has been handed over; later, any error is the walk's.
            Err(_) if first => return result.map(|_| ()),
            Err(e) => return Err(io::Error::other(format!("batch lookup failed part way: {e}"))),
        }
        for i in 0..count {
            each(&keys[i * key_size..(i + 1) * key_size], &values[i * value_size..(i + 1) * value_size]);
        }
        if result.is_err() {
            return Ok(());
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
) -> io::Result<()> {
    let mut value = vec![0u8; value_size];
    for key in map_keys(fd, key_size)? {
        // A key deleted between the two calls is simply skipped.
        if map_lookup(fd, &key, &mut value)? {
            each(&key, &value);
        }
    }
    Ok(())
}

fn info_by_fd(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<()> {
    let mut attr = Attr::new().u32(0, fd.as_raw_fd() as u32).u32(4, buf.len() as u32).u64(8, buf.as_mut_ptr() as u64);
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr).map(|_| ())
}

/// A NUL-padded name of bpf_prog_info or bpf_map_info.
fn c_name(b: &[u8]) -> String {
    let end = b.iter().position(|c| *c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

fn rd32(b: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes(b[off..off + 4].try_into().expect("4 bytes"))
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
    let mut b = [0u8; 88];
    info_by_fd(fd, &mut b)?;
    Ok(MapInfo {
        map_type: rd32(&b, 0),
        id: rd32(&b, 4),
        key_size: rd32(&b, 8),
        value_size: rd32(&b, 12),
        max_entries: rd32(&b, 16),
        flags: rd32(&b, 20),
        name: c_name(&b[24..40]),
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkInfo {
    pub link_type: u32,
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
    let mut b = [0u8; 64];
    info_by_fd(fd, &mut b)?;
    Ok(LinkInfo {
        link_type: rd32(&b, 0),
        id: rd32(&b, 4),
        prog_id: rd32(&b, 8),
        tcx_ifindex: rd32(&b, 16),
        cgroup_id: u64::from_ne_bytes(b[16..24].try_into().expect("8 bytes")),
        netns_ino: rd32(&b, 16),
    })
}

/// One eBPF instruction (`struct bpf_insn`).
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct Insn {
    pub code: u8,
    /// dst_reg in the low nibble, src_reg in the high one.
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

/// Loads a program from raw instructions (the feature probes). On failure
/// returns the errno and the verifier's log.
pub fn prog_load(prog_type: u32, expected_attach_type: u32, insns: &[Insn]) -> Result<OwnedFd, (io::Error, String)> {
    let license = c"GPL";
    let mut log = vec![0u8; 4096];
    let mut attr = Attr::new()
        .u32(0, prog_type)
        .u32(4, insns.len() as u32)
        .u64(8, insns.as_ptr() as u64)
        .u64(16, license.as_ptr() as u64)
        .u32(24, 1)
        .u32(28, log.len() as u32)
        .u64(32, log.as_mut_ptr() as u64)
        .u32(68, expected_attach_type);
    match bpf(BPF_PROG_LOAD, &mut attr) {
        Ok(rc) => Ok(fd_from(rc)),
        Err(e) => {
            let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
            Err((e, String::from_utf8_lossy(&log[..end]).trim().to_string()))
        }
    }
}

/// Runs a loaded program once on `packet` (BPF_PROG_TEST_RUN); returns
/// its return value.
pub fn prog_test_run(prog: BorrowedFd<'_>, packet: &[u8]) -> io::Result<u32> {
    let mut attr = Attr::new()
        .u32(0, prog.as_raw_fd() as u32)
        .u32(8, packet.len() as u32)
        .u64(16, packet.as_ptr() as u64)
        .u32(32, 1);
    bpf(BPF_PROG_TEST_RUN, &mut attr)?;
    Ok(u32::from_ne_bytes(attr.0[4..8].try_into().expect("4 bytes")))
}

/// BPF_LINK_CREATE for a program on an interface (`target_ifindex`).
pub fn link_create(prog: BorrowedFd<'_>, target: u32, attach_type: u32) -> io::Result<OwnedFd> {
    let mut attr = Attr::new().u32(0, prog.as_raw_fd() as u32).u32(4, target).u32(8, attach_type);
    bpf(BPF_LINK_CREATE, &mut attr).map(fd_from)
}

/// Atomically replaces the program behind a link.
pub fn link_update(link: BorrowedFd<'_>, prog: BorrowedFd<'_>) -> io::Result<()> {
    let mut attr = Attr::new().u32(0, link.as_raw_fd() as u32).u32(4, prog.as_raw_fd() as u32);
    bpf(BPF_LINK_UPDATE, &mut attr).map(|_| ())
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
    let mut ids = [0u32; 64];
    // bpf_prog_info: nr_map_ids at 52, map_ids (a pointer) at 56; the
    // kernel fills as many ids as we make room for.
    let mut b = [0u8; 80];
    b[52..56].copy_from_slice(&(ids.len() as u32).to_ne_bytes());
    b[56..64].copy_from_slice(&(ids.as_mut_ptr() as u64).to_ne_bytes());
    info_by_fd(fd, &mut b)?;
    let n = (rd32(&b, 52) as usize).min(ids.len());
    let mut map_ids = ids[..n].to_vec();
    map_ids.sort_unstable();
    Ok(ProgInfo { id: rd32(&b, 4), tag: b[8..16].try_into().expect("8 bytes"), map_ids, name: c_name(&b[64..80]) })
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

fn fd_by_id(cmd: i64, id: u32) -> io::Result<Option<OwnedFd>> {
    // open_flags BPF_F_RDONLY (ignored for programs): a frozen map opens too.
    let mut attr = Attr::new().u32(0, id).u32(8, if cmd == BPF_MAP_GET_FD_BY_ID { BPF_F_RDONLY } else { 0 });
    match bpf(cmd, &mut attr) {
        Ok(rc) => Ok(Some(fd_from(rc))),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}
