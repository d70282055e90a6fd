//! Two sites joined by their gateways, for the gateway-peer tests:
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
//! IPv6 workloads cross the same IPv4 underlay.
//!
//! A's gateway is known to its peer by a secondary address, so the tunnel
//! and the probes must leave from `local_ip`, not the kernel's choice.
//!
//! Workload addresses live on the members' loopback; nothing in the
//! underlay routes them. Every host runs its own hostmesh.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::os::fd::OwnedFd;
use std::time::Duration;

use hm_testkit::{Daemon, Netns, Servers};
use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, SockaddrStorage};

use crate::fixtures::*;

pub const VNI: u32 = 7001;
/// Not the IANA default, to show the configured port is the one used.
pub const VXLAN_PORT: u16 = 8472;
pub const PROBE_INTERVAL_MS: u64 = 200;
pub const PROBE_LOSS: u32 = 5;

pub const MA_WORKLOAD: &str = "10.10.1.1";
/// On A's member, but outside every `[[member]]` CIDR on A's gateway:
/// replies to it find their way back only through the learned path.
pub const MA_UNLISTED: &str = "10.10.9.1";
pub const MB_WORKLOAD: &str = "10.20.1.1";
pub const MA_WORKLOAD6: &str = "fd10:1::1";
pub const MB_WORKLOAD6: &str = "fd20:1::1";
pub const ECHO_PORT: u16 = 8080;

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

/// A site's addresses, and the member host it has.
struct Site {
    name: &'static str,
    cidrs: &'static str,
    member: &'static str,
    member_cidrs: &'static str,
}

const SITE_A: Site = Site {
    name: "site-a",
    cidrs: r#""10.10.0.0/16", "fd10::/16""#,
    member: "ma",
    member_cidrs: r#""10.10.1.0/24", "fd10:1::/64""#,
};

const SITE_B: Site = Site {
    name: "site-b",
    cidrs: r#""10.20.0.0/16", "fd20::/16""#,
    member: "mb",
    member_cidrs: r#""10.20.1.0/24", "fd20:1::/64""#,
};

/// A gateway at `local` of site `own` (its member at `member_ip`), peered
/// with the gateway of site `remote` at `remote_ip`.
fn gateway(local: &str, own: &Site, member_ip: &str, remote: &Site, remote_ip: &str) -> String {
    format!(
        "[gateway]\nrole = \"gateway\"\nlocal_ip = \"{local}\"\nvni = {VNI}\nudp_port = {VXLAN_PORT}\n\
         probe_interval = \"{PROBE_INTERVAL_MS}ms\"\nprobe_loss = {PROBE_LOSS}\n\
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

/// Field order is drop order: echo servers and daemons first, then hosts.
pub struct Sites {
    _echo: Servers,
    pub daemons: Vec<Daemon>,
    pub ma: Host,
    pub ga: Host,
    pub gb: Host,
    pub mb: Host,
}

impl Sites {
    /// Builds both sites over the IPv4 underlay, writes every host's config
    /// (`extra_ma` is added to A's member) and starts the four daemons.
    pub fn start(extra_ma: &str) -> Sites {
        Self::start_with(&UNDERLAY_V4, extra_ma, "")
    }

    /// As `start`, over `u`, with `[daemon]` lines for A's gateway.
    pub fn start_with(u: &Underlay, extra_ma: &str, ga_daemon: &str) -> Sites {
        let (ma, ga, gb, mb) = (Host::new(), Host::with_daemon_config(ga_daemon), Host::new(), Host::new());
        if u.wan_local.contains(':') {
            // No duplicate address detection: an address is usable at once;
            // and a link that goes down keeps its addresses (as IPv4 does),
            // so the tests can cut the WAN and restore it.
            for host in [&ma, &ga, &gb, &mb] {
                host.ns.set_sysctl("net/ipv6/conf/default/accept_dad", "0");
                host.ns.set_sysctl("net/ipv6/conf/default/keep_addr_on_down", "1");
            }
        }
        let lan = |ip: &str| format!("{ip}/{}", u.prefix);
        ma.ns.veth_to(&ga.ns, ("eth0", &lan(u.ma)), ("a0", &lan(u.ga_lan)));
        ga.ns.veth_to(&gb.ns, ("wan", &lan(u.ga_wan)), ("wan", &lan(u.gb_wan)));
        gb.ns.veth_to(&mb.ns, ("b0", &lan(u.gb_lan)), ("eth0", &lan(u.mb)));
        for host in [&ma, &ga, &gb, &mb] {
            host.ns.ip(&["link", "set", "lo", "up"]);
        }
        let host_prefix = if u.wan_local.contains(':') { 128 } else { 32 };
        ga.ns.ip(&["addr", "add", &format!("{}/{host_prefix}", u.wan_local), "dev", "wan"]);
        for addr in [MA_WORKLOAD, MA_UNLISTED] {
            ma.ns.ip(&["addr", "add", &format!("{addr}/32"), "dev", "lo"]);
        }
        mb.ns.ip(&["addr", "add", &format!("{MB_WORKLOAD}/32"), "dev", "lo"]);
        ma.ns.ip(&["addr", "add", &format!("{MA_WORKLOAD6}/128"), "dev", "lo", "nodad"]);
        mb.ns.ip(&["addr", "add", &format!("{MB_WORKLOAD6}/128"), "dev", "lo", "nodad"]);

        ma.write("gateway.toml", &format!("{}{extra_ma}", member(u.ma, u.ga_lan, &SITE_B)));
        mb.write("gateway.toml", &member(u.mb, u.gb_lan, &SITE_A));
        ga.write("gateway.toml", &gateway(u.wan_local, &SITE_A, u.ma, &SITE_B, u.gb_wan));
        gb.write("gateway.toml", &gateway(u.gb_wan, &SITE_B, u.mb, &SITE_A, u.wan_local));
        let at = |ip: &str| SocketAddr::new(ip.parse().expect("workload address"), ECHO_PORT);
        let echo = Servers::echo(&mb.ns, &[at(MB_WORKLOAD), at(MB_WORKLOAD6)])
            .join(Servers::echo(&ma.ns, &[at(MA_WORKLOAD), at(MA_WORKLOAD6)]));
        let daemons = [&ma, &ga, &gb, &mb].iter().map(|h| h.start_ready()).collect();
        Sites { _echo: echo, daemons, ma, ga, gb, mb }
    }

    /// A's gateway's learned return paths: (reply 5-tuple, member).
    pub fn learned_paths(&self) -> Vec<(hostmesh::abi::CtKey, hostmesh::abi::GwCtValue)> {
        use hostmesh::abi::{CtKey, GwCtValue, Pod};
        use hostmesh::backends::bpf::sys;
        use std::os::fd::AsFd;
        let fd = sys::obj_get(&self.ga.opts.bpffs.join("maps/HM_GW_CT")).expect("pinned HM_GW_CT");
        sys::map_dump(fd.as_fd(), std::mem::size_of::<CtKey>(), std::mem::size_of::<GwCtValue>())
            .expect("dump HM_GW_CT")
            .into_iter()
            .map(|(k, v)| (CtKey::from_bytes(&k).expect("key"), GwCtValue::from_bytes(&v).expect("value")))
            .collect()
    }

    pub fn logs(&self) -> String {
        let names = ["ma", "ga", "gb", "mb"];
        self.daemons.iter().zip(names).map(|(d, n)| format!("--- {n}\n{}", d.log_text())).collect()
    }
}

/// A socket of `kind` bound to `src` (port 0), created in `ns`.
fn bound(ns: &Netns, kind: SockType, src: SocketAddr) -> std::io::Result<OwnedFd> {
    ns.run(move || {
        let family = if src.is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 };
        let fd = socket::socket(family, kind, SockFlag::SOCK_CLOEXEC, None)?;
        socket::bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrStorage::from(src))?;
        Ok(fd)
    })
}

