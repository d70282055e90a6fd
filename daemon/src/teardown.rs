//! `hostmesh teardown`: remove everything hostmesh owns in this network
//! namespace — pinned links (which detaches the programs), pinned maps,
//! `table inet hostmesh`, routes with hostmesh's protocol, `hm-*` links —
//! and put back the sysctls it changed. Safe to run twice.

use std::fs;
use std::io;

use crate::backends::bpf::PinnedBpf;
use crate::backends::netlink::{owned_links, Rtnetlink};
use crate::backends::nft::NftCli;
use crate::backends::sysctl::ProcSys;
use crate::backends::{BackendError, NetBackend, NftBackend, SysctlBackend};
use crate::model::KernelFeatures;
use crate::paths::Paths;
use crate::reconcile::SysctlOriginals;
use crate::state::STATUS_FILE;

#[derive(Debug, thiserror::Error)]
pub(crate) enum TeardownError {
    #[error("{0}")]
    Backend(#[from] BackendError),
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> TeardownError {
    let what = what.into();
    move |source| TeardownError::Io { what, source }
}

/// Removes everything; returns one line per thing removed or restored.
pub(crate) fn teardown(paths: &Paths) -> Result<Vec<String>, TeardownError> {
    let mut done = Vec::new();

    // Programs first: unpinning a link detaches its program, so nothing
    // steers traffic into a veth that is about to go.
    // clsact filters are found on the qdiscs, pin dir or not. (Teardown
    // removes TCX links and filters alike, whatever this kernel has.)
    let mut bpf = PinnedBpf::new(&paths.bpffs, KernelFeatures::complete());
    // With the pins goes the pin dir (and the bpffs hostmesh mounted there).
    done.extend(bpf.remove_all()?);

    let mut nft = NftCli::new();
    if nft.mesh_table()?.is_some() {
        nft.delete_mesh_table()?;
        done.push("deleted table inet hostmesh".to_string());
    }

    let mut net = Rtnetlink::open().map_err(io_err("open rtnetlink"))?;
    for key in net.owned_routes()? {
        net.delete_route(&key)?;
        done.push(format!("deleted route {} table {}", key.dst, key.table));
    }
    for (name, _) in owned_links(&net.all_links()?) {
        net.delete_link(&name)?;
        done.push(format!("deleted link {name}"));
    }
    // Any hm-* link left (a veth end whose peer was foreign).
    for link in net.all_links()?.into_iter().filter(|l| l.name.starts_with(crate::backends::LINK_PREFIX)) {
        net.delete_link(&link.name)?;
        done.push(format!("deleted link {}", link.name));
    }

    if paths.state_dir.exists() {
        let (mut originals, notes) =
            SysctlOriginals::load(&paths.state_dir).map_err(io_err(format!("read {}", paths.state_dir.display())))?;
        done.extend(notes.into_iter().map(|n| format!("warning: {n}")));
        let mut sysctl = ProcSys::new();
        let saved: Vec<(String, String)> = originals.values().clone().into_iter().collect();
        for (path, value) in saved {
            if let Some(current) = sysctl.get(&path)? {
                if current != value {
                    sysctl.set(&path, &value)?;
                    done.push(format!("restored sysctl {} = {value}", path.replace('/', ".")));
                }
            }
            originals.forget(&path);
        }
        for file in [STATUS_FILE, crate::reconcile::originals::FILE_NAME] {
            let p = paths.state_dir.join(file);
            if p.exists() {
                fs::remove_file(&p).map_err(io_err(format!("remove {}", p.display())))?;
            }
        }
    }
    Ok(done)
}
