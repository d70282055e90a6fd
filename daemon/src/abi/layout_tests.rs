//! The C/Rust ABI checked against what clang compiled, as Cilium's
//! alignchecker and constchecker do: every mirrored struct's size and each
//! field's name, offset and size from the BTF of the embedded probes; every
//! `HM_` constant of the header from `probes/abi_constants.c`'s enum; every
//! map declaration against the table of maps (`abi::MAPS`). No root needed.

use std::collections::{BTreeMap, BTreeSet};
use std::mem::{offset_of, size_of};

use super::btf::{Btf, Struct};
use super::*;
use crate::backends::bpf::objects::bytes;

static HEADER: &str = include_str!("../../../probes/hostmesh_abi.h");

/// Every object the daemon embeds and loads (all but the constants'),
/// with the file it came from.
fn embedded() -> Vec<(&'static str, &'static [u8])> {
    OBJECTS.iter().filter(|o| o.object != ProbeObject::AbiConstants).map(|o| (o.name, bytes(o.object))).collect()
}

fn btf_of(name: &str, elf: &[u8]) -> Btf {
    Btf::of_object(elf).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// A Rust field as the test sees it: (Rust name, C name, offset, size).
type Field = (&'static str, &'static str, usize, usize);

fn size_of_field<T, F>(_: fn(&T) -> &F) -> usize {
    size_of::<F>()
}

/// `mirror!(RustType, "c_struct", { rust_field => "c_field", ... })`.
macro_rules! mirror {
    ($rust:ty, $c:literal, { $($field:ident => $cfield:literal),* $(,)? }) => {
        (
            stringify!($rust),
            $c,
            size_of::<$rust>(),
            vec![$((
                stringify!($field),
                $cfield,
                offset_of!($rust, $field),
                size_of_field(|s: &$rust| &s.$field),
            )),*] as Vec<Field>,
        )
    };
}

/// Every struct of the header with its Rust mirror, field by field.
fn mirrors() -> Vec<(&'static str, &'static str, usize, Vec<Field>)> {
    vec![
        mirror!(HmConfig, "hm_config", {
            netns_cookie => "netns_cookie", flags => "flags", tcp_timeout_s => "tcp_timeout_s",
            udp_timeout_s => "udp_timeout_s", snat_port_min => "snat_port_min", snat_port_max => "snat_port_max",
        }),
        mirror!(SvcKey, "hm_svc_key", { addr => "addr", port_be => "port", proto => "proto", scope => "scope" }),
        mirror!(SvcValue, "hm_svc_value", {
            id => "id", backend_count => "backend_count", flags => "flags", table_size => "table_size",
        }),
        mirror!(BackendStatsKey, "hm_bstats_key", {
            addr => "addr", port_be => "port", pad => "_pad", svc_id => "svc_id",
        }),
        mirror!(BackendStats, "hm_bstats", {
            ctlb_connections => "ctlb_connections", veth_connections => "veth_connections",
            bytes_to => "bytes_to", bytes_from => "bytes_from",
        }),
        mirror!(SvcAffinity, "hm_svc_affinity", { timeout_s => "timeout_s", pad => "_pad" }),
        mirror!(AffKey, "hm_aff_key", { client => "client", svc_id => "svc_id" }),
        mirror!(AffValue, "hm_aff_value", { backend_id => "backend_id", pad => "_pad", last_seen_ns => "last_seen_ns" }),
        mirror!(BackendValue, "hm_backend", { addr => "addr", port_be => "port", pad => "_pad" }),
        mirror!(MaglevKey, "hm_maglev_key", { svc_id => "svc_id", chunk => "chunk" }),
        mirror!(MaglevChunk, "hm_maglev_chunk", { backend => "backend" }),
        mirror!(CtKey, "hm_ct_key", {
            src => "src", dst => "dst", sport_be => "sport", dport_be => "dport", proto => "proto",
            dir => "dir", pad => "_pad",
        }),
        mirror!(CtValue, "hm_ct_value", {
            nat_addr => "nat_addr", nat_port_be => "nat_port", flags => "flags", pad => "_pad",
            svc_id => "svc_id", last_seen_ns => "last_seen_ns", fib_epoch => "fib_epoch",
            fib_ifindex => "fib_ifindex", fib_macs => "fib_macs", pad2 => "_pad2",
        }),
        mirror!(NatValue, "hm_nat_value", {
            dst => "dst", src => "src", dport_be => "dport", sport_be => "sport", flags => "flags", pad => "_pad",
            svc_id => "svc_id", fib_epoch => "fib_epoch", last_seen_ns => "last_seen_ns",
            fib_ifindex => "fib_ifindex", fib_macs => "fib_macs",
        }),
        mirror!(Addr, "hm_addr", { addr => "addr" }),
        mirror!(SnatValue, "hm_snat_value", { src => "src" }),
        mirror!(RevSkKey, "hm_revsk_key", { cookie => "cookie", addr => "addr", port_be => "port", pad => "_pad" }),
        mirror!(RevSkValue, "hm_revsk_value", { addr => "addr", port_be => "port", pad => "_pad" }),
        mirror!(MeshKey, "hm_mesh_key", { addr => "addr", port_be => "port", proto => "proto", pad => "_pad" }),
        mirror!(MeshValue, "hm_mesh_value", { redirect_port => "redirect_port", pad => "_pad" }),
        mirror!(SockKey, "hm_sock_key", { port => "port", family => "family", proto => "proto" }),
        mirror!(GwConfig, "hm_gw_config", {
            vni => "vni", role => "role", gateway => "gateway", local => "local",
            tcp_timeout_s => "tcp_timeout_s", udp_timeout_s => "udp_timeout_s",
        }),
        mirror!(LpmKey, "hm_lpm_key", { prefixlen => "prefixlen", addr => "addr" }),
        mirror!(Endpoint, "hm_endpoint", { addr => "addr", flags => "flags" }),
        mirror!(GwCtValue, "hm_gw_ct_value", { member => "member", last_seen_ns => "last_seen_ns" }),
        mirror!(GwProbe, "hm_gw_probe", {
            magic => "magic", kind => "kind", slot => "slot", pad => "_pad", seq => "seq", nonce => "nonce",
            target => "target",
        }),
    ]
}

/// Every named struct of every embedded object; one defined differently
/// in two objects is a failure of its own.
fn c_structs() -> BTreeMap<String, Struct> {
    let mut all: BTreeMap<String, (Struct, &str)> = BTreeMap::new();
    for (object, elf) in embedded() {
        for (name, s) in btf_of(object, elf).structs().unwrap() {
            if let Some((seen, first)) = all.get(&name) {
                assert_eq!(seen, &s, "struct {name} differs between {first} and {object}");
            } else {
                all.insert(name, (s, object));
            }
        }
    }
    all.into_iter().map(|(k, (s, _))| (k, s)).collect()
}

/// The mismatches of one mirror, in words.
fn compare(rust: &str, c: &str, size: usize, fields: &[Field], s: &Struct) -> Vec<String> {
    let mut errors = Vec::new();
    if s.size as usize != size {
        errors.push(format!("struct {c} is {} bytes, {rust} is {size}", s.size));
    }
    if s.members.len() != fields.len() {
        errors.push(format!("struct {c} has {} members, {rust} mirrors {}", s.members.len(), fields.len()));
    }
    for (rname, cname, offset, fsize) in fields {
        match s.members.iter().find(|m| m.name == *cname) {
            None => errors.push(format!("struct {c} has no member {cname} ({rust}::{rname})")),
            Some(m) if m.offset as usize != *offset || m.size as usize != *fsize => errors.push(format!(
                "{c}.{cname} is at {} ({} bytes), {rust}::{rname} at {offset} ({fsize} bytes)",
                m.offset, m.size
            )),
            Some(_) => {}
        }
    }
    // No padding the compiler could leave uninitialised: abi::Pod sends
    // every byte of a key to the kernel.
    let covered: u32 = s.members.iter().map(|m| m.size).sum();
    if covered != s.size {
        errors.push(format!("struct {c} has {} bytes of implicit padding; make them a field", s.size - covered));
    }
    errors
}

#[test]
fn every_mirrored_struct_matches_the_compiled_layout() {
    let structs = c_structs();
    let mut errors = Vec::new();
    for (rust, c, size, fields) in mirrors() {
        match structs.get(c) {
            Some(s) => errors.extend(compare(rust, c, size, &fields, s)),
            None => errors.push(format!("struct {c} ({rust}) is in no embedded object's BTF")),
        }
    }
    let mirrored: BTreeSet<&str> = mirrors().iter().map(|m| m.1).collect();
    for name in structs.keys().filter(|n| n.starts_with("hm_")) {
        if !mirrored.contains(name.as_str()) {
            errors.push(format!("struct {name} is in the probes' ABI but has no Rust mirror"));
        }
    }
    assert!(errors.is_empty(), "the C/Rust ABI differs:\n  {}", errors.join("\n  "));
}

/// Every `HM_` constant with the Rust value that mirrors it.
fn rust_constants() -> BTreeMap<&'static str, i64> {
    BTreeMap::from([
        ("HM_MAX_SERVICES", i64::from(MAX_SERVICES)),
        ("HM_MAX_BACKENDS", i64::from(MAX_BACKENDS)),
        ("HM_MAX_MAGLEV_CHUNKS", i64::from(MAX_MAGLEV_CHUNKS)),
        ("HM_MAX_CONNTRACK", i64::from(CONNTRACK_SIZE)),
        ("HM_MAX_REVERSE_SOCK", i64::from(MAX_REVERSE_SOCK)),
        ("HM_MAX_AFFINITY", i64::from(MAX_AFFINITY)),
        ("HM_MAGLEV_CHUNK", MAGLEV_CHUNK as i64),
        ("HM_CFG_CTLB_TCP", i64::from(CFG_CTLB_TCP)),
        ("HM_CFG_CTLB_UDP", i64::from(CFG_CTLB_UDP)),
        ("HM_CFG_EXTERNAL", i64::from(CFG_EXTERNAL)),
        ("HM_CT_SYN_TIMEOUT_S", CT_SYN_TIMEOUT_S as i64),
        ("HM_CT_PICKUP_TIMEOUT_S", CT_PICKUP_TIMEOUT_S as i64),
        ("HM_CT_CLOSING_TIMEOUT_S", CT_CLOSING_TIMEOUT_S as i64),
        ("HM_CT_TCP_TIMEOUT_DEFAULT_S", CT_TCP_TIMEOUT_DEFAULT_S as i64),
        ("HM_CT_UDP_TIMEOUT_DEFAULT_S", CT_UDP_TIMEOUT_DEFAULT_S as i64),
        ("HM_SVC_F_MESH", i64::from(SVC_F_MESH)),
        ("HM_SVC_F_AFFINITY", i64::from(SVC_F_AFFINITY)),
        ("HM_SVC_F_EXTERNAL", i64::from(SVC_F_EXTERNAL)),
        ("HM_SVC_F_NODE_PORT", i64::from(SVC_F_NODE_PORT)),
        ("HM_SVC_F_LOCAL", i64::from(SVC_F_LOCAL)),
        ("HM_SVC_SCOPE_HOST", i64::from(SVC_SCOPE_HOST)),
        ("HM_SVC_SCOPE_NETWORK", i64::from(SVC_SCOPE_NETWORK)),
        // An enum constant is an int in BTF: bit 31 reads negative.
        ("HM_MAGLEV_LOCAL", i64::from(MAGLEV_LOCAL as i32)),
        ("HM_NAT_IN", i64::from(NAT_IN)),
        ("HM_NAT_OUT", i64::from(NAT_OUT)),
        ("HM_NAT_F_REPLY", i64::from(NAT_F_REPLY)),
        ("HM_NAT_F_SNAT", i64::from(NAT_F_SNAT)),
        ("HM_NAT_F_HOST", i64::from(NAT_F_HOST)),
        ("HM_SNAT_TRIES", i64::from(SNAT_TRIES)),
        ("HM_MAX_HOST_ADDRS", i64::from(MAX_HOST_ADDRS)),
        ("HM_CT_FORWARD", i64::from(CT_FORWARD)),
        ("HM_CT_REVERSE", i64::from(CT_REVERSE)),
        ("HM_CT_F_REPLIED", i64::from(CT_F_REPLIED)),
        ("HM_CT_F_CLOSING", i64::from(CT_F_CLOSING)),
        ("HM_CT_F_FIN_OUT", i64::from(CT_F_FIN_OUT)),
        ("HM_CT_F_FIN_BACK", i64::from(CT_F_FIN_BACK)),
        ("HM_CT_F_RESET", i64::from(CT_F_RESET)),
        ("HM_CT_F_PICKUP", i64::from(CT_F_PICKUP)),
        ("HM_FLOW_STATE_MASK", i64::from(FLOW_STATE_MASK)),
        ("HM_AF_INET", i64::from(AF_INET)),
        ("HM_AF_INET6", i64::from(AF_INET6)),
        ("HM_MESH_MAP_SIZE", i64::from(MESH_MAP_SIZE)),
        ("HM_MAX_GW_ROUTES", i64::from(MAX_GW_ROUTES)),
        ("HM_MAX_GW_CONNTRACK", i64::from(MAX_GW_CONNTRACK)),
        ("HM_PROBE_MAGIC", i64::from(PROBE_MAGIC)),
        ("HM_PROBE_ASK", i64::from(PROBE_ASK)),
        ("HM_PROBE_ACK", i64::from(PROBE_ACK)),
        // A C enum holds it as an int.
        ("HM_PROBE_ADDR", i64::from(u32::from(PROBE_ADDR) as i32)),
        ("HM_PROBE_PORT", i64::from(PROBE_PORT)),
        ("HM_MAX_GW_PROBES", i64::from(MAX_GW_PROBES)),
        ("HM_ROLE_MEMBER", i64::from(ROLE_MEMBER)),
        ("HM_ROLE_GATEWAY", i64::from(ROLE_GATEWAY)),
        ("HM_EP_UP", i64::from(EP_UP)),
        ("HM_PEER_EP_KNOWN", i64::from(PEER_EP_KNOWN)),
        ("HM_PEER_EP_ENCRYPTED", i64::from(PEER_EP_ENCRYPTED)),
        ("HM_WG_RX_MARK", i64::from(WG_RX_MARK)),
        ("HM_NETNS_COOKIE_ADDR", i64::from(u32::from(NETNS_COOKIE_ADDR))),
        ("HM_NETNS_COOKIE_PORT", i64::from(NETNS_COOKIE_PORT)),
        ("HM_TUNNEL_KEY_SIZE", i64::from(TUNNEL_KEY_SIZE)),
        ("HM_TC_ACT_UNSPEC", i64::from(TC_ACT_UNSPEC)),
        ("HM_TC_ACT_OK", i64::from(TC_ACT_OK)),
        ("HM_TC_ACT_REDIRECT", i64::from(TC_ACT_REDIRECT)),
        ("HM_TC_ACT_SHOT", i64::from(TC_ACT_SHOT)),
        ("HM_SK_PASS", i64::from(SK_PASS)),
    ])
}

