//! `hostmesh import`: another load balancer's configuration as drop-ins
//! the daemon applies, with what cannot be mapped listed by line.

use std::fs;

use crate::fixtures::*;

/// `ipvsadm-save -n` of a director: a weighted NAT service with
/// persistence and one direct-routing real server, a UDP service, an
/// fwmark service.
const SAVED: &str = "\
-A -t 10.96.0.10:80 -s wrr -p 600
-a -t 10.96.0.10:80 -r 192.168.10.11:8080 -m -w 1
-a -t 10.96.0.10:80 -r 192.168.10.12:8080 -m -w 2
-a -t 10.96.0.10:80 -r 192.168.10.13:8080 -g -w 1
-A -u 10.96.0.10:53 -s rr
-a -u 10.96.0.10:53 -r 192.168.10.11:5353 -m -w 1
-A -f 7 -s rr
-a -f 7 -r 192.168.10.11:0 -g -w 1
";

#[test]
fn ipvsadm_rules_import_as_drop_ins_the_daemon_applies_and_what_cannot_map_is_listed_by_line() {
    let host = Host::new();
    let work = tempfile::tempdir().unwrap();
    let saved = work.path().join("rules.v4");
    fs::write(&saved, SAVED).unwrap();
    let (saved_s, strict_dir, out_dir) =
        (saved.to_str().unwrap(), work.path().join("strict"), work.path().join("imported"));

    // --strict: something is not mapped, so nothing is written.
    let strict = host.hostmesh(&["import", "ipvsadm", saved_s, "--to", strict_dir.to_str().unwrap(), "--strict"]);
    assert_eq!(strict.status.code(), Some(1));
    assert!(!strict_dir.exists(), "nothing written with --strict");

    let out = host.hostmesh(&["import", "ipvsadm", saved_s, "--to", out_dir.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "some things not mapped: {err}");
    assert!(err.contains(&format!("{saved_s}:4: not imported: real server 192.168.10.13:8080")), "{err}");
    assert!(err.contains(&format!("{saved_s}:7: not imported: fwmark service 7")), "{err}");
    let mut written: Vec<String> =
        fs::read_dir(&out_dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    written.sort();
    assert_eq!(written, ["lvs-tcp-10-96-0-10-80.toml", "lvs-udp-10-96-0-10-53.toml"]);
    // Printing them writes nothing and shows the same files.
    let dry = host.hostmesh(&["import", "ipvsadm", saved_s, "--dry-run"]);
    let printed = String::from_utf8_lossy(&dry.stdout);
    for name in &written {
        let text = fs::read_to_string(out_dir.join(name)).unwrap();
        assert!(printed.contains(&format!("# --- {name}\n{text}")), "{printed}");
    }
    // A second import into the same directory replaces nothing.
    let again = host.hostmesh(&["import", "ipvsadm", saved_s, "--to", out_dir.to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists (move it away"));

    for name in &written {
        host.write(name, &fs::read_to_string(out_dir.join(name)).unwrap());
    }
    let _d = host.start_ready();
    let s = host.status();
    assert!(s.last_sync.ok && s.files.iter().all(|f| f.errors.is_empty()), "{:?}", s.files);
    assert_eq!(s.counts.services, 2, "both imported services applied");
    assert!(host.has_route("10.96.0.10"), "{:?}", host.owned_routes());
}

#[test]
fn a_keepalived_conf_imports_with_its_checker_and_the_daemon_applies_it() {
    let host = Host::new();
    let work = tempfile::tempdir().unwrap();
    let conf = work.path().join("keepalived.conf");
    fs::write(
        &conf,
        "! a director\nglobal_defs {\n  router_id lb1\n}\n\
         virtual_server 10.96.0.10 80 {\n  delay_loop 5\n  lb_algo wrr\n  lb_kind NAT\n  protocol TCP\n\
         real_server 192.168.10.11 8080 {\n    weight 1\n    TCP_CHECK {\n      connect_timeout 2\n    }\n  }\n\
         real_server 192.168.10.12 8080 {\n    weight 2\n    TCP_CHECK {\n      connect_timeout 2\n    }\n  }\n}\n",
    )
    .unwrap();
    let out_dir = work.path().join("imported");
    let out = host.hostmesh(&["import", "keepalived", conf.to_str().unwrap(), "--to", out_dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let name = "lvs-tcp-10-96-0-10-80.toml";
    let text = fs::read_to_string(out_dir.join(name)).unwrap();
    assert!(
        text.contains("health_check = { kind = \"tcp\", interval = \"5s\", timeout = \"2s\", rise = 1, fall = 2"),
        "{text}"
    );
    host.write(name, &text);
    let _d = host.start_ready();
    let s = host.status();
    assert!(s.last_sync.ok && s.files.iter().all(|f| f.errors.is_empty()), "{:?}", s.files);
    assert_eq!(s.counts.services, 1);
}
