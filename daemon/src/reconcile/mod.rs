//! Reconcile: observe owned kernel state, plan the difference to the
//! desired state, apply it in a safe order.

mod apply;
mod observe;
pub(crate) mod originals;
mod plan;
mod reconciler;
mod to_empty;

pub(crate) use apply::StepError;
pub(crate) use originals::SysctlOriginals;
#[cfg(test)]
pub(crate) use plan::plan;
pub(crate) use plan::Step;
pub(crate) use reconciler::{Reconciler, SyncOutcome};
pub(crate) use to_empty::reconcile_to_empty;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod wireguard_tests;
