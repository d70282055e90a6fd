//! `[daemon] service_health_listen`: GET /services/NAME says whether this
//! host has backends of an external_policy = "local" service serving, as
//! kube-proxy's health check node port does, so a router or a cloud load
//! balancer in front skips a host that would refuse the flows: 200 and
//! the count while there is one, 503 while there is none (or before the
//! daemon's first sync), 404 for a name that is no such service. The
//! daemon publishes the counts after every sync (the compile's
//! `Desired::local_backends`); the endpoint's thread reads the last.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, PoisonError, RwLock};

use hyper::StatusCode;

use crate::http_endpoint::{Endpoint, Kind, Reply, ServeError};

/// Per service name, its serving backends here.
type Counts = Arc<BTreeMap<String, usize>>;

/// Cheap to clone (shared).
#[derive(Debug, Clone, Default)]
pub(crate) struct ServiceHealth {
    /// `None` until the first publication.
    counts: Arc<RwLock<Option<Counts>>>,
}

impl ServiceHealth {
    /// What the last sync applied.
    pub(crate) fn publish(&self, counts: &BTreeMap<String, usize>) {
        let mut current = self.counts.write().unwrap_or_else(PoisonError::into_inner);
        if current.as_deref() != Some(counts) {
            *current = Some(Arc::new(counts.clone()));
        }
    }

    /// Serves GET /services/NAME on `addr` until the endpoint is dropped.
    pub(crate) fn serve(&self, addr: SocketAddr) -> Result<Endpoint, ServeError> {
        const KIND: Kind = Kind { what: "service health", key: "service_health_listen", thread: "hm-svc-health" };
        let shared = self.clone();
        Endpoint::start(KIND, addr, Arc::new(move |path: &str| shared.answer(path)))
    }

    fn answer(&self, path: &str) -> Reply {
        let Some(name) = path.strip_prefix("/services/").filter(|n| !n.is_empty() && !n.contains('/')) else {
            return Reply::text(StatusCode::NOT_FOUND, "hostmesh serves /services/NAME only\n".into());
        };
        let counts = self.counts.read().unwrap_or_else(PoisonError::into_inner).clone();
        let Some(counts) = counts else {
            return Reply::text(
                StatusCode::SERVICE_UNAVAILABLE,
                "hostmesh has not applied its configuration yet\n".into(),
            );
        };
        let Some(&n) = counts.get(name) else {
            return Reply::text(
                StatusCode::NOT_FOUND,
                "no service of that name has external_policy = \"local\" here\n".into(),
            );
        };
        let body = serde_json::json!({ "service": name, "local_backends": n }).to_string() + "\n";
        let status = if n > 0 { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
        Reply { status, content_type: "application/json", body }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn a_service_is_200_with_backends_here_503_without_and_before_the_first_sync_404_if_unknown() {
        let health = ServiceHealth::default();
        let server = health.serve("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = server.addr();
        assert!(get(addr, "/services/web").contains(" 503 "), "nothing published yet");
        health.publish(&BTreeMap::from([("web".to_string(), 2), ("dns".to_string(), 0)]));
        let ok = get(addr, "/services/web");
        assert!(ok.contains(" 200 ") && ok.contains(r#"{"local_backends":2,"service":"web"}"#), "{ok}");
        assert!(ok.contains("application/json"), "{ok}");
        assert!(get(addr, "/services/dns").contains(" 503 "), "none here");
        assert!(get(addr, "/services/other").contains(" 404 "));
        assert!(get(addr, "/metrics").contains(" 404 "));
        assert!(get(addr, "/services/web/x").contains(" 404 "));
        health.publish(&BTreeMap::from([("web".to_string(), 0)]));
        assert!(get(addr, "/services/web").contains(" 503 "), "the last publication counts");
    }

    #[test]
    fn a_taken_port_is_an_error_naming_the_key() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let Err(e) = ServiceHealth::default().serve(addr) else { panic!("bound a taken port") };
        assert!(e.to_string().contains("service_health_listen") && e.to_string().contains(&addr.to_string()), "{e}");
    }
}
