//! Echo servers that answer every request with their name, so a test sees
//! which backend it reached. They run on threads inside a namespace and stop
//! when dropped.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::Netns;

const POLL: Duration = Duration::from_millis(50);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Tcp,
    Udp,
}

pub struct Servers {
    stops: Vec<Arc<AtomicBool>>,
    threads: Vec<JoinHandle<()>>,
}

impl Servers {
    /// Starts one server per (address, protocol, name) in `ns`.
    pub fn start(ns: &Netns, specs: &[(&str, Proto, &str)]) -> Servers {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for (addr, proto, name) in specs {
            let addr: SocketAddr = addr.parse().expect("server address");
            let (name, stop) = (name.to_string(), Arc::clone(&stop));
            // Bind in the namespace, then serve on a thread of our own.
            let handle = match proto {
                Proto::Tcp => {
                    let listener =
                        ns.run(move || TcpListener::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}")));
                    listener.set_nonblocking(true).unwrap();
                    std::thread::spawn(move || serve_tcp(listener, name, stop))
                }
                Proto::Udp => {
                    let socket = ns.run(move || UdpSocket::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}")));
                    socket.set_read_timeout(Some(POLL)).unwrap();
                    std::thread::spawn(move || serve_udp(socket, name, stop))
                }
            };
            threads.push(handle);
        }
        Servers { stops: vec![stop], threads }
    }
}

fn serve_tcp(listener: TcpListener, name: String, stop: Arc<AtomicBool>) {
    let mut handlers = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((conn, _)) => {
                let (name, stop) = (name.clone(), Arc::clone(&stop));
                handlers.push(std::thread::spawn(move || serve_conn(conn, &name, &stop)));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    for h in handlers {
        let _ = h.join();
    }
}

fn serve_conn(mut conn: TcpStream, name: &str, stop: &AtomicBool) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(POLL));
    let mut buf = [0u8; 512];
    while !stop.load(Ordering::Relaxed) {
        match conn.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {
                if conn.write_all(format!("{name}\n").as_bytes()).is_err() {
                    return;
                }
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
    }
}

fn serve_udp(socket: UdpSocket, name: String, stop: Arc<AtomicBool>) {
    let mut buf = [0u8; 512];
    while !stop.load(Ordering::Relaxed) {
        if let Ok((_, from)) = socket.recv_from(&mut buf) {
            let _ = socket.send_to(format!("{name}\n").as_bytes(), from);
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
