//! bench/external: clients on another machine through a host to backends
//! behind it. A client namespace reaches the backends through the host
//! under test (hostmesh with external_policy "snat" and "local", then
//! iptables DNAT + masquerade, then nftables DNAT + masquerade with a map)
//! and, interleaved with it in slices (`interleave`), through a clean
//! router that only forwards (the limit: plain IP forwarding, no
//! translation), with 1, 1,000 and 10,000 services configured. TCP
//! connect + request/reply + abort, UDP request/reply, and bulk TCP (a
//! stream per client thread). Writes bench/RESULTS.md.
//!
//! ```text
//!                 ext0 192.0.2.1   host   eth0 192.168.10.1 ---- 192.168.10.11 backend
//!  client 192.0.2.2 ---'            vm0 10.77.0.1 --- 10.77.0.2 local backend
//!         198.18.0.2 --- 198.18.0.1 router 192.168.20.1 ---- 192.168.20.11 backend
//! ```
//!
//! Run it with `./bench/run external` (as root).

mod topology;

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};

use hm_bench::interleave::{self, Kind, Path, Plan, Spread};
use hm_bench::load::{catch_interrupts, interrupted};
use hm_bench::options::Options;
use hm_bench::progstats;
use topology::*;

const ALL_SIZES: [usize; 3] = [1, 1000, 10000];

/// One measured path of a row: its rate, ratio to plain forwarding, spread.
#[derive(Debug, Clone, Copy, Default)]
struct Cell {
    rate: f64,
    ratio: f64,
    spread: Spread,
    errors: u64,
}

#[derive(Debug, Clone)]
struct Row {
    path: &'static str,
    services: usize,
    tcp: Cell,
    udp: Cell,
    /// Bytes per second of one stream (hostmesh rows only).
    bulk: Option<Cell>,
}

/// What a row sends to: its TCP, UDP and bulk destinations.
struct Dest {
    path: &'static str,
    tcp: SocketAddr,
    udp: SocketAddr,
    bulk: Option<SocketAddr>,
}

fn measure_kind(t: &Topology, plan: &Plan, kind: Kind, dests: &[&Dest]) -> Vec<Cell> {
    let pick = |d: &Dest| match kind {
        Kind::Tcp => d.tcp,
        Kind::Udp => d.udp,
        Kind::Bulk => d.bulk.expect("a bulk destination"),
    };
    let baseline = Dest {
        path: "plain forwarding",
        tcp: SocketAddr::new(BACKEND_FAR.into(), TCP_PORT),
        udp: SocketAddr::new(BACKEND_FAR.into(), UDP_PORT),
        bulk: Some(SocketAddr::new(BACKEND_FAR.into(), SINK_PORT)),
    };
    let mut paths = vec![Path { ns: &t.client, src: CLIENT_CLEAN.into(), dst: pick(&baseline) }];
    paths.extend(dests.iter().map(|d| Path { ns: &t.client, src: CLIENT.into(), dst: pick(d) }));
    // Bulk too: a stream per client thread, so the CPUs are saturated and
    // the ratio is of what each byte costs (one stream, pinned to one CPU,
    // swung 0.83–1.12 from slice to slice with its congestion window).
    let m = interleave::measure(kind, &paths, plan);
    assert!(!interrupted(), "interrupted; cleaning up");
    (1..paths.len())
        .map(|i| Cell { rate: m.per_sec[i], ratio: m.ratio(i), spread: m.spread[i], errors: m.errors[i] })
        .collect()
}

/// Each destination's row: TCP, then UDP, then the bulk streams of those
/// that have one, each kind interleaved with plain forwarding.
fn measure(t: &Topology, plan: &Plan, services: usize, dests: &[Dest]) -> Vec<Row> {
    let rows = measure_quietly(t, plan, services, dests);
    for row in &rows {
        eprintln!(
            "{:<40} {services:>6} services: tcp {:.3} x, udp {:.3} x{}",
            row.path,
            row.tcp.ratio,
            row.udp.ratio,
            row.bulk.map(|b| format!(", bulk {:.3} x ({:.0} MB/s)", b.ratio, b.rate / 1e6)).unwrap_or_default()
        );
    }
    rows
}

