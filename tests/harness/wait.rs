//! Bounded polling: every wait in the tests has a deadline.

use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy)]
pub struct Waited(pub Duration);

/// How many times slower than a 2-CPU host this machine runs the suite
/// (`HM_TEST_TIME_SCALE`, default 1): a VM under software emulation
/// (`scripts/test-kernels`) is 3 to 10 times slower. Every deadline is
/// multiplied by it (the tests assert no upper bound on time: `SOON`).
pub fn time_scale() -> u32 {
    std::env::var("HM_TEST_TIME_SCALE").ok().and_then(|v| v.parse().ok()).filter(|n| *n >= 1).unwrap_or(1)
}

/// `d` on this machine.
pub fn scaled(d: Duration) -> Duration {
    d * time_scale()
}

/// `secs` seconds on this machine (bounds on times a client measured).
pub fn scaled_secs(secs: f64) -> f64 {
    secs * f64::from(time_scale())
}

/// How long a test waits for what should happen soon (a sync, a route, a
/// probe's verdict, a daemon's exit) before it fails. Generous on purpose:
/// the suite runs its tests side by side, on two CPUs and in an emulated
/// VM, so a test asks only that a thing happens, never how fast. How fast
/// is a benchmark's question (`bench/`, docs/design.md "Testing rules").
/// Scaled like every deadline.
pub const SOON: Duration = Duration::from_secs(30);

/// `wait_until` with the `SOON` deadline.
pub fn wait_soon(what: &str, cond: impl FnMut() -> bool) -> Result<Waited, String> {
    wait_until(what, SOON, cond)
}

/// Polls `cond` every 20 ms until it holds or `timeout` (scaled) passes.
/// Returns how long it took, or an error naming `what`.
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Result<Waited, String> {
    let timeout = scaled(timeout);
    let start = Instant::now();
    loop {
        if cond() {
            return Ok(Waited(start.elapsed()));
        }
        if start.elapsed() >= timeout {
            return Err(format!("timed out after {timeout:?} waiting for {what}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
