//! compile: Config -> Desired, without root.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::*;
use crate::abi::{self, BackendValue, HmConfig, MaglevChunk, MaglevKey, Pod, SvcKey, SvcValue};
use crate::config::Config;

fn config(text: &str) -> Config {
    crate::config::from_text(text)
}

fn facts() -> HostFacts {
    HostFacts {
        interfaces: ["lo", "eth0", "eth1"].map(String::from).into(),
        default_route_interfaces: vec!["eth0".into()],
        netns_cookie: 4242,
        cgroup2_root: Some(PathBuf::from("/sys/fs/cgroup")),
        sk_lookup_unavailable: None,
        underlay_mtu: Default::default(),
        gateways: Default::default(),
        features: KernelFeatures::complete(),
        backend_routes: [
            (
                "192.168.10.11",
                BackendRoute { local: false, dev: Some("eth0".into()), src: Some("192.0.2.1".parse().unwrap()) },
            ),
            (
                "10.0.5.20",
                BackendRoute { local: false, dev: Some("veth7".into()), src: Some("10.0.5.1".parse().unwrap()) },
            ),
        ]
        .into_iter()
        .map(|(a, r)| (a.parse().unwrap(), r))
        .collect(),
        addresses: [("eth0", ["192.0.2.1", "2001:db8::1"]), ("eth1", ["198.51.100.1", "198.51.100.2"])]
            .into_iter()
            .map(|(dev, ips)| (dev.to_string(), ips.iter().map(|ip| ip.parse().unwrap()).collect()))
            .collect(),
        wireguard_key: None,
    }
}

fn compile_new(c: &Config) -> Desired {
    compile(c, &facts(), &Prior::default())
}

fn entries(d: &Desired, map: BpfMap) -> BTreeMap<Vec<u8>, Vec<u8>> {
    d.map_entries
        .iter()
        .filter(|(k, _)| k.map == map)
        .map(|(k, v)| (k.key.to_vec(), v.spec.bytes().unwrap().into_owned()))
        .collect()
}

fn attached(d: &Desired) -> Vec<String> {
    d.attachments.keys().map(|a| a.pin_name()).collect()
}

const TWO: &str = r#"
[[service]]
name = "web"
vip = "10.96.0.10"
port = 80
backends = ["192.168.10.11:8080", { address = "192.168.10.12:8080", weight = 2 }]

[[service]]
name = "dns"
vip = "10.96.0.10"
port = 53
protocol = "udp"
backends = ["192.168.10.11:53"]
"#;

fn mode(m: &str) -> Config {
    config(&format!("[daemon]\nconnect_time_lb = \"{m}\"\n{TWO}"))
}

#[test]
fn no_services_no_state() {
    assert_eq!(compile_new(&Config::default()), Desired::default());
}

#[test]
fn services_fill_the_service_maps() {
    let d = compile_new(&config(TWO));

    let cfg = HmConfig::from_bytes(&entries(&d, BpfMap::Config)[&0u32.to_bytes()]).unwrap();
    assert_eq!(cfg.netns_cookie, 4242);
    assert_eq!(cfg.flags, abi::CFG_CTLB_TCP, "the default mode hands TCP to connect-time LB");
    assert_eq!((cfg.tcp_timeout_s, cfg.udp_timeout_s), (86_400, 60));

    let services = entries(&d, BpfMap::Services);
    let web = SvcValue::from_bytes(&services[&SvcKey::new("10.96.0.10".parse().unwrap(), 80, 6).to_bytes()]).unwrap();
    // Sized from its two backends: 251 slots, over 100 per backend.
    assert_eq!((web.backend_count, web.table_size), (2, crate::table_size::table_size_for(2)));
    assert_eq!(web.table_size, 251);

    // Three backend entries for three distinct addresses... two here: .11:8080,
    // .12:8080 and .11:53.
    let backends: Vec<BackendValue> =
        entries(&d, BpfMap::Backends).values().map(|v| BackendValue::from_bytes(v).unwrap()).collect();
    assert_eq!(backends.len(), 3);

    // web's Maglev table: 4 chunks of 64 for 251 slots, in a 1:2 split.
    let chunks: Vec<MaglevChunk> = entries(&d, BpfMap::Maglev)
        .iter()
        .filter(|(k, _)| MaglevKey::from_bytes(k).unwrap().svc_id == web.id)
        .map(|(_, v)| MaglevChunk::from_bytes(v).unwrap())
        .collect();
    assert_eq!(chunks.len(), 4);
    let slots: Vec<u32> = chunks.iter().flat_map(|c| c.backend).take(251).collect();
    let ids = ids::Prior::from_entries(d.map_entries.iter().map(|(k, v)| (k, &v.spec))).backends;
    let b12 = ids[&"192.168.10.12:8080".parse().unwrap()];
    let share = slots.iter().filter(|&&b| b == b12).count() as f64 / 251.0;
    assert!((share - 2.0 / 3.0).abs() < 0.01, "weight 2 of 3: {share}");

    // Every entry is owned by its service (the config by "services").
    let owners: Vec<&str> = d.map_entries.values().flat_map(|v| v.owners.iter()).collect();
    assert!(owners.contains(&"service/web") && owners.contains(&"service/dns") && owners.contains(&"services"));
}

#[test]
fn a_service_without_backends_refuses() {
    let d = compile_new(&config("[[service]]\nname = \"x\"\nvip = \"10.0.0.1\"\nport = 1\n"));
    let v = SvcValue::from_bytes(entries(&d, BpfMap::Services).values().next().unwrap()).unwrap();
    assert_eq!(v.backend_count, 0);
    assert!(entries(&d, BpfMap::Maglev).is_empty());
}

#[test]
fn the_table_size_is_configurable_per_service_and_by_default() {
    let d = compile_new(&config(
        "[daemon]\nmaglev_table_size = 251\n[[service]]\nname = \"a\"\nvip = \"10.0.0.1\"\nport = 1\nbackends = [\"10.1.0.1:1\"]\n\
         [[service]]\nname = \"b\"\nvip = \"10.0.0.2\"\nport = 1\nbackends = [\"10.1.0.1:1\"]\nmaglev_table_size = 4093\n",
    ));
    let sizes: Vec<u32> =
        entries(&d, BpfMap::Services).values().map(|v| SvcValue::from_bytes(v).unwrap().table_size).collect();
    assert_eq!(sizes, [251, 4093]);
    assert_eq!(entries(&d, BpfMap::Maglev).len(), 4 + 64, "251 slots in 4 chunks, 4093 in 64");
}

