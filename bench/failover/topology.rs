//! One trial's sites (hm_testkit::gateway_pairs: two gateways per site,
//! six hosts behind bridges), with site A's gateways made highly available
//! one of two ways:
//!
//! - hostmesh: every list of gateways probed by hostmesh itself (A's
//!   member lists both of A's gateways, B's gateways both of A's);
//! - keepalived: A's two gateways run Debian's keepalived, one VRRP
//!   instance per link in a sync group, moving 192.0.2.254 (LAN) and
//!   198.51.100.254 (WAN) together; A's member sends to the LAN address,
//!   A's gateways tunnel from the WAN address and B's gateways send to it.
//!   hostmesh still carries the traffic, but never fails over on site A's
//!   side (B's gateways take 1000 lost probes before giving up on A).

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hm_testkit::gateway_pairs::{self as pairs, GB, MA, MB, MB_WORKLOAD, VNI, VXLAN_PORT};
use hm_testkit::{Daemon, DaemonOptions, Netns, Servers, TempDir};

pub const ECHO_PORT: u16 = 8080;
pub const LAN_VIP: &str = "192.0.2.254";
pub const WAN_VIP: &str = "198.51.100.254";

#[derive(Clone, Copy)]
pub enum Way {
    /// hostmesh's own failover with these `[gateway]` probe lines.
    Hostmesh(&'static str),
    /// keepalived with this `advert_int` (below 1 s: VRRP version 3).
    Keepalived(&'static str),
}

/// Field order is drop order: servers, keepalived and daemons before the
/// dirs (which unmount the bpffs) and the namespaces.
pub struct Trial {
    _echo: Servers,
    _keepalived: Vec<Keepalived>,
    /// In host order; a restart replaces one.
    daemons: Mutex<Vec<Daemon>>,
    opts: Vec<DaemonOptions>,
    _dirs: Vec<TempDir>,
    /// ma, ga1, ga2, gb1, gb2, mb.
    pub hosts: Vec<Netns>,
    _switch: Netns,
}

impl Trial {
    /// Builds the sites, starts everything and waits until traffic flows
    /// through site A's first gateway.
    pub fn build(way: Way, hostmesh: &Path) -> Trial {
        let switch = Netns::new();
        let hosts: Vec<Netns> = (0..6).map(|_| Netns::new()).collect();
        pairs::wire(&pairs::Hosts {
            switch: &switch,
            ma: &hosts[0],
            ga: [&hosts[1], &hosts[2]],
            gb: [&hosts[3], &hosts[4]],
            mb: &hosts[5],
        });
        let (configs, keepalived) = match way {
            Way::Hostmesh(probes) => (pairs::configs(probes), Vec::new()),
            Way::Keepalived(advert) => {
                let ka = [1, 2].map(|i| Keepalived::start(&hosts[i], i == 1, advert));
                (vrrp_configs(), ka.into_iter().collect())
            }
        };
        let mut dirs = Vec::new();
        let mut opts: Vec<Option<DaemonOptions>> = (0..6).map(|_| None).collect();
        let mut started: Vec<Option<Daemon>> = (0..6).map(|_| None).collect();
        // Gateways first, so members find theirs answering from the start.
        for i in [1, 2, 3, 4, 0, 5] {
            let dir = TempDir::new("hm-bench-fo");
            let o = DaemonOptions::in_dir(hostmesh.to_str().expect("a UTF-8 path"), &dir);
            o.write_config("gateway.toml", &configs[i]);
            let d = Daemon::start(&hosts[i], &o);
            d.wait_ready(Duration::from_secs(60));
            started[i] = Some(d);
            opts[i] = Some(o);
            dirs.push(dir);
        }
        let daemons = Mutex::new(started.into_iter().map(|d| d.expect("started")).collect());
        let opts = opts.into_iter().map(|o| o.expect("started")).collect();
        let at = |ip: &str| SocketAddr::new(ip.parse().unwrap(), ECHO_PORT);
        let echo = Servers::echo(&hosts[5], &[at(MB_WORKLOAD)]);
        let t = Trial { _echo: echo, _keepalived: keepalived, daemons, opts, _dirs: dirs, hosts, _switch: switch };
        if let Way::Keepalived(_) = way {
            t.wait("site A's first gateway holds both VRRP addresses", || {
                let lan = t.hosts[1].ip(&["-brief", "addr", "show", "lan"]);
                let wan = t.hosts[1].ip(&["-brief", "addr", "show", "wan"]);
                lan.contains(LAN_VIP) && wan.contains(WAN_VIP)
            });
        }
        t.wait("traffic from A's member to B's", || crate::measure::attempt(&t.hosts[0]).is_ok());
        // Every prober has judged every gateway (a gateway started before
        // its peers judged them down until they answered, and a down
        // gateway is up again after probe_rise answers).
        std::thread::sleep(Duration::from_secs(3));
        t
    }

    fn wait(&self, what: &str, mut ok: impl FnMut() -> bool) {
        let end = Instant::now() + Duration::from_secs(30);
        while !ok() {
            assert!(Instant::now() < end, "bench/failover: timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether site A's first gateway still holds both VRRP addresses and
    /// the second neither (keepalived's setting held until now).
    pub fn vrrp_held(&self) -> bool {
        let has =
            |host: usize, dev: &str, vip: &str| self.hosts[host].ip(&["-brief", "addr", "show", dev]).contains(vip);
        has(1, "lan", LAN_VIP) && has(1, "wan", WAN_VIP) && !has(2, "lan", LAN_VIP) && !has(2, "wan", WAN_VIP)
    }

    /// Lines of every daemon's log saying traffic moved to another gateway.
    pub fn moves(&self) -> usize {
        let daemons = self.daemons.lock().expect("daemons");
        daemons.iter().map(|d| d.log_text().matches("traffic moved to another gateway").count()).sum()
    }

    /// SIGKILL to the daemon of site A's first gateway (the one in use), and
    /// a new one started as soon as it is gone.
    pub fn restart_daemon_of_first_gateway_of_a(&self) {
        let mut daemons = self.daemons.lock().expect("daemons");
        daemons[1].signal(nix::sys::signal::Signal::SIGKILL);
        assert!(daemons[1].exited_within(Duration::from_secs(5)).is_some(), "SIGKILL ends the daemon");
        let d = Daemon::start(&self.hosts[1], &self.opts[1]);
        d.wait_ready(Duration::from_secs(60));
        daemons[1] = d;
    }

    /// Site A's first gateway dies, as far as the network can tell.
    pub fn kill_first_gateway_of_a(&self) {
        pairs::cut(&self.hosts[1], &["lan", "wan"]);
    }
}

/// The hostmesh configs when keepalived moves site A's gateway addresses.
fn vrrp_configs() -> [String; 6] {
    let never_down = "probe_loss = 1000";
    let a_gateway = format!(
        "[gateway]\nrole = \"gateway\"\nlocal_ip = \"{WAN_VIP}\"\nvni = {VNI}\nudp_port = {VXLAN_PORT}\n\
         [[peer]]\nname = \"site-b\"\nendpoints = [\"{}\", \"{}\"]\ncidrs = [\"10.20.0.0/16\"]\n\
         [[member]]\nname = \"m\"\nendpoint = \"{MA}\"\ncidrs = [\"10.10.1.0/24\"]\n",
        GB[0].1, GB[1].1
    );
    let b_gateway = |local: &str| {
        format!(
            "[gateway]\nrole = \"gateway\"\nlocal_ip = \"{local}\"\nvni = {VNI}\nudp_port = {VXLAN_PORT}\n{never_down}\n\
             [[peer]]\nname = \"site-a\"\nendpoint = \"{WAN_VIP}\"\ncidrs = [\"10.10.0.0/16\"]\n\
             [[member]]\nname = \"m\"\nendpoint = \"{MB}\"\ncidrs = [\"10.20.1.0/24\"]\n"
        )
    };
    let hm = pairs::configs("");
    [
        format!(
            "[gateway]\nrole = \"member\"\nlocal_ip = \"{MA}\"\ngateway_ip = \"{LAN_VIP}\"\nvni = {VNI}\n\
             udp_port = {VXLAN_PORT}\n[[peer]]\nname = \"site-b\"\ncidrs = [\"10.20.0.0/16\"]\n"
        ),
        a_gateway.clone(),
        a_gateway,
        b_gateway(GB[0].1),
        b_gateway(GB[1].1),
        hm[5].clone(),
    ]
}

/// keepalived (VRRP only) in a namespace, ended by PID on drop.
pub struct Keepalived {
    child: Child,
    _dir: TempDir,
}

impl Keepalived {
    fn start(ns: &Netns, first: bool, advert: &str) -> Keepalived {
        let dir = TempDir::new("hm-bench-ka");
        let conf = dir.path().join("keepalived.conf");
        let version = if advert.contains('.') { "    vrrp_version 3\n" } else { "" };
        let priority = if first { 150 } else { 100 };
        let instance = |name: &str, dev: &str, id: u8, vip: &str| {
            format!(
                "vrrp_instance {name} {{\n    state BACKUP\n    interface {dev}\n    virtual_router_id {id}\n    \
                 priority {priority}\n    advert_int {advert}\n    virtual_ipaddress {{\n        {vip}/24 dev {dev}\n    \
                 }}\n}}\n"
            )
        };
        let text = format!(
            "global_defs {{\n    router_id {}\n{version}}}\nvrrp_sync_group site_a {{\n    group {{\n        lan\n        \
             wan\n    }}\n}}\n{}{}",
            if first { "ga1" } else { "ga2" },
            instance("lan", "lan", 51, LAN_VIP),
            instance("wan", "wan", 52, WAN_VIP),
        );
        std::fs::write(&conf, text).expect("write keepalived.conf");
        let pid = |n: &str| dir.path().join(n).display().to_string();
        let child = Command::new("ip")
            .args(["netns", "exec", ns.name(), "keepalived", "--dont-fork", "--log-console", "--vrrp", "-f"])
            .arg(&conf)
            .args(["-p", &pid("main.pid"), "-r", &pid("vrrp.pid"), "-c", &pid("checkers.pid")])
            .stdout(std::fs::File::create(dir.path().join("log")).map(Stdio::from).unwrap_or_else(|_| Stdio::null()))
            .stderr(Stdio::null())
            .spawn()
            .expect("run keepalived (Debian's package; scripts/deps installs it)");
        Keepalived { child, _dir: dir }
    }
}

impl Drop for Keepalived {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let end = Instant::now() + Duration::from_secs(5);
        while Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
