//! Read-only lookups in the pinned maps for `hostmesh explain`: the same
//! kernel state the daemon observes, read while it runs or not. Nothing
//! here writes.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::abi::*;

use super::pins::PinDir;
use super::sys;

/// The pinned maps under one bpffs dir; a map that is not pinned reads as
/// empty (nothing of that feature is configured).
#[derive(Debug)]
pub(crate) struct Inspector {
    pins: PinDir,
}

/// A service's entry and its Maglev table.
#[derive(Debug, Clone)]
pub(crate) struct ServiceEntry {
    pub value: SvcValue,
    /// The backend of each slot (`None`: a chunk is missing).
    pub slots: Vec<Option<SocketAddr>>,
    /// The service's affinity timeout, if it has affinity.
    pub affinity_s: Option<u32>,
}

impl Inspector {
    pub(crate) fn new(bpffs: &std::path::Path) -> Self {
        Inspector { pins: PinDir::new(bpffs) }
    }

    pub(super) fn pins(&self) -> &PinDir {
        &self.pins
    }

    pub(super) fn map(&self, map: HmMap) -> io::Result<Option<OwnedFd>> {
        match sys::obj_get(&self.pins.map(map)) {
            Ok(fd) => Ok(Some(fd)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io::Error::new(e.kind(), format!("open the pinned {map}: {e}"))),
        }
    }

    fn lookup<V: Pod>(&self, map: HmMap, key: &[u8]) -> io::Result<Option<V>> {
        let Some(fd) = self.map(map)? else { return Ok(None) };
        let mut v = vec![0u8; std::mem::size_of::<V>()];
        Ok(if sys::map_lookup(fd.as_fd(), key, &mut v)? { V::from_bytes(&v) } else { None })
    }

    /// HM_CONFIG's flags (which protocols connect-time LB handles), if
    /// the service maps exist.
    pub(crate) fn config(&self) -> io::Result<Option<HmConfig>> {
        self.lookup(HmMap::Config, &0u32.to_ne_bytes())
    }

    /// The service at (VIP, port, protocol) with its table.
    pub(crate) fn service(&self, key: SvcKey) -> io::Result<Option<ServiceEntry>> {
        let Some(value) = self.lookup::<SvcValue>(HmMap::Services, &key.to_bytes())? else { return Ok(None) };
        let mut backends: BTreeMap<u32, Option<SocketAddr>> = BTreeMap::new();
        let mut slots = Vec::with_capacity(value.table_size as usize);
        let chunks = (value.table_size as usize).div_ceil(MAGLEV_CHUNK);
        for chunk in 0..chunks {
            // external_policy = "local": the table of this host's backends.
            let local = if value.flags & SVC_F_LOCAL != 0 { MAGLEV_LOCAL } else { 0 };
            let k = MaglevKey { svc_id: value.id, chunk: chunk as u32 | local };
            let ids = self.lookup::<MaglevChunk>(HmMap::Maglev, &k.to_bytes())?;
            for i in 0..MAGLEV_CHUNK.min(value.table_size as usize - chunk * MAGLEV_CHUNK) {
                let Some(ids) = &ids else {
                    slots.push(None);
                    continue;
                };
                let id = ids.backend[i];
                if let std::collections::btree_map::Entry::Vacant(v) = backends.entry(id) {
                    let b = self.lookup::<BackendValue>(HmMap::Backends, &id.to_ne_bytes())?;
                    v.insert(b.map(|b| b.socket_addr()));
                }
                slots.push(backends[&id]);
            }
        }
        let affinity_s = if value.flags & SVC_F_AFFINITY != 0 {
            self.lookup::<SvcAffinity>(HmMap::SvcAffinity, &value.id.to_ne_bytes())?.map(|a| a.timeout_s)
        } else {
            None
        };
        Ok(Some(ServiceEntry { value, slots, affinity_s }))
    }

    /// Whether node ports answer on `ip` (HM_HOST_ADDRS).
    pub(crate) fn host_address(&self, ip: IpAddr) -> io::Result<bool> {
        Ok(self.lookup::<u32>(HmMap::HostAddrs, &Addr { addr: addr16(ip) }.to_bytes())?.is_some())
    }

