//! The configuration as compile sees it: each service with only the
//! backends that take new connections. A backend serves when its weight is
//! above 0 and, for a service with a `health_check`, it is up (or not yet
//! checked with `initial = "up"`). Services whose backends all serve are
//! not copied.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use super::{BackendHealth, BackendKey, Health};
use crate::abi::SvcKey;
use crate::backends::StoppedBackend;
use crate::config::{Config, InitialState, Protocol, Service};

/// `serving` as the configuration compile takes: the loaded one itself,
/// shared, when every backend serves.
pub(crate) fn serving_config(
    config: &std::sync::Arc<Config>,
    states: &BTreeMap<BackendKey, BackendHealth>,
) -> std::sync::Arc<Config> {
    match serving(config, states) {
        Cow::Borrowed(_) => std::sync::Arc::clone(config),
        Cow::Owned(c) => std::sync::Arc::new(c),
    }
}

pub(crate) fn serving<'c>(config: &'c Config, states: &BTreeMap<BackendKey, BackendHealth>) -> Cow<'c, Config> {
    let serves = |s: &Service, b: &crate::config::Backend| -> bool {
        if b.weight == 0 {
            return false;
        }
        let Some(check) = &s.health_check else { return true };
        let key = BackendKey { service: s.name.clone(), backend: b.addr };
        match states.get(&key).map(|h| h.health) {
            Some(Health::Up) => true,
            Some(Health::Down) => false,
            Some(Health::Unknown) | None => check.initial == InitialState::Up,
        }
    };
    let affected = |s: &Service| s.backends.iter().any(|b| !serves(s, b));
    if !config.services.iter().any(|s| affected(s)) {
        return Cow::Borrowed(config);
    }
    // The services are shared: only those whose serving set differs from
    // their configured one are copied.
    let mut out = config.clone();
    for s in &mut out.services {
        if affected(s) {
            let kept = s.backends.iter().filter(|b| serves(s, b)).cloned().collect();
            std::sync::Arc::make_mut(s).backends = kept;
        }
    }
    Cow::Owned(out)
}

/// The serving backends of each service with affinity, by service key.
pub(crate) fn affinity_serving(config: &Config) -> BTreeMap<SvcKey, BTreeSet<SocketAddr>> {
    config
        .services
        .iter()
        .filter(|s| s.affinity.is_some())
        .map(|s| (SvcKey::new(s.vip, s.port, s.protocol.number()), s.backends.iter().map(|b| b.addr).collect()))
        .collect()
}

/// The serving backends of each service whose leaving backends' flows
/// are dropped, with when: every UDP service (at once, `None`) and each
/// TCP service with a `drain_timeout` (that long after).
pub(crate) type DropSets = BTreeMap<(SocketAddr, Protocol), (Option<Duration>, BTreeSet<SocketAddr>)>;

pub(crate) fn drop_sets(config: &Config) -> DropSets {
    config
        .services
        .iter()
        .filter(|s| s.protocol == Protocol::Udp || s.drain_timeout.is_some())
        .map(|s| {
            let delay = if s.protocol == Protocol::Udp { None } else { s.drain_timeout };
            ((SocketAddr::new(s.vip, s.port), s.protocol), (delay, s.backends.iter().map(|b| b.addr).collect()))
        })
        .collect()
}

/// The backends that left a service between `before` and `after`
/// (stopped serving, or removed from it or with it), each with the delay
/// before its flows are dropped.
pub(crate) fn stopped(before: &DropSets, after: &DropSets) -> Vec<(StoppedBackend, Option<Duration>)> {
    let mut out = Vec::new();
    for (&(vip, protocol), (delay, backends)) in before {
        let now = after.get(&(vip, protocol));
        for &backend in backends {
            if !now.is_some_and(|(_, n)| n.contains(&backend)) {
                out.push((StoppedBackend { vip, protocol, backend }, *delay));
            }
        }
    }
    out
}

