//! The reconciler: one `sync` turns the configuration in force into kernel
//! state. Incremental syncs diff against what the last successful sync
//! applied; a full resync (the first, the periodic one, and any after a
//! failure) re-reads the kernel, adopting what is there and repairing
//! drift.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backends::{BackendError, Backends, BpfSettings};
use crate::config::{Config, MeshBackend};
use crate::model::incremental::{self, recompile, Compiled, Touched};
use crate::model::{compile_unless_stopped, gateway, Desired, HostFacts, Observed, Prior, Via};

use super::apply::{apply, Applied, StepError};
use super::observe::{observe_sysctls, observe_until};
use super::originals::SysctlOriginals;
use super::plan::{plan, plan_until, PlannedStep};

/// What a sync will apply: the last compile patched, with what the patch
/// touched, or a compile of everything.
enum Want {
    Patched(Box<Compiled>, Touched),
    /// A full sync's: the last compile, nothing it was made from having
    /// changed.
    Kept(Box<Compiled>),
    Compiled(Desired),
    /// A resync that gave way to a sync an event asks for: nothing done.
    GaveWay,
}

pub(crate) struct Reconciler {
    backends: Backends,
    originals: SysctlOriginals,
    /// Whether the kernel holds what `compiled` says: the last sync
    /// applied all of it. When not, the next sync observes the kernel.
    applied: bool,
    /// The last compile: what `desired()` reports, and what an edit of a
    /// few services patches (`model::incremental`).
    compiled: Option<Compiled>,
    /// The gateways the probes chose (runtime state, not config).
    gateways: BTreeMap<Via, Option<IpAddr>>,
    /// Raised when the daemon is told to stop: a sync stops between steps.
    stopping: Arc<AtomicBool>,
    /// Raised while an event that asks for a sync (an edit, a backend or
    /// a peer that changed) waits for the loop: a resync that may give
    /// way to it does (`sync_giving_way`).
    waiting: Arc<AtomicBool>,
}

/// How many of a sync's steps its outcome describes.
pub(super) const DESCRIBED_STEPS: usize = 1000;

#[derive(Debug)]
pub(crate) struct SyncOutcome {
    pub full: bool,
    /// Only the changed services were compiled and planned.
    pub patched: bool,
    /// How many steps were carried out (including failed ones).
    pub step_count: usize,
    /// The first `DESCRIBED_STEPS` of them, described (for the debug log
    /// and tests; a first sync at 100,000 services has 600,000).
    pub steps: Vec<String>,
    pub errors: Vec<StepError>,
    /// Why the BPF programs could not be loaded, if so: nothing that needs
    /// them was applied.
    pub bpf_unavailable: Option<String>,
    /// The sync stopped early because the daemon is stopping.
    pub stopped: bool,
    /// A resync gave way to a sync an event asks for, before applying:
    /// nothing was done, and the kernel and the last compile are as they
    /// were.
    pub gave_way: bool,
    /// What the backends repaired or replaced on the way, for the log.
    pub notes: Vec<String>,
    pub duration: Duration,
    pub phases: Phases,
}

/// Where a sync's time went (logged with "sync done"; `bench/scale` reports
/// it): reading the kernel, compiling (with the host facts it needs),
/// diffing, writing, and recording what was written as the next baseline.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Phases {
    pub observe: Duration,
    pub compile: Duration,
    pub plan: Duration,
    pub apply: Duration,
    pub record: Duration,
}

/// The time since `mark`, moving `mark` to now.
fn lap(mark: &mut Instant) -> Duration {
    let now = Instant::now();
    let d = now - *mark;
    *mark = now;
    d
}

impl Reconciler {
    pub(crate) fn new(backends: Backends, originals: SysctlOriginals) -> Self {
        Reconciler {
            backends,
            originals,
            applied: false,
            compiled: None,
            gateways: BTreeMap::new(),
            stopping: Default::default(),
            waiting: Default::default(),
        }
    }

    /// A resync that may give way checks `waiting` while it reads the
    /// kernel, and gives way once it is raised.
    pub(crate) fn with_waiting_flag(mut self, waiting: Arc<AtomicBool>) -> Self {
        self.waiting = waiting;
        self
    }

    /// A sync checks `stopping` between steps and ends early once it is set.
    pub(crate) fn with_stop_flag(mut self, stopping: Arc<AtomicBool>) -> Self {
        self.stopping = stopping;
        self
    }

    pub(crate) fn set_gateways(&mut self, chosen: BTreeMap<Via, Option<IpAddr>>) {
        self.gateways = chosen;
    }

    /// The desired state of the last sync (`None` before the first).
    pub(crate) fn desired(&self) -> Option<&Desired> {
        self.compiled.as_ref().map(|c| &c.desired)
    }

