//! bench/gateway: member-to-member traffic between two sites, through
//! hostmesh's gateway peers (four daemons, `hm-tun0` with TC programs on
//! every host) against the same four hosts joined by plain kernel VXLAN
//! devices and routes; and, encrypted, hostmesh's WireGuard peers against
//! the same hosts whose WAN hop is a hand-configured WireGuard link. The
//! two topologies of a comparison exist side by side, and every repetition
//! measures one and then the other. Writes its sections of
//! bench/RESULTS.md (`gateway`, `gateway-wireguard`).
//!
//! Run it with `./bench/run gateway` (as root). On a kernel without
//! WireGuard (this development machine's) the encrypted comparison runs in
//! a VM booted with Debian 12's kernel (`scripts/vm-run`; `--vm-kernel K`
//! picks another of the matrix's kernels, `--vm-kernel none` skips it).

mod sink;
mod topology;

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use hm_bench::load::{catch_interrupts, interrupted, tcp_rate, udp_rate};
use hm_bench::options::Options;
use hm_bench::results::{median, read_section, write_section};
use hm_testkit::{Netns, TempDir};

use topology::{Sites, Way, MA_WORKLOAD, MB_WORKLOAD};

/// Medians for one topology.
#[derive(Default)]
struct Row {
    throughput: Vec<f64>,
    requests: Vec<f64>,
    udp: Vec<f64>,
    errors: u64,
}

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
    ways: "**hostmesh**: four daemons, `hm-tun0` on every host, the tunnel destination chosen by TC programs. \
           **kernel VXLAN**: the same hosts joined by point-to-point VXLAN devices (one per hop, MTU 1450) and \
           plain routes, forwarding on the gateways.",
    explained: "Where the difference comes from (one `perf record -a` profile of the hostmesh throughput run, in \
                development): hostmesh's two TC programs are about 1.5% of CPU samples; the rest is the price of \
                a flow-based (`external`) VXLAN device, which every hop pays: a metadata dst allocated and freed \
                per received packet, and an outer route lookup per sent packet (a tunnel key set by BPF is never \
                cached). The spread between runs on these VMs is about ±4%.",
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
                programs. Under emulation (TCG) absolute numbers are far below real hardware's, and every hop \
                costs more than the work in it (in one `perf record -a` of this run, in development, the CPUs \
                were idle half the time: the rates are bound by wakeups between softirqs, workqueues and \
                CPUs); the unencrypted comparison measured in the same repetitions shows what the emulation \
                alone does to hostmesh's ratio.",
    reference: Some(&VXLAN),
};

fn measure(sites: &Sites, o: &Options, row: &mut Row) {
    eprintln!("measuring {}", sites.way.label());
    let src: IpAddr = MA_WORKLOAD.parse().unwrap();
    let dst = |port: u16| SocketAddr::new(MB_WORKLOAD.parse().unwrap(), port);
    row.throughput.push(sink::throughput(&sites.ma, src, dst(topology::SINK_PORT), o.seconds));
    let r = tcp_rate(&sites.ma, src, dst(topology::ECHO_PORT), o.seconds);
    row.requests.push(r.per_sec);
    row.errors += r.errors;
    let r = udp_rate(&sites.ma, src, dst(topology::ECHO_PORT), o.seconds);
    row.udp.push(r.per_sec);
    row.errors += r.errors;
}

/// Both topologies of `c` side by side (and its reference's), measured
/// in turns; its section.
fn compare(c: &Comparison, o: &Options) -> String {
    let baseline = Sites::build(c.baseline, o);
    let hostmesh = Sites::build(c.hostmesh, o);
    let reference = c.reference.map(|r| (Sites::build(r.baseline, o), Sites::build(r.hostmesh, o)));
    let (mut base, mut hm) = (Row::default(), Row::default());
    let (mut ref_base, mut ref_hm) = (Row::default(), Row::default());
    for rep in 0..o.reps {
        measure(&baseline, o, &mut base);
        measure(&hostmesh, o, &mut hm);
        if let Some((b, h)) = &reference {
            measure(b, o, &mut ref_base);
            measure(h, o, &mut ref_hm);
        }
        assert!(!interrupted(), "interrupted; cleaning up");
        eprintln!(
            "rep {}: throughput {:.0} vs {:.0} Mbit/s, TCP {:.0} vs {:.0} req/s, UDP {:.0} vs {:.0} req/s ({} vs {})",
            rep + 1,
            hm.throughput[rep] * 8e-6,
            base.throughput[rep] * 8e-6,
            hm.requests[rep],
            base.requests[rep],
            hm.udp[rep],
            base.udp[rep],
            c.hostmesh.label(),
            c.baseline.label(),
        );
    }
    let same_run = c.reference.map(|r| {
        let (b, h) = (r.baseline.label(), r.hostmesh.label());
        let ratios = ratios(&ref_base, &ref_hm).map(|(name, _, _, ratio)| format!("{name} {ratio:.3}"));
        format!("In the same repetitions, not encrypted, {h} ÷ {b}: {}.", ratios.join(", "))
    });
    report(c, o, &base, &hm, same_run)
}

