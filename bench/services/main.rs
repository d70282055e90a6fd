//! bench/services: request rates to a VIP through hostmesh (connect-time LB
//! and the bpfnat veth), iptables DNAT and nftables DNAT, each with 1, 1,000
//! and 10,000 services configured, against the same traffic sent straight
//! to the backend from a clean namespace, interleaved with it in slices
//! (`interleave`), with several client threads. Absolute rates on these
//! machines are noise; the ratios are the result. Writes bench/RESULTS.md.
//!
//! Run it with `./bench/run services` (as root).

mod systems;

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr, SocketAddrV4};

use hm_testkit::Netns;

use hm_bench::interleave::{self, Kind, Measured, Path, Plan, Spread};
use hm_bench::load::{catch_interrupts, interrupted, EchoServers, InCgroup};
use hm_bench::options::Options;
use hm_bench::progstats;
use systems::*;

const ALL_SIZES: [usize; 3] = [1, 1000, 10000];

/// The client address of VIP traffic, and of traffic from the same
/// namespace straight to the backend ("other traffic": what every
/// connection that is not to a service pays).
const VIA: &str = "192.168.10.1";
const OTHER: &str = "192.168.10.2";
/// The baseline: a namespace of its own with nothing installed, its own
/// veth to the same backend.
const CLEAN: &str = "192.168.20.1";

/// A client namespace (the system under test) and a clean one, both wired
/// to a backend namespace running echo servers.
struct Topology {
    _servers: EchoServers,
    client: Netns,
    clean: Netns,
    _backend: Netns,
}

