//! Clients on other machines: node ports and external VIPs (README.md,
//! "Clients on other machines"). hm_reply (host interfaces' ingress)
//! balances their flows and hm_direct (egress) translates the replies of
//! backends on this host; this compiles what those need beside each
//! service's entries of scope network (`services::network_entries`): how
//! each backend is reached (HM_SNAT),
//! forwarding on the host interfaces (which `bpf_fib_lookup` checks), the
//! reserved port ranges, and the two programs on every host interface.

use crate::abi::{self, Addr, Pod, SnatValue};
use crate::config::{Config, PortRange, Service};
use std::collections::BTreeSet;
use std::net::IpAddr;

use super::bpfnat;
use super::reach::snat_source;
use super::services::owner_of;
use super::state::*;
use super::HostFacts;

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
    let services: Vec<&Service> = config.services.iter().filter(|s| s.serves_network()).map(|s| &**s).collect();
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
    if bpfnat::carries_services(config, out.connect_time) {
        turnaround_sysctls(&services, out);
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

/// The turnaround on lo (hm_direct at its egress takes a host process's
/// packets to its own node port, where connect-time LB did not; see
/// probes/service_nat.c, nat_send): bpf_fib_lookup forwards from lo only
/// where lo forwards, and the replies of another host's backend reach the
/// process through lo, with the host's own address as their source.
fn turnaround_sysctls(services: &[&Service], out: &mut Desired) {
    for s in services.iter().filter(|s| s.node_port.is_some()) {
        let family = if s.vip.is_ipv4() { "ipv4" } else { "ipv6" };
        want(&mut out.sysctls, format!("net/{family}/conf/lo/forwarding"), "1".to_string(), OWNER);
        if s.vip.is_ipv4() {
            want(&mut out.sysctls, "net/ipv4/conf/lo/accept_local".to_string(), "1".to_string(), OWNER);
            want(&mut out.sysctls, "net/ipv4/conf/lo/rp_filter".to_string(), "0".to_string(), OWNER);
        }
    }
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

    #[test]
    fn reserved_ports_are_written_as_the_kernel_prints_them() {
        let r = |first, last| PortRange { first, last };
        assert_eq!(reserved_ports(&[r(61000, 65535), r(30000, 32767)]), "30000-32767,61000-65535");
        assert_eq!(reserved_ports(&[r(30000, 32767), r(32768, 33000)]), "30000-33000");
        assert_eq!(reserved_ports(&[r(40000, 40000)]), "40000");
    }
}
