//! Conntrack housekeeping, the daemon's part: every `CONNTRACK_SWEEP` the
//! BPF backend removes flows past their timeout; this keeps the last
//! sweep's counts for the status and logs a failure when it starts and
//! when it changes, not at every sweep.

use slog::{debug, warn, Logger};

use crate::backends::Sweep;
use crate::reconcile::Reconciler;

#[derive(Default)]
pub(super) struct Sweeper {
    /// The last sweep's counts.
    pub(super) last: Sweep,
    /// The error of the last failed sweep.
    error: Option<String>,
}

impl Sweeper {
    /// One sweep; true when its counts differ from the last one's (the
    /// status then follows).
    pub(super) fn sweep(&mut self, rec: &mut Reconciler, log: &Logger) -> bool {
        match rec.expire_flows() {
            Ok(sweep) => {
                if sweep.removed > 0 {
                    debug!(log, "expired flows"; "entries" => sweep.removed, "open" => sweep.open, "closed" => sweep.closed);
                }
                self.error = None;
                let changed = sweep != self.last;
                self.last = sweep;
                changed
            }
            Err(e) => {
                let e = e.to_string();
                if self.error.as_ref() != Some(&e) {
                    warn!(log, "cannot expire flows from conntrack"; "error" => e.clone());
                    self.error = Some(e);
                }
                false
            }
        }
    }
}
