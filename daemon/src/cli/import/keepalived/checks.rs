//! keepalived's checkers as a hostmesh `health_check`: TCP_CHECK,
//! HTTP_GET, SSL_GET (as a TCP connect), UDP_CHECK with a payload and
//! MISC_CHECK, with the timers a checker inherits from its real server and
//! virtual server (checker, then real server, then virtual server, then
//! keepalived's default).

use std::time::Duration;

use super::super::dropin::{toml_string, Health, Unmapped};
use super::parse::Node;

/// Checkers of keepalived's that hostmesh has a check like, and those it
/// has none like.
const MAPPED_CHECKERS: [&str; 5] = ["TCP_CHECK", "HTTP_GET", "SSL_GET", "UDP_CHECK", "MISC_CHECK"];
const UNMAPPED_CHECKERS: [&str; 5] = ["SMTP_CHECK", "PING_CHECK", "DNS_CHECK", "BFD_CHECK", "FILE_CHECK"];

pub(super) fn is_checker(key: &str) -> bool {
    MAPPED_CHECKERS.contains(&key) || UNMAPPED_CHECKERS.contains(&key)
}

/// A timer in seconds (keepalived takes fractions), as a Duration.
fn seconds(v: &str) -> Option<Duration> {
    v.parse::<f64>().ok().filter(|s| s.is_finite() && *s >= 0.0).map(Duration::from_secs_f64)
}

/// The first of checker, real server, virtual server that sets `key`.
fn inherited<'a>(key: &str, levels: [&'a Node; 3]) -> Option<&'a str> {
    levels.iter().find_map(|n| n.value(key))
}

/// The real server's first checker as a health check, with what of it
/// (or of its other checkers) could not be mapped.
pub(super) fn health(vs: &Node, rs: &Node, unmapped: &mut Vec<Unmapped>, notes: &mut Vec<String>) -> Option<Health> {
    let mut checkers = rs.children.iter().filter(|c| is_checker(&c.key));
    let first = checkers.next()?;
    for other in checkers {
        unmapped.push(Unmapped {
            at: other.at.clone(),
            what: format!("{} (a second checker)", other.key),
            why: "hostmesh runs one health check per service".into(),
        });
    }
    if UNMAPPED_CHECKERS.contains(&first.key.as_str()) {
        unmapped.push(Unmapped {
            at: first.at.clone(),
            what: first.key.clone(),
            why: "hostmesh checks by TCP connect, HTTP, UDP payload or a command".into(),
        });
        return None;
    }
    let (kind, keys) = kind_and_keys(vs, first, unmapped)?;
    let mut h = timers(vs, rs, first, notes);
    h.kind = kind;
    h.keys = keys;
    if let Some(port) = first.value("connect_port") {
        h.keys.push(("port", port.to_string()));
    }
    if let Some(src) = first.value("bindto") {
        h.keys.push(("source", toml_string(src)));
    }
    for key in ["connect_ip", "bind_port", "fwmark", "warmup", "log_all_failures"] {
        if let Some(c) = first.child(key) {
            unmapped.push(Unmapped {
                at: c.at.clone(),
                what: format!("{} {key}", first.key),
                why: "no hostmesh equivalent".into(),
            });
        }
    }
    Some(h)
}

/// keepalived's timers as hostmesh's: a real server is marked down after
/// its check and `retry` retries `delay_before_retry` apart all fail, so
/// hostmesh takes it out after retry + 1 failures, checking every
/// delay_loop, or every delay_before_retry where one is set and shorter
/// (no later than keepalived would); up again at the first success; up
/// from the start unless `alpha`.
fn timers(vs: &Node, rs: &Node, checker: &Node, notes: &mut Vec<String>) -> Health {
    let levels = [checker, rs, vs];
    let get = |key, default: f64| inherited(key, levels).and_then(seconds).unwrap_or(Duration::from_secs_f64(default));
    let delay_loop = get("delay_loop", 60.0);
    let before_retry = get("delay_before_retry", 1.0);
    let mut timeout = if checker.key == "MISC_CHECK" { get("misc_timeout", 5.0) } else { get("connect_timeout", 5.0) };
    let retry: u32 =
        inherited("retry", levels).or(inherited("nb_get_retry", levels)).and_then(|v| v.parse().ok()).unwrap_or(1);
    let mut interval = delay_loop;
    if retry > 0 && inherited("delay_before_retry", levels).is_some() && before_retry < delay_loop {
        interval = before_retry;
        notes.push(format!(
            "checked every {} (keepalived's delay_before_retry; it checks every delay_loop, {}, while up), so a \
             failure is found no later",
            crate::config::show_duration(interval),
            crate::config::show_duration(delay_loop)
        ));
    }
    interval = interval.clamp(Duration::from_millis(50), Duration::from_secs(3600));
    if timeout > interval {
        notes.push(format!("check timeout {} cut to the interval", crate::config::show_duration(timeout)));
        timeout = interval;
    }
    let alpha = [rs, vs].iter().any(|n| n.child("alpha").is_some());
    Health {
        kind: "tcp",
        keys: Vec::new(),
        interval,
        timeout: timeout.max(Duration::from_millis(1)),
        rise: 1,
        fall: (retry + 1).clamp(1, 100),
        initial_up: !alpha,
    }
}

