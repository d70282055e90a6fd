//! Interleaved load from several client threads: every thread sends the
//! same kind of traffic down one of a set of paths, and all of them switch
//! to the next path together every slice (100 ms by default). Whatever
//! else loads the machine (the servers, the daemon's sweeps, another
//! tenant of the VM host) then hits every path alike, and the ratio of two
//! paths is measured under the same load, with the CPUs saturated.
//!
//! A rate is the successes on a path over the time the path was current;
//! the spread is that of the per-round ratios (one round: one slice of
//! every path, in an order that rotates from round to round).

use std::fs::File;
use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hm_testkit::Netns;

use crate::load::{interrupted, pin_to_cpu, tcp_exchange, REQUEST};

/// TCP: connect + request/reply + abort (RST, see load::tcp_rate); UDP:
/// request/reply on one unconnected socket per thread and path; Bulk: one
/// TCP connection per thread and path kept writing to a sink, a success
/// per byte written (so a rate is bytes per second).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Tcp,
    Udp,
    Bulk,
}

/// One way to reach the echo servers: from `src` in `ns` to `dst`.
pub struct Path<'a> {
    pub ns: &'a Netns,
    pub src: IpAddr,
    pub dst: SocketAddr,
}

pub struct Plan {
    pub clients: usize,
    pub slice: Duration,
    pub rounds: usize,
}

