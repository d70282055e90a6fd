//! Bulk TCP: a sink that counts what one connection sends and answers the
//! total when the sender is done, and the sender that measures it.

use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hm_bench::load::{interrupted, pin_to_cpu};
use hm_testkit::Netns;
use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, SockaddrStorage};

const CHUNK: usize = 64 * 1024;

/// Counts the bytes of each connection; answers the count (8 bytes, big
/// endian) at the sender's end of stream. Stops when dropped.
pub struct Sink {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Sink {
    pub fn start(ns: &Netns, addr: SocketAddr) -> Sink {
        let listener = ns.run(move || TcpListener::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}")));
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            pin_to_cpu(1);
            let mut buf = vec![0u8; CHUNK];
            while !s.load(Ordering::Relaxed) {
                let Ok((mut c, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                };
                let _ = c.set_nonblocking(false);
                let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
                let mut total: u64 = 0;
                loop {
                    match c.read(&mut buf) {
                        Ok(0) => {
                            let _ = c.write_all(&total.to_be_bytes());
                            break;
                        }
                        Ok(n) => total += n as u64,
                        Err(_) => break,
                    }
                }
            }
        });
        Sink { stop, thread: Some(thread) }
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One connection from `src` in `ns` to a sink at `dst`, writing for
/// `secs`: bytes per second the sink received (0 if the transfer failed).
pub fn throughput(ns: &Netns, src: IpAddr, dst: SocketAddr, secs: Duration) -> f64 {
    ns.run(move || {
        pin_to_cpu(0);
        let run = || -> std::io::Result<f64> {
            let family = if src.is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 };
            let fd = socket::socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)?;
            socket::bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrStorage::from(SocketAddr::new(src, 0)))?;
            socket::connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrStorage::from(dst))?;
            let mut stream = std::net::TcpStream::from(fd);
            stream.set_write_timeout(Some(Duration::from_secs(2)))?;
            stream.set_read_timeout(Some(Duration::from_secs(5)))?;
            let chunk = vec![0x5au8; CHUNK];
            let start = Instant::now();
            while start.elapsed() < secs && !interrupted() {
                stream.write_all(&chunk)?;
            }
            stream.shutdown(Shutdown::Write)?;
            let mut total = [0u8; 8];
            stream.read_exact(&mut total)?;
            Ok(u64::from_be_bytes(total) as f64 / start.elapsed().as_secs_f64())
        };
        run().unwrap_or_else(|e| {
            eprintln!("throughput {src} -> {dst}: {e}");
            0.0
        })
    })
}
