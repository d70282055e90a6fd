//! bench/soak: hostmesh under steady load on every path (connect-time LB,
//! long connections, the veth path, a node port from another machine, a
//! mesh redirect to a real sidecar, two sites joined by two gateways each)
//! while faults land from a seeded schedule — edits, signals, restarts, a
//! SIGKILL during a sync, links flapped, a route deleted, a map unpinned,
//! rp_filter changed, backends and the sidecar killed, conntrack filled, a
//! gateway cut off, a gateway's daemon killed. It records per minute the
//! connections tried and failed, the failures no fault explains, the
//! daemons' RSS and fds, map entries and conntrack; then stops the
//! load, waits for conntrack to drain, tears down and checks nothing is
//! left. Exit 0 when every goal holds, 1 naming the failing minute and
//! fault.
//!
//! `./bench/run soak --minutes 60 [--seed N]` (as root); not part of the
//! suite. A run of 60 minutes or more writes its table to bench/RESULTS.md.

mod clients;
mod faults;
mod report;
mod sites;
mod world;

use std::sync::Arc;
use std::time::{Duration, Instant};

use hm_bench::load::{catch_interrupts, interrupted, InCgroup};
use hm_bench::options::Options;

use clients::{Load, Recorder};
use report::{Sample, Soak};
use world::World;

/// How often the daemon's RSS, fds and counts are sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(10);

fn main() {
    hm_testkit::require_root();
    catch_interrupts();
    let o = Options::parse(1, &["minutes", "seed", "only"]);
    let minutes: u64 = o.extra.get("minutes").map_or(60, |m| m.parse().expect("--minutes N"));
    let seed: u64 = o.extra.get("seed").map_or_else(
        || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() % 100_000,
        |s| s.parse().expect("--seed N"),
    );
    let only: Vec<String> = o.extra.get("only").map_or(vec![], |v| v.split(',').map(String::from).collect());
    let plan = faults::schedule(seed, minutes, &only);
    println!("bench/soak: {minutes} minute(s), seed {seed}, {} faults:", plan.len());
    for (at, f) in &plan {
        println!("  {:>4}:{:02} {f:?}", at / 60, at % 60);
    }

    let cg = InCgroup::enter();
    let mut w = World::new(&o.hostmesh, cg.path().to_path_buf());
    w.start_daemon();
    // Backends serve once their first checks passed, a moment after READY.
    let mut ready = clients::preflight(&w);
    let waiting = Instant::now();
    while ready.is_err() && waiting.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(200));
        ready = clients::preflight(&w);
    }
    if let Err(e) = ready {
        let (_, status) = w.hostmesh(&["status", "--state-dir", w.opts.state_dir.to_str().unwrap()]);
        let status: Vec<&str> = status.lines().filter(|l| !l.starts_with("  service ")).collect();
        eprintln!("bench/soak: before any fault, {e}\n{}", status.join("\n"));
        teardown(&mut w);
        drop(w);
        drop(cg);
        std::process::exit(1);
    }
    let rec = Arc::new(Recorder::new(Instant::now()));
    let load = Load::start(&w, &rec);
    let mut soak = Soak { minutes, seed, samples: vec![], excuses: vec![], applied: vec![] };
    run(&mut w, &rec, &plan, &mut soak);
    load.stop();
    let drained = report::wait_drained(&w);
    let failures = rec.failures();
    if !report::unexplained(&failures, &soak.excuses).is_empty() {
        diagnose(&w);
    }
    let leftovers = teardown(&mut w);
    let verdict = soak.verdict(&rec, &failures, drained, &leftovers);
    print!("{}", soak.table(&rec, &failures));
    print!("{verdict}");
    if minutes >= 60 {
        let body = format!("{}{}\n{verdict}", report::heading(minutes, seed, plan.len()), soak.table(&rec, &failures));
        hm_bench::results::write_section(&o.out, "bench/soak", &body).expect("write RESULTS.md");
    }
    drop(w);
    drop(cg);
    std::process::exit(if verdict.ok() { 0 } else { 1 });
}

/// The soak's timeline: each fault at its time, a sample every
/// `SAMPLE_EVERY`, until the end or an interrupt.
fn run(w: &mut World, rec: &Recorder, plan: &[(u64, faults::Fault)], soak: &mut Soak) {
    let end = rec.start + Duration::from_secs(soak.minutes * 60);
    let mut rng = faults::Rng::new(soak.seed ^ 0xfeed);
    let mut next_sample = rec.start;
    let mut next = plan.iter().peekable();
    while Instant::now() < end && !interrupted() {
        if Instant::now() >= next_sample {
            soak.samples.push(Sample::take(w, rec));
            next_sample += SAMPLE_EVERY;
        }
        if let Some((at, f)) = next.peek().copied() {
            if rec.start + Duration::from_secs(*at) <= Instant::now() {
                next.next();
                soak.applied.push((rec.ms(Instant::now()), *f));
                let ms = |t: Instant| rec.ms(t);
                if let Some(e) = faults::apply(*f, w, &mut rng, &ms) {
                    soak.excuses.push(e);
                }
                continue;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What a failing soak leaves to look at: the host's neighbours and what
/// `hostmesh explain` says of each loaded path, as the soak ends.
fn diagnose(w: &World) {
    use world::*;
    eprintln!("bench/soak: the state at the end, for the failures below:");
    eprintln!("host neighbours:\n{}", w.host.ip(&["neigh", "show"]));
    let from = format!("{OUTSIDE}:40000");
    for (target, from) in [
        (format!("{HOST_OUTSIDE}:{NODE_PORT}/tcp"), Some(from.as_str())),
        (format!("{DNS_VIP}:{DNS_PORT}/udp"), None),
        (format!("{WEB_VIP}:{WEB_PORT}/tcp"), None),
        (format!("{MESH_VIP}:{MESH_PORT}/tcp"), None),
    ] {
        let mut args = vec!["explain", target.as_str()];
        args.extend(from.iter().flat_map(|f| ["--from", *f]));
        let paths = w.opts.path_args();
        let all: Vec<&str> = args.iter().copied().chain(paths.iter().map(String::as_str)).collect();
        let (_, text) = w.hostmesh(&all);
        eprintln!("$ hostmesh {}\n{text}", args.join(" "));
    }
    for member in [sites::MA, sites::MB] {
        eprintln!("{}", w.sites.status_text(member));
    }
}

/// `hostmesh teardown`, the daemon stopped first, and the same on every
/// host of the sites; what is left after it.
fn teardown(w: &mut World) -> Vec<String> {
    let mut left = world::teardown(&w.host, &w.opts, w.daemon.take());
    left.extend(w.sites.teardown());
    left
}
