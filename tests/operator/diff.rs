//! `hostmesh diff`: what a config dir would change against the
//! configuration in force, with the daemon running, stopped, and gone.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;

use crate::fixtures::*;

fn diff(host: &Host, dir: &Path) -> Output {
    let args = [
        "diff",
        "--config-dir",
        dir.to_str().unwrap(),
        "--runtime-config-dir",
        host.opts.runtime_config_dir.to_str().unwrap(),
        "--vendor-config-dir",
        host.opts.vendor_config_dir.to_str().unwrap(),
        "--state-dir",
        host.opts.state_dir.to_str().unwrap(),
    ];
    host.hostmesh(&args)
}

/// The change lines (`+`, `~`, `-`), without where each definition is.
fn changes(o: &Output) -> Vec<String> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.starts_with("+ ") || l.starts_with("~ ") || l.starts_with("- "))
        .map(|l| l.split(" (").next().unwrap().to_string())
        .collect()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn put(dir: &Path, name: &str, body: &str) {
    let p = dir.join(name);
    fs::write(&p, body).unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
}

#[test]
fn diff_lists_exactly_the_change_against_what_is_in_force_whether_the_daemon_runs_or_not() {
    let host = Host::new();
    host.write("50-web.toml", WEB);
    host.write("60-api.toml", API);
    let staging = tempfile::tempdir().unwrap();
    fs::set_permissions(staging.path(), fs::Permissions::from_mode(0o755)).unwrap();
    for e in fs::read_dir(&host.opts.config_dir).unwrap() {
        let e = e.unwrap();
        put(staging.path(), e.file_name().to_str().unwrap(), &fs::read_to_string(e.path()).unwrap());
    }

    let mut d = host.start_ready();
    let same = diff(&host, staging.path());
    assert_eq!(same.status.code(), Some(0), "{}", text(&same));
    assert!(text(&same).contains("no change: the daemon would keep what is in force"), "{}", text(&same));
    assert!(text(&same).contains("capacity: 2 of 65536 services, 3 of 65536 backends"), "{}", text(&same));

    // The change: web's backends, api gone, dns new.
    put(staging.path(), "50-web.toml", &WEB.replace("192.168.10.11:8080", "192.168.10.13:8080"));
    fs::remove_file(staging.path().join("60-api.toml")).unwrap();
    put(
        staging.path(),
        "70-dns.toml",
        "[[service]]\nname = \"dns\"\nvip = \"10.96.0.53\"\nport = 53\nprotocol = \"udp\"\n",
    );
    let expected = ["+ service dns", "~ service web: backends", "- service api"];
    let changed = diff(&host, staging.path());
    assert_eq!(changed.status.code(), Some(1), "{}", text(&changed));
    assert_eq!(changes(&changed), expected, "{}", text(&changed));
    assert!(text(&changed).contains("1 added, 1 changed, 1 removed"), "{}", text(&changed));
    // Nothing was touched: the daemon's own dir still diffs to nothing.
    assert_eq!(diff(&host, &host.opts.config_dir).status.code(), Some(0));
    assert!(host.has_route("10.96.0.20") && !host.has_route("10.96.0.53"), "{:?}", host.owned_routes());

    // Stopped: the configuration in force is what the kernel still holds.
    d.stop(hm_testkit::scaled(hm_testkit::SOON));
    let stopped = diff(&host, staging.path());
    assert_eq!(stopped.status.code(), Some(1), "{}", text(&stopped));
    assert_eq!(changes(&stopped), expected);
    assert_eq!(diff(&host, &host.opts.config_dir).status.code(), Some(0));

    // A file the daemon would reject: exit 2, with its error.
    put(staging.path(), "80-bad.toml", "[[service]]\nname = \"bad\"\nvip = \"nope\"\nport = 1\n");
    let bad = diff(&host, staging.path());
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));
    assert!(
        text(&bad).contains("80-bad.toml:3:7: service \"bad\": vip \"nope\" is not an IPv4 or IPv6 address"),
        "{}",
        text(&bad)
    );

    // Torn down: nothing is in force, every object would be added.
    assert!(host.teardown().status.success());
    let gone = diff(&host, &host.opts.config_dir);
    assert_eq!(gone.status.code(), Some(1), "{}", text(&gone));
    assert!(text(&gone).contains("nothing is in force here"), "{}", text(&gone));
    assert_eq!(changes(&gone), ["~ [daemon] settings: cgroup", "+ service api", "+ service web"]);
}

#[test]
fn what_is_in_force_follows_edits_and_a_rejected_file_keeps_its_last_good_version() {
    let host = Host::new();
    host.write("50-web.toml", WEB);
    host.write("60-api.toml", API);
    let _d = host.start_ready();
    // api broken: its last good version stays in force, and diff of the
    // dir as it is says the daemon would reject it.
    host.write("60-api.toml", "[[service]]\nname = 3\n");
    hm_testkit::wait_soon("the api file rejected", || {
        host.status()
            .files
            .iter()
            .any(|f| f.path.ends_with("60-api.toml") && f.state == hostmesh::state::FileState::RejectedKeepingLastGood)
    })
    .unwrap();
    let fixed = tempfile::tempdir().unwrap();
    fs::set_permissions(fixed.path(), fs::Permissions::from_mode(0o755)).unwrap();
    put(fixed.path(), "00-daemon.toml", &fs::read_to_string(host.opts.config_dir.join("00-daemon.toml")).unwrap());
    put(fixed.path(), "50-web.toml", WEB);
    put(fixed.path(), "60-api.toml", API);
    let o = diff(&host, fixed.path());
    assert_eq!(o.status.code(), Some(0), "the last good api is in force: {}", text(&o));

    // An edit applied is in force at once.
    host.write("60-api.toml", &API.replace("port = 443", "port = 8443"));
    hm_testkit::wait_soon("the api edit in force", || diff(&host, fixed.path()).status.code() == Some(1)).unwrap();
    assert_eq!(changes(&diff(&host, fixed.path())), ["~ service api: port"]);
}
