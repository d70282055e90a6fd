//! Gateway health: every `probe_interval` a gateway probes each endpoint
//! of each peer, and a member with several `gateway_ips` probes each of
//! them; `choice.rs` turns the answers into the gateway each list uses. A
//! gateway missing `probe_loss` probes in a row is down and traffic moves
//! to the next live one in its list; when none is left, the routes
//! through the list become `unreachable`, so traffic fails at once.
//!
//! Probes travel the tunnel itself (a VXLAN frame to the gateway's
//! `udp_port`, `backends/probe_wire.rs`) and are answered by the data plane
//! (probes/gateway.c, hm_tun_in): a gateway whose daemon restarts keeps
//! answering, and a restarted prober resumes from the choices it saved, so
//! a restart moves no traffic anywhere. Peers are also sent the probes
//! older daemons answer, on `probe_port`, and such probes are answered, so
//! gateways can be upgraded one at a time.
//!
//! A probe is lost when no answer came within `probe_interval`, or half a
//! second if that is shorter; while a gateway in use misses probes the
//! next are sent at once (as HAProxy's `fastinter`), so with the defaults
//! (1 s, 3 lost) a dead gateway is left 1.5 to 2.5 s after it died. A
//! thread does the probing; the sync loop hears of changes through its
//! event channel.

mod choice;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub(crate) use choice::{Choice, Rules};

use crate::clock::now_unix;
use crate::config::{Config, GatewayRole};
use crate::model::Via;

/// The longest a probe waits for its answer (less when probes are sent
/// more often): long enough for a path across continents.
pub(crate) const MAX_ANSWER_WAIT: Duration = Duration::from_millis(500);

/// What the monitor probes, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settings {
    /// Probes are sent from `local_ip`, the address other gateways know
    /// this host by, and answered to it.
    pub local: IpAddr,
    /// The older daemons' probe port (answered and sent on gateways).
    pub port: u16,
    /// The tunnel's UDP port: where probes are sent.
    pub udp_port: u16,
    pub interval: Duration,
    pub rules: Rules,
    pub vni: u32,
    /// Every list of gateways probed, each in order of preference.
    pub lists: Vec<(Via, Vec<IpAddr>)>,
}

impl Settings {
    /// Gateways probe their peers' endpoints; a member probes its own
    /// site's gateways when it has several (with one there is no choice to
    /// make, and it behaves as before: no probes).
    pub(crate) fn from_config(config: &Config) -> Option<Settings> {
        let g = config.gateway.as_ref()?;
        let lists: Vec<(Via, Vec<IpAddr>)> = match g.role {
            // Peers of the other family are not applied (model/gateway.rs).
            GatewayRole::Gateway => config
                .peers
                .iter()
                .filter(|p| p.endpoints.first().is_some_and(|ep| ep.is_ipv4() == g.local_ip.is_ipv4()))
                .map(|p| (Via::Peer(p.name.clone()), p.endpoints.clone()))
                .collect(),
            GatewayRole::Member if g.gateway_ips.len() > 1 => vec![(Via::Site, g.gateway_ips.clone())],
            GatewayRole::Member => Vec::new(),
        };
        (!lists.is_empty()).then_some(Settings {
            local: g.local_ip,
            port: g.probe_port,
            udp_port: g.udp_port,
            interval: g.probe_interval,
            rules: Rules { loss: g.probe_loss, rise: g.probe_rise, preempt: g.preempt },
            vni: g.vni,
            lists,
        })
    }

    /// How long a probe waits for its answer.
    pub(crate) fn answer_wait(&self) -> Duration {
        self.interval.min(MAX_ANSWER_WAIT)
    }

    /// Every address probed, once, in a fixed order (its index is its
    /// slot in HM_GW_PROBES), and whether it is a peer's (sent the older
    /// daemons' probe too).
    pub(crate) fn targets(&self) -> Vec<ProbeTarget> {
        let mut out: Vec<ProbeTarget> = Vec::new();
        for (via, addrs) in &self.lists {
            for &addr in addrs {
                let legacy = matches!(via, Via::Peer(_));
                match out.iter_mut().find(|t| t.addr == addr) {
                    Some(t) => t.legacy |= legacy,
                    None => out.push(ProbeTarget { addr, legacy }),
                }
            }
        }
        out
    }
}

