//! bench/failover: how long site-to-site traffic stops when the gateway in
//! use of site A dies (its links down, as a dead host), with hostmesh's own
//! failover (defaults, and fast probes) beside keepalived moving VRRP
//! addresses between the same two gateway hosts (`advert_int 1`, and its
//! fastest setting that holds); and, under the same load, a SIGKILL and
//! restart of the daemon of the gateway in use, which must move no traffic
//! anywhere. Every trial builds the sites afresh
//! (hm_testkit::gateway_pairs); the ways take turns, trial by trial, in one
//! run. Writes its section of bench/RESULTS.md.
//!
//! Run it with `./bench/run failover` (as root); `--reps N` trials of each
//! way (default 5).

mod measure;
mod topology;

use std::fmt::Write as _;
use std::time::Duration;

use hm_bench::load::{catch_interrupts, interrupted};
use hm_bench::options::Options;
use hm_bench::results::median;

use measure::Outcome;
use topology::{Trial, Way};

/// The ways, with keepalived's fast `advert_int` (`--vrrp-fast`, default
/// 0.01: VRRP v3's least, which held on the 2-CPU development VM, as 0.1,
/// 0.05 and 0.02 did; the table says whether it held in every trial).
fn ways(vrrp_fast: &'static str) -> [(String, Way); 4] {
    [
        ("hostmesh, defaults (probes every 1 s, 3 lost)".into(), Way::Hostmesh("")),
        ("hostmesh, fast (probes every 200 ms, 3 lost)".into(), Way::Hostmesh(FAST)),
        ("keepalived, advert_int 1".into(), Way::Keepalived("1")),
        (format!("keepalived, advert_int {vrrp_fast} (VRRP v3)"), Way::Keepalived(vrrp_fast)),
    ]
}

/// How long the load runs before the gateway dies: 2 s, and a fifth of a
/// second more each trial, so failures meet the probes and adverts (sent
/// every second with the defaults) at different phases.
fn before(trial: usize) -> Duration {
    Duration::from_secs(2) + Duration::from_millis(200) * (trial % 5) as u32
}

/// How long each way's load runs after the gateway dies: past its
/// expected outage, with room for a SYN's second retransmission.
fn after(way: Way) -> Duration {
    match way {
        Way::Hostmesh("") | Way::Keepalived("1") => Duration::from_secs(9),
        _ => Duration::from_secs(5),
    }
}

