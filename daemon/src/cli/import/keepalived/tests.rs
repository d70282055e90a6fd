use std::path::Path;
use std::time::Duration;

use super::super::ipvsadm;
use super::*;
use crate::config::{parse_file, Source};

const SAMPLES: &str = "/usr/share/doc/keepalived/samples";

fn conf(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// Loads each drop-in as the daemon's loader does, checks it says what
/// the import read (name, VIP, port, backends with weights, a health check
/// or none), and counts them.
fn loaded(import: &Import) -> usize {
    for s in &import.services {
        let text = s.render("keepalived");
        let f = parse_file(&Source::new(Path::new("x.toml"), &text)).unwrap_or_else(|e| panic!("{text}\n{e:?}"));
        let v = &f.services[0];
        let backends: Vec<(SocketAddr, u32)> = v.backends.iter().map(|b| (b.addr, b.weight)).collect();
        assert_eq!((&v.name, v.vip, v.port, &backends), (&s.name, s.vip, s.port, &s.backends), "{text}");
        assert_eq!(v.health_check.is_some(), s.health.is_some(), "{text}");
    }
    import.services.len()
}

/// Debian's keepalived samples (scripts/deps installs keepalived): per
/// sample with a virtual_server, the services imported and the things
/// listed as not mapped; every drop-in valid.
#[test]
fn every_virtual_server_of_debian_s_samples_imports_or_is_listed_by_line() {
    let expect: [(&str, usize, usize); 16] = [
        ("HTTP_GET.port", 1, 1),
        ("IPv6", 1, 1),
        ("PING_CHECK", 1, 1),
        ("SMTP_CHECK", 1, 3),
        ("SSL_GET", 2, 4),
        ("UDP_CHECK", 1, 1),
        ("fwmark", 0, 1),
        ("inhibit", 1, 1),
        ("misc_check", 1, 0),
        ("misc_check_arg", 1, 0),
        ("quorum", 1, 4),
        ("sample", 1, 3),
        ("status_code", 1, 1),
        ("virtual_server_group", 11, 4),
        ("virtualhost", 1, 1),
        ("vrrp.lvs_syncd", 1, 4),
    ];
    for (sample, services, unmapped) in expect {
        let path = Path::new(SAMPLES).join(format!("keepalived.conf.{sample}"));
        let import = import(&path).unwrap_or_else(|e| panic!("{sample}: {e}"));
        let listed: Vec<String> = import.unmapped.iter().map(ToString::to_string).collect();
        assert_eq!((import.services.len(), listed.len()), (services, unmapped), "{sample}: {listed:#?}");
        assert!(listed.iter().all(|l| l.starts_with(&format!("{}:", path.display()))), "{listed:#?}");
        assert_eq!(loaded(&import), services, "{sample}: every drop-in loads");
    }
    let vsg = import(&Path::new(SAMPLES).join("keepalived.conf.virtual_server_group")).unwrap();
    let names: Vec<&str> = vsg.services.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names[..4],
        ["lvs-tcp-10-0-0-1-8080", "lvs-tcp-10-0-0-2-80", "lvs-tcp-192-168-200-1-1358", "lvs-tcp-192-168-200-3-80"]
    );
    assert_eq!(names[11 - 1], "lvs-tcp-192-168-200-10-80", "the range 3-10, whole");
}

#[test]
fn checker_timers_inherit_from_real_and_virtual_server_and_keep_keepalived_s_detection_time() {
    let dir = tempfile::tempdir().unwrap();
    let path = conf(
        dir.path(),
        "k.conf",
        "virtual_server 10.1.0.1 80 {\n  delay_loop 10\n  connect_timeout 4\n  lb_algo wrr\n  persistence_timeout 90000\n\
         real_server 10.2.0.1 8080 {\n    weight 2\n    retry 3\n    HTTP_GET {\n      url {\n        path /health\n\
         status_code 204\n      }\n      delay_before_retry 2\n    }\n  }\n\
         real_server 10.2.0.2 8080 {\n    weight 0\n    retry 3\n    HTTP_GET {\n      url {\n        path /health\n\
         status_code 204\n      }\n      delay_before_retry 2\n    }\n  }\n}\n",
    );
    let import = import(&path).unwrap();
    assert!(import.unmapped.is_empty(), "{:?}", import.unmapped);
    let s = &import.services[0];
    assert_eq!(s.backends, [("10.2.0.1:8080".parse().unwrap(), 2), ("10.2.0.2:8080".parse().unwrap(), 0)]);
    assert_eq!(s.affinity, Some(Duration::from_secs(24 * 3600)), "persistence past 24h kept for 24h");
    let h = s.health.as_ref().unwrap();
    assert_eq!(
        (h.kind, h.interval, h.timeout, h.fall, h.rise),
        ("http", Duration::from_secs(2), Duration::from_secs(2), 4, 1)
    );
    assert_eq!(h.keys, [("path", "\"/health\"".to_string()), ("expect", "\"204\"".to_string())]);
    assert!(h.initial_up, "keepalived's real servers start up unless alpha");
    assert!(s.notes.iter().any(|n| n.contains("timeout 4s cut to the interval")), "{:?}", s.notes);
}

