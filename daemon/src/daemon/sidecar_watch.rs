//! Mesh sidecars, the daemon's part: a few times a second while meshes
//! exist, the registrar (`sidecars/`) registers the listener each redirect
//! port wants; this logs each registration that changed.

use std::collections::BTreeMap;

use slog::{info, warn, Logger};

use crate::abi::SockKey;
use crate::backends::SidecarBackend;
use crate::config::Config;
use crate::model::Desired;
use crate::sidecars::{self, Registrar, Registration};

pub(super) struct SidecarWatch {
    registrar: Registrar<Box<dyn SidecarBackend + Send>>,
}

impl SidecarWatch {
    pub(super) fn new(kernel: Box<dyn SidecarBackend + Send>) -> Self {
        SidecarWatch { registrar: Registrar::new(kernel) }
    }

    pub(super) fn report(&self) -> &BTreeMap<SockKey, Registration> {
        self.registrar.report()
    }

    /// Registers the listeners `config` wants on the desired mesh path;
    /// returns true when a registration changed (and logs it).
    pub(super) fn tick(&mut self, config: &Config, want: Option<&Desired>, log: &Logger) -> bool {
        let wanted = sidecars::wanted(config);
        let path = want.and_then(|d| d.mesh_path.clone());
        let before = self.registrar.report().clone();
        if !self.registrar.tick(&wanted, path.as_ref()) {
            return false;
        }
        for (key, reg) in self.registrar.report() {
            if before.get(key) == Some(reg) {
                continue;
            }
            match (&reg.listener, &reg.problem) {
                (Some(l), _) => info!(log, "sidecar listener registered"; "listener" => l.addr.to_string(),
                    "protocol" => crate::config::Protocol::name_of(key.proto), "pid" => l.pid, "process" => l.comm.clone()),
                (None, Some(p)) => {
                    warn!(log, "sidecar listener missing"; "redirect_port" => key.port, "reason" => p.clone())
                }
                (None, None) => {}
            }
        }
        true
    }
}
