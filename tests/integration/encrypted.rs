//! Encrypted sites (README.md, "Encrypted peers"): the two gateways of
//! sites.rs joined through WireGuard. On a kernel with WireGuard (Debian's
//! in the kernel matrix's VMs) members talk over TCP and UDP, IPv4 and
//! IPv6 workloads, over an IPv6 underlay (failover.rs carries them
//! encrypted over IPv4), and the WAN carries nothing but WireGuard; a
//! wrong key gets nothing through; a restart, a peer removed by hand and a
//! key rotation keep a connection. On a kernel without it (this
//! development machine's) the peer is refused, status says why, and
//! nothing at all goes to its CIDRs.

use std::io::{BufRead, BufReader, Write};
use std::time::{Duration, Instant};

use base64::Engine as _;
use hm_testkit::capture::{Capture, Frame};
use hm_testkit::{scaled, wait_soon};

use crate::fixtures::*;
use crate::sites::*;

const WG_PORT: u16 = 51820;
/// The mark of WireGuard's own packets, which the steering into hm-wg0
/// lets pass (model/encryption.rs, WG_FWMARK).
const WG_FWMARK: u32 = 0x686d_7767;
/// B's gateway's WireGuard endpoint over `u`, as status shows it.
fn gb_endpoint(u: &Underlay) -> String {
    std::net::SocketAddr::new(u.gb_wan.parse().unwrap(), WG_PORT).to_string()
}
/// A's gateway's metrics, in its own namespace.
const METRICS: &str = "127.0.0.1:9853";
/// Bytes a member sends that must never show on the WAN.
const MARKER: &[u8] = b"hostmesh-plaintext-marker-7f3a";
/// What the WAN must never carry in clear: the marker, and the members'
/// workload addresses, IPv4 and IPv6 (inside VXLAN or not).
const SECRETS: [&[u8]; 5] = [
    MARKER,
    &[10, 10, 1, 1],
    &[10, 20, 1, 1],
    &[0xfd, 0x10, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
    &[0xfd, 0x20, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
];

/// A WireGuard key pair: the private key as `wg genkey` writes it, and
/// the public key as `wg pubkey` would print it.
pub struct KeyPair {
    pub private: String,
    pub public: String,
}

pub fn key_pair(seed: u8) -> KeyPair {
    let secret = [seed; 32];
    let public = x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from(secret));
    let b64 = base64::engine::general_purpose::STANDARD;
    KeyPair { private: b64.encode(secret), public: b64.encode(public.as_bytes()) }
}

/// Writes `key` as a host's private key, as an operator would.
pub fn install_key(host: &Host, key: &KeyPair) -> String {
    let dir = host.opts.state_dir.parent().expect("the host's dir");
    hm_testkit::sites::install_private_key(dir, "wg.key", &key.private)
}

/// Both sites over `u`, their gateways encrypted with key pairs `keys[0]`
/// (A) and `keys[1]` (B); B is told `b_knows_a` as A's public key.
fn encrypted_sites(u: &Underlay, keys: &[KeyPair; 2], b_knows_a: &str) -> Sites {
    // A resync every 2 s: drift is repaired soon.
    let daemon = format!("metrics_listen = \"{METRICS}\"\nresync_interval = \"2s\"");
    Sites::start_edited(u, &daemon, |name, host, text| match name {
        "ga" => hm_testkit::sites::encrypt(&text, &install_key(host, &keys[0]), &keys[1].public),
        "gb" => hm_testkit::sites::encrypt(&text, &install_key(host, &keys[1]), b_knows_a),
        _ => text,
    })
}

/// From A's member, one TCP connection to B's member's echo server that
/// carries `MARKER`, and its echo, each step within `timeout`; the
/// connection, kept.
fn marked_exchange(sites: &Sites, timeout: Duration) -> std::io::Result<BufReader<std::net::TcpStream>> {
    let stream = connect_from(&sites.ma.ns, MA_WORKLOAD, &format!("{MB_WORKLOAD}:{ECHO_PORT}"), timeout)?;
    let mut reader = BufReader::new(stream);
    let mut greeting = String::new();
    reader.read_line(&mut greeting)?;
    echo_once(&mut reader)?;
    Ok(reader)
}

/// One write of `MARKER` on a kept connection, and its echo.
fn echo_once(conn: &mut BufReader<std::net::TcpStream>) -> std::io::Result<()> {
    conn.get_mut().write_all(MARKER)?;
    let mut back = vec![0u8; MARKER.len()];
    std::io::Read::read_exact(conn, &mut back)?;
    if back != MARKER {
        return Err(std::io::Error::other("the echo differs"));
    }
    Ok(())
}

/// Nothing A's gateway shows holds its private key: not its log, status
/// (text and JSON), metrics, `explain` of a peer's address, or any file of
/// its state dir.
fn assert_no_key_material(sites: &Sites, key: &KeyPair) {
    let state = sites.ga.opts.state_dir.to_str().unwrap();
    let mut shown = vec![("log", sites.daemons[1].log_text())];
    shown.push(("status", sites.ga.status_text().0));
    let json = sites.ga.hostmesh(&["status", "--json", "--state-dir", state]);
    shown.push(("status --json", String::from_utf8_lossy(&json.stdout).into_owned()));
    let (_, metrics) = hm_testkit::http_get(&sites.ga.ns, METRICS.parse().unwrap(), "/metrics").expect("metrics");
    shown.push(("metrics", metrics));
    let mut explain = vec!["explain".to_string(), format!("{MB_WORKLOAD}:{ECHO_PORT}")];
    explain.extend(sites.ga.opts.path_args());
    let out = sites.ga.hostmesh(&explain.iter().map(String::as_str).collect::<Vec<_>>());
    shown
        .push(("explain", format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))));
    let raw = base64::engine::general_purpose::STANDARD.decode(&key.private).unwrap();
    for entry in walk(&sites.ga.opts.state_dir) {
        let bytes = std::fs::read(&entry).unwrap_or_default();
        assert!(!bytes.windows(raw.len()).any(|w| w == raw.as_slice()), "the raw key in {}", entry.display());
        shown.push(("state file", String::from_utf8_lossy(&bytes).into_owned()));
    }
    for (what, text) in shown {
        assert!(!text.contains(&key.private), "the private key shows in the {what}");
    }
}

