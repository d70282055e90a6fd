//! The daemon's life under systemd's protocol: READY after the first sync,
//! drop-ins applied without signals, SIGHUP reloads, a broken file that
//! takes nothing down, SIGTERM, the watchdog, a death without stopping, and
//! `hostmesh check`. None of it depends on the kernel's version (a restart
//! that adopts kernel state does: tests/integration/restart.rs).

use std::time::Duration;

use hm_testkit::wait_soon;
use nix::sys::signal::Signal;

use crate::fixtures::*;

#[test]
fn ready_comes_after_the_first_sync_has_applied_the_config() {
    let host = Host::new();
    host.write("web.toml", WEB);
    let d = host.start();
    d.wait_ready(READY_TIMEOUT);
    // At READY=1 the VIP route and the veth already exist.
    assert!(host.has_route("10.96.0.10"), "routes at READY: {:?}", host.owned_routes());
    let links = host.ns.links();
    assert!(links.contains(&"hm-natin".to_string()) && links.contains(&"hm-natout".to_string()), "{links:?}");
    let msgs = d.notify.messages();
    let ready = msgs.iter().find(|m| m.contains("READY=1")).unwrap();
    // (This namespace has no default route, so the status also carries a
    // warning about host interfaces.)
    assert!(ready.lines().any(|l| l.starts_with("STATUS=1 service, 0 mesh redirects, 0 peers")), "{ready:?}");
}

#[test]
fn a_new_drop_in_applies_without_a_signal() {
    let host = Host::new();
    host.write("web.toml", WEB);
    let _d = host.start_ready();
    host.write("api.toml", API);
    wait_soon("the api route", || host.has_route("10.96.0.20")).unwrap();
    // Removing a file removes what it declared.
    std::fs::remove_file(host.opts.config_dir.join("web.toml")).unwrap();
    wait_soon("the web route to go", || !host.has_route("10.96.0.10")).unwrap();
}

#[test]
fn sighup_reports_reloading_with_a_timestamp_then_ready() {
    let host = Host::new();
    host.write("web.toml", WEB);
    let d = host.start_ready();
    let before = d.notify.messages().len();
    host.write("api.toml", API);
    d.signal(Signal::SIGHUP);
    let reloading = d.notify.wait_for("RELOADING=1", before, hm_testkit::SOON).unwrap();
    let msg = &d.notify.messages()[reloading];
    let usec = msg
        .lines()
        .find_map(|l| l.strip_prefix("MONOTONIC_USEC="))
        .unwrap_or_else(|| panic!("RELOADING=1 without MONOTONIC_USEC: {msg:?}"));
    let usec: u64 = usec.parse().expect("MONOTONIC_USEC is a number");
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).unwrap();
    let now_usec = now.tv_sec() as u64 * 1_000_000 + now.tv_nsec() as u64 / 1000;
    assert!(
        usec <= now_usec && now_usec - usec < 10_000_000,
        "MONOTONIC_USEC {usec} is not the reload time (now {now_usec})"
    );
    d.notify.wait_for("READY=1", reloading + 1, hm_testkit::SOON).unwrap();
    assert!(host.has_route("10.96.0.20"), "the reload applied the new file");
}

#[test]
fn a_broken_drop_in_keeps_its_last_good_version_and_everything_else() {
    let host = Host::new();
    host.write("a-web.toml", WEB);
    host.write("b-api.toml", API);
    let d = host.start_ready();
    assert!(host.has_route("10.96.0.20"));

    // b breaks (an unterminated string on line 3); a changes its VIP meanwhile.
    let generation = host.status().generation;
    host.write("b-api.toml", "[[service]]\nname = \"api\"\nvip = \"10.96.0.21\nport = 443\n");
    host.write("a-web.toml", &WEB.replace("10.96.0.10", "10.96.0.11"));
    wait_soon("a sync after the edits", || host.status().generation > generation).unwrap();
    wait_soon("web's new VIP", || host.has_route("10.96.0.11")).unwrap();
    assert!(host.has_route("10.96.0.20"), "b's last good version stays: {:?}", host.owned_routes());
    assert!(!host.has_route("10.96.0.21"));
    assert!(!host.has_route("10.96.0.10"));

    let (text, code) = host.status_text();
    let bad = host.opts.config_dir.join("b-api.toml");
    assert!(text.contains(&format!("rejected {}: its last good version stays in force", bad.display())), "{text}");
    assert!(text.contains(&format!("{}:3:18: invalid TOML at key `vip`", bad.display())), "{text}");
    assert_eq!(code, 1, "status exits 1 while a file is rejected");
    let status = host.status();
    let file = status.files.iter().find(|f| f.path == bad).unwrap();
    assert_eq!(file.state, hostmesh::state::FileState::RejectedKeepingLastGood);
    assert_eq!((file.errors[0].line, file.errors[0].column), (3, 18));
    let last = d.notify.messages().into_iter().rev().find(|m| m.contains("STATUS=")).unwrap();
    assert!(last.contains("1 file rejected: b-api.toml:3:18"), "{last}");
}

#[test]
fn sigterm_says_stopping_exits_zero_and_leaves_the_dataplane() {
    let host = Host::new();
    host.write("web.toml", WEB);
    let mut d = host.start_ready();
    let status = d.stop(hm_testkit::SOON);
    assert_eq!(status.code(), Some(0));
    assert!(d.notify.messages().iter().any(|m| m.lines().any(|l| l == "STOPPING=1")));
    assert!(host.has_route("10.96.0.10"), "kernel state stays after a stop");
    let (text, code) = host.status_text();
    assert!(text.starts_with("hostmesh: not running: stopped"), "{text}");
    assert_eq!(code, 3);
}

