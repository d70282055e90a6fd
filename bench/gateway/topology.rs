//! The two sites of the test kit (`hm_testkit::sites`, IPv4 underlay),
//! carried either way:
//!
//! - hostmesh: every host runs hostmesh with the kit's configs (members
//!   and gateways of VNI 7001);
//! - kernel VXLAN: point-to-point VXLAN devices per hop (VNIs 7001-7003,
//!   172.16.x.0/30 inside) and routes, forwarding on the gateways.

use std::time::Duration;

use hm_bench::load::EchoServers;
use hm_bench::options::Options;
use hm_testkit::sites::{self, UNDERLAY_V4, VXLAN_PORT};
use hm_testkit::{Daemon, DaemonOptions, Netns, TempDir};

use crate::sink::Sink;

pub use hm_testkit::sites::{MA_WORKLOAD, MB_WORKLOAD};
pub const ECHO_PORT: u16 = 8080;
pub const SINK_PORT: u16 = 9000;

#[derive(Clone, Copy, PartialEq)]
pub enum Way {
    Hostmesh,
    KernelVxlan,
}

impl Way {
    pub fn label(self) -> &'static str {
        match self {
            Way::Hostmesh => "hostmesh",
            Way::KernelVxlan => "kernel VXLAN",
        }
    }
}

/// Field order is drop order: servers and daemons before their namespaces.
pub struct Sites {
    pub way: Way,
    _servers: (EchoServers, Sink),
    _daemons: Vec<Daemon>,
    _dirs: Vec<TempDir>,
    pub ma: Netns,
    _ga: Netns,
    _gb: Netns,
    _mb: Netns,
}

impl Sites {
    pub fn build(way: Way, o: &Options) -> Sites {
        let (ma, ga, gb, mb) = (Netns::new(), Netns::new(), Netns::new(), Netns::new());
        sites::wire(&UNDERLAY_V4, [&ma, &ga, &gb, &mb]);
        let (daemons, dirs) = match way {
            Way::Hostmesh => hostmesh(o, [&ma, &ga, &gb, &mb]),
            Way::KernelVxlan => {
                kernel_vxlan([&ma, &ga, &gb, &mb]);
                (Vec::new(), Vec::new())
            }
        };
        let echo_addr = format!("{MB_WORKLOAD}:{ECHO_PORT}").parse().unwrap();
        let servers = (
            EchoServers::start(&mb, echo_addr, echo_addr),
            Sink::start(&mb, format!("{MB_WORKLOAD}:{SINK_PORT}").parse().unwrap()),
        );
        Sites { way, _servers: servers, _daemons: daemons, _dirs: dirs, ma, _ga: ga, _gb: gb, _mb: mb }
    }
}

fn hostmesh(o: &Options, hosts: [&Netns; 4]) -> (Vec<Daemon>, Vec<TempDir>) {
    let configs = hosts.into_iter().zip(sites::configs(&UNDERLAY_V4, ""));
    let mut daemons = Vec::new();
    let mut dirs = Vec::new();
    for (ns, config) in configs {
        let dir = TempDir::new("hm-bench-gw");
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

fn kernel_vxlan([ma, ga, gb, mb]: [&Netns; 4]) {
    p2p(ma, "vx0", 7001, "192.0.2.20", "192.0.2.1", "eth0", "172.16.1.2/30");
    p2p(ga, "vxa", 7001, "192.0.2.1", "192.0.2.20", "a0", "172.16.1.1/30");
    p2p(ga, "vxw", 7002, "198.51.100.1", "198.51.100.2", "wan", "172.16.2.1/30");
    p2p(gb, "vxw", 7002, "198.51.100.2", "198.51.100.1", "wan", "172.16.2.2/30");
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
}
