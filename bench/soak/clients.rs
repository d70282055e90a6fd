//! Steady load on every path, recorded: attempts counted per second and
//! path, each failure kept with when it ran and why. Every call has a
//! timeout and every loop ends when the soak stops.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hm_testkit::Netns;

use crate::sites::{MA, MA_WORKLOAD, SITE_PORT};
use crate::world::*;
use hm_testkit::gateway_pairs::MB_WORKLOAD;

/// The paths the soak loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// Short TCP connections to the web VIP from the host: connect-time LB.
    Web,
    /// TCP connections held for seconds, a request every 100 ms.
    Long,
    /// UDP requests to the dns VIP, each from a new socket: the veth path.
    Udp,
    /// TCP from another machine to the host's node port.
    NodePort,
    /// TCP to a mesh VIP: the sidecar's listener, by sk_lookup.
    Mesh,
    /// Short TCP connections from site A's member to site B's, through
    /// the gateways in use.
    Gateway,
}

pub const PATHS: [Path; 6] = [Path::Web, Path::Long, Path::Udp, Path::NodePort, Path::Mesh, Path::Gateway];
/// Attempts and failures, per path.
pub type Counts = [(u64, u64); PATHS.len()];

impl Path {
    pub fn index(self) -> usize {
        PATHS.iter().position(|p| *p == self).expect("a path")
    }

