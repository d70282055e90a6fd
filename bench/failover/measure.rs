//! One failover, measured as a user of the sites sees it: a new connection
//! from A's member to B's every 20 ms (connect, read the greeting), and one
//! TCP connection opened before exchanging 64 bytes every 10 ms. An
//! attempt fails when it errs, and stalls when it takes longer than
//! `STALLED` (a SYN lost on the dead gateway waits a second for its
//! retransmission). The outage is from the first failed or stalled attempt
//! to the last one (plus one period).

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hm_testkit::gateway_pairs::{MA_WORKLOAD, MB_WORKLOAD};
use hm_testkit::Netns;

use crate::topology::ECHO_PORT;

pub const PERIOD: Duration = Duration::from_millis(20);
pub const STALLED: Duration = Duration::from_millis(200);
/// The longest an attempt may take (connect, greeting).
const ATTEMPT_LIMIT: Duration = Duration::from_secs(8);

/// When an attempt began (since the load started), and how long it took.
type Attempt = (Duration, std::io::Result<Duration>);

#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub outage: Duration,
    pub attempts: usize,
    pub failed: usize,
    pub stalled: usize,
    pub stream_survived: bool,
    /// The longest the stream went without an echo.
    pub stream_stall: Duration,
    /// Whether the way held its first gateway until the failure (a VRRP
    /// setting too fast for the machine moves the address on its own).
    pub held: bool,
}

/// Connects from A's workload to B's echo server; the calling thread must
/// be in A's member's namespace.
fn connect_here() -> std::io::Result<TcpStream> {
    let dst: SocketAddr = format!("{MB_WORKLOAD}:{ECHO_PORT}").parse().unwrap();
    let stream = hm_bench::load::connect_within(MA_WORKLOAD.parse().unwrap(), dst, Some(ATTEMPT_LIMIT))?;
    stream.set_read_timeout(Some(ATTEMPT_LIMIT))?;
    Ok(stream)
}

/// One attempt on the calling thread (in A's member's namespace): connect
/// and read the greeting.
fn attempt_here() -> std::io::Result<()> {
    let mut line = String::new();
    BufReader::new(connect_here()?).read_line(&mut line)?;
    if line.is_empty() {
        return Err(std::io::Error::other("closed before the greeting"));
    }
    Ok(())
}

/// Runs `f` on a new thread in the namespace of `netns` (a file of it).
fn in_ns<T: Send + 'static>(netns: &Arc<File>, f: impl FnOnce() -> T + Send + 'static) -> JoinHandle<T> {
    let netns = Arc::clone(netns);
    std::thread::spawn(move || {
        nix::sched::setns(netns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        f()
    })
}

/// One attempt from A's member.
pub fn attempt(ma: &Netns) -> std::io::Result<()> {
    in_ns(&Arc::new(ma.file()), attempt_here).join().expect("attempt thread")
}

/// Runs the load for `before`, starts `fault` on a thread of its own (the
/// load goes on while it runs), runs the load for `after` more, and waits
/// for the fault and the attempts still under way.
pub fn failover(ma: &Netns, before: Duration, after: Duration, fault: impl FnOnce() + Send) -> Outcome {
    std::thread::scope(|scope| {
        let mut fault = Some(fault);
        load(
            ma,
            before + after,
            || {
                if let Some(f) = fault.take() {
                    scope.spawn(f);
                }
            },
            before,
        )
    })
}

/// The load of `failover` for `total`, calling `at_fault` once `before` has
/// passed.
fn load(ma: &Netns, total: Duration, mut at_fault: impl FnMut(), before: Duration) -> Outcome {
    let netns = Arc::new(ma.file());
    let stop = Arc::new(AtomicBool::new(false));
    let stream = {
        let stop = Arc::clone(&stop);
        in_ns(&netns, move || {
            let mut s = connect_here().expect("the stream connects");
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let mut reader = BufReader::new(s.try_clone().unwrap());
            let mut greeting = String::new();
            reader.read_line(&mut greeting).expect("the stream's greeting");
            let (mut survived, mut stall, mut last) = (true, Duration::ZERO, Instant::now());
            let mut n: u8 = 0;
            while !stop.load(Ordering::Relaxed) {
                n = n.wrapping_add(1);
                let chunk = [n; 64];
                let mut back = [0u8; 64];
                if s.write_all(&chunk).and_then(|_| reader.read_exact(&mut back)).is_err() || back != chunk {
                    survived = false;
                    break;
                }
                stall = stall.max(last.elapsed());
                last = Instant::now();
                std::thread::sleep(Duration::from_millis(10));
            }
            (survived, stall)
        })
    };
    let results: Arc<Mutex<Vec<Attempt>>> = Arc::default();
    let start = Instant::now();
    let mut handles = Vec::new();
    let mut i: u32 = 0;
    while start.elapsed() < total {
        if start.elapsed() >= before {
            at_fault();
        }
        let at = PERIOD * i;
        if let Some(wait) = at.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        i += 1;
        let (results, began) = (Arc::clone(&results), start.elapsed());
        handles.push(in_ns(&netns, move || {
            let t = Instant::now();
            let r = attempt_here().map(|_| t.elapsed());
            results.lock().unwrap().push((began, r));
        }));
    }
    for h in handles {
        let _ = h.join();
    }
    stop.store(true, Ordering::Relaxed);
    let (stream_survived, stream_stall) = stream.join().unwrap_or((false, Duration::ZERO));
    let mut results = std::mem::take(&mut *results.lock().unwrap());
    results.sort_by_key(|(t, _)| *t);
    let bad: Vec<Duration> =
        results.iter().filter(|(_, r)| r.as_ref().map_or(true, |took| *took > STALLED)).map(|(t, _)| *t).collect();
    let outage = match (bad.first(), bad.last()) {
        (Some(first), Some(last)) => *last - *first + PERIOD,
        _ => Duration::ZERO,
    };
    Outcome {
        outage,
        attempts: results.len(),
        failed: results.iter().filter(|(_, r)| r.is_err()).count(),
        stalled: results.iter().filter(|(_, r)| r.as_ref().is_ok_and(|took| *took > STALLED)).count(),
        stream_survived,
        stream_stall,
        held: true,
    }
}
