//! The namespaces of bench/external and the systems under test on its
//! host: hostmesh, iptables rules, an nftables ruleset.

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use hm_bench::load::{EchoServers, Sink};
use hm_testkit::{Cgroup, Daemon, DaemonOptions, Netns, TempDir};

use super::vip;

/// The host under test, on the client's side.
pub const HOST: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
pub const CLIENT: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);
/// The client's address towards the plain router.
pub const CLIENT_CLEAN: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
/// The backend namespace, behind the host and behind the plain router.
pub const BACKEND: Ipv4Addr = Ipv4Addr::new(192, 168, 10, 11);
pub const BACKEND_FAR: Ipv4Addr = Ipv4Addr::new(192, 168, 20, 11);
/// A namespace behind a veth of the host ("local").
pub const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
pub const TCP_PORT: u16 = 8080;
pub const UDP_PORT: u16 = 5353;
pub const SINK_PORT: u16 = 9000;
pub const NODE_PORT_TCP: u16 = 30080;
pub const NODE_PORT_UDP: u16 = 30053;
pub const LOCAL_PORT_TCP: u16 = 30081;
pub const LOCAL_PORT_UDP: u16 = 30054;
pub const BULK_VIP: Ipv4Addr = Ipv4Addr::new(10, 95, 0, 1);

/// Field order is drop order: servers first.
pub struct Topology {
    _servers: (EchoServers, EchoServers, Sink),
    pub client: Netns,
    pub host: Netns,
    _router: Netns,
    _backend: Netns,
    _local: Netns,
}

impl Topology {
    pub fn new(server_threads: usize) -> Topology {
        let (client, host, router, backend, local) =
            (Netns::new(), Netns::new(), Netns::new(), Netns::new(), Netns::new());
        client.veth_to(&host, ("eth0", "192.0.2.2/24"), ("ext0", "192.0.2.1/24"));
        client.veth_to(&router, ("eth1", "198.18.0.2/24"), ("eth0", "198.18.0.1/24"));
        host.veth_to(&backend, ("eth0", "192.168.10.1/24"), ("eth0", "192.168.10.11/24"));
        router.veth_to(&backend, ("eth1", "192.168.20.1/24"), ("eth1", "192.168.20.11/24"));
        host.veth_to(&local, ("vm0", "10.77.0.1/24"), ("eth0", "10.77.0.2/24"));
        // The client routes VIPs to the host (a router would announce them),
        // the far backend to the plain router.
        client.ip(&["route", "add", "10.0.0.0/8", "via", "192.0.2.1"]);
        client.ip(&["route", "add", "192.168.20.0/24", "via", "198.18.0.1"]);
        backend.ip(&["route", "add", "198.18.0.0/24", "via", "192.168.20.1"]);
        local.ip(&["route", "add", "default", "via", "10.77.0.1"]);
        for ns in [&host, &router] {
            ns.set_sysctl("net/ipv4/ip_forward", "1");
        }
        // Short-lived connections by the hundred thousand: reuse ports.
        for ns in [&client, &backend, &local] {
            ns.set_sysctl("net/ipv4/tcp_tw_reuse", "1");
            ns.set_sysctl("net/ipv4/ip_local_port_range", "1024 65000");
        }
        let any = |port| SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), port);
        let servers = (
            EchoServers::with_threads(&backend, any(TCP_PORT), any(UDP_PORT), server_threads),
            EchoServers::with_threads(&local, any(TCP_PORT), any(UDP_PORT), server_threads),
            Sink::start(&backend, any(SINK_PORT)),
        );
        Topology { _servers: servers, client, host, _router: router, _backend: backend, _local: local }
    }
}

/// hostmesh on the host: `n` external VIPs (TCP :80 and UDP :53 each) to
/// the backend behind it, the "snat" and "local" node ports, the bulk VIP.
pub struct Hostmesh {
    opts: DaemonOptions,
    daemon: Option<Daemon>,
    _cgroup: Cgroup,
    _dir: TempDir,
}

impl Hostmesh {
    pub fn start(ns: &Netns, bin: &Path, n: usize) -> Hostmesh {
        let dir = TempDir::new("hm-bench-ext");
        let cgroup = Cgroup::new();
        let opts = DaemonOptions::in_dir(bin.to_str().unwrap(), &dir);
        // 251-slot tables: the size does not change a packet's cost.
        opts.write_config(
            "00-daemon.toml",
            &format!(
                "[daemon]\ncgroup = \"{}\"\nconnect_time_lb = \"all\"\nhost_interfaces = [\"ext0\", \"eth0\"]\n\
                 maglev_table_size = 251\nmetrics_listen = \"off\"\n",
                cgroup.path().display()
            ),
        );
        opts.write_config("services.toml", &services(n));
        let d = Daemon::start(ns, &opts);
        d.wait_ready(Duration::from_secs(300));
        Hostmesh { opts, daemon: Some(d), _cgroup: cgroup, _dir: dir }
    }
}