    /// How many entries the desired state has in each map.
    pub(crate) fn entry_counts(&self) -> Option<&BTreeMap<crate::model::BpfMap, usize>> {
        self.compiled.as_ref().map(|c| c.entry_counts())
    }

    /// The capacities of the BPF maps, which differ from the configured
    /// ones for maps the configuration leaves unused.
    pub(crate) fn map_sizes(&self) -> Option<crate::config::MapSizes> {
        self.backends.bpf.map_sizes()
    }

    pub(crate) fn sync(&mut self, config: &Arc<Config>, full: bool) -> Result<SyncOutcome, BackendError> {
        self.sync_with(config, full, false)
    }

    /// A full sync that gives way, before it applies anything, to an event
    /// that asks for a sync (`waiting`) when it is a resync of what the
    /// last clean sync applied (nothing it compiles from changed): an edit
    /// then waits for the loop's next look at its events, not for the
    /// whole resync (a second at 100,000 services). The caller runs the
    /// edit's sync, then this resync again.
    pub(crate) fn sync_giving_way(&mut self, config: &Arc<Config>) -> Result<SyncOutcome, BackendError> {
        self.sync_with(config, true, true)
    }

    fn sync_with(&mut self, config: &Arc<Config>, full: bool, may_give_way: bool) -> Result<SyncOutcome, BackendError> {
        let started = Instant::now();
        // New map capacities replace maps, and another TC mode moves every
        // TC hook: the kernel must be re-read.
        let d = &config.daemon;
        let configured = self.host_facts(config).and_then(|facts| {
            // The programs the compile will likely attach: which maps it
            // leaves unused, and what the preload verifies.
            let likely = crate::model::programs_likely(config, &facts.features);
            let unused = crate::model::unused_capacities(config, &likely);
            let settings = BpfSettings { sizes: d.sizes, unused, tc_attach: d.tc_attach };
            Ok((facts, likely, self.backends.bpf.configure(&settings)?))
        });
        let (facts, likely, resized) = match configured {
            Ok(r) => r,
            Err(e) => {
                self.applied = false;
                return Err(e);
            }
        };
        let full = full || resized || !self.applied || self.compiled.is_none();
        // Any service needs the probes: their load (a tenth of a second,
        // the maps' creation and the verifier's work) runs beside the
        // compile.
        if config.services.is_empty() {
            self.backends.bpf.cool_down();
        } else {
            self.backends.bpf.preload(&likely);
        }
        let result = self.sync_inner(config, &facts, full, may_give_way, started);
        if !matches!(&result, Ok(o) if o.errors.is_empty()) {
            self.applied = false;
        }
        result
    }

    fn sync_inner(
        &mut self,
        config: &Arc<Config>,
        facts: &HostFacts,
        full: bool,
        may_give_way: bool,
        started: Instant,
    ) -> Result<SyncOutcome, BackendError> {
        let mut phases = Phases::default();
        let mut mark = started;
        let (want, observed) = self.want(config, facts, full, may_give_way, &mut phases, &mut mark)?;
        let kept = matches!(want, Want::Kept(_));
        let nothing_done = |r: &mut Self, stopped: bool, gave_way: bool, phases: Phases| SyncOutcome {
            full,
            patched: false,
            step_count: 0,
            steps: Vec::new(),
            errors: Vec::new(),
            bpf_unavailable: None,
            stopped,
            gave_way,
            notes: r.backends.bpf.take_notes(),
            duration: started.elapsed(),
            phases,
        };
        let (compiled, touched) = match want {
            Want::Patched(c, touched) => (*c, Some(touched)),
            Want::Kept(c) => (*c, None),
            Want::GaveWay => return Ok(nothing_done(self, false, true, phases)),
            // A partial compile is never planned, let alone applied.
            Want::Compiled(_) if self.stopping.load(Ordering::Relaxed) => {
                return Ok(nothing_done(self, true, false, phases))
            }
            Want::Compiled(desired) => (Compiled::new(desired, config, facts), None),
        };
        phases.compile += lap(&mut mark);
        // A patch plans from what its items were (the kernel held the
        // last compile); anything else from what the kernel holds.
        let before = touched.as_ref().filter(|_| observed.is_none()).map(|t| t.before(&compiled.desired));
        let have = observed.as_ref().or(before.as_ref()).expect("a sync that does not patch read the kernel");
        // A patch's plan covers the items it touched only.
        let touched_want = touched.as_ref().map(|t| t.desired(&compiled.desired));
        let plan_want = touched_want.as_ref().unwrap_or(&compiled.desired);
        // A resync of the last compile gives way during its plan too.
        let Some(steps) = self.plan_steps(have, plan_want, touched.is_some(), may_give_way && kept) else {
            drop(observed);
            self.compiled = Some(compiled);
            phases.plan = lap(&mut mark);
            return Ok(nothing_done(self, false, true, phases));
        };
        drop(observed); // planned against, no longer needed
        phases.plan = lap(&mut mark);
        let Applied { errors, bpf_unavailable, stopped } =
            apply(&mut self.backends, &steps, &mut self.originals, &self.stopping);
        phases.apply = lap(&mut mark);
        let step_count = steps.len();
        let described = steps.iter().take(DESCRIBED_STEPS).map(|s| s.step().to_string()).collect();
        drop(steps);
        let notes = self.record(compiled, stopped, errors.is_empty());
        phases.record = lap(&mut mark);
        Ok(SyncOutcome {
            full,
            patched: touched.is_some() || kept,
            step_count,
            steps: described,
            errors,
            bpf_unavailable,
            stopped,
            gave_way: false,
            notes,
            duration: started.elapsed(),
            phases,
        })
    }