fn measure_quietly(t: &Topology, plan: &Plan, services: usize, dests: &[Dest]) -> Vec<Row> {
    let all: Vec<&Dest> = dests.iter().collect();
    let tcp = measure_kind(t, plan, Kind::Tcp, &all);
    let udp = measure_kind(t, plan, Kind::Udp, &all);
    let streaming: Vec<&Dest> = dests.iter().filter(|d| d.bulk.is_some()).collect();
    let mut bulk =
        if streaming.is_empty() { Vec::new() } else { measure_kind(t, plan, Kind::Bulk, &streaming) }.into_iter();
    dests
        .iter()
        .enumerate()
        .map(|(i, d)| Row { path: d.path, services, tcp: tcp[i], udp: udp[i], bulk: d.bulk.and_then(|_| bulk.next()) })
        .collect()
}

/// Where hostmesh's BPF time went in one measurement: per program, runs
/// and mean ns per run.
struct Profile {
    services: usize,
    programs: Vec<(String, u64, f64)>,
}

fn hostmesh_rows(t: &Topology, o: &Options, plan: &Plan, sizes: &[usize], profiles: &mut Vec<Profile>) -> Vec<Row> {
    let mut rows = Vec::new();
    for &n in sizes {
        let _hm = Hostmesh::start(&t.host, &o.hostmesh, n);
        let vip = target(n);
        let dests = [
            Dest {
                path: "hostmesh \"snat\", external VIP",
                tcp: SocketAddr::new(vip.into(), 80),
                udp: SocketAddr::new(vip.into(), 53),
                bulk: Some(SocketAddr::new(BULK_VIP.into(), SINK_PORT)),
            },
            Dest {
                path: "hostmesh \"snat\", node port",
                tcp: SocketAddr::new(HOST.into(), NODE_PORT_TCP),
                udp: SocketAddr::new(HOST.into(), NODE_PORT_UDP),
                bulk: None,
            },
            Dest {
                path: "hostmesh \"local\", node port",
                tcp: SocketAddr::new(HOST.into(), LOCAL_PORT_TCP),
                udp: SocketAddr::new(HOST.into(), LOCAL_PORT_UDP),
                bulk: None,
            },
        ];
        rows.extend(measure(t, plan, n, &dests));
        profiles.push(profile(t, plan, n, &dests));
    }
    rows
}

/// Where hostmesh's BPF time goes: a shorter pass of the same traffic with
/// the kernel's run-time statistics on (BPF_ENABLE_STATS), whose rates are
/// not reported. The measured passes run without them, as a host in
/// service does: they cost every program run two clock reads, which only
/// the hostmesh rows would pay.
fn profile(t: &Topology, plan: &Plan, services: usize, dests: &[Dest]) -> Profile {
    let _stats = progstats::enable().expect("BPF_ENABLE_STATS");
    let before = progstats::snapshot("hm_");
    let short = Plan { rounds: (plan.rounds / 5).max(2), ..*plan };
    measure_quietly(t, &short, services, dests);
    Profile { services, programs: progstats::since(&before, &progstats::snapshot("hm_")) }
}

/// --alone plain,snat: each path by itself, TCP only, for the plan's
/// rounds of slices (after two of warm-up), hostmesh with one service;
/// with --perf-dir DIR, under `perf record -a` into DIR/PATH.data for the
/// rounds' time. Prints "alone PATH: RATE/s for SECS s", which
/// bench/perf-paths reads (`--external`) to put each symbol's samples per
/// connection.
fn alone(t: &Topology, o: &Options, plan: &Plan, which: &str) {
    let _hm = Hostmesh::start(&t.host, &o.hostmesh, 1);
    for name in which.split(',') {
        let path = match name {
            "plain" => {
                Path { ns: &t.client, src: CLIENT_CLEAN.into(), dst: SocketAddr::new(BACKEND_FAR.into(), TCP_PORT) }
            }
            "snat" => Path { ns: &t.client, src: CLIENT.into(), dst: SocketAddr::new(target(1).into(), 80) },
            _ => panic!("--alone takes plain and snat, not {name}"),
        };
        let (rate, secs) = hm_bench::perf::alone(name, &path, plan, o.extra.get("perf-dir"));
        println!("alone {name}: {rate:.0}/s for {secs:.3} s");
    }
}

