//! Drift repair: what someone removed is put back (by the resync a kernel
//! event or the sysctl read-back brings forward, or the periodic one).

use hm_testkit::wait_soon;

use crate::fixtures::*;

#[test]
fn the_periodic_resync_restores_a_deleted_route_and_a_reset_sysctl() {
    let host = Host::with_daemon_config("resync_interval = \"1s\"");
    host.write("web.toml", WEB);
    let _d = host.start_ready();
    assert_eq!(host.ns.sysctl("net/ipv4/conf/hm-natout/accept_local").as_deref(), Some("1"));

    // (`ip` fails loudly if the route is not there to delete. Whether the
    // deletion is still visible afterwards is a race: the daemon repairs
    // what it owns as soon as the kernel announces the change.)
    host.ns.ip(&["route", "del", "10.96.0.10/32"]);
    host.ns.set_sysctl("net/ipv4/conf/hm-natout/accept_local", "0");
    host.ns.set_sysctl("net/ipv4/conf/all/rp_filter", "1");

    wait_soon("the route to come back", || host.has_route("10.96.0.10")).unwrap();
    wait_soon("the sysctls to come back", || {
        host.ns.sysctl("net/ipv4/conf/hm-natout/accept_local").as_deref() == Some("1")
            && host.ns.sysctl("net/ipv4/conf/all/rp_filter").as_deref() == Some("0")
    })
    .unwrap();
}
