//! Clients on other machines: node ports and external VIPs (README.md,
//! "Clients on other machines"). hm_reply (host interfaces' ingress)
//! balances their flows and hm_direct (egress) translates the replies of
//! backends on this host; this compiles what those need: each service's
//! entries of scope network (`network_entries`, which `services.rs` adds
//! beside the service's own), how each backend is reached (HM_SNAT),
//! forwarding on the host interfaces (which `bpf_fib_lookup` checks), the
//! reserved port ranges, and the two programs on every host interface.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::abi::{self, Addr, MaglevKey, Pod, SnatValue, SvcKey, SvcValue};
use crate::config::{Config, ExternalPolicy, PortRange, Service};

use super::bpfnat;
use super::maglev::Entry;
use super::services::owner_of;
use super::state::*;
use super::{BackendRoute, HostFacts};

const OWNER: Object<'static> = Object::Services;

/// Every backend address of a service clients on other machines reach:
/// the routes the host facts look up.
pub(crate) fn backend_addresses(config: &Config) -> Vec<IpAddr> {
    let set: BTreeSet<IpAddr> = config
        .services
        .iter()
        .filter(|s| s.serves_network())
        .flat_map(|s| s.backends.iter().map(|b| b.addr.ip()))
        .collect();
    set.into_iter().collect()
}

pub(super) fn compile(config: &Config, facts: &HostFacts, out: &mut Desired) {
    let services: Vec<&Service> = config.services.iter().filter(|s| s.serves_network()).collect();
    if services.is_empty() {
        return;
    }
    // bpfnat reports the interfaces that do not exist when it runs.
    let mut scratch = Vec::new();
    let warnings = if bpfnat::carries_services(config, out.connect_time) { &mut scratch } else { &mut out.warnings };
    let host = bpfnat::host_interfaces(config, facts, warnings);
    if host.is_empty() {
        out.warnings.push(
            "no host interface (no default route, none configured): node ports and external VIPs are not served; set \
             [daemon] host_interfaces"
                .to_string(),
        );
        return;
    }

    for svc in &services {
        for b in &svc.backends {
            let ip = b.addr.ip();
            match snat_source(facts.backend_routes.get(&ip), &host) {
                Ok(src) => want(
                    &mut out.map_entries,
                    MapEntryKey { map: BpfMap::Snat, key: Addr { addr: abi::addr16(ip) }.to_bytes().into() },
                    SnatValue { src: src.map_or([0; 16], abi::addr16) }.to_bytes(),
                    owner_of(svc),
                ),
                Err(why) => out.warnings.push(format!(
                    "service \"{}\": backend {} {why}; clients on other machines are not sent to it",
                    svc.name, b.addr
                )),
            }
        }
    }

    // Node ports answer on the host interfaces' addresses.
    if services.iter().any(|s| s.node_port.is_some()) {
        let addrs = host.iter().filter_map(|dev| facts.addresses.get(dev)).flatten();
        for ip in addrs.take(abi::MAX_HOST_ADDRS as usize) {
            let key = MapEntryKey { map: BpfMap::HostAddrs, key: Addr { addr: abi::addr16(*ip) }.to_bytes().into() };
            want(&mut out.map_entries, key, 1u32.to_bytes(), OWNER);
        }
    }

    let v4 = services.iter().any(|s| s.vip.is_ipv4());
    let v6 = services.iter().any(|s| s.vip.is_ipv6());
    for dev in &host {
        if v4 {
            want(&mut out.sysctls, format!("net/ipv4/conf/{dev}/forwarding"), "1".to_string(), OWNER);
        }
        if v6 {
            want(&mut out.sysctls, format!("net/ipv6/conf/{dev}/forwarding"), "1".to_string(), OWNER);
        }
    }
    let d = &config.daemon;
    let mut reserved = vec![d.snat_port_range];
    if services.iter().any(|s| s.node_port.is_some()) {
        reserved.push(d.node_port_range);
    }
    want(&mut out.sysctls, "net/ipv4/ip_local_reserved_ports".to_string(), reserved_ports(&reserved), OWNER);

    for dev in &host {
        for attachment in [
            Attachment { program: Program::Reply, hook: Hook::TcIngress(dev.clone()) },
            Attachment { program: Program::Direct, hook: Hook::TcEgress(dev.clone()) },
        ] {
            want(&mut out.attachments, attachment, (), OWNER);
        }
    }
}

/// Which backends of a service are on this host, as the routes to them
/// say (`snat_source`): for external_policy = "local".
pub(super) struct Reach {
    host: Vec<String>,
}

impl Reach {
    pub(super) fn new(config: &Config, facts: &HostFacts) -> Reach {
        // `compile` reports interfaces that do not exist.
        Reach { host: bpfnat::host_interfaces(config, facts, &mut Vec::new()) }
    }

    /// The indexes in `svc.backends` of its backends on this host, for a
    /// service with external_policy = "local" (`None` for any other).
    pub(super) fn local_backends(&self, svc: &Service, facts: &HostFacts) -> Option<Vec<usize>> {
        if svc.external_policy != ExternalPolicy::Local || !svc.serves_network() {
            return None;
        }
        let here = |ip: IpAddr| matches!(snat_source(facts.backend_routes.get(&ip), &self.host), Ok(None));
        Some((0..svc.backends.len()).filter(|&i| here(svc.backends[i].addr.ip())).collect())
    }
}

