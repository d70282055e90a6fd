//! Signals: a burst of SIGHUPs is one more sync, SIGTERM does not wait for
//! a long sync, and the CLI ends quietly on a closed pipe.

use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::fixtures::*;

fn syncs(log: &str) -> usize {
    log.lines().filter(|l| l.contains("sync done")).count()
}

#[test]
fn a_hundred_sighups_cost_a_sync_per_second_of_signals_at_most() {
    let host = Host::new();
    host.write("web.toml", WEB);
    let d = host.start_ready();
    std::thread::sleep(Duration::from_millis(300));
    let before = syncs(&d.log_text());
    let started = Instant::now();
    for _ in 0..100 {
        d.signal(Signal::SIGHUP);
        std::thread::sleep(Duration::from_millis(10));
    }
    // A burst of signals settles like file events: a stream of them delays
    // a sync by a second at most, so it costs at most one sync per second
    // it lasted, and one after it.
    let most = 2 + started.elapsed().as_secs() as usize;
    // Settled: READY=1 after the last RELOADING=1.
    let has = |m: &String, line: &str| m.lines().any(|l| l == line);
    hm_testkit::wait_soon("the reloads to end", || {
        let m = d.notify.messages();
        let last = m.iter().rposition(|x| has(x, "RELOADING=1"));
        last.is_some_and(|r| m[r + 1..].iter().any(|x| has(x, "READY=1")))
    })
    .unwrap();
    let after = syncs(&d.log_text());
    assert!((1..=most).contains(&(after - before)), "{} syncs for 100 SIGHUPs (at most {most})", after - before);
}

#[test]
fn sigterm_during_a_sync_of_30000_services_stops_it_between_steps() {
    let host = Host::new();
    host.write("a-web.toml", WEB);
    let d0 = host.start_ready();
    drop(d0);
    let many: String = (0..30_000u32)
        .map(|i| {
            format!(
                "[[service]]\nname = \"s{i}\"\nvip = \"10.{}.{}.{}\"\nport = 80\nbackends = [\"192.168.{}.{}:8080\"]\n",
                100 + (i >> 16),
                (i >> 8) & 255,
                i & 255,
                (i >> 8) & 255,
                i & 255
            )
        })
        .collect();
    host.write("b-many.toml", &many);
    let mut d = host.start();
    // The first sync of 30,000 services is under way once the daemon
    // logged its start.
    // (The log holds the first daemon's lines too: look after the second
    // start.)
    let this_run = |log: String| log.rsplit("msg=starting").next().unwrap_or_default().to_string();
    hm_testkit::wait_soon("the daemon to start", || d.log_text().matches("msg=starting").count() == 2).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let during = !this_run(d.log_text()).contains("sync done");
    d.signal(Signal::SIGTERM);
    let status = d.exited_within(hm_testkit::scaled(hm_testkit::SOON)).expect("exit after SIGTERM");
    assert!(status.success(), "{status:?}");
    // The sync stopped between steps instead of running to its end.
    assert!(this_run(d.log_text()).contains("sync stopped early"), "{}", d.log_text());
    assert!(during, "the sync was over before SIGTERM; the test proves nothing:\n{}", d.log_text());
}

#[test]
fn status_into_a_closed_pipe_ends_quietly() {
    let host = Host::new();
    let many: String = (0..3000u32)
        .map(|i| format!("[[service]]\nname = \"s{i}\"\nvip = \"10.97.{}.{}\"\nport = 80\n", i >> 8, i & 255))
        .collect();
    host.write("many.toml", &many);
    let _d = host.start_ready();
    let script = format!(
        "{} status --state-dir {} | head -1 >/dev/null; echo \"${{PIPESTATUS[0]}}\"",
        bin(),
        host.opts.state_dir.display()
    );
    let out = Command::new("bash").arg("-c").arg(&script).output().unwrap();
    let code = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(code == "0" || code == "141", "exit {code}, stderr {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