/// Every file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = e.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

fn wan_summary(frames: &[Frame]) -> String {
    let dir = |f: &Frame| if f.outgoing { "out" } else { "in" };
    let mut ports: Vec<String> = frames.iter().map(|f| format!("{} {:?}/{:?}", dir(f), f.proto, f.ports)).collect();
    ports.sort();
    ports.dedup();
    ports.join(" ")
}

/// A's gateway's `hm-wg0`, by index (a device made again has another).
fn wg_index(sites: &Sites) -> Option<u64> {
    sites.ga.ns.ip_json(&["link", "show"]).iter().find(|l| l["ifname"] == "hm-wg0").and_then(|l| l["ifindex"].as_u64())
}

#[test]
fn encrypted_sites_talk_only_through_wireguard_and_without_it_nothing_reaches_the_peer() {
    let u = &UNDERLAY_V6;
    let keys = [key_pair(0x11), key_pair(0x22)];
    let sites = encrypted_sites(u, &keys, &keys[0].public);
    let capture = Capture::start(&sites.ga.ns, "wan", &SECRETS);
    if !kernel_has_wireguard() {
        // Fail closed: the peer is refused and says why; A's member is
        // refused at once; nothing goes to B's CIDRs, in clear or not
        // (the gateways' probes, VXLAN between their own addresses, carry
        // no workload's).
        let why = "encrypted (WireGuard) but the kernel lacks WireGuard devices (CONFIG_WIREGUARD): not applied";
        let warnings = sites.ga.status().warnings;
        assert!(warnings.iter().any(|w| w.starts_with(&format!("peer \"site-b\" is {why}"))), "{warnings:?}");
        let (text, _) = sites.ga.status_text();
        assert!(text.contains("missing wireguard"), "{text}");
        assert!(text.contains(&format!("peer     site-b   refused      10.20.0.0/16, fd20::/16: {why}")), "{text}");
        let refused = marked_exchange(&sites, scaled(Duration::from_secs(2)));
        assert!(refused.is_err(), "a member reached an encrypted peer with no WireGuard");
        assert!(udp_exchange(&sites.ma.ns, MA_WORKLOAD, &format!("{MB_WORKLOAD}:{ECHO_PORT}")).is_err());
        let frames = capture.take();
        let to_site = frames.iter().filter(|f| f.has_marker || f.ports.is_some_and(|(_, d)| d == ECHO_PORT));
        assert_eq!(to_site.count(), 0, "on the WAN: {}", wan_summary(&frames));
        assert_no_key_material(&sites, &keys[0]);
        return;
    }
    // Through: TCP and UDP, IPv4 and IPv6 workloads.
    let mut conn = marked_exchange(&sites, scaled(Duration::from_secs(2)))
        .unwrap_or_else(|e| panic!("TCP through WireGuard: {e}\n{}", sites.logs()));
    for (src, dst) in [(MA_WORKLOAD, MB_WORKLOAD), (MA_WORKLOAD6, MB_WORKLOAD6)] {
        let dst = if dst.contains(':') { format!("[{dst}]:{ECHO_PORT}") } else { format!("{dst}:{ECHO_PORT}") };
        let tcp = tcp_exchange(&sites.ma.ns, src, &dst, 4, 3000).unwrap_or_else(|e| panic!("TCP {src} -> {dst}: {e}"));
        assert_eq!(tcp.echoed, 12000);
        assert!(!udp_exchange(&sites.ma.ns, src, &dst)
            .unwrap_or_else(|e| panic!("UDP {src} -> {dst}: {e}"))
            .is_empty());
    }
    // The WAN carried WireGuard to and from its port and nothing else of
    // the sites': no VXLAN, no probe, no marker.
    let frames = capture.take();
    let ip: Vec<&Frame> = frames.iter().filter(|f| f.proto.is_some() && !f.is_link_housekeeping()).collect();
    assert!(ip.iter().any(|f| f.ports.is_some_and(|(_, d)| d == WG_PORT)), "{}", wan_summary(&frames));
    for f in &ip {
        assert!(
            f.proto == Some(17) && f.ports.is_some_and(|(s, d)| s == WG_PORT && d == WG_PORT) && !f.has_marker,
            "not WireGuard on the WAN: {f:?}; all: {}",
            wan_summary(&frames)
        );
    }

    // Status, live: the peer encrypted, its handshake and bytes.
    let (text, _) = sites.ga.status_text();
    assert!(text.contains("peer     site-b   up"), "{text}");
    assert!(text.contains(", encrypted (WireGuard)"), "{text}");
    let line = text.lines().find(|l| l.starts_with(&format!("  {}  key {}", gb_endpoint(u), keys[1].public)));
    let line = line.unwrap_or_else(|| panic!("no line for B's gateway in:\n{text}"));
    assert!(line.contains("last handshake") && !line.contains("received 0 B"), "{line}");
    let (_, metrics) = hm_testkit::http_get(&sites.ga.ns, METRICS.parse().unwrap(), "/metrics").expect("metrics");
    let sent = format!("hostmesh_wireguard_sent_bytes_total{{endpoint=\"{}\"}} ", u.gb_wan);
    let sent = metrics.lines().find_map(|l| l.strip_prefix(&sent)).unwrap_or_else(|| panic!("no {sent}in:\n{metrics}"));
    assert!(sent.trim().parse::<u64>().unwrap() > 0, "{sent}");
    assert_no_key_material(&sites, &keys[0]);

    // A restart adopts the device: same device, the connection goes on.
    let before = wg_index(&sites);
    assert!(before.is_some(), "no hm-wg0 on A's gateway");
    let mut sites = sites;
    sites.daemons[1].stop(scaled(Duration::from_secs(5)));
    sites.daemons[1] = sites.ga.start_ready();
    assert_eq!(wg_index(&sites), before, "the device was made again");
    echo_once(&mut conn).unwrap_or_else(|e| panic!("after the restart: {e}\n{}", sites.logs()));

    // Drift: B's peer removed by hand (`wg`, Debian's wireguard-tools)
    // is put back by the next resync, and the connection goes on.
    let peers = || sites.ga.ns.exec("wg", &["show", "hm-wg0", "peers"]);
    sites.ga.ns.exec("wg", &["set", "hm-wg0", "peer", &keys[1].public, "remove"]);
    wait_soon("B's peer back on hm-wg0", || peers().contains(&keys[1].public))
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", peers(), sites.logs()));
    echo_once(&mut conn).unwrap_or_else(|e| panic!("after the peer came back: {e}\n{}", sites.logs()));

    // Rotation: A's new key in place and B told its public key; the kept
    // connection resumes within 2 s of the writes.
    let new = key_pair(0x33);
    install_key(&sites.ga, &new);
    let gb_text = std::fs::read_to_string(sites.gb.opts.config_dir.join("gateway.toml")).unwrap();
    sites.gb.write("gateway.toml", &gb_text.replace(&keys[0].public, &new.public));
    let written = Instant::now();
    conn.get_ref().set_read_timeout(Some(scaled(Duration::from_secs(2)))).unwrap();
    echo_once(&mut conn).unwrap_or_else(|e| panic!("after the rotation: {e}\n{}", sites.logs()));
    let took = written.elapsed();
    assert!(took <= scaled(Duration::from_secs(2)), "resumed {took:?} after the rotation");
    assert!(capture.take().iter().all(|f| !f.has_marker), "the marker crossed in clear");

    // Clear VXLAN that claims to come from B's gateway is not B's: only
    // what came through hm-wg0 is taken from an encrypted peer.
    clear_vxlan_from_the_peer_is_dropped(&sites, u);
}

