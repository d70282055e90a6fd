//! The command line: `hostmesh run | check | diff | import | status |
//! explain | teardown`.

mod check;
mod diff;
mod explain;
mod import;
mod status;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::config::ConfigDirs;
use crate::paths::{
    Paths, DEFAULT_BPFFS, DEFAULT_CONFIG_DIR, DEFAULT_RUNTIME_CONFIG_DIR, DEFAULT_STATE_DIR, DEFAULT_VENDOR_CONFIG_DIR,
};

#[derive(Debug, Parser)]
#[command(
    name = "hostmesh",
    version,
    about = "Service IPs, mesh redirects and gateway peers for VMs and bare-metal hosts"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon (under systemd: Type=notify).
    Run(PathArgs),
    /// Validate the config dir, and what it names on this host (a cgroup,
    /// host interfaces); exit 0 if all is well, 1 if not.
    Check {
        #[command(flatten)]
        dirs: ConfigDirArgs,
        /// Check the files alone, not this host (as on a build host).
        #[arg(long)]
        offline: bool,
    },
    /// What the daemon would do with these config dirs: the objects it
    /// would add, change and remove against the configuration in force
    /// (running or not), the files it would reject, the capacity used.
    /// Touches nothing. Exit 0: no change; 1: changes; 2: errors.
    Diff {
        #[command(flatten)]
        dirs: ConfigDirArgs,
        #[arg(long, default_value = DEFAULT_STATE_DIR)]
        state_dir: PathBuf,
    },
    /// Translate another load balancer's configuration into drop-ins.
    Import {
        #[command(subcommand)]
        from: ImportFrom,
    },
    /// Show what is applied, per object, and rejected files with their errors.
    Status {
        #[arg(long, default_value = DEFAULT_STATE_DIR)]
        state_dir: PathBuf,
        /// Print the status file as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Say how an address is handled: the path, the service and its
    /// backends, the backend a source reaches, the kernel objects.
    Explain {
        /// ADDR[:PORT][/tcp|udp] (IPv6 with a port in brackets).
        target: String,
        /// SRC[:PORT]: predict the backend a connection from there gets.
        #[arg(long)]
        from: Option<String>,
        /// Print it as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        paths: PathArgs,
    },
    /// Remove everything hostmesh owns: links, routes, pins, programs.
    Teardown {
        #[command(flatten)]
        paths: PathArgs,
        /// Tear down even though the daemon is running (it will rebuild
        /// its state at the next sync).
        #[arg(long)]
        force: bool,
    },
}

/// What `hostmesh import` reads.
#[derive(Debug, Subcommand)]
pub enum ImportFrom {
    /// IPVS rules as `ipvsadm-save -n` prints them (-A services, -a real
    /// servers). Exit 0: all mapped; 1: some things not (listed with their
    /// line; the rest imported); 2: not readable or not ipvsadm-save
    /// output (nothing imported).
    Ipvsadm {
        /// The saved rules; "-" (the default) reads stdin.
        #[arg(default_value = "-")]
        file: PathBuf,
        #[command(flatten)]
        out: ImportOut,
    },
    /// keepalived.conf's virtual servers (and virtual_server_group
    /// members), following `include`: real servers, weights, lb_algo,
    /// persistence, checkers and their timers; VRRP and what else has no
    /// equivalent listed with file:line. Exit 0, 1, 2 as for ipvsadm.
    Keepalived {
        /// keepalived.conf.
        file: PathBuf,
        #[command(flatten)]
        out: ImportOut,
    },
}

/// Where `hostmesh import` puts the drop-ins it makes.
#[derive(Debug, Args)]
pub struct ImportOut {
    /// Write one drop-in per service into DIR (made if missing), to review
    /// and then move into the config dir; no existing file is replaced.
    #[arg(long, value_name = "DIR", required_unless_present = "dry_run", conflicts_with = "dry_run")]
    to: Option<PathBuf>,
    /// Print the drop-ins instead of writing them.
    #[arg(long)]
    dry_run: bool,
    /// Write nothing when anything could not be mapped.
    #[arg(long)]
    strict: bool,
}

impl ImportOut {
    fn output(self) -> import::Output {
        match self.to {
            Some(dir) => import::Output::Dir(dir),
            None => import::Output::DryRun,
        }
    }
}

/// The three config dirs, first in precedence first: a drop-in masks one
/// of the same name in a later dir; one that is a symlink to /dev/null
/// masks it away.
#[derive(Debug, Args)]
pub struct ConfigDirArgs {
    /// The admin's drop-ins.
    #[arg(long, default_value = DEFAULT_CONFIG_DIR)]
    pub config_dir: PathBuf,
    /// Runtime drop-ins, made by tools until the next boot (read if it exists).
    #[arg(long, default_value = DEFAULT_RUNTIME_CONFIG_DIR)]
    pub runtime_config_dir: PathBuf,
    /// The vendor's drop-ins, shipped by packages (read if it exists).
    #[arg(long, default_value = DEFAULT_VENDOR_CONFIG_DIR)]
    pub vendor_config_dir: PathBuf,
}

impl From<ConfigDirArgs> for ConfigDirs {
    fn from(a: ConfigDirArgs) -> Self {
        ConfigDirs::new(a.config_dir, a.runtime_config_dir, a.vendor_config_dir)
    }
}

