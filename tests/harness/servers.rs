//! Test servers on threads inside a namespace, stopped when dropped:
//! named servers answer every request with their name, so a test sees which
//! backend it reached; echo servers tell each client the address they see
//! it as and echo what it sends.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::Netns;

const POLL: Duration = Duration::from_millis(50);
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Tcp,
    Udp,
}

/// What a server answers.
#[derive(Debug, Clone)]
enum Answer {
    /// Its name, once per request (TCP: per read; UDP: per datagram).
    Name(String),
    /// TCP: a greeting "<client ip> <server ip>", then everything back;
    /// UDP: "<client ip>" per datagram.
    Echo,
}

pub struct Servers {
    stops: Vec<Arc<AtomicBool>>,
    threads: Vec<JoinHandle<()>>,
}

impl Servers {
    /// Starts one named server per (address, protocol, name) in `ns`.
    pub fn start(ns: &Netns, specs: &[(&str, Proto, &str)]) -> Servers {
        let specs: Vec<(SocketAddr, Proto, Answer)> = specs
            .iter()
            .map(|(addr, proto, name)| (addr.parse().expect("server address"), *proto, Answer::Name(name.to_string())))
            .collect();
        Self::spawn(ns, specs)
    }

    /// Starts a TCP and a UDP echo server on each address in `ns`.
    pub fn echo(ns: &Netns, addrs: &[SocketAddr]) -> Servers {
        let specs =
            addrs.iter().flat_map(|a| [(*a, Proto::Tcp, Answer::Echo), (*a, Proto::Udp, Answer::Echo)]).collect();
        Self::spawn(ns, specs)
    }

    fn spawn(ns: &Netns, specs: Vec<(SocketAddr, Proto, Answer)>) -> Servers {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for (addr, proto, answer) in specs {
            let stop = Arc::clone(&stop);
            // Bind in the namespace, then serve on a thread of our own.
            let handle = match proto {
                Proto::Tcp => {
                    let listener =
                        ns.run(move || TcpListener::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}")));
                    listener.set_nonblocking(true).unwrap();
                    std::thread::spawn(move || serve_tcp(listener, answer, stop))
                }
                Proto::Udp => {
                    let socket = ns.run(move || UdpSocket::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}")));
                    socket.set_read_timeout(Some(POLL)).unwrap();
                    std::thread::spawn(move || serve_udp(socket, answer, stop))
                }
            };
            threads.push(handle);
        }
        Servers { stops: vec![stop], threads }
    }
}

fn serve_tcp(listener: TcpListener, answer: Answer, stop: Arc<AtomicBool>) {
    use std::os::fd::AsFd;
    let mut handlers = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        // Wake at once for a connection, at least every POLL for a stop.
        let mut fds = [nix::poll::PollFd::new(listener.as_fd(), nix::poll::PollFlags::POLLIN)];
        let _ = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(POLL.as_millis() as u16));
        while let Ok((conn, peer)) = listener.accept() {
            // Handlers that are done let go of their threads (a test may
            // open tens of thousands of connections).
            handlers.retain(|h: &JoinHandle<()>| !h.is_finished());
            let (answer, stop) = (answer.clone(), Arc::clone(&stop));
            handlers.push(std::thread::spawn(move || serve_conn(conn, peer, &answer, &stop)));
        }
    }
    for h in handlers {
        let _ = h.join();
    }
}

fn serve_conn(mut conn: TcpStream, peer: SocketAddr, answer: &Answer, stop: &AtomicBool) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(POLL));
    // A client that stops reading must not hold this thread (and the
    // guard that joins it) for ever.
    let _ = conn.set_write_timeout(Some(WRITE_TIMEOUT));
    if let Answer::Echo = answer {
        let server = conn.local_addr().map(|a| a.ip().to_string()).unwrap_or_default();
        if conn.write_all(format!("{} {server}\n", peer.ip()).as_bytes()).is_err() {
            return;
        }
    }
    let mut buf = [0u8; 16384];
    while !stop.load(Ordering::Relaxed) {
        let n = match conn.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => continue,
            Err(_) => return,
        };
        let written = match answer {
            Answer::Name(name) => conn.write_all(format!("{name}\n").as_bytes()),
            Answer::Echo => conn.write_all(&buf[..n]),
        };
        if written.is_err() {
            return;
        }
    }
}

fn serve_udp(socket: UdpSocket, answer: Answer, stop: Arc<AtomicBool>) {
    let mut buf = [0u8; 512];
    while !stop.load(Ordering::Relaxed) {
        if let Ok((_, from)) = socket.recv_from(&mut buf) {
            let reply = match &answer {
                Answer::Name(name) => format!("{name}\n"),
                Answer::Echo => format!("{}\n", from.ip()),
            };
            let _ = socket.send_to(reply.as_bytes(), from);
        }
    }
}

impl Servers {
    /// One guard for both sets.
    pub fn join(mut self, mut other: Servers) -> Servers {
        self.stops.append(&mut other.stops);
        self.threads.append(&mut other.threads);
        self
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        for stop in &self.stops {
            stop.store(true, Ordering::Relaxed);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