    /// The backend a client's affinity entry names and how long ago it was
    /// last used, in nanoseconds of CLOCK_MONOTONIC (the probes' clock).
    pub(crate) fn affinity(&self, client: IpAddr, svc_id: u32) -> io::Result<Option<(SocketAddr, u64)>> {
        let key = AffKey { client: addr16(client), svc_id };
        let Some(v) = self.lookup::<AffValue>(HmMap::Affinity, &key.to_bytes())? else { return Ok(None) };
        let Some(b) = self.lookup::<BackendValue>(HmMap::Backends, &v.backend_id.to_ne_bytes())? else {
            return Ok(None);
        };
        let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
            .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
            .unwrap_or(0);
        Ok(Some((b.socket_addr(), now.saturating_sub(v.last_seen_ns))))
    }

    /// The mesh entry for (VIP, port, protocol): the exact port, else the
    /// VIP's every-port entry, as hm_mesh looks them up.
    pub(crate) fn mesh(&self, vip: IpAddr, port: u16, proto: u8) -> io::Result<Option<(u16, u16)>> {
        for p in [port, 0] {
            if let Some(v) = self.lookup::<MeshValue>(HmMap::Mesh, &MeshKey::new(vip, p, proto).to_bytes())? {
                return Ok(Some((p, v.redirect_port)));
            }
        }
        Ok(None)
    }

    /// The gateway peer endpoint whose CIDR holds `addr` (longest prefix),
    /// and whether it is up.
    pub(crate) fn peer(&self, addr: IpAddr) -> io::Result<Option<(IpAddr, bool)>> {
        let key = LpmKey { prefixlen: 128, addr: addr16(addr) };
        Ok(self.lookup::<Endpoint>(HmMap::Peers, &key.to_bytes())?.map(|e| (ip_from16(e.addr), e.flags & EP_UP != 0)))
    }

    /// HM_GW_CONFIG[0], if the gateway programs are loaded.
    pub(crate) fn gateway_config(&self) -> io::Result<Option<GwConfig>> {
        self.lookup(HmMap::GwConfig, &0u32.to_ne_bytes())
    }

    /// The traffic counters of (service id, backend), summed over CPUs.
    pub(crate) fn counters(&self, svc_id: u32, backend: SocketAddr) -> io::Result<BackendStats> {
        let Some(fd) = self.map(HmMap::BackendStats)? else { return Ok(BackendStats::default()) };
        let key = BackendStatsKey { addr: addr16(backend.ip()), port_be: backend.port().to_be(), pad: 0, svc_id };
        let mut v = vec![0u8; backend_stats_len()?];
        if !sys::map_lookup(fd.as_fd(), &key.to_bytes(), &mut v)? {
            return Ok(BackendStats::default());
        }
        Ok(sum_over_cpus(&v))
    }
}

/// The size of one HM_BACKEND_STATS value as the kernel copies it out:
/// one `BackendStats` per possible CPU.
pub(super) fn backend_stats_len() -> io::Result<usize> {
    Ok(std::mem::size_of::<BackendStats>() * aya::util::nr_cpus().map_err(|(_, e)| e)?)
}

/// One HM_BACKEND_STATS value, summed over its CPUs.
pub(super) fn sum_over_cpus(v: &[u8]) -> BackendStats {
    v.chunks(std::mem::size_of::<BackendStats>())
        .filter_map(BackendStats::from_bytes)
        .fold(BackendStats::default(), |a, b| a + b)
}

/// HM_SERVICES read back: the key each service id is for.
pub(super) fn service_keys_by_id(services: BorrowedFd<'_>) -> io::Result<HashMap<u32, SvcKey>> {
    Ok(sys::map_dump(services, std::mem::size_of::<SvcKey>(), std::mem::size_of::<SvcValue>())?
        .into_iter()
        .filter_map(|(k, v)| Some((SvcValue::from_bytes(&v)?.id, SvcKey::from_bytes(&k)?)))
        // An external VIP's and a node port's entries share their service's id.
        .filter(|(_, k)| k.scope == SVC_SCOPE_HOST)
        .collect())
}
