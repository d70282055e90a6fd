//! bench/services: request rates to a VIP through hostmesh (connect-time LB
//! and the bpfnat veth), iptables DNAT and nftables DNAT, each with 1, 1,000
//! and 10,000 services configured, against the same traffic sent straight
//! to the backend in the same topology. Absolute rates on these machines
//! are noise; the ratios are the result. Writes bench/RESULTS.md.
//!
//! Run it with `./bench/run services` (as root).

mod systems;

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;

use hm_testkit::{Cgroup, Netns};

use hm_bench::load::{catch_interrupts, interrupted, tcp_rate, udp_rate, EchoServers, Rate};
use hm_bench::options::Options;
use hm_bench::results::median;
use systems::*;

const ALL_SIZES: [usize; 3] = [1, 1000, 10000];

/// A client namespace wired to a backend namespace running echo servers.
struct Topology {
    _servers: EchoServers,
    client: Netns,
    _backend: Netns,
}

impl Topology {
    fn new() -> Topology {
        let client = Netns::new();
        let backend = Netns::new();
        client.veth_to(&backend, ("eth0", "192.168.10.1/24"), ("eth0", "192.168.10.11/24"));
        // One client address per path (see load::tcp_rate).
        for a in ["192.168.10.2/24", "192.168.10.3/24"] {
            client.ip(&["addr", "add", a, "dev", "eth0"]);
        }
        client.ip(&["route", "add", "default", "via", "192.168.10.11", "dev", "eth0"]);
        // Short-lived connections by the hundred thousand: reuse ports.
        client.set_sysctl("net/ipv4/tcp_tw_reuse", "1");
        client.set_sysctl("net/ipv4/ip_local_port_range", "1024 65000");
        backend.set_sysctl("net/ipv4/tcp_tw_reuse", "1");
        let servers = EchoServers::start(&backend, BACKEND_TCP.parse().unwrap(), BACKEND_UDP.parse().unwrap());
        Topology { _servers: servers, client, _backend: backend }
    }

    /// Kernel conntrack (iptables, nftables) must not fill up with the
    /// run's closed flows.
    fn short_conntrack_timeouts(&self) {
        for (k, v) in
            [("net/netfilter/nf_conntrack_tcp_timeout_time_wait", "1"), ("net/netfilter/nf_conntrack_udp_timeout", "1")]
        {
            if self.client.sysctl(k).is_some() {
                self.client.set_sysctl(k, v);
            }
        }
    }
}

#[derive(Debug, Clone)]
struct Row {
    path: &'static str,
    services: usize,
    tcp: (f64, f64),
    udp: (f64, f64),
    errors: u64,
}

impl Row {
    fn tcp_ratio(&self) -> f64 {
        self.tcp.1 / self.tcp.0
    }
    fn udp_ratio(&self) -> f64 {
        self.udp.1 / self.udp.0
    }
}

/// The client address of each path.
fn source(path: &str) -> IpAddr {
    match path {
        "direct" => "192.168.10.2",
        "hostmesh connect-time" => "192.168.10.3",
        "iptables DNAT, last service" => "192.168.10.3",
        _ => "192.168.10.1",
    }
    .parse()
    .unwrap()
}

/// Direct and through-the-system rates, interleaved rep by rep so drift
/// hits both alike; medians.
fn measure(t: &Topology, o: &Options, path: &'static str, services: usize) -> Row {
    measure_at(t, o, path, services, target(services))
}

fn measure_at(t: &Topology, o: &Options, path: &'static str, services: usize, vip: std::net::Ipv4Addr) -> Row {
    let direct_tcp: SocketAddr = BACKEND_TCP.parse().unwrap();
    let direct_udp: SocketAddr = BACKEND_UDP.parse().unwrap();
    let (via_tcp, via_udp) = (SocketAddr::V4(SocketAddrV4::new(vip, 80)), SocketAddr::V4(SocketAddrV4::new(vip, 53)));
    let mut samples: [Vec<f64>; 4] = Default::default();
    let mut errors = 0;
    for _ in 0..o.reps {
        let (direct, via) = (source("direct"), source(path));
        let runs: [Rate; 4] = [
            tcp_rate(&t.client, direct, direct_tcp, o.seconds),
            tcp_rate(&t.client, via, via_tcp, o.seconds),
            udp_rate(&t.client, direct, direct_udp, o.seconds),
            udp_rate(&t.client, via, via_udp, o.seconds),
        ];
        for (s, r) in samples.iter_mut().zip(runs) {
            s.push(r.per_sec);
            errors += r.errors;
        }
    }
    assert!(!interrupted(), "interrupted; cleaning up");
    let [dt, st, du, su] = samples.map(median);
    let row = Row { path, services, tcp: (dt, st), udp: (du, su), errors };
    eprintln!(
        "{path:<22} {services:>6} services: tcp {st:>8.0}/s ({:.3} x direct)  udp {su:>8.0}/s ({:.3} x direct)  errors {errors}",
        row.tcp_ratio(),
        row.udp_ratio()
    );
    row
}

