//! The bpfnat veth path for `[[service]]` VIPs (README.md, "Service IPs"):
//! the `hm-natin`/`hm-natout` pair, one host route per VIP via a link-local
//! gateway on `hm-natin`, a permanent neighbour for that gateway, the RPF
//! and forwarding sysctls, the NAT program on `hm-natout` and the reply
//! program on host interfaces and lo. The service maps both paths read are
//! `services.rs`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

use crate::config::{Config, CtlbMode, Mesh, Service};

use super::mesh;
use super::state::*;
use super::HostFacts;

pub(crate) const NATIN: &str = "hm-natin";
pub(crate) const NATOUT: &str = "hm-natout";
/// Locally administered MACs, fixed so compile stays pure and the
/// neighbour entry is known before the link exists.
pub(crate) const NATIN_MAC: [u8; 6] = [0x02, 0x68, 0x6d, 0x00, 0x00, 0x01];
pub(crate) const NATOUT_MAC: [u8; 6] = [0x02, 0x68, 0x6d, 0x00, 0x00, 0x02];
pub(crate) const GATEWAY_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
pub(crate) const GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);

const OWNER: Object<'static> = Object::Bpfnat;

pub(super) fn compile(config: &Config, facts: &HostFacts, out: &mut Desired) {
    // With connect-time LB for every protocol, nothing needs the veth.
    if !carries_services(config, out.connect_time) {
        return;
    }

    want(
        &mut out.links,
        NATIN.to_string(),
        LinkSpec::Veth { peer: NATOUT.to_string(), mac: NATIN_MAC, peer_mac: NATOUT_MAC, up: true },
        OWNER,
    );

    let host = host_interfaces(config, facts, &mut out.warnings);
    let any_v6 = config.services.iter().any(|s| s.vip.is_ipv6());
    for (path, value) in sysctls(&host, any_v6) {
        want(&mut out.sysctls, path, value.to_string(), OWNER);
    }

    let gateways: Vec<IpAddr> =
        if any_v6 { vec![GATEWAY_V4.into(), GATEWAY_V6.into()] } else { vec![GATEWAY_V4.into()] };
    for gw in gateways {
        want(&mut out.neighbours, NeighKey { dev: NATIN.to_string(), ip: gw }, NeighSpec { lladdr: NATOUT_MAC }, OWNER);
    }

    for svc in &config.services {
        if let Some(w) = mesh_vip_warning(&config.meshes, out.connect_time, svc) {
            out.warnings.push(w);
        }
        if let Some((key, spec)) = service_route(&config.meshes, svc) {
            want(&mut out.routes, key, spec, super::services::owner_of(svc));
        }
    }

    // Translated as they leave hm-natin when their backend is reached out of
    // an interface; what it leaves crosses to hm-natout (probes/service_nat.c).
    want(
        &mut out.attachments,
        Attachment { program: Program::NatIn, hook: Hook::TcEgress(NATIN.to_string()) },
        (),
        OWNER,
    );
    want(
        &mut out.attachments,
        Attachment { program: Program::NatOut, hook: Hook::TcIngress(NATOUT.to_string()) },
        (),
        OWNER,
    );
    // Replies come back on host interfaces, or on lo from local backends.
    if host.is_empty() {
        out.warnings.push(
            "no host interface (no default route, none configured): replies from remote backends on the bpfnat veth \
             path will not be translated; set [daemon] host_interfaces"
                .to_string(),
        );
    }
    // Direct traffic from the host to a backend leaves there too, and must
    // not meet a VIP flow's stale entries (probes/service_nat.c, hm_direct).
    for dev in host.iter().map(String::as_str).chain(["lo"]) {
        want(
            &mut out.attachments,
            Attachment { program: Program::Reply, hook: Hook::TcIngress(dev.to_string()) },
            (),
            OWNER,
        );
        want(
            &mut out.attachments,
            Attachment { program: Program::Direct, hook: Hook::TcEgress(dev.to_string()) },
            (),
            OWNER,
        );
    }
}

