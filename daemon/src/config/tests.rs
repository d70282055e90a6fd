//! Loader and validation tests: every rule, with its exact message.

use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use super::*;

/// A scratch config dir, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new() -> Dir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "hm-config-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(&p).unwrap();
        Dir(p)
    }
    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        fs::write(&p, text).unwrap();
        p
    }
    fn remove(&self, name: &str) {
        fs::remove_file(self.0.join(name)).unwrap();
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Parses one file's text and returns its errors as display strings.
pub(super) fn errors(text: &str) -> Vec<String> {
    match parse_file(&Source::new(Path::new("t.toml"), text)) {
        Ok(_) => Vec::new(),
        Err(errs) => errs.iter().map(|e| e.to_string()).collect(),
    }
}

pub(super) fn one_error(text: &str) -> String {
    let errs = errors(text);
    assert_eq!(errs.len(), 1, "expected exactly one error, got {errs:?}");
    errs.into_iter().next().unwrap()
}

const WEB: &str = r#"
[[service]]
name = "web"
vip = "10.96.0.10"
port = 80
backends = ["192.168.10.11:8080", { address = "192.168.10.12:8080", weight = 2 }]
"#;

#[test]
fn tc_attach_may_ask_for_clsact_filters() {
    let f = parse_file(&Source::new(Path::new("t.toml"), "[daemon]\ntc_attach = \"netlink\"\n")).expect("valid");
    assert_eq!(f.daemon.unwrap().tc_attach, TcAttachPref::Netlink);
}

#[test]
fn full_contract_example_parses() {
    let text = r#"
[daemon]
connect_time_lb = "all"
host_interfaces = ["eth0"]
cgroup = "/sys/fs/cgroup"
mesh_backend = "sk_lookup"
resync_interval = "10s"

[[service]]
name = "web"
vip = "10.96.0.10"
port = 80
protocol = "tcp"
backends = ["192.168.10.11:8080", { address = "192.168.10.12:8080", weight = 2 }]

[[service]]
name = "dns6"
vip = "fd00::53"
port = 53
protocol = "udp"
backends = ["[fd00::1:53]:53"]

[[mesh]]
name = "web-sidecar"
vip = "10.96.0.10"
port = 80
protocol = "tcp"
redirect_port = 15001

[gateway]
role = "gateway"
local_ip = "192.0.2.1"
vni = 4242
udp_port = 4789

[[peer]]
name = "site-b"
endpoint = "198.51.100.7"
cidrs = ["10.20.0.0/16"]

[[member]]
name = "m1"
endpoint = "192.0.2.21"
cidrs = ["10.10.1.0/24"]
"#;
    let f = parse_file(&Source::new(Path::new("t.toml"), text)).expect("valid");
    let d = f.daemon.unwrap();
    assert_eq!(d.connect_time_lb, CtlbMode::All);
    assert_eq!(d.host_interfaces, Some(vec!["eth0".to_string()]));
    assert_eq!(d.mesh_backend, MeshBackend::SkLookup);
    assert_eq!(d.resync_interval, std::time::Duration::from_secs(10));
    assert_eq!(d.tc_attach, TcAttachPref::Auto, "the default");
    assert_eq!(f.services.len(), 2);
    let web = &f.services[0];
    assert_eq!(web.vip, "10.96.0.10".parse::<IpAddr>().unwrap());
    assert_eq!(web.backends[1].weight, 2);
    assert_eq!(web.backends[0].weight, 1);
    assert_eq!((web.origin.line, web.origin.column), (10, 8));
    assert_eq!(f.services[1].protocol, Protocol::Udp);
    assert_eq!(f.meshes[0].redirect_port, 15001);
    assert_eq!(f.gateway.unwrap().role, GatewayRole::Gateway);
    assert_eq!(f.peers[0].cidrs[0].to_string(), "10.20.0.0/16");
    assert_eq!(f.members[0].endpoint.to_string(), "192.0.2.21");
}

#[test]
fn defaults() {
    let f = parse_file(&Source::new(Path::new("t.toml"), "[[service]]\nname = \"a\"\nvip = \"10.0.0.1\"\nport = 1\n"))
        .unwrap();
    assert_eq!(f.services[0].protocol, Protocol::Tcp);
    assert!(f.services[0].backends.is_empty());
    let g = parse_file(&Source::new(
        Path::new("t.toml"),
        "[gateway]\nrole = \"member\"\nlocal_ip = \"192.0.2.21\"\ngateway_ip = \"192.0.2.1\"\nvni = 7\n",
    ))
    .unwrap();
    let g = g.gateway.unwrap();
    assert_eq!(g.udp_port, 4789);
    assert_eq!(g.gateway_ips, ["192.0.2.1".parse::<std::net::IpAddr>().unwrap()], "gateway_ip is a list of one");
    assert_eq!(
        (g.probe_interval, g.probe_loss, g.probe_rise, g.preempt),
        (std::time::Duration::from_secs(1), 3, 2, false)
    );
    assert_eq!(DaemonSettings::default().connect_time_lb, CtlbMode::Tcp);
    assert_eq!(DaemonSettings::default().resync_interval, DEFAULT_RESYNC_INTERVAL);
}

#[test]
fn a_parsed_file_holds_no_more_than_its_services() {
    // Collecting the validated services in place of the raw tables kept
    // the raw allocation: 67 MB held for a file of 100,000 services.
    let text: String = (0..2000)
        .map(|i| format!("[[service]]\nname = \"s{i}\"\nvip = \"10.0.{}.{}\"\nport = 80\n", i / 250, i % 250))
        .collect();
    let f = parse_file(&Source::new(Path::new("t.toml"), &text)).expect("valid");
    assert_eq!(f.services.len(), 2000);
    assert!(f.services.capacity() < 2100, "{} slots for 2,000 services", f.services.capacity());
    let raw = std::mem::size_of::<Service>() * f.services.capacity();
    assert!(raw < 2000 * 200, "{raw} bytes of service slots");
}

/// A file of `n` services with the constructs a cut must respect:
/// comments, multi-line arrays, inline tables, strings holding brackets.
fn fleet_file(n: usize) -> String {
    let mut text = String::from("# fleet\n\n[daemon]\nconnect_time_lb = \"all\"\n\n");
    for i in 0..n {
        text += &format!(
            "[[service]] # {i}\nname = \"s{i}\"\nvip = \"10.0.{}.{}\"\nport = 80\nbackends = [\n  \"10.1.0.1:80\", # [[service]]\n  {{ address = \"10.1.0.2:80\", weight = 2 }},\n]\n\n",
            i / 250,
            i % 250 + 1
        );
        if i % 50 == 0 {
            text += &format!(
                "[[mesh]]\nname = \"m{i}\"\nvip = \"10.9.0.{}\"\nport = 0\nredirect_port = 15001\n\n",
                i / 50 + 1
            );
        }
    }
    text
}

#[test]
fn a_file_parsed_in_parts_means_what_it_means_whole() {
    let text = fleet_file(300);
    let src = Source::new(Path::new("t.toml"), &text);
    let parts = split::parts_of(&text, 2000).expect("cut");
    assert!(parts.len() > 10, "{} parts", parts.len());
    let whole = validate::parse_whole(&src).expect("valid");
    assert_eq!(whole.services.len(), 300);
    let joined = validate::parse_parts(&src, parts).expect("every part valid");
    // Origins included: every position is still the file's.
    assert_eq!(joined, whole);
    assert_eq!(joined.services[299].origin.line, whole.services[299].origin.line);

    // Any error, and the parts give up: the whole parse reports it.
    let bad = text.replace("name = \"s200\"", "name = \"s200\"\nbogus = 1");
    let src = Source::new(Path::new("t.toml"), &bad);
    assert_eq!(validate::parse_parts(&src, split::parts_of(&bad, 2000).unwrap()), None);
    // [daemon] twice, in two parts: only the whole parse sees the clash.
    let twice = text.clone() + "[daemon]\nconnect_time_lb = \"tcp\"\n";
    let src = Source::new(Path::new("t.toml"), &twice);
    assert_eq!(validate::parse_parts(&src, split::parts_of(&twice, 2000).unwrap()), None);
    assert!(validate::parse_whole(&src).is_err());
}

#[test]
fn a_large_file_gives_what_the_whole_parse_gives_with_or_without_errors() {
    let text = fleet_file(2000);
    assert!(text.len() > 2 * split::PART_BYTES, "{} bytes: large enough to be cut", text.len());
    let src = Source::new(Path::new("t.toml"), &text);
    assert_eq!(parse_file(&src), validate::parse_whole(&src));
    let bad = text.replace("port = 80\n", "port = 0\n");
    let src = Source::new(Path::new("t.toml"), &bad);
    let errors = parse_file(&src).expect_err("port 0");
    assert_eq!(Err(errors.clone()), validate::parse_whole(&src));
    assert_eq!(errors[0].line, 9, "{:?}", errors[0]);
}

#[test]
fn syntax_error_names_line_column_and_key() {
    let text = "[[service]]\nname = \"web\"\nvip = 10.96.0.10\n";
    assert_eq!(one_error(text), format!("t.toml:3:12: invalid TOML at key `vip`: {}", toml_detail(text)));
    // A broken table header has no key; the position is still exact.
    let text = "[[service]\nname = \"web\"\n";
    assert_eq!(one_error(text), format!("t.toml:1:11: invalid TOML: {}", toml_detail(text)));
}

/// The TOML parser's own wording, so the test pins our framing (position,
/// key, one line) rather than the parser's phrasing.
fn toml_detail(text: &str) -> String {
    let e = toml::from_str::<toml::Table>(text).unwrap_err();
    e.message().trim().replace('\n', "; ")
}

#[test]
fn unknown_key_is_rejected_with_its_position() {
    let err = one_error("[[service]]\nname = \"web\"\nvip = \"10.96.0.10\"\nport = 80\nprot = \"tcp\"\n");
    assert!(err.starts_with("t.toml:5:1: invalid TOML at key `prot`: unknown field `prot`"), "{err}");
}

#[test]
fn bad_addresses() {
    assert_eq!(
        one_error("[[service]]\nname = \"web\"\nvip = \"10.96.0.300\"\nport = 80\n"),
        "t.toml:3:7: service \"web\": vip \"10.96.0.300\" is not an IPv4 or IPv6 address"
    );
    assert_eq!(
        one_error("[[service]]\nname = \"web\"\nvip = \"127.0.0.5\"\nport = 80\n"),
        "t.toml:3:7: service \"web\": vip 127.0.0.5 is a loopback address; a VIP must not be loopback"
    );
    assert_eq!(
        one_error("[[service]]\nname = \"web\"\nvip = \"224.0.0.1\"\nport = 80\n"),
        "t.toml:3:7: service \"web\": vip 224.0.0.1 is not a unicast address"
    );
    assert_eq!(
        one_error("[[service]]\nname = \"web\"\nvip = \"10.0.0.1\"\nport = 80\nbackends = [\"10.0.0.2\"]\n"),
        "t.toml:5:13: service \"web\": backend \"10.0.0.2\" is not an address with a port, like \"192.0.2.10:8080\" or \"[2001:db8::10]:8080\""
    );
    assert_eq!(
        one_error("[[service]]\nname = \"web\"\nvip = \"10.0.0.1\"\nport = 80\nbackends = [{ address = \"nope:1\" }]\n"),
        "t.toml:5:25: service \"web\": backend \"nope:1\" is not an address with a port, like \"192.0.2.10:8080\" or \"[2001:db8::10]:8080\""
    );
    assert_eq!(
        one_error("[[service]]\nname = \"web\"\nvip = \"10.0.0.1\"\nport = 80\nbackends = [\"[fd00::1]:80\"]\n"),
        "t.toml:5:13: service \"web\": backend [fd00::1]:80 is IPv6 but the VIP is IPv4"
    );
    assert_eq!(
        one_error("[gateway]\nrole = \"gateway\"\nlocal_ip = \"0.0.0.0\"\nvni = 1\n"),
        "t.toml:3:12: [gateway]: local_ip 0.0.0.0 is not a unicast address"
    );
    assert_eq!(
        one_error("[[peer]]\nname = \"b\"\ncidrs = [\"10.20.0.1/16\"]\n"),
        "t.toml:3:10: peer \"b\": cidr 10.20.0.1/16 has host bits set; did you mean 10.20.0.0/16?"
    );
    assert_eq!(
        one_error("[[peer]]\nname = \"b\"\ncidrs = [\"10.20.0.0/33\"]\n"),
        "t.toml:3:10: peer \"b\": cidr \"10.20.0.0/33\" is not a network like \"10.20.0.0/16\""
    );
}

#[test]
fn ports_out_of_range() {
    assert_eq!(
        one_error("[[service]]\nname = \"web\"\nvip = \"10.0.0.1\"\nport = 0\n"),
        "t.toml:4:8: service \"web\": port 0 is out of range; use 1 to 65535"
    );
    assert_eq!(
        one_error("[[service]]\nname = \"web\"\nvip = \"10.0.0.1\"\nport = 65536\n"),
        "t.toml:4:8: service \"web\": port 65536 is out of range; use 1 to 65535"
    );
    assert_eq!(
        one_error("[[service]]\nname = \"web\"\nvip = \"10.0.0.1\"\nport = 80\nbackends = [\"10.0.0.2:0\"]\n"),
        "t.toml:5:13: service \"web\": backend 10.0.0.2:0 has port 0; use 1 to 65535"
    );
    assert_eq!(
        one_error("[[mesh]]\nname = \"m\"\nvip = \"10.0.0.1\"\nport = 65536\nredirect_port = 15001\n"),
        "t.toml:4:8: mesh \"m\": port 65536 is out of range; use 0 (every port) to 65535"
    );
    assert_eq!(
        one_error("[[mesh]]\nname = \"m\"\nvip = \"10.0.0.1\"\nport = 0\nredirect_port = 0\n"),
        "t.toml:5:17: mesh \"m\": redirect_port 0 is out of range; use 1 to 65535"
    );
    assert_eq!(
        one_error("[gateway]\nrole = \"gateway\"\nlocal_ip = \"192.0.2.1\"\nvni = 1\nudp_port = 65536\n"),
        "t.toml:5:12: [gateway]: udp_port 65536 is out of range; use 1 to 65535"
    );
}

#[test]
fn mesh_port_zero_means_every_port() {
    let f = parse_file(&Source::new(
        Path::new("t.toml"),
        "[[mesh]]\nname = \"m\"\nvip = \"10.0.0.1\"\nport = 0\nredirect_port = 15001\n",
    ))
    .unwrap();
    assert_eq!(f.meshes[0].port, 0);
}

#[test]
fn names_weights_enums_and_durations() {
    assert_eq!(
        one_error("[[service]]\nname = \"Web\"\nvip = \"10.0.0.1\"\nport = 80\n"),
        "t.toml:2:8: service name \"Web\" is not valid; use 1 to 63 lowercase letters, digits and '-', starting with a letter or digit"
    );
    assert_eq!(
        one_error("[[service]]\nname = \"web\"\nvip = \"10.0.0.1\"\nport = 80\nprotocol = \"sctp\"\n"),
        "t.toml:5:12: service \"web\": protocol \"sctp\" is not one of \"tcp\" or \"udp\""
    );
    assert_eq!(
        one_error("[[service]]\nname = \"web\"\nvip = \"10.0.0.1\"\nport = 80\nbackends = [{ address = \"10.0.0.2:80\", weight = 1001 }]\n"),
        "t.toml:5:49: service \"web\": backend 10.0.0.2:80 has weight 1001; use 1 to 1000, or 0 to drain it (no new connections)"
    );
    assert_eq!(
        one_error("[[service]]\nname = \"web\"\nvip = \"10.0.0.1\"\nport = 80\nbackends = [\"10.0.0.2:80\", \"10.0.0.2:80\"]\n"),
        "t.toml:5:28: service \"web\": backend 10.0.0.2:80 is listed twice"
    );
    assert_eq!(
        one_error("[daemon]\nconnect_time_lb = \"some\"\n"),
        "t.toml:2:19: [daemon]: connect_time_lb \"some\" is not one of \"all\", \"tcp\" or \"off\""
    );
    assert_eq!(
        one_error("[daemon]\nmesh_backend = \"iptables\"\n"),
        "t.toml:2:16: [daemon]: mesh_backend \"iptables\" is not one of \"auto\", \"sk_lookup\" or \"nftables\""
    );
    assert_eq!(
        one_error("[daemon]\ntc_attach = \"tcx\"\n"),
        "t.toml:2:13: [daemon]: tc_attach \"tcx\" is not one of \"auto\" or \"netlink\""
    );
    assert_eq!(
        one_error("[daemon]\nresync_interval = \"soon\"\n"),
        "t.toml:2:19: [daemon]: resync_interval \"soon\" is not a duration; write a number and a unit, like \"500ms\", \"2s\", \"1m30s\" or \"3h\""
    );
    assert_eq!(
        one_error("[daemon]\ncgroup = \"sys/fs/cgroup\"\n"),
        "t.toml:2:10: [daemon]: cgroup \"sys/fs/cgroup\" must be an absolute path"
    );
    assert_eq!(
        one_error("[gateway]\nrole = \"member\"\nlocal_ip = \"192.0.2.21\"\nvni = 1\n"),
        "t.toml:2:8: [gateway]: a member needs `gateway_ips` (or `gateway_ip`), the underlay addresses of this site's gateways"
    );
    let member =
        |g: &str| one_error(&format!("[gateway]\nrole = \"member\"\nlocal_ip = \"192.0.2.21\"\nvni = 1\n{g}\n"));
    assert_eq!(
        member("gateway_ip = \"192.0.2.1\"\ngateway_ips = [\"192.0.2.2\"]"),
        "t.toml:6:15: [gateway]: give `gateway_ips` or `gateway_ip`, not both"
    );
    assert_eq!(member("gateway_ips = []"), "t.toml:5:15: [gateway]: `gateway_ips` is empty; list at least one address");
    assert_eq!(
        member("gateway_ips = [\"192.0.2.1\", \"192.0.2.1\"]"),
        "t.toml:5:29: [gateway]: 192.0.2.1 is listed twice in `gateway_ips`"
    );
    assert_eq!(
        member("gateway_ips = [\"192.0.2.1\", \"2001:db8::1\"]"),
        "t.toml:5:29: [gateway]: `gateway_ips` mixes IPv4 and IPv6 (192.0.2.1 and 2001:db8::1); a site's gateways share one family"
    );
    let nine: Vec<String> = (1..=9).map(|i| format!("\"192.0.2.{i}\"")).collect();
    assert_eq!(
        member(&format!("gateway_ips = [{}]", nine.join(", "))),
        "t.toml:5:15: [gateway]: `gateway_ips` lists 9 addresses; at most 8 are probed"
    );
    assert_eq!(
        member("gateway_ips = [\"192.0.2.21\"]"),
        "t.toml:5:15: [gateway]: gateway 192.0.2.21 is this member's own local_ip"
    );
    assert_eq!(
        member("gateway_ip = \"192.0.2.1\"\nprobe_rise = 0"),
        "t.toml:6:14: [gateway]: probe_rise 0 is out of range; use 1 to 1000"
    );
    assert_eq!(
        one_error("[[peer]]\nname = \"b\"\nendpoint = \"192.0.2.1\"\nendpoints = [\"192.0.2.2\"]\ncidrs = []\n"),
        "t.toml:4:13: peer \"b\": give `endpoints` or `endpoint`, not both"
    );
    assert_eq!(
        one_error("[gateway]\nrole = \"gateway\"\nlocal_ip = \"192.0.2.1\"\nvni = 16777216\n"),
        "t.toml:4:7: [gateway]: vni 16777216 is out of range; use 1 to 16777215"
    );
    let hc = |h: &str| {
        one_error(&format!("[[service]]\nname = \"web\"\nvip = \"10.0.0.1\"\nport = 80\nhealth_check = {{ {h} }}\n"))
    };
    assert_eq!(hc("interval = \"2s\""), "t.toml:5:16: invalid TOML at key `health_check`: missing field `kind`");
    assert_eq!(
        hc("kind = \"icmp\""),
        "t.toml:5:25: service \"web\": health_check: kind \"icmp\" is not one of \"tcp\", \"http\", \"udp\" or \"exec\""
    );
    assert_eq!(
        hc("kind = \"tcp\", path = \"/\""),
        "t.toml:5:39: service \"web\": health_check: `path` is for kind \"http\", not \"tcp\""
    );
    assert_eq!(
        hc("kind = \"tcp\", interval = \"1s\", timeout = \"2s\""),
        "t.toml:5:59: service \"web\": health_check: timeout \"2s\" is out of range; use 10ms up to the interval (1s)"
    );
    assert_eq!(
        hc("kind = \"tcp\", fall = 0"),
        "t.toml:5:39: service \"web\": health_check: fall 0 is out of range; use 1 to 100"
    );
    assert_eq!(
        hc("kind = \"http\", expect = \"399-200\""),
        "t.toml:5:42: service \"web\": health_check: expect \"399-200\" is not an HTTP status or range of them, like \"200\" or \"200-399\""
    );
    assert_eq!(
        hc("kind = \"udp\""),
        "t.toml:5:25: service \"web\": health_check: kind \"udp\" needs `send`, the payload of the check"
    );
    assert_eq!(
        hc("kind = \"exec\", command = [\"check\"]"),
        "t.toml:5:43: service \"web\": health_check: command starts with \"check\"; give the program's absolute path"
    );
    assert_eq!(
        hc("kind = \"tcp\", source = \"fd00::1\""),
        "t.toml:5:41: service \"web\": health_check: source fd00::1 is not of the backends' address family"
    );
}

#[test]
fn every_error_in_a_file_is_reported() {
    let errs = errors("[[service]]\nname = \"web\"\nvip = \"nope\"\nport = 0\nprotocol = \"icmp\"\n");
    assert_eq!(errs.len(), 3, "{errs:?}");
}

fn load(dir: &Dir, store: &mut ConfigStore) -> Loaded {
    store.load(&ConfigDirs::only(dir.0.clone())).expect("dir readable")
}

fn service_names(l: &Loaded) -> Vec<&str> {
    l.config.services.iter().map(|s| s.name.as_str()).collect()
}

#[test]
fn duplicate_names_across_files_reject_the_later_file() {
    let d = Dir::new();
    d.write("a.toml", WEB);
    d.write("b.toml", "[[service]]\nname = \"web\"\nvip = \"10.96.0.11\"\nport = 80\n");
    let l = load(&d, &mut ConfigStore::new());
    assert_eq!(service_names(&l), ["web"]);
    assert_eq!(l.config.services[0].vip.to_string(), "10.96.0.10");
    let b = &l.files[1];
    assert_eq!(b.state, FileState::Rejected);
    assert_eq!(
        b.errors[0].to_string(),
        format!("{}:2:8: service name \"web\" is already used at a.toml:3:8", d.0.join("b.toml").display())
    );
}

#[test]
fn duplicate_names_within_a_file() {
    let d = Dir::new();
    d.write("a.toml", &format!("{WEB}\n[[service]]\nname = \"web\"\nvip = \"10.96.0.11\"\nport = 81\n"));
    let l = load(&d, &mut ConfigStore::new());
    assert!(l.config.services.is_empty());
    assert_eq!(
        l.files[0].errors[0].to_string(),
        format!("{}:9:8: service name \"web\" is already used at a.toml:3:8", d.0.join("a.toml").display())
    );
}

#[test]
fn duplicate_vip_port_protocol() {
    let d = Dir::new();
    d.write("a.toml", WEB);
    d.write("b.toml", "[[service]]\nname = \"api\"\nvip = \"10.96.0.10\"\nport = 80\n");
    d.write("c.toml", "[[service]]\nname = \"dns\"\nvip = \"10.96.0.10\"\nport = 80\nprotocol = \"udp\"\n");
    let l = load(&d, &mut ConfigStore::new());
    assert_eq!(service_names(&l), ["web", "dns"], "same VIP:port over UDP is a different service");
    assert_eq!(
        l.files[1].errors[0].to_string(),
        format!(
            "{}:2:8: service \"api\": vip 10.96.0.10 port 80/tcp is already used by service \"web\" at a.toml:3:8",
            d.0.join("b.toml").display()
        )
    );
    assert_eq!(l.files[1].errors[0].key.as_deref(), Some("vip"));
}

#[test]
fn a_vip_may_be_both_service_and_mesh() {
    let d = Dir::new();
    d.write("a.toml", WEB);
    d.write("b.toml", "[[mesh]]\nname = \"web-sidecar\"\nvip = \"10.96.0.10\"\nport = 80\nredirect_port = 15001\n");
    let l = load(&d, &mut ConfigStore::new());
    assert!(l.rejected().next().is_none());
    assert_eq!(l.config.meshes.len(), 1);
}

#[test]
fn daemon_and_gateway_sections_in_two_files() {
    let d = Dir::new();
    d.write(
        "a.toml",
        "[daemon]\nconnect_time_lb = \"off\"\n\n[gateway]\nrole = \"gateway\"\nlocal_ip = \"192.0.2.1\"\nvni = 1\n",
    );
    d.write("b.toml", "[daemon]\nconnect_time_lb = \"all\"\n");
    d.write("c.toml", "[gateway]\nrole = \"gateway\"\nlocal_ip = \"192.0.2.2\"\nvni = 2\n");
    let l = load(&d, &mut ConfigStore::new());
    assert_eq!(l.config.daemon.connect_time_lb, CtlbMode::Off);
    assert_eq!(l.config.gateway.as_ref().unwrap().vni, 1);
    assert_eq!(
        l.files[1].errors[0].to_string(),
        format!(
            "{}:1:1: [daemon] is already declared at a.toml:1:1; only one file may have it",
            d.0.join("b.toml").display()
        )
    );
    assert_eq!(
        l.files[2].errors[0].to_string(),
        format!(
            "{}:1:1: [gateway] is already declared at a.toml:4:1; only one file may have it",
            d.0.join("c.toml").display()
        )
    );
}

#[test]
fn a_broken_file_keeps_its_last_good_version_and_others_still_apply() {
    let d = Dir::new();
    let mut store = ConfigStore::new();
    d.write("a.toml", WEB);
    d.write("b.toml", "[[service]]\nname = \"api\"\nvip = \"10.96.0.20\"\nport = 443\n");
    assert_eq!(service_names(&load(&d, &mut store)), ["web", "api"]);

    // b breaks; a changes and a new file c appears.
    d.write("b.toml", "[[service]]\nname = \"api\"\nvip = \"10.96.0.20\nport = 443\n");
    d.write("a.toml", &WEB.replace("10.96.0.10", "10.96.0.11"));
    d.write("c.toml", "[[service]]\nname = \"db\"\nvip = \"10.96.0.30\"\nport = 5432\n");
    let l = load(&d, &mut store);
    assert_eq!(service_names(&l), ["web", "api", "db"]);
    assert_eq!(l.config.services[0].vip.to_string(), "10.96.0.11");
    assert_eq!(l.files[1].state, FileState::RejectedKeepingLastGood);
    assert_eq!(l.files[1].errors[0].line, 3);

    // A broken file with no last good version contributes nothing.
    d.write("d.toml", "[[service]\n");
    let l = load(&d, &mut store);
    assert_eq!(l.files[3].state, FileState::Rejected);
    assert_eq!(service_names(&l), ["web", "api", "db"]);

    // Fixing b applies the fix; removing c removes what it declared.
    d.write("b.toml", "[[service]]\nname = \"api\"\nvip = \"10.96.0.21\"\nport = 443\n");
    d.remove("c.toml");
    let l = load(&d, &mut store);
    assert_eq!(service_names(&l), ["web", "api"]);
    assert_eq!(l.config.services[1].vip.to_string(), "10.96.0.21");
}

#[test]
fn a_new_conflict_falls_back_to_the_last_good_version() {
    let d = Dir::new();
    let mut store = ConfigStore::new();
    d.write("a.toml", WEB);
    d.write("b.toml", "[[service]]\nname = \"api\"\nvip = \"10.96.0.20\"\nport = 443\n");
    load(&d, &mut store);
    // b now claims web's VIP: rejected, its previous version stays.
    d.write("b.toml", "[[service]]\nname = \"api\"\nvip = \"10.96.0.10\"\nport = 80\n");
    let l = load(&d, &mut store);
    assert_eq!(l.files[1].state, FileState::RejectedKeepingLastGood);
    assert_eq!(l.config.services[1].vip.to_string(), "10.96.0.20");
}

#[test]
fn only_visible_toml_files_are_read_in_lexical_order() {
    let d = Dir::new();
    d.write("20-b.toml", "[[service]]\nname = \"b\"\nvip = \"10.0.0.2\"\nport = 1\n");
    d.write("10-a.toml", "[[service]]\nname = \"a\"\nvip = \"10.0.0.1\"\nport = 1\n");
    d.write(".10-a.toml.swp", "garbage");
    d.write("30-c.toml~", "garbage");
    d.write("README", "garbage");
    fs::create_dir(d.0.join("dir.toml")).unwrap();
    let l = load(&d, &mut ConfigStore::new());
    assert_eq!(service_names(&l), ["a", "b"]);
    assert_eq!(l.files.len(), 2);
}

#[test]
fn a_missing_dir_is_an_error() {
    let err = ConfigStore::new().load(&ConfigDirs::only("/nonexistent/hostmesh".into())).unwrap_err();
    assert!(err.to_string().starts_with("cannot read config dir /nonexistent/hostmesh: "), "{err}");
}

#[test]
fn shipped_examples_are_valid() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../etc");
    for dir in [root.clone(), root.join("examples")] {
        let l = check_dir(&ConfigDirs::only(dir.clone())).expect("readable");
        let bad: Vec<_> = l.rejected().flat_map(|f| f.errors.iter().map(|e| e.to_string())).collect();
        assert!(bad.is_empty(), "{}: {bad:?}", dir.display());
    }
}