    /// The steps from `have` to `want` (after a patch, the touched items
    /// only, and `have` what they were); `None` when a resync that may give
    /// way (`giving_way`) did so in the middle of its plan.
    fn plan_steps<'a>(
        &self,
        have: &Observed,
        want: &'a Desired,
        patched: bool,
        giving_way: bool,
    ) -> Option<Vec<PlannedStep<'a>>> {
        if patched {
            return Some(plan(have, want, self.originals.values()));
        }
        let waiting = Arc::clone(&self.waiting);
        plan_until(have, want, self.originals.values(), &move || giving_way && waiting.load(Ordering::Relaxed))
    }

    /// What compile needs from the host, this sync.
    fn host_facts(&mut self, config: &Config) -> Result<HostFacts, BackendError> {
        let mut facts = self.backends.host.facts()?;
        if !config.meshes.is_empty() && config.daemon.mesh_backend == MeshBackend::Auto {
            facts.sk_lookup_unavailable = self.backends.bpf.sk_lookup_unavailable();
        }
        facts.underlay_mtu = self.backends.host.path_mtus(&gateway::underlay_addresses(config))?;
        facts.backend_routes = self.backends.host.backend_routes(&crate::model::external::backend_addresses(config))?;
        if config.services.iter().any(|s| s.node_port.is_some()) {
            facts.addresses = self.backends.host.addresses()?;
        }
        facts.gateways = self.gateways.clone();
        facts.wireguard_key = wireguard_key(config);
        Ok(facts)
    }

    /// The desired state, and for a full sync what the kernel has.
    /// Incremental: patch the last compile when only services changed,
    /// else compile against what the last sync applied. Full: observe.
    fn want(
        &mut self,
        config: &Arc<Config>,
        facts: &HostFacts,
        full: bool,
        may_give_way: bool,
        phases: &mut Phases,
        mark: &mut Instant,
    ) -> Result<(Want, Option<Observed>), BackendError> {
        if let Some(prev) = self.compiled.take_if(|_| !full) {
            return Ok(match recompile(prev, config, facts) {
                Ok((c, touched)) => (Want::Patched(Box::new(c), touched), None),
                // The last compile, which the kernel holds: the full
                // compile keeps its ids, and is planned from it.
                Err(last) => {
                    let have = last.as_observed();
                    drop(last);
                    let prior = Prior::from_entries(have.map_entries.iter());
                    (Want::Compiled(compile_unless_stopped(config, facts, &prior, &self.stopping)), Some(have))
                }
            });
        }
        // A full sync starts from the kernel: the baseline is not needed.
        // Nor is the last compile unless nothing it was made from changed
        // (a SIGHUP or periodic resync of the same configuration): then it
        // is what a compile would give, and the sync costs the kernel's
        // dump and a diff. Holding an old compile beside a new one doubled
        // a resync's memory (100,000 services).
        //
        // Only a resync of what the last clean sync applied gives way: the
        // last compile and baseline stand for the kernel meanwhile. A
        // change already waiting goes first even when this resync read it
        // (the change's sync patches the compile); once the compile is
        // let go for a new one, nothing gives way.
        let may_give_way = may_give_way && self.compiled.is_some() && self.applied;
        let waiting = Arc::clone(&self.waiting);
        if may_give_way && waiting.load(Ordering::Relaxed) {
            return Ok((Want::GaveWay, None));
        }
        let kept = self.compiled.take().and_then(|c| incremental::keep(c, config, facts));
        if kept.is_none() {
            self.applied = false;
        }
        phases.compile += lap(mark);
        let give_way = may_give_way && kept.is_some();
        let give_up = move || give_way && waiting.load(Ordering::Relaxed);
        // The last compile kept is what the kernel is compared with: its
        // entries the kernel has as they are are not kept.
        let against = kept.as_ref().map(|c| &c.desired);
        let have = observe_until(&mut self.backends, &give_up, against)?.filter(|_| !give_up());
        let Some(mut have) = have else {
            self.compiled = kept;
            phases.observe = lap(mark);
            return Ok((Want::GaveWay, None));
        };
        phases.observe = lap(mark);
        let want = match kept {
            Some(c) => Want::Kept(Box::new(c)),
            None => Want::Compiled(compile_unless_stopped(
                config,
                facts,
                &Prior::from_entries(have.map_entries.iter()),
                &self.stopping,
            )),
        };
        let desired = match &want {
            Want::Kept(c) => &c.desired,
            Want::Compiled(d) => d,
            Want::Patched(..) | Want::GaveWay => {
                unreachable!("a full sync that read the kernel neither patches nor gave way")
            }
        };
        let paths: BTreeSet<String> = desired.sysctls.keys().chain(self.originals.values().keys()).cloned().collect();
        phases.compile += lap(mark);
        observe_sysctls(&mut self.backends, &paths, &mut have)?;
        phases.observe += lap(mark);
        Ok((want, Some(have)))
    }

    /// Keeps the compile for the next sync to patch and plan from, noting
    /// whether the kernel holds it (all of it was applied); finishes a map
    /// resize once this build's programs run. Returns the BPF backend's
    /// notes.
    fn record(&mut self, compiled: Compiled, stopped: bool, clean: bool) -> Vec<String> {
        // Part of a plan that stopped ran: the next start observes.
        self.applied = !stopped && clean;
        self.compiled = Some(compiled);
        let mut notes = self.backends.bpf.take_notes();
        if !stopped && clean {
            // This build's programs now run on the resized maps: what the
            // old ones wrote meanwhile is copied over.
            match self.backends.bpf.finish_migration() {
                Ok(more) => notes.extend(more),
                Err(e) => notes.push(format!("finishing a map resize: {e}")),
            }
        }
        notes
    }

    /// The first sysctl hostmesh set that no longer has its value, as a
    /// sentence (sysctls send no events: the daemon asks every second).
    pub(crate) fn sysctl_drift(&mut self) -> Option<String> {
        let want = &self.compiled.as_ref()?.desired;
        for (path, w) in &want.sysctls {
            match self.backends.sysctl.get(path) {
                Ok(Some(v)) if v != w.spec => {
                    return Some(format!("sysctl {} is {v}, hostmesh set {}", path.replace('/', "."), w.spec))
                }
                _ => {}
            }
        }
        None
    }

    /// What the backends found that keeps the dataplane from working as
    /// planned, for the status (`BpfBackend::warnings`).
    pub(crate) fn backend_warnings(&self) -> Vec<String> {
        self.backends.bpf.warnings()
    }

    /// Housekeeping between syncs: expire idle flows from conntrack.
    pub(crate) fn expire_flows(&mut self) -> Result<crate::backends::Sweep, BackendError> {
        self.backends.bpf.expire_flows()
    }

    /// Flows and connected sockets of backends that left their services
    /// (`BpfBackend::drop_flows`).
    pub(crate) fn drop_flows(
        &mut self,
        stopped: &[crate::backends::StoppedBackend],
    ) -> Result<crate::backends::Forgotten, BackendError> {
        self.backends.bpf.drop_flows(stopped)
    }

    /// After a sync: affinity entries of backends that left their service
    /// (`BpfBackend::prune_affinity`).
    pub(crate) fn prune_affinity(
        &mut self,
        serving: &std::collections::BTreeMap<crate::abi::SvcKey, std::collections::BTreeSet<std::net::SocketAddr>>,
    ) -> Result<usize, BackendError> {
        self.backends.bpf.prune_affinity(serving)
    }

    /// After a clean full sync: the traffic counters of pairs no longer
    /// configured (`BpfBackend::prune_backend_stats`).
    pub(crate) fn prune_backend_stats(
        &mut self,
        configured: crate::backends::ConfiguredPairs<'_>,
    ) -> Result<usize, BackendError> {
        self.backends.bpf.prune_backend_stats(configured)
    }
}

/// This gateway's WireGuard key, when a peer is encrypted: its private
/// key read as the trust rules allow (`keys::read_private_key`); why it
/// could not be, if not. Read again each sync, so a fixed file (mode,
/// owner) or a new key counts at the next one.
fn wireguard_key(config: &Config) -> Option<Result<crate::keys::DeviceKey, String>> {
    let g = config.gateway.as_ref()?;
    if !config.peers.iter().any(|p| p.encrypted()) {
        return None;
    }
    let source = g.private_key.as_ref()?;
    let creds = std::env::var_os("CREDENTIALS_DIRECTORY").map(std::path::PathBuf::from);
    Some(
        crate::keys::read_private_key(source, creds.as_deref())
            .map(crate::keys::DeviceKey::of)
            .map_err(|e| e.to_string()),
    )
}
