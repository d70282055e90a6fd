//! Reconcile: observe owned kernel state, plan the difference to the
//! desired state, apply it in a safe order.

mod apply;
mod observe;
pub mod originals;
mod plan;
mod reconciler;

pub use apply::StepError;
pub use observe::{observe, observe_sysctls};
pub use originals::SysctlOriginals;
pub use plan::{plan, PlannedStep, Step};
pub use reconciler::{Phases, Reconciler, SyncOutcome};

#[cfg(test)]
mod tests;
