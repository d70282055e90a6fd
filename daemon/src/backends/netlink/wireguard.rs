//! WireGuard devices over generic netlink (the `wireguard` family): a
//! device's key, port and peers set as a whole, and read back for status.
//! The private key goes to the kernel and nowhere else: no message of this
//! module is logged or put in an error.

use std::io;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use netlink_packet_generic::ctrl::nlas::GenlCtrlAttrs;
use netlink_packet_generic::ctrl::{GenlCtrl, GenlCtrlCmd};
use netlink_packet_generic::GenlMessage;
use netlink_packet_wireguard::{
    WireguardAddressFamily, WireguardAllowedIp, WireguardAllowedIpAttr, WireguardAttribute, WireguardCmd,
    WireguardMessage, WireguardPeer, WireguardPeerAttribute, WireguardPeerFlags,
};
use netlink_sys::protocols::NETLINK_GENERIC;

use super::socket::NetlinkSocket;
use crate::keys::{DeviceKey, PrivateKey, PublicKey};
use crate::model::{WireguardPeer as WireguardPeerSpec, WireguardSpec};

type CtrlSocket = NetlinkSocket<GenlMessage<GenlCtrl>>;
type WgSocket = NetlinkSocket<GenlMessage<WireguardMessage>>;

/// A peer as the kernel reports it (for `hostmesh status`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub(crate) struct PeerState {
    pub key: Option<PublicKey>,
    pub endpoint: Option<SocketAddr>,
    /// Unix seconds of the last handshake; 0: none yet.
    pub last_handshake_s: i64,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
}

/// The `wireguard` family's id, which the kernel assigns when the module
/// loads.
fn family_id() -> io::Result<u16> {
    let mut sock = CtrlSocket::open_protocol(NETLINK_GENERIC)?;
    let ask = GenlCtrl { cmd: GenlCtrlCmd::GetFamily, nlas: vec![GenlCtrlAttrs::FamilyName("wireguard".into())] };
    let answers = sock.query(GenlMessage::from_payload(ask))?;
    answers
        .iter()
        .flat_map(|m| m.payload.nlas.iter())
        .find_map(|a| match a {
            GenlCtrlAttrs::FamilyId(id) => Some(*id),
            _ => None,
        })
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "the kernel has no wireguard netlink family"))
}

/// How often each peer is sent a keepalive when nothing else goes its
/// way (as wg-quick's `PersistentKeepalive = 25`). Set on a peer that had
/// none, it also sends one at once: a peer added (a new key) starts its
/// handshake on apply, not at the next packet.
const KEEPALIVE_S: u16 = 25;

/// The set-device message: `ifname`'s key, port and mark, each of
/// `spec`'s peers set (added or updated, its allowed address replaced),
/// and the peers with the keys in `remove` removed. Peers left as they
/// were keep their sessions.
fn set_message(ifname: &str, key: &PrivateKey, spec: &WireguardSpec, remove: &[PublicKey]) -> WireguardMessage {
    let mut peers: Vec<WireguardPeer> = spec.peers.iter().map(|(ip, p)| peer_message(*ip, p)).collect();
    peers.extend(remove.iter().map(|k| {
        WireguardPeer(vec![
            WireguardPeerAttribute::PublicKey(k.0),
            WireguardPeerAttribute::Flags(WireguardPeerFlags::RemoveMe),
        ])
    }));
    WireguardMessage {
        cmd: WireguardCmd::SetDevice,
        attributes: vec![
            WireguardAttribute::IfName(ifname.to_string()),
            WireguardAttribute::PrivateKey(*key.expose()),
            WireguardAttribute::ListenPort(spec.port),
            WireguardAttribute::Fwmark(spec.fwmark),
            WireguardAttribute::Peers(peers),
        ],
    }
}

