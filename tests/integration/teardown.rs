//! `hostmesh teardown` removes every kind of thing hostmesh owns.

use hm_testkit::wait_soon;
use hostmesh::backends::bpf::sys;
use std::path::{Path, PathBuf};

use crate::fixtures::*;

#[test]
fn teardown_leaves_no_link_route_pin_or_program() {
    let host = Host::new();
    host.write("web.toml", WEB);
    host.write("web6.toml", "[[service]]\nname = \"web6\"\nvip = \"fd00::10\"\nport = 80\n");
    // A mesh entry (a route in table local) and a gateway member (hm-tun0).
    host.write("mesh.toml", "[[mesh]]\nname = \"m\"\nvip = \"10.96.0.60\"\nport = 80\nredirect_port = 15001\n");
    host.write(
        "gateway.toml",
        "[gateway]\nrole = \"member\"\nlocal_ip = \"192.0.2.20\"\ngateway_ip = \"192.0.2.1\"\nvni = 7\n\
         [[peer]]\nname = \"b\"\ncidrs = [\"10.20.0.0/16\"]\n",
    );
    host.ns.set_sysctl("net/ipv4/conf/all/rp_filter", "2");
    let mut d = host.start_ready();
    let attached = host.attached_programs();
    let prog_id = attached.iter().find(|(hook, _)| hook == "hm_natout@tc-ingress@hm-natout").unwrap().1;
    assert!(sys::prog_info_by_id(prog_id).unwrap().is_some());

    // Refused while the daemon runs.
    let out = host.teardown();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("hostmesh is running"));

    d.stop(hm_testkit::SOON);
    // On a host without a cgroup2 mount the daemon mounts one under its
    // state dir (backends/host.rs); this test host has one, so the test
    // makes that mount as the daemon would have, for teardown to find.
    let cgroup2 = CgroupMount::new(&host.opts.state_dir.join("cgroup2"));
    let out = host.teardown();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let said = String::from_utf8_lossy(&out.stdout);
    for line in [
        "detached hm_natout on tc ingress of hm-natout",
        "detached hm_connect4 on cgroup ",
        "unpinned map HM_SERVICES",
        "deleted route 10.96.0.10/32",
        "deleted route fd00::10/128",
        "deleted route 10.96.0.60/32 table 255",
        "deleted route 10.20.0.0/16",
        "deleted link hm-natin",
        "deleted link hm-tun0",
        "restored sysctl net.ipv4.conf.all.rp_filter = 2",
        "unmounted cgroup2",
        "status.json",
    ] {
        assert!(said.contains(line), "missing {line:?} in:\n{said}");
    }

    // Links, and filters and the qdiscs hostmesh added for them.
    assert!(host.ns.links().iter().all(|l| !l.starts_with("hm-")), "{:?}", host.ns.links());
    assert_eq!(hostmesh_filters(&host.ns), [], "no hostmesh filter left");
    assert_eq!(clsact_devices(&host.ns), Vec::<String>::new(), "hostmesh's clsact qdiscs go with its filters");
    // Routes.
    assert!(host.owned_routes().is_empty(), "{:?}", host.owned_routes());
    // Pins (and the bpffs hostmesh mounted for them).
    assert!(!host.opts.bpffs.exists(), "pin dir still there");
    // Programs: freed once nothing references them.
    wait_soon("the program to be freed", || sys::prog_info_by_id(prog_id).unwrap().is_none()).unwrap();
    // Sysctls put back.
    assert_eq!(host.ns.sysctl("net/ipv4/conf/all/rp_filter").as_deref(), Some("2"));
    // The cgroup2 mount and the state files it made.
    assert!(!cgroup2.mounted(), "cgroup2 still mounted on {}", cgroup2.dir.display());
    assert!(!cgroup2.dir.exists());
    let left: Vec<String> = std::fs::read_dir(&host.opts.state_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != hostmesh::state::LOCK_FILE)
        .collect();
    assert_eq!(left, Vec::<String>::new(), "state files left");

    // Idempotent.
    let again = host.teardown();
    assert!(again.status.success());
    assert!(String::from_utf8_lossy(&again.stdout).starts_with("nothing to remove"));
}

/// A cgroup2 mount made by the test, unmounted on drop if teardown did not.
struct CgroupMount {
    dir: PathBuf,
}

impl CgroupMount {
    fn new(dir: &Path) -> CgroupMount {
        std::fs::create_dir_all(dir).unwrap();
        nix::mount::mount(Some("cgroup2"), dir, Some("cgroup2"), nix::mount::MsFlags::empty(), None::<&str>)
            .expect("mount cgroup2");
        CgroupMount { dir: dir.to_path_buf() }
    }

    fn mounted(&self) -> bool {
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
        mounts.lines().any(|l| l.split(' ').nth(1) == Some(self.dir.to_str().unwrap()))
    }
}

impl Drop for CgroupMount {
    fn drop(&mut self) {
        if self.mounted() {
            let _ = nix::mount::umount2(&self.dir, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}
