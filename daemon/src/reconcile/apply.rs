//! apply(): carry out a plan through the backends. Every step is tried;
//! a failure is recorded against the config objects it was for and the
//! rest of the plan still runs, so one bad object does not hold back the
//! others. Any failure makes the next sync a full resync.
//!
//! Two gates keep traffic from being steered at nothing: the BPF programs
//! and maps are loaded before the first step that needs them, and if they
//! cannot be, no such step runs (no veth that would run them, no map
//! entry, no program); and a route into a link runs only if every step
//! that built that link (creating it, setting it up, attaching its
//! programs) succeeded in this apply.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::Serialize;

use crate::backends::{Backends, Result};
use crate::model::Owners;

use super::originals::SysctlOriginals;
use super::plan::{PlannedStep, Step};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct StepError {
    pub step: String,
    pub owners: Owners,
    pub error: String,
}

/// What apply did: the errors, and why the BPF programs could not be
/// loaded if they could not (then nothing that needs them ran).
#[derive(Debug, Default)]
pub(super) struct Applied {
    pub errors: Vec<StepError>,
    pub bpf_unavailable: Option<String>,
    /// `stopping` was raised: the steps after it did not run.
    pub stopped: bool,
}

pub(super) fn apply(
    b: &mut Backends,
    steps: &[PlannedStep],
    originals: &mut SysctlOriginals,
    stopping: &AtomicBool,
) -> Applied {
    let mut out = Applied::default();
    let mut bpf_checked = false;
    // Link group -> the step that failed to build it.
    let mut broken: BTreeMap<String, String> = BTreeMap::new();
    let mut skipped = 0usize;
    let mut skipped_owners = Owners::new();
    for planned in steps {
        if stopping.load(Ordering::Relaxed) {
            out.stopped = true;
            break;
        }
        if planned.needs_bpf && !bpf_checked {
            bpf_checked = true;
            if let Err(e) = b.bpf.prepare() {
                out.bpf_unavailable = Some(e.to_string());
            }
        }
        if planned.needs_bpf && out.bpf_unavailable.is_some() {
            skipped += 1;
            skipped_owners.extend_from(&planned.owners);
            if let Some(link) = &planned.link {
                broken.entry(link.clone()).or_insert_with(|| "loading the BPF programs".to_string());
            }
            continue;
        }
        if let (Step::ReplaceRoute(..), Some(link)) = (&planned.step, &planned.link) {
            if let Some(why) = broken.get(link) {
                out.errors.push(StepError {
                    step: planned.step.to_string(),
                    owners: planned.owners.clone(),
                    error: format!("not steering traffic into {link}: {why} failed"),
                });
                continue;
            }
        }
        if let Err(e) = apply_one(b, &planned.step, originals) {
            if let (false, Some(link)) = (matches!(planned.step, Step::ReplaceRoute(..)), &planned.link) {
                broken.entry(link.clone()).or_insert_with(|| planned.step.to_string());
            }
            out.errors.push(StepError {
                step: planned.step.to_string(),
                owners: planned.owners.clone(),
                error: e.to_string(),
            });
        }
    }
    if let Some(why) = &out.bpf_unavailable {
        // One error for all the steps it held back, not one per step.
        out.errors.insert(
            0,
            StepError {
                step: format!("load the BPF programs ({skipped} steps that need them not run)"),
                owners: skipped_owners,
                error: why.clone(),
            },
        );
    }
    out
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
        Step::PutMapEntry(k, v) => match v.bytes() {
            Some(bytes) => b.bpf.put_map_entry(k, &bytes),
            // The plan writes desired values only; a read-back one is a bug.
            None => Err(crate::backends::BackendError::Bpf {
                op: format!("update {}", k.map.name()),
                detail: "a value read back from the kernel holds no bytes to write".to_string(),
            }),
        },
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
