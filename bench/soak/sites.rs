//! The soak's two sites (hm_testkit::gateway_pairs: two gateways per site
//! behind bridges, hostmesh on all six hosts, the default probes). Site A's
//! member reaches a named server on site B's workload address through the
//! gateways in use; faults cut a gateway that carries traffic (its links
//! down, as a dead host) or SIGKILL the daemon of site A's gateway in use.

use std::path::Path as FsPath;
use std::time::Duration;

use hm_testkit::gateway_pairs::{self as pairs, GA, GB, MB_WORKLOAD};
use hm_testkit::{Daemon, DaemonOptions, Netns, Proto, Servers, TempDir};

pub use hm_testkit::gateway_pairs::MA_WORKLOAD;
pub const SITE_PORT: u16 = 8080;

/// Host indexes, in the order of `pairs::configs`.
pub const MA: usize = 0;
pub const GA1: usize = 1;
pub const GB1: usize = 3;
pub const MB: usize = 5;
const NAMES: [&str; 6] = ["ma", "ga1", "ga2", "gb1", "gb2", "mb"];
/// A gateway host's links.
const GATEWAY_LINKS: [&str; 2] = ["lan", "wan"];

/// Field order is drop order: the server and the daemons before the dirs
/// (which unmount the bpffs) and the namespaces.
pub struct Sites {
    _server: Servers,
    daemons: Vec<Option<Daemon>>,
    opts: Vec<DaemonOptions>,
    _dirs: Vec<TempDir>,
    /// ma, ga1, ga2, gb1, gb2, mb.
    pub hosts: Vec<Netns>,
    _switch: Netns,
}

impl Sites {
    pub fn new(bin: &FsPath) -> Sites {
        let switch = Netns::new();
        let hosts: Vec<Netns> = (0..6).map(|_| Netns::new()).collect();
        pairs::wire(&pairs::Hosts {
            switch: &switch,
            ma: &hosts[MA],
            ga: [&hosts[1], &hosts[2]],
            gb: [&hosts[3], &hosts[4]],
            mb: &hosts[MB],
        });
        let configs = pairs::configs("");
        let mut dirs = Vec::new();
        let mut opts = Vec::new();
        for config in &configs {
            let dir = TempDir::new("hm-soak-site");
            let o = DaemonOptions::in_dir(bin.to_str().expect("a UTF-8 path"), &dir);
            o.write_config("gateway.toml", config);
            opts.push(o);
            dirs.push(dir);
        }
        let server = Servers::start(&hosts[MB], &[(&format!("{MB_WORKLOAD}:{SITE_PORT}"), Proto::Tcp, "b-site-b")]);
        let mut s = Sites {
            _server: server,
            daemons: (0..6).map(|_| None).collect(),
            opts,
            _dirs: dirs,
            hosts,
            _switch: switch,
        };
        // Gateways first, so members find theirs answering from the start.
        for i in [1, 2, 3, 4, MA, MB] {
            s.start(i);
        }
        s
    }

    fn start(&mut self, i: usize) {
        let d = Daemon::start(&self.hosts[i], &self.opts[i]);
        d.wait_ready(Duration::from_secs(60));
        self.daemons[i] = Some(d);
    }

    pub fn pid(&self, i: usize) -> Option<u32> {
        self.daemons[i].as_ref().map(Daemon::pid)
    }

    /// The gateway host (index) a member's status says its traffic leaves
    /// through: `MA` (site A's) or `MB` (site B's); the first of its site
    /// when the status does not say.
    pub fn in_use(&self, member: usize) -> usize {
        let (first, site) = if member == MA { (GA1, GA.map(|g| g.0)) } else { (GB1, GB.map(|g| g.0)) };
        let status = std::fs::read_to_string(self.opts[member].state_dir.join("status.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
        let in_use = status.as_ref().and_then(|s| {
            s["objects"].as_array()?.iter().find(|o| o["kind"] == "gateway")?["in_use"].as_str().map(String::from)
        });
        match in_use.and_then(|a| site.iter().position(|g| *g == a)) {
            Some(k) => first + k,
            None => first,
        }
    }

    /// `hostmesh status` of host `i`, with its name.
    pub fn status_text(&self, i: usize) -> String {
        let state = self.opts[i].state_dir.to_str().expect("a UTF-8 path");
        let out = hm_testkit::cli(&self.hosts[i], &self.opts[i].bin, &["status", "--state-dir", state]);
        format!("$ hostmesh status ({})\n{}", NAMES[i], String::from_utf8_lossy(&out.stdout))
    }

    /// Cuts gateway host `i` off (every link down) for `down`, brings it
    /// back and waits until its peers can count it up again (the default
    /// `probe_rise`, 2, probes of 1 s, and room).
    pub fn cut(&self, i: usize, down: Duration) {
        pairs::cut(&self.hosts[i], &GATEWAY_LINKS);
        std::thread::sleep(down);
        pairs::restore(&self.hosts[i], &GATEWAY_LINKS);
        std::thread::sleep(Duration::from_secs(4));
    }

    /// SIGKILL to the daemon of gateway host `i`, started again at once.
    pub fn kill_daemon(&mut self, i: usize) {
        if let Some(mut d) = self.daemons[i].take() {
            d.signal(nix::sys::signal::Signal::SIGKILL);
            let _ = d.exited_within(Duration::from_secs(10));
        }
        self.start(i);
    }

    /// Stops every daemon, runs `hostmesh teardown` for each host and
    /// returns what is left: hostmesh's links, routes and pins, by host.
    pub fn teardown(&mut self) -> Vec<String> {
        let mut left = Vec::new();
        for (i, name) in NAMES.iter().enumerate() {
            let host = crate::world::teardown(&self.hosts[i], &self.opts[i], self.daemons[i].take());
            left.extend(host.into_iter().map(|l| format!("{name}: {l}")));
        }
        left
    }
}
