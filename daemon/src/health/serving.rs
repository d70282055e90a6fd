//! The configuration as compile sees it: each service with only the
//! backends that take new connections. A backend serves when its weight is
//! above 0 and, for a service with a `health_check`, it is up (or not yet
//! checked with `initial = "up"`). Services whose backends all serve are
//! not copied.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use super::{BackendHealth, BackendKey, Health};
use crate::backends::StoppedBackend;
use crate::config::{Config, InitialState, Protocol, Service};

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
    if !config.services.iter().any(affected) {
        return Cow::Borrowed(config);
    }
    let mut out = config.clone();
    for s in &mut out.services {
        if s.health_check.is_some() || s.backends.iter().any(|b| b.weight == 0) {
            let kept = s.backends.iter().filter(|b| serves(s, b)).cloned().collect();
            s.backends = kept;
        }
    }
    Cow::Owned(out)
}

/// The serving backends of each UDP service, by VIP:port.
pub(crate) fn udp_serving(config: &Config) -> BTreeMap<SocketAddr, BTreeSet<SocketAddr>> {
    config
        .services
        .iter()
        .filter(|s| s.protocol == Protocol::Udp)
        .map(|s| (SocketAddr::new(s.vip, s.port), s.backends.iter().map(|b| b.addr).collect()))
        .collect()
}

/// The backends that left a UDP service between `before` and `after`
/// (stopped serving, or removed from it or with it).
pub(crate) fn stopped(
    before: &BTreeMap<SocketAddr, BTreeSet<SocketAddr>>,
    after: &BTreeMap<SocketAddr, BTreeSet<SocketAddr>>,
) -> Vec<StoppedBackend> {
    let mut out = Vec::new();
    for (vip, backends) in before {
        let now = after.get(vip);
        for b in backends {
            if !now.is_some_and(|n| n.contains(b)) {
                out.push(StoppedBackend { vip: *vip, backend: *b });
            }
        }
    }
    out
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
    fn backends_leaving_a_udp_service_are_stopped_and_tcp_ones_are_not() {
        let text = "[[service]]\nname = \"d\"\nvip = \"10.0.0.1\"\nport = 53\nprotocol = \"udp\"\nbackends = [\"10.0.1.1:53\", \"10.0.1.2:53\"]\n\n[[service]]\nname = \"w\"\nvip = \"10.0.0.1\"\nport = 80\nbackends = [\"10.0.1.1:80\"]\n";
        let before = udp_serving(&crate::config::from_text(text));
        assert_eq!(before.len(), 1, "TCP services have nothing to forget");
        let after = udp_serving(&crate::config::from_text(&text.replace(", \"10.0.1.2:53\"", "")));
        let vip = "10.0.0.1:53".parse().unwrap();
        assert_eq!(stopped(&before, &after), [StoppedBackend { vip, backend: "10.0.1.2:53".parse().unwrap() }]);
        assert_eq!(stopped(&after, &before), [], "a backend that comes has nothing to forget");
        assert_eq!(stopped(&before, &BTreeMap::new()).len(), 2, "a removed service's backends all left");
    }

    #[test]
    fn a_configuration_where_everything_serves_is_not_copied() {
        let config = crate::config::from_text(
            "[[service]]\nname = \"a\"\nvip = \"10.0.0.1\"\nport = 80\nbackends = [\"10.0.1.1:80\"]\n",
        );
        assert!(matches!(serving(&config, &BTreeMap::new()), Cow::Borrowed(_)));
    }
}
