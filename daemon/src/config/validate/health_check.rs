//! `health_check` of a `[[service]]`: the common keys, and the keys of its
//! kind (a key of another kind is an error, not ignored).

use std::net::IpAddr;
use std::time::Duration;

use toml::Spanned;

use super::{is_unicast, Check};
use crate::config::schema::*;
use crate::config::types::*;

const KEY: &str = "health_check";
const MAX_RISE_FALL: i64 = 100;
const MAX_PAYLOAD: usize = 1024;
const MAX_PATH: usize = 1024;
const MAX_HOST: usize = 255;
const MAX_ARGS: usize = 64;
const INTERVAL_RANGE: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(3600));

/// The keys each kind takes beyond the common ones.
const KIND_KEYS: [(&str, &[&str]); 4] =
    [("tcp", &[]), ("http", &["path", "host", "expect"]), ("udp", &["send", "expect"]), ("exec", &["command"])];

impl Check<'_, '_> {
    /// `family_of_backends`: the VIP's family (`source` must match it).
    pub(super) fn health_check(&mut self, ctx: &str, h: &RawHealthCheck, vip: Option<IpAddr>) -> Option<HealthCheck> {
        let before = self.errors.len();
        let ctx = format!("{ctx}: {KEY}");
        let kind_name = self.choice(&ctx, "kind", &h.kind, &KIND_KEYS.map(|(n, _)| (n, n)));
        if let Some(kind_name) = kind_name {
            self.foreign_keys(&ctx, kind_name, h);
        }
        let interval = match &h.interval {
            None => Some(DEFAULT_CHECK_INTERVAL),
            Some(v) => self.duration_within(&ctx, "interval", v, INTERVAL_RANGE, "is out of range; use 50ms to 1h"),
        };
        let timeout = self.check_timeout(&ctx, h, interval);
        let rise = self.count(&ctx, "rise", h.rise.as_ref(), DEFAULT_RISE);
        let fall = self.count(&ctx, "fall", h.fall.as_ref(), DEFAULT_FALL);
        let port = h.port.as_ref().and_then(|p| self.port(&ctx, "port", p, false));
        let source = h.source.as_ref().and_then(|v| self.check_source(&ctx, v, vip));
        let initial = match &h.initial {
            None => Some(InitialState::Unknown),
            Some(v) => self.choice(&ctx, "initial", v, &[("unknown", InitialState::Unknown), ("up", InitialState::Up)]),
        };
        let kind = match kind_name? {
            "tcp" => Some(CheckKind::Tcp),
            "http" => self.http(&ctx, h),
            "udp" => self.udp(&ctx, h),
            _ => self.exec(&ctx, h),
        };
        if self.errors.len() > before {
            return None;
        }
        Some(HealthCheck {
            kind: kind?,
            interval: interval?,
            timeout: timeout?,
            rise: rise?,
            fall: fall?,
            port: h.port.as_ref().and(port),
            source,
            initial: initial?,
        })
    }

    /// Keys of another kind than `kind`.
    fn foreign_keys(&mut self, ctx: &str, kind: &str, h: &RawHealthCheck) {
        let given: [(&str, Option<std::ops::Range<usize>>); 5] = [
            ("path", h.path.as_ref().map(Spanned::span)),
            ("host", h.host.as_ref().map(Spanned::span)),
            ("expect", h.expect.as_ref().map(Spanned::span)),
            ("send", h.send.as_ref().map(Spanned::span)),
            ("command", h.command.as_ref().map(Spanned::span)),
        ];
        let allowed = KIND_KEYS.iter().find(|(n, _)| *n == kind).map_or(&[][..], |(_, keys)| keys);
        for (key, span) in given {
            if let (Some(span), false) = (span, allowed.contains(&key)) {
                let takers: Vec<&str> =
                    KIND_KEYS.iter().filter(|(_, keys)| keys.contains(&key)).map(|(n, _)| *n).collect();
                self.fail(&span, key, format!("{ctx}: `{key}` is for kind {}, not \"{kind}\"", quoted_or(&takers)));
            }
        }
    }

    fn check_timeout(&mut self, ctx: &str, h: &RawHealthCheck, interval: Option<Duration>) -> Option<Duration> {
        let Some(v) = &h.timeout else {
            return Some(interval.map_or(DEFAULT_CHECK_TIMEOUT, |i| i.min(DEFAULT_CHECK_TIMEOUT)));
        };
        let max = interval.unwrap_or(INTERVAL_RANGE.1);
        let outside =
            format!("is out of range; use 10ms up to the interval ({})", crate::config::duration::show_duration(max));
        self.duration_within(ctx, "timeout", v, (Duration::from_millis(10), max), &outside)
    }

    fn count(&mut self, ctx: &str, key: &str, v: Option<&Spanned<i64>>, default: u32) -> Option<u32> {
        match v {
            None => Some(default),
            Some(v) if (1..=MAX_RISE_FALL).contains(v.get_ref()) => Some(*v.get_ref() as u32),
            Some(v) => {
                let n = v.get_ref();
                self.fail(&v.span(), key, format!("{ctx}: {key} {n} is out of range; use 1 to {MAX_RISE_FALL}"));
                None
            }
        }
    }