/// One address the prober sends probes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProbeTarget {
    pub addr: IpAddr,
    /// Also sent the probe older daemons answer (on `probe_port`).
    pub legacy: bool,
}

/// How probes reach the wire and their answers come back: the live one is
/// `backends::probe_wire::LiveWire`; the tests drive a fake.
pub(crate) trait Wire: Send {
    /// Sends probe `seq` to every target; the index of each is its slot.
    fn send(&mut self, targets: &[ProbeTarget], seq: u64);
    /// Waits up to `d`, answering the older daemons' probes meanwhile.
    fn listen(&mut self, d: Duration);
    /// The targets that answered probe `seq`; an error when answers cannot
    /// be read (then the round is not judged).
    fn answered(&mut self, targets: &[ProbeTarget], seq: u64) -> Result<BTreeSet<IpAddr>, String>;
}

/// Opens the wire for `settings`, or says why it cannot.
pub(crate) type OpenWire = dyn Fn(&Settings) -> Result<Box<dyn Wire>, String> + Send + Sync;

#[derive(Debug, Default)]
struct Shared {
    lists: BTreeMap<Via, Choice>,
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
    /// Every probed list's state.
    fn report(&self) -> BTreeMap<Via, Choice>;
    /// Why probes cannot run or be judged, if they cannot.
    fn error(&self) -> Option<String>;
    /// The gateway each probed list uses (`None`: every one is down).
    fn chosen(&self) -> BTreeMap<Via, Option<IpAddr>> {
        self.report().into_iter().map(|(via, c)| (via, c.active)).collect()
    }
    /// The peers whose every endpoint is down.
    fn down(&self) -> BTreeSet<String> {
        self.report()
            .into_iter()
            .filter_map(|(via, c)| match via {
                Via::Peer(name) if c.active.is_none() => Some(name),
                _ => None,
            })
            .collect()
    }
}

/// Starts a prober for `settings`, resuming the `saved` choices of lists
/// it probes again; `changed` is called when a gateway goes down or up
/// or traffic moves, and probing ends when it returns false.
pub(crate) trait PeerProber: Send {
    fn start(
        &mut self,
        settings: Settings,
        saved: BTreeMap<Via, Choice>,
        changed: Box<dyn Fn() -> bool + Send>,
    ) -> Box<dyn PeerProbe>;
}

/// Probes for real: a `PeerHealth` thread per settings, on the wire
/// `open` makes.
pub(crate) struct LiveProber {
    pub open: Arc<OpenWire>,
}

impl PeerProber for LiveProber {
    fn start(
        &mut self,
        settings: Settings,
        saved: BTreeMap<Via, Choice>,
        changed: Box<dyn Fn() -> bool + Send>,
    ) -> Box<dyn PeerProbe> {
        Box::new(PeerHealth::start(settings, saved, Arc::clone(&self.open), changed))
    }
}

impl PeerProbe for PeerHealth {
    fn report(&self) -> BTreeMap<Via, Choice> {
        self.shared.lock().expect("health state").lists.clone()
    }

    fn error(&self) -> Option<String> {
        self.shared.lock().expect("health state").error.clone()
    }
}

