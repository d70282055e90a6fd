//! A BPF map entry's value as the desired state holds it. Most values are
//! a few bytes and are held inline (up to 24), or else as bytes shared
//! (`Arc`) by the desired state and the plan that writes them.
//!
//! A Maglev chunk is 256 bytes and a service has one per 64 slots of its
//! table: at 100,000 one-backend services, 1 KiB of every service's ~1.3
//! KiB of map values. A chunk is held instead as its service's table
//! parameters (the backends and their ids, shared by all the service's
//! chunks) and the chunk's digest. Two chunks compare by digest, a chunk
//! read back from the kernel by hashing its bytes; the table is rebuilt
//! only when a chunk is written (`bytes`), once per service for its run of
//! chunks. Equal digests are taken as equal bytes: a 64-bit digest makes a
//! false match (a stale chunk left in place) a 2^-64 chance per compare.

use std::borrow::Cow;
use std::cell::RefCell;
use std::fmt;
use std::sync::{Arc, Weak};

use serde::{Serialize, Serializer};

use crate::abi::{MaglevChunk, Pod, MAGLEV_CHUNK};

use super::bpf_map::BpfMap;
use super::maglev::{self, Entry};
use super::map_key::{KeyBytes, KEY_INLINE};
use crate::table_size::chunks_for;

#[derive(Clone)]
pub struct MapValue(Repr);

#[derive(Clone)]
enum Repr {
    /// A value of up to `KEY_INLINE` bytes (a service's, a backend's),
    /// held inline: no allocation of its own.
    Short(KeyBytes),
    Bytes(Arc<[u8]>),
    Chunk {
        table: Arc<MaglevTable>,
        chunk: u32,
    },
    /// A chunk read back from the kernel: only compared, so only its
    /// digest is kept (a full resync at 100,000 services reads 400,000).
    ReadBack(u64),
}

/// What one service's Maglev table is rebuilt from, and its chunks'
/// digests: in one block of the heap for a table of up to one backend
/// and one chunk, two ids (128 bytes; four blocks, 192, before).
pub struct MaglevTable {
    backends: Few<Entry, 1>,
    /// HM_BACKENDS ids, in the order of `backends`.
    ids: Few<u32, 2>,
    size: u32,
    digests: Few<u64, 1>,
}

/// A list of up to `N` held inline, a longer one boxed.
enum Few<T: Copy, const N: usize> {
    Inline(u8, [T; N]),
    Boxed(Box<[T]>),
}

impl<T: Copy, const N: usize> From<Vec<T>> for Few<T, N> {
    fn from(v: Vec<T>) -> Self {
        match v.first() {
            Some(&first) if v.len() <= N => {
                let mut inline = [first; N];
                inline[..v.len()].copy_from_slice(&v);
                Few::Inline(v.len() as u8, inline)
            }
            _ => Few::Boxed(v.into()),
        }
    }
}

impl<T: Copy, const N: usize> std::ops::Deref for Few<T, N> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match self {
            Few::Inline(n, inline) => &inline[..*n as usize],
            Few::Boxed(b) => b,
        }
    }
}

/// The bytes of one HM_MAGLEV value.
const CHUNK_BYTES: usize = std::mem::size_of::<MaglevChunk>();

impl MaglevTable {
    /// The table of `backends` (with their `ids`) at `size` slots. Builds
    /// it once to take its chunks' digests.
    pub fn new(backends: Vec<Entry>, ids: Vec<u32>, size: u32) -> Arc<MaglevTable> {
        assert_eq!(backends.len(), ids.len(), "one id per backend");
        let mut table = MaglevTable { backends: backends.into(), ids: ids.into(), size, digests: Vec::new().into() };
        let slots = table.slots();
        table.digests =
            (0..table.chunks()).map(|c| digest(&chunk_of(&slots, &table.ids, c))).collect::<Vec<_>>().into();
        Arc::new(table)
    }

