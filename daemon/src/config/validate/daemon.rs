//! `[daemon]`: modes, paths, map capacities and timeouts.

use std::path::PathBuf;
use std::time::Duration;

use super::Check;
use crate::config::capacity::{Capacity, SIZE_KEYS};
use crate::config::error::Origin;
use crate::config::schema::RawDaemon;
use crate::config::types::*;
use crate::table_size::{is_prime, MAX_TABLE_SIZE, MIN_TABLE_SIZE};

const CTX: &str = "[daemon]";

impl Check<'_, '_> {
    pub(super) fn daemon(&mut self, d: RawDaemon, origin: Origin) -> DaemonSettings {
        let mut out = DaemonSettings { origin: Some(origin), ..DaemonSettings::default() };
        self.daemon_modes(&d, &mut out);
        self.daemon_paths(&d, &mut out);
        self.daemon_sizes(&d, &mut out);
        self.daemon_timeouts(&d, &mut out);
        self.daemon_metrics(&d, &mut out);
        self.daemon_ports(&d, &mut out);
        out
    }

    /// `node_port_range`, `snat_port_range` (which must not overlap), and
    /// `service_health_listen`.
    fn daemon_ports(&mut self, d: &RawDaemon, out: &mut DaemonSettings) {
        if let Some(v) = &d.node_port_range {
            if let Some(r) = self.port_range("node_port_range", v) {
                out.node_port_range = r;
            }
        }
        if let Some(v) = &d.snat_port_range {
            if let Some(r) = self.port_range("snat_port_range", v) {
                out.snat_port_range = r;
            }
        }
        if out.node_port_range.overlaps(&out.snat_port_range) {
            let span = d.snat_port_range.as_ref().or(d.node_port_range.as_ref()).map(|v| v.span()).unwrap_or_default();
            self.fail(
                &span,
                "snat_port_range",
                format!(
                    "{CTX}: snat_port_range {} overlaps node_port_range {}; a port cannot be both",
                    out.snat_port_range, out.node_port_range
                ),
            );
        }
        if let Some(v) = &d.service_health_listen {
            self.service_health_listen(v, out);
        }
    }

    /// "off" (the default) or an address with a port, not the metrics
    /// endpoint's: upstream balancers on the network ask it, so it may
    /// listen on any address.
    fn service_health_listen(&mut self, v: &toml::Spanned<String>, out: &mut DaemonSettings) {
        let text = v.get_ref().as_str();
        if text == "off" {
            return;
        }
        match text.parse::<std::net::SocketAddr>() {
            Ok(a) if a.port() == 0 => self.fail(
                &v.span(),
                "service_health_listen",
                format!("{CTX}: service_health_listen \"{text}\" needs a port other than 0"),
            ),
            Ok(a) if out.metrics_listen.is_some_and(|m| m.port() == a.port() && (m.ip() == a.ip() || a.ip().is_unspecified() || m.ip().is_unspecified())) => self.fail(
                &v.span(),
                "service_health_listen",
                format!("{CTX}: service_health_listen {a} takes the metrics endpoint's port; use another port"),
            ),
            Ok(a) => out.service_health_listen = Some(a),
            Err(_) => self.fail(
                &v.span(),
                "service_health_listen",
                format!("{CTX}: service_health_listen \"{text}\" is not \"off\" or an address with a port (\"0.0.0.0:10256\", \"[::]:10256\")"),
            ),
        }
    }

    /// "FIRST-LAST", 1 <= FIRST <= LAST <= 65535.
    fn port_range(&mut self, key: &str, v: &toml::Spanned<String>) -> Option<PortRange> {
        let text = v.get_ref();
        let parsed = text
            .split_once('-')
            .and_then(|(a, b)| Some((a.trim().parse::<u16>().ok()?, b.trim().parse::<u16>().ok()?)));
        match parsed {
            Some((first, last)) if first >= 1 && first <= last => Some(PortRange { first, last }),
            _ => {
                self.fail(
                    &v.span(),
                    key,
                    format!("{CTX}: {key} \"{text}\" is not a range of ports FIRST-LAST (\"30000-32767\"), 1 to 65535"),
                );
                None
            }
        }
    }

    fn daemon_metrics(&mut self, d: &RawDaemon, out: &mut DaemonSettings) {
        if let Some(v) = &d.metrics_listen {
            match v.get_ref().as_str() {
                "off" => out.metrics_listen = None,
                text => match text.parse::<std::net::SocketAddr>() {
                    Ok(a) if a.port() != 0 => out.metrics_listen = Some(a),
                    _ => self.fail(
                        &v.span(),
                        "metrics_listen",
                        format!("{CTX}: metrics_listen \"{text}\" is not \"off\" or an address with a port (\"127.0.0.1:9853\", \"[::1]:9853\")"),
                    ),
                },
            }
        }
        if let Some(v) = &d.metrics_backend_limit {
            match u32::try_from(*v.get_ref()) {
                Ok(n) if n <= 1_000_000 => out.metrics_backend_limit = n,
                _ => self.fail(
                    &v.span(),
                    "metrics_backend_limit",
                    format!("{CTX}: metrics_backend_limit {} is out of range; use 0 to 1000000", v.get_ref()),
                ),
            }
        }
    }

