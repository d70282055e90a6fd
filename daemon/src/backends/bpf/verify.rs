//! Verifying programs: loading a program of a loaded object into the
//! kernel, which checks it, one program or many side by side.

use std::os::fd::AsFd;

use aya::Ebpf;

use super::sys::{self, ProgInfo};
use super::{bpf_err, chain};
use crate::backends::Result;
use crate::model::Program;

/// Verifies each job's program, a thread each: the kernel verifies
/// root's loads in parallel, so a start waits for the slowest program
/// instead of their sum (in the emulated VMs, 1.7 s of verifying on one
/// CPU of two). Each program's info, or why it failed.
pub(super) fn side_by_side(jobs: Vec<(Program, &mut aya::programs::Program)>) -> Vec<(Program, Result<ProgInfo>)> {
    std::thread::scope(|s| {
        let threads: Vec<_> = jobs
            .into_iter()
            .map(|(p, prog)| {
                // A signal would stop the verifier (EAGAIN): held off
                // meanwhile, on each thread.
                (p, s.spawn(move || load_one(prog, p, &super::held_signals::HeldSignals::new())))
            })
            .collect();
        threads
            .into_iter()
            .map(|(p, t)| (p, t.join().unwrap_or_else(|_| Err(bpf_err(p.name(), "the verifying thread panicked")))))
            .collect()
    })
}

/// Loads (verifies) one program of an object and returns its info.
pub(super) fn load_program(ebpf: &mut Ebpf, program: Program) -> Result<ProgInfo> {
    let held = super::held_signals::HeldSignals::new();
    match ebpf.program_mut(program.name()) {
        Some(prog) => load_one(prog, program, &held),
        None => Err(bpf_err(format!("load program {}", program.name()), "not in the object")),
    }
}

/// Loads (verifies) `prog`, `program` of its object, with signals held
/// off on this thread, and returns its info.
fn load_one(
    prog: &mut aya::programs::Program,
    program: Program,
    _held: &super::held_signals::HeldSignals,
) -> Result<ProgInfo> {
    let name = program.name();
    // Each program type has its own load() and fd(), the same for all.
    macro_rules! verified {
        ($p:expr) => {{
            $p.load().map_err(|e| bpf_err(format!("verify program {name}"), chain(&e)))?;
            $p.fd().map_err(|e| bpf_err(name, chain(&e)))?.try_clone().map_err(|e| bpf_err(name, e))?
        }};
    }
    let fd = match prog {
        aya::programs::Program::SchedClassifier(p) => verified!(p),
        aya::programs::Program::CgroupSockAddr(p) => verified!(p),
        aya::programs::Program::SkLookup(p) => verified!(p),
        aya::programs::Program::CgroupSock(p) => verified!(p),
        _ => return Err(bpf_err(format!("load program {name}"), "unexpected program type")),
    };
    sys::prog_info(fd.as_fd()).map_err(|e| bpf_err(format!("info of {name}"), e))
}