/// The names of the header's `#define HM_...` lines.
fn header_defines() -> BTreeSet<&'static str> {
    HEADER
        .lines()
        .filter_map(|l| l.trim().strip_prefix("#define "))
        .filter_map(|rest| rest.split_whitespace().next())
        .filter(|name| name.starts_with("HM_"))
        .collect()
}

#[test]
fn every_header_constant_matches_its_rust_mirror() {
    let compiled = btf_of("abi_constants.o", bytes(ProbeObject::AbiConstants)).enum_constants();
    let rust = rust_constants();
    let mut errors = Vec::new();
    for name in header_defines() {
        let Some(value) = compiled.get(&format!("ABI_{name}")) else {
            errors.push(format!("{name}: not in probes/abi_constants.c (add ABI_{name} = {name})"));
            continue;
        };
        match rust.get(name) {
            None => errors.push(format!("{name} = {value}: no Rust mirror in abi/mod.rs")),
            Some(r) if r != value => errors.push(format!("{name} is {value} in C, {r} in Rust")),
            Some(_) => {}
        }
    }
    for name in rust.keys().filter(|n| !header_defines().contains(*n)) {
        errors.push(format!("{name}: mirrored in Rust but not defined in hostmesh_abi.h"));
    }
    assert!(errors.is_empty(), "the C/Rust constants differ:\n  {}", errors.join("\n  "));
}

