//! A host-networked client of a VIP, for hostmesh's integration tests.
//!
//! The tests start it inside their own network namespace and cgroup, so the
//! connect-time programs see it like any process on the host. A process of
//! its own (a cgroup holds processes, not threads), and a Rust one: under
//! the kernel matrix's emulation a Python interpreter takes half a second
//! to start, this a few milliseconds. Every mode prints one JSON object on
//! stdout.
//!
//!   requests PROTO HOST PORT COUNT   COUNT requests, each on a new socket:
//!       {"answers": {"b1": 10, ...}, "peers": ["10.96.0.10:80"], "errors": []}
//!   requests-from SOURCE PROTO HOST PORT COUNT   the same, each socket bound
//!       to SOURCE first
//!   from-port SOURCE SPORT PROTO HOST PORT   one request on a socket bound to
//!       SOURCE:SPORT: {"answer": "b1"} or {"error": "..."}
//!   loop PROTO HOST PORT INTERVAL SECONDS   a request every INTERVAL for SECONDS:
//!       {"ok": 80, "failures": ["12.3: timed out", ...]}
//!   watch PROTO HOST PORT INTERVAL SECONDS   like loop, one line per request:
//!       {"t": <CLOCK_MONOTONIC seconds>, "answer": "b1"} or {"t": ..., "error": "..."}
//!   refused PROTO HOST PORT   one connect(): {"error": "ECONNREFUSED", "seconds": 0.001}
//!   hold HOST PORT   one TCP connection; a request now and one per line on stdin:
//!       prints {"answer": "b1"} per request, or {"error": "ECONNRESET"} and ends
//!   bulk HOST PORT BYTES   one TCP connection: BYTES sent, the sending side
//!       shut, the answers read to the end: {"answer": "f1", "mss": 1228}
//!       (TCP_MAXSEG at the end: what path MTU discovery left) or {"error": "..."}
//!   hold-udp HOST PORT connected|unconnected   one UDP socket (one flow), a
//!       request now and one per line on stdin: {"answer": "b1"} or
//!       {"error": "ECONNABORTED"} per request

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, BufRead, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::os::fd::OwnedFd;
use std::time::Duration;

use nix::sys::socket::{self, sockopt, AddressFamily, SockFlag, SockType, SockaddrStorage};
use nix::sys::time::TimeVal;
use serde_json::{json, Value};

/// Every send, receive and connect gives up after this.
const TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Proto {
    Tcp,
    Udp,
}

fn proto(s: &str) -> Proto {
    match s {
        "tcp" => Proto::Tcp,
        "udp" => Proto::Udp,
        other => fail(&format!("unknown protocol {other}")),
    }
}

fn fail(why: &str) -> ! {
    eprintln!("vip_client: {why}");
    std::process::exit(2)
}

fn addr(host: &str, port: &str) -> SocketAddr {
    let ip: IpAddr = host.parse().unwrap_or_else(|_| fail(&format!("not an address: {host}")));
    SocketAddr::new(ip, port.parse().unwrap_or_else(|_| fail(&format!("not a port: {port}"))))
}

fn number<T: std::str::FromStr>(s: &str) -> T {
    s.parse().unwrap_or_else(|_| fail(&format!("not a number: {s}")))
}

/// A socket for `dst`'s family, with the timeout set both ways and, if
/// given, bound to `source` (SO_REUSEADDR, as a client reusing a port).
fn new_socket(kind: Proto, dst: &SocketAddr, source: Option<SocketAddr>, timeout: Duration) -> io::Result<OwnedFd> {
    let family = if dst.is_ipv6() { AddressFamily::Inet6 } else { AddressFamily::Inet };
    let ty = if kind == Proto::Tcp { SockType::Stream } else { SockType::Datagram };
    let fd = socket::socket(family, ty, SockFlag::SOCK_CLOEXEC, None)?;
    let tv = TimeVal::new(timeout.as_secs() as i64, timeout.subsec_micros() as i64);
    socket::setsockopt(&fd, sockopt::SendTimeout, &tv)?;
    socket::setsockopt(&fd, sockopt::ReceiveTimeout, &tv)?;
    if let Some(src) = source {
        socket::setsockopt(&fd, sockopt::ReuseAddr, &true)?;
        socket::bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrStorage::from(src))?;
    }
    Ok(fd)
}