    /// How many HM_MAGLEV chunks the table fills.
    pub fn chunks(&self) -> u32 {
        chunks_for(self.backends.len(), self.size) as u32
    }

    fn slots(&self) -> Vec<u32> {
        maglev::build(&self.backends, self.size)
    }
}

/// Chunk `chunk` of a built table: each slot's backend id, 0 past the
/// end; a table of one slot fills its whole chunk with that slot. A
/// service that goes from two backends to one rewrites its chunk 0 before
/// its HM_SERVICES value says the table is of one slot: until then the
/// probes read slots 0..63 of its 251, and each names the backend that
/// stays, never id 0.
fn chunk_of(slots: &[u32], ids: &[u32], chunk: u32) -> Vec<u8> {
    let mut value = MaglevChunk { backend: [0; MAGLEV_CHUNK] };
    if let [only] = slots {
        value.backend = [ids[*only as usize]; MAGLEV_CHUNK];
        return value.to_bytes();
    }
    let start = chunk as usize * MAGLEV_CHUNK;
    for (i, &b) in slots[start..].iter().take(MAGLEV_CHUNK).enumerate() {
        value.backend[i] = ids[b as usize];
    }
    value.to_bytes()
}

/// A chunk's digest: foldhash, seeded the same in every process (a
/// table's digests are compared with those of chunks read back, never
/// kept): a tenth of FNV-1a's byte-at-a-time cost on 256 bytes.
fn digest(bytes: &[u8]) -> u64 {
    use std::hash::BuildHasher;
    foldhash::quality::FixedState::with_seed(3).hash_one(bytes)
}

thread_local! {
    /// The table written last, built: a service's chunks are written one
    /// after another, and the table is built once for them. The `Weak`
    /// keeps the address from being reused by another table.
    static LAST_BUILT: RefCell<Option<(Weak<MaglevTable>, Vec<u32>)>> = const { RefCell::new(None) };
}

impl MapValue {
    /// Chunk `chunk` of `table`.
    pub fn chunk(table: &Arc<MaglevTable>, chunk: u32) -> MapValue {
        assert!(chunk < table.chunks(), "chunk {chunk} of a table of {} chunks", table.chunks());
        MapValue(Repr::Chunk { table: table.clone(), chunk })
    }

    /// A value read from `map` in the kernel.
    pub fn read_back(map: BpfMap, bytes: Vec<u8>) -> MapValue {
        if map == BpfMap::Maglev && bytes.len() == CHUNK_BYTES {
            MapValue(Repr::ReadBack(digest(&bytes)))
        } else {
            bytes.into()
        }
    }

    /// The value's bytes, as written to the map; `None` for a chunk read
    /// back from the kernel, which is only compared, never written.
    pub fn bytes(&self) -> Option<Cow<'_, [u8]>> {
        Some(match &self.0 {
            Repr::ReadBack(_) => return None,
            Repr::Short(b) => Cow::Borrowed(&b[..]),
            Repr::Bytes(b) => Cow::Borrowed(b),
            Repr::Chunk { table, chunk } => LAST_BUILT.with(|last| {
                let mut last = last.borrow_mut();
                let cached = last.as_ref().filter(|(t, _)| std::ptr::eq(t.as_ptr(), Arc::as_ptr(table)));
                if cached.is_none() {
                    *last = Some((Arc::downgrade(table), table.slots()));
                }
                let (_, slots) = last.as_ref().expect("just built");
                Cow::Owned(chunk_of(slots, &table.ids, *chunk))
            }),
        })
    }

    /// The bytes, when they are held as bytes (every value but a Maglev
    /// chunk's).
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match &self.0 {
            Repr::Short(b) => Some(b),
            Repr::Bytes(b) => Some(b),
            Repr::Chunk { .. } | Repr::ReadBack(_) => None,
        }
    }

    /// The digest compared with a chunk's, if this can be a chunk.
    fn chunk_digest(&self) -> Option<u64> {
        match &self.0 {
            Repr::Short(_) => None,
            Repr::Bytes(b) => (b.len() == CHUNK_BYTES).then(|| digest(b)),
            Repr::Chunk { table, chunk } => Some(table.digests[*chunk as usize]),
            Repr::ReadBack(d) => Some(*d),
        }
    }
}

