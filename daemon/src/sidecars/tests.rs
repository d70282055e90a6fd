//! The registrar against `FakeSidecars`: what it registers, when it takes
//! a socket again, what it removes, and the sentence `hostmesh status`
//! shows for each problem.

use std::path::Path;

use super::*;
use crate::backends::fake_sidecars::FakeSidecars;
use crate::config::{parse_file, Source};

const TCP4: SockKey = SockKey { port: 15001, family: abi::AF_INET, proto: 6 };
const UDP6: SockKey = SockKey { port: 15053, family: abi::AF_INET6, proto: 17 };

fn keys(k: &[SockKey]) -> BTreeSet<SockKey> {
    k.iter().copied().collect()
}

fn nft() -> MeshPath {
    MeshPath::Nftables { reason: "test".into() }
}

#[test]
fn a_listener_is_taken_into_the_sockmap_once_and_reported_with_its_holder() {
    let mut fake = FakeSidecars::loaded();
    fake.listen(TCP4, 41, 700, "envoy");
    let mut r = Registrar::new(fake);
    assert!(r.tick(&keys(&[TCP4]), Some(&MeshPath::SkLookup)), "a new registration is news");
    let reg = &r.report()[&TCP4];
    assert_eq!(reg.problem, None);
    let l = reg.listener.as_ref().expect("registered");
    assert_eq!((l.pid, l.comm.as_str(), l.addr.to_string()), (700, "envoy", "127.0.0.1:15001".to_string()));
    assert_eq!(r.kernel().map.as_ref().unwrap()[&TCP4], 1041);
    // Nothing changed: the socket is not taken again, and tick says so.
    assert!(!r.tick(&keys(&[TCP4]), Some(&MeshPath::SkLookup)));
    assert_eq!(r.kernel().log, ["register 15001 pid 700 SockMap"]);
}

#[test]
fn a_restarted_sidecar_is_registered_again_and_its_absence_is_explained() {
    let mut fake = FakeSidecars::loaded();
    fake.listen(TCP4, 41, 700, "envoy");
    let mut r = Registrar::new(fake);
    r.tick(&keys(&[TCP4]), Some(&MeshPath::SkLookup));
    r.kernel().exit(&TCP4);
    assert!(r.tick(&keys(&[TCP4]), Some(&MeshPath::SkLookup)));
    let reg = &r.report()[&TCP4];
    assert_eq!(reg.listener, None);
    assert_eq!(reg.problem.as_deref(), Some("no sidecar listens on 127.0.0.1:15001/tcp: connections are refused"));
    r.kernel().listen(TCP4, 42, 701, "envoy");
    assert!(r.tick(&keys(&[TCP4]), Some(&MeshPath::SkLookup)));
    assert_eq!(r.report()[&TCP4].listener.as_ref().map(|l| l.pid), Some(701));
    assert_eq!(r.kernel().map.as_ref().unwrap()[&TCP4], 1042);
}

#[test]
fn a_socket_an_earlier_daemon_registered_is_adopted_without_taking_it() {
    let mut fake = FakeSidecars::loaded();
    fake.listen(TCP4, 41, 700, "envoy");
    fake.map.as_mut().unwrap().insert(TCP4, 1041);
    let mut r = Registrar::new(fake);
    r.tick(&keys(&[TCP4]), Some(&MeshPath::SkLookup));
    assert_eq!(r.report()[&TCP4].listener.as_ref().map(|l| (l.pid, l.cookie)), Some((700, 1041)));
    assert!(r.kernel().log.is_empty(), "{:?}", r.kernel().log);
}

#[test]
fn map_entries_without_a_listener_here_or_a_wanted_key_are_removed() {
    let mut fake = FakeSidecars::loaded();
    // A socket of another namespace under a wanted key, and a key no mesh
    // entry uses any more.
    fake.map.as_mut().unwrap().extend([(TCP4, 9999), (UDP6, 1050)]);
    let mut r = Registrar::new(fake);
    r.tick(&keys(&[TCP4]), Some(&MeshPath::SkLookup));
    assert_eq!(r.kernel().map.as_ref().unwrap().len(), 0);
    assert_eq!(r.kernel().log, ["unregister 15001", "unregister 15053"]);
    assert!(!r.report().contains_key(&UDP6));
}