#[test]
fn hostmesh_keys_are_validated_too() {
    assert_eq!(
        one_error("[daemon]\nmaglev_table_size = 1000\n"),
        "t.toml:2:21: [daemon]: maglev_table_size 1000 must be a prime number from 7 to 65521 (for example 251, 1021 or 4093)"
    );
    assert_eq!(
        one_error("[[service]]\nname = \"web\"\nvip = \"10.0.0.1\"\nport = 80\nmaglev_table_size = 65537\n"),
        "t.toml:5:21: service \"web\": maglev_table_size 65537 must be a prime number from 7 to 65521 (for example 251, 1021 or 4093)"
    );
    assert_eq!(
        one_error("[daemon]\nmesh_map_size = 1024\n"),
        "t.toml:2:17: [daemon]: mesh_map_size 1024 is out of range; use 4096 to 1048576"
    );
    assert_eq!(
        one_error("[daemon]\nconntrack_udp_timeout = \"0s\"\n"),
        "t.toml:2:25: [daemon]: conntrack_udp_timeout \"0s\" is out of range; use 1s to 49710d"
    );
    let d = parse_file(&Source::new(
        Path::new("t.toml"),
        "[daemon]\nmaglev_table_size = 251\nmesh_map_size = 4096\nconntrack_tcp_timeout = \"2h\"\n",
    ))
    .unwrap()
    .daemon
    .unwrap();
    assert_eq!((d.maglev_table_size, d.sizes.mesh, d.conntrack_tcp_timeout.as_secs()), (Some(251), 4096, 7200));
}

