//! Two sites joined by their gateways: the one description of the
//! topology the gateway tests (tests/integration/sites.rs) and the
//! gateway benchmark (bench/gateway/topology.rs) both build.
//!
//! ```text
//!  site A                                             site B
//!  member "ma"              gateway "ga"   WAN   gateway "gb"              member "mb"
//!  eth0 192.0.2.20/24 --- a0 192.0.2.1   wan ---- wan   b0 203.0.113.1 --- eth0 203.0.113.20/24
//!  lo 10.10.1.1/32                198.51.100.1/24  198.51.100.2/24       lo 10.20.1.1/32
//!  lo 10.10.9.1/32 (in no [[member]] CIDR)   198.51.100.11/32 (A's local_ip)
//!  lo fd10:1::1/128                                                      lo fd20:1::1/128
//! ```
//!
//! Site A is 10.10.0.0/16 and fd10::/16, site B 10.20.0.0/16 and fd20::/16:
//! IPv6 workloads cross the same IPv4 underlay. A's gateway is known to its
//! peer by a secondary address, so the tunnel and the probes must leave
//! from `local_ip`, not the kernel's choice. Workload addresses live on the
//! members' loopback; nothing in the underlay routes them.

use crate::Netns;

pub const VNI: u32 = 7001;
/// Not the IANA default, to show the configured port is the one used.
pub const VXLAN_PORT: u16 = 8472;

pub const MA_WORKLOAD: &str = "10.10.1.1";
/// On A's member, but outside every `[[member]]` CIDR on A's gateway:
/// replies to it find their way back only through the learned path.
pub const MA_UNLISTED: &str = "10.10.9.1";
pub const MB_WORKLOAD: &str = "10.20.1.1";
pub const MA_WORKLOAD6: &str = "fd10:1::1";
pub const MB_WORKLOAD6: &str = "fd20:1::1";

/// The underlay addresses of the four hosts (one prefix length for all
/// three links); `wan_local` is an extra address on A's gateway's WAN
/// link, its `local_ip`.
pub struct Underlay {
    pub ma: &'static str,
    pub ga_lan: &'static str,
    pub ga_wan: &'static str,
    pub wan_local: &'static str,
    pub gb_wan: &'static str,
    pub gb_lan: &'static str,
    pub mb: &'static str,
    pub prefix: u8,
}

pub const UNDERLAY_V4: Underlay = Underlay {
    ma: "192.0.2.20",
    ga_lan: "192.0.2.1",
    ga_wan: "198.51.100.1",
    wan_local: "198.51.100.11",
    gb_wan: "198.51.100.2",
    gb_lan: "203.0.113.1",
    mb: "203.0.113.20",
    prefix: 24,
};

pub const UNDERLAY_V6: Underlay = Underlay {
    ma: "2001:db8:a::20",
    ga_lan: "2001:db8:a::1",
    ga_wan: "2001:db8:f::1",
    wan_local: "2001:db8:f::11",
    gb_wan: "2001:db8:f::2",
    gb_lan: "2001:db8:b::1",
    mb: "2001:db8:b::20",
    prefix: 64,
};

impl Underlay {
    fn is_v6(&self) -> bool {
        self.wan_local.contains(':')
    }
}

/// A site's addresses, and the member host it has.
pub struct Site {
    pub name: &'static str,
    pub cidrs: &'static str,
    pub member: &'static str,
    pub member_cidrs: &'static str,
}

pub const SITE_A: Site = Site {
    name: "site-a",
    cidrs: r#""10.10.0.0/16", "fd10::/16""#,
    member: "ma",
    member_cidrs: r#""10.10.1.0/24", "fd10:1::/64""#,
};

pub const SITE_B: Site = Site {
    name: "site-b",
    cidrs: r#""10.20.0.0/16", "fd20::/16""#,
    member: "mb",
    member_cidrs: r#""10.20.1.0/24", "fd20:1::/64""#,
};