#[test]
fn mode_tcp_has_connect_time_programs_and_the_veth() {
    let d = compile_new(&mode("tcp"));
    let pins = attached(&d);
    assert_eq!(pins.iter().filter(|p| p.contains("@cgroup@%2Fsys%2Ffs%2Fcgroup")).count(), 9, "{pins:?}");
    assert!(pins.contains(&"hm_natout@tc-ingress@hm-natout".to_string()));
    assert!(pins.contains(&"hm_reply@tc-ingress@eth0".to_string()));
    assert!(pins.contains(&"hm_reply@tc-ingress@lo".to_string()), "local backends reply over lo");
    for dev in ["eth0", "lo"] {
        assert!(pins.contains(&format!("hm_direct@tc-egress@{dev}")), "the host's own traffic leaves over {dev}");
    }
    assert!(d.links.contains_key(NATIN));
}

#[test]
fn mode_all_needs_no_veth_and_off_no_connect_time_programs() {
    let all = compile_new(&mode("all"));
    assert!(all.links.is_empty() && all.routes.is_empty() && all.sysctls.is_empty());
    assert_eq!(attached(&all).len(), 9);
    assert!(attached(&all).contains(&"hm_sock_release@cgroup@%2Fsys%2Ffs%2Fcgroup".to_string()));
    // A kernel without the sock_release hook: the other eight.
    let old = HostFacts { features: KernelFeatures::lacking([Feature::SockRelease]), ..facts() };
    let pins: Vec<String> =
        compile(&mode("all"), &old, &Prior::default()).attachments.keys().map(|a| a.pin_name()).collect();
    assert_eq!(pins.len(), 8, "{pins:?}");
    assert!(pins.iter().all(|p| !p.starts_with("hm_sock_release")), "{pins:?}");
    let cfg = HmConfig::from_bytes(&entries(&all, BpfMap::Config)[&0u32.to_bytes()]).unwrap();
    assert_eq!(cfg.flags, abi::CFG_CTLB_TCP | abi::CFG_CTLB_UDP);

    let off = compile_new(&mode("off"));
    assert!(attached(&off).iter().all(|p| p.contains("@tc-")));
    assert_eq!(HmConfig::from_bytes(&entries(&off, BpfMap::Config)[&0u32.to_bytes()]).unwrap().flags, 0);
    assert_eq!(off.routes.len(), 1);
}

#[test]
fn a_kernel_without_one_service_path_sends_everything_down_the_other_and_says_so() {
    let mut no_ctlb = facts();
    no_ctlb.features = KernelFeatures::lacking([Feature::ConnectTimeHooks]);
    let d = compile(&mode("tcp"), &no_ctlb, &Prior::default());
    assert_eq!(d.connect_time, crate::config::CtlbMode::Off);
    assert!(attached(&d).iter().all(|p| p.contains("@tc-")), "no connect-time programs");
    assert_eq!(d.warnings.len(), 1, "{:?}", d.warnings);
    assert!(d.warnings[0].starts_with("connect_time_lb = \"tcp\" cannot be honoured: this kernel lacks cgroup"));
    assert!(d.warnings[0].ends_with("every service takes the bpfnat veth path"), "{}", d.warnings[0]);

    let mut no_veth = facts();
    no_veth.features = KernelFeatures::lacking([Feature::RedirectNeigh]);
    let d = compile(&mode("off"), &no_veth, &Prior::default());
    assert_eq!(d.connect_time, crate::config::CtlbMode::All);
    assert!(d.links.is_empty() && d.routes.is_empty(), "no veth");
    assert!(d.warnings[0].contains("redirect_neigh"), "{:?}", d.warnings);
    // Asking for what the kernel can do anyway is no warning.
    assert!(compile(&mode("all"), &no_veth, &Prior::default()).warnings.is_empty());
}

#[test]
fn the_connect_time_cgroup_is_configurable() {
    let d = compile_new(&config(&format!("[daemon]\ncgroup = \"/sys/fs/cgroup/vms\"\n{TWO}")));
    assert!(attached(&d).iter().any(|p| p == "hm_connect4@cgroup@%2Fsys%2Ffs%2Fcgroup%2Fvms"));
    let no_cgroup = compile(&config(TWO), &HostFacts { cgroup2_root: None, ..facts() }, &Prior::default());
    assert!(no_cgroup.warnings.iter().any(|w| w.starts_with("no cgroup2 mount found")), "{:?}", no_cgroup.warnings);
}

#[test]
fn services_compile_to_the_bpfnat_veth() {
    let d = compile_new(&config(TWO));
    assert_eq!(
        d.links[NATIN].spec,
        LinkSpec::Veth { peer: NATOUT.into(), mac: NATIN_MAC, peer_mac: NATOUT_MAC, up: true }
    );

    // One route per VIP, owned by every service on it.
    assert_eq!(d.routes.len(), 1);
    let (key, route) = d.routes.iter().next().unwrap();
    assert_eq!(key, &RouteKey { table: RT_TABLE_MAIN, dst: "10.96.0.10/32".parse().unwrap() });
    assert_eq!(route.spec, RouteSpec::Via { gateway: GATEWAY_V4.into(), dev: NATIN.into(), mtu: None, encap: None });
    assert_eq!(route.owners, ["service/dns", "service/web"].into());

    assert_eq!(
        d.neighbours[&NeighKey { dev: NATIN.into(), ip: GATEWAY_V4.into() }].spec,
        NeighSpec { lladdr: NATOUT_MAC }
    );

    let sysctls: Vec<(&str, &str)> = d.sysctls.iter().map(|(k, v)| (k.as_str(), v.spec.as_str())).collect();
    assert_eq!(
        sysctls,
        [
            ("net/ipv4/conf/all/rp_filter", "0"),
            ("net/ipv4/conf/eth0/rp_filter", "0"),
            ("net/ipv4/conf/hm-natin/accept_local", "1"),
            ("net/ipv4/conf/hm-natin/forwarding", "1"),
            ("net/ipv4/conf/hm-natin/rp_filter", "0"),
            ("net/ipv4/conf/hm-natout/accept_local", "1"),
            ("net/ipv4/conf/hm-natout/forwarding", "1"),
            ("net/ipv4/conf/hm-natout/rp_filter", "0"),
        ]
    );
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
}