/// Each measurement's medians, baseline and hostmesh, and their ratio.
fn ratios(base: &Row, hm: &Row) -> [(&'static str, f64, f64, f64); 3] {
    let rows = [
        ("TCP throughput (Mbit/s)", median(base.throughput.clone()) * 8e-6, median(hm.throughput.clone()) * 8e-6),
        ("TCP requests /s (new connection each)", median(base.requests.clone()), median(hm.requests.clone())),
        ("UDP requests /s", median(base.udp.clone()), median(hm.udp.clone())),
    ];
    rows.map(|(name, b, h)| (name, b, h, h / b))
}

/// Whether this kernel makes WireGuard links (a link made, in a namespace
/// of its own, and dropped with it).
fn kernel_has_wireguard() -> bool {
    let ns = Netns::new();
    ns.exec_output("ip", &["link", "add", "wg-probe", "type", "wireguard"]).status.success()
}

/// The encrypted comparison run by this program in a VM booted with
/// `kernel` (scripts/vm-run); its section.
fn compare_in_vm(kernel: &str, o: &Options) -> String {
    let dir = TempDir::new("hm-bench-gw-vm");
    let out = dir.join("RESULTS.md");
    let me = std::env::current_exe().expect("own path");
    // The VM's command runs in `dir`.
    let hostmesh = o.hostmesh.canonicalize().expect("the hostmesh binary");
    let vm_run = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/vm-run");
    let (seconds, reps) = (o.seconds.as_secs_f64().to_string(), o.reps.to_string());
    eprintln!("this kernel has no WireGuard: the encrypted comparison runs in a VM with kernel {kernel}");
    let status = std::process::Command::new(&vm_run)
        .arg(kernel)
        .arg(dir.path())
        .arg(&me)
        .args(["--hostmesh".as_ref(), hostmesh.as_os_str()])
        .args(["--seconds", &seconds, "--reps", &reps, "--ways", "wireguard"])
        .args(["--out".as_ref(), out.as_os_str()])
        .status()
        .unwrap_or_else(|e| panic!("{}: {e}", vm_run.display()));
    assert!(status.success(), "the encrypted comparison failed in the VM ({status})");
    read_section(&out, WIREGUARD.section).expect("the VM's run wrote its section")
}

fn main() {
    hm_testkit::require_root();
    catch_interrupts();
    let o = Options::parse(7, &["ways", "vm-kernel"]);
    let ways = o.extra.get("ways").map_or("all", String::as_str);
    assert!(["all", "vxlan", "wireguard"].contains(&ways), "--ways all|vxlan|wireguard, not {ways}");
    eprintln!("hostmesh ({}), {} s x {} reps per measurement", o.hostmesh.display(), o.seconds.as_secs_f64(), o.reps);
    let mut sections = Vec::new();
    if ways != "wireguard" {
        sections.push((VXLAN.section, compare(&VXLAN, &o)));
    }
    if ways != "vxlan" {
        let vm_kernel = o.extra.get("vm-kernel").map_or("6.1", String::as_str);
        if kernel_has_wireguard() {
            sections.push((WIREGUARD.section, compare(&WIREGUARD, &o)));
        } else if ways == "wireguard" || vm_kernel != "none" {
            assert!(ways == "all", "--ways wireguard: this kernel has no WireGuard");
            sections.push((WIREGUARD.section, compare_in_vm(vm_kernel, &o)));
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

fn report(c: &Comparison, o: &Options, base: &Row, hm: &Row, same_run: Option<String>) -> String {
    let mut s = String::new();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let (b, h) = (c.baseline.label(), c.hostmesh.label());
    let _ = writeln!(s, "## bench/gateway: {}\n", c.title);
    let _ = writeln!(s, "Command (as root): `./bench/run gateway`\n");
    let _ = writeln!(
        s,
        "One run on Linux {} with {} CPUs{}. Two sites in namespaces: member A — gateway A — WAN — gateway B — \
         member B, workload addresses on the members' `lo`. {} Both topologies exist side by side; every \
         repetition measures one and then the other. Throughput: one TCP connection writing 64 KiB chunks for \
         {} s, counted by the receiver. Requests: TCP connect + 32-byte request/reply + abort, and UDP \
         request/reply, one client thread. Medians of {} repetitions.\n",
        kernel.trim(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        // scripts/vm-run says so in the VMs it boots.
        std::env::var("HOSTMESH_VM").map(|vm| format!(", in a VM: {vm}")).unwrap_or_default(),
        c.ways,
        o.seconds.as_secs_f64(),
        o.reps,
    );
    let _ = writeln!(s, "| measurement | {b} | {h} | {h} ÷ {b} |");
    let _ = writeln!(s, "|---|---:|---:|---:|");
    let rows = ratios(base, hm);
    for (name, b, h, ratio) in rows {
        let _ = writeln!(s, "| {name} | {b:.0} | {h:.0} | {ratio:.3} |");
    }
    let _ = writeln!(s, "\nErrors: {b} {}, {h} {}.", base.errors, hm.errors);
    if let Some(line) = same_run {
        let _ = writeln!(s, "\n{line}");
    }
    let _ = writeln!(s, "\n{}", c.explained);
    let worst = rows.iter().map(|r| r.3).fold(f64::INFINITY, f64::min);
    let _ = writeln!(s, "\n### Targets\n");
    let _ = writeln!(
        s,
        "- {h} ≥ 0.9 × {b}, throughput and request rate: lowest ratio {worst:.3} — {}",
        if worst >= 0.9 { "met" } else { "MISSED" }
    );
    s
}
