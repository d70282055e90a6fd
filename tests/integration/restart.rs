//! A restart adopts the kernel state it finds: the same links, filters,
//! programs and maps, the mesh's and the gateway's included.

use std::os::fd::AsFd;

use hostmesh::backends::bpf::sys;

use crate::fixtures::*;

/// Every attached program with its id, and the id of every pinned map.
fn attached_ids(host: &Host) -> (Vec<(String, u32)>, Vec<u32>) {
    let pins = &host.opts.bpffs;
    let maps = hostmesh::abi::HmMap::pinned()
        .map(|m| sys::map_info(sys::obj_get(&pins.join("maps").join(m.name())).unwrap().as_fd()).unwrap().id)
        .collect();
    (host.attached_programs(), maps)
}

#[test]
fn a_restarted_daemon_adopts_pinned_state_without_recreating_it() {
    let host = Host::new();
    host.write("web.toml", WEB);
    let mut d = host.start_ready();
    let ids = attached_ids(&host);
    let tc: Vec<&String> = ids.0.iter().map(|(hook, _)| hook).filter(|h| h.contains("@tc-")).collect();
    assert_eq!(
        ids.0.len(),
        9 + 4,
        "9 connect-time links (sock_release among them), hm_natin, hm_natout, hm_reply and hm_direct on lo: {:?}",
        ids.0
    );
    assert_eq!(
        tc,
        [
            "hm_direct@tc-egress@lo",
            "hm_natin@tc-egress@hm-natin",
            "hm_natout@tc-ingress@hm-natout",
            "hm_reply@tc-ingress@lo"
        ],
        "({})",
        host.tc_mode()
    );
    let ifindex = host.ns.ip_json(&["link", "show", "hm-natout"])[0]["ifindex"].as_u64();
    d.stop(hm_testkit::SOON);
    drop(d);

    let _d = host.start_ready();
    assert_eq!(attached_ids(&host), ids, "same links, filters, programs and maps");
    assert_eq!(host.ns.ip_json(&["link", "show", "hm-natout"])[0]["ifindex"].as_u64(), ifindex, "same veth");
    let s = host.status();
    assert!(s.last_sync.full && s.last_sync.ok);
    assert_eq!(s.last_sync.steps, 0, "nothing re-created on restart");
}

/// The mesh (sk_lookup) and the gateway's tunnel programs too: a program
/// that reads a constant (hm_tun_in's peer MAC) uses an unpinned map of
/// its own, which a restart's fresh copy has under another id.
#[test]
fn a_restart_keeps_the_mesh_and_gateway_programs_and_maps() {
    let net = crate::topology::Topology::new("");
    // The peer never answers: it may miss 1000 probes before it is down,
    // so it stays up (as a start assumes) through the test and its routes
    // do not change. (A missed probe is followed by the next at once, so
    // a long interval alone no longer keeps it up.)
    net.host.write("extras.toml", &crate::topology::mesh_and_peer("probe_interval = \"60s\"\nprobe_loss = 1000"));
    let mut d = net.host.start_ready();
    let ids = attached_ids(&net.host);
    for p in ["hm_mesh@netns", "hm_tun_in@tc-ingress@hm-tun0", "hm_tun_out@tc-egress@hm-tun0"] {
        assert!(ids.0.iter().any(|(hook, _)| hook == p), "{p} attached: {:?}", ids.0);
    }
    d.stop(hm_testkit::SOON);
    drop(d);

    let d = net.host.start_ready();
    assert_eq!(attached_ids(&net.host), ids, "same links, filters, programs and maps\n{}", d.log_text());
    let s = net.host.status();
    assert!(s.last_sync.full && s.last_sync.ok);
    assert_eq!(s.last_sync.steps, 0, "nothing re-attached on restart\n{}", d.log_text());
}