#[test]
fn the_packaged_example_is_valid_and_declares_nothing() {
    // Installing the package must change no traffic (etc/hostmesh.toml).
    let text = include_str!("../../../etc/hostmesh.toml");
    let f = parse_file(&Source::new(Path::new("hostmesh.toml"), text)).expect("the packaged example parses");
    assert!(f.daemon.is_none() && f.gateway.is_none());
    assert!(f.services.is_empty() && f.meshes.is_empty() && f.peers.is_empty() && f.members.is_empty());
    // Its commented sections (from the first "# [") are valid configuration
    // once uncommented.
    let uncommented: String = text
        .lines()
        .skip_while(|l| !l.starts_with("# ["))
        .filter_map(|l| l.strip_prefix("# "))
        .filter(|l| !l.starts_with("# "))
        .map(|l| format!("{l}\n"))
        .collect();
    let f = parse_file(&Source::new(Path::new("hostmesh.toml"), &uncommented))
        .unwrap_or_else(|e| panic!("the example, uncommented: {e:?}\n{uncommented}"));
    assert!(f.daemon.is_some() && f.gateway.is_some());
    assert_eq!((f.services.len(), f.meshes.len(), f.peers.len(), f.members.len()), (1, 1, 1, 1));
}

#[test]
fn every_unknown_key_of_a_file_is_reported() {
    let text = "[[service]]\nname = \"web\"\nvipp = \"10.96.0.10\"\nport = 80\nprotocl = \"tcp\"\n\n[daemon]\nresync = \"1s\"\n";
    let errs = parse_file(&Source::new(Path::new("t.toml"), text)).unwrap_err();
    let at: Vec<(usize, Option<&str>)> = errs.iter().map(|e| (e.line, e.key.as_deref())).collect();
    assert_eq!(at, [(3, Some("vipp")), (5, Some("protocl")), (8, Some("resync"))], "{errs:?}");
    assert!(errs.iter().all(|e| e.message.contains("unknown field")), "{errs:?}");
}