/// iptables, then nftables, DNAT + masquerade on the host for each size.
fn netfilter_rows(t: &Topology, plan: &Plan, sizes: &[usize]) -> Vec<Row> {
    let mut rows = Vec::new();
    for (path, load) in
        [("iptables DNAT + masquerade", Netfilter::Iptables), ("nftables DNAT + masquerade (map)", Netfilter::Nftables)]
    {
        for &n in sizes {
            let _rules = load.install(&t.host, n);
            let vip = target(n);
            let dest =
                Dest { path, tcp: SocketAddr::new(vip.into(), 80), udp: SocketAddr::new(vip.into(), 53), bulk: None };
            rows.extend(measure(t, plan, n, &[dest]));
        }
    }
    rows
}

fn main() {
    hm_testkit::require_root();
    catch_interrupts();
    let o = Options::parse(5, &[&Plan::FLAGS[..], &["sizes", "only-hostmesh", "alone", "perf-dir"]].concat());
    let plan = Plan::from_options(&o, 30);
    // --sizes 1,1000: a quick look (no results file).
    // --only-hostmesh 1,1000: a quick look at hostmesh alone, no results file.
    let only_hostmesh = o.extra.get("only-hostmesh");
    let sizes: Vec<usize> = o
        .extra
        .get("sizes")
        .or(only_hostmesh)
        .map(|v| v.split(',').map(|n| n.parse().expect("--sizes N,N")).collect())
        .unwrap_or(ALL_SIZES.to_vec());
    eprintln!("hostmesh ({}), {}", o.hostmesh.display(), plan.describe());
    let t = Topology::new(plan.clients);
    if let Some(paths) = o.extra.get("alone") {
        alone(&t, &o, &plan, paths);
        return;
    }
    let mut profiles = Vec::new();
    let mut rows = hostmesh_rows(&t, &o, &plan, &sizes, &mut profiles);
    if only_hostmesh.is_none() {
        rows.extend(netfilter_rows(&t, &plan, &sizes));
    }
    drop(t);
    let report = report(&plan, &rows, &sizes, &profiles);
    println!("{report}");
    if sizes == ALL_SIZES && only_hostmesh.is_none() {
        hm_bench::results::write_section(&o.out, "external", &report).expect("write results");
        eprintln!("wrote the external section of {}", o.out.display());
    }
}

fn cell(c: &Cell) -> String {
    format!("{:.0} | {:.3} | {:.3}–{:.3}", c.rate, c.ratio, c.spread.low, c.spread.high)
}

fn report(plan: &Plan, rows: &[Row], sizes: &[usize], profiles: &[Profile]) -> String {
    let mut s = String::new();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let _ = writeln!(s, "## bench/external: clients on other machines\n");
    let _ = writeln!(s, "Command (as root): `./bench/run external`\n");
    let _ = writeln!(
        s,
        "One run on Linux {} with {cpus} CPUs; {}; {}. A client namespace reaches backends in another namespace \
         through the host under test; {} client threads (and as many server threads) keep the CPUs saturated: TCP \
         is connect + 32-byte request/reply + abort, UDP request/reply, bulk a TCP stream per client thread, of 16 KiB \
         writes. Every \
         measurement interleaves its paths in {} ms slices over {} rounds (after a warm-up round) with the \
         baseline, **plain forwarding**: the same traffic through a second host that only routes (no \
         translation), to the same backend namespace. × is the ratio of the rates; the spread the 10th–90th \
         percentile of the per-round ratios. The external VIP is the middle one of the configured services; \
         `\"snat\"` backends are on another host (they see the host's address), the `\"local\"` one is a namespace \
         behind a veth of the host (it sees the client's). Absolute rates are noise here; compare ratios.\n",
        kernel.trim(),
        version("iptables", "-V"),
        version("nft", "-v"),
        plan.clients,
        plan.slice.as_millis(),
        plan.rounds,
    );
    let _ = writeln!(
        s,
        "| path | services | TCP /s | × plain | spread | UDP /s | × plain | spread | bulk B/s | × plain | spread | errors |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let bulk = r.bulk.as_ref().map_or("– | – | –".to_string(), cell);
        let errors = r.tcp.errors + r.udp.errors + r.bulk.map_or(0, |b| b.errors);
        let _ =
            writeln!(s, "| {} | {} | {} | {} | {bulk} | {errors} |", r.path, r.services, cell(&r.tcp), cell(&r.udp));
    }
    let _ = writeln!(
        s,
        "\nhostmesh's BPF programs, from a pass of a fifth of the rounds after each hostmesh measurement with the \
         kernel's run-time statistics on (run_time_ns and run_cnt, BPF_ENABLE_STATS; the measured passes above \
         run without them, as a host in service does, since they cost every program run two clock reads), every \
         kind of traffic together, baseline included:\n"
    );
    let _ = writeln!(s, "| services | program | runs | ns per run |");
    let _ = writeln!(s, "|---:|---|---:|---:|");
    for p in profiles {
        for (name, runs, ns) in &p.programs {
            let _ = writeln!(s, "| {} | {name} | {runs} | {ns:.0} |", p.services);
        }
    }
    targets(&mut s, rows, sizes);
    s
}

