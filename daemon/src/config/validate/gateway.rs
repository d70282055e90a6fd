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
    rise: Option<u32>,
}

impl Check<'_, '_> {
    pub(super) fn gateway(&mut self, g: RawGateway, origin: Origin) -> Option<Gateway> {
        let before = self.errors.len();
        let role =
            self.choice(CTX, "role", &g.role, &[("member", GatewayRole::Member), ("gateway", GatewayRole::Gateway)]);
        let (local_ip, gateway_ips) = self.gateway_addresses(&g, role);
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
        let (private_key, wireguard_port) = self.gateway_wireguard(&g, role, [udp_port, probes.port]);
        if self.errors.len() > before {
            return None;
        }
        Some(Gateway {
            role: role?,
            local_ip: local_ip?,
            gateway_ips,
            vni: vni?,
            udp_port: udp_port?,
            probe_interval: probes.interval?,
            probe_loss: probes.loss?,
            probe_port: probes.port?,
            probe_rise: probes.rise?,
            preempt: g.preempt.as_ref().is_some_and(|v| *v.get_ref()),
            private_key,
            wireguard_port: wireguard_port?,
            origin,
        })
    }

    /// `local_ip`, and a member's gateways (`gateway_ip` or `gateway_ips`,
    /// of local_ip's family).
    fn gateway_addresses(&mut self, g: &RawGateway, role: Option<GatewayRole>) -> (Option<IpAddr>, Vec<IpAddr>) {
        let local_ip = self.unicast(CTX, "local_ip", &g.local_ip);
        let given = g.gateway_ip.as_ref().map(|v| v.span()).or_else(|| g.gateway_ips.as_ref().map(|v| v.span()));
        let gateway_ips =
            self.address_list(CTX, ("gateway_ip", &g.gateway_ip), ("gateway_ips", &g.gateway_ips)).unwrap_or_default();
        match (role, given.clone()) {
            (Some(GatewayRole::Member), None) => self.fail(
                &g.role.span(),
                "gateway_ips",
                format!("{CTX}: a member needs `gateway_ips` (or `gateway_ip`), the underlay addresses of this site's gateways"),
            ),
            (Some(GatewayRole::Gateway), Some(span)) => self.fail(
                &span,
                "gateway_ips",
                format!("{CTX}: `gateway_ips` and `gateway_ip` are only for role = \"member\"; a gateway routes to its peers' endpoints"),
            ),
            _ => {}
        }
        if let Some(local) = local_ip {
            if let Some(gw) = gateway_ips.iter().find(|gw| gw.is_ipv4() != local.is_ipv4()) {
                self.fail(
                    &given.clone().unwrap_or_default(),
                    "gateway_ips",
                    format!("{CTX}: gateway {gw} and local_ip {local} are not the same address family"),
                );
            }
            if gateway_ips.contains(&local) {
                self.fail(
                    &given.clone().unwrap_or_default(),
                    "gateway_ips",
                    format!("{CTX}: gateway {local} is this member's own local_ip"),
                );
            }
        }
        (local_ip, gateway_ips)
    }

