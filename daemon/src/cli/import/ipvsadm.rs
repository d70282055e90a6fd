//! `hostmesh import ipvsadm`: the rules `ipvsadm-save -n` prints (`-A`
//! virtual services, `-a` their real servers), as hostmesh services.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use super::dropin::{
    affinity, fit_weights, scheduler_note, service_name, Import, Imported, ParseError, Unmapped, Where,
};
use crate::config::Protocol;

/// One line's options: the service it names and what else it says.
#[derive(Default)]
struct Line {
    add_service: bool,
    service: Option<(Protocol, SocketAddr)>,
    fwmark: Option<String>,
    scheduler: Option<String>,
    persistent: Option<u64>,
    real: Option<SocketAddr>,
    forwarding: Option<&'static str>,
    weight: Option<u32>,
    /// Options read but without a hostmesh equivalent.
    other: Vec<String>,
}

pub(super) fn parse(file: &str, text: &str) -> Result<Import, ParseError> {
    let mut out = Import::default();
    let mut by_key: BTreeMap<(Protocol, SocketAddr), usize> = BTreeMap::new();
    for (i, raw) in text.lines().enumerate() {
        let at = Where { file: file.to_string(), line: i + 1 };
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let line = options(trimmed).map_err(|why| ParseError { at: at.clone(), why })?;
        if let Some(mark) = &line.fwmark {
            // Listed once, at its -A; its real servers go with it.
            if !line.add_service {
                continue;
            }
            out.unmapped.push(Unmapped {
                at,
                what: format!("fwmark service {mark}"),
                why: "hostmesh balances an address and port, not a firewall mark".into(),
            });
            continue;
        }
        let Some((protocol, vip)) = line.service else {
            return Err(ParseError { at, why: "names no service (-t ADDR:PORT, -u ADDR:PORT or -f MARK)".into() });
        };
        if line.add_service {
            add_service(&mut out, &mut by_key, at, protocol, vip, &line);
        } else {
            add_real(&mut out, &by_key, at, protocol, vip, &line)?;
        }
    }
    for s in &mut out.services {
        fit_weights(s);
    }
    Ok(out)
}

fn add_service(
    out: &mut Import,
    by_key: &mut BTreeMap<(Protocol, SocketAddr), usize>,
    at: Where,
    protocol: Protocol,
    vip: SocketAddr,
    line: &Line,
) {
    if vip.port() == 0 {
        out.unmapped.push(Unmapped {
            at,
            what: format!("{protocol} service {vip}"),
            why: "port 0 (every port, with persistence) has no hostmesh equivalent: a service is one port".into(),
        });
        return;
    }
    let mut s = Imported {
        name: service_name("lvs", protocol, vip.ip(), vip.port()),
        vip: vip.ip(),
        port: vip.port(),
        protocol,
        backends: Vec::new(),
        affinity: None,
        health: None,
        from: at.clone(),
        notes: Vec::new(),
    };
    s.notes.push(scheduler_note(line.scheduler.as_deref().unwrap_or("wlc")));
    if let Some(secs) = line.persistent {
        s.affinity = Some(affinity(secs, &mut s.notes));
    }
    for o in &line.other {
        out.unmapped.push(Unmapped { at: at.clone(), what: o.clone(), why: "no hostmesh equivalent".into() });
    }
    by_key.insert((protocol, vip), out.services.len());
    out.services.push(s);
}

fn add_real(
    out: &mut Import,
    by_key: &BTreeMap<(Protocol, SocketAddr), usize>,
    at: Where,
    protocol: Protocol,
    vip: SocketAddr,
    line: &Line,
) -> Result<(), ParseError> {
    let Some(&i) = by_key.get(&(protocol, vip)) else {
        // Its service was not imported (port 0) or not declared before it.
        if vip.port() == 0 {
            return Ok(());
        }
        return Err(ParseError { at, why: format!("real server of {protocol} service {vip}, not added before (-A)") });
    };
    let Some(mut real) = line.real else {
        return Err(ParseError { at, why: "a real server line (-a) without -r ADDR:PORT".into() });
    };
    // Without a port, the service's.
    if real.port() == 0 {
        real.set_port(vip.port());
    }
    if let Some(kind) = line.forwarding {
        out.unmapped.push(Unmapped {
            at,
            what: format!("real server {real} of {protocol} service {vip} ({kind})"),
            why: "hostmesh translates addresses (as -m); the server would have to answer for the VIP itself".into(),
        });
        return Ok(());
    }
    for o in &line.other {
        out.unmapped.push(Unmapped { at: at.clone(), what: o.clone(), why: "no hostmesh equivalent".into() });
    }
    out.services[i].backends.push((real, line.weight.unwrap_or(1)));
    Ok(())
}

