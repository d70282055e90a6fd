//! hostmesh's test harness. Everything a test creates is owned by a guard
//! that removes it on drop, panics included:
//!
//! - `Netns`: a network namespace (as `ip netns add` makes one), with helpers to run
//!   commands and closures inside it and to wire veth pairs between them;
//! - `TempDir`: a scratch dir; a bpffs mounted under it is unmounted;
//! - `Cgroup`: a cgroup v2 dir of the test's own;
//! - `NotifyListener`: an sd_notify socket recording what a daemon says;
//! - `Daemon`: a hostmesh process in a namespace, ended by PID;
//! - `Servers`: echo servers naming themselves, stopped on drop;
//! - `Prometheus`: a real Prometheus server scraping a daemon, ended by PID;
//! - `sites`: the two-site gateway topology (wiring and configs);
//! - `gateway_pairs`: two sites of two gateways each, for failover.
//!
//! Tests must run as root: nothing here skips when it is not.

pub mod capture;
mod cgroup;
mod daemon;
pub mod gateway_pairs;
mod netns;
mod notify;
mod prometheus;
mod servers;
pub mod sites;
mod tempdir;
mod wait;

pub use cgroup::Cgroup;
pub use daemon::{cli, Daemon, DaemonOptions};
pub use netns::Netns;
pub use notify::NotifyListener;
pub use prometheus::{http_get, Prometheus};
pub use servers::{Proto, Servers};
pub use tempdir::TempDir;
pub use wait::{scaled, scaled_secs, time_scale, wait_soon, wait_until, Waited, SOON};

/// A name unique to this process and call, for namespaces and dirs.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!("{prefix}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// Whether the running kernel makes WireGuard links: one made and dropped
/// with a namespace of its own (this machine's kernel has no WireGuard;
/// Debian's have it as a module).
pub fn kernel_makes_wireguard_links() -> bool {
    let ns = Netns::new();
    ns.exec_output("ip", &["link", "add", "wg-probe", "type", "wireguard"]).status.success()
}

/// Panics with a clear message unless running as root: kernel tests need
/// it and must fail, not skip, without it.
pub fn require_root() {
    assert!(nix::unistd::geteuid().is_root(), "hostmesh's kernel tests need root (CI runs them as root)");
}
