//! Compiles every eBPF probe under `probes/` with clang into `OUT_DIR`, where
//! `src/backends/bpf/objects.rs` embeds them with `include_bytes_aligned!`.
//! The probes are C (docs/design.md, "Fixed choices"); clang and libbpf's headers
//! come from Debian (`apt-get install -y clang libbpf-dev`).
//!
//! The objects are the rows of `src/abi/objects.rs`, the one table of
//! them (included here); a list written to `OUT_DIR` embeds each
//! in the table's order. Any change under `probes/` (a new header too)
//! rebuilds them.
//!
//! `HOSTMESH_PROBES=DIR` takes the objects from DIR instead (one `NAME.o`
//! per row of the table, e.g. the OUT_DIR of an earlier build), for editors
//! and type-checking on a machine without clang. `CLANG` names the compiler.

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

#[allow(dead_code)]
#[path = "src/abi/objects.rs"]
mod objects;

use objects::OBJECTS;

const INSTALL: &str = "install clang and libbpf-dev (`apt-get install -y clang libbpf-dev`, or run scripts/deps), \
                       or set HOSTMESH_PROBES to a directory of prebuilt probe objects";

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let probes = manifest.join("../probes");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-env-changed=CLANG");
    println!("cargo:rerun-if-env-changed=HOSTMESH_PROBES");
    println!("cargo:rerun-if-changed=src/abi/objects.rs");
    // A directory: cargo reruns when anything under it changes.
    println!("cargo:rerun-if-changed={}", probes.display());
    let result = match env::var_os("HOSTMESH_PROBES") {
        Some(dir) => copy_prebuilt(Path::new(&dir), &out),
        None => compile_all(&probes, &out),
    }
    .and_then(|()| write_embedded(&out));
    // One sentence from cargo instead of a panic's backtrace and the
    // script's whole output.
    if let Err(message) = result {
        println!("cargo::error={message}");
    }
}

/// The list of every object's bytes, in the table's order, for
/// `backends/bpf/objects.rs` to `include!`.
fn write_embedded(out: &Path) -> Result<(), String> {
    let mut text = String::from("[\n");
    for o in &OBJECTS {
        let path = out.join(format!("{}.o", o.name));
        text.push_str(&format!("    aya::include_bytes_aligned!({:?}),\n", path.display().to_string()));
    }
    text.push_str("]\n");
    let file = out.join("embedded.rs");
    fs::write(&file, text).map_err(|e| format!("cannot write {}: {e}", file.display()))
}

fn copy_prebuilt(dir: &Path, out: &Path) -> Result<(), String> {
    for o in &OBJECTS {
        let from = dir.join(format!("{}.o", o.name));
        println!("cargo:rerun-if-changed={}", from.display());
        fs::copy(&from, out.join(format!("{}.o", o.name)))
            .map_err(|e| format!("HOSTMESH_PROBES: cannot copy {}: {e}", from.display()))?;
    }
    Ok(())
}

fn compile_all(probes: &Path, out: &Path) -> Result<(), String> {
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_string());
    if let Err(e) = Command::new(&clang).arg("--version").output() {
        return Err(format!("the eBPF probes need `{clang}`, which cannot be run ({e}): {INSTALL}"));
    }
    for o in &OBJECTS {
        compile(&clang, &probes.join(o.source), &out.join(format!("{}.o", o.name)), probes, o.defines)?;
    }
    Ok(())
}

fn compile(clang: &str, src: &Path, obj: &Path, include: &Path, defines: &[&str]) -> Result<(), String> {
    let arch_include = format!("/usr/include/{}-linux-gnu", env::consts::ARCH);
    let out = Command::new(clang)
        .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror", "-c"])
        .arg(format!("-I{}", include.display()))
        .arg(format!("-I{arch_include}"))
        .args(defines)
        .arg(src)
        .arg("-o")
        .arg(obj)
        .output()
        .map_err(|e| format!("cannot run `{clang}` on {}: {e}", src.display()))?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    // A missing libbpf header is the one failure a new machine has.
    if stderr.contains("bpf/bpf_helpers.h' file not found") {
        return Err(format!("{} needs libbpf's headers: {INSTALL}", src.display()));
    }
    // cargo::error takes one line; clang's own diagnostics follow it.
    eprintln!("{stderr}");
    Err(format!("clang failed to compile {} (its messages are above)", src.display()))
}
