//! Operator tests: hostmesh run the way operators break things — a pin dir
//! that cannot be used, files others can write, a planted state dir, two
//! daemons, half-written files, floods of errors and signals — and the
//! daemon's life under systemd's protocol and its health checks. The real
//! binary in namespaces of its own, like the integration suite; kept in a
//! binary of their own because none of it depends on the kernel's version,
//! so the kernel matrix (scripts/test-kernels) does not repeat it.

#[path = "../integration/fixtures.rs"]
#[allow(dead_code)]
mod fixtures;
#[path = "../integration/health_net.rs"]
#[allow(dead_code)]
mod health_net;
#[path = "../integration/topology.rs"]
#[allow(dead_code)]
mod topology;

mod diff;
mod dirs;
mod files;
mod fleet;
mod health_checks;
mod import;
mod lifecycle;
mod precedence;
mod repair;
mod signals;
