//! `[[service]]` with its backends, and `[[mesh]]`.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use super::{is_unicast, Check, MAX_WEIGHT};
use crate::config::error::Origin;
use crate::config::schema::*;
use crate::config::types::*;

impl Check<'_, '_> {
    pub(super) fn service(&mut self, s: RawService) -> Option<Service> {
        let before = self.errors.len();
        let name = self.name("service", &s.name);
        let ctx = format!("service \"{}\"", s.name.get_ref());
        let vip = self.vip(&ctx, &s.vip);
        let port = self.port(&ctx, "port", &s.port, false);
        let protocol = self.protocol(&ctx, s.protocol.as_ref());
        // As many as listed, not the doubling a push leaves (a service of
        // one backend would hold four: 11 MB at 100,000 services).
        let mut backends: Vec<Backend> = Vec::with_capacity(s.backends.len().min(crate::abi::MAX_BACKENDS as usize));
        let mut seen = std::collections::HashSet::new();
        if s.backends.len() > crate::abi::MAX_BACKENDS as usize {
            // Said once, not once per backend.
            let span = s.backends.first().map(|b| b.span()).unwrap_or_else(|| s.name.span());
            self.fail(
                &span,
                "backends",
                format!(
                    "{ctx}: {} backends; a service can have at most {}",
                    s.backends.len(),
                    crate::abi::MAX_BACKENDS
                ),
            );
        }
        for b in s.backends.iter().take(crate::abi::MAX_BACKENDS as usize + 1) {
            if let Some(backend) = self.backend(&ctx, b, vip) {
                if !seen.insert(backend.addr) {
                    let span =
                        if b.get_ref().address.span().is_empty() { b.span() } else { b.get_ref().address.span() };
                    self.fail(&span, "backends", format!("{ctx}: backend {} is listed twice", backend.addr));
                } else {
                    backends.push(backend);
                }
            }
        }
        // An error here is counted, and the service refused below.
        let node_port = s.node_port.as_ref().and_then(|v| self.port(&ctx, "node_port", v, false));
        let external = s.external.as_ref().is_some_and(|v| *v.get_ref());
        let external_policy = match &s.external_policy {
            Some(v) => self.external_policy(&ctx, v, external || s.node_port.is_some()),
            None => Some(ExternalPolicy::Snat),
        };
        let maglev_table_size = s.maglev_table_size.as_ref().and_then(|v| self.table_size(&ctx, v));
        let affinity = self.affinity(&ctx, &s);
        let drain_timeout = self.drain_timeout(&ctx, &s, protocol);
        let health_check =
            s.health_check.as_ref().and_then(|h| self.health_check(&ctx, h.get_ref(), vip)).map(Box::new);
        if self.errors.len() > before {
            return None;
        }
        Some(Service {
            name: name?,
            vip: vip?,
            port: port?,
            protocol: protocol?,
            backends,
            maglev_table_size,
            health_check,
            affinity: affinity?,
            drain_timeout: drain_timeout?,
            node_port,
            external,
            external_policy: external_policy?,
            origin: Origin::at(self.src, &s.name.span()),
        })
    }

    /// `external_policy`: "snat" (the default) or "local"; only with a
    /// node port or an external VIP.
    fn external_policy(
        &mut self,
        ctx: &str,
        v: &toml::Spanned<String>,
        serves_network: bool,
    ) -> Option<ExternalPolicy> {
        let policy = self.choice(
            ctx,
            "external_policy",
            v,
            &[("snat", ExternalPolicy::Snat), ("local", ExternalPolicy::Local)],
        )?;
        if !serves_network {
            self.fail(
                &v.span(),
                "external_policy",
                format!("{ctx}: external_policy applies to clients on other machines; set node_port or external = true, or remove it"),
            );
            return None;
        }
        Some(policy)
    }