#[test]
fn every_map_the_probes_declare_is_in_the_loaders_table() {
    let mut errors = Vec::new();
    let mut declared = BTreeSet::new();
    for (object, elf) in embedded() {
        for m in btf_of(object, elf).maps().unwrap() {
            declared.insert(m.name.clone());
            let Some(d) = MAPS.iter().find(|d| d.name == m.name) else {
                errors.push(format!("{object}: map {} is not in abi::MAPS", m.name));
                continue;
            };
            let ours = (d.map_type, d.key_size, d.value_size, d.max_entries, d.flags);
            let theirs = (m.map_type, m.key_size, m.value_size, m.max_entries, m.flags);
            if ours != theirs {
                errors.push(format!(
                    "{object}: map {} (type, key, value, max_entries, flags) is {theirs:?}, MAPS says {ours:?}",
                    m.name
                ));
            }
        }
    }
    for d in MAPS.iter().filter(|d| !declared.contains(d.name)) {
        errors.push(format!("abi::MAPS has {}, which no probe declares", d.name));
    }
    assert!(errors.is_empty(), "the loader's map table differs from the probes:\n  {}", errors.join("\n  "));
}

#[test]
fn the_reader_sees_a_struct_it_is_given() {
    // A failing check must be able to fail: the comparison reports a moved
    // field, a resized struct and implicit padding.
    let s = Struct {
        size: 8,
        members: vec![
            super::btf::Member { name: "svc_id".into(), offset: 4, size: 4 },
            super::btf::Member { name: "chunk".into(), offset: 0, size: 2 },
        ],
    };
    let fields: Vec<Field> = vec![("svc_id", "svc_id", 0, 4), ("chunk", "chunk", 4, 4)];
    let errors = compare("MaglevKey", "hm_maglev_key", 8, &fields, &s);
    assert_eq!(errors.len(), 3, "{errors:#?}");
    assert!(errors[0].contains("hm_maglev_key.svc_id is at 4 (4 bytes), MaglevKey::svc_id at 0"), "{errors:#?}");
    assert!(errors[2].contains("2 bytes of implicit padding"), "{errors:#?}");
}