#[derive(Debug, Args)]
pub struct PathArgs {
    #[command(flatten)]
    pub config: ConfigDirArgs,
    #[arg(long, default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// Pin dir for BPF maps and links (on a bpffs; mounted if it is not).
    #[arg(long, default_value = DEFAULT_BPFFS)]
    pub bpffs: PathBuf,
}

impl From<PathArgs> for Paths {
    fn from(a: PathArgs) -> Self {
        Paths { config: a.config.into(), state_dir: a.state_dir, bpffs: a.bpffs }
    }
}

pub fn main() -> ExitCode {
    // Config files are read under a read lease (config/read.rs): a writer
    // opening one meanwhile makes the kernel send SIGIO, whose default
    // action ends the process. Ignored, the lease is simply released.
    // SAFETY: setting a signal's disposition before any thread starts.
    unsafe {
        libc::signal(libc::SIGIO, libc::SIG_IGN);
    }
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Run(_)) {
        // A command whose output is piped into `head` ends quietly when the
        // pipe closes, as other tools do (exit 141), instead of panicking
        // in println!. The daemon keeps ignoring SIGPIPE (a write error).
        // SAFETY: setting a signal's disposition before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    match cli.command {
        Command::Run(paths) => {
            tune_malloc();
            let log = crate::log::stderr_logger();
            match crate::daemon::run(paths.into(), log.clone()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    slog::crit!(log, "cannot start"; "error" => e.to_string());
                    ExitCode::FAILURE
                }
            }
        }
        Command::Check { dirs, offline } => check::run(&dirs.into(), offline),
        Command::Diff { dirs, state_dir } => diff::run(&dirs.into(), &state_dir),
        Command::Import { from: ImportFrom::Keepalived { file, out } } => {
            let strict = out.strict;
            import::keepalived(&file, out.output(), strict)
        }
        Command::Import { from: ImportFrom::Ipvsadm { file, out } } => {
            let strict = out.strict;
            import::ipvsadm(&file, out.output(), strict)
        }
        Command::Status { state_dir, json } => status::run(&state_dir, json),
        Command::Explain { target, from, json, paths } => explain::run(explain::ExplainArgs {
            target,
            from,
            json,
            config: paths.config.into(),
            state_dir: paths.state_dir,
            bpffs: paths.bpffs,
        }),
        Command::Teardown { paths, force } => teardown(paths.into(), force),
    }
}

/// glibc's allocator, set for a daemon that keeps a large state and
/// builds large passing ones (a compile's entries, a parse, a read of the
/// kernel's maps); a setting the environment makes (MALLOC_ARENA_MAX,
/// MALLOC_MMAP_THRESHOLD_, GLIBC_TUNABLES) stands.
/// - One arena per CPU, at most 4 (its default is 8 per CPU). The daemon's
///   threads (the parse's, the status writer's, the loader's, the map
///   writers') each filled an arena of their own whose freed pieces no
///   other thread reused: at 100,000 services 8 MiB more at the peak on 2
///   CPUs, and no faster.
/// - Blocks of 128 KiB and more mapped on their own, so that freeing one
///   gives its memory back. glibc's default raises that threshold to the
///   largest block freed, up to 32 MiB, after which such passing buffers
///   are carved from the heap and leave holes there that the process
///   keeps: at 100,000 services 10 MiB of a steady 154.
fn tune_malloc() {
    #[cfg(target_env = "gnu")]
    {
        let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
        let set = |var: &str, tunable: &str| std::env::var_os(var).is_some() || tunables.contains(tunable);
        let arenas = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 4);
        // SAFETY: allocator settings, made before any thread starts.
        unsafe {
            if !set("MALLOC_ARENA_MAX", "arena_max") {
                libc::mallopt(libc::M_ARENA_MAX, arenas as libc::c_int);
            }
            if !set("MALLOC_MMAP_THRESHOLD_", "mmap_threshold") {
                libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
            }
        }
    }
}

/// `tune_malloc`'s threshold: glibc's initial one, kept.
#[cfg(target_env = "gnu")]
const MMAP_THRESHOLD: libc::c_int = 128 << 10;

fn teardown(paths: Paths, force: bool) -> ExitCode {
    // The daemon's own lock: held while it runs, so teardown and a daemon
    // never work on the same objects at once.
    // (The status file's pid covers a daemon of a build without the lock.)
    let (_lock, running) = if paths.state_dir.is_dir() && !force {
        match crate::state::InstanceLock::acquire(&paths.state_dir, &paths.bpffs) {
            Ok(lock) => (Some(lock), status::running_daemon(&paths.state_dir).map(|p| p.to_string())),
            Err(crate::state::LockError::Held { pid, .. }) => (None, Some(pid)),
            Err(e) => {
                eprintln!("hostmesh teardown: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        (None, None)
    };
    if let Some(pid) = running {
        eprintln!(
            "hostmesh is running (pid {pid}); stop it first (systemctl stop hostmesh), or pass --force \
             (it would rebuild its state at its next sync)"
        );
        return ExitCode::FAILURE;
    }
    match crate::teardown::teardown(&paths) {
        Ok(done) if done.is_empty() => {
            println!("nothing to remove: hostmesh owns nothing in this network namespace");
            ExitCode::SUCCESS
        }
        Ok(done) => {
            for line in done {
                println!("{line}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("hostmesh teardown: {e}");
            ExitCode::FAILURE
        }
    }
}