    /// `affinity` and `affinity_timeout`: `Some(None)` without affinity.
    fn affinity(&mut self, ctx: &str, s: &RawService) -> Option<Option<Duration>> {
        let on = match &s.affinity {
            None => false,
            Some(v) => self.choice(ctx, "affinity", v, &[("none", false), ("client-ip", true)])?,
        };
        match (&s.affinity_timeout, on) {
            (None, on) => Some(on.then_some(DEFAULT_AFFINITY_TIMEOUT)),
            (Some(v), false) => {
                self.fail(
                    &v.span(),
                    "affinity_timeout",
                    format!("{ctx}: affinity_timeout needs affinity = \"client-ip\""),
                );
                None
            }
            (Some(v), true) => {
                let range = (Duration::from_secs(1), Duration::from_secs(86_400));
                self.duration_within(ctx, "affinity_timeout", v, range, "is out of range; use 1s to 24h").map(Some)
            }
        }
    }

    /// `drain_timeout`, for TCP services (UDP flows move at once).
    fn drain_timeout(&mut self, ctx: &str, s: &RawService, protocol: Option<Protocol>) -> Option<Option<Duration>> {
        let Some(v) = &s.drain_timeout else { return Some(None) };
        if protocol == Some(Protocol::Udp) {
            let msg = format!("{ctx}: drain_timeout is for TCP services; UDP flows leave a backend at once");
            self.fail(&v.span(), "drain_timeout", msg);
            return None;
        }
        let range = (Duration::from_secs(1), Duration::from_secs(86_400));
        self.duration_within(ctx, "drain_timeout", v, range, "is out of range; use 1s to 24h").map(Some)
    }

    fn backend(&mut self, ctx: &str, b: &toml::Spanned<RawBackend>, vip: Option<IpAddr>) -> Option<Backend> {
        let raw = b.get_ref();
        let span = if raw.address.span().is_empty() { b.span() } else { raw.address.span() };
        let text = raw.address.get_ref();
        let addr: SocketAddr = match text.parse() {
            Ok(a) => a,
            Err(_) => {
                self.fail(
                    &span,
                    "backends",
                    format!("{ctx}: backend \"{text}\" is not an address with a port, like \"192.0.2.10:8080\" or \"[2001:db8::10]:8080\""),
                );
                return None;
            }
        };
        if addr.port() == 0 {
            self.fail(&span, "backends", format!("{ctx}: backend {addr} has port 0; use 1 to 65535"));
            return None;
        }
        if !is_unicast(addr.ip()) {
            self.fail(&span, "backends", format!("{ctx}: backend {addr} is not a unicast address"));
            return None;
        }
        if let Some(vip) = vip {
            if vip.is_ipv4() != addr.is_ipv4() {
                let (bf, vf) = if addr.is_ipv4() { ("IPv4", "IPv6") } else { ("IPv6", "IPv4") };
                self.fail(&span, "backends", format!("{ctx}: backend {addr} is {bf} but the VIP is {vf}"));
                return None;
            }
        }
        let weight = match &raw.weight {
            None => 1,
            Some(w) if (0..=MAX_WEIGHT).contains(w.get_ref()) => *w.get_ref() as u32,
            Some(w) => {
                self.fail(
                    &w.span(),
                    "weight",
                    format!(
                        "{ctx}: backend {addr} has weight {}; use 1 to {MAX_WEIGHT}, or 0 to drain it (no new connections)",
                        w.get_ref()
                    ),
                );
                return None;
            }
        };
        Some(Backend { addr, weight })
    }

    pub(super) fn mesh(&mut self, m: RawMesh) -> Option<Mesh> {
        let before = self.errors.len();
        let name = self.name("mesh", &m.name);
        let ctx = format!("mesh \"{}\"", m.name.get_ref());
        let vip = self.vip(&ctx, &m.vip);
        let port = self.port(&ctx, "port", &m.port, true);
        let protocol = self.protocol(&ctx, m.protocol.as_ref());
        let redirect_port = self.port(&ctx, "redirect_port", &m.redirect_port, false);
        if self.errors.len() > before {
            return None;
        }
        Some(Mesh {
            name: name?,
            vip: vip?,
            port: port?,
            protocol: protocol?,
            redirect_port: redirect_port?,
            origin: Origin::at(self.src, &m.name.span()),
        })
    }
}