#[test]
fn only_files_whose_text_changed_are_parsed_again() {
    let dir = Dir::new();
    let mut store = ConfigStore::new();
    dir.write("a.toml", "[[service]]\nname = \"aaa\"\nvip = \"10.0.0.1\"\nport = 80\n");
    dir.write("b.toml", "[[service]]\nname = \"bbb\"\nvip = \"10.0.0.2\"\nport = 80\n");
    assert_eq!(load(&dir, &mut store).parsed_files, 2);
    assert_eq!(load(&dir, &mut store).parsed_files, 0, "nothing changed");
    // The same length, other text, written at once: parsed again.
    dir.write("b.toml", "[[service]]\nname = \"ccc\"\nvip = \"10.0.0.2\"\nport = 80\n");
    let l = load(&dir, &mut store);
    assert_eq!(l.parsed_files, 1);
    assert_eq!(service_names(&l), ["aaa", "ccc"]);
}

/// `n` services of one backend each, named `{prefix}-{i}`, VIPs from
/// 10.{base}.x.y.
fn services_text(prefix: &str, base: u8, n: usize) -> String {
    (0..n)
        .map(|i| {
            format!(
                "[[service]]\nname = \"{prefix}-{i}\"\nvip = \"10.{base}.{}.{}\"\nport = 80\nbackends = [\"192.168.{base}.{}:80\"]\n",
                i / 250,
                i % 250 + 1,
                i % 250 + 1
            )
        })
        .collect()
}

