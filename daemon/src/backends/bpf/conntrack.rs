//! Expiry of idle flows in HM_CT. The map is an LRU, so it never grows
//! past its size; expiring flows that are done (closed TCP, idle UDP) keeps
//! room for live ones and makes a re-used 5-tuple start afresh. The probes
//! apply the same timeouts when they look a flow up.

use std::io;
use std::os::fd::BorrowedFd;

use crate::abi::*;

use super::sys;

/// CLOCK_MONOTONIC in ns, the clock of bpf_ktime_get_ns().
pub fn now_ns() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC");
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

pub fn timeout_s(v: &CtValue, proto: u8, cfg: Option<HmConfig>) -> u64 {
    if v.flags & CT_F_CLOSING != 0 {
        CT_CLOSING_TIMEOUT_S
    } else if proto == 17 {
        cfg.map_or(60, |c| u64::from(c.udp_timeout_s))
    } else if v.flags & CT_F_REPLIED == 0 {
        CT_SYN_TIMEOUT_S
    } else {
        cfg.map_or(86_400, |c| u64::from(c.tcp_timeout_s))
    }
}

/// Deletes expired entries; returns how many.
pub fn expire(fd: BorrowedFd<'_>, cfg: Option<HmConfig>, now: u64) -> io::Result<usize> {
    let entries = sys::map_dump(fd, std::mem::size_of::<CtKey>(), std::mem::size_of::<CtValue>())?;
    let mut removed = 0;
    for (k, v) in entries {
        let (Some(key), Some(value)) = (CtKey::from_bytes(&k), CtValue::from_bytes(&v)) else { continue };
        let idle_s = now.saturating_sub(value.last_seen_ns) / 1_000_000_000;
        if idle_s >= timeout_s(&value, key.proto, cfg) {
            sys::map_delete(fd, &k)?;
            removed += 1;
        }
    }
    Ok(removed)
}
