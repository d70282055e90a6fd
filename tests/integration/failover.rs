//! Several gateways per site (hm_testkit::gateway_pairs, drawn there): six
//! daemons, two sites of two gateways each. When the gateway in use dies
//! (its links down, as a dead host), members and the other site's
//! gateways move to the next one in their lists: new connections resume
//! and a TCP connection opened before carries on, nothing reset. A
//! recovered gateway takes traffic back only with `preempt`. A daemon
//! killed and restarted is no failure anywhere: the data plane answers
//! probes while it is gone.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use hm_testkit::gateway_pairs::{self as pairs, GA, GB, MA_WORKLOAD, MB_WORKLOAD};
use hm_testkit::{scaled, wait_soon, Daemon, Netns, Servers};
use nix::sys::signal::Signal;

use crate::encrypted::{install_key, key_pair, KeyPair};
use crate::fixtures::*;
use crate::sites::{connect_from, tcp_exchange};
use hm_testkit::capture::Capture;

const ECHO_PORT: u16 = 8080;
const PROBES: &str = "probe_interval = \"200ms\"\nprobe_loss = 3\nprobe_rise = 2";

/// Field order is drop order: echo servers and daemons, hosts, the switch.
struct Pairs {
    _echo: Servers,
    daemons: Vec<Daemon>,
    hosts: Vec<Host>,
    _switch: Netns,
}

const NAMES: [&str; 6] = ["ma", "ga1", "ga2", "gb1", "gb2", "mb"];
const MA: usize = 0;
const GA1: usize = 1;
const GB1: usize = 3;
const MB: usize = 5;

impl Pairs {
    fn start(probes: &str) -> Pairs {
        Self::start_edited(probes, |_, _, text| text)
    }

    /// As `start`, each host's config as `edit(INDEX, HOST, TEXT)` makes
    /// it of the test kit's.
    fn start_edited(probes: &str, edit: impl Fn(usize, &Host, String) -> String) -> Pairs {
        let switch = Netns::new();
        let hosts: Vec<Host> = (0..6).map(|_| Host::new()).collect();
        pairs::wire(&pairs::Hosts {
            switch: &switch,
            ma: &hosts[MA].ns,
            ga: [&hosts[1].ns, &hosts[2].ns],
            gb: [&hosts[3].ns, &hosts[4].ns],
            mb: &hosts[MB].ns,
        });
        for (i, (h, c)) in hosts.iter().zip(pairs::configs(probes)).enumerate() {
            h.write("gateway.toml", &edit(i, h, c));
        }
        let at = |ip: &str| SocketAddr::new(ip.parse().unwrap(), ECHO_PORT);
        let echo =
            Servers::echo(&hosts[MB].ns, &[at(MB_WORKLOAD)]).join(Servers::echo(&hosts[MA].ns, &[at(MA_WORKLOAD)]));
        // Gateways first: members then find theirs answering from the start.
        let mut started: Vec<Option<Daemon>> = (0..6).map(|_| None).collect();
        for i in [1, 2, 3, 4, MA, MB] {
            started[i] = Some(hosts[i].start_ready());
        }
        let daemons = started.into_iter().map(|d| d.expect("started")).collect();
        // (A host started before the others judged them down until they
        // answered: tests count log lines from their own start on.)
        Pairs { _echo: echo, daemons, hosts, _switch: switch }
    }

    fn logs(&self) -> String {
        self.daemons.iter().zip(NAMES).map(|(d, n)| format!("--- {n}\n{}", d.log_text())).collect()
    }

    /// The gateway a host's status says carries a path's traffic: on a
    /// member its site's (the tunnel's object), on a gateway its peer's.
    fn in_use(&self, host: usize) -> Option<String> {
        let status = self.hosts[host].status();
        let kind = if host == MA || host == MB { "gateway" } else { "peer" };
        let o = status.objects.iter().find(|o| o.kind.to_string() == kind)?;
        Some(o.in_use?.to_string())
    }

