//! The command line every benchmark takes: --hostmesh PATH --seconds S
//! --reps N --out FILE, plus flags of its own.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub struct Options {
    pub hostmesh: PathBuf,
    pub seconds: Duration,
    pub reps: usize,
    pub out: PathBuf,
    /// The benchmark's own flags that were given, by name.
    pub extra: BTreeMap<String, String>,
}

impl Options {
    /// Parses the process's arguments; `extra` names the benchmark's own
    /// flags (each takes a value).
    pub fn parse(default_reps: usize, extra: &[&str]) -> Options {
        let exe_dir = std::env::current_exe().expect("own path").parent().expect("a dir").to_path_buf();
        let mut o = Options {
            hostmesh: exe_dir.join("hostmesh"),
            seconds: Duration::from_millis(1500),
            reps: default_reps,
            out: Path::new(env!("CARGO_MANIFEST_DIR")).join("RESULTS.md"),
            extra: BTreeMap::new(),
        };
        let args: Vec<String> = std::env::args().skip(1).collect();
        let usage = || {
            format!(
                "--hostmesh PATH --seconds S --reps N --out FILE{}",
                extra.iter().map(|e| format!(" --{e} VALUE")).collect::<String>()
            )
        };
        if args.iter().any(|a| a == "--help" || a == "-h") {
            println!("usage: {} {}", std::env::args().next().unwrap_or_default(), usage());
            std::process::exit(0);
        }
        for pair in args.chunks(2) {
            let value = pair.get(1).cloned().unwrap_or_else(|| panic!("{} needs a value", pair[0]));
            match pair[0].as_str() {
                "--hostmesh" => o.hostmesh = value.into(),
                "--seconds" => o.seconds = Duration::from_secs_f64(value.parse().expect("--seconds S")),
                "--reps" => o.reps = value.parse().expect("--reps N"),
                "--out" => o.out = value.into(),
                flag if extra.contains(&flag.trim_start_matches("--")) => {
                    o.extra.insert(flag.trim_start_matches("--").to_string(), value);
                }
                other => panic!("unknown argument {other}; use {}", usage()),
            }
        }
        assert!(o.hostmesh.exists(), "no hostmesh binary at {} (pass --hostmesh)", o.hostmesh.display());
        o
    }
}
