//! `hostmesh check`: validate the config dir as the daemon would read it,
//! then (unless `--offline`) what the configuration names on this host.

use std::path::Path;
use std::process::ExitCode;

use crate::config::{check_dir, Config, ConfigDirs, CtlbMode};

pub(super) fn run(dirs: &ConfigDirs, offline: bool) -> ExitCode {
    let loaded = match check_dir(dirs) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("hostmesh check: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut rejected = 0;
    for f in loaded.rejected() {
        rejected += 1;
        for e in &f.errors {
            eprintln!("{e}");
        }
    }
    for s in &loaded.skipped {
        eprintln!("{}: skipped: {}", s.path.display(), s.reason);
    }
    for m in &loaded.masked {
        println!("{}", masked_line(m));
    }
    let c = &loaded.config;
    let host = if offline { Vec::new() } else { host_problems(c, &LiveHost) };
    for p in &host {
        eprintln!("{p}");
    }
    println!(
        "{}: {} file(s), {} rejected; valid: {} service(s), {} mesh redirect(s), {} peer(s), {} member(s){}{}{}",
        dirs.admin().display(),
        loaded.files.len(),
        rejected,
        c.services.len(),
        c.meshes.len(),
        c.peers.len(),
        c.members.len(),
        if c.daemon.origin.is_some() { ", [daemon]" } else { "" },
        if c.gateway.is_some() { ", [gateway]" } else { "" },
        match (offline, host.len()) {
            (true, _) => "; this host not checked (--offline)".to_string(),
            (false, 0) => "; what it names on this host exists".to_string(),
            (false, n) => format!("; {n} thing(s) it names missing on this host"),
        },
    );
    if rejected == 0 && host.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// One masked drop-in and the entry that won its name.
pub(super) fn masked_line(m: &crate::config::Masked) -> String {
    let how = if m.by_null { " -> /dev/null" } else { "" };
    format!("{}: masked by {}{how}", m.path.display(), m.by.display())
}

/// What `check` asks of the host it runs on (a fake in the tests).
trait HostView {
    /// Why the connect-time programs could not attach to the cgroup
    /// `path`; `None` when they could.
    fn cgroup_problem(&self, path: &Path) -> Option<String>;
    fn has_interface(&self, name: &str) -> bool;
}

struct LiveHost;

impl HostView for LiveHost {
    fn cgroup_problem(&self, path: &Path) -> Option<String> {
        crate::backends::bpf::cgroup_dir_problem(path)
    }

    fn has_interface(&self, name: &str) -> bool {
        nix::net::if_::if_nametoindex(name).is_ok()
    }
}

/// What the configuration names on this host and the host lacks, one
/// sentence each: where it is set, what is missing, what that turns off,
/// the fix. The daemon applies such a configuration with those parts off
/// (and says so in `hostmesh status`); `check` says it before.
fn host_problems(config: &Config, host: &dyn HostView) -> Vec<String> {
    let d = &config.daemon;
    let at = d.origin.as_ref().map(|o| format!("{o}: ")).unwrap_or_default();
    let mut out = Vec::new();
    if let (Some(cgroup), true) = (&d.cgroup, d.connect_time_lb != CtlbMode::Off) {
        if let Some(problem) = host.cgroup_problem(cgroup) {
            out.push(format!(
                "{at}[daemon] cgroup = \"{}\" {problem} on this host, so connect-time load balancing would be off; \
                 fix: create it (mkdir under the cgroup2 mount, /sys/fs/cgroup), point cgroup at an existing cgroup \
                 v2 directory, or leave it out for the cgroup2 root (`hostmesh check --offline` checks the files \
                 alone)",
                cgroup.display()
            ));
        }
    }
    for dev in d.host_interfaces.iter().flatten().filter(|dev| !host.has_interface(dev)) {
        out.push(format!(
            "{at}[daemon] host_interfaces names {dev}, which this host does not have, so the replies of the veth \
             path and flows from the network would not be handled there; fix: create {dev} or remove it from \
             host_interfaces (`hostmesh check --offline` checks the files alone)"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    struct FakeHost {
        cgroups: Vec<PathBuf>,
        interfaces: Vec<&'static str>,
    }

    impl HostView for FakeHost {
        fn cgroup_problem(&self, path: &Path) -> Option<String> {
            (!self.cgroups.iter().any(|c| c == path)).then(|| "does not exist".to_string())
        }

        fn has_interface(&self, name: &str) -> bool {
            self.interfaces.contains(&name)
        }
    }

    fn host() -> FakeHost {
        FakeHost { cgroups: vec!["/sys/fs/cgroup/hostmesh".into()], interfaces: vec!["eth0"] }
    }

    fn problems(daemon: &str) -> Vec<String> {
        let config = crate::config::from_text(&format!("[daemon]\n{daemon}"));
        let at = config.daemon.origin.as_ref().expect("[daemon] has an origin").to_string();
        let out = host_problems(&config, &host());
        assert!(out.iter().all(|p| p.starts_with(&format!("{at}: [daemon] "))), "each says where: {out:?}");
        out
    }

    #[test]
    fn a_cgroup_that_is_not_on_this_host_is_named_where_it_is_set_with_the_fix() {
        let p = problems("connect_time_lb = \"all\"\ncgroup = \"/nonexistent/x\"\n");
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("[daemon] cgroup = \"/nonexistent/x\" does not exist on this host"), "{}", p[0]);
        assert!(p[0].contains("connect-time load balancing would be off; fix: create it"), "{}", p[0]);
        assert!(problems("connect_time_lb = \"all\"\ncgroup = \"/sys/fs/cgroup/hostmesh\"\n").is_empty());
    }

    #[test]
    fn a_cgroup_connect_time_lb_does_not_use_and_the_default_root_are_not_checked() {
        assert!(problems("connect_time_lb = \"off\"\ncgroup = \"/nonexistent/x\"\n").is_empty());
        assert!(problems("connect_time_lb = \"all\"\n").is_empty());
    }

    #[test]
    fn each_missing_host_interface_is_named() {
        let p = problems("host_interfaces = [\"eth0\", \"bond7\", \"vlan9\"]\n");
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].contains("[daemon] host_interfaces names bond7, which this host does not have"), "{}", p[0]);
        assert!(p[1].contains("names vlan9") && p[1].contains("fix: create vlan9 or remove it"), "{}", p[1]);
        assert!(problems("host_interfaces = [\"eth0\"]\n").is_empty());
    }
}