#[test]
fn every_size_key_sets_its_capacity_within_its_range() {
    for k in &SIZE_KEYS {
        let text = format!("[daemon]\n{} = {}\n", k.key, k.max);
        let d = parse_file(&Source::new(Path::new("t.toml"), &text)).unwrap().daemon.unwrap();
        assert_eq!(d.sizes.get(k.capacity), k.max, "{}", k.key);
        let mut want = MapSizes::default();
        want.set(k.capacity, k.max);
        assert_eq!(d.sizes, want, "{} sets only its own capacity", k.key);
        assert_eq!(
            one_error(&format!("[daemon]\n{} = {}\n", k.key, k.min - 1)),
            format!(
                "t.toml:2:{}: [daemon]: {} {} is out of range; use {} to {}",
                k.key.len() + 4,
                k.key,
                k.min - 1,
                k.min,
                k.max
            )
        );
    }
}

#[test]
fn a_file_past_the_configured_service_capacity_is_rejected_alone() {
    let d = Dir::new();
    d.write("00-daemon.toml", "[daemon]\nservice_map_size = 1024\n");
    d.write("a.toml", &services_text("a", 1, 1000));
    d.write("b.toml", &services_text("b", 2, 30));
    d.write("c.toml", &services_text("c", 3, 20));
    let l = load(&d, &mut ConfigStore::new());
    assert_eq!(l.config.services.len(), 1020, "a.toml and c.toml apply");
    assert_eq!(l.files[2].state, FileState::Rejected);
    assert_eq!(
        l.files[2].errors[0].to_string(),
        format!(
            "{}:2:8: this file's 30 services would make 1030 in all; the service map holds 1024 (raise [daemon] service_map_size)",
            d.0.join("b.toml").display()
        )
    );
    assert_eq!(l.files[3].state, FileState::Applied);
    // Raising the capacity takes the file in.
    d.write("00-daemon.toml", "[daemon]\nservice_map_size = 2048\n");
    let l = load(&d, &mut ConfigStore::new());
    assert_eq!(l.config.services.len(), 1050);
}