    fn wait_in_use(&self, host: usize, want: &str) {
        wait_soon(&format!("{} sends through {want}", NAMES[host]), || self.in_use(host).as_deref() == Some(want))
            .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", self.in_use(host), self.logs()));
    }

    /// Log lines of `host` containing `what`.
    fn said(&self, host: usize, what: &str) -> usize {
        self.daemons[host].log_text().lines().filter(|l| l.contains(what)).count()
    }

    fn exchange_works(&self) -> bool {
        tcp_exchange(&self.hosts[MA].ns, MA_WORKLOAD, &format!("{MB_WORKLOAD}:{ECHO_PORT}"), 1, 10).is_ok()
    }
}

/// A TCP connection from A's workload to B's echo server, kept open.
struct Conn {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Conn {
    fn open(p: &Pairs) -> Conn {
        // Long enough for the retransmissions that cross a failover.
        let timeout = scaled(Duration::from_secs(15));
        let stream = connect_from(&p.hosts[MA].ns, MA_WORKLOAD, &format!("{MB_WORKLOAD}:{ECHO_PORT}"), timeout)
            .unwrap_or_else(|e| panic!("connect: {e}\n{}", p.logs()));
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut greeting = String::new();
        reader.read_line(&mut greeting).expect("greeting");
        Conn { stream, reader }
    }