impl Topology {
    fn new(server_threads: usize) -> Topology {
        let client = Netns::new();
        let clean = Netns::new();
        let backend = Netns::new();
        client.veth_to(&backend, ("eth0", "192.168.10.1/24"), ("eth0", "192.168.10.11/24"));
        client.ip(&["addr", "add", &format!("{OTHER}/24"), "dev", "eth0"]);
        client.ip(&["route", "add", "default", "via", "192.168.10.11", "dev", "eth0"]);
        clean.veth_to(&backend, ("eth0", "192.168.20.1/24"), ("eth1", "192.168.20.11/24"));
        clean.ip(&["route", "add", "default", "via", "192.168.20.11", "dev", "eth0"]);
        // Short-lived connections by the hundred thousand: reuse ports.
        for ns in [&client, &clean, &backend] {
            ns.set_sysctl("net/ipv4/tcp_tw_reuse", "1");
            ns.set_sysctl("net/ipv4/ip_local_port_range", "1024 65000");
        }
        let servers = EchoServers::with_threads(
            &backend,
            BACKEND_TCP.parse().unwrap(),
            BACKEND_UDP.parse().unwrap(),
            server_threads,
        );
        Topology { _servers: servers, client, clean, _backend: backend }
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

/// One protocol of a row.
#[derive(Debug, Clone, Copy, Default)]
struct Cell {
    rate: f64,
    ratio: f64,
    spread: Spread,
    errors: u64,
}

impl Cell {
    /// The rate, the ratio and the spread, as table columns.
    fn columns(&self) -> String {
        format!("{:.0} | {:.3} | {:.3}–{:.3}", self.rate, self.ratio, self.spread.low, self.spread.high)
    }
    /// The same, for the progress lines.
    fn line(&self) -> String {
        format!("{:>8.0}/s ({:.3} x direct, {:.3}-{:.3})", self.rate, self.ratio, self.spread.low, self.spread.high)
    }
}

#[derive(Debug, Clone)]
struct Row {
    path: String,
    services: usize,
    tcp: Cell,
    udp: Cell,
}

/// What the measured path sends to: a VIP, or the backend itself.
#[derive(Clone, Copy)]
enum Target {
    Vip(std::net::Ipv4Addr),
    Backend,
}

impl Target {
    fn addrs(self) -> (SocketAddr, SocketAddr) {
        match self {
            Target::Vip(vip) => {
                (SocketAddr::V4(SocketAddrV4::new(vip, 80)), SocketAddr::V4(SocketAddrV4::new(vip, 53)))
            }
            Target::Backend => (BACKEND_TCP.parse().unwrap(), BACKEND_UDP.parse().unwrap()),
        }
    }
    fn source(self) -> IpAddr {
        match self {
            Target::Vip(_) => VIA.parse().unwrap(),
            Target::Backend => OTHER.parse().unwrap(),
        }
    }
}

/// The rows' paths, interleaved with the clean baseline (the first path)
/// in slices; TCP first, then UDP.
fn measure(t: &Topology, plan: &Plan, services: usize, rows: &[(String, Target)]) -> Vec<Row> {
    let clean = CLEAN.parse().unwrap();
    let mut by_kind = Vec::new();
    for kind in [Kind::Tcp, Kind::Udp] {
        let pick = |(tcp, udp): (SocketAddr, SocketAddr)| if kind == Kind::Tcp { tcp } else { udp };
        let mut paths = vec![Path { ns: &t.clean, src: clean, dst: pick(Target::Backend.addrs()) }];
        paths.extend(rows.iter().map(|(_, target)| Path {
            ns: &t.client,
            src: target.source(),
            dst: pick(target.addrs()),
        }));
        by_kind.push(interleave::measure(kind, &paths, plan));
    }
    assert!(!interrupted(), "interrupted; cleaning up");
    let cell = |m: &Measured, i: usize| Cell {
        rate: m.per_sec[i],
        ratio: m.ratio(i),
        spread: m.spread[i],
        errors: m.errors[i],
    };
    rows.iter()
        .enumerate()
        .map(|(i, (path, _))| {
            let row =
                Row { path: path.clone(), services, tcp: cell(&by_kind[0], i + 1), udp: cell(&by_kind[1], i + 1) };
            eprintln!(
                "{:<36} {services:>6} services: tcp {}  udp {}  errors {}+{}",
                row.path,
                row.tcp.line(),
                row.udp.line(),
                row.tcp.errors,
                row.udp.errors
            );
            row
        })
        .collect()
}

/// Where the BPF time of a measurement went: per program, runs and mean
/// ns per run (hostmesh's programs only, `hm_` names).
struct Profile {
    label: String,
    programs: Vec<(String, u64, f64)>,
}

/// The rows of `measure(plan)`, run without the kernel's run-time
/// statistics (as a host in service runs: they cost every program run two
/// clock reads), then a pass of a fifth of the rounds with them on, whose
/// rates are dropped and whose program costs go to `profiles`.
fn profiled(label: String, profiles: &mut Vec<Profile>, plan: &Plan, measure: impl Fn(&Plan) -> Vec<Row>) -> Vec<Row> {
    let rows = measure(plan);
    let _stats = progstats::enable().expect("BPF_ENABLE_STATS");
    let before = progstats::snapshot("hm_");
    measure(&Plan { rounds: (plan.rounds / 5).max(2), ..*plan });
    let programs = progstats::since(&before, &progstats::snapshot("hm_"));
    profiles.push(Profile { label, programs });
    rows
}

fn main() {
    hm_testkit::require_root();
    catch_interrupts();
    // Rounds of slices, not timed repetitions, set how long it measures.
    if let Some(flag) = std::env::args().find(|a| a == "--seconds" || a == "--reps") {
        panic!("bench-services takes --rounds N and --slice-ms MS, not {flag}");
    }
    let o = Options::parse(5, &[&Plan::FLAGS[..], &["only-hostmesh", "alone", "perf-dir"]].concat());
    let plan = Plan::from_options(&o, 40);
    let server_threads = plan.clients;
    let cg = InCgroup::enter();
    if let Some(paths) = o.extra.get("alone") {
        alone(&o, &cg, &plan, paths);
        return;
    }
    let mut rows = Vec::new();
    let mut syncs = Vec::new();
    let mut profiles = Vec::new();

    eprintln!("hostmesh ({}), {}", o.hostmesh.display(), plan.describe());
    // --only-hostmesh 1,1000: a quick look at hostmesh alone, no results file.
    let only_hostmesh: Option<Vec<usize>> =
        o.extra.get("only-hostmesh").map(|v| v.split(',').map(|n| n.parse().expect("--only-hostmesh N,N")).collect());
    let sizes: Vec<usize> = only_hostmesh.clone().unwrap_or(ALL_SIZES.to_vec());
    {
        let t = Topology::new(server_threads);
        for &n in &sizes {
            let hm = Hostmesh::start(&t.client, &o.hostmesh, cg.path(), "all", n);
            syncs.push((n, "first sync, connect-time", hm.last_sync_ms()));
            for (mode, path) in [("all", "hostmesh connect-time"), ("off", "hostmesh bpfnat veth")] {
                if mode == "off" {
                    hm.switch_mode("off");
                    syncs.push((n, "switch to the bpfnat veth", hm.last_sync_ms()));
                }
                let mut wanted = vec![(path.to_string(), Target::Vip(target(n)))];
                if n == 10000 {
                    wanted.push((format!("other traffic, beside {path}"), Target::Backend));
                }
                let label = format!("{path}, {n} services");
                rows.extend(profiled(label, &mut profiles, &plan, |plan| measure(&t, plan, n, &wanted)));
            }
        }
    }
    if only_hostmesh.is_some() {
        for p in &profiles {
            for (name, runs, ns) in &p.programs {
                eprintln!("{}: {name} {runs} runs, {ns:.0} ns per run", p.label);
            }
        }
        return;
    }
    {
        let t = Topology::new(server_threads);
        for n in ALL_SIZES {
            t.client.exec_with_input("iptables-restore", &[], &iptables_rules(n));
            t.short_conntrack_timeouts();
            let mut wanted = vec![("iptables DNAT".to_string(), Target::Vip(target(n)))];
            // The same 10,000, reaching the last service: the whole list walked.
            if n == 10000 {
                wanted.push(("iptables DNAT, last service".to_string(), Target::Vip(vip(9999))));
            }
            rows.extend(measure(&t, &plan, n, &wanted));
        }
    }
    {
        let t = Topology::new(server_threads);
        for n in ALL_SIZES {
            t.client.exec_with_input("nft", &["-f", "-"], &format!("flush ruleset\n{}", nftables_ruleset(n)));
            t.short_conntrack_timeouts();
            rows.extend(measure(&t, &plan, n, &[("nftables DNAT (map)".to_string(), Target::Vip(target(n)))]));
        }
    }
    drop(cg);

    let report = report(&plan, &rows, &syncs, &profiles);
    println!("{report}");
    hm_bench::results::write_section(&o.out, "services", &report).expect("write results");
    eprintln!("wrote the services section of {}", o.out.display());
}

/// --alone direct,veth,other: each path by itself, TCP only, for the
/// plan's rounds of slices (after two of warm-up), against hostmesh in
/// mode "off" with one service; with --perf-dir DIR, under `perf record
/// -a` into DIR/PATH.data for the rounds' time. Prints "alone PATH:
/// RATE/s for SECS s" (the recorded seconds), which bench/perf-paths
/// reads to put each symbol's samples per connection.
fn alone(o: &Options, cg: &InCgroup, plan: &Plan, which: &str) {
    let t = Topology::new(plan.clients);
    let _hm = Hostmesh::start(&t.client, &o.hostmesh, cg.path(), "off", 1);
    for name in which.split(',') {
        let (ns, src, to) = match name {
            "direct" => (&t.clean, CLEAN, Target::Backend),
            "veth" => (&t.client, VIA, Target::Vip(target(1))),
            "other" => (&t.client, OTHER, Target::Backend),
            _ => panic!("--alone takes direct, veth and other, not {name}"),
        };
        let path = Path { ns, src: src.parse().unwrap(), dst: to.addrs().0 };
        let (rate, secs) = hm_bench::perf::alone(name, &path, plan, o.extra.get("perf-dir"));
        println!("alone {name}: {rate:.0}/s for {secs:.3} s");
    }
}

fn find<'a>(rows: &'a [Row], path: &str, n: usize) -> &'a Row {
    rows.iter().find(|r| r.path == path && r.services == n).expect("measured")
}

