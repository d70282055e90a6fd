//! How hostmesh handles one address, from what the kernel holds (the
//! pinned maps, read through `KernelView`), named with the configuration
//! and the last status file. The order is the kernel's: a mesh entry wins
//! over a service (connect-time LB leaves mesh VIPs alone), a service over
//! a gateway peer's CIDR.

use crate::abi::HmMap;
use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::target::Target;
use super::view::*;
use crate::abi::{BackendStats, GwConfig, HmConfig, SvcKey, CFG_CTLB_TCP, CFG_CTLB_UDP, ROLE_MEMBER, SVC_F_LOCAL};
use crate::backends::bpf::attached::AttachedProgram;
use crate::backends::bpf::inspect::ServiceEntry;
use crate::backends::netlink::RouteTo;
use crate::config::{Config, GatewayRole, Protocol};
use crate::model::flow_hash::flow_hash;
use crate::state::{ObjectKind, ObjectState, Status};

/// The kernel lookups explain needs (`backends::bpf::inspect::Inspector`).
pub(crate) trait KernelView {
    fn config(&self) -> io::Result<Option<HmConfig>>;
    fn service(&self, key: SvcKey) -> io::Result<Option<ServiceEntry>>;
    fn affinity(&self, client: IpAddr, svc_id: u32) -> io::Result<Option<(SocketAddr, u64)>>;
    /// Whether node ports answer on `ip` (an address of a host interface).
    fn host_address(&self, ip: IpAddr) -> io::Result<bool>;
    fn mesh(&self, vip: IpAddr, port: u16, proto: u8) -> io::Result<Option<(u16, u16)>>;
    fn peer(&self, addr: IpAddr) -> io::Result<Option<(IpAddr, bool)>>;
    /// HM_GW_CONFIG[0]: on a member, the gateway of its site in use.
    fn gateway_config(&self) -> io::Result<Option<GwConfig>>;
    fn counters(&self, svc_id: u32, backend: SocketAddr) -> io::Result<BackendStats>;
    /// Every program hostmesh has attached.
    fn attached(&self) -> io::Result<Vec<AttachedProgram>>;
}

pub(crate) struct Sources<'a> {
    pub kernel: &'a dyn KernelView,
    pub config: &'a Config,
    pub status: Option<&'a Status>,
    pub route: Option<RouteTo>,
}

/// Port and protocol when the target leaves them out: the configured
/// services on the address say which.
fn resolve(t: Target, src: &Sources<'_>, sentences: &mut Vec<String>) -> io::Result<(u16, Protocol)> {
    let on_addr: Vec<_> = src.config.services.iter().filter(|s| s.vip == t.addr).collect();
    let port = match t.port {
        Some(p) => p,
        None => match on_addr.iter().find(|s| t.proto.is_none_or(|p| p == s.protocol)) {
            Some(s) => {
                let all: Vec<String> =
                    on_addr.iter().map(|s| format!("{} ({}/{})", s.name, s.port, s.protocol)).collect();
                sentences.push(format!("{} has services {}; this is {}.", t.addr, all.join(", "), s.name));
                return Ok((s.port, s.protocol));
            }
            None => 0,
        },
    };
    if let Some(p) = t.proto {
        return Ok((port, p));
    }
    for p in Protocol::ALL {
        if src.kernel.service(SvcKey::new(t.addr, port, p.number()))?.is_some() {
            return Ok((port, p));
        }
    }
    Ok((port, Protocol::Tcp))
}