#[test]
fn the_capacity_of_a_daemon_section_in_a_later_file_applies_to_earlier_files() {
    let d = Dir::new();
    d.write("a.toml", &services_text("a", 1, 1000));
    d.write("b.toml", &services_text("b", 2, 100));
    d.write("z-daemon.toml", "[daemon]\nbackend_map_size = 1024\n");
    let l = load(&d, &mut ConfigStore::new());
    // a.toml's 250 backends and b.toml's 250 fit; the service map's
    // default holds both files.
    assert_eq!(l.config.services.len(), 1100);
    d.write("z-daemon.toml", "[daemon]\nservice_map_size = 1024\n");
    let l = load(&d, &mut ConfigStore::new());
    assert_eq!(l.config.services.len(), 1000);
    assert_eq!(l.files[1].state, FileState::Rejected);
    assert!(l.files[1].errors[0].to_string().contains("the service map holds 1024"), "{:?}", l.files[1].errors);
}

#[test]
fn a_load_after_file_events_reads_only_files_whose_stamp_changed() {
    let dir = Dir::new();
    let mut store = ConfigStore::new();
    dir.write("a.toml", "[[service]]\nname = \"aaa\"\nvip = \"10.0.0.1\"\nport = 80\n");
    dir.write("b.toml", "[[service]]\nname = \"bbb\"\nvip = \"10.0.0.2\"\nport = 80\n");
    store.load_changed(&ConfigDirs::only(dir.0.clone())).unwrap();
    assert_eq!(store.reads(), 2, "the first load reads every file");
    store.load_changed(&ConfigDirs::only(dir.0.clone())).unwrap();
    assert_eq!(store.reads(), 2, "nothing changed: nothing read");
    // Other text of the same length: its times changed, so it is read.
    dir.write("b.toml", "[[service]]\nname = \"ccc\"\nvip = \"10.0.0.2\"\nport = 80\n");
    let l = store.load_changed(&ConfigDirs::only(dir.0.clone())).unwrap();
    assert_eq!(store.reads(), 3);
    assert_eq!(service_names(&l), ["aaa", "ccc"]);
    // A permission change is seen too (its ctime moves): a file others may
    // write is rejected, though its text is the same.
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(dir.0.join("a.toml"), fs::Permissions::from_mode(0o666)).unwrap();
    let l = store.load_changed(&ConfigDirs::only(dir.0.clone())).unwrap();
    assert_eq!(l.files[0].state, FileState::RejectedKeepingLastGood);
    assert!(l.files[0].errors[0].message.contains("writable by group and others"), "{:?}", l.files[0]);
    // A full load reads every file again.
    store.load(&ConfigDirs::only(dir.0.clone())).unwrap();
    assert_eq!(store.reads(), 6);
}

#[test]
fn files_past_the_maglev_and_mesh_capacities_are_rejected_alone() {
    let d = Dir::new();
    // 251 slots: 4 chunks a table; 1,024 chunks hold 256 tables.
    d.write("00-daemon.toml", "[daemon]\nmaglev_map_size = 1024\nmaglev_table_size = 251\n");
    d.write("a.toml", &services_text("a", 1, 200));
    d.write("b.toml", &services_text("b", 2, 60));
    d.write("c.toml", &services_text("c", 3, 56));
    let l = load(&d, &mut ConfigStore::new());
    assert_eq!(l.config.services.len(), 256, "a.toml and c.toml fill the map exactly");
    assert_eq!(l.files[2].state, FileState::Rejected);
    assert_eq!(
        l.files[2].errors[0].message,
        "this file's Maglev tables would make 1040 chunks of 64 slots in all; the Maglev map holds 1024 \
         (raise [daemon] maglev_map_size, or use a smaller maglev_table_size)"
    );

    let meshes = |prefix: &str, base: u8, n: usize| -> String {
        (0..n)
            .map(|i| {
                format!(
                    "[[mesh]]\nname = \"{prefix}-{i}\"\nvip = \"10.{base}.{}.{}\"\nport = 80\nredirect_port = 15001\n",
                    i / 250,
                    i % 250 + 1
                )
            })
            .collect()
    };
    let d = Dir::new();
    d.write("00-daemon.toml", "[daemon]\nmesh_map_size = 4096\n");
    d.write("a.toml", &meshes("a", 1, 4000));
    d.write("b.toml", &meshes("b", 2, 100));
    let l = load(&d, &mut ConfigStore::new());
    assert_eq!(l.config.meshes.len(), 4000);
    assert_eq!(
        l.files[2].errors[0].message,
        "this file's 100 mesh entries would make 4100 in all; the mesh map holds 4096 (raise [daemon] mesh_map_size)"
    );
    d.write("00-daemon.toml", "[daemon]\nmesh_map_size = 8192\n");
    assert_eq!(load(&d, &mut ConfigStore::new()).config.meshes.len(), 4100);
}

