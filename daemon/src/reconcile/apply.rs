//! apply(): carry out a plan through the backends. Every step is tried;
//! a failure is recorded against the config objects it was for and the
//! rest of the plan still runs, so one bad object does not hold back the
//! others. Any failure makes the next sync a full resync.

use serde::Serialize;

use crate::backends::{Backends, Result};
use crate::model::Owners;

use super::originals::SysctlOriginals;
use super::plan::{PlannedStep, Step};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StepError {
    pub step: String,
    pub owners: Owners,
    pub error: String,
}

pub fn apply(b: &mut Backends, steps: &[PlannedStep], originals: &mut SysctlOriginals) -> Vec<StepError> {
    let mut errors = Vec::new();
    for planned in steps {
        if let Err(e) = apply_one(b, &planned.step, originals) {
            errors.push(StepError {
                step: planned.step.to_string(),
                owners: planned.owners.clone(),
                error: e.to_string(),
            });
        }
    }
    errors
}

fn apply_one(b: &mut Backends, step: &Step, originals: &mut SysctlOriginals) -> Result<()> {
    match step {
        Step::DeleteLink(name) => b.net.delete_link(name),
        Step::CreateLink(name, spec) => b.net.create_link(name, spec),
        Step::SetLinkUp(name) => b.net.set_link_up(name),
        Step::SetSysctl { path, value, original } => {
            // Record before writing: if we crash in between, the original
            // is still known.
            if let Some(orig) = original {
                originals.record(path, orig);
            }
            b.sysctl.set(path, value)
        }
        Step::ReplaceNeighbour(k, s) => b.net.replace_neighbour(k, s),
        Step::PutMapEntry(k, v) => b.bpf.put_map_entry(k, v),
        Step::Attach(a) => b.bpf.attach(a),
        Step::ReplaceNftTable(rules) => b.nft.replace_mesh_table(rules),
        Step::DeleteNftTable => b.nft.delete_mesh_table(),
        Step::ReplaceRoute(k, s) => b.net.replace_route(k, s),
        Step::DeleteRoute(k) => b.net.delete_route(k),
        Step::Detach(a) => b.bpf.detach(a),
        Step::DeleteMapEntry(k) => b.bpf.delete_map_entry(k),
        Step::DeleteNeighbour(k) => b.net.delete_neighbour(k),
        Step::RestoreSysctl { path, original, current } => {
            if current.as_ref().is_some_and(|c| c != original) {
                b.sysctl.set(path, original)?;
            }
            originals.forget(path);
            Ok(())
        }
    }
}