pub(crate) fn explain(t: Target, from: Option<(IpAddr, Option<u16>)>, src: &Sources<'_>) -> io::Result<Explanation> {
    let mut sentences = Vec::new();
    let (port, proto) = resolve(t, src, &mut sentences)?;
    let shown = match (t.addr, port) {
        (a, 0) => a.to_string(),
        (a, p) => format!("{}/{proto}", SocketAddr::new(a, p)),
    };
    let mut e = Explanation {
        target: shown,
        path: PathKind::None,
        sentences,
        service: None,
        mesh: None,
        gateway: None,
        from: None,
        route: src.route.clone(),
        programs: Vec::new(),
        kernel: Vec::new(),
    };
    if let Some(route) = &src.route {
        e.kernel.push(format!(
            "route: {} {}{}{}",
            route.kind,
            route.dev.as_ref().map(|d| format!("dev {d}")).unwrap_or_default(),
            route.gateway.map(|g| format!(" via {g}")).unwrap_or_default(),
            if route.hostmesh { " (proto hostmesh)" } else { "" }
        ));
    }
    let source = from.map(|(a, p)| p.map_or(a.to_string(), |p| SocketAddr::new(a, p).to_string()));
    if let Some((entry_port, redirect)) = src.kernel.mesh(t.addr, port, proto.number())? {
        mesh(&mut e, t.addr, entry_port, redirect, proto, src);
        // Every source reaches the sidecar's listener.
        let lo: IpAddr = if t.addr.is_ipv4() { Ipv4Addr::LOCALHOST.into() } else { Ipv6Addr::LOCALHOST.into() };
        e.from = source.map(|source| Prediction {
            source,
            backend: Some(SocketAddr::new(lo, redirect)),
            by: "listener".into(),
        });
    } else if let Some(svc) = src.kernel.service(SvcKey::new(t.addr, port, proto.number()))? {
        service(&mut e, SvcKey::new(t.addr, port, proto.number()), proto, &svc, src)?;
        // An external VIP: a client on another machine gets the network's
        // entry (its own table with external_policy = "local").
        let network = src.kernel.service(SvcKey::network(t.addr, port, proto.number()))?;
        if let Some(net) = &network {
            e.sentences.push(from_the_network(&format!("{} is an external VIP", e.target), net));
        }
        if let Some(from) = from {
            let remote = network.as_ref().filter(|_| !src.kernel.host_address(from.0).unwrap_or(false));
            e.from = Some(match remote {
                Some(net) => predict(from, t.addr, port, proto, net, PathKind::Veth, src)?,
                None => predict(from, t.addr, port, proto, &svc, e.path, src)?,
            });
        }
    } else if let Some(svc) = node_port_entry(t.addr, port, proto, src)? {
        node_port(&mut e, t.addr, port, proto, &svc, src)?;
        if let Some(from) = from {
            e.from = Some(predict(from, t.addr, port, proto, &svc, PathKind::Veth, src)?);
        }
    } else if let Some((endpoint, up)) = tunnel_to(t.addr, src)? {
        gateway(&mut e, t.addr, endpoint, up, src);
        // Every source's packets go to the peer's tunnel endpoint.
        let udp = src.config.gateway.as_ref().map_or(4789, |g| g.udp_port);
        e.from = source.map(|source| Prediction {
            source,
            backend: Some(SocketAddr::new(endpoint, udp)),
            by: "endpoint".into(),
        });
    } else {
        nothing(&mut e, t.addr, port, proto, src);
    }
    if let (Some(f), Some(p)) = (from, &e.from) {
        e.sentences.push(from_sentence(f, p));
    }
    super::programs::programs(&mut e, &src.kernel.attached()?);
    Ok(e)
}

/// What `--from` says: the backend a connection from there gets now.
fn from_sentence(f: (IpAddr, Option<u16>), p: &Prediction) -> String {
    let at = f.1.map_or(f.0.to_string(), |port| SocketAddr::new(f.0, port).to_string());
    match (&p.backend, p.by.as_str()) {
        (Some(b), "affinity") => format!("From {at}: {b}, the backend its affinity entry names."),
        (Some(b), "listener") => format!("From {at}: the sidecar's listener on {b}, as from anywhere."),
        (Some(b), "endpoint") => format!("From {at}: the tunnel to {b} (VXLAN), as from anywhere."),
        (Some(b), _) => format!("From {at}: {b} (the 5-tuple's slot of the Maglev table)."),
        (None, "random") => format!(
            "From {at}: a socket bound to no port gets a backend by its cookie: any of them, by share; \
                 give SRC:PORT for a socket bound to that port."
        ),
        (None, _) => format!("From {at}: no backend (the table is empty: connections are refused)."),
    }
}

fn mesh(e: &mut Explanation, vip: IpAddr, entry_port: u16, redirect: u16, proto: Protocol, src: &Sources<'_>) {
    let name = src
        .config
        .meshes
        .iter()
        .find(|m| m.vip == vip && m.port == entry_port && m.protocol == proto)
        .map(|m| m.name.clone());
    let listener = name.as_ref().and_then(|n| {
        src.status?.objects.iter().find(|o| o.kind == ObjectKind::Mesh && &o.name == n).map(|o| o.detail.clone())
    });
    e.path = PathKind::Mesh;
    e.sentences.push(format!(
        "{} is a mesh redirect{}: sockets and packets to it are handed to the local sidecar listening on port \
         {redirect} (sk_lookup, or the nftables fallback){}.",
        e.target,
        name.as_ref().map(|n| format!(" ({n})")).unwrap_or_default(),
        listener.as_ref().map(|l| format!("; {l}")).unwrap_or_default()
    ));
    e.kernel.push(format!("{}[{vip} port {entry_port}/{proto}] = redirect port {redirect}", HmMap::Mesh));
    e.mesh = Some(MeshView { name, redirect_port: redirect, port: entry_port, listener });
}

