//! The systems under test, each set up in a fresh client namespace: hostmesh
//! (connect-time or bpfnat veth), iptables DNAT rules, nftables DNAT maps.

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use hm_testkit::{Daemon, DaemonOptions, Netns, TempDir};

pub const BACKEND_TCP: &str = "192.168.10.11:8080";
pub const BACKEND_UDP: &str = "192.168.10.11:5353";

/// The i-th VIP: 10.100.x.y.
pub fn vip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 100 + (i / 62500) as u8, ((i / 250) % 250) as u8, (i % 250 + 1) as u8)
}

/// The service every run targets: the middle one, so a rule list is
/// walked halfway.
pub fn target(n: usize) -> Ipv4Addr {
    vip(n / 2)
}

pub fn hostmesh_services(n: usize) -> String {
    let mut s = String::new();
    for i in 0..n {
        let v = vip(i);
        let _ = write!(
            s,
            "[[service]]\nname = \"t{i}\"\nvip = \"{v}\"\nport = 80\nbackends = [\"{BACKEND_TCP}\"]\n\n\
             [[service]]\nname = \"u{i}\"\nvip = \"{v}\"\nport = 53\nprotocol = \"udp\"\nbackends = [\"{BACKEND_UDP}\"]\n\n"
        );
    }
    s
}

pub fn iptables_rules(n: usize) -> String {
    let mut s = String::from("*nat\n:OUTPUT ACCEPT [0:0]\n");
    for i in 0..n {
        let v = vip(i);
        let _ = writeln!(s, "-A OUTPUT -d {v}/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination {BACKEND_TCP}");
        let _ = writeln!(s, "-A OUTPUT -d {v}/32 -p udp -m udp --dport 53 -j DNAT --to-destination {BACKEND_UDP}");
    }
    s.push_str("COMMIT\n");
    s
}

pub fn nftables_ruleset(n: usize) -> String {
    let (tcp, udp) = (BACKEND_TCP.replace(':', " . "), BACKEND_UDP.replace(':', " . "));
    let tcp_elems: Vec<String> = (0..n).map(|i| format!("{} . 80 : {tcp}", vip(i))).collect();
    let udp_elems: Vec<String> = (0..n).map(|i| format!("{} . 53 : {udp}", vip(i))).collect();
    format!(
        "table ip hmbench {{\n\
         map svc_tcp {{ type ipv4_addr . inet_service : ipv4_addr . inet_service; elements = {{ {} }} }}\n\
         map svc_udp {{ type ipv4_addr . inet_service : ipv4_addr . inet_service; elements = {{ {} }} }}\n\
         chain out {{ type nat hook output priority -100; policy accept;\n\
           meta l4proto tcp dnat ip to ip daddr . tcp dport map @svc_tcp\n\
           meta l4proto udp dnat ip to ip daddr . udp dport map @svc_udp\n\
         }}\n}}\n",
        tcp_elems.join(", "),
        udp_elems.join(", ")
    )
}

/// A hostmesh daemon for the client namespace.
pub struct Hostmesh {
    pub opts: DaemonOptions,
    pub daemon: Option<Daemon>,
    _dir: TempDir,
    cgroup: PathBuf,
}

impl Hostmesh {
    pub fn start(ns: &Netns, bin: &Path, cgroup: &Path, mode: &str, n: usize) -> Hostmesh {
        let dir = TempDir::new("hm-bench");
        let opts = DaemonOptions::in_dir(bin.to_str().unwrap(), &dir);
        let h = Hostmesh { opts, daemon: None, _dir: dir, cgroup: cgroup.to_path_buf() };
        h.set_mode(mode);
        h.opts.write_config("services.toml", &hostmesh_services(n));
        let mut h = h;
        let d = Daemon::start(ns, &h.opts);
        d.wait_ready(Duration::from_secs(300));
        h.daemon = Some(d);
        h.wait_synced(0);
        h
    }

    fn set_mode(&self, mode: &str) {
        self.opts.write_config(
            "00-daemon.toml",
            // 251-slot Maglev tables: 20,000 services at the default 1021
            // would hold ~160 MiB of kernel memory; the table size does not
            // change the per-connection cost measured here.
            &format!(
                "[daemon]\ncgroup = \"{}\"\nconnect_time_lb = \"{mode}\"\nmaglev_table_size = 251\n",
                self.cgroup.display()
            ),
        );
    }

    /// How long the last sync took, in ms.
    pub fn last_sync_ms(&self) -> u64 {
        let text = std::fs::read_to_string(self.opts.state_dir.join("status.json")).unwrap_or_default();
        text.split("\"duration_ms\": ")
            .nth(1)
            .and_then(|r| r.split([',', '\n']).next()?.trim().parse().ok())
            .unwrap_or(0)
    }

    fn status(&self) -> (u64, bool) {
        let text = std::fs::read_to_string(self.opts.state_dir.join("status.json")).unwrap_or_default();
        let field = |name: &str| {
            text.split(&format!("\"{name}\": ")).nth(1).map(|r| r.split([',', '\n']).next().unwrap_or("").to_string())
        };
        let generation = field("generation").and_then(|g| g.parse().ok()).unwrap_or(0);
        (generation, field("ok").as_deref() == Some("true"))
    }

    /// Waits for a complete sync after `generation`.
    fn wait_synced(&self, generation: u64) {
        let start = Instant::now();
        loop {
            let (g, ok) = self.status();
            if g > generation && ok {
                return;
            }
            assert!(start.elapsed() < Duration::from_secs(300), "hostmesh did not sync");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn switch_mode(&self, mode: &str) {
        let (g, _) = self.status();
        self.set_mode(mode);
        self.wait_synced(g);
    }
}

impl Drop for Hostmesh {
    fn drop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            // SIGTERM is handled between syncs; a 20,000-service sync can
            // still be running.
            d.stop(Duration::from_secs(120));
        }
    }
}

/// The version line of a tool, for the results.
pub fn version(program: &str, arg: &str) -> String {
    Command::new(program)
        .arg(arg)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().next().unwrap_or("").trim().to_string())
        .unwrap_or_else(|_| "not found".into())
}
