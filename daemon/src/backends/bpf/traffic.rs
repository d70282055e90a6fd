//! What went to each backend, as the probes count it (HM_BACKEND_STATS,
//! per CPU): read for the metrics endpoint from the pinned maps, summed
//! over CPUs. Read-only, and opened per read: a map replaced by a resize
//! is read at its new pin the next time.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::path::PathBuf;

use crate::abi::*;

use super::pins::PinDir;
use super::sys;

/// One (service key, backend) pair's counters, summed over CPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PairTraffic {
    pub service: SvcKey,
    pub backend: SocketAddr,
    pub stats: BackendStats,
}

/// Reads the counters under one bpffs dir.
#[derive(Debug, Clone)]
pub(crate) struct TrafficReader {
    stats: PathBuf,
    services: PathBuf,
}

impl TrafficReader {
    pub(crate) fn new(bpffs: &std::path::Path) -> Self {
        let pins = PinDir::new(bpffs);
        TrafficReader { stats: pins.map("HM_BACKEND_STATS"), services: pins.map("HM_SERVICES") }
    }

    /// Every pair that carried traffic. No pins yet (nothing configured):
    /// nothing.
    pub(crate) fn read(&self) -> io::Result<Vec<PairTraffic>> {
        let (stats, services) = match (sys::obj_get(&self.stats), sys::obj_get(&self.services)) {
            (Ok(s), Ok(v)) => (s, v),
            (Err(e), _) | (_, Err(e)) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            (Err(e), _) | (_, Err(e)) => return Err(e),
        };
        let ids: std::collections::HashMap<u32, SvcKey> =
            sys::map_dump(services.as_fd(), std::mem::size_of::<SvcKey>(), std::mem::size_of::<SvcValue>())?
                .into_iter()
                .filter_map(|(k, v)| Some((SvcValue::from_bytes(&v)?.id, SvcKey::from_bytes(&k)?)))
                .collect();
        let one = std::mem::size_of::<BackendStats>();
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| e)?;
        let mut out = Vec::new();
        sys::map_for_each(stats.as_fd(), std::mem::size_of::<BackendStatsKey>(), one * cpus, |k, v| {
            let Some(key) = BackendStatsKey::from_bytes(k) else { return };
            // A pair of a service id that is gone (removed, its id not yet
            // reused) names nothing.
            let Some(service) = ids.get(&key.svc_id) else { return };
            let stats = v.chunks(one).filter_map(BackendStats::from_bytes).fold(BackendStats::default(), add);
            let backend = SocketAddr::new(ip_from16(key.addr), u16::from_be(key.port_be));
            out.push(PairTraffic { service: *service, backend, stats });
        })?;
        Ok(out)
    }
}

fn add(a: BackendStats, b: BackendStats) -> BackendStats {
    BackendStats {
        ctlb_connections: a.ctlb_connections.wrapping_add(b.ctlb_connections),
        veth_connections: a.veth_connections.wrapping_add(b.veth_connections),
        bytes_to: a.bytes_to.wrapping_add(b.bytes_to),
        bytes_from: a.bytes_from.wrapping_add(b.bytes_from),
    }
}