impl PeerHealth {
    /// Starts probing; `changed` is called when a gateway goes down or up
    /// or traffic moves, and probing ends when it returns false (nobody
    /// is listening).
    pub(crate) fn start(
        settings: Settings,
        mut saved: BTreeMap<Via, Choice>,
        open: Arc<OpenWire>,
        changed: impl Fn() -> bool + Send + 'static,
    ) -> PeerHealth {
        let now = now_unix();
        let lists = settings
            .lists
            .iter()
            .map(|(via, addrs)| (via.clone(), Choice::resume(addrs, saved.remove(via), now)))
            .collect();
        let shared = Arc::new(Mutex::new(Shared { lists, error: None }));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (shared, stop) = (Arc::clone(&shared), Arc::clone(&stop));
            std::thread::Builder::new()
                .name("peer-health".into())
                .spawn(move || match open(&settings) {
                    Ok(mut wire) => run(&settings, wire.as_mut(), &shared, &stop, &changed),
                    Err(e) => shared.lock().expect("health state").error = Some(e),
                })
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

/// Until some gateway first answers, silence from all of them is more
/// likely this host's own data plane, which the daemon's first sync is
/// still building (the prober starts with it; a loaded machine takes
/// seconds), than every gateway dead: no loss is judged for this long.
const STARTUP_GRACE: Duration = Duration::from_secs(3);

/// The probe loop: send, wait for the answers, judge, and again after the
/// interval (at once while a gateway in use is missing probes).
fn run(
    settings: &Settings,
    wire: &mut dyn Wire,
    shared: &Mutex<Shared>,
    stop: &AtomicBool,
    changed: &dyn Fn() -> bool,
) {
    let targets = settings.targets();
    let wait = settings.answer_wait();
    // Sequence numbers only grow, across restarts too (answers to an
    // earlier daemon's probes are never taken for this one's).
    let mut seq: u64 = crate::clock::now_unix().saturating_mul(1_000_000);
    let mut next = Instant::now();
    let (started, mut heard) = (Instant::now(), false);
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now < next {
            wire.listen((next - now).min(Duration::from_millis(50)));
            continue;
        }
        seq += 1;
        wire.send(&targets, seq);
        let deadline = Instant::now() + wait;
        while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
            wire.listen(deadline.saturating_duration_since(Instant::now()).min(Duration::from_millis(50)));
        }
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let (news, falling) = {
            let mut s = shared.lock().expect("health state");
            match wire.answered(&targets, seq) {
                Ok(answered) if !heard && answered.is_empty() && started.elapsed() < STARTUP_GRACE => {
                    s.error = None;
                    (false, false)
                }
                Ok(answered) => {
                    s.error = None;
                    heard = true;
                    let now = now_unix();
                    let mut news = false;
                    for c in s.lists.values_mut() {
                        news |= c.round(|a| answered.contains(&a), settings.rules, now);
                    }
                    (news, s.lists.values().any(Choice::falling))
                }
                Err(e) => {
                    s.error = Some(e);
                    (false, false)
                }
            }
        };
        next += if falling { wait } else { settings.interval };
        if next < Instant::now() {
            next = Instant::now();
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
    fn a_gateway_probes_every_endpoint_of_its_peers_of_local_ips_family_from_local_ip() {
        let text = GATEWAY.replace("endpoint = \"198.51.100.2\"", "endpoints = [\"198.51.100.2\", \"198.51.100.4\"]");
        let s = Settings::from_config(&config(&text)).expect("a gateway with peers probes");
        assert_eq!(s.local, "198.51.100.1".parse::<IpAddr>().unwrap());
        assert_eq!((s.port, s.interval, s.vni), (4999, Duration::from_millis(250), 7));
        assert_eq!(s.rules, Rules { loss: 3, rise: 2, preempt: false });
        assert_eq!(s.answer_wait(), Duration::from_millis(250));
        // c's endpoint is IPv6: not applied (model/gateway.rs), not probed.
        let (b2, b4) = ("198.51.100.2".parse().unwrap(), "198.51.100.4".parse().unwrap());
        assert_eq!(s.lists, [(Via::Peer("b".into()), vec![b2, b4])]);
        assert_eq!(
            s.targets(),
            [ProbeTarget { addr: b2, legacy: true }, ProbeTarget { addr: b4, legacy: true }],
            "peers are also sent the older daemons' probe"
        );
    }

    #[test]
    fn a_member_probes_its_gateways_only_when_it_has_several() {
        let member = |gw: &str| {
            format!(
                "[gateway]\nrole = \"member\"\nlocal_ip = \"192.0.2.20\"\n{gw}\nvni = 7\nprobe_interval = \"2s\"\n\
                 [[peer]]\nname = \"b\"\ncidrs = [\"10.20.0.0/16\"]\n"
            )
        };
        assert_eq!(Settings::from_config(&config(&member("gateway_ip = \"192.0.2.1\""))), None, "as before");
        let s = Settings::from_config(&config(&member("gateway_ips = [\"192.0.2.1\", \"192.0.2.2\"]"))).unwrap();
        assert_eq!(s.lists, [(Via::Site, vec!["192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap()])]);
        assert!(s.targets().iter().all(|t| !t.legacy), "older daemons never had members probe");
        assert_eq!(s.answer_wait(), MAX_ANSWER_WAIT);
    }

    #[test]
    fn gateways_without_peers_probe_nothing() {
        let lonely = "[gateway]\nrole = \"gateway\"\nlocal_ip = \"198.51.100.1\"\nvni = 7\n";
        assert_eq!(Settings::from_config(&config(lonely)), None);
    }

    /// A wire whose targets answer unless the test says they are dead, or
    /// whose answers cannot be read at all.
    #[derive(Clone, Default)]
    struct FakeWire {
        dead: Arc<Mutex<BTreeSet<IpAddr>>>,
        unreadable: Arc<AtomicBool>,
        rounds: Arc<Mutex<u64>>,
    }

    impl Wire for FakeWire {
        fn send(&mut self, _targets: &[ProbeTarget], _seq: u64) {
            *self.rounds.lock().unwrap() += 1;
        }
        fn listen(&mut self, d: Duration) {
            std::thread::sleep(d);
        }
        fn answered(&mut self, targets: &[ProbeTarget], _seq: u64) -> Result<BTreeSet<IpAddr>, String> {
            if self.unreadable.load(Ordering::Relaxed) {
                return Err("HM_GW_PROBES is not pinned".into());
            }
            let dead = self.dead.lock().unwrap();
            Ok(targets.iter().map(|t| t.addr).filter(|a| !dead.contains(a)).collect())
        }
    }

    fn wait_until(what: &str, f: impl Fn() -> bool) {
        let end = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < end, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn silence_from_every_gateway_at_the_start_is_judged_only_after_the_startup_grace() {
        let mut s = Settings::from_config(&config(GATEWAY)).unwrap();
        s.interval = Duration::from_millis(20);
        let wire = FakeWire::default();
        let first: IpAddr = "198.51.100.2".parse().unwrap();
        wire.dead.lock().unwrap().insert(first);
        let open: Arc<OpenWire> = {
            let wire = wire.clone();
            Arc::new(move |_: &Settings| Ok(Box::new(wire.clone()) as Box<dyn Wire>))
        };
        let started = Instant::now();
        let h = PeerHealth::start(s, BTreeMap::new(), open, || true);
        let b = Via::Peer("b".into());
        wait_until("10 silent rounds", || *wire.rounds.lock().unwrap() > 10);
        assert_eq!(h.chosen()[&b], Some(first), "not judged while this host may still be building its side");
        wait_until("the peer down", || h.down().contains("b"));
        assert!(started.elapsed() >= STARTUP_GRACE, "judged once the grace was over");
    }

    #[test]
    fn the_prober_moves_traffic_off_a_silent_gateway_and_never_judges_answers_it_cannot_read() {
        let text = GATEWAY.replace("endpoint = \"198.51.100.2\"", "endpoints = [\"198.51.100.2\", \"198.51.100.4\"]");
        let mut s = Settings::from_config(&config(&text)).unwrap();
        s.interval = Duration::from_millis(20);
        let wire = FakeWire::default();
        let open: Arc<OpenWire> = {
            let wire = wire.clone();
            Arc::new(move |_: &Settings| Ok(Box::new(wire.clone()) as Box<dyn Wire>))
        };
        let changes = Arc::new(Mutex::new(0u32));
        let told = Arc::clone(&changes);
        let h = PeerHealth::start(s, BTreeMap::new(), open, move || {
            *told.lock().unwrap() += 1;
            true
        });
        let b = Via::Peer("b".into());
        let (first, second): (IpAddr, IpAddr) = ("198.51.100.2".parse().unwrap(), "198.51.100.4".parse().unwrap());
        // Answers that cannot be read are no losses: nothing moves.
        wire.unreadable.store(true, Ordering::Relaxed);
        wire.dead.lock().unwrap().insert(first);
        let r0 = *wire.rounds.lock().unwrap();
        wait_until("10 unreadable rounds", || *wire.rounds.lock().unwrap() > r0 + 10);
        assert_eq!(h.chosen()[&b], Some(first));
        assert!(h.error().unwrap().contains("HM_GW_PROBES"));
        // Readable again: the silent first gateway is left after 3 losses.
        wire.unreadable.store(false, Ordering::Relaxed);
        wait_until("the move", || h.chosen()[&b] == Some(second));
        assert_eq!(h.error(), None);
        let c = &h.report()[&b];
        assert_eq!((c.failovers, c.target(first).unwrap().missed >= 3), (1, true));
        assert!(*changes.lock().unwrap() >= 1, "the daemon was told");
        assert!(h.down().is_empty());
        // Both silent: the peer is down.
        wire.dead.lock().unwrap().insert(second);
        wait_until("the peer down", || h.down().contains("b"));
        assert_eq!(h.chosen()[&b], None);
    }
}