#[test]
fn ipv6_vips_route_via_the_v6_gateway() {
    let d = compile_new(&config(
        "[[service]]\nname = \"w6\"\nvip = \"fd00::10\"\nport = 80\nbackends = [\"[fd00::1:1]:80\"]\n",
    ));
    let route = &d.routes[&RouteKey { table: RT_TABLE_MAIN, dst: "fd00::10/128".parse().unwrap() }];
    assert_eq!(route.spec, RouteSpec::Via { gateway: GATEWAY_V6.into(), dev: NATIN.into(), mtu: None, encap: None });
    assert!(d.neighbours.contains_key(&NeighKey { dev: NATIN.into(), ip: GATEWAY_V6.into() }));
    assert_eq!(d.sysctls["net/ipv6/conf/hm-natin/disable_ipv6"].spec, "0");
    assert_eq!(d.sysctls["net/ipv6/conf/hm-natout/forwarding"].spec, "1");
}

#[test]
fn configured_host_interfaces_replace_the_default_and_missing_ones_are_reported() {
    let d = compile_new(&config(&format!("[daemon]\nhost_interfaces = [\"eth1\", \"eth9\"]\n{TWO}")));
    assert!(d.sysctls.contains_key("net/ipv4/conf/eth1/rp_filter"));
    assert!(!d.sysctls.contains_key("net/ipv4/conf/eth0/rp_filter"));
    assert!(attached(&d).contains(&"hm_reply@tc-ingress@eth1".to_string()));
    assert_eq!(d.warnings, ["host interface eth9 (from [daemon] host_interfaces) does not exist"]);
}

#[test]
fn ids_survive_unrelated_changes() {
    let first = compile_new(&config(TWO));
    let prior = Prior::from_entries(first.map_entries.iter().map(|(k, v)| (k, &v.spec)));
    let web = SvcKey::new("10.96.0.10".parse().unwrap(), 80, 6);

    // Remove "dns" (which sorts first) and add two others.
    let text = r#"
[[service]]
name = "web"
vip = "10.96.0.10"
port = 80
backends = ["192.168.10.12:8080", "192.168.10.13:8080"]
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
    let now = Prior::from_entries(second.map_entries.iter().map(|(k, v)| (k, &v.spec)));
    assert_eq!(now.services[&web], prior.services[&web]);
    let mut all: Vec<u32> = now.services.values().copied().collect();
    all.sort();
    assert_eq!(all, [0, 1, 2], "ids stay dense");
    let b12: std::net::SocketAddr = "192.168.10.12:8080".parse().unwrap();
    assert_eq!(now.backends[&b12], prior.backends[&b12], "a kept backend keeps its id");
}

#[test]
fn peers_without_a_gateway_section_are_reported_not_silently_dropped() {
    let d = compile_new(&config("[[peer]]\nname = \"b\"\ncidrs = [\"10.20.0.0/16\"]\n"));
    assert_eq!(d.warnings, ["[[peer]] and [[member]] entries need a [gateway] section; not applied"]);
    assert!(d.links.is_empty() && d.routes.is_empty());
}

const MEMBER: &str = r#"
[gateway]
role = "member"
local_ip = "192.0.2.20"
gateway_ip = "192.0.2.1"
vni = 7001
udp_port = 4789

[[peer]]
name = "site-b"
cidrs = ["10.20.0.0/16", "fd20::/48"]
"#;

const GATEWAY: &str = r#"
[gateway]
role = "gateway"
local_ip = "198.51.100.1"
vni = 7001

[[peer]]
name = "site-b"
endpoint = "198.51.100.2"
cidrs = ["10.20.0.0/16"]

[[member]]
name = "web-1"
endpoint = "192.0.2.20"
cidrs = ["10.10.1.0/24"]
"#;

fn facts_with_mtu(ip: &str, mtu: u32) -> HostFacts {
    let mut f = facts();
    f.underlay_mtu.insert(ip.parse().unwrap(), mtu);
    f
}

fn route(d: &Desired, dst: &str) -> RouteSpec {
    d.routes[&RouteKey { table: RT_TABLE_MAIN, dst: dst.parse().unwrap() }].spec.clone()
}

#[test]
fn a_member_routes_peer_cidrs_into_the_tunnel_with_the_mtu_less_the_encapsulation() {
    let d = compile(&config(MEMBER), &facts_with_mtu("192.0.2.1", 9000), &Prior::default());
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    assert_eq!(d.links[gateway::TUN].spec, LinkSpec::Vxlan { port: 4789, mac: gateway::TUN_MAC, up: true });
    // The underlay to the gateway is IPv4: 50 bytes of overhead, for
    // inner IPv4 and IPv6 alike.
    // The route carries the tunnel key: VNI, the gateway, from local_ip.
    let encap =
        Some(TunnelEncap { id: 7001, dst: "192.0.2.1".parse().unwrap(), src: Some("192.0.2.20".parse().unwrap()) });
    let v4 =
        RouteSpec::Via { gateway: gateway::TUN_NEXT_HOP_V4.into(), dev: gateway::TUN.into(), mtu: Some(8950), encap };
    let v6 =
        RouteSpec::Via { gateway: gateway::TUN_NEXT_HOP_V6.into(), dev: gateway::TUN.into(), mtu: Some(8950), encap };
    assert_eq!(route(&d, "10.20.0.0/16"), v4);
    assert_eq!(route(&d, "fd20::/48"), v6);
    let cfg: abi::GwConfig = Pod::from_bytes(&entries(&d, BpfMap::GwConfig)[&0u32.to_bytes()]).unwrap();
    assert_eq!((cfg.vni, cfg.role, cfg.gateway), (7001, abi::ROLE_MEMBER, abi::addr16("192.0.2.1".parse().unwrap())));
    assert_eq!(cfg.local, abi::addr16("192.0.2.20".parse().unwrap()), "the tunnel source is local_ip");
    assert_eq!(attached(&d), ["hm_tun_in@tc-ingress@hm-tun0", "hm_tun_out@tc-egress@hm-tun0"]);
    assert!(d.neighbours.contains_key(&NeighKey { dev: gateway::TUN.into(), ip: gateway::TUN_NEXT_HOP_V6.into() }));
    // A member forwards nothing and keeps IPv6 forwarding as it was.
    assert!(!d.sysctls.contains_key("net/ipv6/conf/all/forwarding"));
}