fn main() {
    hm_testkit::require_root();
    catch_interrupts();
    let o = Options::parse(5, &["vrrp-fast"]);
    let vrrp_fast: &'static str = o.extra.get("vrrp-fast").cloned().unwrap_or_else(|| "0.01".into()).leak();
    let ways = ways(vrrp_fast);
    eprintln!("hostmesh ({}), {} trials of each way", o.hostmesh.display(), o.reps);
    let mut rows: Vec<Vec<Outcome>> = vec![Vec::new(); ways.len()];
    let mut restarts: Vec<(Outcome, usize)> = Vec::new();
    for trial in 0..o.reps {
        for (i, (label, way)) in ways.iter().enumerate() {
            let t = Trial::build(*way, &o.hostmesh);
            let mut held = true;
            let mut out = measure::failover(&t.hosts[0], before(trial), after(*way), || {
                if let Way::Keepalived(_) = way {
                    held = t.vrrp_held();
                }
                t.kill_first_gateway_of_a()
            });
            out.held = held;
            eprintln!(
                "trial {}: {label}: outage {:.2} s ({} failed, {} stalled of {}), stream {} (longest stall {:.2} s){}",
                trial + 1,
                out.outage.as_secs_f64(),
                out.failed,
                out.stalled,
                out.attempts,
                if out.stream_survived { "survived" } else { "BROKEN" },
                out.stream_stall.as_secs_f64(),
                if out.held { "" } else { "; the VRRP master had already moved before the failure" }
            );
            rows[i].push(out);
            drop(t);
            assert!(!interrupted(), "interrupted; cleaning up");
        }
        restarts.push(restart(trial, &o));
        assert!(!interrupted(), "interrupted; cleaning up");
    }
    let text = report(&o, &ways, &rows, &restarts);
    print!("{text}");
    hm_bench::results::write_section(&o.out, "failover", &text).expect("write bench/RESULTS.md");
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// The probes whose down time is shorter than a restart: a daemon restart
/// must move no traffic even with these.
const FAST: &str = "probe_interval = \"200ms\"\nprobe_loss = 3";

/// One restart of the daemon of the gateway in use (SIGKILL, started
/// again at once) under the same load, with fast probes: the outcome, and
/// how many times any host moved traffic meanwhile.
fn restart(trial: usize, o: &Options) -> (Outcome, usize) {
    let t = Trial::build(Way::Hostmesh(FAST), &o.hostmesh);
    let moves = t.moves();
    let out = measure::failover(&t.hosts[0], before(trial), Duration::from_secs(5), || {
        t.restart_daemon_of_first_gateway_of_a()
    });
    let moved = t.moves() - moves;
    eprintln!(
        "trial {}: daemon restart: {moved} failovers, {} failed and {} stalled of {} attempts, stream {}",
        trial + 1,
        out.failed,
        out.stalled,
        out.attempts,
        if out.stream_survived { "survived" } else { "BROKEN" }
    );
    (out, moved)
}

fn report(o: &Options, ways: &[(String, Way)], rows: &[Vec<Outcome>], restarts: &[(Outcome, usize)]) -> String {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let keepalived = std::process::Command::new("keepalived")
        .arg("--version")
        .output()
        .map(|out| String::from_utf8_lossy(&out.stderr).lines().next().unwrap_or_default().to_string())
        .unwrap_or_default();
    let mut s = String::new();
    let _ = writeln!(s, "## bench/failover: the gateway of a site dies\n");
    let _ = writeln!(s, "Command (as root): `./bench/run failover`\n");
    let _ = writeln!(
        s,
        "One run on Linux {} with {} CPUs; {keepalived}. Two sites of two gateways each in namespaces behind \
         bridges (hm_testkit::gateway_pairs), hostmesh on every host. Site A's first gateway dies (its links set \
         down; 2 s after the load starts, 0.2 s later each trial, so the failure meets probes and adverts at \
         different phases) while A's member opens a connection to B's member every {} ms (connect, read a greeting) and one \
         TCP connection opened before exchanges 64 bytes every 10 ms. An attempt that errs or takes longer than \
         {} ms (a SYN lost on the dead gateway waits for its retransmission) counts; the outage is from the first \
         such attempt to the last, plus one period. **hostmesh**: A's member lists both gateways of A, B's \
         gateways list both of A, each judging by its own probes. **keepalived**: A's gateways run Debian's \
         keepalived (VRRP only, both instances in a sync group) moving a LAN and a WAN address together; A's \
         member sends to the LAN address and B's gateways to the WAN address. {} trials of each way, in turns; \
         the sites are built afresh for every trial. Each trial also kills the daemon of site A's gateway in use \
         (SIGKILL) under the same load with 200 ms probes, starts it again at once, and counts the moves of \
         traffic to another gateway on every host (the restart's own goal).\n",
        kernel.trim(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        measure::PERIOD.as_millis(),
        measure::STALLED.as_millis(),
        o.reps,
    );
    let _ = writeln!(
        s,
        "| way | outage, median (s) | min–max (s) | failed / stalled attempts | stream survived | longest stream \
         stall, median (s) | held until the failure |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|");
    let med = |r: &[Outcome]| median(r.iter().map(|o| secs(o.outage)).collect());
    for ((label, _), r) in ways.iter().zip(rows) {
        let (lo, hi) = r.iter().map(|o| secs(o.outage)).fold((f64::INFINITY, 0f64), |(a, b), x| (a.min(x), b.max(x)));
        let _ = writeln!(
            s,
            "| {label} | {:.2} | {lo:.2}–{hi:.2} | {} / {} | {} of {} | {:.2} | {} of {} |",
            med(r),
            r.iter().map(|o| o.failed).sum::<usize>(),
            r.iter().map(|o| o.stalled).sum::<usize>(),
            r.iter().filter(|o| o.stream_survived).count(),
            r.len(),
            median(r.iter().map(|o| secs(o.stream_stall)).collect()),
            r.iter().filter(|o| o.held).count(),
            r.len(),
        );
    }
    let worst = |r: &[Outcome]| r.iter().map(|o| secs(o.outage)).fold(0f64, f64::max);
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    let (defaults, fast, vrrp) = (&rows[0], &rows[1], &rows[2]);
    let survived = rows[..2].iter().all(|r| r.iter().all(|o| o.stream_survived));
    let _ = writeln!(s, "\n### Goals\n");
    let _ = writeln!(
        s,
        "- outage with the defaults ≤ 3.5 s in every trial: worst {:.2} s — {}",
        worst(defaults),
        verdict(worst(defaults) <= 3.5)
    );
    let _ = writeln!(
        s,
        "- outage with the defaults ≤ keepalived's with advert_int 1 (medians): {:.2} s vs {:.2} s — {}",
        med(defaults),
        med(vrrp),
        verdict(med(defaults) <= med(vrrp))
    );
    let _ = writeln!(
        s,
        "- outage with fast settings ≤ 1 s in every trial: worst {:.2} s — {}",
        worst(fast),
        verdict(worst(fast) <= 1.0)
    );
    let _ = writeln!(s, "- the established TCP connection survives every hostmesh failover — {}", verdict(survived));
    let moved: usize = restarts.iter().map(|(_, m)| m).sum();
    let _ = writeln!(
        s,
        "- failovers caused by a daemon restart: 0 — {moved} in {} restarts of the daemon of the gateway in use \
         (SIGKILL, started again at once, probes every 200 ms, 3 lost; {} failed and {} stalled attempts, the \
         connection survived {} of {}) — {}",
        restarts.len(),
        restarts.iter().map(|(o, _)| o.failed).sum::<usize>(),
        restarts.iter().map(|(o, _)| o.stalled).sum::<usize>(),
        restarts.iter().filter(|(o, _)| o.stream_survived).count(),
        restarts.len(),
        verdict(moved == 0)
    );
    s
}
