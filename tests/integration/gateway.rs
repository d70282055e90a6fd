//! Gateway peers for real traffic: two sites, four daemons (sites.rs).
//! Members reach each other over TCP and UDP through both gateways, the WAN
//! carries only VXLAN with the configured VNI and port, TCP fits the
//! reduced route MTU, replies find a member no `[[member]]` CIDR covers,
//! a service's remote backend answers, and a cut WAN marks the peer down
//! (and traffic fail fast) until it is restored.

use std::time::Instant;

use hm_testkit::wait_soon;

use crate::fixtures::*;
use crate::sites::*;

/// Counts, on A's gateway's WAN link, VXLAN with our VNI and port in each
/// direction from and to A's `local_ip` (of the underlay `u`), VXLAN that
/// leaves from another of its addresses, and site traffic that is not
/// encapsulated (must stay 0).
fn count_wan_traffic(sites: &Sites, u: &Underlay) {
    let ip = if u.wan_local.contains(':') { "ip6" } else { "ip" };
    let local = u.wan_local;
    let rules = format!(
        r#"
table inet hmtest {{
    counter vxlan_out {{}}
    counter vxlan_out_elsewhere {{}}
    counter vxlan_in {{}}
    counter vxlan_in_elsewhere {{}}
    counter bare {{}}
    chain out {{
        type filter hook postrouting priority 0; policy accept;
        oifname "wan" {ip} saddr {local} udp dport {VXLAN_PORT} @th,96,24 {VNI} counter name vxlan_out
        oifname "wan" {ip} saddr != {local} udp dport {VXLAN_PORT} @th,96,24 {VNI} counter name vxlan_out_elsewhere
        oifname "wan" ip daddr {{ 10.10.0.0/16, 10.20.0.0/16 }} counter name bare
        oifname "wan" ip6 daddr {{ fd10::/16, fd20::/16 }} counter name bare
    }}
    chain in {{
        type filter hook prerouting priority 0; policy accept;
        iifname "wan" {ip} daddr {local} udp dport {VXLAN_PORT} @th,96,24 {VNI} counter name vxlan_in
        iifname "wan" {ip} daddr != {local} udp dport {VXLAN_PORT} @th,96,24 {VNI} counter name vxlan_in_elsewhere
        iifname "wan" ip saddr {{ 10.10.0.0/16, 10.20.0.0/16 }} counter name bare
        iifname "wan" ip6 saddr {{ fd10::/16, fd20::/16 }} counter name bare
    }}
}}
"#
    );
    sites.ga.ns.exec_with_input("nft", &["-f", "-"], &rules);
}

/// VXLAN that left A's gateway (`dir` "out") or came to it ("in"): from
/// and to its `local_ip`, where the kernel can set a tunnel's source; from
/// wherever its route says (and so, for replies, back to that address),
/// where it cannot (hostmesh status names the missing `tunnel_source`).
fn vxlan(sites: &Sites, dir: &str) -> u64 {
    let missing = sites.ga.status().kernel.unwrap().missing;
    let pinned = missing.iter().all(|m| m.feature != hostmesh::Feature::TunnelSource);
    let at_local = counter(sites, &format!("vxlan_{dir}"));
    let elsewhere = counter(sites, &format!("vxlan_{dir}_elsewhere"));
    if pinned {
        assert_eq!(elsewhere, 0, "VXLAN {dir} from or to another address than local_ip");
        at_local
    } else {
        at_local + elsewhere
    }
}

fn counter(sites: &Sites, name: &str) -> u64 {
    let v = sites.ga.ns.exec("nft", &["-j", "list", "counter", "inet", "hmtest", name]);
    let json: serde_json::Value = serde_json::from_str(&v).expect("nft json");
    json["nftables"]
        .as_array()
        .and_then(|a| a.iter().find_map(|o| o["counter"]["packets"].as_u64()))
        .unwrap_or_else(|| panic!("counter {name} in {v}"))
}

const REMOTE_SERVICE: &str = r#"
[[service]]
name = "remote-echo"
vip = "10.96.7.1"
port = 80
backends = ["10.20.1.1:8080"]
"#;

fn echo_at(ip: &str) -> String {
    format!("{ip}:{ECHO_PORT}")
}

