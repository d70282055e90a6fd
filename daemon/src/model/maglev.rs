//! Maglev consistent hashing (Eisenbud et al., NSDI 2016) with weights.
//!
//! Each backend walks its own permutation of the table's slots (an offset
//! and a skip derived from a hash of its address) and claims the next free
//! slot on its turn; backends get turns in proportion to their weights. The
//! table therefore splits by weight, and adding or removing one backend
//! moves little more than that backend's share: the other backends keep
//! walking the same permutations.
//!
//! The table size must be prime (so every skip visits every slot) and
//! well above the number of backends for an even split; a lone backend's
//! table may be of one slot (`table_size::ONE_BACKEND_TABLE_SIZE`).

use std::net::SocketAddr;

use crate::table_size::{is_prime, ONE_BACKEND_TABLE_SIZE};

/// FNV-1a, 64-bit, with a seed mixed into the offset basis: stable across
/// runs and hosts, so every host builds the same table for the same config.
pub(crate) fn fnv1a(seed: u64, bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // A final avalanche so nearby addresses spread well.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

/// A backend as Maglev sees it: an identity and a weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub addr: SocketAddr,
    pub weight: u32,
}

/// Builds a table of `size` slots; each slot holds an index into
/// `backends`. Empty when there are no backends. The result does not depend
/// on the order of `backends`.
pub(crate) fn build(backends: &[Entry], size: u32) -> Vec<u32> {
    assert!(
        is_prime(size) || (size == ONE_BACKEND_TABLE_SIZE && backends.len() <= 1),
        "Maglev table size {size} must be prime ({} backends)",
        backends.len()
    );
    if backends.is_empty() {
        return Vec::new();
    }
    if backends.len() == 1 {
        // Every slot is the one backend's (what the walk below gives).
        return vec![0; size as usize];
    }
    let m = size as u64;
    // Walk backends in a canonical order so config order does not matter.
    let mut order: Vec<usize> = (0..backends.len()).collect();
    order.sort_by_key(|&i| backends[i].addr);
    let perms: Vec<(u64, u64)> = order
        .iter()
        .map(|&i| {
            let id = backends[i].addr.to_string();
            let offset = fnv1a(1, id.as_bytes()) % m;
            let skip = fnv1a(2, id.as_bytes()) % (m - 1) + 1;
            (offset, skip)
        })
        .collect();
    // Turns follow a smooth weighted round-robin: each backend's number of
    // turns stays within one of its exact share at every point, so the
    // table splits by weight however the last round falls.
    let weights: Vec<i64> = order.iter().map(|&i| i64::from(backends[i].weight.max(1))).collect();
    let total: i64 = weights.iter().sum();
    let mut credit = vec![0i64; order.len()];
    let mut next = vec![0u64; order.len()];
    let mut table = vec![u32::MAX; size as usize];
    for _ in 0..size {
        for (c, w) in credit.iter_mut().zip(&weights) {
            *c += w;
        }
        let k = (0..order.len()).max_by_key(|&k| (credit[k], std::cmp::Reverse(k))).expect("backends");
        credit[k] -= total;
        let (offset, skip) = perms[k];
        let mut slot = (offset + next[k] * skip) % m;
        while table[slot as usize] != u32::MAX {
            next[k] += 1;
            slot = (offset + next[k] * skip) % m;
        }
        table[slot as usize] = order[k] as u32;
        next[k] += 1;
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backends(n: usize) -> Vec<Entry> {
        (0..n)
            .map(|i| Entry { addr: format!("10.1.{}.{}:8080", i / 200, i % 200 + 1).parse().unwrap(), weight: 1 })
            .collect()
    }

    fn share(table: &[u32], index: u32) -> f64 {
        table.iter().filter(|&&b| b == index).count() as f64 / table.len() as f64
    }

    /// Slots whose backend changed, as a fraction of the table.
    fn moved(a: &[u32], ab: &[Entry], b: &[u32], bb: &[Entry]) -> f64 {
        let changed = a.iter().zip(b).filter(|(x, y)| ab[**x as usize].addr != bb[**y as usize].addr).count();
        changed as f64 / a.len() as f64
    }

    #[test]
    fn every_slot_is_filled_and_the_split_is_even() {
        for n in [1, 2, 3, 7, 10, 50] {
            let b = backends(n);
            let t = build(&b, 1021);
            assert_eq!(t.len(), 1021);
            for i in 0..n as u32 {
                let s = share(&t, i);
                assert!((s - 1.0 / n as f64).abs() < 0.01, "n={n}: backend {i} has {s:.4}");
            }
        }
    }

    #[test]
    fn weights_are_honoured_within_five_percent() {
        for weights in [vec![1, 2], vec![1, 1, 3], vec![5, 1, 1, 1], vec![10, 20, 30, 40]] {
            let b: Vec<Entry> =
                weights.iter().enumerate().map(|(i, &w)| Entry { weight: w, ..backends(weights.len())[i] }).collect();
            let t = build(&b, 1021);
            let total: u32 = weights.iter().sum();
            for (i, &w) in weights.iter().enumerate() {
                let want = w as f64 / total as f64;
                let got = share(&t, i as u32);
                assert!(
                    (got - want).abs() / want < 0.05,
                    "weights {weights:?}: backend {i} got {got:.4}, want {want:.4}"
                );
            }
        }
    }

    #[test]
    fn order_of_backends_does_not_matter() {
        let b = backends(5);
        let mut r = b.clone();
        r.reverse();
        let t1 = build(&b, 251);
        let t2 = build(&r, 251);
        let names1: Vec<SocketAddr> = t1.iter().map(|&i| b[i as usize].addr).collect();
        let names2: Vec<SocketAddr> = t2.iter().map(|&i| r[i as usize].addr).collect();
        assert_eq!(names1, names2);
    }

    #[test]
    fn removing_or_adding_one_of_n_moves_about_one_nth() {
        for n in [2, 3, 5, 10, 20] {
            let all = backends(n + 1);
            let fewer = all[..n].to_vec();
            let t_all = build(&all, 1021);
            let t_fewer = build(&fewer, 1021);
            // Removing one of n+1: the removed backend's share must move,
            // and only a little more.
            let removed = moved(&t_all, &all, &t_fewer, &fewer);
            let bound = 1.0 / (n + 1) as f64 + 0.05;
            assert!(removed <= bound, "remove 1 of {}: moved {removed:.4} > {bound:.4}", n + 1);
            // Adding one to n is the same change seen the other way.
            let added = moved(&t_fewer, &fewer, &t_all, &all);
            assert!(added <= bound, "add 1 to {n}: moved {added:.4} > {bound:.4}");
        }
    }

    #[test]
    fn one_backend_takes_every_slot() {
        for weight in [1, 7] {
            let one = [Entry { addr: "10.1.0.1:8080".parse().unwrap(), weight }];
            assert_eq!(build(&one, 251), vec![0; 251]);
            assert_eq!(build(&one, ONE_BACKEND_TABLE_SIZE), vec![0]);
        }
    }

    #[test]
    fn no_backends_no_table() {
        assert!(build(&[], 1021).is_empty());
    }
}
