//! Validation of one file on its own: every value checked, every error
//! collected (not just the first), each with its position and key.
//! Uniqueness (names, VIP:port:protocol, one [daemon]) is checked by
//! `merge`, within a file and across files alike.

use std::net::{IpAddr, SocketAddr};
use std::ops::Range;
use std::path::PathBuf;

use ipnet::IpNet;

use super::capacity::{Capacity, SIZE_KEYS};
use super::duration::parse_duration;
use super::error::{ConfigError, Origin, Source};
use super::schema::*;
use super::split;
use super::types::*;
use crate::table_size::{is_prime, MAX_TABLE_SIZE, MIN_TABLE_SIZE};

pub(super) const MAX_NAME_LEN: usize = 63;
pub(super) const MAX_WEIGHT: i64 = 1000;
pub(super) const MAX_VNI: i64 = (1 << 24) - 1;

/// Parses and validates one file's text: a large one in parts
/// (`split.rs`), and whole when a part fails, so that errors are always
/// the whole file's.
pub(crate) fn parse_file(src: &Source<'_>) -> Result<FileConfig, Vec<ConfigError>> {
    match split::parts(src.text).and_then(|parts| parse_parts(src, parts)) {
        Some(file) => Ok(file),
        None => parse_whole(src),
    }
}

/// The file's parts parsed and validated one by one and joined; `None` if
/// any part has an error or two parts hold `[daemon]` or `[gateway]`.
pub(super) fn parse_parts(src: &Source<'_>, parts: Vec<Range<usize>>) -> Option<FileConfig> {
    let mut file = FileConfig::default();
    for range in parts {
        let part = parse_whole(&src.part(range)).ok()?;
        if (part.daemon.is_some() && file.daemon.is_some()) || (part.gateway.is_some() && file.gateway.is_some()) {
            return None;
        }
        file.daemon = file.daemon.or(part.daemon);
        file.gateway = file.gateway.or(part.gateway);
        file.services.extend(part.services);
        file.meshes.extend(part.meshes);
        file.peers.extend(part.peers);
        file.members.extend(part.members);
    }
    file.services.shrink_to_fit();
    Some(file)
}

pub(super) fn parse_whole(src: &Source<'_>) -> Result<FileConfig, Vec<ConfigError>> {
    let raw = parse_raw(src)?;
    let mut check = Check { src, errors: Vec::new() };
    let file = check.file(raw);
    if check.errors.is_empty() {
        Ok(file)
    } else {
        Err(check.errors)
    }
}

/// The items into a vector of their own, exactly as large as they are.
fn fresh<T>(items: impl Iterator<Item = T>) -> Vec<T> {
    let mut out = Vec::with_capacity(items.size_hint().0);
    out.extend(items);
    out.shrink_to_fit();
    out
}

/// Unknown keys reported per file, at most (the rest wait for the next check).
const UNKNOWN_KEYS_MAX: usize = 20;

/// The TOML parsed into the schema. The parser stops at the first unknown
/// key; to report every one, the line holding it is blanked (offsets kept,
/// so positions stay true) and the text parsed again. An error that only
/// shows up after blanking may be an artefact of it (a value that went on
/// over several lines), so it is left for the next check.
fn parse_raw(src: &Source<'_>) -> Result<RawFile, Vec<ConfigError>> {
    let mut text = std::borrow::Cow::Borrowed(src.text);
    let mut errors = Vec::new();
    loop {
        let err = match toml::from_str::<RawFile>(&text) {
            Ok(raw) if errors.is_empty() => return Ok(raw),
            Ok(_) => return Err(in_file_order(errors)),
            Err(e) => e,
        };
        let unknown = err.message().starts_with("unknown field");
        if !unknown && !errors.is_empty() {
            return Err(in_file_order(errors));
        }
        errors.push(toml_error(src, &err));
        let span = err.span().unwrap_or(0..0);
        let start = src.text[..span.start.min(src.text.len())].rfind('\n').map_or(0, |i| i + 1);
        let end = src.text[start..].find('\n').map_or(src.text.len(), |i| start + i);
        // A table header ([[servce]]) cannot be blanked without moving its
        // keys into the table before it.
        if !unknown || errors.len() >= UNKNOWN_KEYS_MAX || src.text[start..end].trim_start().starts_with('[') {
            return Err(in_file_order(errors));
        }
        let mut owned = text.into_owned();
        owned.replace_range(start..end, &" ".repeat(end - start));
        text = std::borrow::Cow::Owned(owned);
    }
}