fn report(plan: &Plan, rows: &[Row], syncs: &[(usize, &str, u64)], profiles: &[Profile]) -> String {
    let mut s = String::new();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let _ = writeln!(s, "## bench/services: service IPs\n");
    let _ = writeln!(s, "Command (as root): `./bench/run services` (`--clients 1` for one client thread)\n");
    let _ = writeln!(
        s,
        "One run on Linux {} with {cpus} CPUs; {}; {}. {} client threads (and as many server threads) keep the CPUs \
         saturated: TCP is connect + 32-byte request/reply + abort, UDP request/reply. Every measurement interleaves \
         its paths in {} ms slices, all client threads switching together, over {} rounds (after one warm-up round): \
         the baseline, **direct**, is the same traffic from a clean namespace (nothing installed, a veth of its own) \
         to the same backend, so other load hits both alike. × direct is the ratio of the rates; the spread is the \
         10th–90th percentile of the per-round ratios. Each VIP is the middle service of the configured set (an \
         iptables rule list is walked halfway); one more row reaches the last of 10,000 iptables services. \
         **Other traffic** is traffic from the hostmesh namespace straight to the backend (no VIP) while 10,000 \
         services are configured: the cost every other connection on the host pays. The bench process sits in the \
         cgroup hostmesh attaches to, so the baseline's connects run the connect-time programs too, which leave at \
         their first check (another network namespace). Absolute rates on these machines are noise; compare ratios.\n",
        kernel.trim(),
        version("iptables", "-V"),
        version("nft", "-v"),
        plan.clients,
        plan.slice.as_millis(),
        plan.rounds,
    );
    let _ = writeln!(
        s,
        "| path | services | TCP connect+req/reply /s | × direct | spread | UDP req/reply /s | × direct | spread | errors |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} |",
            r.path,
            r.services,
            r.tcp.columns(),
            r.udp.columns(),
            r.tcp.errors + r.udp.errors
        );
    }
    let _ = writeln!(
        s,
        "\nhostmesh sync times in this run (each configured service is a TCP and a UDP service on one VIP):\n"
    );
    for (n, what, ms) in syncs {
        let _ = writeln!(s, "- {n} VIPs ({} services), {what}: {ms} ms", 2 * n);
    }
    let _ = writeln!(
        s,
        "\nhostmesh's BPF programs, from a pass of a fifth of the rounds after each hostmesh measurement with the \
         kernel's run-time statistics on (run_time_ns and run_cnt, BPF_ENABLE_STATS; the measured passes above run \
         without them, as a host in service does, since they cost every program run two clock reads), TCP and UDP \
         together, baseline included:\n"
    );
    let _ = writeln!(s, "| measurement | program | runs | ns per run |");
    let _ = writeln!(s, "|---|---|---:|---:|");
    for p in profiles {
        for (name, runs, ns) in &p.programs {
            let _ = writeln!(s, "| {} | {name} | {runs} | {ns:.0} |", p.label);
        }
    }
    let _ = writeln!(s, "\n### Targets\n");
    let check = |ok: bool| if ok { "met" } else { "MISSED" };
    let lowest = |path: &str| {
        ALL_SIZES
            .iter()
            .map(|&n| find(rows, path, n))
            .map(|r| (r.tcp.ratio.min(r.udp.ratio), r.services))
            .fold((f64::MAX, 0), |a, b| if b.0 < a.0 { b } else { a })
    };
    let (ctlb_min, ctlb_at) = lowest("hostmesh connect-time");
    let (veth_min, veth_at) = lowest("hostmesh bpfnat veth");
    let _ = writeln!(
        s,
        "- connect-time ≥ 0.97 × direct at 1, 1,000 and 10,000 services: lowest ratio {ctlb_min:.3} (at {ctlb_at}) — {}",
        check(ctlb_min >= 0.97)
    );
    let _ = writeln!(
        s,
        "- bpfnat veth ≥ 0.95 × direct, TCP and UDP, at 1, 1,000 and 10,000 services (issue 31): lowest ratio \
         {veth_min:.3} (at {veth_at}) — {}",
        check(veth_min >= 0.95)
    );
    let beside = find(rows, "other traffic, beside hostmesh bpfnat veth", 10000);
    let beside_min = beside.tcp.ratio.min(beside.udp.ratio);
    let _ = writeln!(
        s,
        "- other traffic beside 10,000 bpfnat veth services ≥ 0.98 × direct, TCP and UDP: lowest ratio \
         {beside_min:.3} — {}",
        check(beside_min >= 0.98)
    );
    let c10 = find(rows, "hostmesh connect-time", 10000);
    let last = find(rows, "iptables DNAT, last service", 10000);
    let vs_ipt = c10.tcp.rate / last.tcp.rate;
    let _ = writeln!(
        s,
        "- connect-time ≥ 3.5 × iptables DNAT at 10,000 services (last rule), TCP: {vs_ipt:.2}× — {}",
        check(vs_ipt >= 3.5)
    );
    s
}
