//! `hostmesh import keepalived`: keepalived.conf's `virtual_server` blocks
//! (and each member of a `virtual_server_group` one names) as hostmesh
//! services; VRRP and what else has no hostmesh equivalent listed by line.

mod checks;
mod parse;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use super::dropin::{
    affinity, fit_weights, scheduler_note, service_name, Import, Imported, ParseError, Unmapped, Where,
};
use crate::config::Protocol;
use parse::Node;

/// Statements of a virtual_server block read here or by the checkers.
const KNOWN_VS: [&str; 20] = [
    "real_server",
    "protocol",
    "lb_algo",
    "lvs_sched",
    "lb_kind",
    "lvs_method",
    "persistence_timeout",
    "persistence_granularity",
    "delay_loop",
    "connect_timeout",
    "retry",
    "nb_get_retry",
    "delay_before_retry",
    "alpha",
    "omega",
    "inhibit_on_failure",
    "virtualhost",
    "ip_family",
    "warmup",
    "smtp_alert",
];
/// Statements of a real_server block read here or by the checkers.
const KNOWN_RS: [&str; 8] = [
    "weight",
    "inhibit_on_failure",
    "delay_loop",
    "connect_timeout",
    "retry",
    "delay_before_retry",
    "alpha",
    "smtp_alert",
];

pub(super) fn import(path: &Path) -> Result<Import, ParseError> {
    let nodes = parse::read(path)?;
    let groups: BTreeMap<&str, &Node> = nodes
        .iter()
        .filter(|n| n.key == "virtual_server_group")
        .filter_map(|n| n.args.first().map(|name| (name.as_str(), n)))
        .collect();
    let mut out = Import::default();
    for n in &nodes {
        match n.key.as_str() {
            "virtual_server" => virtual_server(n, &groups, &mut out)?,
            "virtual_server_group" | "global_defs" => {}
            k if k.starts_with("vrrp_") || k.starts_with("static_") || k == "linkbeat_use_polling" => {
                out.unmapped.push(Unmapped {
                    at: n.at.clone(),
                    what: k.to_string(),
                    why: "VRRP moves addresses between hosts; hostmesh does not (keep keepalived for it)".into(),
                });
            }
            k => out.unmapped.push(Unmapped {
                at: n.at.clone(),
                what: k.to_string(),
                why: "not a virtual server".into(),
            }),
        }
    }
    for s in &mut out.services {
        fit_weights(s);
    }
    Ok(out)
}

/// One virtual_server: `IP PORT`, `fwmark N` or `group NAME`.
fn virtual_server(vs: &Node, groups: &BTreeMap<&str, &Node>, out: &mut Import) -> Result<(), ParseError> {
    let err = |why: String| ParseError { at: vs.at.clone(), why };
    let args: Vec<&str> = vs.args.iter().map(String::as_str).collect();
    let addrs: Vec<(SocketAddr, Where)> = match args.as_slice() {
        ["fwmark", mark] => {
            return listed(
                out,
                vs,
                format!("virtual_server fwmark {mark}"),
                "hostmesh balances an address and port, not a firewall mark",
            )
        }
        ["group", name] => {
            let g = groups
                .get(name)
                .ok_or_else(|| err(format!("virtual_server group {name}: no virtual_server_group {name}")))?;
            members(g, out)?
        }
        [ip, port] => vec![(
            endpoint(ip, port).ok_or_else(|| err(format!("virtual_server {ip} {port}: not an address and port")))?,
            vs.at.clone(),
        )],
        _ => return Err(err(format!("virtual_server {}: not IP PORT, fwmark N or group NAME", args.join(" ")))),
    };
    let protocol = match vs.value("protocol").unwrap_or("TCP").to_ascii_uppercase().as_str() {
        "TCP" => Protocol::Tcp,
        "UDP" => Protocol::Udp,
        other => {
            return listed(
                out,
                vs,
                format!("virtual_server {} (protocol {other})", args.join(" ")),
                "hostmesh balances TCP and UDP",
            )
        }
    };
    let kind = vs.value("lvs_method").or(vs.value("lb_kind")).unwrap_or("NAT").to_ascii_uppercase();
    if kind != "NAT" {
        let why =
            "hostmesh translates addresses (as NAT); the real servers would have to answer for the VIP themselves";
        return listed(out, vs, format!("virtual_server {} (lb_kind {kind})", args.join(" ")), why);
    }
    let template = service(vs, protocol, out);
    for (addr, from) in addrs {
        let mut s = template.clone();
        (s.vip, s.port, s.from) = (addr.ip(), addr.port(), from);
        s.name = service_name("lvs", protocol, addr.ip(), addr.port());
        for b in &mut s.backends {
            if b.0.port() == 0 {
                b.0.set_port(addr.port());
            }
        }
        out.services.push(s);
    }
    Ok(())
}

fn left(out: &mut Import, n: &Node, what: String, why: &str) {
    out.unmapped.push(Unmapped { at: n.at.clone(), what, why: why.into() });
}

/// `left`, for a virtual server not imported at all.
fn listed(out: &mut Import, n: &Node, what: String, why: &str) -> Result<(), ParseError> {
    left(out, n, what, why);
    Ok(())
}

