//! Signals held off while the verifier runs. A signal that reaches a
//! thread in BPF_PROG_LOAD makes the kernel give up verifying and return
//! EAGAIN; the daemon takes signals all the time (SIGHUP, SIGTERM, and
//! SIGCHLD from exec health checks, whose handler tokio installs), so a
//! start could fail as though the kernel refused BPF. While a `HeldSignals`
//! lives, the calling thread blocks every signal but the synchronous
//! faults: the kernel hands a signal for the process to another thread,
//! and one sent to this thread waits until the guard goes.

use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow, Signal};

pub(crate) struct HeldSignals {
    before: Option<SigSet>,
}

impl HeldSignals {
    pub(crate) fn new() -> HeldSignals {
        let mut hold = SigSet::all();
        for fault in [Signal::SIGSEGV, Signal::SIGBUS, Signal::SIGFPE, Signal::SIGILL, Signal::SIGTRAP] {
            hold.remove(fault);
        }
        let mut before = SigSet::empty();
        // A failure leaves the mask as it was: loading works, only a signal
        // at the wrong moment fails it, as without the guard.
        let held = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&hold), Some(&mut before)).is_ok();
        HeldSignals { before: held.then_some(before) }
    }
}

impl Drop for HeldSignals {
    fn drop(&mut self) {
        if let Some(before) = &self.before {
            let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(before), None);
        }
    }
}