    fn check_source(&mut self, ctx: &str, v: &Spanned<String>, vip: Option<IpAddr>) -> Option<IpAddr> {
        let ip = self.ip(ctx, "source", v)?;
        if !is_unicast(ip) {
            self.fail(&v.span(), "source", format!("{ctx}: source {ip} is not a unicast address"));
            return None;
        }
        if vip.is_some_and(|vip| vip.is_ipv4() != ip.is_ipv4()) {
            self.fail(&v.span(), "source", format!("{ctx}: source {ip} is not of the backends' address family"));
            return None;
        }
        Some(ip)
    }

    fn http(&mut self, ctx: &str, h: &RawHealthCheck) -> Option<CheckKind> {
        let path = match &h.path {
            None => Some(DEFAULT_HTTP_PATH.to_string()),
            Some(v) if v.get_ref().starts_with('/') && v.get_ref().len() <= MAX_PATH && printable(v.get_ref()) => {
                Some(v.get_ref().clone())
            }
            Some(v) => {
                let msg = format!("{ctx}: path \"{}\" must start with / and be at most {MAX_PATH} printable characters without spaces", v.get_ref());
                self.fail(&v.span(), "path", msg);
                None
            }
        };
        let host = match &h.host {
            None => None,
            Some(v) if !v.get_ref().is_empty() && v.get_ref().len() <= MAX_HOST && printable(v.get_ref()) => {
                Some(v.get_ref().clone())
            }
            Some(v) => {
                let msg = format!(
                    "{ctx}: host \"{}\" must be 1 to {MAX_HOST} printable characters without spaces",
                    v.get_ref()
                );
                self.fail(&v.span(), "host", msg);
                return None;
            }
        };
        let expect = match &h.expect {
            None => Some(DEFAULT_HTTP_EXPECT),
            Some(v) => self.status_range(ctx, v),
        };
        Some(CheckKind::Http { path: path?, expect: expect?, host })
    }

    /// "200" or "200-399", statuses 100 to 599.
    fn status_range(&mut self, ctx: &str, v: &Spanned<String>) -> Option<(u16, u16)> {
        let text = v.get_ref();
        let (lo, hi) = text.split_once('-').unwrap_or((text, text));
        let parse = |s: &str| s.trim().parse::<u16>().ok().filter(|n| (100..=599).contains(n));
        match (parse(lo), parse(hi)) {
            (Some(lo), Some(hi)) if lo <= hi => Some((lo, hi)),
            _ => {
                let msg = format!(
                    "{ctx}: expect \"{text}\" is not an HTTP status or range of them, like \"200\" or \"200-399\""
                );
                self.fail(&v.span(), "expect", msg);
                None
            }
        }
    }

    fn udp(&mut self, ctx: &str, h: &RawHealthCheck) -> Option<CheckKind> {
        let Some(send) = &h.send else {
            self.fail(&h.kind.span(), "send", format!("{ctx}: kind \"udp\" needs `send`, the payload of the check"));
            return None;
        };
        let send = self.payload(ctx, "send", send);
        let expect = match &h.expect {
            None => Some(Vec::new()),
            Some(v) => self.payload(ctx, "expect", v),
        };
        if send.as_ref().is_some_and(Vec::is_empty) {
            self.fail(&h.kind.span(), "send", format!("{ctx}: `send` is empty; a check needs a payload"));
            return None;
        }
        Some(CheckKind::Udp { send: send?, expect: expect? })
    }

    fn payload(&mut self, ctx: &str, key: &str, v: &Spanned<String>) -> Option<Vec<u8>> {
        match decode_payload(v.get_ref()) {
            Ok(bytes) if bytes.len() <= MAX_PAYLOAD => Some(bytes),
            Ok(bytes) => {
                let msg = format!("{ctx}: {key} is {} bytes; at most {MAX_PAYLOAD}", bytes.len());
                self.fail(&v.span(), key, msg);
                None
            }
            Err(e) => {
                self.fail(&v.span(), key, format!("{ctx}: {key}: {e}"));
                None
            }
        }
    }

    fn exec(&mut self, ctx: &str, h: &RawHealthCheck) -> Option<CheckKind> {
        let Some(command) = &h.command else {
            let msg = format!(
                "{ctx}: kind \"exec\" needs `command`, like [\"/usr/local/lib/check\", \"{{address}}\", \"{{port}}\"]"
            );
            self.fail(&h.kind.span(), "command", msg);
            return None;
        };
        let args: Vec<String> = command.get_ref().iter().map(|a| a.get_ref().clone()).collect();
        let bad = match args.first() {
            None => Some("is empty".to_string()),
            Some(program) if !program.starts_with('/') => {
                Some(format!("starts with \"{program}\"; give the program's absolute path"))
            }
            Some(_) if args.len() > MAX_ARGS => Some(format!("has {} arguments; at most {MAX_ARGS}", args.len())),
            Some(_) if args.iter().any(|a| a.contains('\0') || a.len() > 4096) => {
                Some("has an argument with a NUL byte or over 4096 bytes".to_string())
            }
            Some(_) => None,
        };
        if let Some(bad) = bad {
            self.fail(&command.span(), "command", format!("{ctx}: command {bad}"));
            return None;
        }
        Some(CheckKind::Exec { command: args })
    }
}

/// Visible ASCII, no spaces (what a request line and a Host header carry).
fn printable(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_graphic())
}

fn quoted_or(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
    quoted.join(" or ")
}