/// What a virtual_server's members share: real servers, scheduler,
/// persistence, the health check; what of it has no equivalent is listed.
fn service(vs: &Node, protocol: Protocol, out: &mut Import) -> Imported {
    let mut s = Imported {
        name: String::new(),
        vip: IpAddr::from([0, 0, 0, 0]),
        port: 0,
        protocol,
        backends: Vec::new(),
        affinity: None,
        health: None,
        from: vs.at.clone(),
        notes: Vec::new(),
    };
    if let Some(sched) = vs.value("lvs_sched").or(vs.value("lb_algo")) {
        s.notes.push(scheduler_note(sched));
    }
    if let Some(t) = vs.value("persistence_timeout").and_then(|v| v.parse::<u64>().ok()) {
        s.affinity = Some(affinity(t, &mut s.notes));
    }
    if let Some(g) = vs
        .child("persistence_granularity")
        .filter(|g| !matches!(g.args.first().map(String::as_str), Some("255.255.255.255" | "128")))
    {
        left(out, g, "persistence_granularity".into(), "hostmesh keeps affinity per client address");
    }
    for c in vs.children.iter().filter(|c| !KNOWN_VS.contains(&c.key.as_str())) {
        left(out, c, c.key.clone(), "no hostmesh equivalent");
    }
    for rs in vs.children.iter().filter(|c| c.key == "real_server") {
        real_server(vs, rs, &mut s, out);
    }
    s
}

/// A real server: its address and weight, and its checker, which becomes
/// the service's health check (hostmesh runs one per service: a real
/// server whose checker differs from the first's is listed).
fn real_server(vs: &Node, rs: &Node, s: &mut Imported, out: &mut Import) {
    let addr = match rs.args.as_slice() {
        [ip] => endpoint(ip, "0"),
        [ip, port] => endpoint(ip, port),
        _ => None,
    };
    let Some(addr) = addr else {
        return left(out, rs, format!("real_server {}", rs.args.join(" ")), "not an address and port");
    };
    let weight = rs.value("weight").and_then(|w| w.parse::<u32>().ok()).unwrap_or(1);
    for c in rs.children.iter().filter(|c| !KNOWN_RS.contains(&c.key.as_str()) && !checks::is_checker(&c.key)) {
        left(out, c, format!("real_server {} {}", rs.args.join(" "), c.key), "no hostmesh equivalent");
    }
    let mut notes = Vec::new();
    let health = checks::health(vs, rs, &mut out.unmapped, &mut notes);
    let first = s.backends.is_empty();
    s.backends.push((addr, weight));
    if first {
        s.health = health;
        s.notes.extend(notes);
    } else if health != s.health {
        let why =
            "hostmesh runs one health check per service: this real server's differs from the first's, whose is used";
        left(out, rs, format!("real_server {}'s checker", rs.args.join(" ")), why);
    }
}

/// A virtual_server_group's members: `IP PORT`, `IP-LAST PORT` (a range of
/// the address's last part), `fwmark N` (listed).
fn members(g: &Node, out: &mut Import) -> Result<Vec<(SocketAddr, Where)>, ParseError> {
    let mut addrs = Vec::new();
    for m in &g.children {
        let err = |why: String| ParseError { at: m.at.clone(), why };
        match (m.key.as_str(), m.args.as_slice()) {
            ("fwmark", [mark]) => left(
                out,
                m,
                format!("virtual_server_group member fwmark {mark}"),
                "hostmesh balances an address and port, not a firewall mark",
            ),
            (range, [port]) => {
                for ip in expand(range).ok_or_else(|| err(format!("{range}: not an address or range")))? {
                    let a =
                        endpoint(&ip.to_string(), port).ok_or_else(|| err(format!("{range} {port}: not a port")))?;
                    addrs.push((a, m.at.clone()));
                }
            }
            _ => return Err(err(format!("{} {}: not IP PORT, IP-LAST PORT or fwmark N", m.key, m.args.join(" ")))),
        }
    }
    Ok(addrs)
}

/// `IP` or `IP-LAST`: the addresses from IP to the one whose last part
/// (octet, or 16-bit group) is LAST.
fn expand(range: &str) -> Option<Vec<IpAddr>> {
    let Some((first, last)) = range.rsplit_once('-') else {
        return range.parse().ok().map(|ip| vec![ip]);
    };
    match first.parse::<IpAddr>().ok()? {
        IpAddr::V4(a) => {
            let o = a.octets();
            let end: u8 = last.parse().ok()?;
            Some((o[3]..=end).map(|x| IpAddr::from([o[0], o[1], o[2], x])).collect())
        }
        IpAddr::V6(a) => {
            let mut s = a.segments();
            let end = u16::from_str_radix(last, 16).ok()?;
            Some(
                (s[7]..=end)
                    .map(|x| {
                        s[7] = x;
                        IpAddr::from(s)
                    })
                    .collect(),
            )
        }
    }
}

fn endpoint(ip: &str, port: &str) -> Option<SocketAddr> {
    Some(SocketAddr::new(ip.parse().ok()?, port.parse().ok()?))
}

#[cfg(test)]
mod tests;