/// Whether `b` serves in `sets` (a backend that came back before its
/// drain timeout keeps its flows).
pub(crate) fn serves(sets: &DropSets, b: &StoppedBackend) -> bool {
    sets.get(&(b.vip, b.protocol)).is_some_and(|(_, set)| set.contains(&b.backend))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"
[[service]]
name = "plain"
vip = "10.0.0.1"
port = 80
backends = ["10.0.1.1:80", { address = "10.0.1.2:80", weight = 0 }]

[[service]]
name = "checked"
vip = "10.0.0.2"
port = 80
backends = ["10.0.1.1:80", "10.0.1.2:80", "10.0.1.3:80", "10.0.1.4:80"]
health_check = { kind = "tcp" }
"#;

    fn addrs(c: &Config, service: usize) -> Vec<String> {
        c.services[service].backends.iter().map(|b| b.addr.to_string()).collect()
    }

    fn state(health: Health) -> BackendHealth {
        BackendHealth::new(health, 0)
    }

    #[test]
    fn draining_down_and_unchecked_backends_take_no_new_connections() {
        let config = crate::config::from_text(TEXT);
        let key = |b: &str| BackendKey { service: "checked".into(), backend: b.parse().unwrap() };
        let states = BTreeMap::from([
            (key("10.0.1.1:80"), state(Health::Up)),
            (key("10.0.1.2:80"), state(Health::Down)),
            (key("10.0.1.3:80"), state(Health::Unknown)),
        ]);
        let out = serving(&config, &states);
        assert_eq!(addrs(&out, 0), ["10.0.1.1:80"], "weight 0 drains");
        assert_eq!(addrs(&out, 1), ["10.0.1.1:80"], "down, unknown and never seen do not serve");
    }

    #[test]
    fn initial_up_serves_before_the_first_check() {
        let config = crate::config::from_text(&TEXT.replace("kind = \"tcp\"", "kind = \"tcp\", initial = \"up\""));
        let out = serving(&config, &BTreeMap::new());
        assert_eq!(addrs(&out, 1).len(), 4);
    }

    #[test]
    fn backends_leaving_a_udp_service_stop_at_once_and_tcp_ones_only_with_a_drain_timeout() {
        let text = "[[service]]\nname = \"d\"\nvip = \"10.0.0.1\"\nport = 53\nprotocol = \"udp\"\nbackends = [\"10.0.1.1:53\", \"10.0.1.2:53\"]\n\n[[service]]\nname = \"w\"\nvip = \"10.0.0.1\"\nport = 80\nbackends = [\"10.0.1.1:80\"]\n\n[[service]]\nname = \"t\"\nvip = \"10.0.0.2\"\nport = 80\nbackends = [\"10.0.1.1:80\"]\ndrain_timeout = \"30s\"\n";
        let before = drop_sets(&crate::config::from_text(text));
        assert_eq!(before.len(), 2, "a TCP service without drain_timeout has nothing to drop");
        let after = drop_sets(&crate::config::from_text(&text.replace(", \"10.0.1.2:53\"", "")));
        let (vip, backend) = ("10.0.0.1:53".parse().unwrap(), "10.0.1.2:53".parse().unwrap());
        let gone = StoppedBackend { vip, protocol: Protocol::Udp, backend };
        assert_eq!(stopped(&before, &after), [(gone, None)]);
        assert!(!serves(&after, &gone) && serves(&before, &gone));
        assert_eq!(stopped(&after, &before), [], "a backend that comes has nothing to drop");
        let all = stopped(&before, &BTreeMap::new());
        assert_eq!(all.len(), 3, "a removed service's backends all left");
        assert!(all.contains(&(
            StoppedBackend {
                vip: "10.0.0.2:80".parse().unwrap(),
                protocol: Protocol::Tcp,
                backend: "10.0.1.1:80".parse().unwrap()
            },
            Some(Duration::from_secs(30))
        )));
    }

    #[test]
    fn a_configuration_where_everything_serves_is_not_copied() {
        let config = crate::config::from_text(
            "[[service]]\nname = \"a\"\nvip = \"10.0.0.1\"\nport = 80\nbackends = [\"10.0.1.1:80\"]\n",
        );
        assert!(matches!(serving(&config, &BTreeMap::new()), Cow::Borrowed(_)));
    }
}
