//! Every metric family: its name, help text and series, rendered at
//! scrape time from the published snapshot, the event counts and the
//! probes' counters. This is the one table of the metric set (the
//! README's "Metrics" section lists it for operators).

use std::collections::HashMap;
use std::fmt::Error;
use std::net::SocketAddr;
use std::sync::{Arc, PoisonError};

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use super::{Shared, Snapshot};
use crate::backends::bpf::traffic::PairTraffic;
use crate::state::BackendState;

/// Per-backend series say this when they may be summed per service.
const COLLAPSE: &str = "With more than [daemon] metrics_backend_limit backends configured in all, one series per \
                        service with backend=\"all\".";

#[derive(Debug)]
pub(super) struct Collector(pub(super) Arc<Shared>);

type Labels = Vec<(&'static str, String)>;

fn gauges(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (Labels, i64)>,
) -> Result<(), Error> {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in rows {
        ConstGauge::new(v).encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

/// `name` without `_total`: the encoder adds it to counters.
fn counters(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (Labels, u64)>,
) -> Result<(), Error> {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in rows {
        ConstCounter::new(v).encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

fn state_name(s: BackendState) -> &'static str {
    match s {
        BackendState::Up => "up",
        BackendState::Down => "down",
        BackendState::Unknown => "unknown",
        BackendState::Draining => "draining",
    }
}

impl prometheus_client::collector::Collector for Collector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), Error> {
        let snap = self.0.current();
        let events = self.0.events.lock().unwrap_or_else(PoisonError::into_inner).clone();
        daemon(&mut enc, &snap)?;
        backends(&mut enc, &snap)?;
        traffic(&mut enc, &snap, &self.0)?;
        wireguard(&mut enc)?;
        let kinds = [("full", &self.0.sync_full), ("incremental", &self.0.sync_incremental)];
        let mut m = enc.encode_descriptor(
            "hostmesh_sync_duration_seconds",
            "How long each sync took: full (SIGHUP, the periodic resync, a repair) or incremental (an edit).",
            None,
            MetricType::Histogram,
        )?;
        for (kind, h) in kinds {
            h.encode(m.encode_family(&vec![("kind", kind.to_string())])?)?;
        }
        counters(
            &mut enc,
            "hostmesh_sync_errors",
            "Steps of syncs that failed, by the kind of object they were for (`hostmesh status` names the objects).",
            // Every kind from the start (at 0), so a rate sees the first error.
            crate::model::Object::KINDS
                .into_iter()
                .chain(events.sync_errors.contains_key("other").then_some("other"))
                .map(|k| (vec![("object_kind", k.to_string())], events.sync_errors.get(k).copied().unwrap_or(0))),
        )?;
        counters(
            &mut enc,
            "hostmesh_config_reloads",
            "Reads of the config dir by outcome: applied (every file), rejected (some file rejected), failed (the dir \
             could not be read).",
            ["applied", "rejected", "failed"]
                .map(|o| (vec![("outcome", o.to_string())], events.reloads.get(o).copied().unwrap_or(0))),
        )?;
        counters(
            &mut enc,
            "hostmesh_gateway_peer_transitions",
            "Times each gateway peer went up or down.",
            snap.peers
                .keys()
                .map(|p| (vec![("peer", p.clone())], events.peer_transitions.get(p).copied().unwrap_or(0))),
        )?;
        counters(
            &mut enc,
            "hostmesh_gateway_failovers",
            "Times traffic moved to another gateway of a list: path \"site\" is a member's own site, \"peer/NAME\" \
             a peer's endpoints (a move back counts).",
            events.failovers.iter().map(|(path, n)| (vec![("path", path.clone())], *n)),
        )?;
        gauges(
            &mut enc,
            "hostmesh_gateway_active",
            "1 for the gateway that carries a path's traffic (gateway=\"none\" and 0 when every one is down).",
            events.gateway_in_use.iter().map(|(path, gw)| {
                let label = gw.map_or_else(|| "none".to_string(), |ip| ip.to_string());
                (vec![("path", path.clone()), ("gateway", label)], i64::from(gw.is_some()))
            }),
        )
    }
}

/// `hm-wg0`'s peers, read at the scrape (handshakes and bytes move between
/// syncs); nothing without the device.
fn wireguard(enc: &mut DescriptorEncoder) -> Result<(), Error> {
    let Ok(peers) = crate::backends::netlink::wireguard::peers(crate::model::encryption::WG) else { return Ok(()) };
    let label = |p: &crate::backends::netlink::wireguard::PeerState| {
        vec![("endpoint", p.endpoint.map_or("none".to_string(), |e| e.ip().to_string()))]
    };
    gauges(
        enc,
        "hostmesh_wireguard_last_handshake_seconds",
        "Unix time of each encrypted peer gateway's last WireGuard handshake (0: none yet).",
        peers.iter().map(|p| (label(p), p.last_handshake_s)),
    )?;
    counters(
        enc,
        "hostmesh_wireguard_received_bytes",
        "Bytes received from each encrypted peer gateway through WireGuard.",
        peers.iter().map(|p| (label(p), p.rx_bytes)),
    )?;
    counters(
        enc,
        "hostmesh_wireguard_sent_bytes",
        "Bytes sent to each encrypted peer gateway through WireGuard.",
        peers.iter().map(|p| (label(p), p.tx_bytes)),
    )
}

fn daemon(enc: &mut DescriptorEncoder, snap: &Snapshot) -> Result<(), Error> {
    let (kernel, tc) = snap.kernel.clone().unwrap_or_default();
    gauges(
        enc,
        "hostmesh_build_info",
        "Always 1: this daemon's version, the kernel release and how TC programs are attached (tcx or netlink).",
        [(vec![("version", env!("CARGO_PKG_VERSION").to_string()), ("kernel", kernel), ("tc_attach", tc)], 1)],
    )?;
    gauges(
        enc,
        "hostmesh_services",
        "Services in force, by the path that handles them: connect_time (cgroup programs) or veth (bpfnat).",
        snap.services.iter().map(|(k, n)| (vec![("kind", k.to_string())], *n as i64)),
    )?;
    gauges(
        enc,
        "hostmesh_config_files",
        "Config files by state: applied, or rejected (`hostmesh status` says why).",
        snap.files.iter().map(|(s, n)| (vec![("state", s.to_string())], *n as i64)),
    )?;
    gauges(
        enc,
        "hostmesh_bpf_map_entries",
        "Entries of the maps hostmesh writes, as the last sync left them; conntrack's as the last sweep counted.",
        snap.maps.iter().filter_map(|m| Some((vec![("map", m.map.to_string())], m.entries? as i64))),
    )?;
    gauges(
        enc,
        "hostmesh_bpf_map_capacity",
        "The most entries each map holds ([daemon] *_map_size keys).",
        snap.maps.iter().map(|m| (vec![("map", m.map.to_string())], m.capacity as i64)),
    )?;
    gauges(
        enc,
        "hostmesh_conntrack_entries",
        "Conntrack entries as the last sweep counted: the veth path's (open and closing flows), and flows from \
         the network to node ports and external VIPs (two entries each); connect-time LB keeps no conntrack.",
        [
            (vec![("path", "veth".to_string())], snap.conntrack_veth as i64),
            (vec![("path", "external".to_string())], snap.conntrack_external as i64),
        ],
    )?;
    gauges(
        enc,
        "hostmesh_snat_ports_in_use",
        "Source ports of [daemon] snat_port_range held by flows from the network to another host's backends, as \
         the last sweep counted.",
        [(vec![], snap.snat_ports as i64)],
    )?;
    gauges(
        enc,
        "hostmesh_mesh_listener_registered",
        "1 when the sidecar listener of a mesh entry is registered, 0 when none listens.",
        snap.meshes.iter().map(|(m, up)| (vec![("mesh", m.clone())], i64::from(*up))),
    )?;
    gauges(
        enc,
        "hostmesh_gateway_peer_up",
        "1 when a gateway peer answers its probes.",
        snap.peers.iter().map(|(p, up)| (vec![("peer", p.clone())], i64::from(*up))),
    )
}

fn backends(enc: &mut DescriptorEncoder, snap: &Snapshot) -> Result<(), Error> {
    const STATES: [BackendState; 4] =
        [BackendState::Up, BackendState::Down, BackendState::Unknown, BackendState::Draining];
    // Rows come service by service (config order): one count per run.
    let mut by_state: Vec<(&str, [i64; 4])> = Vec::new();
    for b in &snap.backends {
        if by_state.last().is_none_or(|(s, _)| *s != b.service) {
            by_state.push((&b.service, [0; 4]));
        }
        let counts = &mut by_state.last_mut().expect("pushed above").1;
        counts[STATES.iter().position(|s| *s == b.state).expect("every state is listed")] += 1;
    }
    gauges(
        enc,
        "hostmesh_backends",
        "Backends of each service by state: up (serving; unchecked backends with a weight), down (failed its \
         health check), unknown (not checked yet), draining (weight 0).",
        by_state.iter().flat_map(|(svc, counts)| {
            STATES
                .iter()
                .zip(counts)
                .map(|(s, n)| (vec![("service", svc.to_string()), ("state", state_name(*s).to_string())], *n))
        }),
    )?;
    let help = format!("1 when a backend takes new connections (up), 0 when down, unknown or draining. {COLLAPSE}");
    let all = || "all".to_string();
    let rows: Vec<(Labels, i64)> = if snap.collapsed() {
        by_state.iter().map(|(s, counts)| (vec![("service", s.to_string()), ("backend", all())], counts[0])).collect()
    } else {
        snap.backends
            .iter()
            .map(|b| {
                let labels = vec![("service", b.service.clone()), ("backend", b.backend.to_string())];
                (labels, i64::from(b.state == BackendState::Up))
            })
            .collect()
    };
    gauges(enc, "hostmesh_backend_up", &help, rows)
}

/// The probes' counters of every configured (service, backend) pair,
/// summed over a service's VIP:port keys (a TCP and a UDP service may
/// share a name), in config order; pairs no longer configured are left
/// out.
fn traffic(enc: &mut DescriptorEncoder, snap: &Snapshot, shared: &Shared) -> Result<(), Error> {
    use crate::abi::BackendStats;
    // A read error leaves the counts at zero for this scrape; the next
    // one reads again.
    let pairs: Vec<PairTraffic> = shared.traffic.read().unwrap_or_default();
    let mut per: HashMap<(&str, SocketAddr), BackendStats> = HashMap::with_capacity(pairs.len());
    for p in &pairs {
        let Some(service) = snap.names.get(&p.service) else { continue };
        let e = per.entry((service.as_str(), p.backend)).or_default();
        *e = *e + p.stats;
    }
    // (service, backend label, counts) in config order; per service when
    // collapsed.
    let mut rows: Vec<(&str, String, BackendStats)> = Vec::with_capacity(snap.backends.len());
    let collapsed = snap.collapsed();
    for b in &snap.backends {
        let st = per.get(&(b.service.as_str(), b.backend)).copied().unwrap_or_default();
        match rows.last_mut() {
            Some((svc, _, sum)) if collapsed && *svc == b.service => *sum = *sum + st,
            _ => rows.push((&b.service, if collapsed { "all".to_string() } else { b.backend.to_string() }, st)),
        }
    }
    let mut per_service: Vec<(&str, u64, u64)> = Vec::new();
    for (svc, _, st) in &rows {
        match per_service.last_mut() {
            Some((s, ct, veth)) if s == svc => {
                *ct += st.ctlb_connections;
                *veth += st.veth_connections;
            }
            _ => per_service.push((svc, st.ctlb_connections, st.veth_connections)),
        }
    }
    counters(
        enc,
        "hostmesh_service_connections",
        "Connections each service sent to a backend, by path: connect_time (a connect(), or an unconnected UDP \
         sendmsg(), rewritten in the cgroup programs) or veth (a new flow of the bpfnat path).",
        per_service.iter().flat_map(|(svc, ct, veth)| {
            [("connect_time", *ct), ("veth", *veth)]
                .map(|(path, n)| (vec![("service", svc.to_string()), ("path", path.to_string())], n))
        }),
    )?;
    let pair = |svc: &str, backend: &str| vec![("service", svc.to_string()), ("backend", backend.to_string())];
    counters(
        enc,
        "hostmesh_backend_connections",
        &format!("Connections each backend got from a service, on both paths. {COLLAPSE}"),
        rows.iter().map(|(svc, b, st)| (pair(svc, b), st.ctlb_connections + st.veth_connections)),
    )?;
    counters(
        enc,
        "hostmesh_backend_bytes",
        &format!(
            "IP bytes between clients and each backend through the veth path, by direction (to_backend, \
             from_backend). Connect-time LB hands sockets to the kernel and cannot count bytes. {COLLAPSE}"
        ),
        rows.iter().flat_map(|(svc, b, st)| {
            [("to_backend", st.bytes_to), ("from_backend", st.bytes_from)].map(|(dir, n)| {
                let mut l = pair(svc, b);
                l.push(("direction", dir.to_string()));
                (l, n)
            })
        }),
    )
}