#[test]
fn an_ipv6_underlay_costs_70_bytes_and_an_unknown_one_is_assumed_1500_with_a_warning() {
    let v6 = MEMBER.replace("192.0.2.1", "2001:db8:9::1").replace("192.0.2.20", "2001:db8:9::20");
    let d = compile(&config(&v6), &facts_with_mtu("2001:db8:9::1", 1500), &Prior::default());
    assert!(matches!(route(&d, "10.20.0.0/16"), RouteSpec::Via { mtu: Some(1430), .. }));
    let d = compile_new(&config(MEMBER));
    assert!(matches!(route(&d, "10.20.0.0/16"), RouteSpec::Via { mtu: Some(1450), .. }));
    assert_eq!(d.warnings, ["no route to 192.0.2.1 to learn the underlay's MTU; assuming 1500"]);
}

#[test]
fn a_gateway_fills_the_peer_and_member_tries_and_withdraws_a_down_peer() {
    let c = config(GATEWAY);
    let d = compile(&c, &facts_with_mtu("198.51.100.2", 1500), &Prior::default());
    let peer = abi::Endpoint { addr: abi::addr16("198.51.100.2".parse().unwrap()), flags: abi::EP_UP };
    let cidr: ipnet::IpNet = "10.20.0.0/16".parse().unwrap();
    assert_eq!(entries(&d, BpfMap::Peers)[&abi::LpmKey::of(&cidr).to_bytes()], peer.to_bytes());
    assert!(entries(&d, BpfMap::PeerEndpoints).contains_key(&abi::Endpoint { flags: 0, ..peer }.to_bytes()));
    let member: ipnet::IpNet = "10.10.1.0/24".parse().unwrap();
    let web1 = abi::Endpoint { addr: abi::addr16("192.0.2.20".parse().unwrap()), flags: 0 };
    assert_eq!(entries(&d, BpfMap::Members)[&abi::LpmKey::of(&member).to_bytes()], web1.to_bytes());
    assert!(matches!(route(&d, "10.20.0.0/16"), RouteSpec::Via { mtu: Some(1450), .. }));
    assert!(matches!(route(&d, "10.10.1.0/24"), RouteSpec::Via { .. }));
    assert_eq!(d.sysctls["net/ipv4/conf/hm-tun0/forwarding"].spec, "1");
    // hm-tun0 sends no ICMP redirects (so the kernel does not check the
    // source of every packet it forwards back into the tunnel).
    assert_eq!(d.sysctls["net/ipv4/conf/hm-tun0/send_redirects"].spec, "0");
    assert_eq!(d.sysctls["net/ipv4/conf/all/send_redirects"].spec, "0");

    let mut down = facts_with_mtu("198.51.100.2", 1500);
    down.gateways.insert(crate::model::Via::Peer("site-b".into()), None);
    let d = compile(&c, &down, &Prior::default());
    assert_eq!(route(&d, "10.20.0.0/16"), RouteSpec::Unreachable);
    let entry = entries(&d, BpfMap::Peers)[&abi::LpmKey::of(&cidr).to_bytes()].clone();
    assert_eq!(entry, abi::Endpoint { flags: 0, ..peer }.to_bytes(), "the trie keeps the peer, marked down");
    assert!(matches!(route(&d, "10.10.1.0/24"), RouteSpec::Via { .. }), "members are not affected");
}

#[test]
fn an_encrypted_peer_that_cannot_be_carried_is_not_applied_and_its_cidrs_are_unreachable() {
    let key = "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=";
    let encrypted = GATEWAY.replace(
        "endpoint = \"198.51.100.2\"\n",
        &format!("endpoint = \"198.51.100.2\"\nencryption = \"wireguard\"\npublic_key = \"{key}\"\n"),
    );
    let with_key = encrypted.replace("vni = 7001\n", "vni = 7001\nprivate_key_file = \"/etc/hostmesh/keys/a.key\"\n");
    let no_wireguard =
        HostFacts { features: KernelFeatures::lacking([Feature::Wireguard]), ..facts_with_mtu("198.51.100.2", 1500) };
    let unread = HostFacts { wireguard_key: Some(Err("private key /etc/hostmesh/keys/a.key: readable by others (mode 0644); fix: chmod 0600 /etc/hostmesh/keys/a.key".into())), ..facts_with_mtu("198.51.100.2", 1500) };
    for (text, facts, why) in [
        (&with_key, &no_wireguard, "the kernel lacks WireGuard devices (CONFIG_WIREGUARD)"),
        (&encrypted, &facts_with_mtu("198.51.100.2", 1500), "[gateway] has no private_key_file"),
        (&with_key, &unread, "private key /etc/hostmesh/keys/a.key: readable by others (mode 0644); fix: chmod 0600 /etc/hostmesh/keys/a.key"),
    ] {
        let d = compile(&config(text), facts, &Prior::default());
        assert_eq!(route(&d, "10.20.0.0/16"), RouteSpec::Unreachable, "{why}");
        assert!(entries(&d, BpfMap::Peers).is_empty() && entries(&d, BpfMap::PeerEndpoints).is_empty(), "{why}");
        assert_eq!(
            d.warnings[..1],
            [format!("peer \"site-b\" is encrypted (WireGuard) but {why}: not applied; its CIDRs are unreachable, so nothing goes to them in clear")]
        );
        assert!(matches!(route(&d, "10.10.1.0/24"), RouteSpec::Via { .. }), "members are not affected");
    }
}

/// The far end of the tunnel key `dst`'s route carries, if any.
fn tunnel_dst(d: &Desired, dst: &str) -> Option<std::net::IpAddr> {
    match route(d, dst) {
        RouteSpec::Via { encap, .. } => encap.map(|e| e.dst),
        other => panic!("{dst}: {other:?}"),
    }
}

