//! `[[mesh]]` -> mesh redirects (README.md, "Mesh redirects"): a `local` route
//! per VIP so the kernel delivers it to this host, and either HM_MESH
//! entries for the sk_lookup program on this namespace, or — when
//! sk_lookup is unavailable or not wanted — tproxy rules in
//! `table inet hostmesh`. Either way the sidecar's socket sees the VIP:port
//! as its local address.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::abi::{MeshKey, MeshValue, Pod};
use crate::config::{Config, Mesh, MeshBackend, Protocol};

use super::state::*;
use super::HostFacts;

pub(super) fn compile(config: &Config, facts: &HostFacts, out: &mut Desired) {
    if config.meshes.is_empty() {
        return;
    }
    let path = match config.daemon.mesh_backend {
        MeshBackend::SkLookup => MeshPath::SkLookup,
        MeshBackend::Nftables => MeshPath::Nftables { reason: "[daemon] mesh_backend = \"nftables\"".into() },
        MeshBackend::Auto => match &facts.sk_lookup_unavailable {
            None => MeshPath::SkLookup,
            Some(why) => MeshPath::Nftables { reason: format!("sk_lookup is not available here: {why}") },
        },
    };
    for m in &config.meshes {
        let owner = Object::Mesh(&m.name).into_owner();
        // Local clients of the VIP send from loopback, not from the VIP
        // itself (the kernel's choice for a local destination): replies to
        // them must not match a whole-VIP entry and go to the sidecar.
        let src =
            if m.vip.is_ipv4() { IpAddr::from([127, 0, 0, 1]) } else { IpAddr::from(std::net::Ipv6Addr::LOCALHOST) };
        want(
            &mut out.routes,
            RouteKey { table: RT_TABLE_LOCAL, dst: IpNet::from(m.vip) },
            RouteSpec::Local { dev: "lo".into(), src },
            &owner,
        );
        match path {
            MeshPath::SkLookup => {
                let key = MeshKey::new(m.vip, m.port, m.protocol.number());
                let value = MeshValue { redirect_port: m.redirect_port, pad: 0 };
                want(
                    &mut out.map_entries,
                    MapEntryKey { map: BpfMap::Mesh, key: key.to_bytes().into() },
                    value.to_bytes(),
                    &owner,
                );
            }
            MeshPath::Nftables { .. } => want(
                &mut out.nft_rules,
                NftRule { vip: m.vip, port: m.port, proto: m.protocol.number(), redirect_port: m.redirect_port },
                (),
                &owner,
            ),
        }
    }
    if path == MeshPath::SkLookup {
        want(&mut out.attachments, Attachment { program: Program::Mesh, hook: Hook::Netns }, (), Object::Meshes);
    }
    out.mesh_path = Some(path);
}

/// Whether a mesh entry takes (vip, port, protocol): an exact port, or
/// every port of the VIP.
pub(super) fn covers(meshes: &[Mesh], vip: IpAddr, port: u16, protocol: Protocol) -> bool {
    meshes.iter().any(|m| m.vip == vip && m.protocol == protocol && (m.port == port || m.port == 0))
}

/// Whether any mesh entry uses this VIP (it then has a local route).
pub(super) fn is_mesh_vip(meshes: &[Mesh], vip: IpAddr) -> bool {
    meshes.iter().any(|m| m.vip == vip)
}
