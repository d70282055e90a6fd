//! Just enough of a BTF reader for the ABI test: the named structs of an
//! object with each member's offset and size, its enum constants, and the
//! map definitions of its `.maps` section. The format is the kernel's
//! (Documentation/bpf/btf.rst upstream): a header, then type records, then
//! a string table; type ids start at 1, 0 is void.

use std::collections::BTreeMap;

use object::{Object, ObjectSection};

const MAGIC: u16 = 0xeb9f;

/// One member of a struct, in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Member {
    pub name: String,
    pub offset: u32,
    pub size: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Struct {
    pub size: u32,
    pub members: Vec<Member>,
}

/// A map as its `SEC(".maps")` definition declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct MapDecl {
    pub name: String,
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub flags: u32,
}

#[derive(Debug, Clone)]
enum Kind {
    Sized(u32),
    Ptr(u32),
    Array {
        elem: u32,
        nelems: u32,
    },
    Struct {
        size: u32,
        members: Vec<(String, u32, u32)>,
    },
    Enum {
        size: u32,
        values: Vec<(String, i64)>,
    },
    /// typedef, volatile, const, restrict, type tag, var: the type they name.
    Alias(u32),
    Datasec(Vec<u32>),
    Other,
}

#[derive(Debug, Clone)]
struct Type {
    name: String,
    kind: Kind,
}

pub(super) struct Btf {
    types: Vec<Type>,
}

fn u16_at(b: &[u8], at: usize) -> Result<u16, String> {
    b.get(at..at + 2).map(|s| u16::from_le_bytes([s[0], s[1]])).ok_or_else(|| format!("BTF truncated at {at}"))
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, String> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or_else(|| format!("BTF truncated at {at}"))
}

impl Btf {
    /// The `.BTF` section of a little-endian ELF object (clang -target bpf
    /// on x86-64 and arm64).
    pub(super) fn of_object(elf: &[u8]) -> Result<Btf, String> {
        let file = object::File::parse(elf).map_err(|e| format!("not an ELF object: {e}"))?;
        let section = file.section_by_name(".BTF").ok_or("the object has no .BTF section (built without -g?)")?;
        let data = section.data().map_err(|e| format!(".BTF unreadable: {e}"))?;
        Btf::parse(data)
    }

    pub(super) fn parse(b: &[u8]) -> Result<Btf, String> {
        if u16_at(b, 0)? != MAGIC {
            return Err("not BTF (bad magic, or big-endian)".into());
        }
        let hdr_len = u32_at(b, 4)? as usize;
        let (type_off, type_len) = (u32_at(b, 8)? as usize, u32_at(b, 12)? as usize);
        let str_off = u32_at(b, 16)? as usize;
        let types_at = hdr_len + type_off;
        let strings = b.get(hdr_len + str_off..).ok_or("BTF string table out of bounds")?;
        let name = |off: u32| -> String {
            let rest = strings.get(off as usize..).unwrap_or_default();
            let end = rest.iter().position(|&c| c == 0).unwrap_or(rest.len());
            String::from_utf8_lossy(&rest[..end]).into_owned()
        };
        let mut types = Vec::new();
        let mut at = types_at;
        while at < types_at + type_len {
            let (name_off, info, size_or_type) = (u32_at(b, at)?, u32_at(b, at + 4)?, u32_at(b, at + 8)?);
            at += 12;
            let kind =
                read_kind(b, &mut at, info, size_or_type, &name).map_err(|e| format!("{}: {e}", name(name_off)))?;
            types.push(Type { name: name(name_off), kind });
        }
        Ok(Btf { types })
    }

    fn get(&self, id: u32) -> Result<&Type, String> {
        id.checked_sub(1).and_then(|i| self.types.get(i as usize)).ok_or_else(|| format!("no BTF type {id}"))
    }

    /// The type behind typedefs, qualifiers and variables.
    fn resolve(&self, mut id: u32) -> Result<&Type, String> {
        loop {
            let t = self.get(id)?;
            match t.kind {
                Kind::Alias(next) => id = next,
                _ => return Ok(t),
            }
        }
    }

    fn size_of(&self, id: u32) -> Result<u32, String> {
        let t = self.resolve(id)?;
        Ok(match &t.kind {
            Kind::Sized(size) | Kind::Struct { size, .. } | Kind::Enum { size, .. } => *size,
            Kind::Ptr(_) => 8,
            Kind::Array { elem, nelems } => nelems * self.size_of(*elem)?,
            _ => return Err(format!("BTF type {id} ({}) has no size", t.name)),
        })
    }

    /// Every named struct, by name.
    pub(super) fn structs(&self) -> Result<BTreeMap<String, Struct>, String> {
        let mut out = BTreeMap::new();
        for t in &self.types {
            if let Kind::Struct { size, members } = &t.kind {
                if t.name.is_empty() {
                    continue;
                }
                let members = members
                    .iter()
                    .map(|(name, ty, offset)| {
                        Ok(Member { name: name.clone(), offset: *offset, size: self.size_of(*ty)? })
                    })
                    .collect::<Result<Vec<_>, String>>()?;
                out.insert(t.name.clone(), Struct { size: *size, members });
            }
        }
        Ok(out)
    }