#[test]
fn a_socket_that_cannot_be_taken_says_what_the_daemon_lacks() {
    let mut fake = FakeSidecars::loaded();
    fake.listen(UDP6, 50, 800, "coredns");
    fake.untakeable.insert(800);
    let mut r = Registrar::new(fake);
    r.tick(&keys(&[UDP6]), Some(&MeshPath::SkLookup));
    let reg = &r.report()[&UDP6];
    assert_eq!(reg.listener, None);
    let problem = reg.problem.as_deref().unwrap();
    assert!(problem.starts_with("cannot take the listener of pid 800 (coredns): "), "{problem}");
    assert!(problem.ends_with("(hostmesh needs CAP_SYS_PTRACE)"), "{problem}");
    assert!(r.kernel().map.as_ref().unwrap().is_empty());
}

#[test]
fn a_listener_nobody_holds_and_a_failed_socket_listing_are_problems_not_registrations() {
    let mut fake = FakeSidecars::loaded();
    fake.listen(TCP4, 41, 700, "envoy");
    fake.holders.clear();
    let mut r = Registrar::new(fake);
    r.tick(&keys(&[TCP4]), Some(&MeshPath::SkLookup));
    assert_eq!(
        r.report()[&TCP4].problem.as_deref(),
        Some("a listener on 127.0.0.1:15001/tcp exists but no process here holds it")
    );
    r.kernel().diag_error = Some(std::io::ErrorKind::PermissionDenied);
    r.tick(&keys(&[TCP4]), Some(&MeshPath::SkLookup));
    assert!(r.report()[&TCP4].problem.as_deref().unwrap().starts_with("cannot list sockets: "));
}

#[test]
fn nothing_is_done_before_the_sockmap_is_loaded() {
    let mut fake = FakeSidecars::default();
    fake.listen(TCP4, 41, 700, "envoy");
    let mut r = Registrar::new(fake);
    assert!(!r.tick(&keys(&[TCP4]), Some(&MeshPath::SkLookup)));
    assert!(r.report().is_empty() && r.kernel().log.is_empty());
}

#[test]
fn the_nftables_fallback_marks_the_listener_transparent_and_leaves_the_map_alone() {
    let mut fake = FakeSidecars::loaded();
    fake.listen(TCP4, 41, 700, "envoy");
    let mut r = Registrar::new(fake);
    assert!(r.tick(&keys(&[TCP4]), Some(&nft())));
    assert!(!r.tick(&keys(&[TCP4]), Some(&nft())));
    assert_eq!(r.kernel().transparent, BTreeSet::from([1041]));
    assert!(r.kernel().map.as_ref().unwrap().is_empty());
    assert_eq!(r.kernel().log, ["register 15001 pid 700 Transparent"]);
    // No mesh path (no mesh entries applied): nothing is reported.
    assert!(r.tick(&keys(&[TCP4]), None));
    assert!(r.report().is_empty());
}

#[test]
fn one_listener_key_per_family_protocol_and_port() {
    let f = parse_file(&Source::new(
        Path::new("t.toml"),
        "[[mesh]]\nname = \"a\"\nvip = \"10.0.0.1\"\nport = 80\nredirect_port = 15001\n\
         [[mesh]]\nname = \"b\"\nvip = \"10.0.0.2\"\nport = 0\nredirect_port = 15001\n\
         [[mesh]]\nname = \"c\"\nvip = \"fd00::1\"\nport = 53\nprotocol = \"udp\"\nredirect_port = 15001\n",
    ))
    .unwrap();
    let config = Config { meshes: f.meshes, ..Config::default() };
    let keys: Vec<SockKey> = wanted(&config).into_iter().collect();
    assert_eq!(
        keys,
        [
            SockKey { port: 15001, family: abi::AF_INET, proto: 6 },
            SockKey { port: 15001, family: abi::AF_INET6, proto: 17 },
        ]
    );
    assert_eq!(expected_addr(&keys[1]).to_string(), "[::1]:15001");
}