/// A blocking connect(2), which honours SO_SNDTIMEO.
fn connect(fd: &OwnedFd, dst: &SocketAddr) -> io::Result<()> {
    socket::connect(std::os::fd::AsRawFd::as_raw_fd(fd), &SockaddrStorage::from(*dst)).map_err(io::Error::from)
}

/// One request on a new socket (bound to `source`, if given): the answer
/// and the peer the socket saw.
fn request(kind: Proto, dst: &SocketAddr, source: Option<SocketAddr>) -> io::Result<(String, String)> {
    let fd = new_socket(kind, dst, source, TIMEOUT)?;
    let mut buf = [0u8; 64];
    let (n, peer) = if kind == Proto::Tcp {
        connect(&fd, dst)?;
        let mut s = TcpStream::from(fd);
        let peer = s.peer_addr()?;
        s.write_all(b"hello\n")?;
        (s.read(&mut buf)?, peer)
    } else {
        let s = UdpSocket::from(fd);
        s.send_to(b"hello\n", dst)?;
        s.recv_from(&mut buf)?
    };
    Ok((String::from_utf8_lossy(&buf[..n]).trim().to_string(), peer.to_string()))
}

/// `bytes` sent on one TCP connection, then its sending side shut and
/// everything the server answers read until it closes: the first answer
/// and the segment size the connection ended with.
fn bulk(dst: &SocketAddr, bytes: usize) -> io::Result<(String, u32)> {
    let fd = new_socket(Proto::Tcp, dst, None, TIMEOUT)?;
    connect(&fd, dst)?;
    let mut s = TcpStream::from(fd);
    let chunk = vec![b'x'; 65536];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len());
        s.write_all(&chunk[..n])?;
        left -= n;
    }
    s.shutdown(std::net::Shutdown::Write)?;
    let mut answers = String::new();
    s.read_to_string(&mut answers)?;
    let mss = socket::getsockopt(&s, sockopt::TcpMaxSeg).map_err(io::Error::from)?;
    Ok((answers.lines().next().unwrap_or_default().to_string(), mss))
}

/// An error as its errno's name (`ECONNREFUSED`), or its text.
fn errno_name(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => format!("{:?}", nix::errno::Errno::from_raw(n)),
        None => e.to_string(),
    }
}

/// CLOCK_MONOTONIC in seconds (what the tests compare with theirs).
fn monotonic() -> f64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC");
    ts.tv_sec() as f64 + ts.tv_nsec() as f64 / 1e9
}

fn requests(kind: Proto, dst: &SocketAddr, count: u32, source: Option<SocketAddr>) -> Value {
    let (mut answers, mut peers, mut errors) = (BTreeMap::<String, u64>::new(), BTreeSet::new(), Vec::new());
    for _ in 0..count {
        match request(kind, dst, source) {
            Ok((answer, peer)) => {
                *answers.entry(answer).or_default() += 1;
                peers.insert(peer);
            }
            Err(e) => errors.push(e.to_string()),
        }
    }
    json!({ "answers": answers, "peers": peers, "errors": errors })
}

/// A request every `interval` for `seconds`; `each` gets the time each
/// started and its outcome.
fn every(kind: Proto, dst: &SocketAddr, interval: f64, seconds: f64, mut each: impl FnMut(f64, io::Result<String>)) {
    let start = monotonic();
    while monotonic() - start < seconds {
        let t = monotonic();
        each(t, request(kind, dst, None).map(|(a, _)| a));
        let spent = monotonic() - t;
        if spent < interval {
            std::thread::sleep(Duration::from_secs_f64(interval - spent));
        }
    }
}

fn refused(kind: Proto, dst: &SocketAddr) -> Value {
    let start = monotonic();
    let outcome = (|| -> io::Result<()> {
        let fd = new_socket(kind, dst, None, Duration::from_secs(5))?;
        connect(&fd, dst)?;
        if kind == Proto::Udp {
            // A connected UDP socket learns of refusal on its next send/recv.
            let s = UdpSocket::from(fd);
            s.send(b"hello\n")?;
            s.recv(&mut [0u8; 64])?;
        }
        Ok(())
    })();
    let error = match outcome {
        Ok(()) => "connected".to_string(),
        Err(e) => errno_name(&e),
    };
    json!({ "error": error, "seconds": monotonic() - start })
}

