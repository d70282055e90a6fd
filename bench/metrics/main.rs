//! bench/metrics: does scraping slow the daemon down? A daemon with N
//! services (two backends each; N = 10 and 1,000 by default, each in a
//! namespace of its own), edited the same way twice: alone, and while
//! client threads scrape
//! /metrics at a fixed total rate (1,000 scrapes/s by default, for the
//! whole edit series, at least 10 s). An edit is one drop-in written
//! (a service added, or its backend changed), from the file closed to
//! the status file showing the sync that applied it; the debounce (150
//! ms) is in both. The two series alternate in rounds (alone, loaded,
//! alone, ...) so drift on the machine falls on both. Writes its section
//! of bench/RESULTS.md.
//!
//! Then (`on_off.rs`) what the endpoint costs the daemon's edits at
//! `--large N` services (100,000 by default; 0 skips it): a daemon with
//! metrics on beside one with them off.
//!
//! Run it with `./bench/run metrics` (as root); `--rate N`, `--threads N`,
//! `--edits N` (per series), `--services N,N`, `--large N`.

mod on_off;

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hm_bench::load::{catch_interrupts, interrupted};
use hm_bench::options::Options;
use hm_bench::results::median;
use hm_testkit::{Cgroup, Daemon, DaemonOptions, Netns, TempDir};

const METRICS: &str = "127.0.0.1:9853";
fn services(n: u32) -> String {
    let mut s = String::new();
    for i in 0..n {
        let (a, b) = (i / 250, i % 250);
        let _ = write!(
            s,
            "[[service]]\nname = \"s{i}\"\nvip = \"10.96.{a}.{b}\"\nport = 80\n\
             backends = [\"192.168.{a}.{b}:8080\", \"192.168.{a}.{}:8080\"]\n",
            b + 1
        );
    }
    s
}

/// The generation in the status file (0 before the first).
fn generation(opts: &DaemonOptions) -> u64 {
    let text = std::fs::read_to_string(opts.state_dir.join("status.json")).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    v["generation"].as_u64().unwrap_or(0)
}

/// One edit: write `edit.toml` (a service added or its backend moved),
/// then wait for a sync past the generation before it.
fn edit(opts: &DaemonOptions, n: u32) -> Duration {
    let before = generation(opts);
    let text = format!(
        "[[service]]\nname = \"edited\"\nvip = \"10.97.0.1\"\nport = 80\nbackends = [\"192.168.200.{}:8080\"]\n",
        n % 250 + 1
    );
    let started = Instant::now();
    opts.write_config("edit.toml", &text);
    while generation(opts) <= before {
        assert!(started.elapsed() < Duration::from_secs(30), "the edit was not synced within 30 s");
        std::thread::sleep(Duration::from_micros(500));
    }
    started.elapsed()
}

struct Load {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    latencies: Vec<std::thread::JoinHandle<Vec<f64>>>,
    started: Instant,
}

/// `threads` clients in `ns`, each pacing `rate / threads` scrapes a
/// second (a new connection per scrape, as Prometheus makes one per
/// target and keeps it; a new one is the harder case for the server).
fn scrape_load(ns: &Netns, rate: u32, threads: u32) -> Load {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let addr: SocketAddr = METRICS.parse().unwrap();
    let gap = Duration::from_secs_f64(f64::from(threads) / f64::from(rate));
    let latencies = (0..threads)
        .map(|_| {
            let (stop, done, failed, ns) = (stop.clone(), done.clone(), failed.clone(), ns.file());
            std::thread::spawn(move || {
                nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
                let mut lat = Vec::new();
                let mut next = Instant::now();
                // Bounded: the series stops it, and nothing runs past 10 minutes.
                let deadline = Instant::now() + Duration::from_secs(600);
                while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                    let t = Instant::now();
                    match scrape(addr) {
                        Ok(()) => {
                            done.fetch_add(1, Ordering::Relaxed);
                            lat.push(t.elapsed().as_secs_f64() * 1e3);
                        }
                        Err(_) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    next += gap;
                    if let Some(wait) = next.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                }
                lat
            })
        })
        .collect();
    Load { stop, done, failed, latencies, started: Instant::now() }
}

