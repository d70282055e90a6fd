//! The pin dir and the state dir: a start that cannot build its dataplane
//! fails before READY; one daemon per dir; nothing in the state dir is
//! followed or trusted blindly.

use std::fs;
use std::os::unix::fs::symlink;

use hm_testkit::{Daemon, DaemonOptions};

use crate::fixtures::*;

#[test]
fn an_unusable_pin_dir_fails_the_start_with_no_ready_no_link_and_no_route() {
    let mut host = Host::new();
    host.write("web.toml", WEB);
    // The pin dir's parent is a regular file: it can never be created.
    let file = host.opts.state_dir.with_file_name("not-a-dir");
    fs::write(&file, "").unwrap();
    host.opts.bpffs = file.join("bpf");
    let log = failed_start(&host);
    assert!(log.contains(&format!("pin dir {}", host.opts.bpffs.display())) && log.contains("mount -t bpf"), "{log}");
}

#[test]
fn programs_that_cannot_load_fail_the_start_before_any_link_or_route() {
    let host = Host::new();
    host.write("web.toml", WEB);
    // Something that is not a map where hostmesh pins HM_CT.
    mount_bpffs(&host.opts);
    fs::create_dir_all(host.opts.bpffs.join("maps").join(hostmesh::abi::HmMap::Ct.name())).unwrap();
    let log = failed_start(&host);
    assert!(log.contains("the first sync failed"), "{log}");
}

#[test]
fn a_veth_program_that_fails_to_attach_gets_no_vip_route() {
    let host = Host::new();
    host.write("web.toml", WEB);
    // The pin of hm_natout's program is taken by a dir: attaching it fails.
    mount_bpffs(&host.opts);
    fs::create_dir_all(host.opts.bpffs.join("progs/hm_natout@tc-ingress@hm-natout")).unwrap();
    let _d = host.start_ready();
    assert!(!host.has_route("10.96.0.10"), "a VIP route into a veth without its program: {:?}", host.owned_routes());
    let (text, code) = host.status_text();
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("not steering traffic into hm-natin"), "{text}");
}

#[test]
fn a_second_daemon_on_the_same_dirs_exits_at_once_naming_the_first() {
    let host = Host::new();
    host.write("web.toml", WEB);
    let first = host.start_ready();
    let second_opts = DaemonOptions { log: host.opts.log.with_file_name("second.log"), ..clone_opts(&host.opts) };
    let mut second = Daemon::start(&host.ns, &second_opts);
    let status = second.exited_within(hm_testkit::scaled(hm_testkit::SOON)).expect("the second daemon exits");
    assert_eq!(status.code(), Some(1));
    let log = second.log_text();
    let want = format!("hostmesh is already running (pid {}) on {}", first.pid(), host.opts.state_dir.display());
    assert!(log.contains(&want), "{log}");
    assert!(second.notify.messages().iter().all(|m| !m.contains("READY=1")));
    // The same pin dir under another state dir is refused too.
    let third_opts = DaemonOptions {
        state_dir: host.opts.state_dir.with_file_name("state-3"),
        log: host.opts.log.with_file_name("third.log"),
        ..clone_opts(&host.opts)
    };
    let mut third = Daemon::start(&host.ns, &third_opts);
    assert_eq!(third.exited_within(hm_testkit::scaled(hm_testkit::SOON)).expect("exits").code(), Some(1));
    assert!(third.log_text().contains(&format!("on {}", host.opts.bpffs.display())), "{}", third.log_text());
    // And teardown waits for the daemon to stop.
    let out = host.teardown();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("stop it first"));
}

#[test]
fn the_state_dir_is_not_written_through_links_nor_trusted_for_sysctl_paths() {
    let host = Host::new();
    host.write("web.toml", WEB);
    let victim = host.opts.state_dir.with_file_name("victim");
    fs::write(&victim, "precious").unwrap();
    fs::create_dir_all(&host.opts.state_dir).unwrap();
    symlink(&victim, host.opts.state_dir.join("status.json")).unwrap();
    // A crafted originals file: one real entry, two that name other files.
    let originals = serde_json::json!({
        "net/ipv4/conf/lo/rp_filter": "0",
        format!("../../..{}", victim.display()): "pwned",
        victim.display().to_string(): "pwned",
    });
    fs::write(host.opts.state_dir.join("sysctl-originals.json"), originals.to_string()).unwrap();
    let mut d = host.start_ready();
    assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
    let status = host.opts.state_dir.join("status.json");
    assert!(!fs::symlink_metadata(&status).unwrap().file_type().is_symlink(), "the planted link was replaced");
    assert!(d.log_text().contains("ignored an entry"), "{}", d.log_text());
    d.stop(hm_testkit::SOON);
    fs::write(host.opts.state_dir.join("sysctl-originals.json"), originals.to_string()).unwrap();
    let out = host.teardown();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
    assert!(String::from_utf8_lossy(&out.stdout).contains("warning:"), "{out:?}");
}

#[test]
fn a_truncated_originals_file_is_moved_aside_and_the_daemon_starts() {
    let host = Host::new();
    host.write("web.toml", WEB);
    fs::create_dir_all(&host.opts.state_dir).unwrap();
    fs::write(host.opts.state_dir.join("sysctl-originals.json"), r#"{"net/ipv4/conf/hm-natin/rp_fi"#).unwrap();
    let d = host.start_ready();
    assert!(d.log_text().contains("is corrupt"), "{}", d.log_text());
    assert!(host.opts.state_dir.join("sysctl-originals.json.corrupt").exists());
    assert!(host.has_route("10.96.0.10"));
}

/// Starts a daemon that must fail: it exits 1, never says READY=1, and
/// leaves no hm-* link and no route. Returns its log.
fn failed_start(host: &Host) -> String {
    let mut d = host.start();
    let status = d.exited_within(hm_testkit::scaled(hm_testkit::SOON)).expect("the daemon exits");
    assert_eq!(status.code(), Some(1), "{}", d.log_text());
    assert!(d.notify.messages().iter().all(|m| !m.contains("READY=1")), "{:?}", d.notify.messages());
    assert!(host.ns.links().iter().all(|l| !l.starts_with("hm-")), "{:?}", host.ns.links());
    assert!(host.owned_routes().is_empty(), "{:?}", host.owned_routes());
    d.log_text()
}

fn clone_opts(o: &DaemonOptions) -> DaemonOptions {
    DaemonOptions {
        bin: o.bin.clone(),
        config_dir: o.config_dir.clone(),
        runtime_config_dir: o.runtime_config_dir.clone(),
        vendor_config_dir: o.vendor_config_dir.clone(),
        state_dir: o.state_dir.clone(),
        bpffs: o.bpffs.clone(),
        log: o.log.clone(),
    }
}

fn mount_bpffs(o: &DaemonOptions) {
    fs::create_dir_all(&o.bpffs).unwrap();
    nix::mount::mount(Some("bpf"), &o.bpffs, Some("bpf"), nix::mount::MsFlags::empty(), Some("mode=0700"))
        .expect("mount a bpffs for the daemon");
}
