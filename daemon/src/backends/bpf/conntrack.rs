//! Expiry of idle flows in HM_CT and of learned return paths in HM_GW_CT.
//! Both maps are LRUs, so they never grow past their size; expiring flows
//! that are done (closed TCP, idle UDP) keeps room for live ones and makes
//! a re-used 5-tuple start afresh. The service probes apply the same
//! timeouts when they look a flow up.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};

use crate::abi::*;
use crate::config::Protocol;

use super::load::Loader;
use super::{bpf_err, sys};
use crate::backends::Sweep;

/// One sweep of both conntrack maps and of the gateway's learned return
/// paths: what it removed, and what is left.
pub(super) fn sweep(loader: &mut Loader) -> crate::backends::Result<Sweep> {
    if !loader.any() {
        return Ok(Sweep::default());
    }
    let now = now_ns();
    // The timeouts the probes use, from HM_CONFIG[0].
    let config = loader.config_entry::<HmConfig>(HmMap::Config)?;
    let mut sweep = Sweep { capacity: loader.sizes.conntrack, ..Sweep::default() };
    for (map, left) in [(HmMap::Ct, &mut sweep.open), (HmMap::CtClosing, &mut sweep.closed)] {
        let fd = loader.map_fd_owned(map)?;
        let (removed, n) = expire(fd.as_fd(), config, now).map_err(|e| bpf_err(format!("expire flows in {map}"), e))?;
        sweep.removed += removed;
        *left = n;
    }
    let fd = loader.map_fd_owned(HmMap::Nat)?;
    let left =
        expire_external(fd.as_fd(), config, now).map_err(|e| bpf_err(format!("expire flows in {}", HmMap::Nat), e))?;
    sweep.removed += left.removed;
    sweep.external = left.entries;
    sweep.snat_ports = left.snat_ports;
    if let Some(gw) = loader.config_entry::<GwConfig>(HmMap::GwConfig)? {
        let fd = loader.map_fd_owned(HmMap::GwCt)?;
        sweep.removed += expire_gateway(fd.as_fd(), gw, now)
            .map_err(|e| bpf_err(format!("expire learned return paths in {}", HmMap::GwCt), e))?
            .0;
    }
    Ok(sweep)
}

/// CLOCK_MONOTONIC in ns, the clock of bpf_ktime_get_ns().
pub(super) fn now_ns() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC");
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

/// How long a flow in `state` lives idle: HM_CT's and HM_NAT's entries
/// alike (probes/conntrack.h, ct_timeout_ns).
pub(super) fn timeout_s(state: FlowState, proto: u8, cfg: Option<HmConfig>) -> u64 {
    if state.has(CT_F_CLOSING) {
        CT_CLOSING_TIMEOUT_S
    } else if Protocol::from_number(proto) == Some(Protocol::Udp) {
        cfg.map_or(CT_UDP_TIMEOUT_DEFAULT_S, |c| u64::from(c.udp_timeout_s))
    } else if !state.has(CT_F_REPLIED) {
        CT_SYN_TIMEOUT_S
    } else {
        cfg.map_or(CT_TCP_TIMEOUT_DEFAULT_S, |c| u64::from(c.tcp_timeout_s))
    }
}

/// Deletes expired entries of HM_CT; returns how many, and how many are
/// left.
pub(super) fn expire(fd: BorrowedFd<'_>, cfg: Option<HmConfig>, now: u64) -> io::Result<(usize, usize)> {
    expire_where(fd, |key: &CtKey, value: &CtValue| {
        idle_s(now, value.last_seen_ns) >= ct_timeout_s(value.flags, key.proto, cfg)
    })
}

/// An HM_CT entry's timeout: `timeout_s`, but `CT_PICKUP_TIMEOUT_S` for a
/// flow picked up mid-stream its backend has not answered (probes/
/// conntrack.h, ct_live; the bit means another thing in HM_NAT's entries).
fn ct_timeout_s(flags: u8, proto: u8, cfg: Option<HmConfig>) -> u64 {
    if flags & (CT_F_PICKUP | CT_F_REPLIED | CT_F_CLOSING) == CT_F_PICKUP {
        CT_PICKUP_TIMEOUT_S
    } else {
        timeout_s(FlowState::of(flags), proto, cfg)
    }
}

/// What is left of HM_NAT after a sweep.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct ExternalLeft {
    pub removed: usize,
    pub entries: usize,
    /// Source ports of snat_port_range in use: one per flow to another
    /// host's backend (its reply entry).
    pub snat_ports: usize,
}