impl Drop for Hostmesh {
    fn drop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            d.stop(Duration::from_secs(120));
        }
        // The next system finds the host as it was.
        let mut args = vec!["teardown".to_string()];
        args.extend(self.opts.path_args());
        let _ = std::process::Command::new(&self.opts.bin)
            .args(&args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

fn services(n: usize) -> String {
    let backend = |port| format!("{BACKEND}:{port}");
    let mut s = String::new();
    for i in 0..n {
        let v = vip(i);
        let _ = write!(
            s,
            "[[service]]\nname = \"t{i}\"\nvip = \"{v}\"\nport = 80\nbackends = [\"{}\"]\nexternal = true\n\n\
             [[service]]\nname = \"u{i}\"\nvip = \"{v}\"\nport = 53\nprotocol = \"udp\"\nbackends = [\"{}\"]\nexternal = true\n\n",
            backend(TCP_PORT),
            backend(UDP_PORT)
        );
    }
    let local = |port| format!("{LOCAL}:{port}");
    let _ = write!(
        s,
        "[[service]]\nname = \"np\"\nvip = \"10.96.0.1\"\nport = 80\nbackends = [\"{}\"]\nnode_port = {NODE_PORT_TCP}\n\n\
         [[service]]\nname = \"npu\"\nvip = \"10.96.0.1\"\nport = 53\nprotocol = \"udp\"\nbackends = [\"{}\"]\nnode_port = {NODE_PORT_UDP}\n\n\
         [[service]]\nname = \"loc\"\nvip = \"10.96.0.2\"\nport = 80\nbackends = [\"{}\", \"{}\"]\nnode_port = {LOCAL_PORT_TCP}\nexternal_policy = \"local\"\n\n\
         [[service]]\nname = \"locu\"\nvip = \"10.96.0.2\"\nport = 53\nprotocol = \"udp\"\nbackends = [\"{}\", \"{}\"]\nnode_port = {LOCAL_PORT_UDP}\nexternal_policy = \"local\"\n\n\
         [[service]]\nname = \"bulk\"\nvip = \"{BULK_VIP}\"\nport = {SINK_PORT}\nbackends = [\"{}\"]\nexternal = true\n",
        backend(TCP_PORT),
        backend(UDP_PORT),
        backend(TCP_PORT),
        local(TCP_PORT),
        backend(UDP_PORT),
        local(UDP_PORT),
        backend(SINK_PORT)
    );
    s
}

/// DNAT + masquerade in the kernel's netfilter on the host.
#[derive(Clone, Copy)]
pub enum Netfilter {
    Iptables,
    Nftables,
}

/// Rules in place; dropping it removes them.
pub struct Installed<'a> {
    ns: &'a Netns,
    kind: Netfilter,
}

impl Netfilter {
    pub fn install(self, ns: &Netns, n: usize) -> Installed<'_> {
        match self {
            Netfilter::Iptables => {
                ns.exec_with_input("iptables-restore", &[], &iptables_rules(n));
            }
            Netfilter::Nftables => {
                ns.exec_with_input("nft", &["-f", "-"], &format!("flush ruleset\n{}", nftables_ruleset(n)));
            }
        }
        // Kernel conntrack must not fill up with the run's closed flows.
        for (k, v) in
            [("net/netfilter/nf_conntrack_tcp_timeout_time_wait", "1"), ("net/netfilter/nf_conntrack_udp_timeout", "1")]
        {
            if ns.sysctl(k).is_some() {
                ns.set_sysctl(k, v);
            }
        }
        Installed { ns, kind: self }
    }
}

impl Drop for Installed<'_> {
    fn drop(&mut self) {
        match self.kind {
            Netfilter::Iptables => {
                self.ns.exec("iptables", &["-t", "nat", "-F"]);
            }
            Netfilter::Nftables => {
                self.ns.exec("nft", &["flush", "ruleset"]);
            }
        }
    }
}

/// The kube-proxy iptables shape: one DNAT rule per service and protocol
/// in PREROUTING, masquerade towards the backends.
fn iptables_rules(n: usize) -> String {
    let mut s = String::from("*nat\n:PREROUTING ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n");
    for i in 0..n {
        let v = vip(i);
        let _ = writeln!(
            s,
            "-A PREROUTING -d {v}/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination {BACKEND}:{TCP_PORT}"
        );
        let _ = writeln!(
            s,
            "-A PREROUTING -d {v}/32 -p udp -m udp --dport 53 -j DNAT --to-destination {BACKEND}:{UDP_PORT}"
        );
    }
    s.push_str("-A POSTROUTING -o eth0 -j MASQUERADE\nCOMMIT\n");
    s
}

/// The kube-proxy nftables shape: a verdict-free map from (VIP, port) to
/// the backend, one lookup per new flow; masquerade towards the backends.
fn nftables_ruleset(n: usize) -> String {
    let elems = |port: u16, to: u16| -> String {
        (0..n).map(|i| format!("{} . {port} : {BACKEND} . {to}", vip(i))).collect::<Vec<_>>().join(", ")
    };
    format!(
        "table ip hmbench {{\n\
         map svc_tcp {{ type ipv4_addr . inet_service : ipv4_addr . inet_service; elements = {{ {} }} }}\n\
         map svc_udp {{ type ipv4_addr . inet_service : ipv4_addr . inet_service; elements = {{ {} }} }}\n\
         chain pre {{ type nat hook prerouting priority -100; policy accept;\n\
           meta l4proto tcp dnat ip to ip daddr . tcp dport map @svc_tcp\n\
           meta l4proto udp dnat ip to ip daddr . udp dport map @svc_udp\n\
         }}\n\
         chain post {{ type nat hook postrouting priority 100; policy accept;\n           oifname \"eth0\" masquerade\n         }}\n}}\n",
        elems(80, TCP_PORT),
        elems(53, UDP_PORT)
    )
}
