//! Two sites joined by their gateways, for the gateway-peer tests: the
//! topology is the test kit's (`hm_testkit::sites`, drawn there); here
//! each host gets a hostmesh of its own, echo servers on the workloads,
//! and the helpers the tests exchange traffic with.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::os::fd::OwnedFd;
use std::time::Duration;

use hm_testkit::{Daemon, Netns, Servers};
use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, SockaddrStorage};

use crate::fixtures::*;

pub use hm_testkit::sites::{
    Underlay, MA_UNLISTED, MA_WORKLOAD, MA_WORKLOAD6, MB_WORKLOAD, MB_WORKLOAD6, UNDERLAY_V4, UNDERLAY_V6, VNI,
    VXLAN_PORT,
};

pub const PROBE_INTERVAL_MS: u64 = 200;
pub const PROBE_LOSS: u32 = 5;
pub const ECHO_PORT: u16 = 8080;

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
        Self::start_edited(u, ga_daemon, |name, _, text| if name == "ma" { format!("{text}{extra_ma}") } else { text })
    }

    /// As `start_with`, each host's config as `edit` makes it of the
    /// test kit's (`edit(NAME, HOST, TEXT)`, NAME one of ma, ga, gb, mb;
    /// run with every host made, before any daemon starts).
    pub fn start_edited(u: &Underlay, ga_daemon: &str, edit: impl Fn(&str, &Host, String) -> String) -> Sites {
        let (ma, ga, gb, mb) = (Host::new(), Host::with_daemon_config(ga_daemon), Host::new(), Host::new());
        hm_testkit::sites::wire(u, [&ma.ns, &ga.ns, &gb.ns, &mb.ns]);
        let probes = format!("probe_interval = \"{PROBE_INTERVAL_MS}ms\"\nprobe_loss = {PROBE_LOSS}");
        let [c_ma, c_ga, c_gb, c_mb] = hm_testkit::sites::configs(u, &probes);
        ma.write("gateway.toml", &edit("ma", &ma, c_ma));
        ga.write("gateway.toml", &edit("ga", &ga, c_ga));
        gb.write("gateway.toml", &edit("gb", &gb, c_gb));
        mb.write("gateway.toml", &edit("mb", &mb, c_mb));
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
        let fd = sys::obj_get(&self.ga.opts.bpffs.join("maps").join(hostmesh::abi::HmMap::GwCt.name()))
            .expect("pinned HM_GW_CT");
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
pub fn bound_in(ns: &Netns, kind: SockType, src: SocketAddr) -> std::io::Result<OwnedFd> {
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
    let stream = connect_from(ns, src, dst, hm_testkit::scaled(Duration::from_secs(2)))?;
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

/// A TCP connection from `src` in `ns` to `dst`, connecting within
/// `timeout` and reading with it.
pub fn connect_from(ns: &Netns, src: &str, dst: &str, timeout: Duration) -> std::io::Result<TcpStream> {
    let fd = bound_in(ns, SockType::Stream, SocketAddr::new(src.parse().expect("source"), 0))?;
    let dst: SocketAddr = dst.parse().expect("destination");
    let stream = TcpStream::from(fd);
    stream.set_write_timeout(Some(timeout))?;
    // A blocking connect(2) honours SO_SNDTIMEO.
    socket::connect(std::os::fd::AsRawFd::as_raw_fd(&stream), &SockaddrStorage::from(dst))?;
    stream.set_read_timeout(Some(timeout))?;
    Ok(stream)
}

/// From `src` in `ns`, one UDP datagram to `dst`; returns the answer (the
/// client address as the server saw it).
pub fn udp_exchange(ns: &Netns, src: &str, dst: &str) -> std::io::Result<String> {
    let fd = bound_in(ns, SockType::Datagram, SocketAddr::new(src.parse().expect("source"), 0))?;
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
