//! One path measured by itself under `perf record -a` (bench/perf-paths):
//! where a connection's CPU goes, symbol by symbol, against another path
//! measured the same way.

use std::path::PathBuf;
use std::time::Instant;

use crate::interleave::{self, Kind, Path, Plan};
use crate::load::interrupted;

/// Runs TCP connections on `path` alone for the plan's rounds of slices
/// (after two rounds of warm-up); with `perf_dir`, `perf record -a` writes
/// PERF_DIR/NAME.data for exactly that time. Returns the connections per
/// second and the seconds recorded.
pub fn alone(name: &str, path: &Path, plan: &Plan, perf_dir: Option<&String>) -> (f64, f64) {
    let one = std::slice::from_ref(path);
    interleave::measure(Kind::Tcp, one, &Plan { rounds: 2, ..*plan });
    let secs = (plan.slice * plan.rounds as u32).as_secs_f64();
    let perf = perf_dir.map(|dir| {
        std::process::Command::new("perf")
            .args(["record", "-q", "-a", "-o"])
            .arg(PathBuf::from(dir).join(format!("{name}.data")))
            .args(["sleep", &format!("{secs:.3}")])
            .spawn()
            .expect("perf record (linux-perf)")
    });
    let start = Instant::now();
    let m = interleave::measure(Kind::Tcp, one, plan);
    if let Some(mut perf) = perf {
        assert!(perf.wait().expect("perf record").success(), "perf record failed");
    }
    assert!(!interrupted(), "interrupted; cleaning up");
    assert!(start.elapsed().as_secs_f64() >= secs, "the load ran as long as perf recorded");
    (m.per_sec[0], secs)
}