/// What one TCP exchange with the echo server saw.
#[derive(Debug)]
pub struct TcpExchange {
    /// The client address as the server saw it.
    pub seen_as: String,
    /// Bytes echoed back intact.
    pub echoed: usize,
    /// TCP_MAXSEG of the client's connection.
    pub mss: usize,
}

/// From `src` in `ns`, connects to `dst`, reads the greeting and sends
/// `writes` writes of `size` bytes, checking they come back intact.
pub fn tcp_exchange(ns: &Netns, src: &str, dst: &str, writes: usize, size: usize) -> std::io::Result<TcpExchange> {
    let fd = bound(ns, SockType::Stream, SocketAddr::new(src.parse().expect("source"), 0))?;
    let dst: SocketAddr = dst.parse().expect("destination");
    let timeout = hm_testkit::scaled(Duration::from_secs(2));
    let stream = TcpStream::from(fd);
    stream.set_write_timeout(Some(timeout))?;
    // A blocking connect(2) honours SO_SNDTIMEO.
    socket::connect(std::os::fd::AsRawFd::as_raw_fd(&stream), &SockaddrStorage::from(dst))?;
    stream.set_read_timeout(Some(timeout))?;
    let mss = socket::getsockopt(&stream, socket::sockopt::TcpMaxSeg)? as usize;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut seen_as = String::new();
    reader.read_line(&mut seen_as)?;
    let mut writer = stream;
    let mut echoed = 0;
    for i in 0..writes {
        let chunk: Vec<u8> = (0..size).map(|j| ((i * 7 + j) % 251) as u8).collect();
        writer.write_all(&chunk)?;
        let mut back = vec![0u8; size];
        reader.read_exact(&mut back)?;
        if back != chunk {
            return Err(std::io::Error::other(format!("write {i}: echo differs")));
        }
        echoed += size;
    }
    let seen_as = seen_as.split_whitespace().next().unwrap_or_default().to_string();
    Ok(TcpExchange { seen_as, echoed, mss })
}

/// From `src` in `ns`, one UDP datagram to `dst`; returns the answer (the
/// client address as the server saw it).
pub fn udp_exchange(ns: &Netns, src: &str, dst: &str) -> std::io::Result<String> {
    let fd = bound(ns, SockType::Datagram, SocketAddr::new(src.parse().expect("source"), 0))?;
    let sock = UdpSocket::from(fd);
    sock.set_read_timeout(Some(hm_testkit::scaled(Duration::from_secs(2))))?;
    // Connected and with IP_RECVERR, so an ICMP error (host unreachable
    // included, which UDP otherwise ignores) is the error of recv.
    if sock.local_addr()?.is_ipv4() {
        socket::setsockopt(&sock, socket::sockopt::Ipv4RecvErr, &true)?;
    }
    sock.connect(dst)?;
    sock.send(b"hello\n")?;
    let mut buf = [0u8; 128];
    let (n, _) = sock.recv_from(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).trim().to_string())
}
