//! Two sites with two gateways each: the topology of the failover tests
//! (tests/integration/failover.rs) and of `bench/run failover`.
//!
//! ```text
//!  site A LAN 192.0.2.0/24          WAN 198.51.100.0/24          site B LAN 203.0.113.0/24
//!  member ma .20 ─┐              ┌─ ga1 .1      gb1 .11 ─┐              ┌─ mb .20
//!                 ├─ [lan-a] ────┤                       ├── [lan-b] ───┤
//!  ga1 .1, ga2 .2 ┘              └─ ga2 .2      gb2 .12 ─┘              └─ gb1 .1, gb2 .2
//!                   ga1, ga2, gb1, gb2 all on [wan]
//! ```
//!
//! Each bracket is a bridge in one switch namespace; a gateway has a LAN
//! link (`lan`) and a WAN link (`wan`), a member one link (`eth0`). Every
//! list of gateways is in the order 1, 2. Workloads are on the members'
//! loopback: 10.10.1.1 (site A, 10.10.0.0/16) and 10.20.1.1 (site B).

use crate::Netns;

pub const VNI: u32 = 7002;
pub const VXLAN_PORT: u16 = 8472;
pub const MA_WORKLOAD: &str = "10.10.1.1";
pub const MB_WORKLOAD: &str = "10.20.1.1";

pub const MA: &str = "192.0.2.20";
pub const GA: [(&str, &str); 2] = [("192.0.2.1", "198.51.100.1"), ("192.0.2.2", "198.51.100.2")];
pub const GB: [(&str, &str); 2] = [("203.0.113.1", "198.51.100.11"), ("203.0.113.2", "198.51.100.12")];
pub const MB: &str = "203.0.113.20";

/// The six hosts and the switch between them.
pub struct Hosts<'a> {
    pub switch: &'a Netns,
    pub ma: &'a Netns,
    pub ga: [&'a Netns; 2],
    pub gb: [&'a Netns; 2],
    pub mb: &'a Netns,
}

/// Wires the hosts: bridges in the switch, a veth per host link, the
/// workload addresses.
pub fn wire(h: &Hosts) {
    h.switch.ip_batch(&[
        &["link", "add", "lan-a", "type", "bridge"],
        &["link", "add", "wan", "type", "bridge"],
        &["link", "add", "lan-b", "type", "bridge"],
        &["link", "set", "lan-a", "up"],
        &["link", "set", "wan", "up"],
        &["link", "set", "lan-b", "up"],
    ]);
    let mut n = 0;
    let mut plug = |host: &Netns, dev: &str, addr: &str, bridge: &str| {
        n += 1;
        let port = format!("p{n}");
        let out = std::process::Command::new("ip")
            .args(["-n", host.name(), "link", "add", dev, "type", "veth", "peer", "name", &port, "netns"])
            .arg(h.switch.name())
            .output()
            .expect("spawn ip");
        assert!(out.status.success(), "veth {dev}: {}", String::from_utf8_lossy(&out.stderr));
        host.ip_batch(&[&["addr", "add", &format!("{addr}/24"), "dev", dev], &["link", "set", dev, "up"]]);
        h.switch.ip_batch(&[&["link", "set", &port, "master", bridge], &["link", "set", &port, "up"]]);
    };
    plug(h.ma, "eth0", MA, "lan-a");
    plug(h.mb, "eth0", MB, "lan-b");
    for (host, (lan, wan)) in h.ga.iter().zip(GA) {
        plug(host, "lan", lan, "lan-a");
        plug(host, "wan", wan, "wan");
    }
    for (host, (lan, wan)) in h.gb.iter().zip(GB) {
        plug(host, "lan", lan, "lan-b");
        plug(host, "wan", wan, "wan");
    }
    h.ma.ip(&["addr", "add", &format!("{MA_WORKLOAD}/32"), "dev", "lo"]);
    h.mb.ip(&["addr", "add", &format!("{MB_WORKLOAD}/32"), "dev", "lo"]);
}

/// The gateway configs: `[ma, ga1, ga2, gb1, gb2, mb]`; `probes` goes into
/// every `[gateway]` (e.g. `probe_interval = "200ms"`).
pub fn configs(probes: &str) -> [String; 6] {
    let gateway = |local: &str, peer: &str, remote: [(&str, &str); 2], member: &str, member_cidr: &str, cidr: &str| {
        format!(
            "[gateway]\nrole = \"gateway\"\nlocal_ip = \"{local}\"\nvni = {VNI}\nudp_port = {VXLAN_PORT}\n{probes}\n\
             [[peer]]\nname = \"{peer}\"\nendpoints = [\"{}\", \"{}\"]\ncidrs = [\"{cidr}\"]\n\
             [[member]]\nname = \"m\"\nendpoint = \"{member}\"\ncidrs = [\"{member_cidr}\"]\n",
            remote[0].1, remote[1].1
        )
    };
    let member = |local: &str, own: [(&str, &str); 2], peer: &str, cidr: &str| {
        format!(
            "[gateway]\nrole = \"member\"\nlocal_ip = \"{local}\"\ngateway_ips = [\"{}\", \"{}\"]\nvni = {VNI}\n\
             udp_port = {VXLAN_PORT}\n{probes}\n[[peer]]\nname = \"{peer}\"\ncidrs = [\"{cidr}\"]\n",
            own[0].0, own[1].0
        )
    };
    [
        member(MA, GA, "site-b", "10.20.0.0/16"),
        gateway(GA[0].1, "site-b", GB, MA, "10.10.1.0/24", "10.20.0.0/16"),
        gateway(GA[1].1, "site-b", GB, MA, "10.10.1.0/24", "10.20.0.0/16"),
        gateway(GB[0].1, "site-a", GA, MB, "10.20.1.0/24", "10.10.0.0/16"),
        gateway(GB[1].1, "site-a", GA, MB, "10.20.1.0/24", "10.10.0.0/16"),
        member(MB, GB, "site-a", "10.10.0.0/16"),
    ]
}

/// Kills a host as far as the network can tell: every link down.
pub fn cut(host: &Netns, links: &[&str]) {
    let cmds: Vec<Vec<&str>> = links.iter().map(|l| vec!["link", "set", l, "down"]).collect();
    let refs: Vec<&[&str]> = cmds.iter().map(Vec::as_slice).collect();
    host.ip_batch(&refs);
}

/// Brings a cut host back.
pub fn restore(host: &Netns, links: &[&str]) {
    let cmds: Vec<Vec<&str>> = links.iter().map(|l| vec!["link", "set", l, "up"]).collect();
    let refs: Vec<&[&str]> = cmds.iter().map(Vec::as_slice).collect();
    host.ip_batch(&refs);
}
