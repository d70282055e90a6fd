//! hostmesh: service IPs, mesh redirects and gateway peers for VMs and
//! bare-metal hosts. The pipeline (docs/design.md):
//!
//! config (TOML drop-ins) -> model (Desired) -> reconcile (observe, plan,
//! apply) -> backends (BPF, netlink, sysctl), driven by `daemon`.

pub mod abi;
pub mod backends;
pub mod cli;
pub mod clock;
pub mod config;
pub mod daemon;
pub mod log;
pub mod model;
pub mod paths;
pub mod peer_health;
pub mod reconcile;
pub mod sidecars;
pub mod state;
pub mod table_size;
pub mod teardown;
pub mod trust;