/// The port on A's member the VXLAN datagrams below are for.
const VXLAN_TEST_PORT: u16 = 7460;

/// A VXLAN datagram as a gateway of the sites sends one (test kit's VNI,
/// the inner frame to hm-tun0's MAC from its peers'), carrying a UDP
/// datagram from B's member to A's member's `VXLAN_TEST_PORT`.
fn vxlan_datagram(payload: &[u8]) -> Vec<u8> {
    let (src, dst): (std::net::Ipv4Addr, std::net::Ipv4Addr) =
        (MB_WORKLOAD.parse().unwrap(), MA_WORKLOAD.parse().unwrap());
    let mut d = vec![0x08, 0, 0, 0];
    d.extend_from_slice(&(VNI << 8).to_be_bytes());
    d.extend_from_slice(&[0x02, 0x68, 0x6d, 0, 1, 0, 0x02, 0x68, 0x6d, 0, 1, 1, 0x08, 0x00]);
    let total = (20 + 8 + payload.len()) as u16;
    let mut ip = vec![0x45, 0];
    ip.extend_from_slice(&total.to_be_bytes());
    ip.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0]);
    ip.extend_from_slice(&src.octets());
    ip.extend_from_slice(&dst.octets());
    let sum = ip.chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum::<u32>();
    let sum = (sum & 0xffff) + (sum >> 16);
    ip[10..12].copy_from_slice(&(!((sum & 0xffff) + (sum >> 16)) as u16).to_be_bytes());
    d.extend_from_slice(&ip);
    d.extend_from_slice(&40000u16.to_be_bytes());
    d.extend_from_slice(&VXLAN_TEST_PORT.to_be_bytes());
    d.extend_from_slice(&(total - 20).to_be_bytes());
    d.extend_from_slice(&[0, 0]);
    d.extend_from_slice(payload);
    d
}

