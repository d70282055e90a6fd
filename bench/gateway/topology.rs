//! The two sites of the test kit (`hm_testkit::sites`, IPv4 underlay),
//! carried one of four ways:
//!
//! - hostmesh: every host runs hostmesh with the kit's configs (members
//!   and gateways of VNI 7001);
//! - kernel VXLAN: point-to-point VXLAN devices per hop (VNIs 7001-7003,
//!   172.16.x.0/30 inside) and routes, forwarding on the gateways;
//! - hostmesh encrypted: as hostmesh, the gateways' peers encrypted
//!   (`encryption = "wireguard"`, `hm-wg0`);
//! - kernel WireGuard: as kernel VXLAN, but the WAN hop a hand-configured
//!   WireGuard link (`ip link add … type wireguard`, `wg set`) instead of
//!   VXLAN.

use std::time::Duration;

use hm_bench::load::{EchoServers, Sink};
use hm_bench::options::Options;
use hm_testkit::sites::{self, UNDERLAY_V4, VXLAN_PORT};
use hm_testkit::{Daemon, DaemonOptions, Netns, TempDir};

pub use hm_testkit::sites::{MA_WORKLOAD, MB_WORKLOAD};
pub const ECHO_PORT: u16 = 8080;
pub const SINK_PORT: u16 = 9000;

/// WireGuard's port on both gateways, either way.
const WG_PORT: u16 = 51820;
/// The MTU `wg-quick` gives a WireGuard link over a 1500-byte underlay.
const WG_MTU: &str = "1420";

#[derive(Clone, Copy, PartialEq)]
pub enum Way {
    Hostmesh,
    KernelVxlan,
    HostmeshEncrypted,
    KernelWireguard,
}

impl Way {
    pub fn label(self) -> &'static str {
        match self {
            Way::Hostmesh => "hostmesh",
            Way::KernelVxlan => "kernel VXLAN",
            Way::HostmeshEncrypted => "hostmesh encrypted",
            Way::KernelWireguard => "kernel WireGuard",
        }
    }
}

/// Field order is drop order: servers and daemons before their namespaces.
pub struct Sites {
    _servers: (EchoServers, Sink),
    _daemons: Vec<Daemon>,
    _dirs: Vec<TempDir>,
    pub ma: Netns,
    _ga: Netns,
    _gb: Netns,
    _mb: Netns,
}

impl Sites {
    /// The hosts carried `way`, with echo servers of `threads` threads
    /// and a sink on B's member.
    pub fn build(way: Way, o: &Options, threads: usize) -> Sites {
        let (ma, ga, gb, mb) = (Netns::new(), Netns::new(), Netns::new(), Netns::new());
        sites::wire(&UNDERLAY_V4, [&ma, &ga, &gb, &mb]);
        let hosts = [&ma, &ga, &gb, &mb];
        let (daemons, dirs) = match way {
            Way::Hostmesh => hostmesh(o, hosts, false),
            Way::HostmeshEncrypted => hostmesh(o, hosts, true),
            Way::KernelVxlan => (Vec::new(), vec![kernel_routes(hosts, Wan::Vxlan)]),
            Way::KernelWireguard => (Vec::new(), vec![kernel_routes(hosts, Wan::Wireguard)]),
        };
        let echo_addr = format!("{MB_WORKLOAD}:{ECHO_PORT}").parse().unwrap();
        let servers = (
            EchoServers::with_threads(&mb, echo_addr, echo_addr, threads),
            Sink::start(&mb, format!("{MB_WORKLOAD}:{SINK_PORT}").parse().unwrap()),
        );
        Sites { _servers: servers, _daemons: daemons, _dirs: dirs, ma, _ga: ga, _gb: gb, _mb: mb }
    }
}

/// Four daemons with the kit's configs; with `encrypted`, each gateway
/// has a key pair of its own and knows the other's public key.
fn hostmesh(o: &Options, hosts: [&Netns; 4], encrypted: bool) -> (Vec<Daemon>, Vec<TempDir>) {
    let configs = hosts.into_iter().zip(sites::configs(&UNDERLAY_V4, ""));
    let keys = encrypted.then(|| [KeyPair::new(hosts[1]), KeyPair::new(hosts[2])]);
    let mut daemons = Vec::new();
    let mut dirs = Vec::new();
    for (i, (ns, mut config)) in configs.enumerate() {
        let dir = TempDir::new("hm-bench-gw");
        if let (Some(keys), 1 | 2) = (&keys, i) {
            let (own, peer) = if i == 1 { (&keys[0], &keys[1]) } else { (&keys[1], &keys[0]) };
            config = sites::encrypt(&config, &own.write_in(&dir), &peer.public);
        }
        let opts = DaemonOptions::in_dir(o.hostmesh.to_str().unwrap(), &dir);
        opts.write_config("gateway.toml", &config);
        let d = Daemon::start(ns, &opts);
        d.wait_ready(Duration::from_secs(60));
        daemons.push(d);
        dirs.push(dir);
    }
    (daemons, dirs)
}