#[test]
fn a_gateway_s_routes_carry_each_far_end_as_their_tunnel_key_where_the_kernel_takes_keys_on_routes() {
    let c = config(GATEWAY);
    let d = compile(&c, &facts_with_mtu("198.51.100.2", 1500), &Prior::default());
    assert_eq!(tunnel_dst(&d, "10.20.0.0/16"), Some("198.51.100.2".parse().unwrap()), "the peer's endpoint");
    assert_eq!(tunnel_dst(&d, "10.10.1.0/24"), Some("192.0.2.20".parse().unwrap()), "the member's endpoint");
    // Without keys on routes, the same routes without one: hm_tun_out
    // sets every packet's.
    let without =
        HostFacts { features: KernelFeatures::lacking([Feature::RouteEncap]), ..facts_with_mtu("198.51.100.2", 1500) };
    let d = compile(&c, &without, &Prior::default());
    assert_eq!(tunnel_dst(&d, "10.20.0.0/16"), None);
    assert_eq!(tunnel_dst(&d, "10.10.1.0/24"), None);
    assert!(matches!(route(&d, "10.20.0.0/16"), RouteSpec::Via { mtu: Some(1450), .. }));
}

#[test]
fn a_gateway_routes_a_peer_through_the_endpoint_its_probes_chose_and_knows_every_endpoint() {
    use crate::model::Via;
    let text = GATEWAY.replace("endpoint = \"198.51.100.2\"", "endpoints = [\"198.51.100.2\", \"198.51.100.3\"]");
    let c = config(&text);
    let mut f = facts_with_mtu("198.51.100.2", 1500);
    f.underlay_mtu.insert("198.51.100.3".parse().unwrap(), 1400);
    let cidr: ipnet::IpNet = "10.20.0.0/16".parse().unwrap();
    let ep = |ip: &str, flags| abi::Endpoint { addr: abi::addr16(ip.parse().unwrap()), flags }.to_bytes();
    // Unprobed: the first.
    let d = compile(&c, &f, &Prior::default());
    assert_eq!(entries(&d, BpfMap::Peers)[&abi::LpmKey::of(&cidr).to_bytes()], ep("198.51.100.2", abi::EP_UP));
    assert!(matches!(route(&d, "10.20.0.0/16"), RouteSpec::Via { mtu: Some(1450), .. }));
    assert_eq!(tunnel_dst(&d, "10.20.0.0/16"), Some("198.51.100.2".parse().unwrap()));
    // The probes moved it to the second: the trie, the route's tunnel key
    // and its MTU follow;
    // both endpoints stay known as the peer's (replies may come from either).
    f.gateways.insert(Via::Peer("site-b".into()), Some("198.51.100.3".parse().unwrap()));
    let d = compile(&c, &f, &Prior::default());
    assert_eq!(entries(&d, BpfMap::Peers)[&abi::LpmKey::of(&cidr).to_bytes()], ep("198.51.100.3", abi::EP_UP));
    assert!(matches!(route(&d, "10.20.0.0/16"), RouteSpec::Via { mtu: Some(1350), .. }));
    assert_eq!(tunnel_dst(&d, "10.20.0.0/16"), Some("198.51.100.3".parse().unwrap()));
    let known = entries(&d, BpfMap::PeerEndpoints);
    assert!(known.contains_key(&ep("198.51.100.2", 0)) && known.contains_key(&ep("198.51.100.3", 0)));
    // A choice that is no longer in the list (an edit raced the prober)
    // is no choice: the peer is down until the prober judges the new list.
    f.gateways.insert(Via::Peer("site-b".into()), Some("198.51.100.9".parse().unwrap()));
    let d = compile(&c, &f, &Prior::default());
    assert_eq!(route(&d, "10.20.0.0/16"), RouteSpec::Unreachable);
}

#[test]
fn a_member_sends_through_the_gateway_its_probes_chose_and_fails_fast_when_none_answers() {
    use crate::model::Via;
    let text = MEMBER.replace("gateway_ip = \"192.0.2.1\"", "gateway_ips = [\"192.0.2.1\", \"192.0.2.2\"]");
    let c = config(&text);
    let mut f = facts_with_mtu("192.0.2.1", 1500);
    f.underlay_mtu.insert("192.0.2.2".parse().unwrap(), 9000);
    let gw_config = |d: &Desired| {
        let v = &d.map_entries[&MapEntryKey { map: BpfMap::GwConfig, key: 0u32.to_bytes().into() }].spec;
        <abi::GwConfig as zerocopy::FromBytes>::read_from_bytes(v.as_bytes().unwrap()).unwrap()
    };
    let d = compile(&c, &f, &Prior::default());
    assert_eq!(gw_config(&d).gateway, abi::addr16("192.0.2.1".parse().unwrap()));
    f.gateways.insert(Via::Site, Some("192.0.2.2".parse().unwrap()));
    let d = compile(&c, &f, &Prior::default());
    assert_eq!(gw_config(&d).gateway, abi::addr16("192.0.2.2".parse().unwrap()));
    assert!(matches!(route(&d, "10.20.0.0/16"), RouteSpec::Via { mtu: Some(8950), .. }));
    f.gateways.insert(Via::Site, None);
    let d = compile(&c, &f, &Prior::default());
    assert_eq!(route(&d, "10.20.0.0/16"), RouteSpec::Unreachable);
    assert_eq!(route(&d, "fd20::/48"), RouteSpec::Unreachable);
}

#[test]
fn a_gateway_skips_endpoints_of_the_other_family_than_local_ip() {
    let text = GATEWAY.replace("endpoint = \"198.51.100.2\"", "endpoint = \"2001:db8:7::2\"");
    let d = compile(&config(&text), &facts_with_mtu("192.0.2.20", 1500), &Prior::default());
    assert_eq!(
        d.warnings,
        ["peer \"site-b\": endpoint 2001:db8:7::2 is IPv6 but local_ip 198.51.100.1 is IPv4; the tunnel runs from local_ip: not applied"]
    );
    assert!(!d.routes.contains_key(&RouteKey { table: RT_TABLE_MAIN, dst: "10.20.0.0/16".parse().unwrap() }));
    assert!(entries(&d, BpfMap::Peers).is_empty() && entries(&d, BpfMap::PeerEndpoints).is_empty());
    assert!(matches!(route(&d, "10.10.1.0/24"), RouteSpec::Via { .. }), "the member still applies");
}

#[test]
fn role_mismatched_entries_are_warned_about() {
    let mut c = config(MEMBER);
    c.members = config(GATEWAY).members;
    c.peers[0].endpoints = vec!["198.51.100.2".parse().unwrap()];
    let d = compile(&c, &facts_with_mtu("192.0.2.1", 1500), &Prior::default());
    assert_eq!(
        d.warnings,
        [
            "peer \"site-b\": endpoint is for gateways; a member sends everything to its gateway",
            "member \"web-1\" is for gateways; this host is a member: not applied"
        ]
    );
}