#[test]
fn includes_groups_dr_services_and_differing_checkers_are_followed_or_listed() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("conf.d")).unwrap();
    conf(
        &dir.path().join("conf.d"),
        "a.conf",
        "virtual_server 10.1.0.2 53 {\n  protocol UDP\n  real_server 10.2.0.1 5353 {\n  }\n}\n",
    );
    conf(&dir.path().join("conf.d"), ".hidden.conf", "virtual_server 10.9.9.9 1 {\n}\n");
    conf(
        &dir.path().join("conf.d"),
        "b.conf",
        "virtual_server 10.1.0.3 80 {\n  lb_kind DR\n  real_server 10.2.0.1 80 {\n  }\n}\n\
         virtual_server_group G {\n  10.1.1.1-2 443\n  fwmark 9\n}\n\
         virtual_server group G {\n  real_server 10.2.0.1 443 {\n    TCP_CHECK {\n      connect_port 8443\n    }\n  }\n\
         real_server 10.2.0.2 443 {\n    TCP_CHECK {\n      connect_port 9443\n    }\n  }\n}\n",
    );
    let path = conf(dir.path(), "keepalived.conf", "global_defs {\n  router_id x\n}\ninclude conf.d/*.conf\n");
    let import = import(&path).unwrap();
    let names: Vec<&str> = import.services.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["lvs-udp-10-1-0-2-53", "lvs-tcp-10-1-1-1-443", "lvs-tcp-10-1-1-2-443"]);
    let listed: Vec<String> = import
        .unmapped
        .iter()
        .map(|u| format!("{}:{} {}", u.at.file.rsplit('/').next().unwrap(), u.at.line, u.what))
        .collect();
    assert_eq!(
        listed,
        [
            "b.conf:1 virtual_server 10.1.0.3 80 (lb_kind DR)",
            "b.conf:8 virtual_server_group member fwmark 9",
            "b.conf:16 real_server 10.2.0.2 443's checker",
        ]
    );
    assert_eq!(import.services[1].health.as_ref().unwrap().keys, [("port", "8443".to_string())]);
    let e = super::import(&conf(dir.path(), "bad.conf", "virtual_server 10.1.0.1 80 {\n  real_server 10.2.0.1 80 {\n"))
        .unwrap_err();
    assert!(e.to_string().contains("bad.conf:") && e.why.contains("not closed"), "{e}");
}

/// The same services from `ipvsadm-save -n` and from keepalived.conf
/// import to the same drop-ins, but for the line each names as its
/// source.
#[test]
fn ipvsadm_save_text_of_the_same_services_imports_to_the_same_drop_ins() {
    let dir = tempfile::tempdir().unwrap();
    let path = conf(
        dir.path(),
        "k.conf",
        "virtual_server 10.96.0.10 80 {\n  lb_algo wrr\n  persistence_timeout 600\n\
         real_server 192.168.10.11 8080 {\n    weight 1\n  }\n  real_server 192.168.10.12 8080 {\n    weight 2\n  }\n}\n\
         virtual_server 10.96.0.10 53 {\n  protocol UDP\n  lb_algo rr\n  real_server 192.168.10.11 5353 {\n    weight 0\n  }\n}\n",
    );
    let saved = "-A -t 10.96.0.10:80 -s wrr -p 600\n-a -t 10.96.0.10:80 -r 192.168.10.11:8080 -m -w 1\n\
                 -a -t 10.96.0.10:80 -r 192.168.10.12:8080 -m -w 2\n-A -u 10.96.0.10:53 -s rr\n\
                 -a -u 10.96.0.10:53 -r 192.168.10.11:5353 -m -w 0\n";
    let body = |s: &Imported, tool| s.render(tool).lines().skip(1).collect::<Vec<_>>().join("\n");
    let (k, i) = (import(&path).unwrap(), ipvsadm::parse("saved", saved).unwrap());
    assert_eq!(k.services.len(), 2);
    for (a, b) in k.services.iter().zip(&i.services) {
        assert_eq!(body(a, "keepalived"), body(b, "ipvsadm"));
    }
}
