//! Encrypted peers through plan + apply + sync against the in-memory
//! kernel: the WireGuard device, its steering and their order.

use std::sync::Arc;

use super::*;
use crate::backends::fake::FakeKernel;
use crate::config::Config;
use crate::model::encryption::{WG, WG_FWMARK, WG_GUARD_TABLE, WG_TABLE};
use crate::model::*;

const PRIVATE: &str = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=";
const B1: &str = "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=";
const B2: &str = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=";

/// A key file the trust rules accept, in a dir of its own.
fn key_file() -> (tempfile::TempDir, String) {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("a.key");
    std::fs::write(&path, format!("{PRIVATE}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    (d, path.display().to_string())
}

fn gateway(key_path: &str, peer_key: &str, encryption: &str) -> Arc<Config> {
    let peer_wg = if encryption == "wireguard" { format!("public_key = \"{peer_key}\"\n") } else { String::new() };
    Arc::new(crate::config::from_text(&format!(
        "[gateway]\nrole = \"gateway\"\nlocal_ip = \"198.51.100.1\"\nvni = 7001\nprivate_key_file = \"{key_path}\"\n\n\
         [[peer]]\nname = \"site-b\"\nendpoint = \"198.51.100.2\"\ncidrs = [\"10.20.0.0/16\"]\n\
         encryption = \"{encryption}\"\n{peer_wg}"
    )))
}

fn kernel() -> FakeKernel {
    let k = FakeKernel::new();
    {
        let mut s = k.state();
        s.facts.interfaces = ["lo", "eth0"].map(String::from).into();
        s.facts.underlay_mtu.insert("198.51.100.2".parse().unwrap(), 1500);
        s.host_sysctls.insert("net/ipv4/conf/all/rp_filter".into(), "2".into());
        s.host_sysctls.insert("net/ipv4/conf/all/send_redirects".into(), "1".into());
    }
    k
}

fn guard_rules() -> std::collections::BTreeSet<RuleSpec> {
    [(32700, WG_TABLE), (32701, WG_GUARD_TABLE)]
        .map(|(priority, table)| RuleSpec { v6: false, priority, not_fwmark: WG_FWMARK, table })
        .into()
}

#[test]
fn an_encrypted_peer_is_steered_into_its_device_before_anything_sends_to_it() {
    let (_dir, key) = key_file();
    let k = kernel();
    let mut r = Reconciler::new(k.backends(), SysctlOriginals::in_memory());
    let out = r.sync(&gateway(&key, B1, "wireguard"), false).unwrap();
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    let s = k.state();
    let LinkSpec::Wireguard(w) = &s.links[WG] else { panic!("no WireGuard device: {:?}", s.links) };
    let ep: std::net::IpAddr = "198.51.100.2".parse().unwrap();
    assert_eq!((w.port, w.fwmark, w.mtu, w.up), (51820, WG_FWMARK, 1440, true));
    assert_eq!(w.peers[&ep], WireguardPeer { public_key: crate::keys::PublicKey::parse(B1).unwrap(), port: 51820 });
    let private = crate::keys::read_private_key(&crate::keys::KeySource::File(key.clone().into()), None).unwrap();
    assert_eq!(w.key.as_ref().unwrap().public, private.public_key());
    assert_eq!(s.rules, guard_rules());
    let host: ipnet::IpNet = "198.51.100.2/32".parse().unwrap();
    assert_eq!(
        s.routes[&RouteKey { table: WG_TABLE, dst: host }],
        RouteSpec::Dev { dev: WG.into(), src: "198.51.100.1".parse().unwrap() }
    );
    assert_eq!(s.routes[&RouteKey { table: WG_GUARD_TABLE, dst: host }], RouteSpec::Unreachable);
    // 1500 less WireGuard's 60 and VXLAN's 50.
    let cidr = RouteKey { table: RT_TABLE_MAIN, dst: "10.20.0.0/16".parse().unwrap() };
    assert!(matches!(s.routes[&cidr], RouteSpec::Via { mtu: Some(1390), .. }), "{:?}", s.routes[&cidr]);
    // The steering (the device, its routes, the rules) before the first
    // map entry that sends to the peer and the route that brings it
    // traffic.
    let at =
        |what: &str| s.log.iter().position(|l| l.starts_with(what)).unwrap_or_else(|| panic!("no {what}: {:?}", s.log));
    let steered = at("add_rule").max(at(&format!("replace_route {host}"))).max(at("create_link hm-wg0"));
    assert!(steered < at("put_map_entry HM_PEER_ENDPOINTS"), "{:?}", s.log);
    assert!(steered < at("put_map_entry HM_PEERS"), "{:?}", s.log);
    assert!(steered < at("replace_route 10.20.0.0/16"), "{:?}", s.log);
    // The peer's VXLAN is taken only through the device: its endpoint is
    // known as encrypted, and hm_wg_in, which marks what the device
    // receives, is attached before that entry is written.
    let endpoint = crate::abi::Endpoint { addr: crate::abi::addr16(ep), flags: 0 };
    let entry = MapEntryKey { map: BpfMap::PeerEndpoints, key: crate::abi::Pod::to_bytes(&endpoint).into() };
    let known = s.maps.get(&entry).expect("B's endpoint in HM_PEER_ENDPOINTS");
    assert_eq!(known[..], (crate::abi::PEER_EP_KNOWN | crate::abi::PEER_EP_ENCRYPTED).to_ne_bytes());
    let wg_in = Attachment { program: Program::WgIn, hook: Hook::TcIngress(WG.into()) };
    assert!(s.attachments.contains_key(&wg_in), "{:?}", s.attachments);
    assert!(at(&format!("attach {}", wg_in.pin_name())) < at("put_map_entry HM_PEER_ENDPOINTS"), "{:?}", s.log);
    drop(s);
    let again = r.sync(&gateway(&key, B1, "wireguard"), true).unwrap();
    assert!(again.steps.is_empty(), "a converged device reads back as wanted: {:?}", again.steps);
    // hm-tun0 sends no ICMP redirects while hostmesh runs (model/gateway.rs);
    // the host's own setting is put back when the gateway goes.
    assert_eq!(k.state().host_sysctls["net/ipv4/conf/all/send_redirects"], "0");
    let gone = r.sync(&Arc::default(), false).unwrap();
    assert!(gone.errors.is_empty(), "{:?}", gone.errors);
    assert_eq!(k.state().host_sysctls["net/ipv4/conf/all/send_redirects"], "1");
}

#[test]
fn a_new_peer_key_sets_the_device_in_place_and_clear_again_removes_the_steering_last() {
    let (_dir, key) = key_file();
    let k = kernel();
    let mut r = Reconciler::new(k.backends(), SysctlOriginals::in_memory());
    r.sync(&gateway(&key, B1, "wireguard"), false).unwrap();

    let out = r.sync(&gateway(&key, B2, "wireguard"), false).unwrap();
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    assert_eq!(out.steps, ["set wireguard hm-wg0 listen-port 51820 mtu 1440 (1 peers)"], "in place, nothing else");
    let device = k.state().links[WG].clone();
    let LinkSpec::Wireguard(w) = device else { panic!("{device:?}") };
    assert_eq!(w.peers.values().next().unwrap().public_key, crate::keys::PublicKey::parse(B2).unwrap());

    k.state().log.clear();
    let out = r.sync(&gateway(&key, B2, "none"), false).unwrap();
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    let s = k.state();
    assert!(s.rules.is_empty() && !s.links.contains_key(WG), "{:?}", s.log);
    assert!(s.routes.keys().all(|r| !crate::model::encryption::is_guard_table(r.table)));
    // The CIDR's route changes MTU (in clear: 1450) before the steering
    // goes; the rules go before their routes.
    let at =
        |what: &str| s.log.iter().position(|l| l.starts_with(what)).unwrap_or_else(|| panic!("no {what}: {:?}", s.log));
    assert!(at("replace_route 10.20.0.0/16") < at("delete_rule"), "{:?}", s.log);
    assert!(at("delete_rule") < at("delete_route 198.51.100.2/32"), "{:?}", s.log);
}

#[test]
fn teardown_removes_the_device_its_rules_and_routes() {
    let (_dir, key) = key_file();
    let k = kernel();
    let mut r = Reconciler::new(k.backends(), SysctlOriginals::in_memory());
    r.sync(&gateway(&key, B1, "wireguard"), false).unwrap();
    let emptied = crate::reconcile::reconcile_to_empty(&mut k.backends(), &mut SysctlOriginals::in_memory()).unwrap();
    assert!(emptied.errors.is_empty(), "{:?}", emptied.errors);
    let s = k.state();
    assert!(s.links.is_empty() && s.routes.is_empty() && s.rules.is_empty(), "{:?}", s.log);
}

#[test]
fn a_device_deleted_by_hand_is_made_again_and_meanwhile_the_guard_refuses() {
    let (_dir, key) = key_file();
    let k = kernel();
    let mut r = Reconciler::new(k.backends(), SysctlOriginals::in_memory());
    r.sync(&gateway(&key, B1, "wireguard"), false).unwrap();
    crate::backends::NetBackend::delete_link(&mut k.clone(), WG).unwrap();
    let host: ipnet::IpNet = "198.51.100.2/32".parse().unwrap();
    {
        let s = k.state();
        assert!(!s.routes.contains_key(&RouteKey { table: WG_TABLE, dst: host }), "gone with the device");
        assert_eq!(s.routes[&RouteKey { table: WG_GUARD_TABLE, dst: host }], RouteSpec::Unreachable, "still refused");
        assert_eq!(s.rules, guard_rules());
    }
    let out = r.sync(&gateway(&key, B1, "wireguard"), true).unwrap();
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    let device = k.state().links[WG].clone();
    assert!(matches!(device, LinkSpec::Wireguard(_)));
    assert_eq!(
        k.state().routes[&RouteKey { table: WG_TABLE, dst: host }],
        RouteSpec::Dev { dev: WG.into(), src: "198.51.100.1".parse().unwrap() }
    );
}
