//! A map entry's key bytes (and a short value's), held inline. The keys
//! of the maps hostmesh writes are at most 20 bytes (a service's address,
//! port and protocol; a prefix); held as shared slices, each of the
//! 265,000 of 100,000 services was an allocation of its own (48 bytes
//! with its header) and a pointer to follow on every comparison.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;

use serde::{Serialize, Serializer};

/// The longest key held (every `BpfMap`'s keys fit: a test checks).
pub(crate) const KEY_INLINE: usize = 24;

/// Up to `KEY_INLINE` bytes; compared, hashed, printed and serialized as
/// the slice they are.
#[derive(Clone, Copy, Default)]
pub struct KeyBytes {
    len: u8,
    bytes: [u8; KEY_INLINE],
}

impl KeyBytes {
    /// `b` as a key. Longer than `KEY_INLINE` is a map's key size no
    /// `BpfMap` has: a bug, not an input.
    pub fn of(b: &[u8]) -> Self {
        assert!(b.len() <= KEY_INLINE, "a map key of {} bytes; BpfMap keys are at most {KEY_INLINE}", b.len());
        let mut k = KeyBytes { len: b.len() as u8, bytes: [0; KEY_INLINE] };
        k.bytes[..b.len()].copy_from_slice(b);
        k
    }
}

impl Deref for KeyBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

impl From<&[u8]> for KeyBytes {
    fn from(b: &[u8]) -> Self {
        KeyBytes::of(b)
    }
}

impl From<Vec<u8>> for KeyBytes {
    fn from(b: Vec<u8>) -> Self {
        KeyBytes::of(&b)
    }
}

impl PartialEq for KeyBytes {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for KeyBytes {}

impl Hash for KeyBytes {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (**self).hash(state)
    }
}

impl fmt::Debug for KeyBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl Serialize for KeyBytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (**self).serialize(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::BpfMap;

    #[test]
    fn every_map_s_keys_fit_and_read_back_as_they_went_in() {
        for map in BpfMap::ALL {
            let size = map.map().def().key_size as usize;
            assert!(size <= KEY_INLINE, "{map:?} keys of {size} bytes");
            let bytes: Vec<u8> = (0..size as u8).collect();
            let k = KeyBytes::from(bytes.clone());
            assert_eq!(&*k, &bytes[..]);
            assert_eq!(format!("{k:?}"), format!("{bytes:?}"));
            assert_eq!(serde_json::to_string(&k).unwrap(), serde_json::to_string(&bytes).unwrap());
        }
        assert_ne!(KeyBytes::of(&[0]), KeyBytes::of(&[0, 0]), "the length is part of the key");
    }
}