impl Plan {
    /// The flags every interleaved bench takes (`Options::parse` must
    /// know them): `--clients N` (4), `--rounds N` (`rounds`) and
    /// `--slice-ms MS` (100).
    pub const FLAGS: [&'static str; 3] = ["clients", "rounds", "slice-ms"];

    /// The plan the command line asks for.
    pub fn from_options(o: &crate::options::Options, rounds: usize) -> Plan {
        let flag = |name: &str, default: usize| -> usize {
            o.extra.get(name).map(|v| v.parse().unwrap_or_else(|_| panic!("--{name} N"))).unwrap_or(default)
        };
        Plan {
            clients: flag("clients", 4),
            rounds: flag("rounds", rounds),
            slice: Duration::from_millis(flag("slice-ms", 100) as u64),
        }
    }

    /// "4 client threads, 30 rounds of 100 ms slices per measurement", for
    /// a bench's first line.
    pub fn describe(&self) -> String {
        format!(
            "{} client threads, {} rounds of {} ms slices per measurement",
            self.clients,
            self.rounds,
            self.slice.as_millis()
        )
    }
}

/// p10 and p90 of the per-round ratios to the first path.
#[derive(Debug, Clone, Copy, Default)]
pub struct Spread {
    pub low: f64,
    pub high: f64,
}

#[derive(Debug, Clone, Default)]
pub struct Measured {
    /// Successes per second while each path was current.
    pub per_sec: Vec<f64>,
    pub errors: Vec<u64>,
    /// Each path against the first one.
    pub spread: Vec<Spread>,
}

impl Measured {
    pub fn ratio(&self, path: usize) -> f64 {
        self.per_sec[path] / self.per_sec[0]
    }
}

const STOP: usize = usize::MAX;

struct Shared {
    current: AtomicUsize,
    ok: Vec<AtomicU64>,
    errors: Vec<AtomicU64>,
}

/// Runs `plan.rounds` rounds (after one unrecorded warm-up round) of
/// `kind` traffic over `paths`; the first path is the baseline.
pub fn measure(kind: Kind, paths: &[Path<'_>], plan: &Plan) -> Measured {
    assert!(!paths.is_empty() && plan.clients > 0 && plan.rounds > 0);
    let n = paths.len();
    let shared = Shared {
        current: AtomicUsize::new(0),
        ok: (0..n).map(|_| AtomicU64::new(0)).collect(),
        errors: (0..n).map(|_| AtomicU64::new(0)).collect(),
    };
    let targets: Vec<(File, IpAddr, SocketAddr)> = paths.iter().map(|p| (p.ns.file(), p.src, p.dst)).collect();
    let single = plan.clients == 1;
    let mut counts = vec![vec![0u64; n]; plan.rounds];
    let mut elapsed = vec![vec![0f64; n]; plan.rounds];
    std::thread::scope(|scope| {
        for _ in 0..plan.clients {
            let (shared, targets) = (&shared, &targets);
            scope.spawn(move || {
                if single {
                    pin_to_cpu(0);
                }
                match kind {
                    Kind::Tcp => tcp_client(shared, targets),
                    Kind::Udp => udp_client(shared, targets),
                    Kind::Bulk => bulk_client(shared, targets),
                }
            });
        }
        for round in 0..=plan.rounds {
            for step in 0..n {
                let path = (round + step) % n;
                let before = shared.ok[path].load(Ordering::Relaxed);
                let start = Instant::now();
                shared.current.store(path, Ordering::Release);
                std::thread::sleep(plan.slice);
                // Round 0 warms up: sockets, ARP, the servers' threads.
                if round > 0 {
                    counts[round - 1][path] = shared.ok[path].load(Ordering::Relaxed) - before;
                    elapsed[round - 1][path] = start.elapsed().as_secs_f64();
                }
            }
            if interrupted() {
                break;
            }
        }
        shared.current.store(STOP, Ordering::Release);
    });

    let per_sec: Vec<f64> = (0..n)
        .map(|p| {
            let ok: u64 = counts.iter().map(|c| c[p]).sum();
            let secs: f64 = elapsed.iter().map(|e| e[p]).sum();
            ok as f64 / secs.max(1e-9)
        })
        .collect();
    let spread = (0..n)
        .map(|p| {
            let mut ratios: Vec<f64> = (0..plan.rounds)
                .filter(|&r| counts[r][0] > 0)
                .map(|r| (counts[r][p] as f64 / elapsed[r][p]) / (counts[r][0] as f64 / elapsed[r][0]))
                .collect();
            ratios.sort_by(f64::total_cmp);
            if ratios.is_empty() {
                return Spread::default();
            }
            let at = |q: f64| ratios[((ratios.len() - 1) as f64 * q).round() as usize];
            Spread { low: at(0.1), high: at(0.9) }
        })
        .collect();
    let errors = shared.errors.iter().map(|e| e.load(Ordering::Relaxed)).collect();
    Measured { per_sec, errors, spread }
}

/// Moves the calling thread into a path's namespace; sockets it creates
/// from then on belong there.
fn enter(ns: &File) {
    nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
}

fn tcp_client(shared: &Shared, targets: &[(File, IpAddr, SocketAddr)]) {
    let mut buf = [0u8; 64];
    let mut inside = STOP;
    loop {
        let path = shared.current.load(Ordering::Acquire);
        if path == STOP {
            return;
        }
        let (ns, src, dst) = &targets[path];
        if inside != path {
            enter(ns);
            inside = path;
        }
        match tcp_exchange(*src, *dst, &mut buf) {
            Ok(()) => shared.ok[path].fetch_add(1, Ordering::Relaxed),
            Err(_) => shared.errors[path].fetch_add(1, Ordering::Relaxed),
        };
    }
}

fn udp_client(shared: &Shared, targets: &[(File, IpAddr, SocketAddr)]) {
    let sockets: Vec<UdpSocket> = targets
        .iter()
        .map(|(ns, src, _)| {
            enter(ns);
            let s = UdpSocket::bind(SocketAddr::new(*src, 0)).expect("bind a UDP client socket");
            s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
            s
        })
        .collect();
    let mut buf = [0u8; 64];
    loop {
        let path = shared.current.load(Ordering::Acquire);
        if path == STOP {
            return;
        }
        let ok = sockets[path].send_to(REQUEST, targets[path].2).is_ok() && sockets[path].recv_from(&mut buf).is_ok();
        if ok {
            shared.ok[path].fetch_add(1, Ordering::Relaxed);
        } else {
            shared.errors[path].fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Writes of this size, each with a timeout well under a slice, so the
/// bytes of one are counted for the path that was current.
const BULK_WRITE: usize = 16 * 1024;

fn bulk_client(shared: &Shared, targets: &[(File, IpAddr, SocketAddr)]) {
    let chunk = vec![0x5au8; BULK_WRITE];
    let mut streams: Vec<Option<TcpStream>> = targets.iter().map(|_| None).collect();
    let mut inside = STOP;
    loop {
        let path = shared.current.load(Ordering::Acquire);
        if path == STOP {
            return;
        }
        let (ns, src, dst) = &targets[path];
        if inside != path {
            enter(ns);
            inside = path;
        }
        if streams[path].is_none() {
            match crate::load::connect_from(*src, *dst) {
                Ok(s) => {
                    s.set_write_timeout(Some(Duration::from_millis(20))).unwrap();
                    streams[path] = Some(s);
                }
                Err(_) => {
                    shared.errors[path].fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            }
        }
        let stream = streams[path].as_mut().expect("connected");
        match stream.write(&chunk) {
            Ok(n) => {
                shared.ok[path].fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => {
                shared.errors[path].fetch_add(1, Ordering::Relaxed);
                streams[path] = None;
            }
        }
    }
}
