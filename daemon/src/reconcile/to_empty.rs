//! A reconcile to the empty state, for `hostmesh teardown`: what hostmesh
//! owns is read back, `plan` removes it in its own order (routes first,
//! then programs, the nftables table, policy rules, neighbours, sysctls put back, links
//! last) and `apply` carries that out, step by step, like any sync.
//!
//! Two things differ from a sync. Attached programs are read back without
//! loading this build's (they are detached whatever they are), so teardown
//! works on a kernel where the programs cannot load. And map contents are
//! not read: the maps go whole after the plan (their pins are removed),
//! not entry by entry.

use std::collections::BTreeSet;
use std::sync::atomic::AtomicBool;

use crate::backends::{Backends, Result};
use crate::model::{AttachStatus, Desired, Observed};

use super::apply::{apply, StepError};
use super::observe::observe_sysctls;
use super::originals::SysctlOriginals;
use super::plan::{plan, PlannedStep, Step};

/// What the reconcile to empty did.
#[derive(Debug, Default)]
pub(crate) struct Emptied {
    /// The steps carried out, including failed ones.
    pub steps: Vec<Step>,
    pub errors: Vec<StepError>,
}

/// Removes everything hostmesh owns that a plan covers (see the module).
pub(crate) fn reconcile_to_empty(b: &mut Backends, originals: &mut SysctlOriginals) -> Result<Emptied> {
    let mut have = Observed {
        links: b.net.links()?,
        neighbours: b.net.neighbours()?,
        routes: b.net.routes()?,
        rules: b.net.rules()?,
        nft_table: b.nft.mesh_table()?,
        attachments: b.bpf.present()?.into_iter().map(|a| (a, AttachStatus::Current)).collect(),
        ..Observed::default()
    };
    let recorded: BTreeSet<String> = originals.values().keys().cloned().collect();
    observe_sysctls(b, &recorded, &mut have)?;
    let nothing = Desired::default();
    let steps = plan(&have, &nothing, originals.values());
    // Nothing can ask teardown to stop half way.
    let applied = apply(b, &steps, originals, &AtomicBool::new(false));
    Ok(Emptied { steps: steps.into_iter().map(PlannedStep::into_step).collect(), errors: applied.errors })
}
