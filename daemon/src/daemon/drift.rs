//! Is a change the kernel announced a move away from what hostmesh wants?
//! The rule for fast repair: anything hostmesh owns that is deleted or set
//! down, and a host interface hostmesh attaches programs to that comes
//! back under a new index, is drift (repaired by a full resync at once);
//! everything else — including the echo of hostmesh's own changes — is not.

use std::collections::BTreeMap;
use std::time::Duration;

use slog::{warn, Logger};

use crate::backends::netlink::monitor::{CurrentLinks, KernelChange, LinkLookup};
use crate::model::{BpfMap, Desired, LinkSpec, MapEntryKey, NeighKey, RouteKey, RTPROT_HOSTMESH};

/// A repair waits this long for the rest of a burst of kernel events (a
/// deleted veth takes its routes with it): one resync repairs them all.
pub(super) const REPAIR_SETTLE: Duration = Duration::from_millis(100);
/// Repairs named in the log per burst; the rest are counted.
const REPAIRS_LOGGED: usize = 5;

/// The interfaces hostmesh attaches programs to that it did not create,
/// with their index at the last sync.
pub(super) type HostIndexes = BTreeMap<String, u32>;

/// Drift, the daemon's part: which kernel changes need a repair, and how
/// many were seen since the last sync.
#[derive(Default)]
pub(super) struct DriftWatch {
    /// Host interfaces carrying hostmesh's programs, by index, as of the
    /// last sync (one that comes back under a new index is re-attached).
    host_indexes: HostIndexes,
    /// Drift found since the last sync, not yet repaired.
    seen: usize,
}

impl DriftWatch {
    /// Why a kernel change needs a repair, if it does (against the last
    /// sync's desired state).
    pub(super) fn of(&self, change: &KernelChange, want: Option<&Desired>) -> Option<String> {
        drift(change, want?, &self.host_indexes, &CurrentLinks)
    }

    /// Logs a move away from what hostmesh wants (the first few of a burst).
    pub(super) fn log(&mut self, why: String, log: &Logger) {
        self.seen += 1;
        if self.seen <= REPAIRS_LOGGED {
            warn!(log, "repairing drift"; "what" => why);
        }
    }

    /// After a sync: the drift it repaired that was not named is counted.
    pub(super) fn settle(&mut self, log: &Logger) {
        if self.seen > REPAIRS_LOGGED {
            warn!(log, "repaired more drift than was logged"; "changes" => self.seen);
        }
        self.seen = 0;
    }

    /// Remembers the index of each host interface the sync attached to.
    pub(super) fn remember_hosts(&mut self, want: Option<&Desired>) {
        self.host_indexes = want
            .map(host_devices)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|d| crate::backends::ifaces::index(&d).map(|i| (d, i)))
            .collect();
    }
}

/// Names of every link hostmesh wants, both ends of its veths included.
fn wanted_link(want: &Desired, name: &str) -> bool {
    want.links.contains_key(name)
        || want.links.values().any(|w| matches!(&w.spec, LinkSpec::Veth { peer, .. } if peer == name))
}

/// Host interfaces that carry hostmesh's programs.
pub(super) fn host_devices(want: &Desired) -> Vec<String> {
    let mut devs: Vec<String> = want
        .attachments
        .keys()
        .filter_map(|a| a.device())
        .filter(|d| !wanted_link(want, d))
        .map(str::to_string)
        .collect();
    devs.sort();
    devs.dedup();
    devs
}

/// Whether node ports need the host interfaces' addresses: one step into
/// the entries, which are ordered by map first.
fn wants_host_addresses(want: &Desired) -> bool {
    let first = MapEntryKey { map: BpfMap::HostAddrs, key: Default::default() };
    want.map_entries.range(first..).next().is_some_and(|(k, _)| k.map == BpfMap::HostAddrs)
}

fn host_address_key(ip: std::net::IpAddr) -> MapEntryKey {
    use crate::abi::Pod;
    MapEntryKey { map: BpfMap::HostAddrs, key: crate::abi::Addr { addr: crate::abi::addr16(ip) }.to_bytes().into() }
}