/// A service's entries for clients on other machines: its external VIP's
/// and its node port's in HM_SERVICES (scope network), and with
/// external_policy = "local" the table of its backends on this host
/// (`local`, indexes in `svc.backends`), whose chunks are keyed with
/// MAGLEV_LOCAL. Without it they share the service's table.
pub(super) fn network_entries(
    svc: &Service,
    id: u32,
    backend_ids: &[u32],
    table_size: u32,
    local: Option<&[usize]>,
) -> Vec<(MapEntryKey, MapValue)> {
    let mut out = Vec::new();
    let mut flags = if svc.affinity.is_some() { abi::SVC_F_AFFINITY } else { 0 };
    let mut backend_count = svc.backends.len() as u32;
    if let Some(local) = local {
        flags |= abi::SVC_F_LOCAL;
        backend_count = local.len() as u32;
        let entries = local.iter().map(|&i| Entry { addr: svc.backends[i].addr, weight: svc.backends[i].weight });
        let ids = local.iter().map(|&i| backend_ids[i]).collect();
        let table = MaglevTable::new(entries.collect(), ids, table_size);
        for chunk in 0..table.chunks() {
            let key = MaglevKey { svc_id: id, chunk: chunk | abi::MAGLEV_LOCAL };
            out.push((MapEntryKey { map: BpfMap::Maglev, key: key.to_bytes().into() }, MapValue::chunk(&table, chunk)));
        }
    }
    let value = SvcValue { id, backend_count, flags, table_size };
    let proto = svc.protocol.number();
    let mut entry = |key: SvcKey, flag: u32| {
        let value = SvcValue { flags: value.flags | flag, ..value };
        out.push((MapEntryKey { map: BpfMap::Services, key: key.to_bytes().into() }, value.to_bytes().into()));
    };
    if svc.external {
        entry(SvcKey::network(svc.vip, svc.port, proto), abi::SVC_F_EXTERNAL);
    }
    if let Some(port) = svc.node_port {
        // Any address of the family: HM_HOST_ADDRS says which answer.
        let any: IpAddr = if svc.vip.is_ipv4() { Ipv4Addr::UNSPECIFIED.into() } else { Ipv6Addr::UNSPECIFIED.into() };
        entry(SvcKey::network(any, port, proto), abi::SVC_F_NODE_PORT);
    }
    out
}

/// The source flows from the network to a backend take: none for a
/// backend on this host (one of its addresses, or reached through an
/// interface that is not a host interface: a VM or container here), which
/// then sees the client's address; else the host's address on the way
/// to it, so its replies come back here.
fn snat_source(route: Option<&BackendRoute>, host: &[String]) -> Result<Option<IpAddr>, &'static str> {
    let route = route.ok_or("has no route")?;
    if route.local || route.dev.as_ref().is_none_or(|dev| !host.contains(dev)) {
        return Ok(None);
    }
    route.src.map(Some).ok_or("is reached through a host interface with no address")
}

/// `ip_local_reserved_ports` as the kernel prints it: ranges sorted,
/// joined where they touch, a range of one port as the port.
fn reserved_ports(ranges: &[PortRange]) -> String {
    let mut sorted = ranges.to_vec();
    sorted.sort_by_key(|r| r.first);
    let mut merged: Vec<PortRange> = Vec::new();
    for r in sorted {
        match merged.last_mut() {
            Some(last) if u32::from(r.first) <= u32::from(last.last) + 1 => last.last = last.last.max(r.last),
            _ => merged.push(r),
        }
    }
    let parts: Vec<String> = merged
        .iter()
        .map(|r| if r.first == r.last { r.first.to_string() } else { format!("{}-{}", r.first, r.last) })
        .collect();
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(local: bool, dev: &str, src: Option<&str>) -> BackendRoute {
        BackendRoute { local, dev: Some(dev.to_string()), src: src.map(|s| s.parse().unwrap()) }
    }

    #[test]
    fn a_backend_reached_through_a_host_interface_gets_the_hosts_address_and_one_here_keeps_the_clients() {
        let host = vec!["eth0".to_string()];
        let remote = route(false, "eth0", Some("192.0.2.1"));
        assert_eq!(snat_source(Some(&remote), &host), Ok(Some("192.0.2.1".parse().unwrap())));
        // A VM or namespace behind a veth or bridge of this host.
        assert_eq!(snat_source(Some(&route(false, "veth7", Some("10.0.0.1"))), &host), Ok(None));
        // A process of this host.
        assert_eq!(snat_source(Some(&route(true, "lo", Some("192.0.2.1"))), &host), Ok(None));
        assert!(snat_source(None, &host).is_err());
        assert!(snat_source(Some(&route(false, "eth0", None)), &host).is_err());
    }

    #[test]
    fn reserved_ports_are_written_as_the_kernel_prints_them() {
        let r = |first, last| PortRange { first, last };
        assert_eq!(reserved_ports(&[r(61000, 65535), r(30000, 32767)]), "30000-32767,61000-65535");
        assert_eq!(reserved_ports(&[r(30000, 32767), r(32768, 33000)]), "30000-33000");
        assert_eq!(reserved_ports(&[r(40000, 40000)]), "40000");
    }
}
