//! Maglev table sizes: the limits the configuration is checked against,
//! the size a service gets, and the HM_MAGLEV chunks its table fills. The
//! config's capacity check and the model's compile both need them, so they
//! live in a leaf that imports nothing of the crate but `abi`.

use crate::abi::MAGLEV_CHUNK;

pub(crate) const MIN_TABLE_SIZE: u32 = 7;
pub(crate) const MAX_TABLE_SIZE: u32 = 65521;
/// The sizes chosen when the configuration names none: primes about four
/// times apart, so a service changes size only when its backend count
/// crosses a step, not at every added backend.
pub(crate) const AUTO_TABLE_SIZES: [u32; 5] = [251, 1021, 4093, 16381, MAX_TABLE_SIZE];
/// Maglev's guidance: a table over 100 times the backends keeps the split
/// even and a backend's removal moving little more than its share.
pub(crate) const SLOTS_PER_BACKEND: u32 = 100;

/// The size of a lone backend's table when the configuration names none:
/// every slot would hold that backend, so one slot (one HM_MAGLEV chunk
/// instead of four) picks it as a table of 251 would. At 100,000
/// one-backend services that is 300,000 fewer map entries to write and
/// compare, and 75 MiB less kernel memory.
pub(crate) const ONE_BACKEND_TABLE_SIZE: u32 = 1;

/// The table size for `backends` backends when the configuration names
/// none: one slot for one backend, else the smallest of AUTO_TABLE_SIZES
/// over SLOTS_PER_BACKEND × backends (251 slots, four 256-byte chunks, for
/// two backends).
pub(crate) fn table_size_for(backends: usize) -> u32 {
    if backends == 1 {
        return ONE_BACKEND_TABLE_SIZE;
    }
    let want = (backends as u64).saturating_mul(u64::from(SLOTS_PER_BACKEND));
    AUTO_TABLE_SIZES.into_iter().find(|&m| u64::from(m) > want).unwrap_or(MAX_TABLE_SIZE)
}

pub(crate) fn is_prime(n: u32) -> bool {
    if n < 2 {
        return false;
    }
    let mut d = 2u32;
    while d.saturating_mul(d) <= n {
        if n.is_multiple_of(d) {
            return false;
        }
        d += 1;
    }
    true
}

/// A service's table size: its own, else `[daemon] maglev_table_size`,
/// else sized from its backends.
pub(crate) fn resolve(own: Option<u32>, default: Option<u32>, backends: usize) -> u32 {
    own.or(default).unwrap_or_else(|| table_size_for(backends))
}

/// The HM_MAGLEV chunks a table of `size` slots over `backends` backends
/// fills: none without backends.
pub(crate) fn chunks_for(backends: usize, size: u32) -> usize {
    if backends == 0 {
        0
    } else {
        (size as usize).div_ceil(MAGLEV_CHUNK)
    }
}

/// The HM_MAGLEV chunks a service takes: `resolve`'s size, `chunks_for`'s
/// count (the merge's capacity check counts them file by file).
pub(crate) fn service_chunks(own: Option<u32>, default: Option<u32>, backends: usize) -> usize {
    chunks_for(backends, resolve(own, default, backends))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primes() {
        let primes: Vec<u32> = (0..30).filter(|&n| is_prime(n)).collect();
        assert_eq!(primes, [2, 3, 5, 7, 11, 13, 17, 19, 23, 29]);
        assert!(AUTO_TABLE_SIZES.iter().all(|m| is_prime(*m)) && is_prime(MIN_TABLE_SIZE));
    }

    #[test]
    fn the_automatic_size_stays_over_a_hundred_slots_per_backend() {
        assert_eq!(table_size_for(0), 251);
        assert_eq!(table_size_for(2), 251);
        assert_eq!(table_size_for(3), 1021);
        assert_eq!(table_size_for(10), 1021);
        assert_eq!(table_size_for(11), 4093);
        assert_eq!(table_size_for(1000), MAX_TABLE_SIZE);
        for n in 2..=655 {
            assert!(table_size_for(n) > n as u32 * SLOTS_PER_BACKEND, "{n} backends");
        }
    }

    #[test]
    fn a_lone_backend_gets_a_table_of_one_slot_in_one_chunk() {
        assert_eq!(table_size_for(1), ONE_BACKEND_TABLE_SIZE);
        assert_eq!(chunks_for(1, resolve(None, None, 1)), 1);
        // A size the configuration names is kept.
        assert_eq!(resolve(None, Some(1021), 1), 1021);
        assert_eq!(resolve(Some(7), None, 1), 7);
    }

    #[test]
    fn a_table_fills_whole_chunks_and_none_without_backends() {
        assert_eq!(chunks_for(0, 251), 0);
        assert_eq!(chunks_for(2, 251), 4);
        assert_eq!(chunks_for(2, 256), 4);
        assert_eq!(chunks_for(2, 257), 5);
        assert_eq!(resolve(Some(7), Some(1021), 2), 7);
        assert_eq!(resolve(None, Some(1021), 2), 1021);
        assert_eq!(resolve(None, None, 2), 251);
    }
}