fn in_file_order(mut errors: Vec<ConfigError>) -> Vec<ConfigError> {
    errors.sort_by_key(|e| (e.line, e.column));
    errors
}

fn toml_error(src: &Source<'_>, err: &toml::de::Error) -> ConfigError {
    let span = err.span().unwrap_or(0..0);
    let key = src.key_on_line(span.start);
    let detail = err.message().trim().replace('\n', "; ");
    let message = match &key {
        Some(key) => format!("invalid TOML at key `{key}`: {detail}"),
        _ => format!("invalid TOML: {detail}"),
    };
    src.error(&span, key.as_deref(), message)
}

struct Check<'s, 'a> {
    src: &'s Source<'a>,
    errors: Vec<ConfigError>,
}

impl Check<'_, '_> {
    fn fail(&mut self, span: &Range<usize>, key: &str, message: String) {
        let err = self.src.error(span, Some(key), message);
        self.errors.push(err);
    }

    fn file(&mut self, raw: RawFile) -> FileConfig {
        let daemon = raw.daemon.map(|d| {
            let origin = Origin::at(self.src, &d.span());
            self.daemon(d.into_inner(), origin)
        });
        // Collected into new vectors: collecting in place would keep the
        // raw tables' allocation (~670 bytes per service, 67 MB for a file
        // of 100,000) for as long as the file is in force.
        let services = fresh(raw.service.into_iter().filter_map(|s| self.service(s.into_inner())));
        let meshes = fresh(raw.mesh.into_iter().filter_map(|m| self.mesh(m.into_inner())));
        let gateway = raw.gateway.and_then(|g| {
            let origin = Origin::at(self.src, &g.span());
            self.gateway(g.into_inner(), origin)
        });
        let peers = fresh(raw.peer.into_iter().filter_map(|p| self.peer(p.into_inner())));
        let members = fresh(raw.member.into_iter().filter_map(|m| self.member(m.into_inner())));
        FileConfig { daemon, services, meshes, gateway, peers, members }
    }

    fn daemon(&mut self, d: RawDaemon, origin: Origin) -> DaemonSettings {
        let ctx = "[daemon]";
        let mut out = DaemonSettings { origin: Some(origin), ..DaemonSettings::default() };
        let raw_sizes: Vec<_> = SIZE_KEYS.iter().map(|k| (k, raw_size(&d, k.capacity).cloned())).collect();
        if let Some(v) = d.connect_time_lb {
            match CtlbMode::parse(v.get_ref()) {
                Some(mode) => out.connect_time_lb = mode,
                None => self.fail(
                    &v.span(),
                    "connect_time_lb",
                    format!("{ctx}: connect_time_lb \"{}\" is not one of \"all\", \"tcp\" or \"off\"", v.get_ref()),
                ),
            }
        }
        if let Some(list) = d.host_interfaces {
            let mut names = Vec::new();
            for ifname in list {
                let name = ifname.get_ref();
                if is_interface_name(name) {
                    names.push(name.clone());
                } else {
                    self.fail(
                        &ifname.span(),
                        "host_interfaces",
                        format!("{ctx}: host_interfaces entry \"{name}\" is not a valid interface name"),
                    );
                }
            }
            out.host_interfaces = Some(names);
        }
        if let Some(v) = d.cgroup {
            let path = PathBuf::from(v.get_ref());
            if path.is_absolute() {
                out.cgroup = Some(path);
            } else {
                self.fail(&v.span(), "cgroup", format!("{ctx}: cgroup \"{}\" must be an absolute path", v.get_ref()));
            }
        }
        if let Some(v) = d.mesh_backend {
            match v.get_ref().as_str() {
                "auto" => out.mesh_backend = MeshBackend::Auto,
                "sk_lookup" => out.mesh_backend = MeshBackend::SkLookup,
                "nftables" => out.mesh_backend = MeshBackend::Nftables,
                other => self.fail(
                    &v.span(),
                    "mesh_backend",
                    format!("{ctx}: mesh_backend \"{other}\" is not one of \"auto\", \"sk_lookup\" or \"nftables\""),
                ),
            }
        }
        if let Some(v) = d.tc_attach {
            match v.get_ref().as_str() {
                "auto" => out.tc_attach = TcAttachPref::Auto,
                "netlink" => out.tc_attach = TcAttachPref::Netlink,
                other => self.fail(
                    &v.span(),
                    "tc_attach",
                    format!("{ctx}: tc_attach \"{other}\" is not one of \"auto\" or \"netlink\""),
                ),
            }
        }
        if let Some(v) = d.resync_interval {
            match parse_duration(v.get_ref()) {
                Ok(d) if d.as_millis() >= 100 => out.resync_interval = d,
                Ok(_) => self.fail(
                    &v.span(),
                    "resync_interval",
                    format!("{ctx}: resync_interval \"{}\" is too short; use at least 100ms", v.get_ref()),
                ),
                Err(e) => self.fail(&v.span(), "resync_interval", format!("{ctx}: resync_interval {e}")),
            }
        }
        if let Some(v) = d.maglev_table_size {
            if let Some(n) = self.table_size(ctx, &v) {
                out.maglev_table_size = Some(n);
            }
        }
        for (k, v) in raw_sizes {
            let Some(v) = v else { continue };
            match u32::try_from(*v.get_ref()) {
                Ok(n) if (k.min..=k.max).contains(&n) => out.sizes.set(k.capacity, n),
                _ => self.fail(
                    &v.span(),
                    k.key,
                    format!("{ctx}: {} {} is out of range; use {} to {}", k.key, v.get_ref(), k.min, k.max),
                ),
            }
        }
        for (key, value, slot) in [
            ("conntrack_tcp_timeout", d.conntrack_tcp_timeout, &mut out.conntrack_tcp_timeout),
            ("conntrack_udp_timeout", d.conntrack_udp_timeout, &mut out.conntrack_udp_timeout),
        ] {
            let Some(v) = value else { continue };
            match parse_duration(v.get_ref()) {
                Ok(d) if d.as_secs() >= 1 && d.as_secs() <= u64::from(u32::MAX) => *slot = d,
                Ok(_) => self.fail(
                    &v.span(),
                    key,
                    format!("{ctx}: {key} \"{}\" is out of range; use 1s to 49710d", v.get_ref()),
                ),
                Err(e) => self.fail(&v.span(), key, format!("{ctx}: {key} {e}")),
            }
        }
        out
    }

