//! The rtnetlink backend: links, routes and neighbours in the daemon's
//! network namespace. `socket` speaks netlink; `link`, `route` and `neigh`
//! build typed requests; this module maps them to the model.

pub(crate) mod link;
pub(crate) mod monitor;
mod neigh;
pub(crate) mod nft_table;
pub(crate) mod route;
mod rule;
pub(crate) mod sock_destroy;
mod socket;
pub mod tc;
pub(crate) mod wireguard;

use std::collections::{BTreeMap, BTreeSet};
use std::io;

pub use link::Link;
use route::IntoDev;
pub use socket::{NetlinkSocket, RouteSocket};

use super::{BackendError, NetBackend, Result, LINK_PREFIX};
use crate::model::*;

pub struct Rtnetlink {
    sock: RouteSocket,
}

fn err(op: impl Into<String>) -> impl FnOnce(io::Error) -> BackendError {
    let op = op.into();
    move |source| BackendError::Netlink { op, source }
}

impl Rtnetlink {
    pub fn open() -> io::Result<Self> {
        Ok(Rtnetlink { sock: RouteSocket::open()? })
    }

    pub fn all_links(&mut self) -> Result<Vec<Link>> {
        link::dump_links(&mut self.sock).map_err(err("dump links"))
    }

    fn index_of(&mut self, name: &str) -> Result<u32> {
        self.all_links()?.into_iter().find(|l| l.name == name).map(|l| l.index).ok_or_else(|| BackendError::Netlink {
            op: format!("find link {name}"),
            source: io::Error::from_raw_os_error(libc::ENODEV),
        })
    }

    /// Every route with hostmesh's protocol in any table, whatever its
    /// shape (for teardown).
    pub fn owned_routes(&mut self) -> Result<Vec<RouteKey>> {
        Ok(route::dump(&mut self.sock)
            .map_err(err("dump routes"))?
            .into_iter()
            .filter(|r| r.protocol == RTPROT_HOSTMESH)
            .map(|r| RouteKey { table: r.table, dst: r.dst })
            .collect())
    }
}

/// Groups `hm-*` links into model specs: a veth pair whose ends are both
/// ours is one item under the smaller name; anything else named `hm-*` is
/// reported as it is so the planner can replace or remove it.
pub fn owned_links(links: &[Link]) -> BTreeMap<String, LinkSpec> {
    let by_index: BTreeMap<u32, &Link> = links.iter().map(|l| (l.index, l)).collect();
    let mut out = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for l in links.iter().filter(|l| l.name.starts_with(LINK_PREFIX)) {
        if seen.contains(&l.name) {
            continue;
        }
        let peer = match (l.kind.as_deref(), l.peer_other_netns, l.link) {
            (Some("veth"), false, Some(i)) => by_index.get(&i).copied(),
            _ => None,
        };
        match peer {
            Some(p) if p.name.starts_with(LINK_PREFIX) && p.index != l.index => {
                let (a, b) = if l.name < p.name { (l, p) } else { (p, l) };
                seen.insert(a.name.clone());
                seen.insert(b.name.clone());
                out.insert(
                    a.name.clone(),
                    LinkSpec::Veth {
                        peer: b.name.clone(),
                        mac: a.mac.unwrap_or_default(),
                        peer_mac: b.mac.unwrap_or_default(),
                        up: a.up && b.up,
                    },
                );
            }
            _ => match (l.kind.as_deref(), l.vxlan) {
                (Some("vxlan"), Some((port, true))) => {
                    out.insert(l.name.clone(), LinkSpec::Vxlan { port, mac: l.mac.unwrap_or_default(), up: l.up });
                }
                // Its key, port and peers are read by `links`, over
                // generic netlink.
                (Some("wireguard"), _) => {
                    let mtu = l.mtu.unwrap_or_default();
                    let spec = WireguardSpec { mtu, up: l.up, port: 0, fwmark: 0, key: None, peers: BTreeMap::new() };
                    out.insert(l.name.clone(), LinkSpec::Wireguard(spec));
                }
                _ => {
                    let kind = l.kind.clone().unwrap_or_else(|| "unknown".into());
                    let kind = match kind.as_str() {
                        "veth" => "veth with a foreign peer".to_string(),
                        "vxlan" => "vxlan that is not flow-based".to_string(),
                        _ => kind,
                    };
                    out.insert(l.name.clone(), LinkSpec::Foreign { link_kind: kind });
                }
            },
        }
    }
    out
}