    /// The constants of every enum.
    pub(super) fn enum_constants(&self) -> BTreeMap<String, i64> {
        let mut out = BTreeMap::new();
        for t in &self.types {
            if let Kind::Enum { values, .. } = &t.kind {
                out.extend(values.iter().cloned());
            }
        }
        out
    }

    /// The maps of the `.maps` section, as libbpf reads them: `__uint(f, n)`
    /// is a pointer to an array of n elements, `__type(f, T)` a pointer to T.
    pub(super) fn maps(&self) -> Result<Vec<MapDecl>, String> {
        let mut out = Vec::new();
        for t in &self.types {
            let Kind::Datasec(vars) = &t.kind else { continue };
            if t.name != ".maps" {
                continue;
            }
            for &var in vars {
                let name = self.get(var)?.name.clone();
                let Kind::Struct { members, .. } = &self.resolve(var)?.kind else {
                    return Err(format!("map {name} is not a struct"));
                };
                let mut decl = MapDecl { name, map_type: 0, key_size: 0, value_size: 0, max_entries: 0, flags: 0 };
                for (field, ty, _) in members {
                    let Kind::Ptr(target) = self.resolve(*ty)?.kind else {
                        return Err(format!("map {}: {field} is not a pointer", decl.name));
                    };
                    let count = || match self.resolve(target)?.kind {
                        Kind::Array { nelems, .. } => Ok(nelems),
                        _ => Err(format!("map {}: {field} is not __uint()", decl.name)),
                    };
                    match field.as_str() {
                        "type" => decl.map_type = count()?,
                        "max_entries" => decl.max_entries = count()?,
                        "map_flags" => decl.flags = count()?,
                        "key_size" => decl.key_size = count()?,
                        "value_size" => decl.value_size = count()?,
                        "key" => decl.key_size = self.size_of(target)?,
                        "value" => decl.value_size = self.size_of(target)?,
                        other => return Err(format!("map {}: unknown field {other}", decl.name)),
                    }
                }
                out.push(decl);
            }
        }
        Ok(out)
    }
}

/// One type record's kind-specific part, after its 12-byte header;
/// advances `at` past it.
fn read_kind(
    b: &[u8],
    at: &mut usize,
    info: u32,
    size_or_type: u32,
    name: &dyn Fn(u32) -> String,
) -> Result<Kind, String> {
    let vlen = (info & 0xffff) as usize;
    let kind_flag = info >> 31 == 1;
    Ok(match (info >> 24) & 0x1f {
        1 => {
            *at += 4;
            Kind::Sized(size_or_type)
        }
        2 => Kind::Ptr(size_or_type),
        3 => {
            let k = Kind::Array { elem: u32_at(b, *at)?, nelems: u32_at(b, *at + 8)? };
            *at += 12;
            k
        }
        4 | 5 => {
            let mut members = Vec::with_capacity(vlen);
            for _ in 0..vlen {
                let raw = u32_at(b, *at + 8)?;
                let bits = if kind_flag { raw & 0xff_ffff } else { raw };
                if bits % 8 != 0 {
                    return Err("a bitfield member".to_string());
                }
                members.push((name(u32_at(b, *at)?), u32_at(b, *at + 4)?, bits / 8));
                *at += 12;
            }
            Kind::Struct { size: size_or_type, members }
        }
        6 => {
            let mut values = Vec::with_capacity(vlen);
            for _ in 0..vlen {
                values.push((name(u32_at(b, *at)?), i64::from(u32_at(b, *at + 4)? as i32)));
                *at += 8;
            }
            Kind::Enum { size: size_or_type, values }
        }
        19 => {
            let mut values = Vec::with_capacity(vlen);
            for _ in 0..vlen {
                let v = u64::from(u32_at(b, *at + 4)?) | (u64::from(u32_at(b, *at + 8)?) << 32);
                values.push((name(u32_at(b, *at)?), v as i64));
                *at += 12;
            }
            Kind::Enum { size: size_or_type, values }
        }
        // fwd, func, type tag
        7 | 12 | 18 => Kind::Other,
        // float
        16 => Kind::Sized(size_or_type),
        8..=11 => Kind::Alias(size_or_type),
        13 => {
            *at += 8 * vlen;
            Kind::Other
        }
        14 => {
            *at += 4;
            Kind::Alias(size_or_type)
        }
        15 => {
            let mut vars = Vec::with_capacity(vlen);
            for _ in 0..vlen {
                vars.push(u32_at(b, *at)?);
                *at += 12;
            }
            Kind::Datasec(vars)
        }
        17 => {
            *at += 4;
            Kind::Other
        }
        other => return Err(format!("unknown BTF kind {other}")),
    })
}