#[test]
fn health_checks_of_every_kind_parse_with_their_defaults() {
    let text = r#"
[[service]]
name = "a"
vip = "10.0.0.1"
port = 80
backends = ["10.0.1.1:8080", { address = "10.0.1.2:8080", weight = 0 }]
health_check = { kind = "tcp" }

[[service]]
name = "b"
vip = "10.0.0.2"
port = 80
health_check = { kind = "http", path = "/healthz", expect = "200", host = "web.internal", interval = "200ms", rise = 1, fall = 2, port = 8081, source = "10.0.0.9", initial = "up" }

[[service]]
name = "c"
vip = "10.0.0.3"
port = 53
protocol = "udp"
health_check = { kind = "udp", send = 'ping\x00', expect = "pong" }

[[service]]
name = "d"
vip = "10.0.0.4"
port = 80
health_check = { kind = "exec", command = ["/usr/local/lib/check-web", "{address}", "{port}"] }
"#;
    let f = parse_file(&Source::new(Path::new("t.toml"), text)).expect("valid");
    let hc: Vec<&HealthCheck> = f.services.iter().map(|s| &**s.health_check.as_ref().unwrap()).collect();
    assert_eq!(f.services[0].backends[1].weight, 0, "weight 0 drains");
    assert_eq!(
        *hc[0],
        HealthCheck {
            kind: CheckKind::Tcp,
            interval: DEFAULT_CHECK_INTERVAL,
            timeout: DEFAULT_CHECK_TIMEOUT,
            rise: DEFAULT_RISE,
            fall: DEFAULT_FALL,
            port: None,
            source: None,
            initial: InitialState::Unknown,
        }
    );
    assert_eq!(
        hc[1].kind,
        CheckKind::Http { path: "/healthz".into(), expect: (200, 200), host: Some("web.internal".into()) }
    );
    assert_eq!(hc[1].timeout, std::time::Duration::from_millis(200), "the timeout is at most the interval");
    assert_eq!((hc[1].rise, hc[1].fall, hc[1].port), (1, 2, Some(8081)));
    assert_eq!(hc[1].source, Some("10.0.0.9".parse().unwrap()));
    assert_eq!(hc[1].initial, InitialState::Up);
    assert_eq!(hc[2].kind, CheckKind::Udp { send: b"ping\0".to_vec(), expect: b"pong".to_vec() });
    assert_eq!(
        hc[3].kind,
        CheckKind::Exec { command: vec!["/usr/local/lib/check-web".into(), "{address}".into(), "{port}".into()] }
    );
}

#[test]
fn affinity_is_client_ip_with_a_three_hour_default_or_none() {
    let svc = |extra: &str| format!("[[service]]\nname = \"web\"\nvip = \"10.0.0.1\"\nport = 80\n{extra}");
    let parse =
        |extra: &str| parse_file(&Source::new(Path::new("t.toml"), &svc(extra))).map(|f| f.services[0].affinity);
    assert_eq!(parse(""), Ok(None));
    assert_eq!(parse("affinity = \"none\"\n"), Ok(None));
    assert_eq!(parse("affinity = \"client-ip\"\n"), Ok(Some(std::time::Duration::from_secs(10_800))));
    assert_eq!(
        parse("affinity = \"client-ip\"\naffinity_timeout = \"10m\"\n"),
        Ok(Some(std::time::Duration::from_secs(600)))
    );
    assert_eq!(
        one_error(&svc("affinity_timeout = \"10m\"\n")),
        "t.toml:5:20: service \"web\": affinity_timeout needs affinity = \"client-ip\""
    );
    assert_eq!(
        one_error(&svc("affinity = \"cookie\"\n")),
        "t.toml:5:12: service \"web\": affinity \"cookie\" is not one of \"none\" or \"client-ip\""
    );
    assert_eq!(
        one_error(&svc("affinity = \"client-ip\"\naffinity_timeout = \"2d\"\n")),
        "t.toml:6:20: service \"web\": affinity_timeout \"2d\" is out of range; use 1s to 24h"
    );
}

#[test]
fn drain_timeout_is_for_tcp_services() {
    let svc = |extra: &str| format!("[[service]]\nname = \"web\"\nvip = \"10.0.0.1\"\nport = 80\n{extra}");
    let f = parse_file(&Source::new(Path::new("t.toml"), &svc("drain_timeout = \"30s\"\n"))).unwrap();
    assert_eq!(f.services[0].drain_timeout, Some(std::time::Duration::from_secs(30)));
    assert_eq!(
        one_error(&svc("protocol = \"udp\"\ndrain_timeout = \"30s\"\n")),
        "t.toml:6:17: service \"web\": drain_timeout is for TCP services; UDP flows leave a backend at once"
    );
    assert_eq!(
        one_error(&svc("drain_timeout = \"0s\"\n")),
        "t.toml:5:17: service \"web\": drain_timeout \"0s\" is out of range; use 1s to 24h"
    );
}

#[test]
fn metrics_listen_is_on_loopback_by_default_and_takes_an_address_or_off() {
    let daemon = |text: &str| parse_file(&Source::new(Path::new("t.toml"), text)).expect("valid").daemon.unwrap();
    let d = daemon("[daemon]\n");
    assert_eq!(d.metrics_listen, Some("127.0.0.1:9853".parse().unwrap()));
    assert_eq!(d.metrics_backend_limit, 1000);
    assert_eq!(daemon("[daemon]\nmetrics_listen = \"off\"\n").metrics_listen, None);
    let d = daemon("[daemon]\nmetrics_listen = \"[::1]:9900\"\nmetrics_backend_limit = 0\n");
    assert_eq!(d.metrics_listen, Some("[::1]:9900".parse().unwrap()));
    assert_eq!(d.metrics_backend_limit, 0);
    assert_eq!(
        one_error("[daemon]\nmetrics_listen = \"localhost\"\n"),
        "t.toml:2:18: [daemon]: metrics_listen \"localhost\" is not \"off\" or an address with a port (\"127.0.0.1:9853\", \"[::1]:9853\")"
    );
    assert!(one_error("[daemon]\nmetrics_listen = \"127.0.0.1:0\"\n").contains("with a port"));
    assert!(one_error("[daemon]\nmetrics_backend_limit = -1\n").contains("use 0 to 1000000"));
}

#[test]
fn a_node_port_is_one_services_per_protocol_and_family_and_inside_the_range() {
    let d = Dir::new();
    let svc = |name: &str, vip: &str, proto: &str, port: u16| {
        format!(
            "[[service]]\nname = \"{name}\"\nvip = \"{vip}\"\nport = 80\nprotocol = \"{proto}\"\nnode_port = {port}\n"
        )
    };
    d.write("a.toml", &svc("web", "10.96.0.10", "tcp", 30080));
    d.write("b.toml", &svc("other", "10.96.0.11", "tcp", 30080));
    d.write("c.toml", &svc("dns", "10.96.0.10", "udp", 30080));
    d.write("d.toml", &svc("web6", "fd00:96::10", "tcp", 30080));
    d.write("e.toml", &svc("low", "10.96.0.12", "tcp", 8080));
    let l = load(&d, &mut ConfigStore::new());
    assert_eq!(service_names(&l), ["web", "dns", "web6"], "UDP and IPv6 may share the number");
    assert!(
        l.files[1].errors[0].to_string().ends_with(
            "service \"other\": node_port 30080/tcp (IPv4) is already used by service \"web\" at a.toml:2:8"
        ),
        "{}",
        l.files[1].errors[0]
    );
    assert!(
        l.files[4].errors[0].to_string().ends_with("node_port 8080 is outside [daemon] node_port_range 30000-32767"),
        "{}",
        l.files[4].errors[0]
    );
}