/// Why `change` needs a repair, if it does. `now` says what links are
/// like at this moment: a change already undone is no drift.
pub(super) fn drift(
    change: &KernelChange,
    want: &Desired,
    hosts: &HostIndexes,
    now: &dyn LinkLookup,
) -> Option<String> {
    match change {
        KernelChange::Lost => Some("rtnetlink events were lost".to_string()),
        KernelChange::LinkGone { name } if wanted_link(want, name) && now.index(name).is_none() => {
            Some(format!("link {name} was deleted"))
        }
        KernelChange::Link { name, up: false, .. } if wanted_link(want, name) && now.up(name) == Some(false) => {
            Some(format!("link {name} was set down"))
        }
        KernelChange::Link { name, index, .. } if hosts.get(name).is_some_and(|i| i != index) => Some(format!(
            "host interface {name} came back as index {index} (was {}); its programs must be attached again",
            hosts[name]
        )),
        KernelChange::RouteGone { table, dst, protocol }
            if *protocol == RTPROT_HOSTMESH && want.routes.contains_key(&RouteKey { table: *table, dst: *dst }) =>
        {
            Some(format!("route {dst} table {table} was deleted"))
        }
        // Node ports answer on the host interfaces' addresses (HM_HOST_ADDRS):
        // one added there that it lacks, or one removed that it has (a
        // refreshed lifetime, which IPv6 sends at every router
        // advertisement, is neither).
        KernelChange::Address { ifindex, ip, added }
            if hosts.values().any(|i| i == ifindex)
                && wants_host_addresses(want)
                && *added != want.map_entries.contains_key(&host_address_key(*ip)) =>
        {
            let dev = hosts.iter().find(|(_, i)| *i == ifindex).map_or_else(String::new, |(n, _)| n.clone());
            let what = if *added { "added to" } else { "removed from" };
            Some(format!("address {ip} was {what} host interface {dev}, where node ports answer"))
        }
        // Neighbour churn is constant on a busy host: look the name up only
        // when hostmesh has neighbours of its own.
        KernelChange::NeighbourGone { ip, ifindex } if !want.neighbours.is_empty() => {
            let dev = now.name(*ifindex)?;
            want.neighbours
                .contains_key(&NeighKey { dev: dev.clone(), ip: *ip })
                .then(|| format!("neighbour {ip} dev {dev} was deleted"))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Attachment, Hook, Owned, Program, RouteSpec};

    fn want() -> Desired {
        let mut d = Desired::default();
        let veth = LinkSpec::Veth { peer: "hm-natout".into(), mac: [0; 6], peer_mac: [0; 6], up: true };
        d.links.insert("hm-natin".into(), Owned { spec: veth, owners: Default::default() });
        let dst: ipnet::IpNet = "10.96.0.10/32".parse().unwrap();
        let route =
            RouteSpec::Via { gateway: "169.254.1.1".parse().unwrap(), dev: "hm-natin".into(), mtu: None, encap: None };
        d.routes.insert(RouteKey { table: 254, dst }, Owned { spec: route, owners: Default::default() });
        let a = Attachment { program: Program::Reply, hook: Hook::TcIngress("eth0".into()) };
        d.attachments.insert(a, Owned { spec: (), owners: Default::default() });
        d
    }

    /// Links as a test says they are now.
    struct Now {
        present: bool,
        up: bool,
    }

    impl LinkLookup for Now {
        fn index(&self, _: &str) -> Option<u32> {
            self.present.then_some(7)
        }
        fn name(&self, _: u32) -> Option<String> {
            None
        }
        fn up(&self, _: &str) -> Option<bool> {
            self.present.then_some(self.up)
        }
    }

    #[test]
    fn what_hostmesh_owns_going_away_is_drift_and_its_own_changes_are_not() {
        let w = want();
        let hosts: HostIndexes = [("eth0".to_string(), 2)].into();
        let gone = Now { present: false, up: false };
        let here = Now { present: true, up: true };
        let down = Now { present: true, up: false };
        let d = |c: KernelChange, now: &Now| drift(&c, &w, &hosts, now);
        assert_eq!(
            d(KernelChange::LinkGone { name: "hm-natout".into() }, &gone).unwrap(),
            "link hm-natout was deleted"
        );
        // Deleted and already re-created (hostmesh replacing it): no repair.
        assert_eq!(d(KernelChange::LinkGone { name: "hm-natin".into() }, &here), None);
        assert_eq!(d(KernelChange::LinkGone { name: "eth9".into() }, &gone), None);
        assert!(d(KernelChange::Link { name: "hm-natin".into(), index: 7, up: false }, &down).is_some());
        // Created down, then set up by hostmesh: the first event is no drift.
        assert_eq!(d(KernelChange::Link { name: "hm-natin".into(), index: 7, up: false }, &here), None);
        assert_eq!(d(KernelChange::Link { name: "eth0".into(), index: 2, up: true }, &here), None);
        let back = d(KernelChange::Link { name: "eth0".into(), index: 9, up: true }, &here).unwrap();
        assert!(back.contains("host interface eth0 came back as index 9 (was 2)"), "{back}");
        let route = |protocol| KernelChange::RouteGone { table: 254, dst: "10.96.0.10/32".parse().unwrap(), protocol };
        assert!(d(route(RTPROT_HOSTMESH), &here).is_some());
        assert_eq!(d(route(4), &here), None, "another protocol's route");
        assert_eq!(host_devices(&w), ["eth0"]);
        // An address event matters on a host interface once node ports
        // answer there, and only when it changes what they answer on.
        let (known, new) = ("192.0.2.1".parse().unwrap(), "192.0.2.7".parse().unwrap());
        let event = |ifindex, ip, added| KernelChange::Address { ifindex, ip, added };
        assert_eq!(d(event(2, new, true), &here), None, "no node port");
        let mut w = want();
        let spec = crate::model::MapValue::from(vec![1, 0, 0, 0]);
        w.map_entries.insert(host_address_key(known), Owned { spec, owners: Default::default() });
        let why = drift(&event(2, new, true), &w, &hosts, &here).unwrap();
        assert!(why.contains("address 192.0.2.7 was added to host interface eth0"), "{why}");
        assert!(drift(&event(2, known, false), &w, &hosts, &here).is_some(), "a known one removed");
        assert_eq!(drift(&event(2, known, true), &w, &hosts, &here), None, "a refresh of a known one");
        assert_eq!(drift(&event(5, new, true), &w, &hosts, &here), None, "another interface");
    }
}
