//! Where a backend of a service reached from the network is: on this
//! host, or another host's, as the route to it says. `external.rs` gives
//! another host's backends this host's address (HM_SNAT); `services.rs`
//! gives external_policy = "local" a table of the ones here.

use std::net::IpAddr;

use crate::config::{ExternalPolicy, Service};

use super::{BackendRoute, HostFacts};

/// Which backends of a service are on this host, as the routes to them
/// say (`snat_source`): for external_policy = "local".
pub(super) struct Reach {
    host: Vec<String>,
}

impl Reach {
    /// Given the host interfaces.
    pub(super) fn new(host: Vec<String>) -> Reach {
        Reach { host }
    }

    /// The indexes in `svc.backends` of its backends on this host, for a
    /// service with external_policy = "local" (`None` for any other).
    pub(super) fn local_backends(&self, svc: &Service, facts: &HostFacts) -> Option<Vec<usize>> {
        if svc.external_policy != ExternalPolicy::Local || !svc.serves_network() {
            return None;
        }
        let here = |ip: IpAddr| matches!(snat_source(facts.backend_routes.get(&ip), &self.host), Ok(None));
        Some((0..svc.backends.len()).filter(|&i| here(svc.backends[i].addr.ip())).collect())
    }
}

/// The source flows from the network to a backend take: none for a
/// backend on this host (one of its addresses, or reached through an
/// interface that is not a host interface: a VM or container here), which
/// then sees the client's address; else the host's address on the way
/// to it, so its replies come back here.
pub(super) fn snat_source(route: Option<&BackendRoute>, host: &[String]) -> Result<Option<IpAddr>, &'static str> {
    let route = route.ok_or("has no route")?;
    if route.local || route.dev.as_ref().is_none_or(|dev| !host.contains(dev)) {
        return Ok(None);
    }
    route.src.map(Some).ok_or("is reached through a host interface with no address")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(local: bool, dev: &str, src: Option<&str>) -> BackendRoute {
        BackendRoute { local, dev: Some(dev.to_string()), src: src.map(|s| s.parse().unwrap()) }
    }

    #[test]
    fn a_backend_reached_through_a_host_interface_gets_the_hosts_address_and_one_here_keeps_the_clients() {
        let host = vec!["eth0".to_string()];
        let remote = route(false, "eth0", Some("192.0.2.1"));
        assert_eq!(snat_source(Some(&remote), &host), Ok(Some("192.0.2.1".parse().unwrap())));
        // A VM or namespace behind a veth or bridge of this host.
        assert_eq!(snat_source(Some(&route(false, "veth7", Some("10.0.0.1"))), &host), Ok(None));
        // A process of this host.
        assert_eq!(snat_source(Some(&route(true, "lo", Some("192.0.2.1"))), &host), Ok(None));
        assert!(snat_source(None, &host).is_err());
        assert!(snat_source(Some(&route(false, "eth0", None)), &host).is_err());
    }
}