/// Deletes expired entries of HM_NAT; says how many, and what is left.
pub(super) fn expire_external(fd: BorrowedFd<'_>, cfg: Option<HmConfig>, now: u64) -> io::Result<ExternalLeft> {
    let mut snat_ports = 0;
    let (removed, entries) = expire_where(fd, |key: &CtKey, value: &NatValue| {
        let expired = idle_s(now, value.last_seen_ns) >= timeout_s(FlowState::of(value.flags), key.proto, cfg);
        if !expired && value.flags & (NAT_F_REPLY | NAT_F_SNAT) == NAT_F_REPLY | NAT_F_SNAT {
            snat_ports += 1;
        }
        expired
    })?;
    Ok(ExternalLeft { removed, entries, snat_ports })
}

/// Deletes learned return paths of HM_GW_CT idle longer than the TCP or
/// UDP timeout in `cfg`; returns how many, and how many are left.
pub(super) fn expire_gateway(fd: BorrowedFd<'_>, cfg: GwConfig, now: u64) -> io::Result<(usize, usize)> {
    expire_where(fd, |key: &CtKey, value: &GwCtValue| {
        let udp = Protocol::from_number(key.proto) == Some(Protocol::Udp);
        let timeout = if udp { cfg.udp_timeout_s } else { cfg.tcp_timeout_s };
        idle_s(now, value.last_seen_ns) >= u64::from(timeout)
    })
}

fn idle_s(now: u64, last_seen_ns: u64) -> u64 {
    now.saturating_sub(last_seen_ns) / 1_000_000_000
}

fn expire_where<K: Pod, V: Pod>(
    fd: BorrowedFd<'_>,
    mut expired: impl FnMut(&K, &V) -> bool,
) -> io::Result<(usize, usize)> {
    let entries = sys::map_dump(fd, std::mem::size_of::<K>(), std::mem::size_of::<V>())?;
    let total = entries.len();
    let mut removed = 0;
    for (k, v) in entries {
        let (Some(key), Some(value)) = (K::from_bytes(&k), V::from_bytes(&v)) else { continue };
        if expired(&key, &value) {
            sys::map_delete(fd, &k)?;
            removed += 1;
        }
    }
    Ok((removed, total - removed))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: u8 = 6;
    const UDP: u8 = 17;

    /// The sweep's timeouts are the probes' (probes/conntrack.h): each map's
    /// own bits never change what the shared state bits say.
    #[test]
    fn timeouts_read_each_map_s_own_bits_only_where_they_mean_something() {
        let cfg = HmConfig { tcp_timeout_s: 300, udp_timeout_s: 30, ..Default::default() };
        // HM_NAT: the backend's entry of an answered flow, translated to
        // this host's address, lives as any answered TCP flow; its REPLY
        // bit (HM_CT's PICKUP bit) is not a pickup here.
        let reply = NAT_F_REPLY | NAT_F_SNAT | NAT_F_HOST;
        assert_eq!(timeout_s(FlowState::of(reply | CT_F_REPLIED), TCP, Some(cfg)), 300);
        assert_eq!(timeout_s(FlowState::of(reply), TCP, Some(cfg)), CT_SYN_TIMEOUT_S);
        assert_eq!(timeout_s(FlowState::of(reply | CT_F_CLOSING), TCP, Some(cfg)), CT_CLOSING_TIMEOUT_S);
        assert_eq!(timeout_s(FlowState::of(reply), UDP, Some(cfg)), 30);
        assert_eq!(timeout_s(FlowState::of(0), UDP, None), CT_UDP_TIMEOUT_DEFAULT_S);
        // HM_CT: a flow picked up mid-stream lives 2 s until answered, then
        // as any answered flow; closed, as any closed one.
        assert_eq!(ct_timeout_s(CT_F_PICKUP, TCP, Some(cfg)), CT_PICKUP_TIMEOUT_S);
        assert_eq!(ct_timeout_s(CT_F_PICKUP | CT_F_REPLIED, TCP, Some(cfg)), 300);
        assert_eq!(ct_timeout_s(CT_F_PICKUP | CT_F_CLOSING, TCP, Some(cfg)), CT_CLOSING_TIMEOUT_S);
        assert_eq!(ct_timeout_s(0, TCP, None), CT_SYN_TIMEOUT_S);
        assert_eq!(ct_timeout_s(CT_F_REPLIED, TCP, None), CT_TCP_TIMEOUT_DEFAULT_S);
    }
}
