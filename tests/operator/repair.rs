//! Fast repair: what someone deletes or resets is put back from the
//! kernel's own change events, with the periodic resync an hour away; a
//! lost map pin is pinned again.

use std::os::fd::AsFd;

use hm_testkit::wait_soon;
use hostmesh::backends::bpf::sys;

use crate::fixtures::*;

/// The index of the interface hostmesh's reply program runs on at `dev`'s
/// ingress: from the pinned TCX link, or the clsact filter.
fn reply_program_index(host: &Host, dev: &str) -> Option<u32> {
    let pin = host.opts.bpffs.join(format!("links/hm_reply@tc-ingress@{dev}"));
    if let Ok(fd) = sys::obj_get(&pin) {
        return sys::link_info(fd.as_fd()).ok().map(|i| i.tcx_ifindex).filter(|i| *i != 0);
    }
    tc_filters(&host.ns)
        .iter()
        .any(|f| f.dev == dev && f.dir == "ingress" && f.is_hostmesh() && f.name.as_deref() == Some("hm_reply"))
        .then(|| index(host, dev))
        .flatten()
}

fn index(host: &Host, dev: &str) -> Option<u32> {
    host.ns.ip_json(&["link", "show", dev]).first().and_then(|l| l["ifindex"].as_u64()).map(|i| i as u32)
}

#[test]
fn deleted_links_reset_sysctls_and_recreated_host_interfaces_are_repaired_from_kernel_events() {
    let host = Host::with_daemon_config("host_interfaces = [\"eth1\"]\nresync_interval = \"1h\"");
    host.ns.ip(&["link", "add", "eth1", "type", "veth", "peer", "name", "eth1p"]);
    host.ns.ip(&["link", "set", "eth1", "up"]);
    host.write("web.toml", WEB);
    let d = host.start_ready();
    host.ns.ip(&["link", "del", "hm-natin"]);
    wait_soon("hm-natin and its VIP route back", || {
        host.ns.links().contains(&"hm-natin".to_string()) && host.has_route("10.96.0.10")
    })
    .unwrap();
    assert!(
        d.log_text().contains("repairing drift") && d.log_text().contains("link hm-natin was deleted"),
        "{}",
        d.log_text()
    );

    host.ns.set_sysctl("net/ipv4/conf/all/rp_filter", "1");
    wait_soon("rp_filter back to 0", || host.ns.sysctl("net/ipv4/conf/all/rp_filter").as_deref() == Some("0")).unwrap();

    let old = index(&host, "eth1").unwrap();
    assert_eq!(reply_program_index(&host, "eth1"), Some(old));
    host.ns.ip(&["link", "del", "eth1"]);
    host.ns.ip(&["link", "add", "eth1", "type", "veth", "peer", "name", "eth1p"]);
    host.ns.ip(&["link", "set", "eth1", "up"]);
    let new = index(&host, "eth1").unwrap();
    assert_ne!(old, new);
    wait_soon("the reply program on the new eth1", || reply_program_index(&host, "eth1") == Some(new)).unwrap();
    assert!(d.log_text().contains("host interface eth1 came back"), "{}", d.log_text());
}

#[test]
fn a_deleted_map_pin_is_pinned_again_at_the_next_resync() {
    let host = Host::new();
    host.write("web.toml", WEB);
    let d = host.start_ready();
    let pin = host.opts.bpffs.join("maps").join(hostmesh::abi::HmMap::Services.name());
    assert!(pin.exists());
    std::fs::remove_file(&pin).unwrap();
    let before = d.notify.messages().len();
    d.signal(nix::sys::signal::Signal::SIGHUP);
    d.notify.wait_for("READY=1", before, hm_testkit::SOON).unwrap();
    assert!(pin.exists(), "HM_SERVICES is pinned again");
    assert!(d.log_text().contains("had lost its pin"), "{}", d.log_text());
    // It is the map the programs use: the VIP still answers from it.
    let fd = sys::obj_get(&pin).unwrap();
    assert!(sys::map_info(fd.as_fd()).unwrap().max_entries > 0);
}
