//! hostmesh: service IPs, mesh redirects and gateway peers for VMs and
//! bare-metal hosts. The pipeline (docs/design.md):
//!
//! config (TOML drop-ins) -> model (Desired) -> reconcile (observe, plan,
//! apply) -> backends (BPF, netlink, sysctl), driven by `daemon`.

// Internals are crate-private, so the compiler sees unused code; the
// public face is what the integration tests and `main` use: the map ABI,
// the status file, the bpf syscalls and netlink helpers the tests read the
// kernel with, and the CLI.
#![warn(unreachable_pub, dead_code)]

pub mod abi;
pub mod backends;
pub mod cli;
mod clock;
mod config;
mod daemon;
mod health;
mod http_endpoint;
mod keys;
mod log;
mod metrics;
mod model;
mod paths;
mod peer_health;
mod reconcile;
mod service_health;
mod sidecars;
pub mod state;
mod table_size;
mod teardown;
mod trust;

pub use config::{Capacity, MapSizes, SizeKey, SIZE_KEYS};
pub use model::{Feature, TcAttach};