/// The check's kind and its own keys.
fn kind_and_keys(
    vs: &Node,
    c: &Node,
    unmapped: &mut Vec<Unmapped>,
) -> Option<(&'static str, Vec<(&'static str, String)>)> {
    let mut left = |what: String, why: &str| unmapped.push(Unmapped { at: c.at.clone(), what, why: why.into() });
    match c.key.as_str() {
        "TCP_CHECK" => Some(("tcp", Vec::new())),
        "SSL_GET" => {
            left(
                "SSL_GET's TLS handshake and URL".into(),
                "hostmesh has no TLS check: it checks a TCP connect to the port",
            );
            Some(("tcp", Vec::new()))
        }
        "HTTP_GET" => Some(("http", http_keys(vs, c, unmapped))),
        "UDP_CHECK" => {
            let Some(payload) = c.value("payload").and_then(hex_payload) else {
                left(
                    "UDP_CHECK without a payload".into(),
                    "hostmesh's UDP check sends a payload and waits for an answer",
                );
                return None;
            };
            let mut keys = vec![("send", toml_string(&payload))];
            if let Some(reply) = c.value("require_reply").and_then(hex_payload) {
                keys.push(("expect", toml_string(&reply)));
            }
            Some(("udp", keys))
        }
        "MISC_CHECK" => {
            let path = c.value("misc_path").unwrap_or("");
            let args: Vec<&str> = path.split_whitespace().collect();
            if !args.first().is_some_and(|a| a.starts_with('/')) {
                left(format!("MISC_CHECK misc_path \"{path}\""), "hostmesh runs a command by its absolute path");
                return None;
            }
            if c.child("misc_dynamic").is_some() {
                left("MISC_CHECK misc_dynamic".into(), "hostmesh does not set weights from a check's exit status");
            }
            let command: Vec<String> = args.iter().map(|a| toml_string(a)).collect();
            Some(("exec", vec![("command", format!("[{}]", command.join(", ")))]))
        }
        _ => None,
    }
}

/// HTTP_GET's first url: path, status_code, and the virtualhost (the
/// checker's, else the virtual server's) as host.
fn http_keys(vs: &Node, c: &Node, unmapped: &mut Vec<Unmapped>) -> Vec<(&'static str, String)> {
    let mut urls = c.children.iter().filter(|n| n.key == "url");
    let mut keys = Vec::new();
    if let Some(url) = urls.next() {
        keys.push(("path", toml_string(url.value("path").unwrap_or("/"))));
        keys.push(("expect", toml_string(url.value("status_code").unwrap_or("200-299"))));
        if let Some(d) = url.child("digest") {
            unmapped.push(Unmapped {
                at: d.at.clone(),
                what: "HTTP_GET digest".into(),
                why: "hostmesh checks the status, not the body".into(),
            });
        }
    }
    for u in urls {
        unmapped.push(Unmapped {
            at: u.at.clone(),
            what: "HTTP_GET url (a second one)".into(),
            why: "hostmesh checks one path".into(),
        });
    }
    if let Some(host) = c.value("virtualhost").or(vs.value("virtualhost")) {
        keys.push(("host", toml_string(host)));
    }
    keys
}

/// keepalived's hex payload as hostmesh's (\xHH escapes).
fn hex_payload(hex: &str) -> Option<String> {
    if hex.is_empty() || !hex.len().is_multiple_of(2) || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Some(hex.as_bytes().chunks(2).map(|p| format!("\\x{}", std::str::from_utf8(p).unwrap_or("00"))).collect())
}