fn peer_message(ip: IpAddr, p: &WireguardPeerSpec) -> WireguardPeer {
    let net = IpNet::from(ip);
    let family = if ip.is_ipv4() { WireguardAddressFamily::Ipv4 } else { WireguardAddressFamily::Ipv6 };
    let allowed = WireguardAllowedIp(vec![
        WireguardAllowedIpAttr::Family(family),
        WireguardAllowedIpAttr::IpAddr(net.addr()),
        WireguardAllowedIpAttr::Cidr(net.prefix_len()),
    ]);
    WireguardPeer(vec![
        WireguardPeerAttribute::PublicKey(p.public_key.0),
        WireguardPeerAttribute::Flags(WireguardPeerFlags::ReplaceAllowedIps),
        WireguardPeerAttribute::Endpoint(SocketAddr::new(ip, p.port)),
        WireguardPeerAttribute::PersistentKeepalive(KEEPALIVE_S),
        WireguardPeerAttribute::AllowedIps(vec![allowed]),
    ])
}

fn socket() -> io::Result<(WgSocket, u16)> {
    Ok((WgSocket::open_protocol(NETLINK_GENERIC)?, family_id()?))
}

/// `wg set IFNAME private-key … listen-port … fwmark …` with `spec`'s
/// peers, and every other peer the device has removed.
pub(crate) fn set_device(ifname: &str, spec: &WireguardSpec) -> io::Result<()> {
    let Some(key) = spec.key.as_ref().and_then(|k| k.private.as_deref()) else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no private key to give the device"));
    };
    let have = device(ifname)?;
    let wanted: Vec<PublicKey> = spec.peers.values().map(|p| p.public_key).collect();
    let remove: Vec<PublicKey> = have.peers.values().map(|p| p.public_key).filter(|k| !wanted.contains(k)).collect();
    let (mut sock, id) = socket()?;
    let mut msg = GenlMessage::from_payload(set_message(ifname, key, spec, &remove));
    msg.set_resolved_family_id(id);
    sock.request(msg, 0)
}