    fn table_size(&mut self, ctx: &str, v: &toml::Spanned<i64>) -> Option<u32> {
        let n = *v.get_ref();
        let (min, max) = (i64::from(MIN_TABLE_SIZE), i64::from(MAX_TABLE_SIZE));
        if (min..=max).contains(&n) && is_prime(n as u32) {
            Some(n as u32)
        } else {
            self.fail(
                &v.span(),
                "maglev_table_size",
                format!("{ctx}: maglev_table_size {n} must be a prime number from {min} to {max} (for example 251, 1021 or 4093)"),
            );
            None
        }
    }

    fn service(&mut self, s: RawService) -> Option<Service> {
        let before = self.errors.len();
        let name = self.name("service", &s.name);
        let ctx = format!("service \"{}\"", s.name.get_ref());
        let vip = self.vip(&ctx, &s.vip);
        let port = self.port(&ctx, "port", &s.port, false);
        let protocol = self.protocol(&ctx, s.protocol.as_ref());
        let mut backends: Vec<Backend> = Vec::new();
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
        for (key, span) in [
            ("node_port", s.node_port.as_ref().map(|v| v.span())),
            ("health_check", s.health_check.as_ref().map(|v| v.span())),
            ("affinity", s.affinity.as_ref().map(|v| v.span())),
            ("affinity_timeout", s.affinity_timeout.as_ref().map(|v| v.span())),
        ] {
            if let Some(span) = span {
                self.fail(
                    &span,
                    key,
                    format!("{ctx}: `{key}` is not supported by this version of hostmesh yet; remove it"),
                );
            }
        }
        let maglev_table_size = s.maglev_table_size.as_ref().and_then(|v| self.table_size(&ctx, v));
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
            origin: Origin::at(self.src, &s.name.span()),
        })
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
            Some(w) if (1..=MAX_WEIGHT).contains(w.get_ref()) => *w.get_ref() as u32,
            Some(w) => {
                self.fail(
                    &w.span(),
                    "weight",
                    format!(
                        "{ctx}: backend {addr} has weight {}; use 1 to {MAX_WEIGHT} (remove a backend to stop sending it traffic)",
                        w.get_ref()
                    ),
                );
                return None;
            }
        };
        Some(Backend { addr, weight })
    }

    fn mesh(&mut self, m: RawMesh) -> Option<Mesh> {
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

    fn gateway(&mut self, g: RawGateway, origin: Origin) -> Option<Gateway> {
        let before = self.errors.len();
        let ctx = "[gateway]";
        let role = match g.role.get_ref().as_str() {
            "member" => Some(GatewayRole::Member),
            "gateway" => Some(GatewayRole::Gateway),
            other => {
                self.fail(
                    &g.role.span(),
                    "role",
                    format!("{ctx}: role \"{other}\" is not one of \"member\" or \"gateway\""),
                );
                None
            }
        };
        let local_ip = self.unicast(ctx, "local_ip", &g.local_ip);
        let gateway_ip = g.gateway_ip.as_ref().and_then(|v| self.unicast(ctx, "gateway_ip", v));
        match (role, &g.gateway_ip) {
            (Some(GatewayRole::Member), None) => self.fail(
                &g.role.span(),
                "gateway_ip",
                format!("{ctx}: a member needs `gateway_ip`, the underlay address of this site's gateway"),
            ),
            (Some(GatewayRole::Gateway), Some(v)) => self.fail(
                &v.span(),
                "gateway_ip",
                format!("{ctx}: `gateway_ip` is only for role = \"member\"; a gateway routes to its peers' endpoints"),
            ),
            _ => {}
        }
        if let (Some(local), Some(gw)) = (local_ip, gateway_ip) {
            if local.is_ipv4() != gw.is_ipv4() {
                self.fail(
                    &g.gateway_ip.as_ref().map(|v| v.span()).unwrap_or_default(),
                    "gateway_ip",
                    format!("{ctx}: gateway_ip {gw} and local_ip {local} are not the same address family"),
                );
            }
        }
        let vni = match *g.vni.get_ref() {
            v @ 1..=MAX_VNI => Some(v as u32),
            v => {
                self.fail(&g.vni.span(), "vni", format!("{ctx}: vni {v} is out of range; use 1 to {MAX_VNI}"));
                None
            }
        };
        let udp_port = match &g.udp_port {
            None => Some(4789),
            Some(p) => self.port(ctx, "udp_port", p, false),
        };
        let probe_port = match &g.probe_port {
            None => Some(DEFAULT_PROBE_PORT),
            Some(p) => self.port(ctx, "probe_port", p, false),
        };
        let probe_interval = match &g.probe_interval {
            None => Some(DEFAULT_PROBE_INTERVAL),
            Some(v) => match parse_duration(v.get_ref()) {
                Ok(d) if d.as_millis() >= 50 && d.as_secs() <= 3600 => Some(d),
                Ok(_) => {
                    self.fail(
                        &v.span(),
                        "probe_interval",
                        format!("{ctx}: probe_interval \"{}\" is out of range; use 50ms to 1h", v.get_ref()),
                    );
                    None
                }
                Err(e) => {
                    self.fail(&v.span(), "probe_interval", format!("{ctx}: probe_interval {e}"));
                    None
                }
            },
        };
        let probe_loss = match &g.probe_loss {
            None => Some(DEFAULT_PROBE_LOSS),
            Some(v) if (1..=1000).contains(v.get_ref()) => Some(*v.get_ref() as u32),
            Some(v) => {
                self.fail(
                    &v.span(),
                    "probe_loss",
                    format!("{ctx}: probe_loss {} is out of range; use 1 to 1000", v.get_ref()),
                );
                None
            }
        };
        if let (Some(a), Some(b)) = (udp_port, probe_port) {
            if a == b {
                let span = g.probe_port.as_ref().map(|v| v.span()).unwrap_or_else(|| g.role.span());
                self.fail(
                    &span,
                    "probe_port",
                    format!("{ctx}: probe_port {b} is the tunnel's udp_port; use another port"),
                );
            }
        }
        if self.errors.len() > before {
            return None;
        }
        Some(Gateway {
            role: role?,
            local_ip: local_ip?,
            gateway_ip,
            vni: vni?,
            udp_port: udp_port?,
            probe_interval: probe_interval?,
            probe_loss: probe_loss?,
            probe_port: probe_port?,
            origin,
        })
    }

    fn peer(&mut self, p: RawPeer) -> Option<Peer> {
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

    fn member(&mut self, m: RawMember) -> Option<Member> {
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

    fn name(&mut self, kind: &str, v: &toml::Spanned<String>) -> Option<String> {
        let name = v.get_ref();
        if is_object_name(name) {
            Some(name.clone())
        } else {
            self.fail(
                &v.span(),
                "name",
                format!(
                    "{kind} name \"{name}\" is not valid; use 1 to {MAX_NAME_LEN} lowercase letters, digits and '-', starting with a letter or digit"
                ),
            );
            None
        }
    }

    fn ip(&mut self, ctx: &str, key: &str, v: &toml::Spanned<String>) -> Option<IpAddr> {
        match v.get_ref().parse::<IpAddr>() {
            Ok(ip) => Some(ip),
            Err(_) => {
                self.fail(&v.span(), key, format!("{ctx}: {key} \"{}\" is not an IPv4 or IPv6 address", v.get_ref()));
                None
            }
        }
    }

    fn unicast(&mut self, ctx: &str, key: &str, v: &toml::Spanned<String>) -> Option<IpAddr> {
        let ip = self.ip(ctx, key, v)?;
        if is_unicast(ip) {
            Some(ip)
        } else {
            self.fail(&v.span(), key, format!("{ctx}: {key} {ip} is not a unicast address"));
            None
        }
    }

    fn vip(&mut self, ctx: &str, v: &toml::Spanned<String>) -> Option<IpAddr> {
        let ip = self.ip(ctx, "vip", v)?;
        if ip.is_loopback() {
            self.fail(&v.span(), "vip", format!("{ctx}: vip {ip} is a loopback address; a VIP must not be loopback"));
            None
        } else if !is_unicast(ip) {
            self.fail(&v.span(), "vip", format!("{ctx}: vip {ip} is not a unicast address"));
            None
        } else {
            Some(ip)
        }
    }

    fn port(&mut self, ctx: &str, key: &str, v: &toml::Spanned<i64>, zero_means_all: bool) -> Option<u16> {
        let n = *v.get_ref();
        let low = if zero_means_all { 0 } else { 1 };
        if (low..=65535).contains(&n) {
            Some(n as u16)
        } else {
            let hint = if zero_means_all { "use 0 (every port) to 65535" } else { "use 1 to 65535" };
            self.fail(&v.span(), key, format!("{ctx}: {key} {n} is out of range; {hint}"));
            None
        }
    }

    fn protocol(&mut self, ctx: &str, v: Option<&toml::Spanned<String>>) -> Option<Protocol> {
        let Some(v) = v else { return Some(Protocol::Tcp) };
        match v.get_ref().as_str() {
            "tcp" => Some(Protocol::Tcp),
            "udp" => Some(Protocol::Udp),
            other => {
                self.fail(
                    &v.span(),
                    "protocol",
                    format!("{ctx}: protocol \"{other}\" is not one of \"tcp\" or \"udp\""),
                );
                None
            }
        }
    }

    fn cidrs(&mut self, ctx: &str, list: &[toml::Spanned<String>]) -> Vec<IpNet> {
        let mut out: Vec<IpNet> = Vec::new();
        for v in list {
            match v.get_ref().parse::<IpNet>() {
                Ok(net) if net != net.trunc() => self.fail(
                    &v.span(),
                    "cidrs",
                    format!("{ctx}: cidr {net} has host bits set; did you mean {}?", net.trunc()),
                ),
                Ok(net) if out.contains(&net) => {
                    self.fail(&v.span(), "cidrs", format!("{ctx}: cidr {net} is listed twice"))
                }
                Ok(net) => out.push(net),
                Err(_) => self.fail(
                    &v.span(),
                    "cidrs",
                    format!("{ctx}: cidr \"{}\" is not a network like \"10.20.0.0/16\"", v.get_ref()),
                ),
            }
        }
        out
    }
}

pub(crate) fn is_object_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c.is_ascii_digit())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && name.len() <= MAX_NAME_LEN
}

/// The raw value of a capacity key.
fn raw_size(d: &RawDaemon, c: Capacity) -> Option<&toml::Spanned<i64>> {
    match c {
        Capacity::Services => d.service_map_size.as_ref(),
        Capacity::Backends => d.backend_map_size.as_ref(),
        Capacity::MaglevChunks => d.maglev_map_size.as_ref(),
        Capacity::Conntrack => d.conntrack_size.as_ref(),
        Capacity::ReverseSock => d.reverse_sock_map_size.as_ref(),
        Capacity::Mesh => d.mesh_map_size.as_ref(),
    }
}

fn is_interface_name(name: &str) -> bool {
    !name.is_empty() && name.len() < 16 && !name.contains(['/', ' ', '\0']) && name != "." && name != ".."
}

pub(crate) fn is_unicast(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => !(v4.is_unspecified() || v4.is_multicast() || v4.is_broadcast()),
        IpAddr::V6(v6) => !(v6.is_unspecified() || v6.is_multicast()),
    }
}
