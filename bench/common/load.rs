//! Closed-loop load: TCP connect + request/reply + abort, and UDP
//! request/reply, against echo servers. One client thread per run keeps the
//! two CPUs of these machines split between client and server; the
//! multi-threaded, interleaved load is `interleave`.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hm_testkit::Netns;

pub(crate) const REQUEST: &[u8; 32] = b"hostmesh-bench-request-32-bytes!";

/// Servers in the backend namespace: TCP answers one request and waits for
/// the client to close, UDP echoes. One thread of each is pinned to CPU 1
/// (for one client thread on CPU 0); more are left to the scheduler.
pub struct EchoServers {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl EchoServers {
    pub fn start(ns: &Netns, tcp: SocketAddr, udp: SocketAddr) -> EchoServers {
        EchoServers::with_threads(ns, tcp, udp, 1)
    }

    /// `threads` TCP and as many UDP server threads, sharing one listener
    /// and one socket.
    pub fn with_threads(ns: &Netns, tcp: SocketAddr, udp: SocketAddr, threads: usize) -> EchoServers {
        let stop = Arc::new(AtomicBool::new(false));
        let listener = ns.run(move || TcpListener::bind(tcp).expect("bind tcp"));
        listener.set_nonblocking(true).unwrap();
        let socket = ns.run(move || UdpSocket::bind(udp).expect("bind udp"));
        socket.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let pin = threads == 1;
        let mut handles = Vec::new();
        for _ in 0..threads.max(1) {
            let (done, listener) = (Arc::clone(&stop), listener.try_clone().expect("clone the listener"));
            handles.push(std::thread::spawn(move || {
                if pin {
                    pin_to_cpu(1);
                }
                serve_tcp(&listener, &done)
            }));
            let (done, socket) = (Arc::clone(&stop), socket.try_clone().expect("clone the socket"));
            handles.push(std::thread::spawn(move || {
                if pin {
                    pin_to_cpu(1);
                }
                let mut buf = [0u8; 64];
                while !done.load(Ordering::Relaxed) {
                    if let Ok((n, from)) = socket.recv_from(&mut buf) {
                        let _ = socket.send_to(&buf[..n], from);
                    }
                }
            }));
        }
        EchoServers { stop, threads: handles }
    }
}

/// Accepts (waiting in poll(2), so threads that share the listener sleep
/// until a connection comes), answers one request, waits for the close.
fn serve_tcp(listener: &TcpListener, stop: &AtomicBool) {
    use std::os::fd::AsRawFd;
    let mut buf = [0u8; 64];
    while !stop.load(Ordering::Relaxed) {
        let mut pfd = libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd for the duration of the call.
        if unsafe { libc::poll(&mut pfd, 1, 50) } <= 0 {
            continue;
        }
        // Another thread may have taken it: accept is non-blocking.
        if let Ok((mut c, _)) = listener.accept() {
            let _ = c.set_nonblocking(false);
            let _ = c.set_read_timeout(Some(Duration::from_secs(1)));
            if c.read(&mut buf).unwrap_or(0) > 0 {
                let _ = c.write_all(&buf[..REQUEST.len()]);
                // The client ends the connection (see tcp_rate).
                let _ = c.read(&mut buf);
            }
        }
    }
}

impl Drop for EchoServers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// A TCP server that reads and discards, a thread per connection: the
/// end of `interleave`'s bulk streams.
pub struct Sink {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Sink {
    pub fn start(ns: &Netns, at: SocketAddr) -> Sink {
        let listener = ns.run(move || TcpListener::bind(at).expect("bind the sink"));
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut s, _)) => {
                        let done = Arc::clone(&done);
                        s.set_nonblocking(false).unwrap();
                        s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
                        std::thread::spawn(move || {
                            let mut buf = vec![0u8; 256 * 1024];
                            while !done.load(Ordering::Relaxed) {
                                match s.read(&mut buf) {
                                    Ok(0) => return,
                                    Ok(_) => {}
                                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                                    Err(_) => return,
                                }
                            }
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
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

/// Ctrl-C ends the current measurement; the caller then unwinds, so every
/// namespace, daemon and cgroup guard still cleans up.
pub fn catch_interrupts() {
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_interrupt as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_interrupt as *const () as libc::sighandler_t);
    }
}

pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

#[derive(Debug, Clone, Copy)]
pub struct Rate {
    pub per_sec: f64,
    pub errors: u64,
}

/// Pins the calling thread: client and server each get a CPU of their own
/// (on a 2-CPU machine), which steadies the rates.
pub fn pin_to_cpu(cpu: usize) {
    let n = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let mut set = nix::sched::CpuSet::new();
    if set.set(cpu % n).is_ok() {
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
    }
}

/// A TCP socket bound to `src` and connected to `dst`.
pub(crate) fn connect_from(src: IpAddr, dst: SocketAddr) -> std::io::Result<TcpStream> {
    connect_within(src, dst, None)
}

/// A TCP socket bound to `src` and connected to `dst`, closed with a reset
/// (SO_LINGER 0); `limit` bounds the connect (SO_SNDTIMEO, which a blocking
/// connect(2) honours), so a SYN lost for good does not wait two minutes.
pub fn connect_within(src: IpAddr, dst: SocketAddr, limit: Option<Duration>) -> std::io::Result<TcpStream> {
    use std::os::fd::FromRawFd;
    let family = if dst.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    // SAFETY: plain socket(2); the fd is owned by the TcpStream below.
    let fd = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh socket no one else owns.
    let stream = unsafe { TcpStream::from_raw_fd(fd) };
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: a valid socket and a correctly sized linger struct.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &linger as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    if limit.is_some() {
        stream.set_write_timeout(limit)?;
    }
    let sock = nix::sys::socket::SockaddrStorage::from(SocketAddr::new(src, 0));
    nix::sys::socket::bind(fd, &sock).map_err(std::io::Error::from)?;
    let to = nix::sys::socket::SockaddrStorage::from(dst);
    nix::sys::socket::connect(fd, &to).map_err(std::io::Error::from)?;
    Ok(stream)
}

/// TCP connect + request + reply + abort from `src` to `dst` for `secs`,
/// in `ns`. The client ends each connection with a RST (SO_LINGER 0), so
/// no TIME_WAIT piles up: tens of thousands of them would turn every
/// connect() into a search for a free port, and on the server a NATed
/// connection could meet the TIME_WAIT of an earlier one from the same
/// client port to another address (a direct one, or another VIP) whose TCP
/// timestamps differ, and be taken for an old duplicate. Each path also
/// uses its own source address.
pub fn tcp_rate(ns: &Netns, src: IpAddr, dst: SocketAddr, secs: Duration) -> Rate {
    ns.run(move || {
        pin_to_cpu(0);
        let mut buf = [0u8; 64];
        let (mut ok, mut errors) = (0u64, 0u64);
        let start = Instant::now();
        while start.elapsed() < secs && !interrupted() {
            match tcp_exchange(src, dst, &mut buf) {
                Ok(()) => ok += 1,
                Err(_) => errors += 1,
            }
        }
        Rate { per_sec: ok as f64 / start.elapsed().as_secs_f64(), errors }
    })
}

/// One connection: connect, the request, its whole reply; the abort is
/// the drop (SO_LINGER 0, see connect_from).
pub(crate) fn tcp_exchange(src: IpAddr, dst: SocketAddr, buf: &mut [u8; 64]) -> std::io::Result<()> {
    let mut s = connect_from(src, dst)?;
    s.set_read_timeout(Some(Duration::from_secs(1)))?;
    s.write_all(REQUEST)?;
    let mut got = 0;
    while got < REQUEST.len() {
        match s.read(&mut buf[got..])? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => got += n,
        }
    }
    Ok(())
}

/// Makes up to `n` TCP connections (request/reply each) within `limit`;
/// returns how many were made.
pub fn tcp_count(ns: &Netns, src: IpAddr, dst: SocketAddr, n: u32, limit: Duration) -> u64 {
    ns.run(move || {
        let mut buf = [0u8; 64];
        let start = Instant::now();
        let mut made = 0u64;
        while made < u64::from(n) && start.elapsed() < limit && !interrupted() {
            if let Ok(mut s) = connect_from(src, dst) {
                let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
                if s.write_all(REQUEST).is_ok() && s.read(&mut buf).unwrap_or(0) > 0 {
                    made += 1;
                }
            }
        }
        made
    })
}

/// UDP request/reply on one unconnected socket from `src` to `dst`.
pub fn udp_rate(ns: &Netns, src: IpAddr, dst: SocketAddr, secs: Duration) -> Rate {
    ns.run(move || {
        pin_to_cpu(0);
        let s = UdpSocket::bind(SocketAddr::new(src, 0)).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        let mut buf = [0u8; 64];
        let (mut ok, mut errors) = (0u64, 0u64);
        let start = Instant::now();
        while start.elapsed() < secs && !interrupted() {
            if s.send_to(REQUEST, dst).is_err() {
                errors += 1;
                continue;
            }
            match s.recv_from(&mut buf) {
                Ok(_) => ok += 1,
                Err(_) => errors += 1,
            }
        }
        Rate { per_sec: ok as f64 / start.elapsed().as_secs_f64(), errors }
    })
}

/// Runs the bench process in a cgroup of its own (the connect-time
/// programs attach there) and moves it back on drop.
pub struct InCgroup {
    cgroup: hm_testkit::Cgroup,
    original: std::path::PathBuf,
}

impl InCgroup {
    pub fn enter() -> InCgroup {
        let cgroup = hm_testkit::Cgroup::new();
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let rel = own.lines().find_map(|l| l.strip_prefix("0::")).unwrap_or("/").trim_start_matches('/').to_string();
        let root = cgroup.path().parent().unwrap().to_path_buf();
        cgroup.add(std::process::id());
        InCgroup { cgroup, original: root.join(rel) }
    }

    pub fn path(&self) -> &std::path::Path {
        self.cgroup.path()
    }
}

impl Drop for InCgroup {
    fn drop(&mut self) {
        let _ = std::fs::write(self.original.join("cgroup.procs"), std::process::id().to_string());
    }
}