const MESH: &str = r#"
[[mesh]]
name = "web-sidecar"
vip = "10.96.0.10"
port = 80
redirect_port = 15001

[[mesh]]
name = "all6"
vip = "fd00::60"
port = 0
protocol = "udp"
redirect_port = 15002
"#;

#[test]
fn mesh_entries_get_local_routes_map_entries_and_sk_lookup() {
    let d = compile_new(&config(MESH));
    assert_eq!(d.mesh_path, Some(MeshPath::SkLookup));
    let local = &d.routes[&RouteKey { table: RT_TABLE_LOCAL, dst: "10.96.0.10/32".parse().unwrap() }];
    assert_eq!(local.spec, RouteSpec::Local { dev: "lo".into(), src: "127.0.0.1".parse().unwrap() });
    assert_eq!(local.owners, ["mesh/web-sidecar"].into());
    assert!(d.routes.contains_key(&RouteKey { table: RT_TABLE_LOCAL, dst: "fd00::60/128".parse().unwrap() }));

    let mesh = entries(&d, BpfMap::Mesh);
    let exact = abi::MeshKey::new("10.96.0.10".parse().unwrap(), 80, 6);
    let wildcard = abi::MeshKey::new("fd00::60".parse().unwrap(), 0, 17);
    assert_eq!(abi::MeshValue::from_bytes(&mesh[&exact.to_bytes()]).unwrap().redirect_port, 15001);
    assert_eq!(abi::MeshValue::from_bytes(&mesh[&wildcard.to_bytes()]).unwrap().redirect_port, 15002);
    assert_eq!(attached(&d), ["hm_mesh@netns"]);
    assert!(d.nft_rules.is_empty());
}

#[test]
fn without_sk_lookup_mesh_entries_become_tproxy_rules() {
    let f = HostFacts { sk_lookup_unavailable: Some("Linux 5.4 has no sk_lookup".into()), ..facts() };
    let d = compile(&config(MESH), &f, &Prior::default());
    assert_eq!(
        d.mesh_path,
        Some(MeshPath::Nftables { reason: "sk_lookup is not available here: Linux 5.4 has no sk_lookup".into() })
    );
    assert_eq!(d.nft_rules.len(), 2);
    assert!(entries(&d, BpfMap::Mesh).is_empty() && d.attachments.is_empty());
    assert_eq!(d.routes.len(), 2, "local routes either way");

    let forced = compile_new(&config(&format!("[daemon]\nmesh_backend = \"nftables\"\n{MESH}")));
    assert_eq!(forced.mesh_path, Some(MeshPath::Nftables { reason: "[daemon] mesh_backend = \"nftables\"".into() }));
}

#[test]
fn a_service_on_a_mesh_vip_port_is_left_to_the_sidecar() {
    let d = compile_new(&config(&format!("{TWO}{MESH}")));
    let services = entries(&d, BpfMap::Services);
    let flags = |port: u16, proto: u8| {
        SvcValue::from_bytes(&services[&SvcKey::new("10.96.0.10".parse().unwrap(), port, proto).to_bytes()])
            .unwrap()
            .flags
    };
    assert_eq!(flags(80, 6), abi::SVC_F_MESH, "web:80/tcp is also a mesh entry");
    assert_eq!(flags(53, 17), 0, "dns:53/udp is not");
    // The VIP is delivered locally: no veth route for it...
    assert!(!d.routes.contains_key(&RouteKey { table: RT_TABLE_MAIN, dst: "10.96.0.10/32".parse().unwrap() }));
    // ...so dns, over the veth in mode tcp, would reach this host: said so.
    assert_eq!(d.warnings.len(), 1, "{:?}", d.warnings);
    assert!(d.warnings[0].starts_with("service \"dns\" (10.96.0.10 port 53/udp) shares its VIP with a mesh entry"));
    // With connect-time LB for UDP too, nothing is lost.
    assert!(compile_new(&config(&format!("[daemon]\nconnect_time_lb = \"all\"\n{TWO}{MESH}"))).warnings.is_empty());
}

#[test]
fn a_service_with_affinity_gets_its_timeout_entry_and_flag_and_loses_them_without() {
    let text = "[[service]]\nname = \"web\"\nvip = \"10.96.0.10\"\nport = 80\nbackends = [\"10.0.1.1:80\"]\naffinity = \"client-ip\"\naffinity_timeout = \"90s\"\n";
    let d = compile_new(&config(text));
    let svc = SvcValue::from_bytes(entries(&d, BpfMap::Services).values().next().unwrap()).unwrap();
    assert_eq!(svc.flags & abi::SVC_F_AFFINITY, abi::SVC_F_AFFINITY);
    let affinity = entries(&d, BpfMap::SvcAffinity);
    assert_eq!(affinity.len(), 1);
    let (key, value) = affinity.iter().next().unwrap();
    assert_eq!(*key, svc.id.to_bytes().to_vec(), "keyed by the service's id");
    assert_eq!(abi::SvcAffinity::from_bytes(value).unwrap().timeout_s, 90);

    let d = compile_new(&config(&text.replace("affinity = \"client-ip\"\naffinity_timeout = \"90s\"\n", "")));
    let svc = SvcValue::from_bytes(entries(&d, BpfMap::Services).values().next().unwrap()).unwrap();
    assert_eq!(svc.flags & abi::SVC_F_AFFINITY, 0);
    assert!(entries(&d, BpfMap::SvcAffinity).is_empty());
}

