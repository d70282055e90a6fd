//! The checks themselves, one async function per kind. Each returns `Ok`
//! on a pass, or the reason of the failure in a few words, as the status
//! and the log show it ("connect: connection refused", "http 503",
//! "timeout after 1s"). They run in the daemon's network namespace, from
//! `source` when it is given.

use std::net::SocketAddr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Stdio;

use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpSocket, TcpStream, UdpSocket};

use crate::config::{show_duration, CheckKind, HealthCheck};

/// The largest answer a udp check reads.
const UDP_ANSWER_MAX: usize = 2048;
/// The PATH an exec check runs with (its environment is otherwise empty).
const EXEC_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// One check of `backend` (the address as configured; `check.port`, when
/// set, replaces its port), bounded by the check's timeout.
pub(crate) async fn check(service: &str, backend: SocketAddr, check: &HealthCheck) -> Result<(), String> {
    let target = SocketAddr::new(backend.ip(), check.port.unwrap_or(backend.port()));
    let run = async {
        match &check.kind {
            CheckKind::Tcp => connect(target, check).await.map(drop),
            CheckKind::Http { path, expect, host } => http(target, check, path, *expect, host.as_deref()).await,
            CheckKind::Udp { send, expect } => udp(target, check, send, expect).await,
            CheckKind::Exec { command } => exec(service, target, command).await,
        }
    };
    match tokio::time::timeout(check.timeout, run).await {
        Ok(result) => result,
        Err(_) => Err(format!("timeout after {}", show_duration(check.timeout))),
    }
}

async fn connect(target: SocketAddr, check: &HealthCheck) -> Result<TcpStream, String> {
    let socket = if target.is_ipv4() { TcpSocket::new_v4() } else { TcpSocket::new_v6() };
    let socket = socket.map_err(|e| format!("socket: {}", reason(&e)))?;
    if let Some(source) = check.source {
        socket.bind(SocketAddr::new(source, 0)).map_err(|e| format!("bind {source}: {}", reason(&e)))?;
    }
    socket.connect(target).await.map_err(|e| format!("connect: {}", reason(&e)))
}

async fn http(
    target: SocketAddr,
    check: &HealthCheck,
    path: &str,
    (lo, hi): (u16, u16),
    host: Option<&str>,
) -> Result<(), String> {
    let stream = connect(target, check).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(stream))
        .await
        .map_err(|e| format!("http: {e}"))?;
    // The connection is driven beside the request, and ends with it.
    let conn = AbortOnDrop(tokio::spawn(conn));
    let host = host.map_or_else(|| target.to_string(), str::to_string);
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, host)
        .header(hyper::header::USER_AGENT, concat!("hostmesh/", env!("CARGO_PKG_VERSION")))
        .header(hyper::header::CONNECTION, "close")
        .body(Empty::new())
        .map_err(|e| format!("http: {e}"))?;
    let response = sender.send_request(request).await.map_err(|e| format!("http: {e}"))?;
    drop(conn);
    let status = response.status().as_u16();
    if (lo..=hi).contains(&status) {
        Ok(())
    } else {
        Err(format!("http {status}"))
    }
}

struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn udp(target: SocketAddr, check: &HealthCheck, send: &[u8], expect: &[u8]) -> Result<(), String> {
    let local = check.source.map_or_else(
        || if target.is_ipv4() { "0.0.0.0:0".parse().unwrap() } else { "[::]:0".parse().unwrap() },
        |s| SocketAddr::new(s, 0),
    );
    let socket = UdpSocket::bind(local).await.map_err(|e| format!("bind {}: {}", local.ip(), reason(&e)))?;
    // Connected, so an ICMP port unreachable comes back as an error.
    socket.connect(target).await.map_err(|e| format!("udp: {}", reason(&e)))?;
    socket.send(send).await.map_err(|e| format!("udp: {}", reason(&e)))?;
    let mut buf = vec![0u8; UDP_ANSWER_MAX];
    let n = socket.recv(&mut buf).await.map_err(|e| format!("udp: {}", reason(&e)))?;
    if expect.is_empty() || buf[..n].windows(expect.len()).any(|w| w == expect) {
        Ok(())
    } else {
        Err(format!("udp: an answer of {n} bytes without the expected payload"))
    }
}

async fn exec(service: &str, target: SocketAddr, command: &[String]) -> Result<(), String> {
    let (program, args) = command.split_first().ok_or("exec: no command")?;
    trusted_program(program)?;
    let (address, port) = (target.ip().to_string(), target.port().to_string());
    let args = args.iter().map(|a| a.replace("{address}", &address).replace("{port}", &port));
    let status = tokio::process::Command::new(program)
        .args(args)
        .env_clear()
        .env("PATH", EXEC_PATH)
        .env("HOSTMESH_SERVICE", service)
        .env("HOSTMESH_BACKEND_ADDRESS", &address)
        .env("HOSTMESH_BACKEND_PORT", &port)
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // A check past its timeout is dropped, and its process killed.
        .kill_on_drop(true)
        .status()
        .await
        .map_err(|e| format!("exec {program}: {}", reason(&e)))?;
    match (status.code(), std::os::unix::process::ExitStatusExt::signal(&status)) {
        (Some(0), _) => Ok(()),
        (Some(code), _) => Err(format!("exec: exit status {code}")),
        (None, Some(sig)) => Err(format!("exec: killed by signal {sig}")),
        (None, None) => Err("exec: ended without a status".to_string()),
    }
}

