//! `health_check` of a `[[service]]`, typed: how each backend is checked
//! and how results become a state (README.md, "Health checks").

use std::net::IpAddr;
use std::time::Duration;

use serde::Serialize;

pub(crate) const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(2);
pub(crate) const DEFAULT_CHECK_TIMEOUT: Duration = Duration::from_secs(1);
pub(crate) const DEFAULT_RISE: u32 = 2;
pub(crate) const DEFAULT_FALL: u32 = 3;
/// HTTP statuses that pass when `expect` is not given.
pub(crate) const DEFAULT_HTTP_EXPECT: (u16, u16) = (200, 399);
pub(crate) const DEFAULT_HTTP_PATH: &str = "/";

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub(crate) struct HealthCheck {
    pub kind: CheckKind,
    pub interval: Duration,
    /// At most `interval`.
    pub timeout: Duration,
    /// Passes in a row that bring a down backend up.
    pub rise: u32,
    /// Failures in a row that take an up backend down.
    pub fall: u32,
    /// The port checked; `None`: the backend's own.
    pub port: Option<u16>,
    /// The source address of the checks; `None`: the kernel's choice.
    pub source: Option<IpAddr>,
    /// What a backend is before its first result.
    pub initial: InitialState,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase", tag = "kind")]
pub(crate) enum CheckKind {
    /// A TCP connect that completes.
    Tcp,
    /// `GET path` answered with a status in `expect` (inclusive).
    Http { path: String, expect: (u16, u16), host: Option<String> },
    /// `send` as one datagram, answered by one containing `expect` (any
    /// answer when `expect` is empty).
    Udp { send: Vec<u8>, expect: Vec<u8> },
    /// The command exits 0 within the timeout. `{address}` and `{port}` in
    /// its arguments are the backend's.
    Exec { command: Vec<String> },
}

impl CheckKind {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            CheckKind::Tcp => "tcp",
            CheckKind::Http { .. } => "http",
            CheckKind::Udp { .. } => "udp",
            CheckKind::Exec { .. } => "exec",
        }
    }
}

/// `initial`: a new backend waits for its first check ("unknown", the
/// default) or takes traffic at once ("up").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub(crate) enum InitialState {
    #[default]
    Unknown,
    Up,
}

/// Decodes a payload as written: `\xHH` is that byte, `\\` a backslash,
/// everything else itself. `Err` names what is wrong.
pub(crate) fn decode_payload(text: &str) -> Result<Vec<u8>, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'\\' {
            out.push(bytes[i]);
            i += 1;
            continue;
        }
        match bytes.get(i + 1) {
            Some(b'\\') => {
                out.push(b'\\');
                i += 2;
            }
            Some(b'x') => {
                let hex = text.get(i + 2..i + 4).filter(|h| h.bytes().all(|c| c.is_ascii_hexdigit()));
                let Some(hex) = hex else {
                    return Err(format!("\\x at byte {i} needs two hex digits, like \\x00"));
                };
                out.push(u8::from_str_radix(hex, 16).expect("two hex digits"));
                i += 4;
            }
            _ => {
                return Err(format!("\\ at byte {i} starts no escape; write \\\\ for a backslash or \\xHH for a byte"))
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_decode_hex_escapes_and_backslashes() {
        assert_eq!(decode_payload("ping").unwrap(), b"ping");
        assert_eq!(decode_payload(r"\x00\xffok\\").unwrap(), b"\x00\xffok\\");
        assert!(decode_payload(r"\x0").unwrap_err().contains("two hex digits"));
        assert!(decode_payload(r"\q").unwrap_err().contains("starts no escape"));
        assert_eq!(decode_payload("").unwrap(), b"");
    }
}