/// The route the kernel picks for an address, for `hostmesh explain`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct RouteTo {
    /// "unicast", "local", "unreachable", ...
    pub kind: String,
    pub dev: Option<String>,
    pub gateway: Option<std::net::IpAddr>,
    /// hostmesh's own (`proto hostmesh`).
    pub hostmesh: bool,
}

impl Rtnetlink {
    /// What `ip route get ADDR` would say.
    pub(crate) fn route_to(&mut self, ip: std::net::IpAddr) -> Result<Option<RouteTo>> {
        let Some(r) = route::get(&mut self.sock, ip).map_err(err(format!("look up the route to {ip}")))? else {
            return Ok(None);
        };
        let links = self.all_links()?;
        let dev = r.oif.and_then(|i| links.iter().find(|l| l.index == i)).map(|l| l.name.clone());
        let kind = format!("{:?}", r.kind).to_lowercase();
        // `route get` answers without the route's protocol; the FIB entry
        // it used has it (one lookup, not a dump of every route).
        let protocol = route::get_fib_match(&mut self.sock, ip)
            .map_err(err(format!("look up the route entry for {ip}")))?
            .map(|x| x.protocol);
        Ok(Some(RouteTo { kind, dev, gateway: r.gateway, hostmesh: protocol == Some(crate::model::RTPROT_HOSTMESH) }))
    }

    /// The MTU of the underlay's path to each address: the route's MTU if
    /// it has one, else its output link's; looked up as WireGuard's own
    /// packets are (with its mark), so never the path into `hm-wg0`.
    pub fn path_mtus(&mut self, to: &[std::net::IpAddr]) -> Result<BTreeMap<std::net::IpAddr, u32>> {
        self.routes_to_marked(to, Some(crate::model::encryption::WG_FWMARK), |r, link| {
            r.mtu.or(link.and_then(|l| l.mtu))
        })
    }

    /// The route to each address (`ip route get`): local or not, its
    /// output interface and preferred source.
    pub fn backend_routes(
        &mut self,
        to: &[std::net::IpAddr],
    ) -> Result<BTreeMap<std::net::IpAddr, crate::model::BackendRoute>> {
        self.routes_to(to, |r, link| {
            let local = r.kind == netlink_packet_route::route::RouteType::Local;
            Some(crate::model::BackendRoute { local, dev: link.map(|l| l.name.clone()), src: r.prefsrc })
        })
    }

    /// `ip route get` for each address, with the route's output link (one
    /// dump of the links for all of them); `what` says what each route
    /// gives, addresses with no route or nothing to give are left out.
    fn routes_to<T>(
        &mut self,
        to: &[std::net::IpAddr],
        what: impl Fn(&route::Route, Option<&Link>) -> Option<T>,
    ) -> Result<BTreeMap<std::net::IpAddr, T>> {
        self.routes_to_marked(to, None, what)
    }

    /// `routes_to` for packets with `mark`.
    fn routes_to_marked<T>(
        &mut self,
        to: &[std::net::IpAddr],
        mark: Option<u32>,
        what: impl Fn(&route::Route, Option<&Link>) -> Option<T>,
    ) -> Result<BTreeMap<std::net::IpAddr, T>> {
        let mut out = BTreeMap::new();
        if to.is_empty() {
            return Ok(out);
        }
        let links = self.all_links()?;
        for ip in to {
            let Some(r) =
                route::get_marked(&mut self.sock, *ip, mark).map_err(err(format!("look up the route to {ip}")))?
            else {
                continue;
            };
            let link = r.oif.and_then(|i| links.iter().find(|l| l.index == i));
            if let Some(v) = what(&r, link) {
                out.insert(*ip, v);
            }
        }
        Ok(out)
    }