/// From B's gateway, two VXLAN datagrams for A's member, from B's WAN
/// address to A's `local_ip`: the first with WireGuard's mark, so the
/// steering lets it leave in clear (as anyone on the WAN could forge it),
/// the second through hm-wg0. A's member gets the second, never the first.
fn clear_vxlan_from_the_peer_is_dropped(sites: &Sites, u: &Underlay) {
    use nix::sys::socket::{setsockopt, sockopt, SockType};
    const CLEAR: &[u8] = b"clear-vxlan-claiming-to-be-site-b";
    const SEALED: &[u8] = b"vxlan-through-wireguard";
    let rx = std::net::UdpSocket::from(
        bound_in(
            &sites.ma.ns,
            SockType::Datagram,
            std::net::SocketAddr::new(MA_WORKLOAD.parse().unwrap(), VXLAN_TEST_PORT),
        )
        .expect("a socket on A's member"),
    );
    let tx = |mark: Option<u32>| {
        let from = std::net::SocketAddr::new(u.gb_wan.parse().unwrap(), 0);
        let sock = std::net::UdpSocket::from(
            bound_in(&sites.gb.ns, SockType::Datagram, from).expect("a socket on B's gateway"),
        );
        if let Some(mark) = mark {
            setsockopt(&sock, sockopt::Mark, &mark).expect("SO_MARK");
        }
        sock
    };
    let to = std::net::SocketAddr::new(u.wan_local.parse().unwrap(), VXLAN_PORT);
    tx(Some(WG_FWMARK)).send_to(&vxlan_datagram(CLEAR), to).expect("send in clear");
    tx(None).send_to(&vxlan_datagram(SEALED), to).expect("send through hm-wg0");
    rx.set_read_timeout(Some(scaled(Duration::from_secs(2)))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    while !got.iter().any(|g: &Vec<u8>| g == SEALED) {
        let n =
            rx.recv(&mut buf).unwrap_or_else(|e| panic!("nothing through hm-wg0 ({e}); got {got:?}\n{}", sites.logs()));
        got.push(buf[..n].to_vec());
    }
    rx.set_nonblocking(true).unwrap();
    while let Ok(n) = rx.recv(&mut buf) {
        got.push(buf[..n].to_vec());
    }
    assert!(!got.iter().any(|g| g == CLEAR), "A's member got clear VXLAN claiming to be B's gateway");
}

#[test]
fn a_peer_told_the_wrong_public_key_gets_nothing_through() {
    let keys = [key_pair(0x44), key_pair(0x55)];
    let wrong = key_pair(0x66);
    let sites = encrypted_sites(&UNDERLAY_V4, &keys, &wrong.public);
    let capture = Capture::start(&sites.ga.ns, "wan", &SECRETS);
    // Half a second (scaled): the encrypted sites' test connects well
    // within it with the right keys.
    let crossed = marked_exchange(&sites, scaled(Duration::from_millis(500)));
    assert!(crossed.is_err(), "a connection crossed with a wrong key");
    let frames = capture.take();
    assert!(frames.iter().all(|f| !f.has_marker), "{}", wan_summary(&frames));
    if kernel_has_wireguard() {
        // Only WireGuard crossed, and no handshake ever completed.
        let clear = frames
            .iter()
            .filter(|f| f.proto.is_some() && !f.is_link_housekeeping() && f.ports != Some((WG_PORT, WG_PORT)));
        assert_eq!(clear.count(), 0, "{}", wan_summary(&frames));
        let (text, _) = sites.ga.status_text();
        let line = text.lines().find(|l| l.starts_with(&format!("  {}  key ", gb_endpoint(&UNDERLAY_V4))));
        assert!(line.is_some_and(|l| l.contains("no handshake yet")), "{text}");

        // A key file others may read is refused at the sync its change
        // wakes (the file is watched), naming the file and the fix.
        use std::os::unix::fs::PermissionsExt;
        let key = sites.ga.opts.state_dir.parent().unwrap().join("keys/wg.key");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let fix = format!(
            "private key {}: readable by group and others (mode 0644); fix: chmod 0600 {}",
            key.display(),
            key.display()
        );
        let said = || sites.ga.status().warnings.iter().any(|w| w.contains(&fix));
        wait_soon("the key refused", said).unwrap_or_else(|e| panic!("{e}: {:?}", sites.ga.status().warnings));
        let (text, _) = sites.ga.status_text();
        assert!(text.contains("peer     site-b   refused"), "{text}");
        assert_eq!(wg_index(&sites), None, "the device of a refused peer stays: {text}");
    }
}