#[test]
fn a_burst_of_a_thousand_drop_ins_costs_one_sync() {
    let host = Host::new();
    let d = host.start_ready();
    let generation = host.status().generation;
    let before = d.log_text().matches("msg=\"sync done\"").count();
    let started = std::time::Instant::now();
    for i in 0..1000 {
        host.write(
            &format!("svc-{i:04}.toml"),
            &format!("[[service]]\nname = \"svc-{i}\"\nvip = \"10.97.{}.{}\"\nport = 80\n", i / 250, i % 250 + 1),
        );
    }
    // A stream of events delays a sync by a second at most, so a burst
    // that took the writer longer (a slow VM) may cost one sync more per
    // second it took.
    let syncs = 1 + started.elapsed().as_secs();
    wait_soon("1000 services applied", || {
        let s = host.status();
        s.counts.services == 1000 && s.last_sync.ok
    })
    .unwrap();
    // Let any straggling sync happen before counting.
    std::thread::sleep(Duration::from_millis(500));
    let generations = host.status().generation - generation;
    assert!(
        (1..=syncs).contains(&generations),
        "{generations} syncs for a burst written in {:?}\n{}",
        started.elapsed(),
        d.log_text()
    );
    assert_eq!(d.log_text().matches("msg=\"sync done\"").count() as u64, before as u64 + generations);
    assert_eq!(host.owned_routes().len(), 1000);
}

#[test]
fn watchdog_pings_come_at_half_the_interval() {
    let host = Host::new();
    let d = hm_testkit::Daemon::start_with_env(&host.ns, &host.opts, &[("WATCHDOG_USEC", "400000")]);
    d.wait_ready(READY_TIMEOUT);
    let start = d.notify.messages().len();
    let pings = || d.notify.messages()[start..].iter().filter(|m| m.lines().any(|l| l == "WATCHDOG=1")).count();
    // Every 200 ms, so five take at least 800 ms from the first.
    let waited = wait_soon("five WATCHDOG=1", || pings() >= 5).unwrap();
    assert!(
        waited.0 >= Duration::from_millis(800),
        "five WATCHDOG=1 within {:?}: more often than every 200 ms",
        waited.0
    );
}

#[test]
fn status_says_when_the_daemon_died_without_stopping() {
    let host = Host::new();
    host.write("web.toml", WEB);
    let d = host.start_ready();
    let pid = d.pid();
    d.signal(Signal::SIGKILL);
    drop(d);
    let (text, code) = host.status_text();
    assert!(text.starts_with(&format!("hostmesh: not running: pid {pid} is gone and did not stop cleanly")), "{text}");
    assert!(
        text.lines().any(|l| l.trim_start().starts_with("service") && l.contains(" web ")),
        "the last applied state is still shown: {text}"
    );
    assert_eq!(code, 3);
    let out = host.hostmesh(&["status", "--json", "--state-dir", host.opts.state_dir.to_str().unwrap()]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["liveness"], "gone");
}

#[test]
fn check_exits_zero_on_a_valid_dir_and_one_with_every_error_printed() {
    let host = Host::new();
    host.write("web.toml", WEB);
    let ok = host.check(&[]);
    assert_eq!(ok.status.code(), Some(0), "{}", String::from_utf8_lossy(&ok.stderr));
    assert!(String::from_utf8_lossy(&ok.stdout).contains("2 file(s), 0 rejected; valid: 1 service(s)"));

    host.write("bad.toml", "[[service]]\nname = \"x\"\nvip = \"nope\"\nport = 0\n");
    host.write("z-dup.toml", "[[service]]\nname = \"web\"\nvip = \"10.96.0.99\"\nport = 1\n");
    let bad = host.check(&[]);
    assert_eq!(bad.status.code(), Some(1));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(err.lines().count(), 3, "{err}");
    assert!(err.contains("bad.toml:3:7: service \"x\": vip \"nope\" is not an IPv4 or IPv6 address"), "{err}");
    assert!(err.contains("bad.toml:4:8: service \"x\": port 0 is out of range; use 1 to 65535"), "{err}");
    assert!(err.contains("z-dup.toml:2:8: service name \"web\" is already used at web.toml:3:8"), "{err}");
}

#[test]
fn check_names_a_cgroup_and_an_interface_this_host_lacks_and_offline_checks_the_files_alone() {
    let host = Host::new();
    host.write("web.toml", WEB);
    host.set_daemon_config_in(std::path::Path::new("/nonexistent/x"), "host_interfaces = [\"hm-nowhere0\"]");
    let out = host.check(&[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 2, "{err}");
    assert!(
        err.contains(
            "00-daemon.toml:1:1: [daemon] cgroup = \"/nonexistent/x\" does not exist on this host, so \
                      connect-time load balancing would be off; fix: create it"
        ),
        "{err}"
    );
    assert!(err.contains("[daemon] host_interfaces names hm-nowhere0, which this host does not have"), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("; 2 thing(s) it names missing on this host"));

    let offline = host.check(&["--offline"]);
    assert_eq!(offline.status.code(), Some(0), "{}", String::from_utf8_lossy(&offline.stderr));
    assert!(String::from_utf8_lossy(&offline.stdout).contains("; this host not checked (--offline)"));

    // The test's own cgroup, and an interface of the host's namespace.
    host.set_daemon_config("host_interfaces = [\"lo\"]");
    let ok = host.check(&[]);
    assert_eq!(ok.status.code(), Some(0), "{}", String::from_utf8_lossy(&ok.stderr));
    assert!(String::from_utf8_lossy(&ok.stdout).contains("; what it names on this host exists"));
}