/// One point-to-point VXLAN device: `name` with VNI `vni` from `local` to
/// `remote` over `dev`, `inner` (a /30) inside.
fn p2p(ns: &Netns, name: &str, vni: u32, local: &str, remote: &str, dev: &str, inner: &str) {
    let (vni, port) = (vni.to_string(), VXLAN_PORT.to_string());
    ns.ip(&[
        "link", "add", name, "type", "vxlan", "id", &vni, "local", local, "remote", remote, "dstport", &port, "dev",
        dev,
    ]);
    ns.ip(&["link", "set", name, "mtu", "1450", "up"]);
    ns.ip(&["addr", "add", inner, "dev", name]);
}

/// The WAN hop of the hand-built topologies.
enum Wan {
    Vxlan,
    Wireguard,
}

/// The hand-built topology: point-to-point VXLAN from each member to its
/// gateway, `wan` between the gateways, plain routes; the dir holds the
/// WireGuard keys, if any.
fn kernel_routes([ma, ga, gb, mb]: [&Netns; 4], wan: Wan) -> TempDir {
    let dir = TempDir::new("hm-bench-gw-kernel");
    p2p(ma, "vx0", 7001, "192.0.2.20", "192.0.2.1", "eth0", "172.16.1.2/30");
    p2p(ga, "vxa", 7001, "192.0.2.1", "192.0.2.20", "a0", "172.16.1.1/30");
    match wan {
        Wan::Vxlan => {
            p2p(ga, "vxw", 7002, "198.51.100.1", "198.51.100.2", "wan", "172.16.2.1/30");
            p2p(gb, "vxw", 7002, "198.51.100.2", "198.51.100.1", "wan", "172.16.2.2/30");
        }
        Wan::Wireguard => {
            let (a, b) = (KeyPair::new(ga), KeyPair::new(gb));
            wireguard(ga, &a.write_in(&dir), &b.public, "198.51.100.2", "172.16.2.1/30");
            wireguard(gb, &b.write_in(&dir), &a.public, "198.51.100.1", "172.16.2.2/30");
        }
    }
    p2p(gb, "vxb", 7003, "203.0.113.1", "203.0.113.20", "b0", "172.16.3.1/30");
    p2p(mb, "vx0", 7003, "203.0.113.20", "203.0.113.1", "eth0", "172.16.3.2/30");
    ma.ip(&["route", "add", "10.20.0.0/16", "via", "172.16.1.1"]);
    ga.ip(&["route", "add", "10.20.0.0/16", "via", "172.16.2.2"]);
    ga.ip(&["route", "add", "10.10.1.0/24", "via", "172.16.1.2"]);
    gb.ip(&["route", "add", "10.10.0.0/16", "via", "172.16.2.1"]);
    gb.ip(&["route", "add", "10.20.1.0/24", "via", "172.16.3.2"]);
    mb.ip(&["route", "add", "10.10.0.0/16", "via", "172.16.3.1"]);
    for gw in [ga, gb] {
        gw.set_sysctl("net/ipv4/ip_forward", "1");
    }
    dir
}

/// A hand-configured WireGuard link `wg0` as an operator makes one with
/// Debian's wireguard-tools: one peer at `remote`, every address allowed
/// through it, `inner` (a /30) inside.
fn wireguard(ns: &Netns, key_file: &str, peer_public: &str, remote: &str, inner: &str) {
    let (port, endpoint) = (WG_PORT.to_string(), format!("{remote}:{WG_PORT}"));
    ns.ip(&["link", "add", "wg0", "type", "wireguard"]);
    let device = ["set", "wg0", "listen-port", &port, "private-key", key_file];
    let peer = ["peer", peer_public, "endpoint", &endpoint, "allowed-ips", "0.0.0.0/0"];
    ns.exec("wg", &[&device[..], &peer[..]].concat());
    ns.ip(&["link", "set", "wg0", "mtu", WG_MTU, "up"]);
    ns.ip(&["addr", "add", inner, "dev", "wg0"]);
}

/// A WireGuard key pair from `wg genkey` and `wg pubkey`.
struct KeyPair {
    private: String,
    public: String,
}

impl KeyPair {
    /// Made by `wg` run in `ns`.
    fn new(ns: &Netns) -> KeyPair {
        let private = ns.exec("wg", &["genkey"]).trim().to_string();
        let public = ns.exec_with_input("wg", &["pubkey"], &private).trim().to_string();
        KeyPair { private, public }
    }

    /// Writes the private key under `dir` as hostmesh trusts it; its path.
    fn write_in(&self, dir: &TempDir) -> String {
        let name = format!("{}.key", &self.public[..8].replace(['/', '+'], "_"));
        hm_testkit::sites::install_private_key(dir.path(), &name, &self.private)
    }
}
