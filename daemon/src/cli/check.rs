//! `hostmesh check`: validate the config dir as the daemon would read it.

use std::path::Path;
use std::process::ExitCode;

use crate::config::check_dir;

pub(super) fn run(dir: &Path) -> ExitCode {
    let loaded = match check_dir(dir) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("hostmesh check: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut rejected = 0;
    for f in loaded.rejected() {
        rejected += 1;
        for e in &f.errors {
            eprintln!("{e}");
        }
    }
    for s in &loaded.skipped {
        eprintln!("{}: skipped: {}", s.path.display(), s.reason);
    }
    let c = &loaded.config;
    println!(
        "{}: {} file(s), {} rejected; valid: {} service(s), {} mesh redirect(s), {} peer(s), {} member(s){}{}",
        dir.display(),
        loaded.files.len(),
        rejected,
        c.services.len(),
        c.meshes.len(),
        c.peers.len(),
        c.members.len(),
        if c.daemon.origin.is_some() { ", [daemon]" } else { "" },
        if c.gateway.is_some() { ", [gateway]" } else { "" },
    );
    if rejected == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