#[test]
fn a_service_from_the_network_gets_its_node_port_entry_snat_sources_sysctls_and_programs_on_host_interfaces() {
    let c = config(
        "[daemon]\nconnect_time_lb = \"all\"\n[[service]]\nname = \"web\"\nvip = \"10.96.0.10\"\nport = 80\nbackends = \
         [\"192.168.10.11:8080\", \"10.0.5.20:8080\"]\nnode_port = 30080\nexternal = true\n",
    );
    let d = compile_new(&c);
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    let services = entries(&d, BpfMap::Services);
    let value = |key: abi::SvcKey| abi::SvcValue::from_bytes(&services[&key.to_bytes()]).unwrap();
    let vip = value(abi::SvcKey::new("10.96.0.10".parse().unwrap(), 80, 6));
    assert_eq!(vip.flags, 0, "this host's clients' entry");
    let external = value(abi::SvcKey::network("10.96.0.10".parse().unwrap(), 80, 6));
    assert_eq!((external.id, external.flags, external.backend_count), (vip.id, abi::SVC_F_EXTERNAL, 2));
    let node = value(abi::SvcKey::network("0.0.0.0".parse().unwrap(), 30080, 6));
    assert_eq!((node.id, node.flags, node.table_size), (vip.id, abi::SVC_F_NODE_PORT, vip.table_size));
    assert!(!services.contains_key(&abi::SvcKey::new("0.0.0.0".parse().unwrap(), 30080, 6).to_bytes()));
    // The network's entries take no id of their own, and "snat" shares the
    // service's table.
    assert_eq!(Prior::from_entries(d.map_entries.iter().map(|(k, v)| (k, &v.spec))).services.len(), 1);
    assert!(entries(&d, BpfMap::Maglev)
        .keys()
        .all(|k| abi::MaglevKey::from_bytes(k).unwrap().chunk & abi::MAGLEV_LOCAL == 0));
    assert!(d.local_backends.is_empty());

    let snat = entries(&d, BpfMap::Snat);
    let src = |b: &str| {
        abi::SnatValue::from_bytes(&snat[&abi::Addr { addr: abi::addr16(b.parse().unwrap()) }.to_bytes()]).unwrap().src
    };
    assert_eq!(src("192.168.10.11"), abi::addr16("192.0.2.1".parse().unwrap()), "another host: this host's address");
    assert_eq!(src("10.0.5.20"), [0; 16], "behind a veth of this host: the client's own address");

    // The node port answers on the host interface's addresses only.
    let answering: Vec<[u8; 16]> =
        entries(&d, BpfMap::HostAddrs).keys().map(|k| abi::Addr::from_bytes(k).unwrap().addr).collect();
    let eth0 = ["192.0.2.1", "2001:db8::1"].map(|ip| abi::addr16(ip.parse().unwrap()));
    assert_eq!(answering.iter().collect::<std::collections::BTreeSet<_>>(), eth0.iter().collect());
    assert_eq!(d.sysctls["net/ipv4/conf/eth0/forwarding"].spec, "1");
    assert!(!d.sysctls.contains_key("net/ipv6/conf/eth0/forwarding"));
    assert_eq!(d.sysctls["net/ipv4/ip_local_reserved_ports"].spec, "30000-32767,61000-65535");
    for hook in [Hook::TcIngress("eth0".into()), Hook::TcEgress("eth0".into())] {
        assert!(d.attachments.keys().any(|a| a.hook == hook), "{hook:?}");
    }
    // In mode "all" nothing else needs the veth.
    assert!(d.links.is_empty());
    // hm_reply and hm_direct look for flows from the network: with such a
    // service only (mode_all_... above: none, no flag).
    let cfg = HmConfig::from_bytes(&entries(&d, BpfMap::Config)[&0u32.to_bytes()]).unwrap();
    assert_eq!(cfg.flags, abi::CFG_CTLB_TCP | abi::CFG_CTLB_UDP | abi::CFG_EXTERNAL);
}

#[test]
fn external_policy_local_gives_the_networks_entries_a_table_of_this_hosts_backends_only() {
    // 10.0.5.20 is behind a veth of this host, 192.168.10.11 another host's.
    let text = "[[service]]\nname = \"web\"\nvip = \"10.96.0.10\"\nport = 80\nbackends = \
                [\"192.168.10.11:8080\", \"10.0.5.20:8080\"]\nnode_port = 30080\nexternal = true\n\
                external_policy = \"local\"\n";
    let d = compile_new(&config(text));
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    let services = entries(&d, BpfMap::Services);
    let value = |key: abi::SvcKey| abi::SvcValue::from_bytes(&services[&key.to_bytes()]).unwrap();
    let vip = value(abi::SvcKey::new("10.96.0.10".parse().unwrap(), 80, 6));
    assert_eq!((vip.flags, vip.backend_count), (0, 2), "this host's clients reach both");
    for (key, flag) in [
        (abi::SvcKey::network("10.96.0.10".parse().unwrap(), 80, 6), abi::SVC_F_EXTERNAL),
        (abi::SvcKey::network("0.0.0.0".parse().unwrap(), 30080, 6), abi::SVC_F_NODE_PORT),
    ] {
        let v = value(key);
        assert_eq!((v.id, v.flags, v.backend_count), (vip.id, flag | abi::SVC_F_LOCAL, 1), "{key:?}");
    }
    // The local table: every slot is the backend behind the veth.
    let backends = entries(&d, BpfMap::Backends);
    let id_of = |addr: &str| {
        let want: std::net::SocketAddr = addr.parse().unwrap();
        backends
            .iter()
            .find(|(_, v)| abi::BackendValue::from_bytes(v).unwrap().socket_addr() == want)
            .map(|(k, _)| u32::from_bytes(k).unwrap())
            .unwrap()
    };
    let chunks = entries(&d, BpfMap::Maglev);
    let local: Vec<u32> = chunks
        .iter()
        .filter(|(k, _)| abi::MaglevKey::from_bytes(k).unwrap().chunk & abi::MAGLEV_LOCAL != 0)
        .flat_map(|(_, v)| abi::MaglevChunk::from_bytes(v).unwrap().backend)
        .collect();
    let table_chunks = chunks.len() / 2;
    assert_eq!(local.len(), table_chunks * abi::MAGLEV_CHUNK, "as many chunks as the service's own table");
    let size = vip.table_size as usize;
    assert!(local[..size].iter().all(|&id| id == id_of("10.0.5.20:8080")), "only the backend here");
    assert_eq!(d.local_backends.get("web"), Some(&1));

    // None here: the network's entries refuse (backend_count 0), this
    // host's clients still reach the other host's backend.
    let d = compile_new(&config(&text.replace(", \"10.0.5.20:8080\"", "")));
    let services = entries(&d, BpfMap::Services);
    let node =
        abi::SvcValue::from_bytes(&services[&abi::SvcKey::network("0.0.0.0".parse().unwrap(), 30080, 6).to_bytes()])
            .unwrap();
    assert_eq!(node.backend_count, 0);
    let vip = abi::SvcValue::from_bytes(&services[&abi::SvcKey::new("10.96.0.10".parse().unwrap(), 80, 6).to_bytes()])
        .unwrap();
    assert_eq!(vip.backend_count, 1);
    assert_eq!(d.local_backends.get("web"), Some(&0));
}