/// `ifname` as the kernel has it: port, mark, public key and peers (by
/// their one allowed address, as hostmesh sets them); never the private
/// key. `mtu` and `up` are the link's, left at 0 and false here.
pub(crate) fn device(ifname: &str) -> io::Result<WireguardSpec> {
    let mut out = WireguardSpec { port: 0, fwmark: 0, mtu: 0, key: None, peers: Default::default(), up: false };
    for a in get_device(ifname)?.iter().flat_map(|m| m.payload.attributes.iter()) {
        match a {
            WireguardAttribute::ListenPort(p) => out.port = *p,
            WireguardAttribute::Fwmark(m) => out.fwmark = *m,
            WireguardAttribute::PublicKey(k) if k.iter().any(|b| *b != 0) => {
                out.key = Some(DeviceKey { public: PublicKey(*k), private: None })
            }
            WireguardAttribute::Peers(peers) => {
                for p in peers {
                    if let Some((ip, peer)) = peer_spec(p) {
                        out.peers.insert(ip, peer);
                    }
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// A peer as hostmesh sets it: one allowed address, its endpoint's port.
/// Any other peer reads back under a key no endpoint has, so it differs.
fn peer_spec(p: &WireguardPeer) -> Option<(IpAddr, WireguardPeerSpec)> {
    let (mut key, mut port, mut ips) = (None, 0, Vec::new());
    for a in p.0.iter() {
        match a {
            WireguardPeerAttribute::PublicKey(k) => key = Some(PublicKey(*k)),
            WireguardPeerAttribute::Endpoint(e) => port = e.port(),
            WireguardPeerAttribute::AllowedIps(allowed) => {
                for ip in allowed {
                    let (mut addr, mut cidr) = (None, 0);
                    for x in ip.0.iter() {
                        match x {
                            WireguardAllowedIpAttr::IpAddr(a) => addr = Some(*a),
                            WireguardAllowedIpAttr::Cidr(c) => cidr = *c,
                            _ => {}
                        }
                    }
                    ips.extend(addr.and_then(|a| IpNet::new(a, cidr).ok()));
                }
            }
            _ => {}
        }
    }
    let public_key = key?;
    // Keyed by the one host address allowed; a peer otherwise shaped is
    // keyed so that it matches no endpoint (the unspecified address).
    let ip = match ips.as_slice() {
        [one] if one.prefix_len() == one.max_prefix_len() => one.addr(),
        _ => IpAddr::from([0u8; 4]),
    };
    Some((ip, WireguardPeerSpec { public_key, port }))
}

fn get_device(ifname: &str) -> io::Result<Vec<GenlMessage<WireguardMessage>>> {
    let (mut sock, id) = socket()?;
    let ask =
        WireguardMessage { cmd: WireguardCmd::GetDevice, attributes: vec![WireguardAttribute::IfName(ifname.into())] };
    let mut msg = GenlMessage::from_payload(ask);
    msg.set_resolved_family_id(id);
    sock.dump(msg)
}

/// The peers of `ifname` as the kernel has them.
pub(crate) fn peers(ifname: &str) -> io::Result<Vec<PeerState>> {
    let answers = get_device(ifname)?;
    Ok(answers.iter().flat_map(|m| m.payload.attributes.iter()).flat_map(peer_states).collect())
}

fn peer_states(a: &WireguardAttribute) -> Vec<PeerState> {
    let WireguardAttribute::Peers(peers) = a else { return Vec::new() };
    peers
        .iter()
        .map(|p| {
            let mut s = PeerState::default();
            for attr in p.0.iter() {
                match attr {
                    WireguardPeerAttribute::PublicKey(k) => s.key = Some(PublicKey(*k)),
                    WireguardPeerAttribute::Endpoint(e) => s.endpoint = Some(*e),
                    WireguardPeerAttribute::LastHandshake(t) => s.last_handshake_s = t.seconds,
                    WireguardPeerAttribute::RxBytes(n) => s.rx_bytes = *n,
                    WireguardPeerAttribute::TxBytes(n) => s.tx_bytes = *n,
                    _ => {}
                }
            }
            s
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::{Emitable, ParseableParametrized};
    use netlink_packet_generic::GenlHeader;

    use super::*;

    #[test]
    fn the_set_message_carries_the_key_port_mark_and_peers_and_parses_back() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("a.key");
        std::fs::write(&path, "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let key = crate::keys::read_private_key(&crate::keys::KeySource::File(path), None).unwrap();
        let b1 = PublicKey::parse("HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=").unwrap();
        let gone = PublicKey([7; 32]);
        let ep: IpAddr = "198.51.100.11".parse().unwrap();
        let spec = WireguardSpec {
            port: 51820,
            fwmark: 0x686d_7767,
            mtu: 1440,
            key: Some(DeviceKey::of(key.clone())),
            peers: [(ep, WireguardPeerSpec { public_key: b1, port: 51900 })].into(),
            up: true,
        };
        let msg = set_message("hm-wg0", &key, &spec, &[gone]);
        let mut buf = vec![0u8; msg.buffer_len()];
        msg.emit(&mut buf);
        let header = GenlHeader { cmd: WireguardCmd::SetDevice.into(), version: 1 };
        let back = WireguardMessage::parse_with_param(&buf[..], header).unwrap();
        assert_eq!(back, msg);
        assert!(back.attributes.contains(&WireguardAttribute::ListenPort(51820)));
        assert!(back.attributes.contains(&WireguardAttribute::Fwmark(0x686d_7767)));
        let WireguardAttribute::Peers(peers) = &back.attributes[4] else { panic!("peers expected") };
        assert_eq!(peer_spec(&peers[0]), Some((ep, WireguardPeerSpec { public_key: b1, port: 51900 })));
        assert!(peers[1].0.contains(&WireguardPeerAttribute::Flags(WireguardPeerFlags::RemoveMe)));
        assert_eq!(
            peer_states(&back.attributes[4])[0],
            PeerState { key: Some(b1), endpoint: Some(SocketAddr::new(ep, 51900)), ..Default::default() }
        );
        let debug = format!("{spec:?}{}", serde_json::to_string(&spec).unwrap());
        assert!(!debug.contains("yAnz5TF"), "the private key shows in {debug}");
    }
}
