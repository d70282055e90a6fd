//! Drop-ins as operators (and other users) leave them: writable by
//! others, half-written, full of errors, over capacity, not files at all.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::time::Duration;

use hm_testkit::wait_soon;

use crate::fixtures::*;

fn check(host: &Host) -> (String, i32) {
    let out = host.check(&[]);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (text, out.status.code().unwrap_or(-1))
}

#[test]
fn drop_ins_others_can_write_are_rejected_and_the_rest_applies() {
    let host = Host::new();
    host.write("a-web.toml", WEB);
    host.write("b-api.toml", API);
    let api = host.opts.config_dir.join("b-api.toml");
    fs::set_permissions(&api, fs::Permissions::from_mode(0o664)).unwrap();
    host.write("c-other.toml", "[[service]]\nname = \"other\"\nvip = \"10.96.0.30\"\nport = 80\n");
    let other = host.opts.config_dir.join("c-other.toml");
    nix::unistd::chown(&other, Some(nix::unistd::Uid::from_raw(1000)), None).unwrap();

    let (text, code) = check(&host);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains(&format!("{} is writable by its group (mode 0664); fix: chmod go-w", api.display())),
        "{text}"
    );
    assert!(text.contains(&format!("{} is owned by uid 1000, not root", other.display())), "{text}");

    let _d = host.start_ready();
    assert!(host.has_route("10.96.0.10"), "the safe file applies: {:?}", host.owned_routes());
    assert!(!host.has_route("10.96.0.20") && !host.has_route("10.96.0.30"), "{:?}", host.owned_routes());
    let (status, code) = host.status_text();
    assert_eq!(code, 1);
    assert!(status.contains("chmod go-w"), "{status}");

    // A config dir anyone can write: nothing in it is obeyed.
    fs::set_permissions(&host.opts.config_dir, fs::Permissions::from_mode(0o777)).unwrap();
    let (text, code) = check(&host);
    assert_eq!(code, 1);
    assert!(text.contains("is writable by group and others (mode 0777)"), "{text}");
    fs::set_permissions(&host.opts.config_dir, fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn a_file_written_in_two_parts_is_applied_once_whole() {
    let host = Host::new();
    host.write("a-web.toml", WEB);
    let d = host.start_ready();
    let path = host.opts.config_dir.join("b-api.toml");
    let (head, tail) = API.split_at(API.find("port").unwrap());
    {
        let mut f = fs::File::create(&path).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        f.write_all(head.as_bytes()).unwrap();
        f.flush().unwrap();
        std::thread::sleep(Duration::from_millis(500));
        f.write_all(tail.as_bytes()).unwrap();
    }
    wait_soon("the api route", || host.has_route("10.96.0.20")).unwrap();
    let log = d.log_text();
    assert!(!log.contains("config file rejected"), "a sync saw the half-written file:\n{log}");
    let services: Vec<&str> =
        log.lines().filter(|l| l.contains("sync done")).filter_map(|l| field(l, "services")).collect();
    assert!(services.iter().all(|n| *n == "1" || *n == "2"), "{services:?}");
}

#[test]
fn ten_thousand_errors_give_a_bounded_report() {
    let host = Host::new();
    host.write("a-web.toml", WEB);
    let bad: String =
        (0..10_000).map(|i| format!("[[service]]\nname = \"s{i}\"\nvip = \"10.96.1.1\"\nport = 0\n")).collect();
    host.write("b-bad.toml", &bad);
    let (text, code) = check(&host);
    assert_eq!(code, 1);
    assert!(text.lines().count() <= 25, "{} lines from check", text.lines().count());
    assert!(text.contains("more errors in this file"), "{text}");
    let d = host.start_ready();
    let log = d.log_text();
    let first_sync = log.split("sync done").next().unwrap();
    assert!(
        first_sync.lines().count() <= 25,
        "{} log lines before the first sync was done:\n{first_sync}",
        first_sync.lines().count()
    );
    let status = fs::metadata(host.opts.state_dir.join("status.json")).unwrap().len();
    assert!(status < 64 * 1024, "status.json is {status} bytes");
    // One very long key is quoted cut, not whole.
    let long = format!("{} = 1\n", vec!["k"; 100_000].join("."));
    host.write("c-long.toml", &long);
    let (text, _) = check(&host);
    assert!(text.lines().all(|l| l.len() < 600), "a line of {} bytes", text.lines().map(str::len).max().unwrap());
}

#[test]
fn seventy_thousand_backends_in_one_service_reject_that_file() {
    let host = Host::new();
    host.write("a-web.toml", WEB);
    let backends: Vec<String> =
        (0..70_000u32).map(|i| format!("\"10.{}.{}.{}:80\"", 128 + (i >> 16), (i >> 8) & 255, i & 255)).collect();
    host.write(
        "b-big.toml",
        &format!("[[service]]\nname = \"big\"\nvip = \"10.96.0.40\"\nport = 80\nbackends = [{}]\n", backends.join(",")),
    );
    let (text, code) = check(&host);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("70000 backends; a service can have at most 65536"), "{text}");
    let _d = host.start_ready();
    assert!(host.has_route("10.96.0.10") && !host.has_route("10.96.0.40"), "{:?}", host.owned_routes());
    let (status, code) = host.status_text();
    assert_eq!(code, 1);
    assert!(status.contains("at most 65536"), "{status}");
}

#[test]
fn entries_that_are_not_regular_files_are_listed_as_skipped() {
    let host = Host::new();
    host.write("a-web.toml", WEB);
    let dir = &host.opts.config_dir;
    nix::unistd::mkfifo(&dir.join("fifo.toml"), nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    symlink(dir.join("gone"), dir.join("dangling.toml")).unwrap();
    fs::create_dir(dir.join("dir.toml")).unwrap();
    let (text, code) = check(&host);
    assert_eq!(code, 0, "{text}");
    for (name, why) in [("fifo.toml", "a FIFO"), ("dangling.toml", "dangling"), ("dir.toml", "a directory")] {
        assert!(text.lines().any(|l| l.contains(name) && l.contains("skipped") && l.contains(why)), "{name}: {text}");
    }
    let _d = host.start_ready();
    let (status, _) = host.status_text();
    assert!(status.contains("skipped") && status.contains("fifo.toml"), "{status}");
}

/// `key=value` from a logfmt line.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}