/// Runs the bench process in a cgroup of its own (the connect-time
/// programs attach there) and moves it back on drop.
struct InCgroup {
    cgroup: Cgroup,
    original: PathBuf,
}

impl InCgroup {
    fn enter() -> InCgroup {
        let cgroup = Cgroup::new();
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let rel = own.lines().find_map(|l| l.strip_prefix("0::")).unwrap_or("/").trim_start_matches('/').to_string();
        let root = cgroup.path().parent().unwrap().to_path_buf();
        cgroup.add(std::process::id());
        InCgroup { cgroup, original: root.join(rel) }
    }
}

impl Drop for InCgroup {
    fn drop(&mut self) {
        let _ = std::fs::write(self.original.join("cgroup.procs"), std::process::id().to_string());
    }
}

fn main() {
    hm_testkit::require_root();
    catch_interrupts();
    let o = Options::parse(5, &["only-hostmesh"]);
    let cg = InCgroup::enter();
    let mut rows = Vec::new();
    let mut syncs = Vec::new();

    eprintln!("hostmesh ({}), {} s x {} reps per rate", o.hostmesh.display(), o.seconds.as_secs_f64(), o.reps);
    // --only-hostmesh 1,1000: a quick look at hostmesh alone, no results file.
    let only_hostmesh: Option<Vec<usize>> =
        o.extra.get("only-hostmesh").map(|v| v.split(',').map(|n| n.parse().expect("--only-hostmesh N,N")).collect());
    let sizes: Vec<usize> = only_hostmesh.clone().unwrap_or(ALL_SIZES.to_vec());
    {
        let t = Topology::new();
        for &n in &sizes {
            let hm = Hostmesh::start(&t.client, &o.hostmesh, cg.cgroup.path(), "all", n);
            syncs.push((n, "first sync, connect-time", hm.last_sync_ms()));
            rows.push(measure(&t, &o, "hostmesh connect-time", n));
            hm.switch_mode("off");
            syncs.push((n, "switch to the bpfnat veth", hm.last_sync_ms()));
            rows.push(measure(&t, &o, "hostmesh bpfnat veth", n));
        }
    }
    if only_hostmesh.is_some() {
        return;
    }
    {
        let t = Topology::new();
        for n in ALL_SIZES {
            t.client.exec_with_input("iptables-restore", &[], &iptables_rules(n));
            t.short_conntrack_timeouts();
            rows.push(measure(&t, &o, "iptables DNAT", n));
        }
        // The same 10,000, reaching the last service: the whole list walked.
        rows.push(measure_at(&t, &o, "iptables DNAT, last service", 10000, vip(9999)));
    }
    {
        let t = Topology::new();
        for n in ALL_SIZES {
            t.client.exec_with_input("nft", &["-f", "-"], &format!("flush ruleset\n{}", nftables_ruleset(n)));
            t.short_conntrack_timeouts();
            rows.push(measure(&t, &o, "nftables DNAT (map)", n));
        }
    }
    drop(cg);

    let report = report(&o, &rows, &syncs);
    println!("{report}");
    hm_bench::results::write_section(&o.out, "services", &report).expect("write results");
    eprintln!("wrote the services section of {}", o.out.display());
}

/// Why the netfilter rows' own ratios mislead, in the results.
const NETFILTER_NOTE: &str = "In the iptables and nftables rows the direct traffic goes through the same \
netfilter hooks: conntrack for every flow, and for iptables a walk of the whole rule list, since direct traffic \
matches no rule (hence a ratio above 1 at 10,000 rules: the direct connections walk all 20,000 rules, the VIP's \
half). Their × direct is therefore not a cost against a clean host; compare absolute rates across rows of this \
one run instead, as the last target does.";

fn find<'a>(rows: &'a [Row], path: &str, n: usize) -> &'a Row {
    rows.iter().find(|r| r.path == path && r.services == n).expect("measured")
}