    /// Writes 100 bytes and reads them back.
    fn echo(&mut self, round: u8) -> std::io::Result<()> {
        let chunk = [round; 100];
        self.stream.write_all(&chunk)?;
        let mut back = [0u8; 100];
        self.reader.read_exact(&mut back)?;
        if back != chunk {
            return Err(std::io::Error::other("the echo differs"));
        }
        Ok(())
    }
}

#[test]
fn the_gateway_in_use_of_site_a_dies_and_traffic_moves_without_a_reset_and_stays_when_it_returns() {
    let p = Pairs::start(PROBES);
    let mut conn = Conn::open(&p);
    conn.echo(1).unwrap_or_else(|e| panic!("{e}\n{}", p.logs()));
    p.wait_in_use(MA, GA[0].0);
    p.wait_in_use(GB1, GA[0].1);

    let moved = p.said(MA, "traffic moved to another gateway");
    let died = Instant::now();
    pairs::cut(&p.hosts[GA1].ns, &["lan", "wan"]);
    // A's member and both of B's gateways leave it, for its second.
    p.wait_in_use(MA, GA[1].0);
    p.wait_in_use(GB1, GA[1].1);
    p.wait_in_use(GB1 + 1, GA[1].1);
    wait_soon("new connections work again", || p.exchange_works()).unwrap_or_else(|e| panic!("{e}\n{}", p.logs()));
    println!("connections resumed {:?} after the gateway died (probes every 200 ms, 3 lost)", died.elapsed());
    conn.echo(2).unwrap_or_else(|e| panic!("the connection opened before: {e}\n{}", p.logs()));

    // It comes back: judged up after probe_rise answers, and without
    // preempt the traffic stays where it went.
    pairs::restore(&p.hosts[GA1].ns, &["lan", "wan"]);
    wait_soon("A's member sees its first gateway up", || {
        p.hosts[MA].status().objects.iter().any(|o| o.detail.contains(&format!("{} up", GA[0].0)))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", p.logs()));
    assert_eq!(p.in_use(MA).as_deref(), Some(GA[1].0), "preempt = false: traffic stays");
    assert_eq!(p.in_use(GB1).as_deref(), Some(GA[1].1));
    conn.echo(3).unwrap_or_else(|e| panic!("{e}\n{}", p.logs()));
    assert!(p.exchange_works());
    assert_eq!(p.said(MA, "traffic moved to another gateway"), moved + 1, "{}", p.logs());
}

#[test]
fn with_preempt_site_bs_first_gateway_takes_traffic_back_after_it_returns_without_a_reset() {
    let p = Pairs::start(&format!("{PROBES}\npreempt = true"));
    let mut conn = Conn::open(&p);
    conn.echo(1).unwrap_or_else(|e| panic!("{e}\n{}", p.logs()));
    p.wait_in_use(MB, GB[0].0);
    p.wait_in_use(GA1, GB[0].1);

    let moved = p.said(MB, "traffic moved to another gateway");
    let preempted = p.said(MB, "an earlier gateway answers again (preempt)");
    pairs::cut(&p.hosts[GB1].ns, &["lan", "wan"]);
    p.wait_in_use(MB, GB[1].0);
    p.wait_in_use(GA1, GB[1].1);
    wait_soon("new connections work again", || p.exchange_works()).unwrap_or_else(|e| panic!("{e}\n{}", p.logs()));
    conn.echo(2).unwrap_or_else(|e| panic!("the connection opened before: {e}\n{}", p.logs()));

    pairs::restore(&p.hosts[GB1].ns, &["lan", "wan"]);
    p.wait_in_use(MB, GB[0].0);
    p.wait_in_use(GA1, GB[0].1);
    p.wait_in_use(GA1 + 1, GB[0].1);
    conn.echo(3).unwrap_or_else(|e| panic!("after the move back: {e}\n{}", p.logs()));
    assert!(p.exchange_works());
    assert_eq!(p.said(MB, "traffic moved to another gateway"), moved + 2, "there and back:\n{}", p.logs());
    assert_eq!(p.said(MB, "an earlier gateway answers again (preempt)"), preempted + 1, "{}", p.logs());
}

#[test]
fn killing_and_restarting_the_daemon_of_the_gateway_in_use_moves_nothing_and_fails_no_connection() {
    let mut p = Pairs::start(PROBES);
    let mut conn = Conn::open(&p);
    conn.echo(1).unwrap_or_else(|e| panic!("{e}\n{}", p.logs()));
    p.wait_in_use(MA, GA[0].0);
    p.wait_in_use(GB1, GA[0].1);

    // (At the start a host may have judged a gateway down that was not
    // started yet: only what happens from here counts.)
    let said = |p: &Pairs| -> Vec<(usize, usize)> {
        (0..6).map(|i| (p.said(i, "traffic moved"), p.said(i, "gateway down"))).collect()
    };
    let before = said(&p);
    let old_log_len = p.daemons[GA1].log_text().len();
    p.daemons[GA1].signal(Signal::SIGKILL);
    assert!(p.daemons[GA1].exited_within(scaled(Duration::from_secs(5))).is_some(), "SIGKILL ends it");
    // Longer than probe_loss probes: the data plane answers meanwhile.
    let gone = Instant::now();
    let mut failed = 0;
    let mut tried = 0;
    while gone.elapsed() < Duration::from_millis(1500) {
        tried += 1;
        failed += usize::from(!p.exchange_works());
        std::thread::sleep(Duration::from_millis(20));
    }
    p.daemons[GA1] = p.hosts[GA1].start_ready();
    for _ in 0..10 {
        tried += 1;
        failed += usize::from(!p.exchange_works());
    }
    conn.echo(2).unwrap_or_else(|e| panic!("{e}\n{}", p.logs()));
    assert_eq!(failed, 0, "{failed} of {tried} connections failed\n{}", p.logs());
    assert_eq!(said(&p), before, "a host moved traffic or saw a gateway down:\n{}", p.logs());
    // The restarted daemon resumed its probes' judgements: it has nothing
    // to say about its peer's gateways.
    let new_log = p.daemons[GA1].log_text()[old_log_len..].to_string();
    assert!(new_log.contains("probing gateways"), "{new_log}");
    assert_eq!(p.in_use(MA).as_deref(), Some(GA[0].0));
    assert_eq!(p.in_use(GB1).as_deref(), Some(GA[0].1));
}

/// Each gateway's name and the MAC of its WAN link, to tell who sent a frame.
fn wan_macs(p: &Pairs) -> String {
    let mac = |g: usize| p.hosts[g].ns.ip_json(&["link", "show", "wan"]).first().map(|l| l["address"].to_string());
    [GA1, GA1 + 1, GB1, GB1 + 1].map(|g| format!("{} {}", NAMES[g], mac(g).unwrap_or_default())).join(", ")
}

/// Every gateway encrypted, each with its own key pair (`keys[i]` for the
/// host at index i), its peer's two gateways each known by theirs.
fn encrypted(i: usize, host: &Host, text: String, keys: &[KeyPair]) -> String {
    if i == MA || i == MB {
        return text;
    }
    let (remote, peer_keys) = if i < GB1 { (GB, &keys[3..5]) } else { (GA, &keys[1..3]) };
    let endpoints = format!("endpoints = [\"{}\", \"{}\"]", remote[0].1, remote[1].1);
    let keyed = format!(
        "endpoints = [{{ address = \"{}\", public_key = \"{}\" }}, {{ address = \"{}\", public_key = \"{}\" }}]\n\
         encryption = \"wireguard\"",
        remote[0].1, peer_keys[0].public, remote[1].1, peer_keys[1].public
    );
    let key_file = install_key(host, &keys[i]);
    text.replacen("[gateway]\n", &format!("[gateway]\nprivate_key_file = \"{key_file}\"\n"), 1)
        .replacen(&endpoints, &keyed, 1)
}

#[test]
fn encrypted_gateways_fail_over_inside_wireguard_without_a_reset() {
    let keys: Vec<KeyPair> = (0..6u8).map(|i| key_pair(0x70 + i)).collect();
    let p = Pairs::start_edited(PROBES, |i, host, text| encrypted(i, host, text, &keys));
    if !kernel_has_wireguard() {
        // Refused on every gateway: nothing crosses (encrypted.rs shows
        // the rest of the refusal on two sites).
        for g in [GA1, GA1 + 1, GB1, GB1 + 1] {
            let status = p.hosts[g].status();
            assert!(status.objects.iter().any(|o| o.kind.to_string() == "peer" && o.state.to_string() == "refused"));
        }
        assert!(!p.exchange_works(), "a member reached an encrypted peer without WireGuard");
        return;
    }
    // A's gateways' WAN links: the workloads' addresses must never show.
    let workloads: [&[u8]; 2] = [&[10, 10, 1, 1], &[10, 20, 1, 1]];
    let captures = [GA1, GA1 + 1].map(|g| Capture::start(&p.hosts[g].ns, "wan", &workloads));
    let mut conn = Conn::open(&p);
    conn.echo(1).unwrap_or_else(|e| panic!("{e}\n{}", p.logs()));
    p.wait_in_use(MA, GA[0].0);
    p.wait_in_use(GB1, GA[0].1);
    pairs::cut(&p.hosts[GA1].ns, &["lan", "wan"]);
    p.wait_in_use(MA, GA[1].0);
    p.wait_in_use(GB1, GA[1].1);
    wait_soon("new connections work again", || p.exchange_works()).unwrap_or_else(|e| panic!("{e}\n{}", p.logs()));
    conn.echo(2).unwrap_or_else(|e| panic!("the connection opened before: {e}\n{}", p.logs()));
    // Between the sites only WireGuard, through either gateway.
    for (capture, g) in captures.iter().zip([GA1, GA1 + 1]) {
        let frames = capture.take();
        assert!(frames.iter().any(|f| f.ports == Some((51820, 51820))), "no WireGuard on {}'s WAN", NAMES[g]);
        for f in frames.iter().filter(|f| f.proto.is_some() && !f.is_link_housekeeping()) {
            assert!(
                f.ports == Some((51820, 51820)) && !f.has_marker,
                "not WireGuard on {}'s WAN: {f:?}; the gateways' WAN MACs: {}\n{}",
                NAMES[g],
                wan_macs(&p),
                p.logs()
            );
        }
    }
}
