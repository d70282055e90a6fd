//! bench/gateway: member-to-member traffic between two sites, through
//! hostmesh's gateway peers (four daemons, `hm-tun0` with TC programs on
//! every host) against the same four hosts joined by plain kernel VXLAN
//! devices and routes; and, encrypted, hostmesh's WireGuard peers against
//! the same hosts whose WAN hop is a hand-configured WireGuard link. The
//! topologies of a comparison exist side by side, and several client
//! threads switch between them together in short slices (`interleave`),
//! so the CPUs are saturated and whatever else loads the machine hits
//! every way alike. Writes its sections of bench/RESULTS.md (`gateway`,
//! `gateway-wireguard`).
//!
//! Run it with `./bench/run gateway` (as root). On a kernel without
//! WireGuard (this development machine's) the encrypted comparison runs in
//! a VM booted with Debian 12's kernel (`scripts/vm-run`; `--vm-kernel K`
//! picks another of the matrix's kernels, `--vm-kernel none` skips it).

mod topology;

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use hm_bench::interleave::{self, Kind, Measured, Path as Route, Plan};
use hm_bench::load::catch_interrupts;
use hm_bench::options::Options;
use hm_bench::progstats;
use hm_bench::results::{read_section, write_section};
use hm_testkit::TempDir;

use topology::{Sites, Way, ECHO_PORT, MA_WORKLOAD, MB_WORKLOAD, SINK_PORT};

/// The measurements: a name, the traffic, its port on B's member, and the
/// factor from its rate to the unit shown (bulk: bytes/s to Mbit/s).
const KINDS: [(&str, Kind, u16, f64); 3] = [
    ("TCP requests /s (new connection each)", Kind::Tcp, ECHO_PORT, 1.0),
    ("UDP requests /s", Kind::Udp, ECHO_PORT, 1.0),
    ("TCP bulk (Mbit/s)", Kind::Bulk, SINK_PORT, 8e-6),
];

/// hostmesh's way against a hand-built baseline, and how the section
/// describes them.
struct Comparison {
    section: &'static str,
    title: &'static str,
    baseline: Way,
    hostmesh: Way,
    ways: &'static str,
    explained: &'static str,
    /// Another comparison measured in the same repetitions, whose ratios
    /// the section shows beside its own (what the machine alone does to
    /// hostmesh's ratio).
    reference: Option<&'static Comparison>,
}

const VXLAN: Comparison = Comparison {
    section: "gateway",
    title: "gateway peers",
    baseline: Way::KernelVxlan,
    hostmesh: Way::Hostmesh,
    ways: "**hostmesh**: four daemons, `hm-tun0` on every host, each route into it carrying its tunnel key \
           (`encap ip`), TC programs on it checking what arrives and sending learned replies back. **kernel \
           VXLAN**: the same hosts joined by point-to-point VXLAN devices (one per hop, MTU 1450) and plain \
           routes, forwarding on the gateways.",
    explained: "Where the difference comes from (in development, Dec 2026): every hop of hostmesh's pays what a \
                flow-based (`external`) VXLAN device costs, a metadata dst allocated and freed per received \
                packet (`dst_release`, `dst_destroy`, `call_rcu` in a `perf record -a`), and its TC programs \
                (above). The routes carry the tunnel key, so the device keeps each far end's outer route cached \
                as a static device does; with the key set by a program for every packet, as until Dec 2026, each \
                sent packet looked its outer route up again (in runs of the same day: TCP requests 0.856 → \
                0.86–0.90, bulk 0.932 → 0.93–0.96). A gateway learns a reply's way back only for a member \
                address that no `[[member]]` CIDR of that member covers: the others' replies take the route. A \
                gateway forwards from `hm-tun0` back into it without ICMP redirects (`send_redirects`; in one \
                run: TCP requests 0.86 → 0.89, UDP 0.88 → 0.92). The same hosts joined by flow-based devices \
                and `encap ip` routes with no programs measured 0.957 / 0.936 / 0.956 × kernel VXLAN (by hand): \
                the rest of the gap is the programs. On a gateway each packet's tunnel key is read, its sender \
                looked up among the peers' gateways, and its 5-tuple among the learned paths (HM_GW_CT: a table \
                of 131,072 buckets, where a lookup that misses costs a cache miss).",
    reference: None,
};

