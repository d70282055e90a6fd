//! `hostmesh explain ADDR[:PORT][/tcp|udp] [--from SRC[:PORT]] [--json]`:
//! which path handles an address and why, the service and its backends
//! (weights, share of the Maglev table, state, counters), the backend a
//! given source reaches now, and the kernel objects involved. It reads
//! the pinned maps and the routes, the config dir for names and the last
//! status file for states: it works while the daemon is down.

mod gather;
mod programs;
mod target;
#[cfg(test)]
mod tests;
mod view;

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;

use self::gather::{KernelView, Sources};
use crate::abi::{BackendStats, HmConfig, SvcKey};
use crate::backends::bpf::attached::AttachedProgram;
use crate::backends::bpf::inspect::{Inspector, ServiceEntry};

impl KernelView for Inspector {
    fn config(&self) -> io::Result<Option<HmConfig>> {
        Inspector::config(self)
    }
    fn service(&self, key: SvcKey) -> io::Result<Option<ServiceEntry>> {
        Inspector::service(self, key)
    }
    fn affinity(&self, client: IpAddr, svc_id: u32) -> io::Result<Option<(SocketAddr, u64)>> {
        Inspector::affinity(self, client, svc_id)
    }
    fn host_address(&self, ip: IpAddr) -> io::Result<bool> {
        Inspector::host_address(self, ip)
    }
    fn mesh(&self, vip: IpAddr, port: u16, proto: u8) -> io::Result<Option<(u16, u16)>> {
        Inspector::mesh(self, vip, port, proto)
    }
    fn peer(&self, addr: IpAddr) -> io::Result<Option<(IpAddr, bool)>> {
        Inspector::peer(self, addr)
    }
    fn gateway_config(&self) -> io::Result<Option<crate::abi::GwConfig>> {
        Inspector::gateway_config(self)
    }
    fn counters(&self, svc_id: u32, backend: SocketAddr) -> io::Result<BackendStats> {
        Inspector::counters(self, svc_id, backend)
    }
    fn attached(&self) -> io::Result<Vec<AttachedProgram>> {
        Inspector::attached(self)
    }
}

pub(crate) struct ExplainArgs {
    pub target: String,
    pub from: Option<String>,
    pub json: bool,
    pub config: crate::config::ConfigDirs,
    pub state_dir: PathBuf,
    pub bpffs: PathBuf,
}

pub(crate) fn run(a: ExplainArgs) -> ExitCode {
    let parsed =
        target::parse_target(&a.target).and_then(|t| Ok((t, a.from.as_deref().map(target::parse_from).transpose()?)));
    let (t, from) = match parsed {
        Ok(v) => v,
        Err(e) => {
            eprintln!("hostmesh explain: {e}");
            return ExitCode::from(2);
        }
    };
    let mut notes = Vec::new();
    let config = match crate::config::ConfigStore::new().load(&a.config) {
        Ok(l) => l.config,
        Err(e) => {
            notes.push(format!("(cannot read the config dir, so objects have no names: {e})"));
            Default::default()
        }
    };
    let status = crate::state::Status::read(&a.state_dir).ok();
    let route = match crate::backends::netlink::Rtnetlink::open() {
        Ok(mut nl) => nl.route_to(t.addr).unwrap_or_else(|e| {
            notes.push(format!("(cannot look up the route: {e})"));
            None
        }),
        Err(e) => {
            notes.push(format!("(cannot open rtnetlink: {e})"));
            None
        }
    };
    let kernel = Inspector::new(&a.bpffs);
    let src = Sources { kernel: &kernel, config: &config, status: status.as_ref(), route };
    match gather::explain(t, from, &src) {
        Ok(mut e) => {
            e.sentences.extend(notes);
            if a.json {
                println!("{}", serde_json::to_string_pretty(&e).unwrap_or_default());
            } else {
                print!("{}", e.render());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("hostmesh explain: cannot read the kernel's state under {}: {e}", a.bpffs.display());
            ExitCode::FAILURE
        }
    }
}