/// The node port's entry when `addr` is an address node ports answer on.
fn node_port_entry(addr: IpAddr, port: u16, proto: Protocol, src: &Sources<'_>) -> io::Result<Option<ServiceEntry>> {
    if port == 0 || !src.kernel.host_address(addr)? {
        return Ok(None);
    }
    let any: IpAddr = if addr.is_ipv4() { Ipv4Addr::UNSPECIFIED.into() } else { Ipv6Addr::UNSPECIFIED.into() };
    src.kernel.service(SvcKey::network(any, port, proto.number()))
}

/// What a client on another machine gets from the network's entry `net`.
fn from_the_network(what: &str, net: &ServiceEntry) -> String {
    let policy = if net.value.flags & SVC_F_LOCAL != 0 {
        format!(
            "external_policy \"local\": only this host's backends, which see the client's own address ({} of them{})",
            net.value.backend_count,
            if net.value.backend_count == 0 { ": new flows are refused" } else { "" }
        )
    } else {
        "external_policy \"snat\": any backend; another host's sees this host's address".to_string()
    };
    format!("{what}: packets from the network to it are balanced at the host interfaces' ingress (hm_reply), {policy}.")
}

/// HOSTADDR:NODEPORT: its service, as clients on other machines get it.
fn node_port(
    e: &mut Explanation,
    addr: IpAddr,
    port: u16,
    proto: Protocol,
    svc: &ServiceEntry,
    src: &Sources<'_>,
) -> io::Result<()> {
    let named = src
        .config
        .services
        .iter()
        .find(|s| s.node_port == Some(port) && s.protocol == proto && s.vip.is_ipv4() == addr.is_ipv4());
    e.path = PathKind::NodePort;
    e.sentences.push(from_the_network(
        &format!(
            "{} is node port {port} of service {} on an address of this host",
            e.target,
            named.map_or("(not in the config)".to_string(), |s| format!("\"{}\" ({})", s.name, s.origin))
        ),
        svc,
    ));
    e.sentences.push(
        "A process of this host reaches it too: at connect() where connect-time LB handles the protocol, at lo's \
         egress otherwise."
            .to_string(),
    );
    let Some(s) = named else { return Ok(()) };
    // The service's backends and counters, its table as the network sees it.
    let mut view = Explanation { sentences: Vec::new(), kernel: Vec::new(), ..e.clone() };
    service(&mut view, SvcKey::new(s.vip, s.port, proto.number()), proto, svc, src)?;
    e.service = view.service;
    e.kernel.push(format!(
        "{}[{} port {port}/{proto}, scope network] = id {}, {} backends, table {} slots",
        HmMap::Services,
        if addr.is_ipv4() { "0.0.0.0" } else { "::" },
        svc.value.id,
        svc.value.backend_count,
        svc.value.table_size
    ));
    e.kernel.push(format!("{}[{addr}]: node ports answer on it", HmMap::HostAddrs));
    Ok(())
}

