//! Property tests of the loader (proptest, stable Rust): whatever bytes a
//! file holds — the shipped examples mutated byte by byte, or random TOML
//! trees built from the real keys — parsing never panics and yields either
//! a configuration or errors whose file:line:col points into the file.
//! `HM_FUZZ_CASES` sets the cases per property (default 1,000 in the
//! suite); `bench/fuzz` runs 1,000,000.

use std::path::Path;

use proptest::prelude::*;

use super::store::parse_bytes;

const EXAMPLES: &[&str] = &[
    include_str!("../../../etc/examples/10-web.toml"),
    include_str!("../../../etc/examples/20-dns.toml"),
    include_str!("../../../etc/examples/30-web6.toml"),
    include_str!("../../../etc/hostmesh.toml"),
];

/// Keys the schema knows, and a few it does not.
const KEYS: &[&str] = &[
    "daemon",
    "service",
    "mesh",
    "gateway",
    "peer",
    "member",
    "name",
    "vip",
    "port",
    "protocol",
    "backends",
    "address",
    "weight",
    "redirect_port",
    "role",
    "local_ip",
    "gateway_ip",
    "gateway_ips",
    "endpoints",
    "probe_rise",
    "preempt",
    "vni",
    "udp_port",
    "endpoint",
    "cidrs",
    "connect_time_lb",
    "host_interfaces",
    "cgroup",
    "resync_interval",
    "maglev_table_size",
    "conntrack_size",
    "service_map_size",
    "backend_map_size",
    "maglev_map_size",
    "reverse_sock_map_size",
    "affinity_map_size",
    "mesh_map_size",
    "tc_attach",
    "metrics_listen",
    "metrics_backend_limit",
    "probe_interval",
    "nonsense",
    "k.k",
];

fn cases() -> u32 {
    std::env::var("HM_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000)
}

#[derive(Debug, Clone)]
enum Edit {
    Insert(usize, u8),
    Delete(usize),
    Replace(usize, u8),
}

fn edit() -> impl Strategy<Value = Edit> {
    // Bytes that matter to TOML more often than not.
    let byte = prop_oneof![prop::sample::select(b"[]{}=\"'\n.,#0123456789-+:\\ ".to_vec()), any::<u8>(),];
    prop_oneof![
        (any::<usize>(), byte.clone()).prop_map(|(i, b)| Edit::Insert(i, b)),
        any::<usize>().prop_map(Edit::Delete),
        (any::<usize>(), byte).prop_map(|(i, b)| Edit::Replace(i, b)),
    ]
}

fn apply(text: &str, edits: &[Edit]) -> Vec<u8> {
    let mut b = text.as_bytes().to_vec();
    for e in edits {
        let n = b.len();
        match *e {
            Edit::Insert(i, c) => b.insert(i % (n + 1), c),
            Edit::Delete(i) if n > 0 => {
                b.remove(i % n);
            }
            Edit::Replace(i, c) if n > 0 => b[i % n] = c,
            _ => {}
        }
    }
    b
}

fn toml_value() -> impl Strategy<Value = toml::Value> {
    let leaf = prop_oneof![
        any::<i64>().prop_map(toml::Value::Integer),
        (0i64..70000).prop_map(toml::Value::Integer),
        any::<bool>().prop_map(toml::Value::Boolean),
        "[a-z0-9.:/\\[\\] -]{0,24}".prop_map(toml::Value::String),
        prop::sample::select(vec!["10.96.0.10", "192.168.1.1:80", "::1", "[fd00::1]:53", "tcp", "udp", "1s", "all"])
            .prop_map(|s| toml::Value::String(s.to_string())),
    ];
    leaf.prop_recursive(4, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(toml::Value::Array),
            prop::collection::btree_map(prop::sample::select(KEYS.to_vec()).prop_map(str::to_string), inner, 0..6)
                .prop_map(|m| toml::Value::Table(m.into_iter().collect())),
        ]
    })
}

/// The property: no panic, and every error points into the file.
fn check(bytes: Vec<u8>) -> Result<(), TestCaseError> {
    let path = Path::new("/etc/hostmesh/f.toml");
    let lines = bytes.iter().filter(|b| **b == b'\n').count() + 1;
    if let Err(errors) = parse_bytes(path, bytes) {
        prop_assert!(!errors.is_empty());
        for e in errors {
            prop_assert_eq!(e.file.as_path(), path);
            prop_assert!(e.line >= 1 && e.line <= lines && e.column >= 1, "{}:{} of {} lines", e.line, e.column, lines);
            prop_assert!(!e.message.is_empty());
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn mutated_examples_parse_or_fail_with_positions(which in 0..EXAMPLES.len(), edits in prop::collection::vec(edit(), 1..8)) {
        check(apply(EXAMPLES[which], &edits))?;
    }

    #[test]
    fn random_toml_trees_parse_or_fail_with_positions(
        tree in prop::collection::btree_map(prop::sample::select(KEYS.to_vec()).prop_map(str::to_string), toml_value(), 0..6)
    ) {
        let table: toml::Table = tree.into_iter().collect();
        let text = toml::to_string(&table).unwrap_or_default();
        check(text.into_bytes())?;
    }
}
