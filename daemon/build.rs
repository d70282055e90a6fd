//! Compiles every eBPF probe under `probes/` with clang into `OUT_DIR`, where
//! `src/backends/bpf/objects.rs` embeds them with `include_bytes_aligned!`.
//! The probes are C (docs/design.md, "Fixed choices"); clang and libbpf's headers
//! come from Debian (`apt-get install -y clang libbpf-dev`).

use std::{
    env,
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
];

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let probes = manifest.join("../probes");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_string());

    println!("cargo:rerun-if-env-changed=CLANG");
    for header in ["hostmesh_abi.h", "service_maps.h", "packet.h", "conntrack.h"] {
        println!("cargo:rerun-if-changed={}", probes.join(header).display());
    }
    for (object, source, defines) in PROBES {
        let src = probes.join(format!("{source}.c"));
        println!("cargo:rerun-if-changed={}", src.display());
        compile(&clang, &src, &out.join(format!("{object}.o")), &probes, defines);
    }
}

fn compile(clang: &str, src: &Path, obj: &Path, include: &Path, defines: &[&str]) {
    let arch_include = format!("/usr/include/{}-linux-gnu", env::consts::ARCH);
    let output = Command::new(clang)
        .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror", "-c"])
        .arg(format!("-I{}", include.display()))
        .arg(format!("-I{arch_include}"))
        .args(defines)
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