fn service(e: &mut Explanation, key: SvcKey, proto: Protocol, svc: &ServiceEntry, src: &Sources<'_>) -> io::Result<()> {
    let cfg = src.kernel.config()?;
    let ctlb = cfg.is_some_and(|c| c.flags & if proto == Protocol::Tcp { CFG_CTLB_TCP } else { CFG_CTLB_UDP } != 0);
    let named = src.config.services.iter().find(|s| s.vip == key.vip() && s.port == key.port() && s.protocol == proto);
    e.path = if ctlb { PathKind::ConnectTime } else { PathKind::Veth };
    let how = if ctlb {
        format!("connect-time load balancing: the cgroup programs give each {proto} socket a backend at connect() or sendmsg(), so no packet is translated")
    } else {
        "the bpfnat veth path: packets are routed into hm-natin and translated per packet as they leave it (on hm-natout, across the veth, for a backend on this host), with conntrack"
            .to_string()
    };
    let live = svc.slots.iter().flatten().count();
    e.sentences.push(format!(
        "{} is service {}{}, handled by {how}. {}",
        e.target,
        named.map_or("(not in the config: left from an earlier one?)".to_string(), |s| format!("\"{}\"", s.name)),
        named.map(|s| format!(" ({})", s.origin)).unwrap_or_default(),
        if svc.value.backend_count == 0 || live == 0 {
            "It has no backend taking connections: connections are refused at once.".to_string()
        } else {
            format!("{} backends take new connections.", svc.value.backend_count)
        }
    ));
    let mut slots: BTreeMap<SocketAddr, usize> = BTreeMap::new();
    for b in svc.slots.iter().flatten() {
        *slots.entry(*b).or_default() += 1;
    }
    let mut addrs: Vec<SocketAddr> = named.map(|s| s.backends.iter().map(|b| b.addr).collect()).unwrap_or_default();
    addrs.extend(slots.keys().filter(|a| !addrs.contains(a)).copied().collect::<Vec<_>>());
    let mut backends = Vec::new();
    for a in addrs {
        let weight = named.and_then(|s| s.backends.iter().find(|b| b.addr == a)).map(|b| b.weight);
        let state = src
            .status
            .and_then(|st| st.backends.iter().find(|b| Some(&b.service) == named.map(|s| &s.name) && b.address == a))
            .map(|b| b.state.to_string())
            .unwrap_or_else(|| if weight == Some(0) { "draining" } else { "up" }.to_string());
        let c = src.kernel.counters(svc.value.id, a)?;
        let n = slots.get(&a).copied().unwrap_or(0);
        backends.push(BackendView {
            address: a,
            weight,
            slots: n,
            share: if svc.slots.is_empty() { 0.0 } else { n as f64 / svc.slots.len() as f64 },
            state,
            connections: c.ctlb_connections + c.veth_connections,
            bytes_to: c.bytes_to,
            bytes_from: c.bytes_from,
        });
    }
    service_entries(e, svc, cfg);
    e.service = Some(ServiceView {
        name: named.map(|s| s.name.clone()),
        origin: named.map(|s| s.origin.to_string()),
        id: svc.value.id,
        table_size: svc.value.table_size,
        affinity_timeout_s: svc.affinity_s,
        backends,
    });
    Ok(())
}

/// The map entries of a service, as explain lists them.
fn service_entries(e: &mut Explanation, svc: &ServiceEntry, cfg: Option<HmConfig>) {
    e.kernel.push(format!(
        "{}[{}] = id {}, {} backends, table {} slots; {}: {} chunks",
        HmMap::Services,
        e.target,
        svc.value.id,
        svc.value.backend_count,
        svc.value.table_size,
        HmMap::Maglev,
        svc.slots.len().div_ceil(crate::abi::MAGLEV_CHUNK)
    ));
    if let Some(c) = cfg {
        e.kernel.push(format!(
            "{}: connect-time LB handles {}",
            HmMap::Config,
            match (c.flags & CFG_CTLB_TCP != 0, c.flags & CFG_CTLB_UDP != 0) {
                (true, true) => "tcp and udp",
                (true, false) => "tcp",
                (false, true) => "udp",
                (false, false) => "nothing (every service takes the veth path)",
            }
        ));
    }
}

/// The backend a connection from `from` gets now, as the probes choose:
/// a fresh affinity entry first, else the table slot of the 5-tuple's
/// hash (the veth path always; connect-time LB for a socket bound to a
/// port), else (connect-time, no port) a random one by the cookie.
fn predict(
    from: (IpAddr, Option<u16>),
    vip: IpAddr,
    port: u16,
    proto: Protocol,
    svc: &ServiceEntry,
    path: PathKind,
    src: &Sources<'_>,
) -> io::Result<Prediction> {
    let source = from.1.map_or(from.0.to_string(), |p| SocketAddr::new(from.0, p).to_string());
    if let Some(timeout) = svc.affinity_s {
        if let Some((b, idle_ns)) = src.kernel.affinity(from.0, svc.value.id)? {
            if idle_ns < u64::from(timeout) * 1_000_000_000 {
                return Ok(Prediction { source, backend: Some(b), by: "affinity".into() });
            }
        }
    }
    let Some(sport) = from.1 else {
        let by = if path == PathKind::ConnectTime { "random" } else { "hash" };
        return Ok(Prediction { source, backend: None, by: by.into() });
    };
    if svc.slots.is_empty() {
        return Ok(Prediction { source, backend: None, by: "hash".into() });
    }
    let slot = flow_hash(from.0, vip, sport, port, proto.number()) as usize % svc.slots.len();
    Ok(Prediction { source, backend: svc.slots[slot], by: "hash".into() })
}