const WIREGUARD: Comparison = Comparison {
    section: "gateway-wireguard",
    title: "encrypted gateway peers (WireGuard)",
    baseline: Way::KernelWireguard,
    hostmesh: Way::HostmeshEncrypted,
    ways: "**hostmesh encrypted**: four daemons as above, the gateways' peer `encryption = \"wireguard\"`: VXLAN \
           between the gateways inside hostmesh's `hm-wg0`. **kernel WireGuard**: the hand-built topology of \
           the `gateway` section with its WAN hop a WireGuard link made by hand (`ip link add wg0 type \
           wireguard`, `wg set` of Debian's wireguard-tools, MTU 1420) instead of VXLAN.",
    explained: "Both ways pay the same encryption; hostmesh adds VXLAN inside the tunnel (50 bytes more per \
                packet, and one more encapsulation and decapsulation, each a softirq pass of its own) and its TC \
                programs; and its steering's policy rules (`not fwmark … lookup 26733`) make the kernel validate \
                the source of every packet a gateway receives with a full FIB lookup through the rules \
                (fib_validate_source), which the hand-built link, without rules, skips (natively, one such rule \
                on the unencrypted gateways took TCP requests 0.87 → 0.82, UDP 0.88 → 0.83, bulk 0.97 → 0.89 × \
                kernel VXLAN in one run, Dec 2026). Under emulation (TCG) absolute numbers are far below real hardware's, and the per-packet \
                work of every hop weighs more than natively: the unencrypted comparison, measured in the same \
                rounds, shows what the emulation alone does to hostmesh's ratio (compare the `gateway` section, \
                measured natively).",
    reference: Some(&VXLAN),
};

/// Every kind of traffic over the ways of `c` (and its reference's), the
/// ways interleaved; its section.
fn compare(c: &Comparison, o: &Options, plan: &Plan) -> String {
    let mut ways = vec![c.baseline, c.hostmesh];
    if let Some(r) = c.reference {
        ways.extend([r.baseline, r.hostmesh]);
    }
    let sites: Vec<Sites> = ways.iter().map(|w| Sites::build(*w, o, plan.clients)).collect();
    let src: IpAddr = MA_WORKLOAD.parse().unwrap();
    let measured = KINDS.map(|(name, kind, port, _)| {
        eprintln!("measuring {name}: {}", ways.iter().map(|w| w.label()).collect::<Vec<_>>().join(", "));
        let dst = SocketAddr::new(MB_WORKLOAD.parse().unwrap(), port);
        let paths: Vec<Route> = sites.iter().map(|s| Route { ns: &s.ma, src, dst }).collect();
        interleave::measure(kind, &paths, plan)
    });
    let programs = profile(&sites, plan);
    report(c, plan, &measured, &programs)
}

/// Where hostmesh's BPF time goes: a pass of a fifth of the rounds of
/// every kind of traffic, all ways, with the kernel's run-time statistics
/// on (BPF_ENABLE_STATS), whose rates are not reported. The measured
/// passes run without them, as a host in service does: they cost every
/// program run two clock reads, which only hostmesh's ways would pay.
fn profile(sites: &[Sites], plan: &Plan) -> Vec<(String, u64, f64)> {
    let _stats = progstats::enable().expect("BPF_ENABLE_STATS");
    let before = progstats::snapshot("hm_");
    let short = Plan { rounds: (plan.rounds / 5).max(2), ..*plan };
    let src: IpAddr = MA_WORKLOAD.parse().unwrap();
    for (_, kind, port, _) in KINDS {
        let dst = SocketAddr::new(MB_WORKLOAD.parse().unwrap(), port);
        let paths: Vec<Route> = sites.iter().map(|s| Route { ns: &s.ma, src, dst }).collect();
        interleave::measure(kind, &paths, &short);
    }
    progstats::since(&before, &progstats::snapshot("hm_"))
}

/// The encrypted comparison run by this program in a VM booted with
/// `kernel` (scripts/vm-run); its section.
fn compare_in_vm(kernel: &str, o: &Options, plan: &Plan) -> String {
    let dir = TempDir::new("hm-bench-gw-vm");
    let out = dir.join("RESULTS.md");
    let me = std::env::current_exe().expect("own path");
    // The VM's command runs in `dir`.
    let hostmesh = o.hostmesh.canonicalize().expect("the hostmesh binary");
    let vm_run = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/vm-run");
    // Under emulation every rate is some 50 times lower: slices five times
    // longer hold enough requests for each round's ratio to mean something
    // (at 100 ms, the spread of the bulk ratio was 0.3 to 1.9).
    let plan = [
        ("--clients", plan.clients.to_string()),
        ("--rounds", plan.rounds.to_string()),
        ("--slice-ms", (plan.slice.as_millis() * 5).to_string()),
    ];
    eprintln!("this kernel has no WireGuard: the encrypted comparison runs in a VM with kernel {kernel}");
    let status = std::process::Command::new(&vm_run)
        .arg(kernel)
        .arg(dir.path())
        .arg(&me)
        .args(["--hostmesh".as_ref(), hostmesh.as_os_str()])
        .args(plan.iter().flat_map(|(flag, value)| [*flag, value.as_str()]))
        .args(["--ways", "wireguard"])
        .args(["--out".as_ref(), out.as_os_str()])
        .status()
        .unwrap_or_else(|e| panic!("{}: {e}", vm_run.display()));
    assert!(status.success(), "the encrypted comparison failed in the VM ({status})");
    read_section(&out, WIREGUARD.section).expect("the VM's run wrote its section")
}

