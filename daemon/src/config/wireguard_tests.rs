//! The WireGuard keys of `[gateway]` and `[[peer]]` (README.md,
//! "Encrypted peers").

use super::*;

const KEY_B1: &str = "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=";
const KEY_B2: &str = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=";

use super::tests::one_error;

const GATEWAY: &str = "[gateway]\nrole = \"gateway\"\nlocal_ip = \"198.51.100.1\"\nvni = 7\n";

fn peer(lines: &str) -> String {
    format!("[[peer]]\nname = \"b\"\ncidrs = [\"10.20.0.0/16\"]\n{lines}\n")
}

#[test]
fn a_gateway_names_its_private_key_and_listens_on_51820_unless_told() {
    let f = from_text(&format!("{GATEWAY}private_key_file = \"/etc/hostmesh/keys/a.key\"\n"));
    let g = f.gateway.expect("a gateway");
    assert_eq!(g.private_key, Some(KeySource::File("/etc/hostmesh/keys/a.key".into())));
    assert_eq!(g.wireguard_port, DEFAULT_WIREGUARD_PORT);
    let f = from_text(&format!("{GATEWAY}private_key_file = \"credential:a.key\"\nwireguard_port = 51000\n"));
    let g = f.gateway.expect("a gateway");
    assert_eq!(g.private_key, Some(KeySource::Credential("a.key".into())));
    assert_eq!(g.wireguard_port, 51000);
    assert_eq!(
        one_error(&format!("{GATEWAY}private_key_file = \"keys/a.key\"\n")),
        "t.toml:5:20: [gateway]: private_key_file \"keys/a.key\" is not an absolute path (or credential:NAME)"
    );
    assert_eq!(
        one_error(&format!("{GATEWAY}wireguard_port = 4789\n")),
        "t.toml:5:18: [gateway]: wireguard_port 4789 is the tunnel's udp_port or the probe_port; use another port"
    );
    assert_eq!(
        one_error(
            "[gateway]\nrole = \"member\"\nlocal_ip = \"192.0.2.20\"\ngateway_ip = \"192.0.2.1\"\nvni = 7\n\
             private_key_file = \"/k\"\n"
        ),
        "t.toml:6:20: [gateway]: private_key_file is only for role = \"gateway\"; a member reaches its own gateway on the site's network, in clear"
    );
}

#[test]
fn an_encrypted_peer_has_one_public_key_per_endpoint() {
    let f = from_text(&peer(&format!(
        "endpoint = \"198.51.100.11\"\nencryption = \"wireguard\"\npublic_key = \"{KEY_B1}\""
    )));
    let Encryption::Wireguard { public_keys, port } = &f.peers[0].encryption else { panic!("encrypted") };
    assert_eq!(public_keys.iter().map(|k| k.to_string()).collect::<Vec<_>>(), [KEY_B1]);
    assert_eq!(*port, None);
    let f = from_text(&peer(&format!(
        "endpoints = [{{ address = \"198.51.100.11\", public_key = \"{KEY_B1}\" }}, \
         {{ address = \"198.51.100.12\", public_key = \"{KEY_B2}\" }}]\nencryption = \"wireguard\"\nwireguard_port = 51900"
    )));
    let p = &f.peers[0];
    assert_eq!(p.endpoints, ["198.51.100.11".parse::<std::net::IpAddr>().unwrap(), "198.51.100.12".parse().unwrap()]);
    let Encryption::Wireguard { public_keys, port } = &p.encryption else { panic!("encrypted") };
    assert_eq!(public_keys.iter().map(|k| k.to_string()).collect::<Vec<_>>(), [KEY_B1, KEY_B2]);
    assert_eq!(*port, Some(51900));
    let f = from_text(&peer("endpoints = [\"198.51.100.11\", { address = \"198.51.100.12\" }]"));
    assert_eq!(f.peers[0].encryption, Encryption::None);
    assert_eq!(f.peers[0].endpoints.len(), 2);
}

#[test]
fn encryption_keys_that_do_not_fit_are_rejected_naming_the_key() {
    let wg = |rest: &str| one_error(&peer(&format!("encryption = \"wireguard\"\n{rest}")));
    assert_eq!(
        one_error(&peer("endpoint = \"198.51.100.11\"\nencryption = \"ipsec\"")),
        "t.toml:5:14: peer \"b\": encryption \"ipsec\" is not one of \"none\" or \"wireguard\""
    );
    assert_eq!(
        wg(&format!("public_key = \"{KEY_B1}\"")),
        "t.toml:4:14: peer \"b\": encryption is between gateways; give this peer's `endpoints` on a gateway (a member's traffic reaches its own gateway in clear)"
    );
    assert_eq!(
        wg("endpoint = \"198.51.100.11\""),
        "t.toml:4:14: peer \"b\": encryption = \"wireguard\" needs each endpoint's public key (`public_key`, or { address = \"…\", public_key = \"…\" } in `endpoints`)"
    );
    assert_eq!(
        wg("endpoint = \"198.51.100.11\"\npublic_key = \"not a key\""),
        "t.toml:6:14: peer \"b\": public_key is not a WireGuard key (44 characters of base64, as `wg pubkey` prints)"
    );
    assert_eq!(
        wg(&format!("endpoints = [\"198.51.100.11\", \"198.51.100.12\"]\npublic_key = \"{KEY_B1}\"")),
        "t.toml:6:14: peer \"b\": 2 endpoints need a key each; give each entry of `endpoints` as { address = \"…\", public_key = \"…\" }"
    );
    assert_eq!(
        wg(&format!(
            "endpoints = [{{ address = \"198.51.100.11\", public_key = \"{KEY_B1}\" }}, \
             {{ address = \"198.51.100.12\", public_key = \"{KEY_B1}\" }}]"
        )),
        format!("t.toml:5:148: peer \"b\": public key {KEY_B1} is given twice; each gateway has its own")
    );
    assert_eq!(
        one_error(&peer(&format!("endpoint = \"198.51.100.11\"\npublic_key = \"{KEY_B1}\""))),
        "t.toml:5:14: peer \"b\": public_key is only for encryption = \"wireguard\""
    );
    assert_eq!(
        one_error(&peer("endpoint = \"198.51.100.11\"\nwireguard_port = 51820")),
        "t.toml:5:18: peer \"b\": wireguard_port is only for encryption = \"wireguard\""
    );
    assert_eq!(
        one_error(&peer("endpoints = [{ address = \"198.51.100.11\", key = \"x\" }]")),
        "t.toml:4:14: invalid TOML at key `endpoints`: unknown field `key`, expected `address` or `public_key`"
    );
}
