//! What went to each backend, as the probes count it (HM_BACKEND_STATS,
//! per CPU): read for the metrics endpoint from the pinned maps, summed
//! over CPUs. Read-only, and opened per read: a map replaced by a resize
//! is read at its new pin the next time.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;

use crate::abi::*;

use super::inspect::{backend_stats_len, service_keys_by_id, sum_over_cpus, Inspector};
use super::sys;

/// One (service key, backend) pair's counters, summed over CPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PairTraffic {
    pub service: SvcKey,
    pub backend: SocketAddr,
    pub stats: BackendStats,
}

/// Reads the counters under one bpffs dir.
#[derive(Debug)]
pub(crate) struct TrafficReader(Inspector);

impl TrafficReader {
    pub(crate) fn new(bpffs: &std::path::Path) -> Self {
        TrafficReader(Inspector::new(bpffs))
    }

    /// Every pair that carried traffic. No pins yet (nothing configured):
    /// nothing.
    pub(crate) fn read(&self) -> io::Result<Vec<PairTraffic>> {
        let (Some(stats), Some(services)) = (self.0.map(HmMap::BackendStats)?, self.0.map(HmMap::Services)?) else {
            return Ok(Vec::new());
        };
        let ids = service_keys_by_id(services.as_fd())?;
        let mut out = Vec::new();
        sys::map_for_each(stats.as_fd(), std::mem::size_of::<BackendStatsKey>(), backend_stats_len()?, |k, v| {
            let Some(key) = BackendStatsKey::from_bytes(k) else { return };
            // A pair of a service id that is gone (removed, its id not yet
            // reused) names nothing.
            let Some(service) = ids.get(&key.svc_id) else { return };
            let backend = socket_addr16(key.addr, key.port_be);
            out.push(PairTraffic { service: *service, backend, stats: sum_over_cpus(v) });
        })?;
        Ok(out)
    }
}
