//! Peer health (gateways): every `probe_interval` a gateway sends each peer
//! gateway a UDP probe on `probe_port` and answers the probes it gets. A
//! peer that misses `probe_loss` probes in a row is down — its routes become
//! `unreachable`, so traffic fails at once instead of vanishing — and is up
//! again at its first answer. A thread does the probing; the sync loop hears
//! of changes through its event channel.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::clock::now_unix;
use crate::config::{Config, GatewayRole};

/// What the monitor probes, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settings {
    /// Probes are sent from and answered on `local_ip`, the address peers
    /// know this gateway by.
    pub local: IpAddr,
    pub port: u16,
    pub interval: Duration,
    pub loss: u32,
    pub vni: u32,
    pub peers: Vec<(String, IpAddr)>,
}

impl Settings {
    /// Gateways probe their peers; members and hosts without peers do not.
    pub(crate) fn from_config(config: &Config) -> Option<Settings> {
        let g = config.gateway.as_ref().filter(|g| g.role == GatewayRole::Gateway)?;
        // Peers of the other family are not applied (model/gateway.rs).
        let peers: Vec<(String, IpAddr)> = config
            .peers
            .iter()
            .filter_map(|p| Some((p.name.clone(), p.endpoint?)))
            .filter(|(_, ep)| ep.is_ipv4() == g.local_ip.is_ipv4())
            .collect();
        (!peers.is_empty()).then_some(Settings {
            local: g.local_ip,
            port: g.probe_port,
            interval: g.probe_interval,
            loss: g.probe_loss,
            vni: g.vni,
            peers,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct PeerStatus {
    pub endpoint: IpAddr,
    pub up: bool,
    /// Unix seconds of the last change (or of the start).
    pub since: u64,
    /// Probes missed in a row.
    pub missed: u32,
}

#[derive(Debug, Default)]
struct Shared {
    peers: BTreeMap<String, PeerStatus>,
    error: Option<String>,
}

pub(crate) struct PeerHealth {
    shared: Arc<Mutex<Shared>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// What the daemon reads of a running prober. The live one is
/// `PeerHealth`; the daemon's unit tests drive a fake.
pub(crate) trait PeerProbe: Send {
    /// Every probed peer's state.
    fn report(&self) -> BTreeMap<String, PeerStatus>;
    /// Why probes cannot run, if they cannot.
    fn error(&self) -> Option<String>;
    /// The peers that are down now.
    fn down(&self) -> BTreeSet<String> {
        self.report().into_iter().filter(|(_, p)| !p.up).map(|(n, _)| n).collect()
    }
}

/// Starts a prober for `settings`; `changed` is called when a peer goes
/// down or up, and probing ends when it returns false.
pub(crate) trait PeerProber: Send {
    fn start(&mut self, settings: Settings, changed: Box<dyn Fn() -> bool + Send>) -> Box<dyn PeerProbe>;
}

/// Probes for real: a `PeerHealth` thread per settings.
pub(crate) struct LiveProber;

impl PeerProber for LiveProber {
    fn start(&mut self, settings: Settings, changed: Box<dyn Fn() -> bool + Send>) -> Box<dyn PeerProbe> {
        Box::new(PeerHealth::start(settings, changed))
    }
}

impl PeerProbe for PeerHealth {
    fn report(&self) -> BTreeMap<String, PeerStatus> {
        self.shared.lock().expect("health state").peers.clone()
    }

    fn error(&self) -> Option<String> {
        self.shared.lock().expect("health state").error.clone()
    }
}

impl PeerHealth {
    /// Starts probing; `changed` is called when a peer goes down or up,
    /// and probing ends when it returns false (nobody is listening).
    pub(crate) fn start(settings: Settings, changed: impl Fn() -> bool + Send + 'static) -> PeerHealth {
        let now = now_unix();
        let peers = settings
            .peers
            .iter()
            .map(|(name, ep)| (name.clone(), PeerStatus { endpoint: *ep, up: true, since: now, missed: 0 }))
            .collect();
        let shared = Arc::new(Mutex::new(Shared { peers, error: None }));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (settings, shared, stop) = (settings.clone(), Arc::clone(&shared), Arc::clone(&stop));
            std::thread::Builder::new()
                .name("peer-health".into())
                .spawn(move || run(&settings, &shared, &stop, &changed))
                .expect("spawn the peer health thread")
        };
        PeerHealth { shared, stop, thread: Some(thread) }
    }
}

impl Drop for PeerHealth {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(settings: &Settings, shared: &Mutex<Shared>, stop: &AtomicBool, changed: &dyn Fn() -> bool) {
    let sock = match UdpSocket::bind((settings.local, settings.port)) {
        Ok(s) => s,
        Err(e) => {
            shared.lock().expect("health state").error = Some(format!(
                "cannot listen for peer probes on {}: {e}; peers are taken as up",
                SocketAddr::new(settings.local, settings.port)
            ));
            return;
        }
    };
    let _ = sock.set_read_timeout(Some(Duration::from_millis(50)));
    let mut seq: u64 = 0;
    let mut answered: BTreeSet<String> = settings.peers.iter().map(|(n, _)| n.clone()).collect();
    let mut next_probe = Instant::now();
    let mut buf = [0u8; 128];
    while !stop.load(Ordering::Relaxed) {
        let mut news = false;
        if Instant::now() >= next_probe {
            {
                let mut s = shared.lock().expect("health state");
                for (name, _) in &settings.peers {
                    let p = s.peers.get_mut(name).expect("every peer has a status");
                    if answered.contains(name) {
                        continue;
                    }
                    p.missed += 1;
                    if p.up && p.missed >= settings.loss {
                        p.up = false;
                        p.since = now_unix();
                        news = true;
                    }
                }
            }
            seq += 1;
            answered.clear();
            let probe = format!("hostmesh-probe {} {seq}\n", settings.vni);
            for (_, ip) in &settings.peers {
                let _ = sock.send_to(probe.as_bytes(), (*ip, settings.port));
            }
            next_probe += settings.interval;
            if next_probe < Instant::now() {
                next_probe = Instant::now() + settings.interval;
            }
        }
        if let Ok((n, from)) = sock.recv_from(&mut buf) {
            let text = String::from_utf8_lossy(&buf[..n]);
            let words: Vec<&str> = text.split_whitespace().collect();
            match words.as_slice() {
                ["hostmesh-probe", vni, s] if *vni == settings.vni.to_string() => {
                    let _ = sock.send_to(format!("hostmesh-ack {vni} {s}\n").as_bytes(), from);
                }
                ["hostmesh-ack", vni, s] if *vni == settings.vni.to_string() && *s == seq.to_string() => {
                    let from_ip = from.ip();
                    let mut st = shared.lock().expect("health state");
                    for (name, ip) in &settings.peers {
                        if *ip == from_ip {
                            answered.insert(name.clone());
                            let p = st.peers.get_mut(name).expect("every peer has a status");
                            p.missed = 0;
                            if !p.up {
                                p.up = true;
                                p.since = now_unix();
                                news = true;
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        if news && !changed() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::from_text as config;

    const GATEWAY: &str = "[gateway]\nrole = \"gateway\"\nlocal_ip = \"198.51.100.1\"\nvni = 7\n\
                           probe_interval = \"250ms\"\nprobe_loss = 3\nprobe_port = 4999\n\
                           [[peer]]\nname = \"b\"\nendpoint = \"198.51.100.2\"\ncidrs = [\"10.20.0.0/16\"]\n\
                           [[peer]]\nname = \"c\"\nendpoint = \"2001:db8::3\"\ncidrs = [\"10.30.0.0/16\"]\n";

    #[test]
    fn a_gateway_probes_its_peers_of_local_ips_family_from_local_ip() {
        let s = Settings::from_config(&config(GATEWAY)).expect("a gateway with peers probes");
        assert_eq!(s.local, "198.51.100.1".parse::<IpAddr>().unwrap());
        assert_eq!((s.port, s.interval, s.loss, s.vni), (4999, Duration::from_millis(250), 3, 7));
        // c's endpoint is IPv6: not applied (model/gateway.rs), not probed.
        assert_eq!(s.peers, [("b".to_string(), "198.51.100.2".parse().unwrap())]);
    }

    #[test]
    fn members_and_gateways_without_peers_probe_nothing() {
        let member = "[gateway]\nrole = \"member\"\nlocal_ip = \"192.0.2.20\"\ngateway_ip = \"192.0.2.1\"\nvni = 7\n\
                      [[peer]]\nname = \"b\"\ncidrs = [\"10.20.0.0/16\"]\n";
        assert_eq!(Settings::from_config(&config(member)), None);
        let lonely = "[gateway]\nrole = \"gateway\"\nlocal_ip = \"198.51.100.1\"\nvni = 7\n";
        assert_eq!(Settings::from_config(&config(lonely)), None);
    }
}
