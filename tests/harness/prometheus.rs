//! A real Prometheus server (Debian's `prometheus` package) in a test's
//! namespace, scraping one target every second, with its storage in a
//! scratch dir; ended by PID on drop. `http_get` is the plain HTTP/1.0
//! client the tests read /metrics and the query API with.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Stdio};
use std::time::Duration;

use crate::{wait_until, Netns, TempDir};

pub struct Prometheus {
    child: Child,
    listen: SocketAddr,
    dir: TempDir,
}

impl Prometheus {
    /// Starts it in `ns` (a handle to the test's namespace) scraping
    /// `target`'s /metrics, and waits until it answers queries.
    pub fn start(ns: &Netns, target: SocketAddr, listen: SocketAddr) -> Prometheus {
        let dir = TempDir::new("hm-prom");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\nscrape_configs:\n  - job_name: hostmesh\n    \
                 static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .expect("write prometheus.yml");
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log file");
        let child = ns
            .command("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address={listen}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .expect("run prometheus (Debian's prometheus package; scripts/deps installs it)");
        let p = Prometheus { child, listen, dir };
        let ready = wait_until("prometheus ready", Duration::from_secs(30), || {
            http_get(ns, listen, "/-/ready").is_ok_and(|(code, _)| code == 200)
        });
        assert!(ready.is_ok(), "prometheus did not become ready: {}", p.log());
        p
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// An instant query (from inside `ns`): each series' labels and value.
    pub fn query(&self, ns: &Netns, expr: &str) -> Vec<(serde_json::Map<String, serde_json::Value>, f64)> {
        let path = format!("/api/v1/query?query={}", percent_encode(expr));
        let (code, body) = http_get(ns, self.listen, &path).expect("query prometheus");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        assert_eq!(code, 200, "query {expr}: {body}");
        v["data"]["result"]
            .as_array()
            .map(|rs| {
                rs.iter()
                    .map(|r| {
                        let labels = r["metric"].as_object().cloned().unwrap_or_default();
                        let value = r["value"][1].as_str().and_then(|s| s.parse().ok()).unwrap_or(f64::NAN);
                        (labels, value)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let child = &mut self.child;
        if wait_until("prometheus to exit", Duration::from_secs(5), || child.try_wait().ok().flatten().is_some())
            .is_err()
        {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// GET `path` from `addr` inside `ns`: (status code, body).
pub fn http_get(ns: &Netns, addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    let raw = ns.run(move || -> std::io::Result<Vec<u8>> {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.write_all(request.as_bytes())?;
        let mut out = Vec::new();
        s.read_to_end(&mut out)?;
        Ok(out)
    })?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    Ok((code, body.to_string()))
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