/// The options of one line, short or long.
fn options(line: &str) -> Result<Line, String> {
    let mut l = Line::default();
    let mut words = line.split_whitespace().peekable();
    while let Some(w) = words.next() {
        let mut value = |what: &str| words.next().ok_or_else(|| format!("{w} without {what}"));
        match w {
            "-A" | "--add-service" => l.add_service = true,
            "-a" | "--add-server" => {}
            "-t" | "--tcp-service" => l.service = Some((Protocol::Tcp, endpoint(value("ADDR:PORT")?)?)),
            "-u" | "--udp-service" => l.service = Some((Protocol::Udp, endpoint(value("ADDR:PORT")?)?)),
            "-f" | "--fwmark-service" => l.fwmark = Some(value("MARK")?.to_string()),
            "--sctp-service" => return Err("SCTP services: hostmesh balances TCP and UDP".into()),
            "-s" | "--scheduler" => l.scheduler = Some(value("a scheduler")?.to_string()),
            "-p" | "--persistent" => {
                l.persistent = Some(300);
                if let Some(t) = words.next_if(|n| !n.starts_with('-')) {
                    l.persistent = Some(t.parse().map_err(|_| format!("-p {t}: not a number of seconds"))?);
                }
            }
            "-r" | "--real-server" => l.real = Some(endpoint(value("ADDR:PORT")?)?),
            "-m" | "--masquerading" => {}
            "-g" | "--gatewaying" => l.forwarding = Some("direct routing, -g"),
            "-i" | "--ipip" => l.forwarding = Some("IP-in-IP tunnel, -i"),
            "-w" | "--weight" => {
                let v = value("a weight")?;
                l.weight = Some(v.parse().map_err(|_| format!("-w {v}: not a weight"))?);
            }
            "-M" | "--netmask" => {
                let v = value("a netmask")?;
                if v != "255.255.255.255" && v != "128" {
                    l.other.push(format!("persistence netmask {v} (hostmesh keeps affinity per client address)"));
                }
            }
            "-x" | "--u-threshold" | "-y" | "--l-threshold" | "-b" | "--sched-flags" | "--pe" | "--tun-type"
            | "--tun-port" | "--tun-nocsum" | "--tun-csum" | "--tun-remcsum" => {
                let v = if w.starts_with("--tun-no") || w == "--tun-csum" || w == "--tun-remcsum" {
                    String::new()
                } else {
                    format!(" {}", value("a value")?)
                };
                if !(matches!(w, "-x" | "-y" | "--u-threshold" | "--l-threshold") && v == " 0") {
                    l.other.push(format!("{w}{v}"));
                }
            }
            _ => return Err(format!("{w}: not an option ipvsadm-save prints")),
        }
    }
    Ok(l)
}

