//! Wall-clock time as the status file, peer health and `hostmesh status`
//! record and compare it: whole seconds since the Unix epoch. A leaf: it
//! imports nothing of the crate.

use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since the epoch; 0 on a clock set before 1970.
pub(crate) fn now_unix() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