/// The daemon runs checks as its own user (root, as a rule): a program
/// someone else could have written is not run.
fn trusted_program(program: &str) -> Result<(), String> {
    let meta = std::fs::metadata(program).map_err(|e| format!("exec {program}: {}", reason(&e)))?;
    let uid = nix::unistd::geteuid().as_raw();
    if !meta.is_file() {
        return Err(format!("exec {program}: not a regular file"));
    }
    if meta.uid() != 0 && meta.uid() != uid {
        return Err(format!("exec {program}: owned by uid {}, not root; not run", meta.uid()));
    }
    if meta.permissions().mode() & 0o022 != 0 {
        return Err(format!("exec {program}: writable by group or others; not run"));
    }
    Ok(())
}

/// An I/O error as a few lower-case words ("connection refused").
fn reason(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => {
            let desc = nix::errno::Errno::from_raw(n).desc();
            let mut chars = desc.chars();
            chars.next().map_or_else(String::new, |c| c.to_lowercase().chain(chars).collect())
        }
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::time::Duration;

    use super::*;
    use crate::config::InitialState;

    fn hc(kind: CheckKind) -> HealthCheck {
        HealthCheck {
            kind,
            interval: Duration::from_secs(1),
            timeout: Duration::from_millis(500),
            rise: 1,
            fall: 1,
            port: None,
            source: None,
            initial: InitialState::Unknown,
        }
    }

    fn run(backend: SocketAddr, check: &HealthCheck) -> Result<(), String> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(super::check("t", backend, check))
    }

    /// A port nothing listens on.
    fn closed_port() -> SocketAddr {
        TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
    }

    /// Answers one HTTP request with `status` on a thread.
    fn http_once(status: u16) -> (SocketAddr, std::thread::JoinHandle<String>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let mut req = vec![0u8; 4096];
            let n = c.read(&mut req).unwrap();
            write!(c, "HTTP/1.1 {status} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").unwrap();
            String::from_utf8_lossy(&req[..n]).into_owned()
        });
        (addr, t)
    }

    #[test]
    fn tcp_passes_on_a_listener_and_names_a_refusal() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        assert_eq!(run(l.local_addr().unwrap(), &hc(CheckKind::Tcp)), Ok(()));
        assert_eq!(run(closed_port(), &hc(CheckKind::Tcp)), Err("connect: connection refused".into()));
        let mut other_port = hc(CheckKind::Tcp);
        other_port.port = Some(l.local_addr().unwrap().port());
        assert_eq!(run(closed_port(), &other_port), Ok(()), "`port` replaces the backend's");
    }

    #[test]
    fn http_checks_the_status_range_and_sends_path_and_host() {
        let kind = |host: Option<&str>| CheckKind::Http {
            path: "/healthz".into(),
            expect: (200, 299),
            host: host.map(str::to_string),
        };
        let (addr, t) = http_once(204);
        assert_eq!(run(addr, &hc(kind(Some("web.internal")))), Ok(()));
        let request = t.join().unwrap();
        assert!(request.starts_with("GET /healthz HTTP/1.1\r\n"), "{request}");
        assert!(request.to_lowercase().contains("host: web.internal\r\n"), "{request}");
        let (addr, t) = http_once(503);
        assert_eq!(run(addr, &hc(kind(None))), Err("http 503".into()));
        assert!(t.join().unwrap().to_lowercase().contains(&format!("host: {addr}\r\n")), "the default Host");
    }

    #[test]
    fn a_check_past_its_timeout_fails_saying_so() {
        // Accepted by the kernel, never answered.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let kind = CheckKind::Http { path: "/".into(), expect: (200, 399), host: None };
        assert_eq!(run(l.local_addr().unwrap(), &hc(kind)), Err("timeout after 500ms".into()));
    }

    #[test]
    fn udp_needs_an_answer_with_the_expected_payload() {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = s.local_addr().unwrap();
        let answering = s.try_clone().unwrap();
        let t = std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            for answer in [&b"xx pong xx"[..], b"nope"] {
                let (_, from) = answering.recv_from(&mut buf).unwrap();
                answering.send_to(answer, from).unwrap();
            }
        });
        let kind = CheckKind::Udp { send: b"ping".to_vec(), expect: b"pong".to_vec() };
        assert_eq!(run(addr, &hc(kind.clone())), Ok(()));
        assert_eq!(run(addr, &hc(kind.clone())), Err("udp: an answer of 4 bytes without the expected payload".into()));
        t.join().unwrap();
        // The port stays ours (a test beside this one could otherwise be
        // given it, and not answer): connected elsewhere, it takes nothing
        // from the check, which hears the port unreachable.
        s.connect("127.0.0.1:9").unwrap();
        assert_eq!(run(addr, &hc(kind)), Err("udp: connection refused".into()), "nothing listens any more");
    }

    #[test]
    fn exec_passes_on_exit_0_and_refuses_a_program_others_can_write() {
        let exec = |argv: &[&str]| CheckKind::Exec { command: argv.iter().map(|a| a.to_string()).collect() };
        let addr: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        assert_eq!(
            run(addr, &hc(exec(&["/bin/sh", "-c", "[ \"$0:$1\" = 127.0.0.1:8080 ]", "{address}", "{port}"]))),
            Ok(())
        );
        assert_eq!(run(addr, &hc(exec(&["/bin/sh", "-c", "exit 3"]))), Err("exec: exit status 3".into()));
        assert_eq!(run(addr, &hc(exec(&["/bin/sh", "-c", "[ -z \"$HOME\" ]"]))), Ok(()), "a clean environment");
        assert_eq!(run(addr, &hc(exec(&["/bin/sh", "-c", "sleep 5"]))), Err("timeout after 500ms".into()));
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("check");
        std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        let err = run(addr, &hc(exec(&[script.to_str().unwrap()]))).unwrap_err();
        assert!(err.ends_with("writable by group or others; not run"), "{err}");
    }
}