/// ADDR:PORT or [ADDR6]:PORT, numeric (`ipvsadm-save -n`).
fn endpoint(s: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    // Without a port (a real server on the service's).
    let bare = s.strip_prefix('[').and_then(|v| v.strip_suffix(']')).unwrap_or(s);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, 0));
    }
    Err(format!("{s}: not ADDR:PORT (numeric: run ipvsadm-save with -n)"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::{parse_file, Source};

    /// `ipvsadm-save -n` of a director with NAT, DR and fwmark services.
    const SAVED: &str = "\
-A -t 10.0.0.1:80 -s wrr -p 300
-a -t 10.0.0.1:80 -r 192.168.1.1:8080 -m -w 1
-a -t 10.0.0.1:80 -r 192.168.1.2:8080 -m -w 3
-a -t 10.0.0.1:80 -r 192.168.1.3:8080 -g -w 1
-A -u 10.0.0.1:53 -s rr
-a -u 10.0.0.1:53 -r 192.168.1.1:53 -m -w 0
-A -f 1 -s rr
-a -f 1 -r 192.168.1.1:0 -g -w 1
-A -t [2001:db8::1]:443 -s sh -M 128
-a -t [2001:db8::1]:443 -r [2001:db8::10] -m -w 70000
-a -t [2001:db8::1]:443 -r [2001:db8::11]:443 -m -w 35000 -x 0 -y 0
-A -t 10.0.0.2:0 -s wlc -p
-a -t 10.0.0.2:0 -r 192.168.1.9:0 -m -w 1
";

    fn at(line: usize) -> Where {
        Where { file: "saved".into(), line }
    }

    #[test]
    fn services_real_servers_weights_and_persistence_map_and_the_rest_is_listed_by_line() {
        let import = parse("saved", SAVED).unwrap();
        let s = &import.services;
        assert_eq!(s.len(), 3, "{s:#?}");
        assert_eq!((s[0].name.as_str(), s[0].port, s[0].protocol), ("lvs-tcp-10-0-0-1-80", 80, Protocol::Tcp));
        assert_eq!(s[0].backends, [("192.168.1.1:8080".parse().unwrap(), 1), ("192.168.1.2:8080".parse().unwrap(), 3)]);
        assert_eq!(s[0].affinity, Some(Duration::from_secs(300)));
        assert_eq!(s[0].from, at(1));
        assert_eq!(s[1].protocol, Protocol::Udp);
        assert_eq!(s[1].backends, [("192.168.1.1:53".parse().unwrap(), 0)], "weight 0: draining");
        // A real server without a port takes the service's; weights above
        // 1000 are scaled together.
        assert_eq!(s[2].name, "lvs-tcp-2001-db8--1-443");
        assert_eq!(
            s[2].backends,
            [("[2001:db8::10]:443".parse().unwrap(), 1000), ("[2001:db8::11]:443".parse().unwrap(), 500)]
        );
        assert!(s[2].notes.iter().any(|n| n.contains("weights scaled")), "{:?}", s[2].notes);
        let unmapped: Vec<(usize, &str)> = import.unmapped.iter().map(|u| (u.at.line, u.what.as_str())).collect();
        assert_eq!(
            unmapped,
            [
                (4, "real server 192.168.1.3:8080 of tcp service 10.0.0.1:80 (direct routing, -g)"),
                (7, "fwmark service 1"),
                (12, "tcp service 10.0.0.2:0"),
            ]
        );
    }

    #[test]
    fn every_drop_in_is_a_valid_hostmesh_file() {
        for s in parse("saved", SAVED).unwrap().services {
            let text = s.render("ipvsadm");
            let file = parse_file(&Source::new(std::path::Path::new("x.toml"), &text))
                .unwrap_or_else(|e| panic!("{text}\n{e:?}"));
            let svc = &file.services[0];
            assert_eq!((svc.name.as_str(), svc.vip, svc.port), (s.name.as_str(), s.vip, s.port), "{text}");
            let backends: Vec<(std::net::SocketAddr, u32)> = svc.backends.iter().map(|b| (b.addr, b.weight)).collect();
            assert_eq!(backends, s.backends, "{text}");
        }
    }

    #[test]
    fn what_is_not_ipvsadm_save_output_is_an_error_with_its_line() {
        let e = parse("saved", "-A -t 10.0.0.1:80 -s rr\n\n-A -t web:http -s rr\n").unwrap_err();
        assert_eq!(e.at, at(3));
        assert!(e.why.contains("numeric: run ipvsadm-save with -n"), "{}", e.why);
        let e = parse("saved", "-a -t 10.0.0.1:80 -r 192.168.1.1:80 -m -w 1\n").unwrap_err();
        assert!(e.why.contains("not added before (-A)"), "{}", e.why);
        let e = parse("saved", "-A -t 10.0.0.1:80 --frobnicate\n").unwrap_err();
        assert_eq!(e.why, "--frobnicate: not an option ipvsadm-save prints");
        let e = parse("saved", "-A -t 10.0.0.1:80 -p forever\n").unwrap_err();
        assert!(e.why.contains("not a number of seconds"), "{}", e.why);
    }
}