fn report(o: &Options, rows: &[Row], syncs: &[(usize, &str, u64)]) -> String {
    let mut s = String::new();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let _ = writeln!(s, "## bench/services: service IPs\n");
    let _ = writeln!(s, "Command (as root): `./bench/run services`\n");
    let _ = writeln!(
        s,
        "One run on Linux {} with {} CPUs; {}; {}. Each rate is the median of {} runs of {} s, one client thread \
         (pinned to CPU 0, the servers to CPU 1); each ratio divides by the same traffic sent straight to the backend, \
         measured interleaved with it in the same topology from another client address (so NATed connections never \
         meet the server's TIME_WAIT of direct ones). The target is the middle service of the configured set (an iptables rule list is walked \
         halfway); one more row reaches the last of 10,000 iptables services. Absolute rates on these machines are noise; compare ratios.\n",
        kernel.trim(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        version("iptables", "-V"),
        version("nft", "-v"),
        o.reps,
        o.seconds.as_secs_f64()
    );
    let _ =
        writeln!(s, "| path | services | TCP connect+req/reply /s | × direct | UDP req/reply /s | × direct | errors |");
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {:.0} | {:.3} | {:.0} | {:.3} | {} |",
            r.path,
            r.services,
            r.tcp.1,
            r.tcp_ratio(),
            r.udp.1,
            r.udp_ratio(),
            r.errors
        );
    }
    let _ = writeln!(s, "\n{NETFILTER_NOTE}");
    let _ = writeln!(
        s,
        "\nhostmesh sync times in this run (each configured service is a TCP and a UDP service on one VIP):\n"
    );
    for (n, what, ms) in syncs {
        let _ = writeln!(s, "- {n} VIPs ({} services), {what}: {ms} ms", 2 * n);
    }
    let _ = writeln!(s, "\n### Targets\n");
    let check = |ok: bool| if ok { "met" } else { "MISSED" };
    let ctlb_min = ALL_SIZES
        .iter()
        .map(|&n| find(rows, "hostmesh connect-time", n))
        .map(|r| r.tcp_ratio().min(r.udp_ratio()))
        .fold(f64::MAX, f64::min);
    let veth_min = ALL_SIZES
        .iter()
        .map(|&n| find(rows, "hostmesh bpfnat veth", n))
        .map(|r| r.tcp_ratio().min(r.udp_ratio()))
        .fold(f64::MAX, f64::min);
    let c10 = find(rows, "hostmesh connect-time", 10000);
    let i10 = find(rows, "iptables DNAT", 10000);
    let vs_ipt = c10.tcp.1 / i10.tcp.1;
    let vs_ipt_udp = c10.udp.1 / i10.udp.1;
    let _ = writeln!(s, "- connect-time ≥ 0.95 × direct: lowest ratio {ctlb_min:.3} — {}", check(ctlb_min >= 0.95));
    let _ = writeln!(s, "- bpfnat veth ≥ 0.8 × direct: lowest ratio {veth_min:.3} — {}", check(veth_min >= 0.8));
    let _ = writeln!(
        s,
        "- connect-time at 10,000 services ≥ 2 × iptables DNAT at 10,000 services: TCP {vs_ipt:.2}× ({}), UDP {vs_ipt_udp:.2}×",
        check(vs_ipt >= 2.0)
    );
    let last = find(rows, "iptables DNAT, last service", 10000);
    let us = |rate: f64| 1e6 / rate;
    let extra_us = us(i10.tcp.1) - us(c10.tcp.1);
    let _ = writeln!(
        s,
        "\nWhy the iptables ratio is what it is: a new connection to the middle of 10,000 services walks about \
         10,000 of the 20,000 rules (TCP and UDP) before its DNAT; here that adds {extra_us:.0} µs to a connection that \
         takes {:.0} µs through connect-time load balancing, about {:.1} ns per rule. Connect-time load balancing stays \
         flat ({:.3} × direct at 10,000 services). The ratio therefore depends on how much a connection costs on the \
         host: the rule walk is {:.0}% of the cost here. To the last service (the whole list) it is {:.2}×. UDP uses one \
         socket per run, one conntrack flow, so the rule walk happens once and the ratios there are about equal.",
        us(c10.tcp.1),
        extra_us * 1000.0 / 10_000.0,
        c10.tcp_ratio(),
        100.0 * extra_us / us(i10.tcp.1),
        c10.tcp.1 / last.tcp.1
    );
    s
}