    /// Every interface's addresses, by name (`ip addr`): the local address
    /// (IFA_LOCAL where there is one: a point-to-point link's IFA_ADDRESS
    /// is its peer's).
    pub fn addresses(&mut self) -> Result<BTreeMap<String, BTreeSet<std::net::IpAddr>>> {
        use netlink_packet_route::address::AddressMessage;
        use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
        let names: BTreeMap<u32, String> = self.all_links()?.into_iter().map(|l| (l.index, l.name)).collect();
        let mut out: BTreeMap<String, BTreeSet<std::net::IpAddr>> = BTreeMap::new();
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            let mut req = AddressMessage::default();
            req.header.family = family;
            let replies = self.sock.dump(RouteNetlinkMessage::GetAddress(req)).map_err(err("dump addresses"))?;
            for m in replies {
                let RouteNetlinkMessage::NewAddress(a) = m else { continue };
                let Some(name) = names.get(&a.header.index) else { continue };
                if let Some(ip) = local_address(&a) {
                    out.entry(name.clone()).or_default().insert(ip);
                }
            }
        }
        Ok(out)
    }

    /// Interfaces and default-route interfaces.
    pub fn link_facts(&mut self) -> Result<HostFacts> {
        let links = self.all_links()?;
        let routes = route::dump(&mut self.sock).map_err(err("dump routes"))?;
        let names: BTreeMap<u32, String> = links.iter().map(|l| (l.index, l.name.clone())).collect();
        Ok(HostFacts {
            interfaces: links.iter().map(|l| l.name.clone()).collect(),
            default_route_interfaces: route::default_route_oifs(&routes)
                .into_iter()
                .filter_map(|i| names.get(&i).cloned())
                .filter(|n| !n.starts_with(LINK_PREFIX))
                .collect(),
            ..HostFacts::default()
        })
    }
}

impl NetBackend for Rtnetlink {
    fn links(&mut self) -> Result<BTreeMap<String, LinkSpec>> {
        let mut links = owned_links(&self.all_links()?);
        for (name, spec) in links.iter_mut() {
            if let LinkSpec::Wireguard(w) = spec {
                let device = wireguard::device(name).map_err(err(format!("read wireguard device {name}")))?;
                *w = WireguardSpec { mtu: w.mtu, up: w.up, ..device };
            }
        }
        Ok(links)
    }

    fn create_link(&mut self, name: &str, spec: &LinkSpec) -> Result<()> {
        match spec {
            LinkSpec::Veth { peer, mac, peer_mac, up } => {
                link::create_veth(&mut self.sock, name, *mac, peer, *peer_mac)
                    .map_err(err(format!("create veth {name} peer {peer}")))?;
                if *up {
                    self.set_link_up(name)?;
                    self.set_link_up(peer)?;
                }
                Ok(())
            }
            LinkSpec::Vxlan { port, mac, up } => {
                link::create_vxlan(&mut self.sock, name, *mac, *port)
                    .map_err(err(format!("create vxlan {name} external dstport {port}")))?;
                if *up {
                    self.set_link_up(name)?;
                }
                Ok(())
            }
            LinkSpec::Wireguard(w) => {
                link::create_wireguard(&mut self.sock, name, w.mtu)
                    .map_err(err(format!("create wireguard {name} mtu {}", w.mtu)))?;
                self.configure_link(name, spec)
            }
            LinkSpec::Foreign { link_kind } => Err(BackendError::Netlink {
                op: format!("create {link_kind} link {name}"),
                source: io::Error::new(io::ErrorKind::Unsupported, "hostmesh does not create this kind of link"),
            }),
        }
    }