fn targets(s: &mut String, rows: &[Row], sizes: &[usize]) {
    let find = |path: &str, n: usize| rows.iter().find(|r| r.path == path && r.services == n);
    let check = |ok: bool| if ok { "met" } else { "MISSED" };
    let snat = "hostmesh \"snat\", external VIP";
    // Both ways in with "snat" (the external VIP and the node port) count:
    // the lower of the two is the one held to each goal.
    let snat_rows = |n: usize| rows.iter().filter(move |r| r.path.starts_with("hostmesh \"snat\"") && r.services == n);
    let lower = |n: usize, ratio: fn(&Row) -> f64| {
        snat_rows(n).map(|r| (ratio(r), r.path)).fold((f64::MAX, ""), |a, b| if b.0 < a.0 { b } else { a })
    };
    let _ = writeln!(s, "\n### Targets\n");
    let lowest = sizes
        .iter()
        .flat_map(|&n| [(lower(n, |r| r.tcp.ratio), n, "TCP"), (lower(n, |r| r.udp.ratio), n, "UDP")])
        .fold(((f64::MAX, ""), 0, ""), |a, b| if b.0 .0 < a.0 .0 { b } else { a });
    let _ = writeln!(
        s,
        "- \"snat\" ≥ 0.95 × plain forwarding, TCP and UDP, every N (external VIP and node port): lowest {:.3} ({}, \
         {}, at {}) — {}",
        lowest.0 .0,
        lowest.2,
        lowest.0 .1,
        lowest.1,
        check(lowest.0 .0 >= 0.95)
    );
    for &n in sizes {
        let Some(nft) = find("nftables DNAT + masquerade (map)", n) else { continue };
        if snat_rows(n).next().is_none() {
            continue;
        }
        // Measured apart (one system on the host at a time), so compared by
        // their ratios to the plain forwarding each was interleaved with.
        let (tcp, udp) = (lower(n, |r| r.tcp.ratio).0, lower(n, |r| r.udp.ratio).0);
        let ahead = tcp > nft.tcp.ratio && udp > nft.udp.ratio;
        let _ = writeln!(
            s,
            "- ahead of nftables DNAT + masquerade at {n} (the lower \"snat\" row, × plain, each against its own \
             interleaved baseline): TCP {tcp:.3} vs {:.3}, UDP {udp:.3} vs {:.3} — {}",
            nft.tcp.ratio,
            nft.udp.ratio,
            check(ahead)
        );
    }
    let bulk = sizes.iter().filter_map(|&n| find(snat, n)?.bulk).map(|b| b.ratio).fold(f64::MAX, f64::min);
    let _ = writeln!(s, "- bulk TCP ≥ 0.95 × plain forwarding: lowest {bulk:.3} — {}", check(bulk >= 0.95));
    if let (Some(first), Some(last)) =
        (sizes.first().and_then(|&n| find(snat, n)), sizes.last().and_then(|&n| find(snat, n)))
    {
        let drop = |a: f64, b: f64| 1.0 - b / a;
        let worst = drop(first.tcp.ratio, last.tcp.ratio).max(drop(first.udp.ratio, last.udp.ratio));
        let _ = writeln!(
            s,
            "- flat in N ({} → {}): drop {:.1} % — {}",
            first.services,
            last.services,
            worst * 100.0,
            check(worst <= 0.03)
        );
    }
}

/// The version line of a tool, for the results.
fn version(program: &str, arg: &str) -> String {
    std::process::Command::new(program)
        .arg(arg)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().next().unwrap_or("").trim().to_string())
        .unwrap_or_else(|_| "not found".into())
}

/// The i-th external VIP: 10.100.x.y.
pub fn vip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 100 + (i / 62500) as u8, ((i / 250) % 250) as u8, (i % 250 + 1) as u8)
}

/// The service every run targets: the middle one.
pub fn target(n: usize) -> Ipv4Addr {
    vip(n / 2)
}