    pub fn name(self) -> &'static str {
        match self {
            Path::Web => "web",
            Path::Long => "long",
            Path::Udp => "udp",
            Path::NodePort => "nodeport",
            Path::Mesh => "mesh",
            Path::Gateway => "gateway",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Failure {
    pub path: Path,
    /// Milliseconds since the soak began.
    pub from_ms: u64,
    pub to_ms: u64,
    pub why: String,
}

/// The most failures kept one by one (the rest are counted).
const FAILURES_KEPT: usize = 100_000;

pub struct Recorder {
    pub start: Instant,
    /// Per second: attempts and failures per path.
    seconds: Mutex<Vec<Counts>>,
    failures: Mutex<Vec<Failure>>,
}

impl Recorder {
    pub fn new(start: Instant) -> Recorder {
        Recorder { start, seconds: Mutex::new(Vec::new()), failures: Mutex::new(Vec::new()) }
    }

    pub fn ms(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.start).as_millis() as u64
    }

    fn record(&self, path: Path, from: Instant, result: Result<(), String>) {
        let now = Instant::now();
        let second = (self.ms(now) / 1000) as usize;
        {
            let mut s = self.seconds.lock().unwrap();
            if s.len() <= second {
                s.resize(second + 1, [(0, 0); PATHS.len()]);
            }
            s[second][path.index()].0 += 1;
            if result.is_err() {
                s[second][path.index()].1 += 1;
            }
        }
        if let Err(why) = result {
            let mut f = self.failures.lock().unwrap();
            if f.len() < FAILURES_KEPT {
                f.push(Failure { path, from_ms: self.ms(from), to_ms: self.ms(now), why });
            }
        }
    }

    /// Attempts and failures per path over seconds `[from, to)`.
    pub fn counts(&self, from: usize, to: usize) -> Counts {
        let s = self.seconds.lock().unwrap();
        let mut out = [(0, 0); PATHS.len()];
        for sec in s.iter().take(to).skip(from) {
            for (o, c) in out.iter_mut().zip(sec) {
                o.0 += c.0;
                o.1 += c.1;
            }
        }
        out
    }

    pub fn failures(&self) -> Vec<Failure> {
        self.failures.lock().unwrap().clone()
    }
}

/// The load's threads; `stop` ends them.
pub struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Load {
    pub fn start(w: &World, rec: &Arc<Recorder>) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        let web: SocketAddr = format!("{WEB_VIP}:{WEB_PORT}").parse().unwrap();
        let dns: SocketAddr = format!("{DNS_VIP}:{DNS_PORT}").parse().unwrap();
        let node: SocketAddr = format!("{HOST_OUTSIDE}:{NODE_PORT}").parse().unwrap();
        let mesh: SocketAddr = format!("{MESH_VIP}:{MESH_PORT}").parse().unwrap();
        let site: SocketAddr = format!("{MB_WORKLOAD}:{SITE_PORT}").parse().unwrap();
        let (host, outside) = (&w.host, &w.outside);
        let mut spawn = |ns: &Netns, body: fn(&Recorder, SocketAddr, &AtomicBool), to: SocketAddr| {
            let (stop, rec, file) = (Arc::clone(&stop), Arc::clone(rec), ns.file());
            threads.push(std::thread::spawn(move || {
                nix::sched::setns(std::os::fd::AsFd::as_fd(&file), nix::sched::CloneFlags::CLONE_NEWNET)
                    .expect("enter the namespace");
                body(&rec, to, &stop);
            }));
        };
        for _ in 0..2 {
            spawn(host, short_tcp::<0>, web);
        }
        spawn(host, long_tcp, web);
        spawn(host, udp, dns);
        spawn(outside, short_tcp::<1>, node);
        spawn(host, short_tcp::<2>, mesh);
        spawn(&w.sites.hosts[MA], short_tcp::<3>, site);
        Load { stop, threads }
    }

    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// The pause between a thread's attempts: steady load that leaves the
/// daemon's checks their CPU.
const PACE: Duration = Duration::from_millis(2);
const TIMEOUT: Duration = Duration::from_secs(1);

/// Short connections; `N` 0 is the web VIP, 1 the node port, 2 the mesh
/// VIP (paced ten times slower: its sidecar is a Python process), 3 site
/// B's server from site A's workload address.
fn short_tcp<const N: u8>(rec: &Recorder, to: SocketAddr, stop: &AtomicBool) {
    let (path, pace) = match N {
        0 => (Path::Web, PACE),
        1 => (Path::NodePort, PACE),
        2 => (Path::Mesh, PACE * 10),
        _ => (Path::Gateway, PACE),
    };
    while !stop.load(Ordering::Relaxed) {
        let from = Instant::now();
        let r = connect_on(path, to).and_then(|mut s| exchange(&mut s));
        rec.record(path, from, r);
        std::thread::sleep(pace);
    }
}

/// Connections held 5 s, a request every 100 ms.
fn long_tcp(rec: &Recorder, to: SocketAddr, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        let from = Instant::now();
        let mut r = connect_on(Path::Long, to);
        if let Ok(s) = &mut r {
            let mut result = Ok(());
            while from.elapsed() < Duration::from_secs(5) && !stop.load(Ordering::Relaxed) {
                if let Err(e) = exchange(s) {
                    result = Err(format!("after {} ms: {e}", from.elapsed().as_millis()));
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            rec.record(Path::Long, from, result);
        } else if let Err(e) = r {
            rec.record(Path::Long, from, Err(e));
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn udp(rec: &Recorder, to: SocketAddr, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        let from = Instant::now();
        rec.record(Path::Udp, from, udp_once(to));
        std::thread::sleep(PACE);
    }
}

/// One UDP request from a new socket, and its answer.
fn udp_once(to: SocketAddr) -> Result<(), String> {
    let mut buf = [0u8; 64];
    let s = UdpSocket::bind("0.0.0.0:0").map_err(|e| format!("bind: {e}"))?;
    s.set_read_timeout(Some(TIMEOUT)).map_err(|e| e.to_string())?;
    s.send_to(b"ping", to).map_err(|e| format!("send: {e}"))?;
    match s.recv_from(&mut buf) {
        Ok((n, _)) if n > 0 && buf[0] == b'b' => Ok(()),
        Ok((n, _)) => Err(format!("answer {:?}", String::from_utf8_lossy(&buf[..n]))),
        Err(e) => Err(format!("recv: {e}")),
    }
}

/// A connection for `path`: from site A's workload address on the
/// gateway path, from the address the route picks on the others.
fn connect_on(path: Path, to: SocketAddr) -> Result<TcpStream, String> {
    let s = match path {
        Path::Gateway => hm_bench::load::connect_within(MA_WORKLOAD.parse().unwrap(), to, Some(TIMEOUT)),
        _ => TcpStream::connect_timeout(&to, TIMEOUT),
    };
    let s = s.map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(TIMEOUT)).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(TIMEOUT)).map_err(|e| e.to_string())?;
    // Closed with a reset: no TIME_WAIT piles up over an hour.
    let _ =
        nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::Linger, &libc::linger { l_onoff: 1, l_linger: 0 });
    Ok(s)
}

/// A request and its answer (the backend's name).
fn exchange(s: &mut TcpStream) -> Result<(), String> {
    let mut buf = [0u8; 64];
    s.write_all(b"hi").map_err(|e| format!("write: {e}"))?;
    match s.read(&mut buf) {
        Ok(n) if n > 0 && buf[0] == b'b' => Ok(()),
        Ok(0) => Err("closed by the peer".to_string()),
        Ok(n) => Err(format!("answer {:?}", String::from_utf8_lossy(&buf[..n]))),
        Err(e) => Err(format!("read: {e}")),
    }
}

/// One request on each path, before the load: a world that does not work
/// at all is not a soak.
pub fn preflight(w: &World) -> Result<(), String> {
    let (host, outside) = (&w.host, &w.outside);
    let rec = Arc::new(Recorder::new(Instant::now()));
    let run = |ns: &Netns, path: Path, to: String| {
        let (file, rec) = (ns.file(), Arc::clone(&rec));
        std::thread::spawn(move || {
            nix::sched::setns(std::os::fd::AsFd::as_fd(&file), nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            let to: SocketAddr = to.parse().unwrap();
            let from = Instant::now();
            let r = match path {
                Path::Udp => udp_once(to),
                _ => connect_on(path, to).and_then(|mut s| exchange(&mut s)),
            };
            rec.record(path, from, r);
        })
        .join()
        .expect("a preflight thread");
    };
    run(host, Path::Web, format!("{WEB_VIP}:{WEB_PORT}"));
    run(host, Path::Udp, format!("{DNS_VIP}:{DNS_PORT}"));
    run(outside, Path::NodePort, format!("{HOST_OUTSIDE}:{NODE_PORT}"));
    run(host, Path::Mesh, format!("{MESH_VIP}:{MESH_PORT}"));
    run(&w.sites.hosts[MA], Path::Gateway, format!("{MB_WORKLOAD}:{SITE_PORT}"));
    match rec.failures().first() {
        None => Ok(()),
        Some(f) => Err(format!("the {} path does not work: {}", f.path.name(), f.why)),
    }
}

/// UDP flows from `n` new sockets to the dns VIP, each a new conntrack
/// entry; answers are not waited for. Returns how many were sent.
pub fn pressure(ns: &Netns, n: usize) -> usize {
    let file = ns.file();
    std::thread::spawn(move || {
        nix::sched::setns(std::os::fd::AsFd::as_fd(&file), nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        let to: SocketAddr = format!("{DNS_VIP}:{DNS_PORT}").parse().unwrap();
        let mut sent = 0;
        for _ in 0..n {
            if let Ok(s) = UdpSocket::bind(SocketAddr::new(IpAddr::from([0, 0, 0, 0]), 0)) {
                if s.send_to(b"ping", to).is_ok() {
                    sent += 1;
                }
            }
        }
        sent
    })
    .join()
    .unwrap_or(0)
}