/// The sysctls the veth path needs. RPF: packets cross the veth with a
/// host source address, and replies come back to a VIP routed elsewhere;
/// accept_local lets hm-natout take host-sourced packets; forwarding on
/// hm-natin and hm-natout is what bpf_fib_lookup checks before it forwards
/// (hm_natin's lookups are made as if its packets arrived on hm-natin).
fn sysctls(host: &[String], any_v6: bool) -> Vec<(String, &'static str)> {
    let mut sysctls = vec![("net/ipv4/conf/all/rp_filter".to_string(), "0")];
    for dev in [NATIN, NATOUT] {
        sysctls.push((format!("net/ipv4/conf/{dev}/rp_filter"), "0"));
        sysctls.push((format!("net/ipv4/conf/{dev}/accept_local"), "1"));
    }
    for dev in [NATIN, NATOUT] {
        sysctls.push((format!("net/ipv4/conf/{dev}/forwarding"), "1"));
    }
    for dev in host {
        sysctls.push((format!("net/ipv4/conf/{dev}/rp_filter"), "0"));
    }
    if any_v6 {
        for dev in [NATIN, NATOUT] {
            sysctls.push((format!("net/ipv6/conf/{dev}/disable_ipv6"), "0"));
        }
        for dev in [NATIN, NATOUT] {
            sysctls.push((format!("net/ipv6/conf/{dev}/forwarding"), "1"));
        }
    }
    sysctls
}

/// Whether the veth path carries a service: everything but connect-time
/// LB for every protocol, when there are services at all.
pub(super) fn carries_services(config: &Config, connect_time: CtlbMode) -> bool {
    !config.services.is_empty() && connect_time.leaves_some()
}

/// A service's host route into hm-natin (when the veth path carries
/// services). A mesh VIP has a local route instead: the whole VIP is
/// delivered to this host, where the sidecar takes its mesh ports.
pub(super) fn service_route(meshes: &[Mesh], svc: &Service) -> Option<(RouteKey, RouteSpec)> {
    if mesh::is_mesh_vip(meshes, svc.vip) {
        return None;
    }
    let gateway = if svc.vip.is_ipv4() { IpAddr::V4(GATEWAY_V4) } else { IpAddr::V6(GATEWAY_V6) };
    Some((
        RouteKey { table: RT_TABLE_MAIN, dst: IpNet::from(svc.vip) },
        RouteSpec::Via { gateway, dev: NATIN.to_string(), mtu: None, encap: None },
    ))
}

/// A service on a mesh VIP that the mesh entry does not cover, and that
/// connect-time LB does not take, reaches this host instead of a backend.
pub(super) fn mesh_vip_warning(meshes: &[Mesh], connect_time: CtlbMode, svc: &Service) -> Option<String> {
    (mesh::is_mesh_vip(meshes, svc.vip)
        && !connect_time.handles(svc.protocol)
        && !mesh::covers(meshes, svc.vip, svc.port, svc.protocol))
    .then(|| {
        format!(
            "service \"{}\" ({} port {}/{}) shares its VIP with a mesh entry that does not cover it: its traffic \
             reaches this host, not a backend, unless connect-time load balancing handles it (connect_time_lb = \
             \"all\") or it moves to another VIP",
            svc.name, svc.vip, svc.port, svc.protocol
        )
    })
}

/// `[daemon] host_interfaces`, or the interfaces holding a default route;
/// names that do not exist are reported and skipped.
pub(super) fn host_interfaces(config: &Config, facts: &HostFacts, warnings: &mut Vec<String>) -> Vec<String> {
    match &config.daemon.host_interfaces {
        None => facts.default_route_interfaces.clone(),
        Some(list) => list
            .iter()
            .filter(|dev| {
                let exists = facts.interfaces.contains(*dev);
                if !exists {
                    warnings.push(format!("host interface {dev} (from [daemon] host_interfaces) does not exist"));
                }
                exists
            })
            .cloned()
            .collect(),
    }
}
