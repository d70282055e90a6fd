//! `[gateway]`, `[[peer]]` and `[[member]]`.

use std::net::IpAddr;
use std::time::Duration;

use super::{Check, MAX_VNI};
use crate::config::error::Origin;
use crate::config::schema::*;
use crate::config::types::*;

const CTX: &str = "[gateway]";

/// The probe settings of a gateway, each `None` when invalid.
struct Probes {
    port: Option<u16>,
    interval: Option<Duration>,
    loss: Option<u32>,
}

impl Check<'_, '_> {
    pub(super) fn gateway(&mut self, g: RawGateway, origin: Origin) -> Option<Gateway> {
        let before = self.errors.len();
        let role =
            self.choice(CTX, "role", &g.role, &[("member", GatewayRole::Member), ("gateway", GatewayRole::Gateway)]);
        let (local_ip, gateway_ip) = self.gateway_addresses(&g, role);
        let vni = match *g.vni.get_ref() {
            v @ 1..=MAX_VNI => Some(v as u32),
            v => {
                self.fail(&g.vni.span(), "vni", format!("{CTX}: vni {v} is out of range; use 1 to {MAX_VNI}"));
                None
            }
        };
        let udp_port = match &g.udp_port {
            None => Some(4789),
            Some(p) => self.port(CTX, "udp_port", p, false),
        };
        let probes = self.gateway_probes(&g, udp_port);
        if self.errors.len() > before {
            return None;
        }
        Some(Gateway {
            role: role?,
            local_ip: local_ip?,
            gateway_ip,
            vni: vni?,
            udp_port: udp_port?,
            probe_interval: probes.interval?,
            probe_loss: probes.loss?,
            probe_port: probes.port?,
            origin,
        })
    }

    /// `local_ip`, and `gateway_ip` (a member's, of the same family).
    fn gateway_addresses(&mut self, g: &RawGateway, role: Option<GatewayRole>) -> (Option<IpAddr>, Option<IpAddr>) {
        let local_ip = self.unicast(CTX, "local_ip", &g.local_ip);
        let gateway_ip = g.gateway_ip.as_ref().and_then(|v| self.unicast(CTX, "gateway_ip", v));
        match (role, &g.gateway_ip) {
            (Some(GatewayRole::Member), None) => self.fail(
                &g.role.span(),
                "gateway_ip",
                format!("{CTX}: a member needs `gateway_ip`, the underlay address of this site's gateway"),
            ),
            (Some(GatewayRole::Gateway), Some(v)) => self.fail(
                &v.span(),
                "gateway_ip",
                format!("{CTX}: `gateway_ip` is only for role = \"member\"; a gateway routes to its peers' endpoints"),
            ),
            _ => {}
        }
        if let (Some(local), Some(gw)) = (local_ip, gateway_ip) {
            if local.is_ipv4() != gw.is_ipv4() {
                self.fail(
                    &g.gateway_ip.as_ref().map(|v| v.span()).unwrap_or_default(),
                    "gateway_ip",
                    format!("{CTX}: gateway_ip {gw} and local_ip {local} are not the same address family"),
                );
            }
        }
        (local_ip, gateway_ip)
    }

    /// The peer probes: port (not the tunnel's), interval, loss.
    fn gateway_probes(&mut self, g: &RawGateway, udp_port: Option<u16>) -> Probes {
        let port = match &g.probe_port {
            None => Some(DEFAULT_PROBE_PORT),
            Some(p) => self.port(CTX, "probe_port", p, false),
        };
        let interval = match &g.probe_interval {
            None => Some(DEFAULT_PROBE_INTERVAL),
            Some(v) => {
                let range = (Duration::from_millis(50), Duration::from_secs(3600));
                self.duration_within(CTX, "probe_interval", v, range, "is out of range; use 50ms to 1h")
            }
        };
        let loss = match &g.probe_loss {
            None => Some(DEFAULT_PROBE_LOSS),
            Some(v) if (1..=1000).contains(v.get_ref()) => Some(*v.get_ref() as u32),
            Some(v) => {
                self.fail(
                    &v.span(),
                    "probe_loss",
                    format!("{CTX}: probe_loss {} is out of range; use 1 to 1000", v.get_ref()),
                );
                None
            }
        };
        if let (Some(a), Some(b)) = (udp_port, port) {
            if a == b {
                let span = g.probe_port.as_ref().map(|v| v.span()).unwrap_or_else(|| g.role.span());
                self.fail(
                    &span,
                    "probe_port",
                    format!("{CTX}: probe_port {b} is the tunnel's udp_port; use another port"),
                );
            }
        }
        Probes { port, interval, loss }
    }

    pub(super) fn peer(&mut self, p: RawPeer) -> Option<Peer> {
        let before = self.errors.len();
        let name = self.name("peer", &p.name);
        let ctx = format!("peer \"{}\"", p.name.get_ref());
        let endpoint = p.endpoint.as_ref().and_then(|e| self.unicast(&ctx, "endpoint", e));
        let cidrs = self.cidrs(&ctx, &p.cidrs);
        if self.errors.len() > before {
            return None;
        }
        Some(Peer { name: name?, endpoint, cidrs, origin: Origin::at(self.src, &p.name.span()) })
    }

    pub(super) fn member(&mut self, m: RawMember) -> Option<Member> {
        let before = self.errors.len();
        let name = self.name("member", &m.name);
        let ctx = format!("member \"{}\"", m.name.get_ref());
        let endpoint = self.unicast(&ctx, "endpoint", &m.endpoint);
        let cidrs = self.cidrs(&ctx, &m.cidrs);
        if self.errors.len() > before {
            return None;
        }
        Some(Member { name: name?, endpoint: endpoint?, cidrs, origin: Origin::at(self.src, &m.name.span()) })
    }
}