    fn daemon_modes(&mut self, d: &RawDaemon, out: &mut DaemonSettings) {
        if let Some(v) = &d.connect_time_lb {
            let table: Vec<(&str, CtlbMode)> = CtlbMode::ALL.iter().map(|m| (m.name(), *m)).collect();
            if let Some(mode) = self.choice(CTX, "connect_time_lb", v, &table) {
                out.connect_time_lb = mode;
            }
        }
        if let Some(v) = &d.mesh_backend {
            let table = [
                ("auto", MeshBackend::Auto),
                ("sk_lookup", MeshBackend::SkLookup),
                ("nftables", MeshBackend::Nftables),
            ];
            if let Some(backend) = self.choice(CTX, "mesh_backend", v, &table) {
                out.mesh_backend = backend;
            }
        }
        if let Some(v) = &d.tc_attach {
            let table = [("auto", TcAttachPref::Auto), ("netlink", TcAttachPref::Netlink)];
            if let Some(pref) = self.choice(CTX, "tc_attach", v, &table) {
                out.tc_attach = pref;
            }
        }
    }

    fn daemon_paths(&mut self, d: &RawDaemon, out: &mut DaemonSettings) {
        if let Some(list) = &d.host_interfaces {
            let mut names = Vec::new();
            for ifname in list {
                let name = ifname.get_ref();
                if is_interface_name(name) {
                    names.push(name.clone());
                } else {
                    self.fail(
                        &ifname.span(),
                        "host_interfaces",
                        format!("{CTX}: host_interfaces entry \"{name}\" is not a valid interface name"),
                    );
                }
            }
            out.host_interfaces = Some(names);
        }
        if let Some(v) = &d.cgroup {
            let path = PathBuf::from(v.get_ref());
            if path.is_absolute() {
                out.cgroup = Some(path);
            } else {
                self.fail(&v.span(), "cgroup", format!("{CTX}: cgroup \"{}\" must be an absolute path", v.get_ref()));
            }
        }
    }

    fn daemon_sizes(&mut self, d: &RawDaemon, out: &mut DaemonSettings) {
        if let Some(v) = &d.maglev_table_size {
            if let Some(n) = self.table_size(CTX, v) {
                out.maglev_table_size = Some(n);
            }
        }
        for k in &SIZE_KEYS {
            let Some(v) = raw_size(d, k.capacity) else { continue };
            match u32::try_from(*v.get_ref()) {
                Ok(n) if (k.min..=k.max).contains(&n) => out.sizes.set(k.capacity, n),
                _ => self.fail(
                    &v.span(),
                    k.key,
                    format!("{CTX}: {} {} is out of range; use {} to {}", k.key, v.get_ref(), k.min, k.max),
                ),
            }
        }
    }

    fn daemon_timeouts(&mut self, d: &RawDaemon, out: &mut DaemonSettings) {
        if let Some(v) = &d.resync_interval {
            let range = (Duration::from_millis(100), Duration::MAX);
            if let Some(t) = self.duration_within(CTX, "resync_interval", v, range, "is too short; use at least 100ms")
            {
                out.resync_interval = t;
            }
        }
        let range = (Duration::from_secs(1), Duration::from_secs(u64::from(u32::MAX)));
        if let Some(v) = &d.conntrack_tcp_timeout {
            if let Some(t) =
                self.duration_within(CTX, "conntrack_tcp_timeout", v, range, "is out of range; use 1s to 49710d")
            {
                out.conntrack_tcp_timeout = t;
            }
        }
        if let Some(v) = &d.conntrack_udp_timeout {
            if let Some(t) =
                self.duration_within(CTX, "conntrack_udp_timeout", v, range, "is out of range; use 1s to 49710d")
            {
                out.conntrack_udp_timeout = t;
            }
        }
    }

    /// `maglev_table_size`, here or on a service: a prime within the limits.
    pub(super) fn table_size(&mut self, ctx: &str, v: &toml::Spanned<i64>) -> Option<u32> {
        let n = *v.get_ref();
        let (min, max) = (i64::from(MIN_TABLE_SIZE), i64::from(MAX_TABLE_SIZE));
        if (min..=max).contains(&n) && is_prime(n as u32) {
            Some(n as u32)
        } else {
            self.fail(
                &v.span(),
                "maglev_table_size",
                format!("{ctx}: maglev_table_size {n} must be a prime number from {min} to {max} (for example 251, 1021 or 4093)"),
            );
            None
        }
    }
}

/// The raw value of a capacity key.
fn raw_size(d: &RawDaemon, c: Capacity) -> Option<&toml::Spanned<i64>> {
    match c {
        Capacity::Services => d.service_map_size.as_ref(),
        Capacity::Backends => d.backend_map_size.as_ref(),
        Capacity::MaglevChunks => d.maglev_map_size.as_ref(),
        Capacity::Conntrack => d.conntrack_size.as_ref(),
        Capacity::ReverseSock => d.reverse_sock_map_size.as_ref(),
        Capacity::Affinity => d.affinity_map_size.as_ref(),
        Capacity::Mesh => d.mesh_map_size.as_ref(),
    }
}

fn is_interface_name(name: &str) -> bool {
    !name.is_empty() && name.len() < 16 && !name.contains(['/', ' ', '\0']) && name != "." && name != ".."
}
