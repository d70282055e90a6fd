//! The one table of probe objects: what `daemon/build.rs` compiles from
//! `probes/` (it includes this file) and the daemon embeds, loads, marks
//! and tests. Self-contained on purpose: build.rs reads it with
//! `#[path]`, so it imports nothing.

/// Every object built from `probes/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProbeObject {
    /// The bpfnat veth path and the reply translation, reading the coarse
    /// clock (probes/clock.h).
    ServiceNat,
    /// The same reading the precise clock (before 5.11).
    ServiceNatPrecise,
    /// Connect-time load balancing.
    ServiceCtlb,
    /// The same without bpf_set_retval() (before 5.18): refusals are EPERM.
    ServiceCtlbEperm,
    /// sk_lookup mesh redirects.
    Mesh,
    /// Gateway peers over hm-tun0.
    Gateway,
    /// The netns cookie on kernels without SO_NETNS_COOKIE.
    NetnsCookie,
    /// Never loaded: the header's constants as BTF, for the ABI test.
    AbiConstants,
}

/// One row of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectDef {
    pub object: ProbeObject,
    /// The object's file name without `.o`, in build.rs's `OUT_DIR`.
    pub name: &'static str,
    /// The C file under `probes/` (one file per feature).
    pub source: &'static str,
    /// Extra clang defines: a variant of a file for kernels that lack
    /// something (`model/kernel.rs` says which).
    pub defines: &'static [&'static str],
}

const fn row(
    object: ProbeObject,
    name: &'static str,
    source: &'static str,
    defines: &'static [&'static str],
) -> ObjectDef {
    ObjectDef { object, name, source, defines }
}

/// Every object, in `ProbeObject`'s order.
pub const OBJECTS: [ObjectDef; ProbeObject::COUNT] = [
    row(ProbeObject::ServiceNat, "service_nat", "service_nat.c", &["-DHM_COARSE_CLOCK"]),
    row(ProbeObject::ServiceNatPrecise, "service_nat_precise", "service_nat.c", &[]),
    row(ProbeObject::ServiceCtlb, "service_ctlb", "service_ctlb.c", &[]),
    row(ProbeObject::ServiceCtlbEperm, "service_ctlb_eperm", "service_ctlb.c", &["-DHM_NO_SET_RETVAL"]),
    row(ProbeObject::Mesh, "mesh", "mesh.c", &[]),
    row(ProbeObject::Gateway, "gateway", "gateway.c", &[]),
    row(ProbeObject::NetnsCookie, "netns_cookie", "netns_cookie.c", &[]),
    row(ProbeObject::AbiConstants, "abi_constants", "abi_constants.c", &[]),
];

// The table is in `ProbeObject`'s order: `ProbeObject::def` indexes it.
const _: () = {
    let mut i = 0;
    while i < OBJECTS.len() {
        assert!(OBJECTS[i].object as usize == i, "OBJECTS is in ProbeObject's order");
        i += 1;
    }
};

impl ProbeObject {
    pub const COUNT: usize = 8;

    /// Its row of the table.
    pub const fn def(self) -> &'static ObjectDef {
        &OBJECTS[self as usize]
    }
}