fn scrape(addr: SocketAddr) -> std::io::Result<()> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n")?;
    let mut body = Vec::with_capacity(1 << 20);
    s.read_to_end(&mut body)?;
    if body.starts_with(b"HTTP/1.0 200") || body.starts_with(b"HTTP/1.1 200") {
        Ok(())
    } else {
        Err(std::io::Error::other("not 200"))
    }
}

struct Series {
    services: u32,
    alone: Vec<f64>,
    loaded: Vec<f64>,
    scrapes: u64,
    failed: u64,
    seconds: f64,
    scrape_ms: Vec<f64>,
    scrape_bytes: usize,
}

fn run(o: &Options, services_n: u32, rate: u32, threads: u32, edits: u32) -> Series {
    let ns = Netns::new();
    let cgroup = Cgroup::new();
    let dir = TempDir::new("hm-bench-metrics");
    let opts = DaemonOptions::in_dir(o.hostmesh.to_str().unwrap(), &dir);
    opts.write_config(
        "00-daemon.toml",
        &format!(
            "[daemon]\ncgroup = \"{}\"\nconnect_time_lb = \"all\"\nmetrics_listen = \"{METRICS}\"\n",
            cgroup.path().display()
        ),
    );
    opts.write_config("services.toml", &services(services_n));
    let daemon = Daemon::start(&ns, &opts);
    daemon.wait_ready(Duration::from_secs(120));
    let scrape_bytes = ns.run(|| {
        let mut s = TcpStream::connect(METRICS).unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut b = Vec::new();
        s.read_to_end(&mut b).unwrap();
        b.len()
    });
    let mut series = Series {
        services: services_n,
        alone: vec![],
        loaded: vec![],
        scrapes: 0,
        failed: 0,
        seconds: 0.0,
        scrape_ms: vec![],
        scrape_bytes,
    };
    let mut n = 0;
    // Rounds of 5 edits each way; the load runs through its rounds.
    for _round in 0..edits.div_ceil(5) {
        if interrupted() {
            break;
        }
        for _ in 0..5 {
            n += 1;
            series.alone.push(edit(&opts, n).as_secs_f64() * 1e3);
        }
        let load = scrape_load(&ns, rate, threads);
        std::thread::sleep(Duration::from_millis(300));
        for _ in 0..5 {
            n += 1;
            series.loaded.push(edit(&opts, n).as_secs_f64() * 1e3);
        }
        // At least 10 s of scraping in all.
        let min = Duration::from_secs_f64(10.0 / f64::from(edits.div_ceil(5)));
        if let Some(rest) = min.checked_sub(load.started.elapsed()) {
            std::thread::sleep(rest);
        }
        load.stop.store(true, Ordering::Relaxed);
        series.seconds += load.started.elapsed().as_secs_f64();
        for t in load.latencies {
            series.scrape_ms.extend(t.join().unwrap());
        }
        series.scrapes += load.done.load(Ordering::Relaxed);
        series.failed += load.failed.load(Ordering::Relaxed);
    }
    drop(daemon);
    series
}

