//! compile: Config -> Desired, without root.

use std::path::Path;

use super::*;
use crate::abi::{Pod, SvcKey, SvcValue};
use crate::config::{parse_file, Config, Source};

fn config(text: &str) -> Config {
    let f = parse_file(&Source::new(Path::new("t.toml"), text)).expect("valid config");
    Config {
        daemon: f.daemon.unwrap_or_default(),
        services: f.services,
        meshes: f.meshes,
        gateway: f.gateway,
        peers: f.peers,
        members: f.members,
    }
}

fn facts() -> HostFacts {
    HostFacts {
        interfaces: ["lo", "eth0", "eth1"].map(String::from).into(),
        default_route_interfaces: vec!["eth0".into()],
    }
}

const TWO: &str = r#"
[[service]]
name = "web"
vip = "10.96.0.10"
port = 80
backends = ["192.168.10.11:8080", "192.168.10.12:8080"]

[[service]]
name = "dns"
vip = "10.96.0.10"
port = 53
protocol = "udp"
backends = ["192.168.10.11:53"]
"#;

#[test]
fn no_services_no_state() {
    let d = compile(&Config::default(), &facts(), &ServiceIds::new());
    assert_eq!(d, Desired::default());
}

#[test]
fn services_compile_to_the_bpfnat_veth() {
    let d = compile(&config(TWO), &facts(), &ServiceIds::new());

    let veth = &d.links[NATIN];
    assert_eq!(veth.spec, LinkSpec::Veth { peer: NATOUT.into(), mac: NATIN_MAC, peer_mac: NATOUT_MAC, up: true });

    // One route per VIP, owned by every service on it.
    assert_eq!(d.routes.len(), 1);
    let (key, route) = d.routes.iter().next().unwrap();
    assert_eq!(key, &RouteKey { table: RT_TABLE_MAIN, dst: "10.96.0.10/32".parse().unwrap() });
    assert_eq!(route.spec, RouteSpec::Via { gateway: GATEWAY_V4.into(), dev: NATIN.into(), mtu: None });
    assert_eq!(route.owners, ["service/dns", "service/web"].map(String::from).into());

    // The gateway's neighbour points at hm-natout's fixed MAC.
    assert_eq!(d.neighbours.len(), 1);
    assert_eq!(
        d.neighbours[&NeighKey { dev: NATIN.into(), ip: GATEWAY_V4.into() }].spec,
        NeighSpec { lladdr: NATOUT_MAC }
    );

    // RPF sysctls: all, both veth ends, the default-route interface.
    let sysctls: Vec<(&str, &str)> = d.sysctls.iter().map(|(k, v)| (k.as_str(), v.spec.as_str())).collect();
    assert_eq!(
        sysctls,
        [
            ("net/ipv4/conf/all/rp_filter", "0"),
            ("net/ipv4/conf/eth0/rp_filter", "0"),
            ("net/ipv4/conf/hm-natin/accept_local", "1"),
            ("net/ipv4/conf/hm-natin/rp_filter", "0"),
            ("net/ipv4/conf/hm-natout/accept_local", "1"),
            ("net/ipv4/conf/hm-natout/rp_filter", "0"),
        ]
    );

    // One service map entry per (VIP, port, protocol).
    assert_eq!(d.map_entries.len(), 2);
    let web = SvcKey::new("10.96.0.10".parse().unwrap(), 80, 6);
    let entry = &d.map_entries[&MapEntryKey { map: BpfMap::Services, key: web.to_bytes() }];
    let value = SvcValue::from_bytes(&entry.spec).unwrap();
    assert_eq!(value.backend_count, 2);
    assert_eq!(entry.owners, ["service/web".to_string()].into());

    assert_eq!(
        d.attachments.keys().collect::<Vec<_>>(),
        [&Attachment { program: Program::NatOut, hook: Hook::TcIngress(NATOUT.into()) }]
    );
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
}

#[test]
fn ipv6_vips_route_via_the_v6_gateway() {
    let d = compile(
        &config("[[service]]\nname = \"w6\"\nvip = \"fd00::10\"\nport = 80\nbackends = [\"[fd00::1:1]:80\"]\n"),
        &facts(),
        &ServiceIds::new(),
    );
    let route = &d.routes[&RouteKey { table: RT_TABLE_MAIN, dst: "fd00::10/128".parse().unwrap() }];
    assert_eq!(route.spec, RouteSpec::Via { gateway: GATEWAY_V6.into(), dev: NATIN.into(), mtu: None });
    assert!(d.neighbours.contains_key(&NeighKey { dev: NATIN.into(), ip: GATEWAY_V6.into() }));
    assert_eq!(d.sysctls["net/ipv6/conf/hm-natin/disable_ipv6"].spec, "0");
}

#[test]
fn connect_time_lb_all_needs_no_veth() {
    let d = compile(&config(&format!("[daemon]\nconnect_time_lb = \"all\"\n{TWO}")), &facts(), &ServiceIds::new());
    assert!(d.links.is_empty() && d.routes.is_empty() && d.sysctls.is_empty());
}

#[test]
fn configured_host_interfaces_replace_the_default_and_missing_ones_are_reported() {
    let d = compile(
        &config(&format!("[daemon]\nhost_interfaces = [\"eth1\", \"eth9\"]\n{TWO}")),
        &facts(),
        &ServiceIds::new(),
    );
    assert!(d.sysctls.contains_key("net/ipv4/conf/eth1/rp_filter"));
    assert!(!d.sysctls.contains_key("net/ipv4/conf/eth0/rp_filter"));
    assert!(!d.sysctls.contains_key("net/ipv4/conf/eth9/rp_filter"));
    assert_eq!(d.warnings, ["host interface eth9 (from [daemon] host_interfaces) does not exist"]);
}

#[test]
fn service_ids_survive_unrelated_changes() {
    let first = compile(&config(TWO), &facts(), &ServiceIds::new());
    let prior = ids::from_entries(first.map_entries.iter().map(|(k, v)| (k, &v.spec)));
    let web = SvcKey::new("10.96.0.10".parse().unwrap(), 80, 6);
    let web_id = prior[&web];

    // Remove "dns" (which sorts first) and add two others.
    let text = r#"
[[service]]
name = "web"
vip = "10.96.0.10"
port = 80
[[service]]
name = "a"
vip = "10.96.0.1"
port = 1
[[service]]
name = "b"
vip = "10.96.0.2"
port = 2
"#;
    let second = compile(&config(text), &facts(), &prior);
    let ids = ids::from_entries(second.map_entries.iter().map(|(k, v)| (k, &v.spec)));
    assert_eq!(ids[&web], web_id);
    let mut all: Vec<u32> = ids.values().copied().collect();
    all.sort();
    assert_eq!(all, [0, 1, 2], "ids stay dense");
}

#[test]
fn unimplemented_sections_are_reported_not_silently_dropped() {
    let d = compile(
        &config("[[mesh]]\nname = \"m\"\nvip = \"10.0.0.1\"\nport = 80\nredirect_port = 15001\n"),
        &facts(),
        &ServiceIds::new(),
    );
    assert_eq!(d.warnings.len(), 1);
    assert!(d.warnings[0].starts_with("mesh \"m\" is valid but"), "{:?}", d.warnings);
}
