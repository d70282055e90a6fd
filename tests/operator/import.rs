//! `hostmesh import`: another load balancer's configuration as drop-ins
//! the daemon applies, with what cannot be mapped listed by line.

use std::fs;
use std::time::{Duration, Instant};

use hostmesh::state::BackendState;

use crate::fixtures::*;
use crate::health_net::{assert_only, HealthNet};

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

/// keepalived's worst time to take out a real server whose port closed:
/// the failure just after a check (delay_loop), then its check and
/// `retry` retries, each up to connect_timeout, delay_before_retry apart.
fn keepalived_detection(delay_loop: f64, connect_timeout: f64, retry: u32, delay_before_retry: f64) -> Duration {
    Duration::from_secs_f64(delay_loop + connect_timeout + f64::from(retry) * (delay_before_retry + connect_timeout))
}

#[test]
fn an_imported_keepalived_director_balances_by_its_weights_and_takes_a_dead_real_server_out_in_its_timers() {
    let checker = "TCP_CHECK {\n      connect_timeout 1\n      retry 1\n      delay_before_retry 0.2\n    }";
    let conf = format!(
        "virtual_server 10.96.0.10 80 {{\n  delay_loop 1\n  lb_algo wrr\n  lb_kind NAT\n  protocol TCP\n\
         real_server 192.168.10.11 8080 {{\n    weight 1\n    {checker}\n  }}\n\
         real_server 192.168.10.12 8080 {{\n    weight 3\n    {checker}\n  }}\n}}\n"
    );
    let mut net = HealthNet::new("", "");
    let work = tempfile::tempdir().unwrap();
    let path = work.path().join("keepalived.conf");
    fs::write(&path, conf).unwrap();
    let out = net.host.hostmesh(&["import", "keepalived", path.to_str().unwrap(), "--dry-run"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let dropin = String::from_utf8_lossy(&out.stdout).into_owned();
    net.host.write("services.toml", &dropin);
    let _d = net.host.start_ready();
    for i in 0..2 {
        net.wait_state("lvs-tcp-10-96-0-10-80", i, 8080, BackendState::Up);
    }

    // The weights: 1 to 3, within 10 %.
    let (answers, errors) = net.requests("tcp", 400);
    assert!(errors.is_empty(), "{errors:?}");
    let count = |name: &str| answers.iter().find(|(n, _)| n == name).map_or(0, |(_, c)| *c) as f64;
    let share = count("b2") / (count("b1") + count("b2"));
    assert!((share - 0.75).abs() <= 0.075, "b2's share {share:.3}, weights 1:3: {answers:?}");

    // b2 dies: out within keepalived's own time for these timers.
    let limit = hm_testkit::scaled(keepalived_detection(1.0, 1.0, 1, 0.2));
    let killed = Instant::now();
    net.stop_main(1);
    net.wait_state("lvs-tcp-10-96-0-10-80", 1, 8080, BackendState::Down);
    let took = killed.elapsed();
    assert!(took <= limit, "b2 taken out after {took:?}, keepalived's timers allow {limit:?}");
    assert_only(&net, "tcp", "b1", "b2 killed");
    eprintln!("b2's share {share:.3} (weights 1:3); b2 out after {took:?} (keepalived: up to {limit:?})");
}