    /// A list of gateway addresses in order of preference, given as one
    /// address (`single`) or a list (`list`), never both: unicast, no
    /// repeats, one family, at most MAX_GATEWAYS_PER_SITE. `None` when
    /// neither is given or an entry is wrong (the error is recorded).
    fn address_list(
        &mut self,
        ctx: &str,
        (one_key, one): (&str, &Option<S<String>>),
        (list_key, list): (&str, &Option<S<Vec<S<String>>>>),
    ) -> Option<Vec<IpAddr>> {
        let items: Vec<(&str, &S<String>)> = match (one, list) {
            (None, None) => return None,
            (Some(_), Some(l)) => {
                self.fail(&l.span(), list_key, format!("{ctx}: give `{list_key}` or `{one_key}`, not both"));
                return None;
            }
            (Some(v), None) => vec![(one_key, v)],
            (None, Some(l)) => l.get_ref().iter().map(|v| (list_key, v)).collect(),
        };
        let before = self.errors.len();
        if let Some(l) = list {
            let n = l.get_ref().len();
            if n == 0 {
                self.fail(&l.span(), list_key, format!("{ctx}: `{list_key}` is empty; list at least one address"));
            } else if n > MAX_GATEWAYS_PER_SITE {
                self.fail(
                    &l.span(),
                    list_key,
                    format!("{ctx}: `{list_key}` lists {n} addresses; at most {MAX_GATEWAYS_PER_SITE} are probed"),
                );
            }
        }
        let mut out: Vec<IpAddr> = Vec::new();
        for (key, v) in items {
            let Some(ip) = self.unicast(ctx, key, v) else { continue };
            if out.contains(&ip) {
                self.fail(&v.span(), key, format!("{ctx}: {ip} is listed twice in `{key}`"));
            } else if out.first().is_some_and(|first| first.is_ipv4() != ip.is_ipv4()) {
                self.fail(
                    &v.span(),
                    key,
                    format!(
                        "{ctx}: `{key}` mixes IPv4 and IPv6 ({} and {ip}); a site's gateways share one family",
                        out[0]
                    ),
                );
            }
            out.push(ip);
        }
        (self.errors.len() == before).then_some(out)
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
        let loss = self.probe_count("probe_loss", &g.probe_loss, DEFAULT_PROBE_LOSS);
        let rise = self.probe_count("probe_rise", &g.probe_rise, DEFAULT_PROBE_RISE);
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
        Probes { port, interval, loss, rise }
    }

    /// `private_key_file` (a gateway's only) and `wireguard_port` (not a
    /// port the tunnel or the probes use).
    fn gateway_wireguard(
        &mut self,
        g: &RawGateway,
        role: Option<GatewayRole>,
        taken: [Option<u16>; 2],
    ) -> (Option<KeySource>, Option<u16>) {
        let private_key = g.private_key_file.as_ref().and_then(|v| {
            if role == Some(GatewayRole::Member) {
                self.fail(
                    &v.span(),
                    "private_key_file",
                    format!("{CTX}: private_key_file is only for role = \"gateway\"; a member reaches its own gateway on the site's network, in clear"),
                );
                return None;
            }
            match KeySource::parse(v.get_ref()) {
                Ok(k) => Some(k),
                Err(why) => {
                    self.fail(&v.span(), "private_key_file", format!("{CTX}: private_key_file {why}"));
                    None
                }
            }
        });
        let port = match &g.wireguard_port {
            None => Some(DEFAULT_WIREGUARD_PORT),
            Some(p) => self.port(CTX, "wireguard_port", p, false),
        };
        if let Some(p) = port.filter(|p| taken.contains(&Some(*p))) {
            let span = g.wireguard_port.as_ref().map(|v| v.span()).unwrap_or_else(|| g.role.span());
            self.fail(
                &span,
                "wireguard_port",
                format!("{CTX}: wireguard_port {p} is the tunnel's udp_port or the probe_port; use another port"),
            );
        }
        (private_key, port)
    }

    /// A count of probes in a row (`probe_loss`, `probe_rise`): 1 to 1000.
    fn probe_count(&mut self, key: &str, v: &Option<S<i64>>, default: u32) -> Option<u32> {
        match v {
            None => Some(default),
            Some(v) if (1..=1000).contains(v.get_ref()) => Some(*v.get_ref() as u32),
            Some(v) => {
                self.fail(&v.span(), key, format!("{CTX}: {key} {} is out of range; use 1 to 1000", v.get_ref()));
                None
            }
        }
    }

