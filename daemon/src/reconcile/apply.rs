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
use crate::model::{MapEntryKey, Owners};

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
    let mut at = 0;
    while let Some(planned) = steps.get(at) {
        at += 1;
        if stopping.load(Ordering::Relaxed) {
            out.stopped = true;
            break;
        }
        if planned.needs_bpf() && !bpf_checked {
            bpf_checked = true;
            if let Err(e) = b.bpf.prepare() {
                out.bpf_unavailable = Some(e.to_string());
            }
        }
        if planned.needs_bpf() && out.bpf_unavailable.is_some() {
            skipped += 1;
            skipped_owners.extend_from(planned.owners());
            if let Some(link) = planned.link() {
                broken.entry(link.clone()).or_insert_with(|| "loading the BPF programs".to_string());
            }
            continue;
        }
        let run = map_run(&steps[at - 1..]);
        if run > 0 {
            out.errors.extend(apply_map_run(b, &steps[at - 1..at - 1 + run]));
            at += run - 1;
            continue;
        }
        let PlannedStep::Other(o) = planned else { unreachable!("a map step is a run of one at least") };
        if let (Step::ReplaceRoute(..), Some(link)) = (&o.step, &o.link) {
            if let Some(why) = broken.get(link) {
                out.errors.push(StepError {
                    step: o.step.to_string(),
                    owners: o.owners.clone(),
                    error: format!("not steering traffic into {link}: {why} failed"),
                });
                continue;
            }
        }
        if let Err(e) = apply_one(b, &o.step, originals) {
            if let (false, Some(link)) = (matches!(o.step, Step::ReplaceRoute(..)), &o.link) {
                broken.entry(link.clone()).or_insert_with(|| o.step.to_string());
            }
            out.errors.push(StepError { step: o.step.to_string(), owners: o.owners.clone(), error: e.to_string() });
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

/// Map entries written or deleted in one go at most (their values are
/// built for it: a Maglev chunk, the largest, is 256 bytes). Enough for
/// the backend to share a run among several threads (`batch::update`).
const MAP_RUN: usize = 16 * 1024;

/// How many steps from the first of `steps` are one run of map writes
/// (or deletes) to one map, which the backend carries out together (in
/// batches where the kernel has them); 0 when the first is no map step.
fn map_run(steps: &[PlannedStep]) -> usize {
    let map_of = |s: &PlannedStep| match s {
        PlannedStep::Put(k, _) => Some((true, k.map)),
        PlannedStep::Delete(k) => Some((false, k.map)),
        PlannedStep::Other(_) => None,
    };
    let Some(first) = steps.first().and_then(map_of) else { return 0 };
    steps.iter().take(MAP_RUN).take_while(|s| map_of(s) == Some(first)).count()
}

/// Carries out a run of `map_run`: every entry is tried, each failure is
/// its own step's error.
fn apply_map_run(b: &mut Backends, run: &[PlannedStep]) -> Vec<StepError> {
    // (step index in the run, error)
    let mut failed: Vec<(usize, String)> = Vec::new();
    match &run[0] {
        PlannedStep::Delete(_) => {
            let keys: Vec<&MapEntryKey> =
                run.iter().filter_map(|s| if let PlannedStep::Delete(k) = s { Some(k) } else { None }).collect();
            failed.extend(b.bpf.delete_map_entries(&keys).into_iter().map(|(i, e)| (i, e.to_string())));
        }
        _ => {
            // (step index, key, bytes): a Maglev chunk is built here.
            let mut entries = Vec::with_capacity(run.len());
            for (i, s) in run.iter().enumerate() {
                let PlannedStep::Put(k, w) = s else { continue };
                match w.spec.bytes() {
                    Some(bytes) => entries.push((i, *k, bytes)),
                    // The plan writes desired values only; a read-back one is a bug.
                    None => failed.push((i, no_bytes(k).to_string())),
                }
            }
            let puts: Vec<(&MapEntryKey, &[u8])> = entries.iter().map(|(_, k, v)| (*k, v.as_ref())).collect();
            let put = b.bpf.put_map_entries(&puts);
            failed.extend(put.into_iter().map(|(j, e)| (entries[j].0, e.to_string())));
        }
    }
    failed.sort_by_key(|(i, _)| *i);
    let error = |(i, error): (usize, String)| StepError {
        step: run[i].step().to_string(),
        owners: run[i].owners().clone(),
        error,
    };
    failed.into_iter().map(error).collect()
}

fn no_bytes(k: &MapEntryKey) -> crate::backends::BackendError {
    crate::backends::BackendError::Bpf {
        op: format!("update {}", k.map.name()),
        detail: "a value read back from the kernel holds no bytes to write".to_string(),
    }
}

fn apply_one(b: &mut Backends, step: &Step, originals: &mut SysctlOriginals) -> Result<()> {
    match step {
        Step::DeleteLink(name) => b.net.delete_link(name),
        Step::CreateLink(name, spec) => b.net.create_link(name, spec),
        Step::ConfigureLink(name, spec) => b.net.configure_link(name, spec),
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
            None => Err(no_bytes(k)),
        },
        Step::Attach(a) => b.bpf.attach(a),
        Step::ReplaceNftTable(rules) => b.nft.replace_mesh_table(rules),
        Step::DeleteNftTable => b.nft.delete_mesh_table(),
        Step::ReplaceRoute(k, s) => b.net.replace_route(k, s),
        Step::DeleteRoute(k) => b.net.delete_route(k),
        Step::AddRule(r) => b.net.add_rule(r),
        Step::DeleteRule(r) => b.net.delete_rule(r),
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
