//! The TOML schema of one drop-in file, exactly as written (README.md,
//! "Configuration"). Every value keeps its span so validation can
//! point at file:line:column. Nothing here interprets values; `validate`
//! turns these into typed configuration.

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use toml::Spanned;

pub(super) type S<T> = Spanned<T>;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFile {
    pub daemon: Option<S<RawDaemon>>,
    #[serde(default)]
    pub service: Vec<S<RawService>>,
    #[serde(default)]
    pub mesh: Vec<S<RawMesh>>,
    pub gateway: Option<S<RawGateway>>,
    #[serde(default)]
    pub peer: Vec<S<RawPeer>>,
    #[serde(default)]
    pub member: Vec<S<RawMember>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDaemon {
    pub connect_time_lb: Option<S<String>>,
    pub host_interfaces: Option<Vec<S<String>>>,
    pub cgroup: Option<S<String>>,
    pub mesh_backend: Option<S<String>>,
    /// hostmesh extension: how often kernel state is re-read and repaired.
    pub resync_interval: Option<S<String>>,
    /// hostmesh extension: default Maglev table size (prime).
    pub maglev_table_size: Option<S<i64>>,
    /// hostmesh extension: idle timeouts of flows on the bpfnat veth path.
    pub conntrack_tcp_timeout: Option<S<String>>,
    pub conntrack_udp_timeout: Option<S<String>>,
    /// hostmesh extension: map capacities (config/capacity.rs).
    pub service_map_size: Option<S<i64>>,
    pub backend_map_size: Option<S<i64>>,
    pub maglev_map_size: Option<S<i64>>,
    pub conntrack_size: Option<S<i64>>,
    pub reverse_sock_map_size: Option<S<i64>>,
    pub affinity_map_size: Option<S<i64>>,
    pub mesh_map_size: Option<S<i64>>,
    /// hostmesh extension: "auto" (TCX where the kernel has it) or
    /// "netlink" (clsact filters).
    pub tc_attach: Option<S<String>>,
    /// hostmesh extension: the Prometheus endpoint, "IP:PORT" or "off".
    pub metrics_listen: Option<S<String>>,
    pub metrics_backend_limit: Option<S<i64>>,
    /// Node ports must fall in it ("30000-32767"); reserved for the host.
    pub node_port_range: Option<S<String>>,
    /// hostmesh extension: the source ports of flows from the network to
    /// a backend on another host ("61000-65535"); reserved for the host.
    pub snat_port_range: Option<S<String>>,
    pub service_health_listen: Option<S<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawService {
    pub name: S<String>,
    pub vip: S<String>,
    pub port: S<i64>,
    pub protocol: Option<S<String>>,
    #[serde(default)]
    pub backends: Vec<S<RawBackend>>,
    pub node_port: Option<S<i64>>,
    pub external: Option<S<bool>>,
    pub external_policy: Option<S<String>>,
    pub health_check: Option<S<RawHealthCheck>>,
    pub affinity: Option<S<String>>,
    pub affinity_timeout: Option<S<String>>,
    pub drain_timeout: Option<S<String>>,
    /// hostmesh extension: this service's Maglev table size (prime).
    pub maglev_table_size: Option<S<i64>>,
}

/// `health_check = { kind = ..., ... }`; which keys a kind takes is
/// checked in `validate::health_check`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHealthCheck {
    pub kind: S<String>,
    pub interval: Option<S<String>>,
    pub timeout: Option<S<String>>,
    pub rise: Option<S<i64>>,
    pub fall: Option<S<i64>>,
    pub port: Option<S<i64>>,
    pub source: Option<S<String>>,
    pub initial: Option<S<String>>,
    /// http
    pub path: Option<S<String>>,
    pub host: Option<S<String>>,
    /// http: a status range ("200-399"); udp: the payload the answer holds.
    pub expect: Option<S<String>>,
    /// udp
    pub send: Option<S<String>>,
    /// exec
    pub command: Option<S<Vec<S<String>>>>,
}

/// A backend is either `"ip:port"` or `{ address = "ip:port", weight = N }`.
#[derive(Debug)]
pub(super) struct RawBackend {
    pub address: S<String>,
    pub weight: Option<S<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMesh {
    pub name: S<String>,
    pub vip: S<String>,
    pub port: S<i64>,
    pub protocol: Option<S<String>>,
    pub redirect_port: S<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGateway {
    pub role: S<String>,
    pub local_ip: S<String>,
    pub gateway_ip: Option<S<String>>,
    pub gateway_ips: Option<S<Vec<S<String>>>>,
    pub vni: S<i64>,
    pub udp_port: Option<S<i64>>,
    /// hostmesh extensions: peer health probes between gateways.
    pub probe_interval: Option<S<String>>,
    pub probe_loss: Option<S<i64>>,
    pub probe_port: Option<S<i64>>,
    pub probe_rise: Option<S<i64>>,
    pub preempt: Option<S<bool>>,
    /// hostmesh extensions: WireGuard between gateways.
    pub private_key_file: Option<S<String>>,
    pub wireguard_port: Option<S<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPeer {
    pub name: S<String>,
    pub endpoint: Option<S<String>>,
    pub endpoints: Option<S<Vec<S<RawEndpoint>>>>,
    pub cidrs: Vec<S<String>>,
    /// hostmesh extensions: WireGuard between gateways.
    pub encryption: Option<S<String>>,
    pub public_key: Option<S<String>>,
    pub wireguard_port: Option<S<i64>>,
}

/// A peer's gateway is either `"ip"` or `{ address = "ip", public_key =
/// "…" }` (each gateway of an encrypted peer has its own key).
#[derive(Debug)]
pub(super) struct RawEndpoint {
    pub address: S<String>,
    pub public_key: Option<S<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMember {
    pub name: S<String>,
    pub endpoint: S<String>,
    pub cidrs: Vec<S<String>>,
}

impl<'de> Deserialize<'de> for RawBackend {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(BackendVisitor)
    }
}

struct BackendVisitor;

impl<'de> Visitor<'de> for BackendVisitor {
    type Value = RawBackend;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(r#"a backend as "ip:port" or { address = "ip:port", weight = N }"#)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<RawBackend, E> {
        // A plain string has no span of its own here; the caller's
        // Spanned<RawBackend> carries it, and validation uses that one.
        Ok(RawBackend { address: Spanned::new(0..0, v.to_string()), weight: None })
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawBackend, A::Error> {
        let mut address = None;
        let mut weight = None;
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "address" => address = Some(map.next_value::<S<String>>()?),
                "weight" => weight = Some(map.next_value::<S<i64>>()?),
                other => return Err(de::Error::unknown_field(other, &["address", "weight"])),
            }
        }
        let address = address.ok_or_else(|| de::Error::missing_field("address"))?;
        Ok(RawBackend { address, weight })
    }
}

impl<'de> Deserialize<'de> for RawEndpoint {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(EndpointVisitor)
    }
}

struct EndpointVisitor;

impl<'de> Visitor<'de> for EndpointVisitor {
    type Value = RawEndpoint;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(r#"an endpoint as "ip" or { address = "ip", public_key = "…" }"#)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<RawEndpoint, E> {
        // As for backends: the caller's Spanned<RawEndpoint> has the span.
        Ok(RawEndpoint { address: Spanned::new(0..0, v.to_string()), public_key: None })
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawEndpoint, A::Error> {
        let mut address = None;
        let mut public_key = None;
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "address" => address = Some(map.next_value::<S<String>>()?),
                "public_key" => public_key = Some(map.next_value::<S<String>>()?),
                other => return Err(de::Error::unknown_field(other, &["address", "public_key"])),
            }
        }
        let address = address.ok_or_else(|| de::Error::missing_field("address"))?;
        Ok(RawEndpoint { address, public_key })
    }
}