/// Where the tunnel takes packets to `addr`, and whether that gateway
/// answers: on a gateway, the peer's endpoint in use (HM_PEERS); on a
/// member, for an address of a peer's CIDRs, its site's gateway in use
/// (HM_GW_CONFIG), down when the status says every one of them is.
fn tunnel_to(addr: IpAddr, src: &Sources<'_>) -> io::Result<Option<(IpAddr, bool)>> {
    if let Some(found) = src.kernel.peer(addr)? {
        return Ok(Some(found));
    }
    let member = src.config.gateway.as_ref().is_some_and(|g| g.role == GatewayRole::Member);
    if !member || !src.config.peers.iter().any(|p| p.cidrs.iter().any(|c| c.contains(&addr))) {
        return Ok(None);
    }
    let Some(cfg) = src.kernel.gateway_config()?.filter(|c| c.role == ROLE_MEMBER) else { return Ok(None) };
    let down = src
        .status
        .is_some_and(|s| s.objects.iter().any(|o| o.kind == ObjectKind::Gateway && o.state == ObjectState::Down));
    Ok(Some((crate::abi::ip_from16(cfg.gateway), !down)))
}

fn gateway(e: &mut Explanation, addr: IpAddr, endpoint: IpAddr, up: bool, src: &Sources<'_>) {
    let peer = src.config.peers.iter().find(|p| p.cidrs.iter().any(|c| c.contains(&addr)));
    let member = src.config.gateway.as_ref().filter(|g| g.role == GatewayRole::Member);
    // The list the gateway in use was chosen from, when there is a choice.
    let list = member.map_or_else(|| peer.map(|p| p.endpoints.clone()).unwrap_or_default(), |g| g.gateway_ips.clone());
    let of = if list.len() > 1 {
        format!(" (in use of {})", list.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))
    } else {
        String::new()
    };
    let whose = if member.is_some() { "this site's gateway " } else { "" };
    e.path = PathKind::Gateway;
    e.sentences.push(format!(
        "{} is behind gateway peer {}: packets to it go over the VXLAN tunnel hm-tun0 to {whose}{endpoint}{of}, \
         which {}.",
        e.target,
        peer.map_or("(not in the config)".to_string(), |p| format!("\"{}\"", p.name)),
        if up { "answers its probes" } else { "does not answer its probes now: traffic to it fails fast" }
    ));
    let encrypted = member.is_none() && peer.is_some_and(|p| p.encrypted());
    if encrypted {
        e.sentences.push(format!(
            "The tunnel's packets to {endpoint} cross the WAN inside WireGuard (hm-wg0), encrypted, never in clear."
        ));
    }
    let peer = peer.map(|p| p.name.clone());
    if member.is_some() {
        e.kernel.push(format!("{}[0].gateway = {endpoint}", HmMap::GwConfig));
    } else {
        e.kernel.push(format!("{}[{addr}] = endpoint {endpoint} ({})", HmMap::Peers, if up { "up" } else { "down" }));
    }
    e.gateway = Some(GatewayView { peer, endpoint, up, encrypted });
}

fn nothing(e: &mut Explanation, addr: IpAddr, port: u16, proto: Protocol, src: &Sources<'_>) {
    let configured = src.config.services.iter().find(|s| s.vip == addr && s.port == port && s.protocol == proto);
    let other_ports: Vec<String> = src
        .config
        .services
        .iter()
        .filter(|s| s.vip == addr && !(s.port == port && s.protocol == proto))
        .map(|s| format!("{} ({}/{})", s.name, s.port, s.protocol))
        .collect();
    let refused = src.config.peers.iter().find(|p| p.cidrs.iter().any(|c| c.contains(&addr))).filter(|p| {
        src.status.is_some_and(|s| {
            s.objects.iter().any(|o| o.kind == ObjectKind::Peer && o.name == p.name && o.state == ObjectState::Refused)
        })
    });
    let why = if let Some(p) = refused {
        format!(
            "it is behind gateway peer \"{}\", which is encrypted (WireGuard) and refused here: its CIDRs are \
             unreachable, so nothing goes to it in clear (`hostmesh status` says why)",
            p.name
        )
    } else if let Some(s) = configured {
        format!("service \"{}\" ({}) is configured but not in the kernel: `hostmesh status` says why", s.name, s.origin)
    } else if !other_ports.is_empty() {
        format!("no service has this port and protocol; the address has {}", other_ports.join(", "))
    } else {
        "no service, mesh entry or gateway peer CIDR has it".to_string()
    };
    e.sentences.push(format!(
        "hostmesh does not handle {}: {why}. The kernel routes it as it would without hostmesh{}.",
        e.target,
        e.route.as_ref().and_then(|r| r.dev.as_ref()).map(|d| format!(" (dev {d})")).unwrap_or_default()
    ));
}
