//! bench/mesh: connection and UDP request rates to a sidecar through
//! hostmesh's sk_lookup redirect, through hostmesh's nftables fallback
//! (tproxy), and through a conventional nftables `redirect` rule, against
//! connecting straight to 127.0.0.1:port; plus the conntrack entries each
//! leaves per 10,000 connections. Each path runs in a namespace of its own
//! (conntrack is switched on per namespace by what uses it). Writes its
//! section of bench/RESULTS.md.
//!
//! Run it with `./bench/run mesh` (as root).

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hm_bench::load::{catch_interrupts, interrupted, tcp_rate, udp_rate, EchoServers};
use hm_bench::options::Options;
use hm_bench::results::median;
use hm_testkit::{Daemon, DaemonOptions, Netns, TempDir};

const SIDECAR: &str = "127.0.0.1:15001";
const VIP: &str = "10.96.0.70";
const CONNECTIONS_FOR_CONNTRACK: u32 = 10_000;

#[derive(Clone, Copy, PartialEq)]
enum Way {
    Direct,
    SkLookup,
    Tproxy,
    NftRedirect,
}

impl Way {
    fn label(self) -> &'static str {
        match self {
            Way::Direct => "direct to 127.0.0.1:15001",
            Way::SkLookup => "hostmesh sk_lookup",
            Way::Tproxy => "hostmesh nftables fallback (tproxy)",
            Way::NftRedirect => "nftables redirect (conventional)",
        }
    }
}

/// One namespace with the sidecar (an echo server on 127.0.0.1:15001) and
/// the path under test set up in front of it.
struct Setup {
    _daemon: Option<Daemon>,
    _dir: TempDir,
    _servers: EchoServers,
    ns: Netns,
}

impl Setup {
    fn new(path: Way, o: &Options) -> Setup {
        let ns = Netns::new();
        ns.set_sysctl("net/ipv4/tcp_tw_reuse", "1");
        let servers = EchoServers::start(&ns, SIDECAR.parse().unwrap(), SIDECAR.parse().unwrap());
        let dir = TempDir::new("hm-bench-mesh");
        let mut daemon = None;
        match path {
            Way::Direct => {}
            Way::SkLookup | Way::Tproxy => {
                let opts = DaemonOptions::in_dir(o.hostmesh.to_str().unwrap(), &dir);
                let backend = if path == Way::SkLookup { "sk_lookup" } else { "nftables" };
                opts.write_config(
                    "mesh.toml",
                    &format!(
                        "[daemon]\nmesh_backend = \"{backend}\"\n\n\
                         [[mesh]]\nname = \"tcp\"\nvip = \"{VIP}\"\nport = 80\nredirect_port = 15001\n\n\
                         [[mesh]]\nname = \"udp\"\nvip = \"{VIP}\"\nport = 53\nprotocol = \"udp\"\nredirect_port = 15001\n"
                    ),
                );
                let d = Daemon::start(&ns, &opts);
                d.wait_ready(Duration::from_secs(60));
                wait_registered(&opts);
                daemon = Some(d);
            }
            Way::NftRedirect => {
                // The VIP needs a route for the first lookup; redirect then
                // rewrites the destination to 127.0.0.1 (conntrack NAT).
                ns.ip(&[
                    "route",
                    "add",
                    "local",
                    &format!("{VIP}/32"),
                    "dev",
                    "lo",
                    "table",
                    "local",
                    "src",
                    "127.0.0.1",
                ]);
                let rules = format!(
                    "table ip natbench {{\n  chain out {{\n    type nat hook output priority -100; policy accept;\n\
                     \x20   ip daddr {VIP} tcp dport 80 redirect to :15001\n\
                     \x20   ip daddr {VIP} udp dport 53 redirect to :15001\n  }}\n}}\n"
                );
                ns.exec_with_input("nft", &["-f", "-"], &rules);
            }
        }
        Setup { _daemon: daemon, _dir: dir, _servers: servers, ns }
    }

    fn conntrack_count(&self) -> u64 {
        self.ns.sysctl("net/netfilter/nf_conntrack_count").and_then(|v| v.parse().ok()).unwrap_or(0)
    }
}

