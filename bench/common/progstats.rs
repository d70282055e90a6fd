//! What each BPF program costs per run, from the kernel's own counters
//! (run_time_ns and run_cnt of bpf_prog_info). BPF_ENABLE_STATS turns the
//! counting on only while this process holds the fd it returns, so the
//! machine's `kernel.bpf_stats_enabled` sysctl is never written.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const BPF_PROG_GET_NEXT_ID: i64 = 11;
const BPF_PROG_GET_FD_BY_ID: i64 = 13;
const BPF_OBJ_GET_INFO_BY_FD: i64 = 15;
const BPF_ENABLE_STATS: i64 = 32;

fn bpf(cmd: i64, attr: &mut [u8; 128]) -> io::Result<i64> {
    // SAFETY: attr is a zeroed buffer larger than every bpf_attr variant
    // used here; the one pointer in it (info) outlives the call.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// Run-time statistics are collected while this lives.
pub struct StatsEnabled(#[allow(dead_code)] OwnedFd);

pub fn enable() -> io::Result<StatsEnabled> {
    let mut attr = [0u8; 128]; // enable_stats.type = BPF_STATS_RUN_TIME (0)
    let fd = bpf(BPF_ENABLE_STATS, &mut attr)?;
    // SAFETY: a new fd the kernel just returned.
    Ok(StatsEnabled(unsafe { OwnedFd::from_raw_fd(fd as i32) }))
}

/// Time and runs so far, by program name, summed over the programs of
/// that name whose names start with `prefix`.
#[derive(Debug, Clone, Default)]
pub struct Snapshot(pub BTreeMap<String, (u64, u64)>);

pub fn snapshot(prefix: &str) -> Snapshot {
    let mut out = BTreeMap::new();
    let mut id = 0u32;
    loop {
        let mut attr = [0u8; 128];
        attr[0..4].copy_from_slice(&id.to_ne_bytes());
        if bpf(BPF_PROG_GET_NEXT_ID, &mut attr).is_err() {
            break;
        }
        id = u32::from_ne_bytes(attr[4..8].try_into().unwrap());
        let mut attr = [0u8; 128];
        attr[0..4].copy_from_slice(&id.to_ne_bytes());
        let Ok(fd) = bpf(BPF_PROG_GET_FD_BY_ID, &mut attr) else { continue };
        // SAFETY: a new fd the kernel just returned.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        // bpf_prog_info: name at 64 (16 bytes), run_time_ns at 192,
        // run_cnt at 200.
        let mut info = [0u8; 256];
        let mut attr = [0u8; 128];
        attr[0..4].copy_from_slice(&(fd.as_raw_fd() as u32).to_ne_bytes());
        attr[4..8].copy_from_slice(&(info.len() as u32).to_ne_bytes());
        attr[8..16].copy_from_slice(&(info.as_mut_ptr() as u64).to_ne_bytes());
        if bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr).is_err() {
            continue;
        }
        let name: String = info[64..80].iter().take_while(|b| **b != 0).map(|b| *b as char).collect();
        if !name.starts_with(prefix) {
            continue;
        }
        let ns = u64::from_ne_bytes(info[192..200].try_into().unwrap());
        let runs = u64::from_ne_bytes(info[200..208].try_into().unwrap());
        let e = out.entry(name).or_insert((0, 0));
        e.0 += ns;
        e.1 += runs;
    }
    Snapshot(out)
}

/// Per program between two snapshots: runs and mean ns per run.
pub fn since(before: &Snapshot, after: &Snapshot) -> Vec<(String, u64, f64)> {
    after
        .0
        .iter()
        .filter_map(|(name, (ns, runs))| {
            let (ns0, runs0) = before.0.get(name).copied().unwrap_or((0, 0));
            let runs = runs.saturating_sub(runs0);
            (runs > 0).then(|| (name.clone(), runs, ns.saturating_sub(ns0) as f64 / runs as f64))
        })
        .collect()
}