fn pct(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(((v.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(f64::NAN)
}

fn main() {
    hm_testkit::require_root();
    catch_interrupts();
    let o = Options::parse(1, &["rate", "threads", "edits", "services", "large"]);
    let get = |k: &str, d: u32| o.extra.get(k).map_or(d, |v| v.parse().expect("a number"));
    let (rate, threads, edits) = (get("rate", 1000), get("threads", 4), get("edits", 20));
    let sizes: Vec<u32> = o
        .extra
        .get("services")
        .map_or("10,1000", |v| v.as_str())
        .split(',')
        .map(|n| n.parse().expect("--services N,N"))
        .collect();
    eprintln!(
        "hostmesh ({}), {sizes:?} services, {rate} scrapes/s from {threads} threads, {edits} edits each way",
        o.hostmesh.display()
    );
    let runs: Vec<Series> = sizes.iter().map(|n| run(&o, *n, rate, threads, edits)).collect();
    let large = get("large", 100_000);
    let on_off = (large > 0).then(|| on_off::run(&o, large, edits));
    let mut report = report(&runs, rate, threads);
    if let Some(r) = &on_off {
        report.push_str(&on_off_report(r));
    }
    println!("{report}");
    hm_bench::results::write_section(&o.out, "metrics", &report).expect("write results");
    eprintln!("wrote the metrics section of {}", o.out.display());
}

fn report(runs: &[Series], rate: u32, threads: u32) -> String {
    let mut out = String::new();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let _ = writeln!(out, "## bench/metrics: scrapes beside edits\n");
    let _ = writeln!(out, "Command (as root): `./bench/run metrics`\n");
    let _ = writeln!(
        out,
        "One run on Linux {} with {} CPUs. Per size, a daemon with N services of two backends (namespace of its \
         own), {} edits alone and as many while {threads} threads scrape /metrics at {rate}/s in all (a new connection \
         each), alternating in rounds of 5. An edit is a drop-in written until the status shows its sync (the 150 ms \
         debounce included).\n",
        kernel.trim(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        runs.first().map_or(0, |r| r.alone.len()),
    );
    let _ = writeln!(
        out,
        "| services | scrape size | scrapes/s achieved | scrape median / p99 | failed | edit alone (median / max) | edit while scraped (median / max) | × alone | delay (median / max) | goal ≤ 100 ms |"
    );
    let _ = writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for s in runs {
        let (ma, mb) = (median(s.alone.clone()), median(s.loaded.clone()));
        let (xa, xb) = (pct(s.alone.clone(), 1.0), pct(s.loaded.clone(), 1.0));
        let met = mb - ma <= 100.0 && xb - xa <= 100.0;
        let _ = writeln!(
            out,
            "| {} | {} KiB | {:.0} | {:.1} / {:.1} ms | {} | {ma:.0} / {xa:.0} ms | {mb:.0} / {xb:.0} ms | {:.2} | {:+.0} / {:+.0} ms | {} |",
            s.services,
            s.scrape_bytes / 1024,
            s.scrapes as f64 / s.seconds,
            median(s.scrape_ms.clone()),
            pct(s.scrape_ms.clone(), 0.99),
            s.failed,
            mb / ma,
            mb - ma,
            xb - xa,
            if met { "met" } else { "missed" },
        );
    }
    let _ = writeln!(
        out,
        "\nThe endpoint renders on one thread of its own; where fewer scrapes than asked are achieved, that thread \
         (and the clients, on the same CPUs) is saturated, which is the load the goal is about: edits beside it."
    );
    out
}

fn on_off_report(r: &on_off::OnOff) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nWhat the endpoint costs an edit at scale, no scrape: two daemons with the same {} services (one backend \
         each), metrics on (the default) and `metrics_listen = \"off\"`, side by side, {} edits each in alternating \
         rounds of 5. A maximum far above its median is an edit that waited for the periodic resync (every 30 s, \
         seconds long at this size), which either daemon meets.\n",
        r.services,
        r.on.len()
    );
    let _ = writeln!(out, "| services | edit, metrics on (median / max) | edit, metrics off (median / max) | on × off (median) | peak RSS on / off |");
    let _ = writeln!(out, "|---:|---:|---:|---:|---:|");
    let (mon, moff) = (median(r.on.clone()), median(r.off.clone()));
    let _ = writeln!(
        out,
        "| {} | {mon:.0} / {:.0} ms | {moff:.0} / {:.0} ms | {:.2} | {} / {} MiB |",
        r.services,
        pct(r.on.clone(), 1.0),
        pct(r.off.clone(), 1.0),
        mon / moff,
        r.rss_on,
        r.rss_off
    );
    out
}