    pub(super) fn peer(&mut self, p: RawPeer) -> Option<Peer> {
        let before = self.errors.len();
        let name = self.name("peer", &p.name);
        let ctx = format!("peer \"{}\"", p.name.get_ref());
        // Each endpoint's address, with the span of its entry when the
        // entry is a plain string.
        let addresses = p.endpoints.as_ref().map(|l| {
            let items = l.get_ref().iter().map(|e| {
                let span = if e.get_ref().address.span().is_empty() { e.span() } else { e.get_ref().address.span() };
                S::new(span, e.get_ref().address.get_ref().clone())
            });
            S::new(l.span(), items.collect())
        });
        let endpoints =
            self.address_list(&ctx, ("endpoint", &p.endpoint), ("endpoints", &addresses)).unwrap_or_default();
        let cidrs = self.cidrs(&ctx, &p.cidrs);
        let encryption = self.encryption(&ctx, &p, endpoints.len());
        if self.errors.len() > before {
            return None;
        }
        Some(Peer {
            name: name?,
            endpoints,
            cidrs,
            encryption: encryption?,
            origin: Origin::at(self.src, &p.name.span()),
        })
    }

    /// `encryption`, and for WireGuard one public key per endpoint: the
    /// peer's `public_key` when it has one endpoint, each endpoint's
    /// `public_key` when it has several (a site's gateways each have their
    /// own key: WireGuard sends to one address per key). `n` endpoints.
    fn encryption(&mut self, ctx: &str, p: &RawPeer, n: usize) -> Option<Encryption> {
        let kind = match &p.encryption {
            None => "none",
            Some(v) => self.choice(ctx, "encryption", v, &[("none", "none"), ("wireguard", "wireguard")])?,
        };
        let per_endpoint: Vec<&S<String>> = p
            .endpoints
            .iter()
            .flat_map(|l| l.get_ref().iter().filter_map(|e| e.get_ref().public_key.as_ref()))
            .collect();
        if kind == "none" {
            let stray = p
                .public_key
                .as_ref()
                .map(|v| ("public_key", v.span()))
                .or_else(|| per_endpoint.first().map(|v| ("public_key", v.span())))
                .or_else(|| p.wireguard_port.as_ref().map(|v| ("wireguard_port", v.span())));
            if let Some((key, span)) = stray {
                self.fail(&span, key, format!("{ctx}: {key} is only for encryption = \"wireguard\""));
                return None;
            }
            return Some(Encryption::None);
        }
        let span = p.encryption.as_ref().map(|v| v.span()).unwrap_or_default();
        if n == 0 {
            self.fail(&span, "encryption", format!("{ctx}: encryption is between gateways; give this peer's `endpoints` on a gateway (a member's traffic reaches its own gateway in clear)"));
            return None;
        }
        let keys: Vec<&S<String>> = match (&p.public_key, per_endpoint.len()) {
            (Some(k), 0) if n == 1 => vec![k],
            (Some(k), 0) => {
                self.fail(&k.span(), "public_key", format!("{ctx}: {n} endpoints need a key each; give each entry of `endpoints` as {{ address = \"…\", public_key = \"…\" }}"));
                return None;
            }
            (Some(k), _) => {
                self.fail(&k.span(), "public_key", format!("{ctx}: give `public_key` or each endpoint's, not both"));
                return None;
            }
            (None, m) if m == n => per_endpoint,
            (None, _) => {
                self.fail(&span, "public_key", format!("{ctx}: encryption = \"wireguard\" needs each endpoint's public key (`public_key`, or {{ address = \"…\", public_key = \"…\" }} in `endpoints`)"));
                return None;
            }
        };
        let mut public_keys: Vec<PublicKey> = Vec::with_capacity(n);
        for k in keys {
            match PublicKey::parse(k.get_ref()) {
                Some(key) if public_keys.contains(&key) => {
                    self.fail(
                        &k.span(),
                        "public_key",
                        format!("{ctx}: public key {key} is given twice; each gateway has its own"),
                    );
                }
                Some(key) => public_keys.push(key),
                None => self.fail(
                    &k.span(),
                    "public_key",
                    format!(
                        "{ctx}: public_key is not a WireGuard key (44 characters of base64, as `wg pubkey` prints)"
                    ),
                ),
            }
        }
        let port = match &p.wireguard_port {
            None => Some(None),
            Some(v) => self.port(ctx, "wireguard_port", v, false).map(Some),
        };
        (public_keys.len() == n).then_some(Encryption::Wireguard { public_keys, port: port? })
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