    fn set_link_up(&mut self, name: &str) -> Result<()> {
        let links = self.all_links()?;
        let names: Vec<&Link> = links.iter().filter(|l| l.name == name).collect();
        let Some(l) = names.first() else {
            return Err(BackendError::Netlink {
                op: format!("set {name} up"),
                source: io::Error::from_raw_os_error(libc::ENODEV),
            });
        };
        link::set_up(&mut self.sock, l.index).map_err(err(format!("set {name} up")))?;
        // A veth pair is one item: bring the peer up too.
        if let (Some("veth"), Some(peer)) = (l.kind.as_deref(), l.link) {
            if let Some(p) = links.iter().find(|x| x.index == peer && x.name.starts_with(LINK_PREFIX)) {
                link::set_up(&mut self.sock, p.index).map_err(err(format!("set {} up", p.name)))?;
            }
        }
        Ok(())
    }

    fn configure_link(&mut self, name: &str, spec: &LinkSpec) -> Result<()> {
        let LinkSpec::Wireguard(w) = spec else {
            return Err(BackendError::Netlink {
                op: format!("configure link {name}"),
                source: io::Error::new(io::ErrorKind::Unsupported, "only a WireGuard device is set in place"),
            });
        };
        // The key, port, mark and peers before the device goes up: it
        // never runs with another's.
        wireguard::set_device(name, w).map_err(err(format!(
            "set wireguard {name} listen-port {} ({} peers)",
            w.port,
            w.peers.len()
        )))?;
        let index = self.index_of(name)?;
        link::set_mtu(&mut self.sock, index, w.mtu).map_err(err(format!("set {name} mtu {}", w.mtu)))?;
        if w.up {
            link::set_up(&mut self.sock, index).map_err(err(format!("set {name} up")))?;
        }
        Ok(())
    }

    fn delete_link(&mut self, name: &str) -> Result<()> {
        link::delete(&mut self.sock, name).map_err(err(format!("delete link {name}")))
    }

    fn routes(&mut self) -> Result<BTreeMap<RouteKey, RouteSpec>> {
        let names: BTreeMap<u32, String> = self.all_links()?.into_iter().map(|l| (l.index, l.name)).collect();
        let routes = route::dump(&mut self.sock).map_err(err("dump routes"))?;
        Ok(routes
            .into_iter()
            .filter(|r| r.protocol == RTPROT_HOSTMESH)
            .filter_map(|r| {
                let spec = match (r.kind, r.gateway) {
                    (route::RouteType::Unreachable, _) => RouteSpec::Unreachable,
                    (route::RouteType::Local, _) => {
                        RouteSpec::Local { dev: names.get(&r.oif?)?.clone(), src: r.prefsrc? }
                    }
                    (_, None) => RouteSpec::Dev { dev: names.get(&r.oif?)?.clone(), src: r.prefsrc? },
                    (_, Some(gateway)) => {
                        RouteSpec::Via { gateway, dev: names.get(&r.oif?)?.clone(), mtu: r.mtu, encap: r.encap }
                    }
                };
                Some((RouteKey { table: r.table, dst: r.dst }, spec))
            })
            .collect())
    }

