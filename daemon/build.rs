//! Compiles every eBPF probe under `probes/` with clang into `OUT_DIR`, where
//! `src/backends/bpf/objects.rs` embeds them with `include_bytes_aligned!`.
//! The probes are C (docs/design.md, "Fixed choices"); clang and libbpf's headers
//! come from Debian (`apt-get install -y clang libbpf-dev`).
//!
//! `HOSTMESH_PROBES=DIR` takes the objects from DIR instead (one `NAME.o`
//! per entry of PROBES, e.g. the OUT_DIR of an earlier build), for editors
//! and type-checking on a machine without clang. `CLANG` names the compiler.

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

/// Every object the daemon embeds: (object name, C file, extra defines).
/// One C file per feature; a file built twice is a variant for kernels
/// that lack something (model/kernel.rs says which).
const PROBES: &[(&str, &str, &[&str])] = &[
    ("service_nat", "service_nat", &[]),
    ("service_ctlb", "service_ctlb", &[]),
    // Without bpf_set_retval() (before 5.18): refusals are EPERM.
    ("service_ctlb_eperm", "service_ctlb", &["-DHM_NO_SET_RETVAL"]),
    ("mesh", "mesh", &[]),
    ("gateway", "gateway", &[]),
    ("netns_cookie", "netns_cookie", &[]),
    // Never loaded: the header's constants as BTF, for the ABI test.
    ("abi_constants", "abi_constants", &[]),
];

const INSTALL: &str = "install clang and libbpf-dev (`apt-get install -y clang libbpf-dev`, or run scripts/deps), \
                       or set HOSTMESH_PROBES to a directory of prebuilt probe objects";

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let probes = manifest.join("../probes");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-env-changed=CLANG");
    println!("cargo:rerun-if-env-changed=HOSTMESH_PROBES");
    for header in ["hostmesh_abi.h", "service_maps.h", "packet.h", "conntrack.h", "build_mark.h"] {
        println!("cargo:rerun-if-changed={}", probes.join(header).display());
    }
    let result = match env::var_os("HOSTMESH_PROBES") {
        Some(dir) => copy_prebuilt(Path::new(&dir), &out),
        None => compile_all(&probes, &out),
    };
    // One sentence from cargo instead of a panic's backtrace and the
    // script's whole output.
    if let Err(message) = result {
        println!("cargo::error={message}");
    }
}

fn copy_prebuilt(dir: &Path, out: &Path) -> Result<(), String> {
    for (object, _, _) in PROBES {
        let from = dir.join(format!("{object}.o"));
        println!("cargo:rerun-if-changed={}", from.display());
        fs::copy(&from, out.join(format!("{object}.o")))
            .map_err(|e| format!("HOSTMESH_PROBES: cannot copy {}: {e}", from.display()))?;
    }
    Ok(())
}

fn compile_all(probes: &Path, out: &Path) -> Result<(), String> {
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_string());
    if let Err(e) = Command::new(&clang).arg("--version").output() {
        return Err(format!("the eBPF probes need `{clang}`, which cannot be run ({e}): {INSTALL}"));
    }
    for (object, source, defines) in PROBES {
        let src = probes.join(format!("{source}.c"));
        println!("cargo:rerun-if-changed={}", src.display());
        compile(&clang, &src, &out.join(format!("{object}.o")), probes, defines)?;
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
