//! The probes this binary carries (compiled by build.rs from the table of
//! objects, `abi::OBJECTS`) and each map's definition as the configuration
//! sizes it (from the table of maps, `abi::MAPS`).

use crate::abi::{HmMap, MapDef, ProbeObject};
use crate::backends::MapSizes;
use crate::model::{Feature, KernelFeatures, Program};

/// Every object's bytes, in the table's order (build.rs writes the list).
static EMBEDDED: [&[u8]; ProbeObject::COUNT] = include!(concat!(env!("OUT_DIR"), "/embedded.rs"));

/// The bytes of one object.
pub fn bytes(object: ProbeObject) -> &'static [u8] {
    EMBEDDED[object as usize]
}

/// The objects whose programs this kernel runs, each as its programs
/// name it (`Program::object`) with the variant loaded for it: the
/// connect-time object without bpf_set_retval() where the kernel lacks it,
/// the veth path's reading the precise clock where it lacks the coarse
/// one. All share the pinned maps.
pub fn loaded_objects(features: &KernelFeatures) -> [(ProbeObject, ProbeObject); 4] {
    let ctlb = if features.has(Feature::SetRetval) { ProbeObject::ServiceCtlb } else { ProbeObject::ServiceCtlbEperm };
    let nat = if features.has(Feature::CoarseClock) { ProbeObject::ServiceNat } else { ProbeObject::ServiceNatPrecise };
    [
        (ProbeObject::ServiceNat, nat),
        (ProbeObject::ServiceCtlb, ctlb),
        (ProbeObject::Mesh, ProbeObject::Mesh),
        (ProbeObject::Gateway, ProbeObject::Gateway),
    ]
}

/// A map's definition with the configured capacities applied.
pub fn sized(map: HmMap, sizes: &MapSizes) -> MapDef {
    let mut d = *map.def();
    if let Some(c) = d.sized_by {
        d.max_entries = sizes.get(c);
    }
    d
}

/// The objects that carry programs, whose marks explain compares.
const MARKED: [ProbeObject; 6] = [
    ProbeObject::ServiceNat,
    ProbeObject::ServiceNatPrecise,
    ProbeObject::ServiceCtlb,
    ProbeObject::ServiceCtlbEperm,
    ProbeObject::Mesh,
    ProbeObject::Gateway,
];

/// The mark of each object that carries programs, parsed and hashed once.
fn carried_marks() -> &'static [(ProbeObject, u64); 6] {
    static MARKS: std::sync::OnceLock<[(ProbeObject, u64); 6]> = std::sync::OnceLock::new();
    MARKS.get_or_init(|| MARKED.map(|o| (o, build_mark(bytes(o)))))
}

/// The mark the loader gives the programs of `variant` (`build_mark`);
/// `None` for an object that carries no programs.
pub fn mark_of(variant: ProbeObject) -> Option<&'static u64> {
    carried_marks().iter().find(|(o, _)| *o == variant).map(|(_, m)| m)
}

/// The marks this build's programs carry (probes/build_mark.h), for each
/// object `program` can come from: both variants of the connect-time
/// and the veth-path objects, else the one.
pub fn build_marks(program: Program) -> Vec<u64> {
    let object = program.object();
    let variants: &[ProbeObject] = match object {
        ProbeObject::ServiceCtlb => &[ProbeObject::ServiceCtlb, ProbeObject::ServiceCtlbEperm],
        ProbeObject::ServiceNat => &[ProbeObject::ServiceNat, ProbeObject::ServiceNatPrecise],
        _ => std::slice::from_ref(&object),
    };
    carried_marks().iter().filter(|(o, _)| variants.contains(o)).map(|(_, m)| *m).collect()
}

