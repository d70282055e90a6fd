//! What `hostmesh explain` says: the plain sentences first, then the
//! details. The same struct is printed as text or as JSON (`--json`).

use std::net::{IpAddr, SocketAddr};

use serde::Serialize;

use crate::backends::netlink::RouteTo;

/// Which part of hostmesh handles the address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum PathKind {
    /// Connect-time load balancing in the cgroup programs.
    ConnectTime,
    /// The bpfnat veth path.
    Veth,
    /// A mesh redirect to a local sidecar.
    Mesh,
    /// A gateway peer, over the tunnel.
    Gateway,
    /// A node port: clients on other machines (and this host's own
    /// processes) reach it on the host interfaces' addresses.
    NodePort,
    /// Nothing: the kernel routes it as it would without hostmesh.
    None,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct BackendView {
    pub address: SocketAddr,
    pub weight: Option<u32>,
    /// Slots of the Maglev table, and their share of it.
    pub slots: usize,
    pub share: f64,
    /// up, down, unknown, draining (from the status file; "up" for an
    /// unchecked backend with a weight).
    pub state: String,
    pub connections: u64,
    pub bytes_to: u64,
    pub bytes_from: u64,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct ServiceView {
    pub name: Option<String>,
    pub origin: Option<String>,
    pub id: u32,
    pub table_size: u32,
    pub affinity_timeout_s: Option<u32>,
    pub backends: Vec<BackendView>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct MeshView {
    pub name: Option<String>,
    pub redirect_port: u16,
    /// The entry's port (0: every port of the VIP).
    pub port: u16,
    /// What the status says of its listener.
    pub listener: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct GatewayView {
    pub peer: Option<String>,
    pub endpoint: IpAddr,
    pub up: bool,
    /// The leg to the endpoint goes through WireGuard.
    pub encrypted: bool,
}

/// The backend (or listener, or endpoint) a given source reaches.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Prediction {
    pub source: String,
    pub backend: Option<SocketAddr>,
    /// How it is chosen: "affinity", "hash", "listener", "endpoint", or
    /// "random" (a socket's cookie: any backend, by share).
    pub by: String,
}

/// Whose an attached program is, by its build mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum BuildOf {
    /// The mark of an object this binary carries.
    This,
    /// Another mark: another build's probes.
    Other,
    /// No mark: a build from before marks.
    Unmarked,
    /// The mark could not be read (privilege).
    Unknown,
}

/// A program on the path, where it is attached and whose it is.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ProgramView {
    pub program: String,
    /// Where, in words ("hm_natout on tc ingress of hm-natout").
    pub hook: String,
    /// "link" or "tc filter".
    pub via: String,
    pub id: u32,
    pub tag: Option<String>,
    pub mark: Option<String>,
    pub build: BuildOf,
    /// False when the hook is gone (the program runs nowhere).
    pub live: bool,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Explanation {
    pub target: String,
    pub path: PathKind,
    pub sentences: Vec<String>,
    pub service: Option<ServiceView>,
    pub mesh: Option<MeshView>,
    pub gateway: Option<GatewayView>,
    pub from: Option<Prediction>,
    pub route: Option<RouteTo>,
    /// The programs on the path.
    pub programs: Vec<ProgramView>,
    /// The kernel objects involved, one line each.
    pub kernel: Vec<String>,
}

impl Explanation {
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        for s in &self.sentences {
            out.push_str(s);
            out.push('\n');
        }
        if let Some(s) = &self.service {
            out.push_str(&format!(
                "\nservice {} (id {}, Maglev table of {} slots{})\n",
                s.name.as_deref().unwrap_or("(not in the config)"),
                s.id,
                s.table_size,
                s.affinity_timeout_s.map(|t| format!(", client-ip affinity for {t} s")).unwrap_or_default()
            ));
            out.push_str(&format!(
                "  {:<40} {:>6} {:>6} {:>7}  {:<8} {:>11} {:>12} {:>12}\n",
                "backend", "weight", "slots", "share", "state", "connections", "bytes to", "bytes from"
            ));
            for b in &s.backends {
                out.push_str(&format!(
                    "  {:<40} {:>6} {:>6} {:>6.1}%  {:<8} {:>11} {:>12} {:>12}\n",
                    b.address.to_string(),
                    b.weight.map_or("-".to_string(), |w| w.to_string()),
                    b.slots,
                    b.share * 100.0,
                    b.state,
                    b.connections,
                    b.bytes_to,
                    b.bytes_from
                ));
            }
        }
        if !self.kernel.is_empty() {
            out.push_str("\nkernel:\n");
            for k in &self.kernel {
                out.push_str(&format!("  {k}\n"));
            }
        }
        out
    }
}
