//! What the soak measured, per minute, and whether its goals hold.

use std::fmt::{self, Write as _};
use std::time::{Duration, Instant};

use crate::clients::{Failure, Recorder, PATHS};
use crate::faults::{Excuse, Fault};
use crate::sites::GA1;
use crate::world::{World, BULK, NODE_PORT, UDP_TIMEOUT_S};

/// The daemons as seen at one moment: the host's, and site A's first
/// gateway's (`gw_`).
#[derive(Debug, Clone)]
pub struct Sample {
    pub at_ms: u64,
    pub rss_kib: u64,
    pub fds: u64,
    pub gw_rss_kib: u64,
    pub gw_fds: u64,
    pub map_entries: u64,
    pub conntrack: u64,
}

/// One measure of a sample.
type Pick = fn(&Sample) -> u64;

/// A process's resident memory (KiB) and open fds; 0 for what cannot be
/// read (the process is gone).
fn usage(pid: Option<u32>) -> (u64, u64) {
    let Some(pid) = pid else { return (0, 0) };
    let rss_kib = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:").map(|v| v.trim().trim_end_matches(" kB").trim().to_string()))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count() as u64).unwrap_or(0);
    (rss_kib, fds)
}

impl Sample {
    pub fn take(w: &World, rec: &Recorder) -> Sample {
        let (rss_kib, fds) = usage(w.pid());
        let (gw_rss_kib, gw_fds) = usage(w.sites.pid(GA1));
        let counts = w.status().map(|s| s["counts"].clone()).unwrap_or_default();
        let n = |k: &str| counts[k].as_u64().unwrap_or(0);
        Sample {
            at_ms: rec.ms(Instant::now()),
            rss_kib,
            fds,
            gw_rss_kib,
            gw_fds,
            map_entries: n("map_entries"),
            conntrack: n("conntrack_open") + n("conntrack_closed") + n("conntrack_external"),
        }
    }
}

/// How long conntrack may take to drain once the load stops, as the README
/// documents it: the longest expiry of what the load leaves (a SYN never
/// answered: 60 s; UDP: this soak's `conntrack_udp_timeout`; closed TCP
/// flows: 10 s), the sweep's 2 s, and a status write.
pub fn drain_limit() -> Duration {
    Duration::from_secs(UDP_TIMEOUT_S.max(60) + 2 + 3)
}