/// The value of `hm_build_mark` the loader gives every program of
/// `object`: FNV-1a (64 bits) over its functions' names and instructions
/// as compiled, before relocation. A rebuild that changes no code (a
/// comment, the BTF) keeps the mark; a change of code changes it. An
/// object aya cannot parse (it would not load either) is hashed whole.
pub fn build_mark(object: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let fnv = |h: u64, bytes: &[u8]| bytes.iter().fold(h, |h, b| (h ^ u64::from(*b)).wrapping_mul(PRIME));
    let Ok(obj) = aya_obj::Object::parse(object) else { return fnv(OFFSET, object) };
    let mut h = OFFSET;
    for f in obj.functions.values() {
        h = fnv(h, f.name.as_bytes());
        for i in &f.instructions {
            h = fnv(h, &[i.code, i.dst_reg() | (i.src_reg() << 4)]);
            h = fnv(h, &i.off.to_le_bytes());
            h = fnv(h, &i.imm.to_le_bytes());
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `object` with one byte of section `section` (at `at`) changed.
    fn patched(object: &[u8], section: &str, at: usize) -> Vec<u8> {
        use object::{Object, ObjectSection};
        let file = object::File::parse(object).unwrap();
        let (start, _) = file.section_by_name(section).unwrap().file_range().unwrap();
        let mut bytes = object.to_vec();
        bytes[start as usize + at] ^= 0x01;
        bytes
    }

    #[test]
    fn each_object_has_its_own_stable_mark_from_its_code() {
        let marks: Vec<u64> = MARKED.map(|o| build_mark(bytes(o))).to_vec();
        let mut distinct = marks.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), 6, "{marks:x?}");
        assert_eq!(build_mark(bytes(ProbeObject::Gateway)), marks[5], "the same object, the same mark");
        assert_eq!(build_marks(Program::Reply), [marks[0], marks[1]], "both veth-path variants");
        assert_eq!(build_marks(Program::Connect4), [marks[2], marks[3]], "both connect-time variants");
        // One instruction's immediate changed (code): another mark. The
        // license string changed (not code): the same mark.
        assert_ne!(build_mark(&patched(bytes(ProbeObject::Gateway), "classifier", 4)), marks[5]);
        assert_eq!(build_mark(&patched(bytes(ProbeObject::Gateway), "license", 0)), marks[5]);
        // Not an object at all: hashed whole, still a mark.
        assert_ne!(build_mark(b"not an object"), build_mark(b"not an object!"));
    }
}

/// The verifier's limit on a chain of calls, as 5.10 counts it: each
/// frame rounded up to 32 bytes, 512 in all. Newer kernels count closer,
/// so a chain that passes here can fail there (it did: hm_direct, 544);
/// this test holds every program of every object to 5.10's count.
#[cfg(test)]
mod stack_tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet, HashSet};

    const LIMIT: u32 = 512;
    const PSEUDO_CALL: u8 = 1;

    fn is_call(i: &aya_obj::generated::bpf_insn) -> bool {
        i.code == 0x85 && i.src_reg() == PSEUDO_CALL
    }

    /// The deepest r10 offset an instruction reaches: a load or store
    /// through r10, or r10 copied to a register that is then moved down.
    fn frame(insns: &[aya_obj::generated::bpf_insn]) -> u32 {
        let mut depth = 0u32;
        let mut from_r10 = [false; 11];
        for i in insns {
            let (class, dst, src) = (i.code & 0x07, i.dst_reg() as usize, i.src_reg() as usize);
            let memory = matches!(class, 0x01..=0x03) && (dst == 10 || src == 10);
            if memory && i.off < 0 {
                depth = depth.max(u32::from(i.off.unsigned_abs()));
            }
            if class == 0x07 && dst < 11 {
                // mov64 dst, r10 marks dst; add64 dst, -N on it is a frame address.
                if i.code == 0xbf && src == 10 {
                    from_r10[dst] = true;
                    continue;
                }
                if i.code == 0x07 && from_r10[dst] && i.imm < 0 {
                    depth = depth.max(i.imm.unsigned_abs());
                }
                from_r10[dst] = false;
            }
        }
        depth
    }

    /// The deepest chain of rounded frames from `start` in a linked program.
    fn chain(insns: &[aya_obj::generated::bpf_insn], starts: &BTreeSet<usize>, start: usize) -> u32 {
        let end = starts.range(start + 1..).next().copied().unwrap_or(insns.len());
        let body = &insns[start..end];
        let own = frame(body).div_ceil(32) * 32;
        let deepest = body
            .iter()
            .enumerate()
            .filter(|(_, i)| is_call(i))
            .map(|(at, i)| chain(insns, starts, ((start + at) as i64 + 1 + i64::from(i.imm)) as usize))
            .max()
            .unwrap_or(0);
        own + deepest
    }

    #[test]
    fn every_chain_of_calls_fits_the_stack_as_5_10_counts_it() {
        let mut deepest: BTreeMap<String, u32> = BTreeMap::new();
        for object in MARKED {
            let mut obj = aya_obj::Object::parse(bytes(object)).unwrap();
            let text: HashSet<usize> = obj.functions.keys().map(|(section, _)| *section).collect();
            obj.relocate_calls(&text).unwrap();
            for (name, program) in &obj.programs {
                let insns = &obj.functions[&program.function_key()].instructions;
                let mut starts = BTreeSet::from([0usize]);
                for (at, i) in insns.iter().enumerate().filter(|(_, i)| is_call(i)) {
                    starts.insert((at as i64 + 1 + i64::from(i.imm)) as usize);
                }
                deepest.insert(format!("{object:?}:{name}"), chain(insns, &starts, 0));
            }
        }
        let over: Vec<_> = deepest.iter().filter(|(_, d)| **d > LIMIT).collect();
        assert!(over.is_empty(), "over {LIMIT} bytes of stack on 5.10: {over:?}");
        // The counting finds frames at all: the veth path's big one.
        assert!(deepest["ServiceNat:hm_natout"] >= 448, "{deepest:?}");
    }
}
