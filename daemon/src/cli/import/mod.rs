//! `hostmesh import`: another load balancer's configuration as hostmesh
//! drop-ins, one file per service, with what could not be mapped listed
//! by file and line.

mod dropin;
mod ipvsadm;
mod keepalived;

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use dropin::Import;

/// Exit 1: some things were not mapped (the rest was imported).
const PARTIAL: u8 = 1;
/// Exit 2: the input could not be read or parsed, or the drop-ins not
/// written; nothing was.
const FAILED: u8 = 2;

/// Where the drop-ins go.
pub(super) enum Output {
    /// Printed, nothing written.
    DryRun,
    /// One file per service in this directory (made if missing).
    Dir(PathBuf),
}

/// `hostmesh import ipvsadm [FILE|-]`.
pub(super) fn ipvsadm(input: &Path, output: Output, strict: bool) -> ExitCode {
    let (name, text) = match read_input(input) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("hostmesh import ipvsadm: {e}");
            return ExitCode::from(FAILED);
        }
    };
    match ipvsadm::parse(&name, &text) {
        Ok(import) => finish("ipvsadm", import, output, strict),
        Err(e) => {
            eprintln!("{e}; nothing imported");
            ExitCode::from(FAILED)
        }
    }
}

/// `hostmesh import keepalived FILE`.
pub(super) fn keepalived(input: &Path, output: Output, strict: bool) -> ExitCode {
    match keepalived::import(input) {
        Ok(import) => finish("keepalived", import, output, strict),
        Err(e) => {
            eprintln!("{e}; nothing imported");
            ExitCode::from(FAILED)
        }
    }
}

/// The input's name for messages and its text, read whole ("-": stdin).
fn read_input(input: &Path) -> std::io::Result<(String, String)> {
    if input == Path::new("-") {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text)?;
        return Ok(("-".into(), text));
    }
    let text = std::fs::read_to_string(input)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", input.display())))?;
    Ok((input.display().to_string(), text))
}

/// Lists what was not mapped, then prints or writes the drop-ins (none
/// with `strict` when something was not mapped); the exit status.
fn finish(tool: &str, import: Import, output: Output, strict: bool) -> ExitCode {
    for u in &import.unmapped {
        eprintln!("{u}");
    }
    let partial = !import.unmapped.is_empty();
    if partial && strict {
        eprintln!("hostmesh import {tool}: {} thing(s) not mapped; --strict: nothing written", import.unmapped.len());
        return ExitCode::from(PARTIAL);
    }
    let files: Vec<(String, String)> =
        import.services.iter().map(|s| (format!("{}.toml", s.name), s.render(tool))).collect();
    match output {
        Output::DryRun => {
            for (name, text) in &files {
                println!("# --- {name}\n{text}");
            }
        }
        Output::Dir(ref dir) => {
            if let Err(e) = write_all(dir, &files) {
                eprintln!("hostmesh import {tool}: {e}; nothing written");
                return ExitCode::from(FAILED);
            }
            for (name, _) in &files {
                println!("{}", dir.join(name).display());
            }
        }
    }
    eprintln!(
        "hostmesh import {tool}: {} service(s){}, {} thing(s) not mapped",
        files.len(),
        if matches!(output, Output::DryRun) { " (dry run: nothing written)" } else { "" },
        import.unmapped.len()
    );
    ExitCode::from(if partial { PARTIAL } else { 0 })
}

/// Writes every file, or none: an existing file of the same name stops it
/// before anything is written, and a failure part way removes what was
/// written. Each is written to a hidden name and renamed into place, so a
/// daemon watching `dir` never reads half of one.
fn write_all(dir: &Path, files: &[(String, String)]) -> std::io::Result<()> {
    use std::io::{Error, ErrorKind};

    std::fs::create_dir_all(dir).map_err(|e| Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
    if let Some((name, _)) = files.iter().find(|(name, _)| dir.join(name).exists()) {
        return Err(Error::new(
            ErrorKind::AlreadyExists,
            format!("{} exists (move it away, or import to another directory)", dir.join(name).display()),
        ));
    }
    let mut written = Vec::with_capacity(files.len());
    for (name, text) in files {
        match write_one(dir, name, text) {
            Ok(path) => written.push(path),
            Err(e) => {
                for path in &written {
                    let _ = std::fs::remove_file(path);
                }
                return Err(Error::new(e.kind(), format!("{}: {e}", dir.join(name).display())));
            }
        }
    }
    Ok(())
}

/// One file, mode 0644, through a hidden name; its path.
fn write_one(dir: &Path, name: &str, text: &str) -> std::io::Result<PathBuf> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;

    let tmp = dir.join(format!(".{name}.tmp"));
    let path = dir.join(name);
    let result = (|| {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map(|()| path)
}