    fn replace_route(&mut self, key: &RouteKey, spec: &RouteSpec) -> Result<()> {
        match spec {
            RouteSpec::Via { gateway, dev, mtu, encap } => {
                let oif = self.index_of(dev)?;
                let hop = route::ViaHop { gateway: *gateway, oif, mtu: *mtu, encap: encap.as_ref() };
                route::replace_via(&mut self.sock, key.table, &key.dst, hop, RTPROT_HOSTMESH)
                    .map_err(err(format!("add route {} via {gateway} dev {dev} table {}", key.dst, key.table)))
            }
            RouteSpec::Local { dev, src } => {
                let oif = self.index_of(dev)?;
                route::replace_into(
                    &mut self.sock,
                    key.table,
                    &key.dst,
                    IntoDev { oif, src: *src, local: true },
                    RTPROT_HOSTMESH,
                )
                .map_err(err(format!("add route local {} dev {dev} src {src} table {}", key.dst, key.table)))
            }
            RouteSpec::Unreachable => route::replace_unreachable(&mut self.sock, key.table, &key.dst, RTPROT_HOSTMESH)
                .map_err(err(format!("add route unreachable {} table {}", key.dst, key.table))),
            RouteSpec::Dev { dev, src } => {
                let oif = self.index_of(dev)?;
                route::replace_into(
                    &mut self.sock,
                    key.table,
                    &key.dst,
                    IntoDev { oif, src: *src, local: false },
                    RTPROT_HOSTMESH,
                )
                .map_err(err(format!("add route {} dev {dev} src {src} table {}", key.dst, key.table)))
            }
        }
    }

    fn rules(&mut self) -> Result<BTreeSet<RuleSpec>> {
        Ok(rule::dump(&mut self.sock, RTPROT_HOSTMESH).map_err(err("dump rules"))?.into_iter().collect())
    }

    fn add_rule(&mut self, r: &RuleSpec) -> Result<()> {
        rule::add(&mut self.sock, r, RTPROT_HOSTMESH).map_err(err(format!("add rule lookup {}", r.table)))
    }

    fn delete_rule(&mut self, r: &RuleSpec) -> Result<()> {
        rule::delete(&mut self.sock, r, RTPROT_HOSTMESH).map_err(err(format!("delete rule lookup {}", r.table)))
    }

    fn delete_route(&mut self, key: &RouteKey) -> Result<()> {
        route::delete(&mut self.sock, key.table, &key.dst, RTPROT_HOSTMESH)
            .map_err(err(format!("delete route {} table {}", key.dst, key.table)))
    }

    fn neighbours(&mut self) -> Result<BTreeMap<NeighKey, NeighSpec>> {
        let names: BTreeMap<u32, String> = self
            .all_links()?
            .into_iter()
            .filter(|l| l.name.starts_with(LINK_PREFIX))
            .map(|l| (l.index, l.name))
            .collect();
        Ok(neigh::dump(&mut self.sock)
            .map_err(err("dump neighbours"))?
            .into_iter()
            .filter(|n| n.permanent)
            .filter_map(|n| {
                let dev = names.get(&n.ifindex)?.clone();
                Some((NeighKey { dev, ip: n.ip }, NeighSpec { lladdr: n.lladdr? }))
            })
            .collect())
    }

    fn replace_neighbour(&mut self, key: &NeighKey, spec: &NeighSpec) -> Result<()> {
        let ifindex = self.index_of(&key.dev)?;
        neigh::replace_permanent(&mut self.sock, ifindex, key.ip, spec.lladdr).map_err(err(format!(
            "set neighbour {} lladdr {} dev {}",
            key.ip,
            fmt_mac(&spec.lladdr),
            key.dev
        )))
    }

    fn delete_neighbour(&mut self, key: &NeighKey) -> Result<()> {
        let Ok(ifindex) = self.index_of(&key.dev) else { return Ok(()) };
        neigh::delete(&mut self.sock, ifindex, key.ip)
            .map_err(err(format!("delete neighbour {} dev {}", key.ip, key.dev)))
    }
}

/// An address message's local address: IFA_LOCAL where there is one (a
/// point-to-point link's IFA_ADDRESS is its peer's), else IFA_ADDRESS.
pub(super) fn local_address(a: &netlink_packet_route::address::AddressMessage) -> Option<std::net::IpAddr> {
    use netlink_packet_route::address::AddressAttribute;
    let (mut local, mut address) = (None, None);
    for attr in &a.attributes {
        match attr {
            AddressAttribute::Local(ip) => local = Some(*ip),
            AddressAttribute::Address(ip) => address = Some(*ip),
            _ => {}
        }
    }
    local.or(address)
}
