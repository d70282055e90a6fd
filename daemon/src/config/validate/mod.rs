//! Validation of one file on its own: every value checked, every error
//! collected (not just the first), each with its position and key.
//! Uniqueness (names, VIP:port:protocol, one [daemon]) is checked by
//! `merge`, within a file and across files alike.
//!
//! One validator per section: `daemon.rs`, `services.rs` (services and
//! meshes), `gateway.rs` (the gateway, peers, members); this file walks
//! the file and holds the field checks they share.

use std::net::IpAddr;
use std::ops::Range;
use std::time::Duration;

use ipnet::IpNet;

use super::duration::parse_duration;
use super::error::{ConfigError, Origin, Source};
use super::schema::*;
use super::split;
use super::types::*;

mod daemon;
mod gateway;
mod health_check;
mod services;

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
    for part in parse_in_parallel(src, &parts)? {
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

/// Threads a large file's parts are parsed on, at most.
const PARSE_THREADS: usize = 4;

/// Each part parsed and validated on its own, the parts shared out in
/// runs over up to `PARSE_THREADS` threads (one per CPU): in order, or
/// `None` if any part has an error.
fn parse_in_parallel(src: &Source<'_>, parts: &[Range<usize>]) -> Option<Vec<FileConfig>> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = cpus.min(PARSE_THREADS).min(parts.len()).max(1);
    // Each part a source of its own (its positions the file's), made
    // here: a source finds its lines once, on the thread that asks.
    let mut sources = parts.iter().map(|r| src.part(r.clone()));
    let per = parts.len().div_ceil(threads);
    let runs: Vec<Vec<Source<'_>>> = (0..threads).map(|_| sources.by_ref().take(per).collect()).collect();
    let parse_run =
        |run: Vec<Source<'_>>| -> Option<Vec<FileConfig>> { run.iter().map(|p| parse_whole(p).ok()).collect() };
    let parsed: Vec<Option<Vec<FileConfig>>> = if threads == 1 {
        runs.into_iter().map(parse_run).collect()
    } else {
        std::thread::scope(|scope| {
            let spawned: Vec<_> = runs.into_iter().map(|run| scope.spawn(move || parse_run(run))).collect();
            spawned.into_iter().map(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
        })
    };
    let mut out = Vec::with_capacity(parts.len());
    for run in parsed {
        out.extend(run?);
    }
    Some(out)
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
        let services =
            fresh(raw.service.into_iter().filter_map(|s| self.service(s.into_inner())).map(std::sync::Arc::new));
        let meshes = fresh(raw.mesh.into_iter().filter_map(|m| self.mesh(m.into_inner())));
        let gateway = raw.gateway.and_then(|g| {
            let origin = Origin::at(self.src, &g.span());
            self.gateway(g.into_inner(), origin)
        });
        let peers = fresh(raw.peer.into_iter().filter_map(|p| self.peer(p.into_inner())));
        let members = fresh(raw.member.into_iter().filter_map(|m| self.member(m.into_inner())));
        FileConfig { daemon, services, meshes, gateway, peers, members, derived: Default::default() }
    }

    /// One of `table`'s names, or an error listing them all.
    fn choice<T: Copy>(&mut self, ctx: &str, key: &str, v: &toml::Spanned<String>, table: &[(&str, T)]) -> Option<T> {
        if let Some((_, value)) = table.iter().find(|(name, _)| name == v.get_ref()) {
            return Some(*value);
        }
        let names: Vec<String> = table.iter().map(|(n, _)| format!("\"{n}\"")).collect();
        let list = match names.split_last() {
            Some((last, [])) => last.clone(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        };
        self.fail(&v.span(), key, format!("{ctx}: {key} \"{}\" is not one of {list}", v.get_ref()));
        None
    }

    /// A duration within `min..=max`; `outside` ends the error for one
    /// that is not ("is out of range; use 1s to 1h").
    fn duration_within(
        &mut self,
        ctx: &str,
        key: &str,
        v: &toml::Spanned<String>,
        (min, max): (Duration, Duration),
        outside: &str,
    ) -> Option<Duration> {
        match parse_duration(v.get_ref()) {
            Ok(d) if d >= min && d <= max => Some(d),
            Ok(_) => {
                self.fail(&v.span(), key, format!("{ctx}: {key} \"{}\" {outside}", v.get_ref()));
                None
            }
            Err(e) => {
                self.fail(&v.span(), key, format!("{ctx}: {key} {e}"));
                None
            }
        }
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

pub(crate) fn is_unicast(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => !(v4.is_unspecified() || v4.is_multicast() || v4.is_broadcast()),
        IpAddr::V6(v6) => !(v6.is_unspecified() || v6.is_multicast()),
    }
}