/// Waits until both mesh entries show a registered sidecar.
fn wait_registered(opts: &DaemonOptions) {
    let status = opts.state_dir.join("status.json");
    for _ in 0..200 {
        let text = std::fs::read_to_string(&status).unwrap_or_default();
        if text.matches("\"state\": \"applied\"").count() >= 2 && !text.contains("no_sidecar") {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the sidecar was not registered: {}", std::fs::read_to_string(&status).unwrap_or_default());
}

struct Row {
    path: Way,
    tcp: f64,
    udp: f64,
    direct_tcp: f64,
    direct_udp: f64,
    conntrack: u64,
    errors: u64,
}

fn target(path: Way, port: u16) -> SocketAddr {
    match path {
        Way::Direct => SIDECAR.parse().unwrap(),
        _ => SocketAddr::new(VIP.parse().unwrap(), port),
    }
}

fn measure(path: Way, o: &Options) -> Row {
    let s = Setup::new(path, o);
    let src: IpAddr = "127.0.0.1".parse().unwrap();
    // Conntrack entries made by 10,000 connections, counted first, on the
    // fresh namespace (after the rate runs the table would be full of their
    // flows, and new entries would only displace old ones). Closed flows
    // stay for the count (this namespace's timeouts only).
    let timeouts: Vec<(&str, String)> =
        ["net/netfilter/nf_conntrack_tcp_timeout_close", "net/netfilter/nf_conntrack_tcp_timeout_time_wait"]
            .into_iter()
            .filter_map(|k| s.ns.sysctl(k).map(|v| (k, v)))
            .collect();
    for (k, _) in &timeouts {
        s.ns.set_sysctl(k, "300");
    }
    let before = s.conntrack_count();
    let sample = Duration::from_secs(60);
    let conns = count_connections(&s.ns, src, target(path, 80), CONNECTIONS_FOR_CONNTRACK, sample);
    let conntrack = s.conntrack_count().saturating_sub(before) * u64::from(CONNECTIONS_FOR_CONNTRACK) / conns.max(1);
    // Back to the defaults for the rate runs.
    for (k, v) in &timeouts {
        s.ns.set_sysctl(k, v);
    }
    let (mut tcp, mut udp, mut dtcp, mut dudp, mut errors) = (vec![], vec![], vec![], vec![], 0);
    for _ in 0..o.reps {
        for (samples, dst, is_tcp) in [
            (&mut dtcp, SIDECAR.parse().unwrap(), true),
            (&mut tcp, target(path, 80), true),
            (&mut dudp, SIDECAR.parse().unwrap(), false),
            (&mut udp, target(path, 53), false),
        ] {
            let r = if is_tcp { tcp_rate(&s.ns, src, dst, o.seconds) } else { udp_rate(&s.ns, src, dst, o.seconds) };
            samples.push(r.per_sec);
            errors += r.errors;
        }
        assert!(!interrupted(), "interrupted; cleaning up");
    }
    let row = Row {
        path,
        tcp: median(tcp),
        udp: median(udp),
        direct_tcp: median(dtcp),
        direct_udp: median(dudp),
        conntrack,
        errors,
    };
    eprintln!(
        "{:<38} tcp {:>8.0}/s ({:.3} x direct)  udp {:>8.0}/s ({:.3} x direct)  conntrack {}/10k  errors {}",
        path.label(),
        row.tcp,
        row.tcp / row.direct_tcp,
        row.udp,
        row.udp / row.direct_udp,
        row.conntrack,
        row.errors
    );
    row
}

/// Makes `n` connections (or as many as fit in `limit`); returns how many.
fn count_connections(ns: &Netns, src: IpAddr, dst: SocketAddr, n: u32, limit: Duration) -> u64 {
    let r = hm_bench::load::tcp_count(ns, src, dst, n, limit);
    r.max(1)
}

fn main() {
    hm_testkit::require_root();
    catch_interrupts();
    let o = Options::parse(7, &[]);
    eprintln!("hostmesh ({}), {} s x {} reps per rate", o.hostmesh.display(), o.seconds.as_secs_f64(), o.reps);
    let rows: Vec<Row> =
        [Way::Direct, Way::SkLookup, Way::Tproxy, Way::NftRedirect].into_iter().map(|p| measure(p, &o)).collect();
    let report = report(&o, &rows);
    println!("{report}");
    hm_bench::results::write_section(&o.out, "mesh", &report).expect("write results");
    eprintln!("wrote the mesh section of {}", o.out.display());
}

fn report(o: &Options, rows: &[Row]) -> String {
    let mut s = String::new();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let _ = writeln!(s, "## bench/mesh: mesh redirects\n");
    let _ = writeln!(s, "Command (as root): `./bench/run mesh`\n");
    let _ = writeln!(
        s,
        "One run on Linux {} with {} CPUs. A local client reaches a sidecar (an echo server on 127.0.0.1:15001) \
         through each path; each rate is the median of {} runs of {} s, one client thread (pinned to CPU 0, the \
         sidecar to CPU 1), interleaved with the same traffic sent straight to 127.0.0.1:15001 in the same namespace, \
         to the same sidecar (so direct traffic pays whatever the path costs everything else: the sk_lookup program \
         runs, or conntrack for the redirect rule); the first row is direct against direct, the noise floor. TCP is \
         connect + request/reply + abort. Conntrack: entries in the path's namespace after {} more \
         connections. Each path has a namespace of its own.\n",
        kernel.trim(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        o.reps,
        o.seconds.as_secs_f64(),
        CONNECTIONS_FOR_CONNTRACK
    );
    let _ = writeln!(s, "| path | TCP connections /s | × direct | UDP requests /s | × direct | conntrack entries per 10,000 connections | errors |");
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {:.0} | {:.3} | {:.0} | {:.3} | {} | {} |",
            r.path.label(),
            r.tcp,
            r.tcp / r.direct_tcp,
            r.udp,
            r.udp / r.direct_udp,
            r.conntrack,
            r.errors
        );
    }
    let find = |p: Way| rows.iter().find(|r| r.path == p).expect("measured");
    let (sk, redirect) = (find(Way::SkLookup), find(Way::NftRedirect));
    let worst = (sk.tcp / sk.direct_tcp).min(sk.udp / sk.direct_udp);
    let check = |ok: bool| if ok { "met" } else { "MISSED" };
    let _ = writeln!(s, "\n### Targets\n");
    let _ = writeln!(s, "- sk_lookup ≥ 0.95 × direct: lowest ratio {worst:.3} — {}", check(worst >= 0.95));
    let _ = writeln!(
        s,
        "- sk_lookup above the nftables redirect rate: TCP {:.2}×, UDP {:.2}× — {}",
        sk.tcp / redirect.tcp,
        sk.udp / redirect.udp,
        check(sk.tcp > redirect.tcp && sk.udp > redirect.udp)
    );
    let _ = writeln!(s, "- zero conntrack entries for sk_lookup: {} — {}", sk.conntrack, check(sk.conntrack == 0));
    s
}