/// Wires the four hosts (`[ma, ga, gb, mb]`) over `u`: the three links, A's
/// gateway's `local_ip`, the workload addresses, loopbacks up.
pub fn wire(u: &Underlay, [ma, ga, gb, mb]: [&Netns; 4]) {
    if u.is_v6() {
        // No duplicate address detection: an address is usable at once;
        // and a link that goes down keeps its addresses (as IPv4 does), so
        // tests can cut the WAN and restore it.
        for ns in [ma, ga, gb, mb] {
            ns.set_sysctl("net/ipv6/conf/default/accept_dad", "0");
            ns.set_sysctl("net/ipv6/conf/default/keep_addr_on_down", "1");
        }
    }
    let lan = |ip: &str| format!("{ip}/{}", u.prefix);
    ma.veth_to(ga, ("eth0", &lan(u.ma)), ("a0", &lan(u.ga_lan)));
    ga.veth_to(gb, ("wan", &lan(u.ga_wan)), ("wan", &lan(u.gb_wan)));
    gb.veth_to(mb, ("b0", &lan(u.gb_lan)), ("eth0", &lan(u.mb)));
    // (Netns::new set every loopback up.)
    let host_prefix = if u.is_v6() { 128 } else { 32 };
    ga.ip(&["addr", "add", &format!("{}/{host_prefix}", u.wan_local), "dev", "wan"]);
    let (w, u1, w6) = (format!("{MA_WORKLOAD}/32"), format!("{MA_UNLISTED}/32"), format!("{MA_WORKLOAD6}/128"));
    ma.ip_batch(&[
        &["addr", "add", &w, "dev", "lo"],
        &["addr", "add", &u1, "dev", "lo"],
        &["addr", "add", &w6, "dev", "lo", "nodad"],
    ]);
    let (w, w6) = (format!("{MB_WORKLOAD}/32"), format!("{MB_WORKLOAD6}/128"));
    mb.ip_batch(&[&["addr", "add", &w, "dev", "lo"], &["addr", "add", &w6, "dev", "lo", "nodad"]]);
}

/// The gateway config of every host, `[ma, ga, gb, mb]`; `probes` is added
/// to both gateways' `[gateway]` (e.g. `probe_interval = "200ms"`).
pub fn configs(u: &Underlay, probes: &str) -> [String; 4] {
    [
        member(u.ma, u.ga_lan, &SITE_B),
        gateway(u.wan_local, &SITE_A, u.ma, &SITE_B, u.gb_wan, probes),
        gateway(u.gb_wan, &SITE_B, u.mb, &SITE_A, u.wan_local, probes),
        member(u.mb, u.gb_lan, &SITE_A),
    ]
}

/// A gateway at `local` of site `own` (its member at `member_ip`), peered
/// with the gateway of site `remote` at `remote_ip`.
fn gateway(local: &str, own: &Site, member_ip: &str, remote: &Site, remote_ip: &str, probes: &str) -> String {
    format!(
        "[gateway]\nrole = \"gateway\"\nlocal_ip = \"{local}\"\nvni = {VNI}\nudp_port = {VXLAN_PORT}\n{probes}\n\
         [[peer]]\nname = \"{}\"\nendpoint = \"{remote_ip}\"\ncidrs = [{}]\n\
         [[member]]\nname = \"{}\"\nendpoint = \"{member_ip}\"\ncidrs = [{}]\n",
        remote.name, remote.cidrs, own.member, own.member_cidrs
    )
}

/// A member at `local` behind the gateway at `gateway_ip`, reaching `remote`.
fn member(local: &str, gateway_ip: &str, remote: &Site) -> String {
    format!(
        "[gateway]\nrole = \"member\"\nlocal_ip = \"{local}\"\ngateway_ip = \"{gateway_ip}\"\nvni = {VNI}\n\
         udp_port = {VXLAN_PORT}\n[[peer]]\nname = \"{}\"\ncidrs = [{}]\n",
        remote.name, remote.cidrs
    )
}

/// A gateway's config (from [`configs`]) made encrypted: its private key
/// file, and its peer's WireGuard public key (README.md, "Encrypted
/// peers"); WireGuard's port is the default, 51820.
pub fn encrypt(gateway: &str, key_file: &str, peer_public: &str) -> String {
    gateway.replacen("[gateway]\n", &format!("[gateway]\nprivate_key_file = \"{key_file}\"\n"), 1).replacen(
        "[[peer]]\n",
        &format!("[[peer]]\nencryption = \"wireguard\"\npublic_key = \"{peer_public}\"\n"),
        1,
    )
}

/// Writes a WireGuard private key (base64, as `wg genkey` prints it) as
/// `DIR/keys/NAME` the way hostmesh trusts a key and an operator installs
/// one: written aside, 0600, renamed into place, in a 0700 dir. Its path.
pub fn install_private_key(dir: &std::path::Path, name: &str, private: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let keys = dir.join("keys");
    std::fs::create_dir_all(&keys).expect("key dir");
    std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o700)).expect("chmod key dir");
    let path = keys.join(name);
    let aside = keys.join(format!("{name}.new"));
    std::fs::write(&aside, format!("{private}\n")).expect("write key");
    std::fs::set_permissions(&aside, std::fs::Permissions::from_mode(0o600)).expect("chmod key");
    std::fs::rename(&aside, &path).expect("rename key into place");
    path.display().to_string()
}
