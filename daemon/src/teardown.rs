//! `hostmesh teardown`: a reconcile to the empty state, through `plan`
//! like every sync (`reconcile::reconcile_to_empty`), then what no plan
//! step covers, in one place: the pinned maps (whole), the pin dir and the
//! bpffs hostmesh mounted on it, the cgroup2 mount it made under the state
//! dir on a host that had none, and the files it keeps there. Safe to run
//! twice.

use std::fs;
use std::io;
use std::path::Path;

use crate::backends::bpf::PinnedBpf;
use crate::backends::netlink::Rtnetlink;
use crate::backends::nft::NftCli;
use crate::backends::sysctl::ProcSys;
use crate::backends::{BackendError, Backends, HostBackend};
use crate::model::{HostFacts, KernelFeatures};
use crate::paths::Paths;
use crate::reconcile::{reconcile_to_empty, Step, SysctlOriginals};

#[derive(Debug, thiserror::Error)]
pub(crate) enum TeardownError {
    #[error("{0}")]
    Backend(#[from] BackendError),
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
    #[error("{} steps failed: {}", .0.len(), .0.join("; "))]
    Steps(Vec<String>),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> TeardownError {
    let what = what.into();
    move |source| TeardownError::Io { what, source }
}

/// The files hostmesh keeps in the state dir (the lock file stays: the
/// teardown holds it).
const STATE_FILES: [&str; 3] =
    [crate::state::STATUS_FILE, crate::reconcile::originals::FILE_NAME, crate::health::SAVED_FILE];

/// Teardown reads no host facts: removal needs none.
struct NoFacts;

impl HostBackend for NoFacts {
    fn facts(&mut self) -> crate::backends::Result<HostFacts> {
        Ok(HostFacts::default())
    }

    fn path_mtus(
        &mut self,
        _: &[std::net::IpAddr],
    ) -> crate::backends::Result<std::collections::BTreeMap<std::net::IpAddr, u32>> {
        Ok(Default::default())
    }

    fn backend_routes(
        &mut self,
        _: &[std::net::IpAddr],
    ) -> crate::backends::Result<std::collections::BTreeMap<std::net::IpAddr, crate::model::BackendRoute>> {
        Ok(Default::default())
    }

    fn addresses(
        &mut self,
    ) -> crate::backends::Result<std::collections::BTreeMap<String, std::collections::BTreeSet<std::net::IpAddr>>> {
        Ok(Default::default())
    }
}

/// Removes everything; returns one line per thing removed or restored.
pub(crate) fn teardown(paths: &Paths) -> Result<Vec<String>, TeardownError> {
    let mut done = Vec::new();
    let mut originals = if paths.state_dir.is_dir() {
        let (originals, notes) =
            SysctlOriginals::load(&paths.state_dir).map_err(io_err(format!("read {}", paths.state_dir.display())))?;
        done.extend(notes.into_iter().map(|n| format!("warning: {n}")));
        originals
    } else {
        SysctlOriginals::default()
    };
    let mut backends = Backends {
        host: Box::new(NoFacts),
        net: Box::new(Rtnetlink::open().map_err(io_err("open rtnetlink"))?),
        sysctl: Box::new(ProcSys::new()),
        // Removal needs no feature: every way of attaching is undone.
        bpf: Box::new(PinnedBpf::new(&paths.bpffs, KernelFeatures::complete())),
        nft: Box::new(NftCli::new()),
    };
    let emptied = reconcile_to_empty(&mut backends, &mut originals)?;
    if !emptied.errors.is_empty() {
        return Err(TeardownError::Steps(emptied.errors.iter().map(|e| format!("{}: {}", e.step, e.error)).collect()));
    }
    done.extend(emptied.steps.iter().filter_map(said));
    drop(backends);
    // The maps whole, leftover filters and pins, the pin dir and its bpffs.
    done.extend(PinnedBpf::new(&paths.bpffs, KernelFeatures::complete()).remove_all()?);
    if paths.state_dir.is_dir() {
        done.extend(clear_state_dir(&paths.state_dir)?);
    }
    Ok(done)
}

/// What a step did, in the past tense, for the operator; `None` for a
/// step that changed nothing (a sysctl already back at its value).
fn said(step: &Step) -> Option<String> {
    Some(match step {
        Step::DeleteRoute(k) => format!("deleted route {} table {}", k.dst, k.table),
        Step::Detach(a) => format!("detached {a}"),
        Step::DeleteNftTable => "deleted table inet hostmesh".to_string(),
        Step::DeleteNeighbour(k) => format!("deleted neighbour {} dev {}", k.ip, k.dev),
        Step::RestoreSysctl { path, original, current } if current.as_ref().is_some_and(|c| c != original) => {
            format!("restored sysctl {} = {original}", path.replace('/', "."))
        }
        Step::DeleteLink(name) => format!("deleted link {name}"),
        _ => return None,
    })
}

/// The cgroup2 mount hostmesh made under the state dir (where the host had
/// none), and the files it keeps there.
fn clear_state_dir(dir: &Path) -> Result<Vec<String>, TeardownError> {
    let mut done = Vec::new();
    let cgroup2 = dir.join(crate::backends::host::CGROUP2_DIR);
    if crate::backends::host::is_cgroup2_mount(&cgroup2).map_err(io_err("read /proc/self/mounts"))? {
        nix::mount::umount2(&cgroup2, nix::mount::MntFlags::MNT_DETACH)
            .map_err(|e| TeardownError::Io { what: format!("unmount {}", cgroup2.display()), source: e.into() })?;
        done.push(format!("unmounted cgroup2 {}", cgroup2.display()));
    }
    match fs::remove_dir(&cgroup2) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            return Err(TeardownError::Io { what: format!("remove {}", cgroup2.display()), source: e })
        }
        _ => {}
    }
    let applied = dir.join(crate::state::APPLIED_DIR);
    match fs::remove_dir_all(&applied) {
        Ok(()) => done.push(format!("removed {}", applied.display())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(TeardownError::Io { what: format!("remove {}", applied.display()), source: e }),
    }
    for file in STATE_FILES {
        let p = dir.join(file);
        match fs::remove_file(&p) {
            Ok(()) => done.push(format!("removed {}", p.display())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(TeardownError::Io { what: format!("remove {}", p.display()), source: e }),
        }
    }
    Ok(done)
}