impl From<Vec<u8>> for MapValue {
    fn from(bytes: Vec<u8>) -> Self {
        if bytes.len() <= KEY_INLINE {
            MapValue(Repr::Short(KeyBytes::of(&bytes)))
        } else {
            MapValue(Repr::Bytes(bytes.into()))
        }
    }
}

impl PartialEq for MapValue {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (Repr::Chunk { table: a, chunk: i }, Repr::Chunk { table: b, chunk: j }) if Arc::ptr_eq(a, b) && i == j => {
                true
            }
            _ => match (self.as_bytes(), other.as_bytes()) {
                (Some(a), Some(b)) => a == b,
                _ => self.chunk_digest().is_some_and(|d| other.chunk_digest() == Some(d)),
            },
        }
    }
}

impl Eq for MapValue {}

impl fmt::Debug for MapValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.0, self.bytes()) {
            (Repr::ReadBack(d), _) => write!(f, "chunk digest {d:016x}"),
            (_, b) => f.debug_list().entries(b.unwrap_or_default().iter()).finish(),
        }
    }
}

impl Serialize for MapValue {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match (&self.0, self.bytes()) {
            (Repr::ReadBack(d), _) => s.serialize_str(&format!("chunk digest {d:016x}")),
            (_, b) => s.collect_seq(b.unwrap_or_default().iter()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_short_and_long_are_their_bytes() {
        for len in 0..40u8 {
            let bytes: Vec<u8> = (0..len).collect();
            let v = MapValue::from(bytes.clone());
            assert_eq!(v.bytes().as_deref(), Some(&bytes[..]));
            assert_eq!(v.as_bytes(), Some(&bytes[..]));
            assert_eq!(v, MapValue::read_back(BpfMap::Services, bytes.clone()));
            assert_ne!(v, MapValue::from([bytes.clone(), vec![0]].concat()));
            assert_eq!(serde_json::to_string(&v).unwrap(), serde_json::to_string(&bytes).unwrap());
        }
    }

    fn backends(n: usize) -> Vec<Entry> {
        (0..n).map(|i| Entry { addr: format!("10.1.0.{}:80", i + 1).parse().unwrap(), weight: 1 }).collect()
    }

    /// The chunks as the compile built them before: every slot's backend
    /// id, 0 past the table's end.
    fn built_directly(b: &[Entry], ids: &[u32], size: u32) -> Vec<Vec<u8>> {
        maglev::build(b, size)
            .chunks(MAGLEV_CHUNK)
            .map(|slots| {
                let mut c = MaglevChunk { backend: [0; MAGLEV_CHUNK] };
                for (i, &s) in slots.iter().enumerate() {
                    c.backend[i] = ids[s as usize];
                }
                c.to_bytes()
            })
            .collect()
    }

    #[test]
    fn a_chunk_writes_the_bytes_of_the_built_table() {
        let ids = vec![7, 9, 11];
        let table = MaglevTable::new(backends(3), ids.clone(), 251);
        assert_eq!(table.chunks(), 4);
        let want = built_directly(&backends(3), &ids, 251);
        // Out of order, and interleaved with another table: the cache of
        // the last built table never serves the wrong one.
        let other = MaglevTable::new(backends(2), vec![1, 2], 251);
        for c in [3, 0, 2, 1] {
            assert_eq!(MapValue::chunk(&table, c).bytes().unwrap().as_ref(), want[c as usize].as_slice(), "chunk {c}");
            assert_ne!(MapValue::chunk(&other, c).bytes().unwrap().as_ref(), want[c as usize].as_slice());
        }
    }

    #[test]
    fn a_table_of_one_backend_is_one_block_of_the_heap() {
        // 100,000 one-backend services hold 100,000 tables (of one slot).
        assert!(std::mem::size_of::<MaglevTable>() <= 104, "{}", std::mem::size_of::<MaglevTable>());
        let one = MaglevTable::new(backends(1), vec![7], crate::table_size::ONE_BACKEND_TABLE_SIZE);
        assert!(matches!((&one.backends, &one.ids, &one.digests), (Few::Inline(..), Few::Inline(..), Few::Inline(..))));
        assert_eq!((&one.ids[..], one.digests.len()), (&[7][..], 1));
        let three = MaglevTable::new(backends(3), vec![1, 2, 3], 251);
        assert_eq!((three.backends.len(), &three.ids[..], three.digests.len()), (3, &[1, 2, 3][..], 4));
        assert!(MaglevTable::new(Vec::new(), Vec::new(), 251).ids.is_empty());
    }

    #[test]
    fn chunks_compare_by_content_with_each_other_and_with_bytes() {
        let a = MaglevTable::new(backends(2), vec![1, 2], 251);
        let same = MaglevTable::new(backends(2), vec![1, 2], 251);
        let other_ids = MaglevTable::new(backends(2), vec![1, 3], 251);
        let fewer = MaglevTable::new(backends(1), vec![1], 251);
        assert_eq!(MapValue::chunk(&a, 1), MapValue::chunk(&same, 1));
        assert_ne!(MapValue::chunk(&a, 1), MapValue::chunk(&a, 3), "the last chunk has the table's tail");
        assert_ne!(MapValue::chunk(&a, 0), MapValue::chunk(&other_ids, 0));
        assert_ne!(MapValue::chunk(&a, 0), MapValue::chunk(&fewer, 0));
        // As observe reads it back from the kernel.
        let bytes = MapValue::chunk(&a, 2).bytes().unwrap().into_owned();
        let read_back = MapValue::read_back(BpfMap::Maglev, bytes.clone());
        assert!(read_back.bytes().is_none() && read_back.as_bytes().is_none(), "only a digest is kept");
        assert_eq!(read_back, MapValue::chunk(&a, 2));
        assert_eq!(MapValue::chunk(&a, 2), read_back);
        assert_eq!(read_back, MapValue::from(bytes.clone()));
        assert_ne!(read_back, MapValue::chunk(&a, 1));
        assert_eq!(MapValue::from(bytes.clone()), MapValue::chunk(&a, 2), "as bytes, too");
        assert_ne!(MapValue::from(vec![0; 8]), MapValue::chunk(&a, 2), "another size is never a chunk");
        let mut flipped = bytes.clone();
        flipped[100] ^= 1;
        assert_ne!(MapValue::read_back(BpfMap::Maglev, flipped.clone()), MapValue::chunk(&a, 2));
        assert_ne!(MapValue::from(flipped), MapValue::chunk(&a, 2));
        // Other maps' values are kept whole, whatever their size.
        assert_eq!(MapValue::read_back(BpfMap::Mesh, bytes.clone()).as_bytes(), Some(&bytes[..]));
    }

    #[test]
    fn a_chunk_holds_parameters_not_bytes() {
        let table = MaglevTable::new(backends(1), vec![1], 251);
        let chunks: Vec<MapValue> = (0..4).map(|c| MapValue::chunk(&table, c)).collect();
        assert_eq!(Arc::strong_count(&table), 5, "the service's chunks share one table");
        // 24 bytes inline for short values, and the tag.
        assert!(std::mem::size_of::<MapValue>() <= 32);
        assert!(chunks.iter().all(|c| c.as_bytes().is_none()));
    }

    #[test]
    fn bytes_stay_bytes() {
        let v = MapValue::from(vec![1, 2, 3]);
        assert_eq!(v.as_bytes(), Some(&[1u8, 2, 3][..]));
        assert_eq!(v.bytes().unwrap().as_ref(), [1, 2, 3]);
        assert_eq!(serde_json::to_string(&v).unwrap(), "[1,2,3]");
    }
}
