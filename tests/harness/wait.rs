//! Bounded polling: every wait in the tests has a deadline.

use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy)]
pub struct Waited(pub Duration);

/// Polls `cond` every 20 ms until it holds or `timeout` passes. Returns
/// how long it took, or an error naming `what`.
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Result<Waited, String> {
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
