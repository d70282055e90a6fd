//! What metrics cost the daemon at scale, without a scrape: two daemons
//! side by side with the same N services (one backend each), one with the
//! endpoint on (the default) and one with `metrics_listen = "off"`, each
//! in a namespace and cgroup of its own, edited in alternating rounds of
//! 5 so drift on the machine falls on both; and each one's peak RSS.

use std::time::Duration;

use hm_bench::load::interrupted;
use hm_bench::options::Options;
use hm_testkit::{Cgroup, Daemon, DaemonOptions, Netns, TempDir};

pub(crate) struct OnOff {
    pub services: u32,
    pub on: Vec<f64>,
    pub off: Vec<f64>,
    /// Peak RSS (VmHWM) of each, MiB.
    pub rss_on: u64,
    pub rss_off: u64,
}

/// N services of one backend each.
fn services(n: u32) -> String {
    let mut s = String::with_capacity(n as usize * 100);
    for i in 0..n {
        let (a, b, c) = (i >> 16, (i >> 8) & 255, i & 255);
        s.push_str(&format!(
            "[[service]]\nname = \"s{i}\"\nvip = \"10.{}.{b}.{c}\"\nport = 80\nbackends = [\"192.168.{b}.{c}:8080\"]\n",
            100 + a
        ));
    }
    s
}

fn peak_rss_mib(d: &Daemon) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", d.pid())).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().split(' ').next()?.parse().ok())
        .unwrap_or(0)
        / 1024
}

struct One {
    _ns: Netns,
    _cgroup: Cgroup,
    _dir: TempDir,
    opts: DaemonOptions,
    daemon: Daemon,
}

fn start(o: &Options, n: u32, metrics: &str, text: &str) -> One {
    let ns = Netns::new();
    let cgroup = Cgroup::new();
    let dir = TempDir::new("hm-bench-metrics-onoff");
    let opts = DaemonOptions::in_dir(o.hostmesh.to_str().unwrap(), &dir);
    // Past 65,536 services the service and backend maps need the size keys.
    let size = (n + 1).next_power_of_two().max(65536);
    opts.write_config(
        "00-daemon.toml",
        &format!(
            "[daemon]\ncgroup = \"{}\"\nconnect_time_lb = \"all\"\nmetrics_listen = \"{metrics}\"\n\
             service_map_size = {size}\nbackend_map_size = {size}\n",
            cgroup.path().display()
        ),
    );
    opts.write_config("services.toml", text);
    let daemon = Daemon::start(&ns, &opts);
    daemon.wait_ready(Duration::from_secs(300));
    One { _ns: ns, _cgroup: cgroup, _dir: dir, opts, daemon }
}

pub(crate) fn run(o: &Options, n: u32, edits: u32) -> OnOff {
    let text = services(n);
    let on = start(o, n, super::METRICS, &text);
    let off = start(o, n, "off", &text);
    let mut r = OnOff { services: n, on: vec![], off: vec![], rss_on: 0, rss_off: 0 };
    let mut k = 0;
    for _round in 0..edits.div_ceil(5) {
        if interrupted() {
            break;
        }
        for (one, times) in [(&on, &mut r.on), (&off, &mut r.off)] {
            for _ in 0..5 {
                k += 1;
                times.push(super::edit(&one.opts, k).as_secs_f64() * 1e3);
            }
        }
    }
    r.rss_on = peak_rss_mib(&on.daemon);
    r.rss_off = peak_rss_mib(&off.daemon);
    r
}