#[test]
fn the_port_ranges_the_policies_and_the_service_health_endpoint_are_checked() {
    let e = one_error("[daemon]\nnode_port_range = \"30000-32767\"\nsnat_port_range = \"32000-33000\"\n");
    assert!(e.contains("snat_port_range 32000-33000 overlaps node_port_range 30000-32767"), "{e}");
    let e = one_error("[daemon]\nsnat_port_range = \"9-1\"\n");
    assert!(e.contains("snat_port_range \"9-1\" is not a range of ports FIRST-LAST"), "{e}");
    let listen =
        |text: &str| parse_file(&Source::new(Path::new("t.toml"), text)).unwrap().daemon.unwrap().service_health_listen;
    assert_eq!(listen("[daemon]\nservice_health_listen = \"0.0.0.0:10256\"\n"), Some("0.0.0.0:10256".parse().unwrap()));
    assert_eq!(listen("[daemon]\nservice_health_listen = \"off\"\n"), None);
    assert_eq!(listen("[daemon]\nresync_interval = \"30s\"\n"), None, "off by default");
    let e = one_error("[daemon]\nservice_health_listen = \"10256\"\n");
    assert!(e.contains("service_health_listen \"10256\" is not \"off\" or an address with a port"), "{e}");
    let e = one_error("[daemon]\nservice_health_listen = \"0.0.0.0:9853\"\n");
    assert!(e.contains("service_health_listen 0.0.0.0:9853 takes the metrics endpoint's port"), "{e}");
    let svc = "[[service]]\nname = \"web\"\nvip = \"10.96.0.10\"\nport = 80\n";
    let policy = |text: &str| parse_file(&Source::new(Path::new("t.toml"), text)).unwrap().services[0].external_policy;
    assert_eq!(policy(&format!("{svc}external = true\nexternal_policy = \"local\"\n")), ExternalPolicy::Local);
    assert_eq!(policy(&format!("{svc}node_port = 30080\n")), ExternalPolicy::Snat, "the default");
    let e = one_error(&format!("{svc}external = true\nexternal_policy = \"cluster\"\n"));
    assert!(e.contains("external_policy \"cluster\" is not one of \"snat\" or \"local\""), "{e}");
    let e = one_error(&format!("{svc}external_policy = \"snat\"\n"));
    assert!(e.contains("external_policy applies to clients on other machines"), "{e}");
    assert!(errors(&format!("{svc}node_port = 30080\nexternal = true\nexternal_policy = \"snat\"\n")).is_empty());
}

#[test]
fn a_service_holds_its_backends_in_a_list_of_their_size() {
    // A list grown by pushes holds four for one: 11 MB at 100,000 services.
    for n in [1usize, 2, 3, 5] {
        let backends: Vec<String> = (0..n).map(|i| format!("\"10.1.0.{}:80\"", i + 1)).collect();
        let text = format!(
            "[[service]]\nname = \"web\"\nvip = \"10.0.0.1\"\nport = 80\nbackends = [{}]\n",
            backends.join(", ")
        );
        let config = crate::config::from_text(&text);
        let b = &config.services[0].backends;
        assert_eq!((b.len(), b.capacity()), (n, n));
    }
}

#[test]
fn backends_other_files_have_count_once_against_the_backend_map() {
    // n services, each with its own backend 192.168.<net>.<i>:<port>.
    let text = |name: &str, vip_net: u8, nets: &[u8], port: u16| -> String {
        nets.iter()
            .flat_map(|&net| (1..=250u16).map(move |i| (net, i)))
            .enumerate()
            .map(|(n, (net, i))| {
                format!(
                    "[[service]]\nname = \"{name}-{n}\"\nvip = \"10.{vip_net}.{}.{}\"\nport = 80\nbackends = [\"192.168.{net}.{i}:{port}\"]\n",
                    n / 250,
                    n % 250 + 1
                )
            })
            .collect()
    };
    let d = Dir::new();
    d.write("00-daemon.toml", "[daemon]\nbackend_map_size = 1024\n");
    // 1,000 backends; then a small file of 250 of them and a big one of
    // the same 1,000: each counted from the smaller side, none new.
    d.write("10-a.toml", &text("a", 1, &[1, 2, 3, 4], 80));
    d.write("20-b.toml", &text("b", 2, &[2], 80));
    let l = load(&d, &mut ConfigStore::new());
    assert_eq!(l.config.services.len(), 1250);
    d.write("05-small.toml", &text("c", 3, &[4], 80));
    let l = load(&d, &mut ConfigStore::new());
    assert_eq!(l.config.services.len(), 1500, "{:?}", l.files.iter().map(|f| &f.errors).collect::<Vec<_>>());
    // 250 on another port are new: 1,250 distinct in all.
    d.write("30-new.toml", &text("n", 4, &[1], 81));
    let l = load(&d, &mut ConfigStore::new());
    assert_eq!(l.files[4].state, FileState::Rejected);
    assert!(
        l.files[4].errors[0]
            .to_string()
            .contains("this file's backends would make 1250 distinct backend addresses in all"),
        "{:?}",
        l.files[4].errors
    );
}

#[test]
fn a_text_s_hash_is_the_same_however_it_is_cut_and_a_reload_reads_an_unchanged_file_in_pieces() {
    use super::read::{hash_drop_in, TextHash};
    let text: Vec<u8> = (0..200_000u32).map(|i| b"abcdefghij\n"[(i % 11) as usize]).collect();
    let whole = TextHash::of(&text);
    assert_eq!(whole.0, text.len());
    for cut in [1, 7, 4096, 65_536, 199_999] {
        let mut h = TextHash::default();
        text.chunks(cut).for_each(|c| h.add(c));
        assert_eq!(h.finish(), whole, "cut every {cut}");
    }
    assert_ne!(TextHash::of(&text[1..]), whole);
    let d = Dir::new();
    d.write("a.toml", std::str::from_utf8(&text).unwrap());
    assert_eq!(hash_drop_in(&d.0.join("a.toml")).unwrap(), whole);
    // A full load of an unchanged file keeps its parse; a changed one is
    // parsed again.
    let mut store = ConfigStore::new();
    d.write("b.toml", "[[service]]\nname = \"aaa\"\nvip = \"10.0.0.1\"\nport = 80\n");
    store.load(&ConfigDirs::only(d.0.clone())).unwrap();
    let parses = store.parses();
    store.load(&ConfigDirs::only(d.0.clone())).unwrap();
    assert_eq!(store.parses(), parses);
    d.write("b.toml", "[[service]]\nname = \"bbb\"\nvip = \"10.0.0.1\"\nport = 80\n");
    let l = store.load(&ConfigDirs::only(d.0.clone())).unwrap();
    assert_eq!((store.parses(), service_names(&l)), (parses + 1, vec!["bbb"]));
}