fn main() {
    hm_testkit::require_root();
    catch_interrupts();
    let o = Options::parse(1, &[&["ways", "vm-kernel"][..], &Plan::FLAGS].concat());
    let plan = Plan::from_options(&o, 30);
    let ways = o.extra.get("ways").map_or("all", String::as_str);
    assert!(["all", "vxlan", "wireguard"].contains(&ways), "--ways all|vxlan|wireguard, not {ways}");
    eprintln!("hostmesh ({}), {}", o.hostmesh.display(), plan.describe());
    let mut sections = Vec::new();
    if ways != "wireguard" {
        sections.push((VXLAN.section, compare(&VXLAN, &o, &plan)));
    }
    if ways != "vxlan" {
        let vm_kernel = o.extra.get("vm-kernel").map_or("6.1", String::as_str);
        if hm_testkit::kernel_makes_wireguard_links() {
            sections.push((WIREGUARD.section, compare(&WIREGUARD, &o, &plan)));
        } else if ways == "wireguard" || vm_kernel != "none" {
            assert!(ways == "all", "--ways wireguard: this kernel has no WireGuard");
            sections.push((WIREGUARD.section, compare_in_vm(vm_kernel, &o, &plan)));
        } else {
            eprintln!("this kernel has no WireGuard and --vm-kernel is none: no encrypted comparison");
        }
    }
    for (name, report) in sections {
        println!("{report}");
        write_section(&o.out, name, &report).expect("write results");
        eprintln!("wrote the {name} section of {}", o.out.display());
    }
}

fn report(c: &Comparison, plan: &Plan, measured: &[Measured; 3], programs: &[(String, u64, f64)]) -> String {
    let mut s = String::new();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let (b, h) = (c.baseline.label(), c.hostmesh.label());
    let _ = writeln!(s, "## bench/gateway: {}\n", c.title);
    let _ = writeln!(s, "Command (as root): `./bench/run gateway`\n");
    let _ = writeln!(
        s,
        "One run on Linux {} with {} CPUs{}. Two sites in namespaces: member A — gateway A — WAN — gateway B — \
         member B, workload addresses on the members' `lo`. {} The topologies exist side by side. {} client \
         threads (and as many server threads) keep the CPUs saturated: TCP is connect + 32-byte request/reply + \
         abort, UDP request/reply, bulk a TCP stream per client thread, of 16 KiB writes, to a sink. Every \
         measurement interleaves the ways in {} ms slices over {} rounds (after a warm-up round); × is the ratio \
         of the rates, the spread the 10th–90th percentile of the per-round ratios.\n",
        kernel.trim(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        // scripts/vm-run says so in the VMs it boots.
        std::env::var("HOSTMESH_VM").map(|vm| format!(", in a VM: {vm}")).unwrap_or_default(),
        c.ways,
        plan.clients,
        plan.slice.as_millis(),
        plan.rounds,
    );
    let _ = writeln!(s, "| measurement | {b} | {h} | × | spread | errors |");
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|");
    for ((name, _, _, unit), m) in KINDS.iter().zip(measured) {
        let _ = writeln!(
            s,
            "| {name} | {:.0} | {:.0} | {:.3} | {:.3}–{:.3} | {} / {} |",
            m.per_sec[0] * unit,
            m.per_sec[1] * unit,
            m.ratio(1),
            m.spread[1].low,
            m.spread[1].high,
            m.errors[0],
            m.errors[1],
        );
    }
    if let Some(r) = c.reference {
        let ratios: Vec<String> = KINDS
            .iter()
            .zip(measured)
            .map(|((name, ..), m)| format!("{name} {:.3}", m.ratio(3) / m.ratio(2)))
            .collect();
        let _ = writeln!(
            s,
            "\nIn the same rounds, not encrypted, {} ÷ {}: {}.",
            r.hostmesh.label(),
            r.baseline.label(),
            ratios.join(", ")
        );
    }
    let _ = writeln!(
        s,
        "\nhostmesh's BPF programs (every host's, summed), from a pass of a fifth of the rounds after the \
         measurement with the kernel's run-time statistics on (BPF_ENABLE_STATS; the measured passes run \
         without them, as a host in service does, since they cost every program run two clock reads), every \
         kind of traffic together:\n"
    );
    let _ = writeln!(s, "| program | runs | ns per run |");
    let _ = writeln!(s, "|---|---:|---:|");
    for (name, runs, ns) in programs {
        let _ = writeln!(s, "| {name} | {runs} | {ns:.0} |");
    }
    let _ = writeln!(s, "\n{}", c.explained);
    let worst = measured.iter().map(|m| m.ratio(1)).fold(f64::INFINITY, f64::min);
    let _ = writeln!(s, "\n### Targets\n");
    let _ = writeln!(
        s,
        "- {h} ≥ 0.9 × {b}, request rates and bulk: lowest ratio {worst:.3} — {}",
        if worst >= 0.9 { "met" } else { "MISSED" }
    );
    s
}