#[test]
fn a_backend_with_no_route_is_named_and_left_out_of_flows_from_the_network() {
    let c = config(
        "[[service]]\nname = \"web\"\nvip = \"10.96.0.10\"\nport = 80\nbackends = [\"203.0.113.9:80\"]\nexternal = true\n",
    );
    let d = compile_new(&c);
    assert!(entries(&d, BpfMap::Snat).is_empty());
    assert!(d.warnings.iter().any(|w| w.contains("203.0.113.9:80 has no route")), "{:?}", d.warnings);
}

#[test]
fn entries_are_ordered_by_map_then_by_id_as_a_number_or_else_by_key_bytes() {
    use crate::abi::{MaglevKey, Pod};
    let backend = |id: u32| MapEntryKey { map: BpfMap::Backends, key: id.to_bytes().into() };
    let chunk = |svc_id: u32, chunk: u32| MapEntryKey {
        map: BpfMap::Maglev,
        key: MaglevKey { svc_id, chunk }.to_bytes().into(),
    };
    let service = |b: &[u8]| MapEntryKey { map: BpfMap::Services, key: b.into() };
    // Ids as numbers: 255 < 256 whatever their bytes in memory.
    assert!(backend(255) < backend(256) && backend(1) < backend(65_536));
    // A service's id first, then its chunk.
    assert!(chunk(1, 3) < chunk(2, 0) && chunk(2, 0) < chunk(2, 1) && chunk(256, 0) > chunk(255, 9));
    // The map first; other maps' keys by their bytes.
    assert!(backend(u32::MAX) < chunk(0, 0) && chunk(u32::MAX, 0) < service(&[0]));
    assert!(service(&[1, 0]) < service(&[1, 1]) && service(&[0, 9]) < service(&[1, 0]));
    // Consistent with equality.
    assert_eq!(backend(7).cmp(&backend(7)), std::cmp::Ordering::Equal);
}

/// Each configuration of every mode (with node ports, client affinity, a
/// mesh and a gateway) on each kernel (and kernels that force another
/// mode), with what compile makes of it and the programs it attaches.
fn for_each_hint_case(check: impl Fn(&str, &Config, &KernelFeatures, &Desired, &BTreeSet<Program>)) {
    let external = "[[service]]\nname = \"ext\"\nvip = \"10.96.0.20\"\nport = 80\nbackends = \
                    [\"192.168.10.11:8080\"]\nnode_port = 30080\nexternal = true\n";
    let sticky = "[[service]]\nname = \"sticky\"\nvip = \"10.96.0.30\"\nport = 80\nbackends = \
                  [\"192.168.10.11:8080\"]\naffinity = \"client-ip\"\n";
    let daemon = |m: &str| format!("[daemon]\nconnect_time_lb = \"{m}\"\n");
    let mut cases = vec![String::new(), MESH.to_string(), MEMBER.to_string(), GATEWAY.to_string()];
    for m in ["tcp", "all", "off"] {
        cases.push(format!("{}{TWO}", daemon(m)));
        cases.push(format!("{}{external}", daemon(m)));
        cases.push(format!("{}{sticky}", daemon(m)));
        cases.push(format!("{}{TWO}{MESH}{GATEWAY}", daemon(m)));
    }
    let kernels = [
        KernelFeatures::complete(),
        KernelFeatures::lacking([Feature::ConnectTimeHooks]),
        KernelFeatures::lacking([Feature::RedirectNeigh]),
        KernelFeatures::lacking([Feature::SockRelease]),
    ];
    for text in &cases {
        for features in &kernels {
            let c = config(text);
            let d = compile(&c, &HostFacts { features: features.clone(), ..facts() }, &Prior::default());
            let attached: BTreeSet<Program> = d.attachments.keys().map(|a| a.program).collect();
            check(&format!("{text}\non a kernel lacking {features:?}"), &c, features, &d, &attached);
        }
    }
}

/// The maps created small for being unused are those compile leaves
/// unused: the conntrack maps are the veth-path object's programs'
/// (hm_natin, hm_natout, hm_reply, hm_direct), the reverse map the connect-time
/// programs', client affinity's the services' with affinity.
#[test]
fn the_capacities_left_unused_are_those_a_compile_does_not_use() {
    use crate::config::Capacity;
    for_each_hint_case(|case, c, features, d, attached| {
        let unused = unused_capacities(c, &programs_likely(c, features));
        let nat = [Program::NatIn, Program::NatOut, Program::Reply, Program::Direct];
        assert_eq!(unused.contains(Capacity::Conntrack), !nat.iter().any(|p| attached.contains(p)), "{case}");
        let ctlb = Program::CONNECT_TIME.iter().any(|p| attached.contains(p));
        assert_eq!(unused.contains(Capacity::ReverseSock), !ctlb, "{case}");
        let affinity = d.map_entries.keys().any(|k| k.map == BpfMap::SvcAffinity);
        assert_eq!(unused.contains(Capacity::Affinity), !affinity, "{case}");
    });
}

/// The preload's hint names what compile attaches: every mode, on kernels
/// that force another, with node ports, a mesh and a gateway.
#[test]
fn the_programs_a_preload_verifies_are_those_compile_attaches() {
    for_each_hint_case(|case, c, features, _, attached| {
        assert_eq!(&programs_likely(c, features), attached, "{case}");
    });
}

proptest::proptest! {
    /// Items made at once are the items `want` makes one at a time: keys
    /// repeated in any order are one item, with every owner and the first
    /// spec.
    #[test]
    fn items_wanted_all_at_once_are_those_wanted_one_at_a_time(
        items in proptest::collection::vec((0u16..64, 0u8..4, 0u8..3), 0..300)
    ) {
        let owners = ["service/a", "service/b", "bpfnat"];
        let mut one_by_one = BTreeMap::new();
        let mut all = Vec::new();
        for (key, spec, owner) in &items {
            want(&mut one_by_one, *key, *spec, owners[*owner as usize]);
            let owned = Owned { spec: *spec, owners: [owners[*owner as usize]].into_iter().collect() };
            all.push((*key, owned));
        }
        proptest::prop_assert_eq!(wanted_all(all), one_by_one);
    }
}