fn print(v: &Value) {
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

/// Waits for the next line on stdin; false at its end.
fn next_line() -> bool {
    let mut line = String::new();
    io::stdin().lock().read_line(&mut line).map(|n| n > 0).unwrap_or(false)
}

fn hold(dst: &SocketAddr) -> io::Result<()> {
    let fd = new_socket(Proto::Tcp, dst, None, TIMEOUT)?;
    connect(&fd, dst)?;
    let mut s = TcpStream::from(fd);
    loop {
        let mut buf = [0u8; 64];
        let out = match s.write_all(b"hello\n").and_then(|()| s.read(&mut buf)) {
            Ok(0) => json!({ "error": "closed" }),
            Ok(n) => json!({ "answer": String::from_utf8_lossy(&buf[..n]).trim() }),
            Err(e) => json!({ "error": errno_name(&e) }),
        };
        print(&out);
        if out.get("error").is_some() || !next_line() {
            return Ok(());
        }
    }
}

fn hold_udp(dst: &SocketAddr, connected: bool) -> io::Result<()> {
    let fd = new_socket(Proto::Udp, dst, None, TIMEOUT)?;
    if connected {
        connect(&fd, dst)?;
    }
    let s = UdpSocket::from(fd);
    loop {
        let mut buf = [0u8; 64];
        let got = if connected {
            s.send(b"hello\n").and_then(|_| s.recv(&mut buf))
        } else {
            s.send_to(b"hello\n", dst).and_then(|_| s.recv_from(&mut buf).map(|(n, _)| n))
        };
        print(&match got {
            Ok(n) => json!({ "answer": String::from_utf8_lossy(&buf[..n]).trim() }),
            Err(e) => json!({ "error": errno_name(&e) }),
        });
        if !next_line() {
            return Ok(());
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = match a.as_slice() {
        ["requests", p, host, port, count] => requests(proto(p), &addr(host, port), number(count), None),
        ["requests-from", src, p, host, port, count] => {
            requests(proto(p), &addr(host, port), number(count), Some(addr(src, "0")))
        }
        ["from-port", src, sport, p, host, port] => {
            match request(proto(p), &addr(host, port), Some(addr(src, sport))) {
                Ok((answer, _)) => json!({ "answer": answer }),
                Err(e) => json!({ "error": e.to_string() }),
            }
        }
        ["loop", p, host, port, interval, seconds] => {
            let (mut ok, mut failures, start) = (0u64, Vec::new(), monotonic());
            every(proto(p), &addr(host, port), number(interval), number(seconds), |t, r| match r {
                Ok(_) => ok += 1,
                Err(e) => failures.push(format!("{:.2}: {e}", t - start)),
            });
            json!({ "ok": ok, "failures": failures })
        }
        ["watch", p, host, port, interval, seconds] => {
            every(proto(p), &addr(host, port), number(interval), number(seconds), |t, r| {
                print(&match r {
                    Ok(answer) => json!({ "t": t, "answer": answer }),
                    Err(e) => json!({ "t": t, "error": e.to_string() }),
                })
            });
            return;
        }
        ["refused", p, host, port] => refused(proto(p), &addr(host, port)),
        ["bulk", host, port, bytes] => match bulk(&addr(host, port), number(bytes)) {
            Ok((answer, mss)) => json!({ "answer": answer, "mss": mss }),
            Err(e) => json!({ "error": errno_name(&e) }),
        },
        ["hold", host, port] => return hold(&addr(host, port)).unwrap_or_else(|e| fail(&e.to_string())),
        ["hold-udp", host, port, how] => {
            let connected = match *how {
                "connected" => true,
                "unconnected" => false,
                other => fail(&format!("hold-udp: {other} is not connected or unconnected")),
            };
            return hold_udp(&addr(host, port), connected).unwrap_or_else(|e| fail(&e.to_string()));
        }
        _ => fail(&format!("usage: see tests/clients/vip_client.rs ({args:?})")),
    };
    print(&out);
}
