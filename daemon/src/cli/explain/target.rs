//! What `hostmesh explain` is asked about: `ADDR[:PORT][/tcp|udp]`, and
//! `--from SRC[:PORT]`. IPv6 addresses with a port are in brackets.

use std::net::{IpAddr, SocketAddr};

use crate::config::Protocol;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Target {
    pub addr: IpAddr,
    pub port: Option<u16>,
    pub proto: Option<Protocol>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum TargetError {
    #[error("\"{0}\" is not ADDR[:PORT][/tcp|udp] (IPv6 with a port in brackets: [fd00::1]:80/tcp)")]
    Target(String),
    #[error("--from \"{0}\" is not SRC or SRC:PORT (IPv6 with a port in brackets)")]
    From(String),
}

/// An address with an optional port: `1.2.3.4`, `1.2.3.4:80`, `fd00::1`,
/// `[fd00::1]:80`.
fn addr_port(s: &str) -> Option<(IpAddr, Option<u16>)> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some((ip, None));
    }
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return (sa.port() != 0).then_some((sa.ip(), Some(sa.port())));
    }
    let bare = s.strip_prefix('[').and_then(|r| r.strip_suffix(']'))?;
    Some((bare.parse().ok()?, None))
}

pub(crate) fn parse_target(s: &str) -> Result<Target, TargetError> {
    let bad = || TargetError::Target(s.to_string());
    let (rest, proto) = match s.rsplit_once('/') {
        Some((rest, "tcp")) => (rest, Some(Protocol::Tcp)),
        Some((rest, "udp")) => (rest, Some(Protocol::Udp)),
        Some(_) => return Err(bad()),
        None => (s, None),
    };
    let (addr, port) = addr_port(rest).ok_or_else(bad)?;
    Ok(Target { addr, port, proto })
}

pub(crate) fn parse_from(s: &str) -> Result<(IpAddr, Option<u16>), TargetError> {
    addr_port(s).ok_or_else(|| TargetError::From(s.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_and_sources_parse_in_every_form() {
        let t = parse_target("10.96.0.10:53/udp").unwrap();
        assert_eq!((t.addr.to_string(), t.port, t.proto), ("10.96.0.10".into(), Some(53), Some(Protocol::Udp)));
        let t = parse_target("[fd00:96::10]:80").unwrap();
        assert_eq!((t.addr.to_string(), t.port, t.proto), ("fd00:96::10".into(), Some(80), None));
        assert_eq!(parse_target("fd00:96::10").unwrap().port, None);
        assert_eq!(parse_target("10.20.1.5").unwrap().port, None);
        assert_eq!(parse_target("10.96.0.10/tcp").unwrap().proto, Some(Protocol::Tcp));
        for bad in ["10.96.0.10:80/sctp", "web", "10.96.0.10:0", "10.96.0.10:99999", ""] {
            assert_eq!(parse_target(bad), Err(TargetError::Target(bad.into())), "{bad}");
        }
        assert_eq!(parse_from("192.168.10.1:40000").unwrap().1, Some(40000));
        assert_eq!(parse_from("[fd00:10::1]:40000").unwrap().1, Some(40000));
        assert!(parse_from("nobody").is_err());
    }
}
