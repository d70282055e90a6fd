//! Drift repair: the periodic resync puts back what someone removed.

use std::time::Duration;

use hm_testkit::wait_until;

use crate::fixtures::*;

#[test]
fn the_periodic_resync_restores_a_deleted_route_and_a_reset_sysctl() {
    let _serial = serial();
    let host = Host::with_daemon_config("resync_interval = \"1s\"");
    host.write("web.toml", WEB);
    let _d = host.start_ready();
    assert_eq!(host.ns.sysctl("net/ipv4/conf/hm-natout/accept_local").as_deref(), Some("1"));

    host.ns.ip(&["route", "del", "10.96.0.10/32"]);
    host.ns.set_sysctl("net/ipv4/conf/hm-natout/accept_local", "0");
    host.ns.set_sysctl("net/ipv4/conf/all/rp_filter", "1");
    assert!(!host.has_route("10.96.0.10"));

    wait_until("the route to come back", Duration::from_secs(5), || host.has_route("10.96.0.10")).unwrap();
    wait_until("the sysctls to come back", Duration::from_secs(5), || {
        host.ns.sysctl("net/ipv4/conf/hm-natout/accept_local").as_deref() == Some("1")
            && host.ns.sysctl("net/ipv4/conf/all/rp_filter").as_deref() == Some("0")
    })
    .unwrap();
}
