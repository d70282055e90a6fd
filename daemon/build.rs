//! Compiles every eBPF probe under `probes/` with clang into `OUT_DIR`, where
//! `src/dataplane/objects.rs` embeds them with `include_bytes_aligned!`.
//! The probes are C (DESIGN.md, "Fixed choices"); clang and libbpf's headers
//! come from Debian (`apt-get install -y clang libbpf-dev`).

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

/// Every probe the daemon embeds. One C file per feature.
const PROBES: &[&str] = &["service_nat", "service_ctlb", "mesh", "gateway"];

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let probes = manifest.join("../probes");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_string());

    println!("cargo:rerun-if-env-changed=CLANG");
    for header in ["hostmesh_abi.h", "service_maps.h", "packet.h"] {
        println!("cargo:rerun-if-changed={}", probes.join(header).display());
    }
    for probe in PROBES {
        let src = probes.join(format!("{probe}.c"));
        println!("cargo:rerun-if-changed={}", src.display());
        compile(&clang, &src, &out.join(format!("{probe}.o")), &probes);
    }
}

fn compile(clang: &str, src: &Path, obj: &Path, include: &Path) {
    let arch_include = format!("/usr/include/{}-linux-gnu", env::consts::ARCH);
    let output = Command::new(clang)
        .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror", "-c"])
        .arg(format!("-I{}", include.display()))
        .arg(format!("-I{arch_include}"))
        .arg(src)
        .arg("-o")
        .arg(obj)
        .output();
    match output {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!("clang failed to compile {}:\n{}", src.display(), String::from_utf8_lossy(&out.stderr)),
        Err(err) => panic!(
            "cannot run `{clang}` to compile the eBPF probes ({err}); install clang and \
             libbpf-dev (`apt-get install -y clang libbpf-dev`, or run scripts/deps)"
        ),
    }
}