/// One request to the remote service from A's member, as a workload in
/// the test cgroup would make it (no bind: the kernel picks the source).
fn ask_service(sites: &Sites) -> String {
    let out = sites
        .ma
        .ns
        .command_in_cgroup("python3", sites.ma.cgroup.path())
        .args([
            "-c",
            "import socket; s = socket.create_connection(('10.96.7.1', 80), timeout=2); \
             print(s.makefile().readline().strip(), s.getpeername()[0], s.getsockname()[0])",
        ])
        .output()
        .expect("run python3");
    assert!(out.status.success(), "service client: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn members_of_two_sites_talk_through_their_gateways() {
    let sites = Sites::start(REMOTE_SERVICE);
    count_wan_traffic(&sites, &UNDERLAY_V4);
    let logs = || sites.logs();

    // TCP and UDP, A -> B and B -> A; each side sees the other's workload
    // address (no translation anywhere).
    let ab = tcp_exchange(&sites.ma.ns, MA_WORKLOAD, &echo_at(MB_WORKLOAD), 3, 100)
        .unwrap_or_else(|e| panic!("TCP A -> B: {e}\n{}", logs()));
    assert_eq!((ab.seen_as.as_str(), ab.echoed), (MA_WORKLOAD, 300));
    let ba = tcp_exchange(&sites.mb.ns, MB_WORKLOAD, &echo_at(MA_WORKLOAD), 3, 100)
        .unwrap_or_else(|e| panic!("TCP B -> A: {e}\n{}", logs()));
    assert_eq!((ba.seen_as.as_str(), ba.echoed), (MB_WORKLOAD, 300));
    assert_eq!(udp_exchange(&sites.ma.ns, MA_WORKLOAD, &echo_at(MB_WORKLOAD)).expect("UDP A -> B"), MA_WORKLOAD);
    assert_eq!(udp_exchange(&sites.mb.ns, MB_WORKLOAD, &echo_at(MA_WORKLOAD)).expect("UDP B -> A"), MB_WORKLOAD);

    // The member's route to the peer CIDR: 1500 - 50 bytes of VXLAN over
    // IPv4; TCP's MSS follows it, and full-size segments cross.
    let route = sites.ma.ns.ip(&["route", "show", "10.20.0.0/16"]);
    assert!(route.contains("dev hm-tun0") && route.contains("mtu 1450"), "{route}");
    // Each route carries its tunnel key (the far end, from local_ip), so
    // the device keeps its outer route cached: the member's to its
    // gateway, the gateway's to the peer's gateway and to its member.
    let key = |at: &Host, dst: &str, far: &str, local: &str| {
        let route = at.ns.ip(&["-d", "route", "show", dst]);
        let want = format!("encap ip id {VNI} src {local} dst {far} ttl 64");
        assert!(route.contains(&want), "{dst}: {route}; want {want}");
    };
    key(&sites.ma, "10.20.0.0/16", UNDERLAY_V4.ga_lan, UNDERLAY_V4.ma);
    key(&sites.ga, "10.20.0.0/16", UNDERLAY_V4.gb_wan, UNDERLAY_V4.wan_local);
    key(&sites.ga, "10.10.1.0/24", UNDERLAY_V4.ma, UNDERLAY_V4.wan_local);
    // A gateway-only host has no bpfnat veth, and status does not claim one.
    assert!(
        sites.ga.status().objects.iter().all(|o| o.kind != hostmesh::state::ObjectKind::Bpfnat),
        "{:?}",
        sites.ga.status().objects
    );
    let big = tcp_exchange(&sites.ma.ns, MA_WORKLOAD, &echo_at(MB_WORKLOAD), 50, 1400)
        .unwrap_or_else(|e| panic!("1400-byte writes A -> B: {e}\n{}", logs()));
    assert_eq!(big.echoed, 50 * 1400);
    assert!(big.mss <= 1450 - 40, "MSS {} does not fit the tunnel", big.mss);

    // A member address that no [[member]] CIDR covers: A's gateway has no
    // route to it, yet replies come back along the learned path.
    let get = sites.ga.ns.exec_output("ip", &["route", "get", MA_UNLISTED]);
    assert!(!String::from_utf8_lossy(&get.stdout).contains("hm-tun0"), "A's gateway routes {MA_UNLISTED}");
    let learned = tcp_exchange(&sites.ma.ns, MA_UNLISTED, &echo_at(MB_WORKLOAD), 2, 500)
        .unwrap_or_else(|e| panic!("TCP from {MA_UNLISTED}: {e}\n{}", logs()));
    assert_eq!((learned.seen_as.as_str(), learned.echoed), (MA_UNLISTED, 1000));
    assert_eq!(udp_exchange(&sites.ma.ns, MA_UNLISTED, &echo_at(MB_WORKLOAD)).expect("UDP learned"), MA_UNLISTED);

    // A service on A's member whose backend is B's member.
    let answer = ask_service(&sites);
    let words: Vec<&str> = answer.split_whitespace().collect();
    assert_eq!(words.len(), 4, "{answer}");
    // greeting (client as seen, server), peer name (the VIP), own address
    assert_eq!(words[1], MB_WORKLOAD, "served by the backend in site B: {answer}");
    assert_eq!(words[2], "10.96.7.1", "{answer}");
    assert_eq!(words[0], words[3], "the backend sees the client's own address: {answer}");

    // The WAN carried all of it as VXLAN with our VNI and port, in both
    // directions, and nothing of the sites' addresses bare.
    assert!(vxlan(&sites, "out") >= 60, "VXLAN out: {}", vxlan(&sites, "out"));
    assert!(vxlan(&sites, "in") >= 60, "VXLAN in: {}", vxlan(&sites, "in"));
    assert_eq!(counter(&sites, "bare"), 0, "unencapsulated site traffic on the WAN");
}

fn peer_state(host: &Host, name: &str) -> Option<String> {
    host.status()
        .objects
        .iter()
        .find(|o| o.kind == hostmesh::state::ObjectKind::Peer && o.name == name)
        .map(|o| o.state.to_string())
}

#[test]
fn a_cut_wan_marks_the_peer_down_and_traffic_fails_fast_until_restored() {
    let sites = Sites::start("");
    let logs = || sites.logs();
    tcp_exchange(&sites.ma.ns, MA_WORKLOAD, &echo_at(MB_WORKLOAD), 1, 10).unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    assert_eq!(peer_state(&sites.ga, "site-b").as_deref(), Some("up"));

    // Down once probe_loss probes are lost in a row.
    let cut = Instant::now();
    sites.ga.ns.ip(&["link", "set", "wan", "down"]);
    wait_soon("A's gateway marks site-b down", || peer_state(&sites.ga, "site-b").as_deref() == Some("down"))
        .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    println!("site-b down after {:?} (probe interval {PROBE_INTERVAL_MS} ms, loss {PROBE_LOSS})", cut.elapsed());
    wait_soon("B's gateway marks site-a down", || peer_state(&sites.gb, "site-a").as_deref() == Some("down"))
        .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    let (text, _) = sites.ga.status_text();
    assert!(text.lines().any(|l| l.contains("site-b") && l.contains("down") && l.contains("since")), "{text}");
    let notify = &sites.daemons[1].notify;
    wait_soon("STATUS= names the down peer and since when", || {
        notify
            .messages()
            .iter()
            .any(|m| m.contains("STATUS=") && m.contains("(1 down: site-b since 20") && m.contains(" UTC)"))
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}", notify.messages()));

    // Routes withdrawn: the gateway answers at once that site B is
    // unreachable instead of letting the SYN vanish.
    let route = sites.ga.ns.ip(&["route", "show", "10.20.0.0/16"]);
    assert!(route.starts_with("unreachable"), "{route}");
    // EHOSTUNREACH, not the exchange's own timeout. (Here the ICMP error
    // can beat connect(2) releasing its socket, which makes it a soft
    // error until the SYN's first retransmission at 1 s; across a real
    // network it is at once.)
    let err = tcp_exchange(&sites.ma.ns, MA_WORKLOAD, &echo_at(MB_WORKLOAD), 1, 10).expect_err("site B is cut off");
    assert_eq!(err.raw_os_error(), Some(libc::EHOSTUNREACH), "{err}");
    // UDP too. The gateway sends such errors at one a second per source,
    // five in a burst (ip_error()); on a slow machine the TCP attempt
    // above may have spent them, and a datagram whose error was not sent
    // times out instead: ask again until the budget has refilled.
    let mut udp = None;
    wait_soon("EHOSTUNREACH for UDP", || {
        let e = udp_exchange(&sites.ma.ns, MA_WORKLOAD, &echo_at(MB_WORKLOAD)).expect_err("site B is cut off");
        let unreachable = e.raw_os_error() == Some(libc::EHOSTUNREACH);
        udp = Some(e);
        unreachable
    })
    .unwrap_or_else(|err| panic!("{err}: the last error was {udp:?}"));

    // Restored: up again at the first answer, and traffic flows.
    sites.ga.ns.ip(&["link", "set", "wan", "up"]);
    wait_soon("A's gateway marks site-b up", || peer_state(&sites.ga, "site-b").as_deref() == Some("up"))
        .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    wait_soon("traffic flows again", || tcp_exchange(&sites.ma.ns, MA_WORKLOAD, &echo_at(MB_WORKLOAD), 1, 10).is_ok())
        .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    let (text, _) = sites.ga.status_text();
    assert!(text.lines().any(|l| l.contains("site-b") && l.contains("up")), "{text}");
}

#[test]
fn a_gateway_learns_which_member_started_a_flow_and_forgets_it_when_idle() {
    use hostmesh::abi::addr16;
    let sites = Sites::start_with(&UNDERLAY_V4, "", "resync_interval = \"1s\"\nconntrack_udp_timeout = \"2s\"");
    let logs = || sites.logs();
    tcp_exchange(&sites.ma.ns, MA_UNLISTED, &echo_at(MB_WORKLOAD), 1, 10).unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    udp_exchange(&sites.ma.ns, MA_UNLISTED, &echo_at(MB_WORKLOAD)).unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    // Keyed by the reply's 5-tuple (from B's workload to A's), pointing at
    // A's member by its underlay address.
    let reply_to_unlisted = |proto: u8| {
        sites.learned_paths().into_iter().any(|(k, v)| {
            k.proto == proto
                && k.src == addr16(MB_WORKLOAD.parse().unwrap())
                && u16::from_be(k.sport_be) == ECHO_PORT
                && k.dst == addr16(MA_UNLISTED.parse().unwrap())
                && v.member == addr16("192.0.2.20".parse().unwrap())
        })
    };
    assert!(reply_to_unlisted(6), "TCP path learned: {:?}", sites.learned_paths());
    assert!(reply_to_unlisted(17), "UDP path learned: {:?}", sites.learned_paths());
    // A member address its own [[member]] CIDR covers needs no learned
    // path: the replies take the route back to that member (and its
    // cached tunnel key), and no entry is made per flow.
    tcp_exchange(&sites.ma.ns, MA_WORKLOAD, &echo_at(MB_WORKLOAD), 1, 10).unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    udp_exchange(&sites.ma.ns, MA_WORKLOAD, &echo_at(MB_WORKLOAD)).unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    let covered = addr16(MA_WORKLOAD.parse().unwrap());
    assert!(
        sites.learned_paths().iter().all(|(k, _)| k.dst != covered && k.src != covered),
        "a path learned for {MA_WORKLOAD}: {:?}",
        sites.learned_paths()
    );
    // conntrack_udp_timeout is 2 s here; the TCP timeout (24 h) keeps the
    // TCP path.
    wait_soon("the idle UDP path is forgotten", || !reply_to_unlisted(17))
        .unwrap_or_else(|e| panic!("{e}: {:?}", sites.learned_paths()));
    assert!(reply_to_unlisted(6), "the TCP path stays: {:?}", sites.learned_paths());
}

#[test]
fn ipv6_workloads_cross_the_ipv4_underlay_both_ways() {
    let sites = Sites::start("");
    count_wan_traffic(&sites, &UNDERLAY_V4);
    let logs = || sites.logs();
    let at = |ip: &str| format!("[{ip}]:{ECHO_PORT}");
    let route = sites.ma.ns.ip(&["-6", "route", "show", "fd20::/16"]);
    assert!(route.contains("dev hm-tun0") && route.contains("mtu 1450"), "{route}");
    let ab = tcp_exchange(&sites.ma.ns, MA_WORKLOAD6, &at(MB_WORKLOAD6), 20, 1400)
        .unwrap_or_else(|e| panic!("TCP A -> B over IPv6: {e}\n{}", logs()));
    assert_eq!((ab.seen_as.as_str(), ab.echoed), (MA_WORKLOAD6, 20 * 1400));
    assert!(ab.mss <= 1450 - 60, "MSS {} does not fit the tunnel", ab.mss);
    let ba = tcp_exchange(&sites.mb.ns, MB_WORKLOAD6, &at(MA_WORKLOAD6), 3, 100)
        .unwrap_or_else(|e| panic!("TCP B -> A over IPv6: {e}\n{}", logs()));
    assert_eq!(ba.seen_as, MB_WORKLOAD6);
    assert_eq!(udp_exchange(&sites.ma.ns, MA_WORKLOAD6, &at(MB_WORKLOAD6)).expect("UDP A -> B"), MA_WORKLOAD6);
    assert_eq!(udp_exchange(&sites.mb.ns, MB_WORKLOAD6, &at(MA_WORKLOAD6)).expect("UDP B -> A"), MB_WORKLOAD6);
    assert!(vxlan(&sites, "out") >= 20, "VXLAN out: {}", vxlan(&sites, "out"));
    assert_eq!(counter(&sites, "bare"), 0, "unencapsulated site traffic on the WAN");
}

/// Whether A's gateway holds an answer to a probe it sent through the
/// tunnel to `target` (HM_GW_PROBES, written by its hm_tun_in).
fn answered_in_the_tunnel(sites: &Sites, target: &str) -> bool {
    use hostmesh::abi::{addr16, GwProbe, HmMap, Pod, PROBE_ACK};
    use hostmesh::backends::bpf::sys;
    use std::os::fd::AsFd;
    let pin = sites.ga.opts.bpffs.join("maps").join(HmMap::GwProbes.name());
    let Ok(fd) = sys::obj_get(&pin) else { return false };
    let target = addr16(target.parse().expect("an address"));
    sys::map_dump(fd.as_fd(), 4, std::mem::size_of::<GwProbe>())
        .expect("dump HM_GW_PROBES")
        .iter()
        .filter_map(|(_, v)| GwProbe::from_bytes(v))
        .any(|p| p.kind == PROBE_ACK.to_be() && p.target == target)
}

#[test]
fn an_ipv6_underlay_carries_both_families_and_its_peers_are_probed() {
    let sites = Sites::start_with(&UNDERLAY_V6, "", "");
    count_wan_traffic(&sites, &UNDERLAY_V6);
    let logs = || sites.logs();
    // 1500 less 70 bytes of VXLAN over IPv6.
    let route = sites.ma.ns.ip(&["route", "show", "10.20.0.0/16"]);
    assert!(route.contains("dev hm-tun0") && route.contains("mtu 1430"), "{route}");
    let v4 = tcp_exchange(&sites.ma.ns, MA_WORKLOAD, &echo_at(MB_WORKLOAD), 20, 1380)
        .unwrap_or_else(|e| panic!("TCP A -> B: {e}\n{}", logs()));
    assert_eq!((v4.seen_as.as_str(), v4.echoed), (MA_WORKLOAD, 20 * 1380));
    assert!(v4.mss <= 1430 - 40, "MSS {} does not fit the tunnel", v4.mss);
    let at6 = |ip: &str| format!("[{ip}]:{ECHO_PORT}");
    let v6 = tcp_exchange(&sites.mb.ns, MB_WORKLOAD6, &at6(MA_WORKLOAD6), 3, 100)
        .unwrap_or_else(|e| panic!("TCP B -> A over IPv6: {e}\n{}", logs()));
    assert_eq!(v6.seen_as, MB_WORKLOAD6);
    assert_eq!(udp_exchange(&sites.ma.ns, MA_UNLISTED, &echo_at(MB_WORKLOAD)).expect("UDP learned"), MA_UNLISTED);
    assert!(vxlan(&sites, "out") >= 20, "VXLAN out: {}", vxlan(&sites, "out"));
    assert!(vxlan(&sites, "in") >= 20, "VXLAN in: {}", vxlan(&sites, "in"));
    assert_eq!(counter(&sites, "bare"), 0, "unencapsulated site traffic on the WAN");
    // The probes cross the tunnel over IPv6, answered by B's gateway's
    // data plane (the older daemons' probes are answered too, by the
    // daemon: this shows the tunnel's are).
    wait_soon("an answer of B's data plane in A's gateway's HM_GW_PROBES", || {
        answered_in_the_tunnel(&sites, UNDERLAY_V6.gb_wan)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    // The probes run over IPv6 too: cut and restore.
    sites.ga.ns.ip(&["link", "set", "wan", "down"]);
    wait_soon("site-b down", || peer_state(&sites.ga, "site-b").as_deref() == Some("down"))
        .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    sites.ga.ns.ip(&["link", "set", "wan", "up"]);
    wait_soon("site-b up", || peer_state(&sites.ga, "site-b").as_deref() == Some("up"))
        .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
}