/// Waits for the conntrack entries to drain; how long it took, or what
/// was left at the limit.
pub fn wait_drained(w: &World) -> Result<Duration, u64> {
    let start = Instant::now();
    loop {
        let left = w
            .status()
            .map(|s| {
                let c = &s["counts"];
                ["conntrack_open", "conntrack_closed", "conntrack_external"]
                    .iter()
                    .map(|k| c[*k].as_u64().unwrap_or(0))
                    .sum::<u64>()
            })
            .unwrap_or(u64::MAX);
        if left == 0 {
            return Ok(start.elapsed());
        }
        if start.elapsed() > drain_limit() {
            return Err(left);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub struct Soak {
    pub minutes: u64,
    pub seed: u64,
    pub samples: Vec<Sample>,
    pub excuses: Vec<Excuse>,
    /// When each fault ran (ms into the soak).
    pub applied: Vec<(u64, Fault)>,
}

/// The section's heading in bench/RESULTS.md: the command, the machine,
/// the world and the load.
pub fn heading(minutes: u64, seed: u64, faults: usize) -> String {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!(
        "## bench/soak: {minutes} minutes of faults under load\n\n\
         Command (as root): `./bench/run soak --minutes {minutes} --seed {seed}`\n\n\
         One run on Linux {} with {cpus} CPUs. The host namespace runs hostmesh with the web service \
         (connect-time LB, and node port {NODE_PORT} from another namespace), the dns service (UDP: the veth path), a \
         mesh redirect to a real sidecar and {BULK} more services; three backends in a namespace of their own, \
         health-checked every 300 ms. Beside it, two sites of two gateways each (hostmesh on all six hosts, the \
         default probes). Load all the while: short TCP connections to the web VIP (two threads), one connection \
         held 5 s at a time, UDP requests from a new socket each, short connections to the node port, to the mesh \
         VIP and from site A's member to site B's through the gateways in use. {faults} faults from the seeded \
         schedule, one every 4–12 s. A failure counts as explained only within the window of a fault that should \
         cause it, on the paths it reaches.\n",
        kernel.trim()
    )
}

/// A failure no fault explains.
pub fn unexplained<'a>(failures: &'a [Failure], excuses: &[Excuse]) -> Vec<&'a Failure> {
    failures
        .iter()
        .filter(|f| {
            !excuses.iter().any(|e| e.paths.contains(&f.path) && f.to_ms >= e.from_ms && f.from_ms <= e.until_ms)
        })
        .collect()
}

impl Soak {
    fn minute_of(ms: u64) -> usize {
        (ms / 60_000) as usize
    }

    pub fn table(&self, rec: &Recorder, failures: &[Failure]) -> String {
        let lost = unexplained(failures, &self.excuses);
        let mut out = String::new();
        let _ = writeln!(out, "\nseed {}; per minute (attempts / failed per path; unexplained failures; the host daemon's RSS and fds, site A's first gateway's (gw), the host's map entries and conntrack entries at the minute's last sample):\n", self.seed);
        let paths: Vec<&str> = PATHS.iter().map(|p| p.name()).collect();
        let _ = writeln!(
            out,
            "| min | {} | unexplained | faults | RSS MiB | fds | gw RSS MiB | gw fds | map entries | conntrack |",
            paths.join(" | ")
        );
        let _ = writeln!(out, "|---:|{}---:|---|---:|---:|---:|---:|---:|---:|", "---:|".repeat(paths.len()));
        for m in 0..self.minutes as usize {
            let counts = rec.counts(m * 60, (m + 1) * 60);
            let cells: Vec<String> = counts.iter().map(|(a, f)| format!("{a} / {f}")).collect();
            let un = lost.iter().filter(|f| Self::minute_of(f.to_ms) == m).count();
            let faults: Vec<String> = self
                .applied
                .iter()
                .filter(|(at, _)| Self::minute_of(*at) == m)
                .map(|(_, f)| format!("{f:?}"))
                .collect();
            let s = self.samples.iter().rev().find(|s| Self::minute_of(s.at_ms) == m);
            let mib = |kib: u64| kib as f64 / 1024.0;
            let (rss, fds, gw_rss, gw_fds, maps, ct) = s.map_or((0.0, 0, 0.0, 0, 0, 0), |s| {
                (mib(s.rss_kib), s.fds, mib(s.gw_rss_kib), s.gw_fds, s.map_entries, s.conntrack)
            });
            let _ = writeln!(
                out,
                "| {m} | {} | {un} | {} | {rss:.1} | {fds} | {gw_rss:.1} | {gw_fds} | {maps} | {ct} |",
                cells.join(" | "),
                if faults.is_empty() { "-".to_string() } else { faults.join(", ") }
            );
        }
        out
    }

    pub fn verdict(
        &self,
        rec: &Recorder,
        failures: &[Failure],
        drained: Result<Duration, u64>,
        leftovers: &[String],
    ) -> Verdict {
        let _ = rec;
        let lost = unexplained(failures, &self.excuses);
        let mut problems = Vec::new();
        if let Some(first) = lost.first() {
            let fault = self.applied.iter().rev().find(|(at, _)| *at <= first.to_ms);
            problems.push(format!(
                "{} unexplained failed connection(s); the first in minute {} ({} ms in, {}): {} — the last fault before it: {}",
                lost.len(),
                Self::minute_of(first.to_ms),
                first.to_ms,
                first.path.name(),
                first.why,
                fault.map_or("none".to_string(), |(at, f)| format!("{f:?} at {at} ms"))
            ));
        }
        let picks: [(&str, Pick); 4] = [
            ("the daemon's RSS", |s| s.rss_kib),
            ("the daemon's fds", |s| s.fds),
            ("site A's first gateway's RSS", |s| s.gw_rss_kib),
            ("site A's first gateway's fds", |s| s.gw_fds),
        ];
        for (what, pick) in picks {
            if let Some((early, late)) = self.growth(pick) {
                if late > early * 1.05 {
                    problems.push(format!(
                        "{what} grew {:.1} % (median {early:.0} early, {late:.0} at the end)",
                        (late / early - 1.0) * 100.0
                    ));
                }
            }
        }
        if let Err(left) = drained {
            problems
                .push(format!("{left} conntrack entries left {} s after the load stopped", drain_limit().as_secs()));
        }
        if !leftovers.is_empty() {
            problems.push(format!("left after teardown: {}", leftovers.join(", ")));
        }
        // The unexplained failures by path and reason, most first.
        let mut reasons: std::collections::BTreeMap<(&str, String), usize> = Default::default();
        for f in &lost {
            let why: String = f.why.chars().filter(|c| !c.is_ascii_digit()).collect();
            *reasons.entry((f.path.name(), why)).or_default() += 1;
        }
        let mut reasons: Vec<_> = reasons.into_iter().collect();
        reasons.sort_by_key(|r| std::cmp::Reverse(r.1));
        for ((path, why), n) in reasons.into_iter().take(10) {
            problems.push(format!("  {n} × {path}: {why}"));
        }
        Verdict { problems, drained, unexplained: lost.len(), failures: failures.len() }
    }

    /// The median of `pick` over the early window (minutes 5–15 of an
    /// hour, the same share of a shorter soak) and the late one (the last
    /// 10 minutes of an hour).
    fn growth(&self, pick: Pick) -> Option<(f64, f64)> {
        let total = self.minutes * 60_000;
        let window = |from: u64, to: u64| {
            let mut v: Vec<u64> =
                self.samples.iter().filter(|s| s.at_ms >= from && s.at_ms < to).map(pick).filter(|v| *v > 0).collect();
            v.sort_unstable();
            v.get(v.len() / 2).map(|m| *m as f64)
        };
        Some((window(total / 12, total / 4)?, window(total - total / 6, total + 1)?))
    }
}

pub struct Verdict {
    problems: Vec<String>,
    drained: Result<Duration, u64>,
    unexplained: usize,
    failures: usize,
}

impl Verdict {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "\nfailed connections: {} ({} explained by a fault, {} not)",
            self.failures,
            self.failures - self.unexplained,
            self.unexplained
        )?;
        if let Ok(d) = self.drained {
            writeln!(f, "conntrack drained {:.1} s after the load stopped", d.as_secs_f64())?;
        }
        if self.ok() {
            return writeln!(f, "every goal holds");
        }
        for p in &self.problems {
            writeln!(f, "FAILED: {p}")?;
        }
        Ok(())
    }
}
