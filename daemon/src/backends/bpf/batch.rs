//! Writing and deleting many entries of one map: in batches
//! (BPF_MAP_UPDATE_BATCH / BPF_MAP_DELETE_BATCH, one system call for up to
//! `BATCH` entries) where the kernel has them, one entry per call where
//! not. Either way every entry is tried and each failure is reported
//! against its own entry, as one call per entry would: a batch stops at
//! the entry the kernel refused, that entry is tried alone (its error is
//! its own), and the batch goes on after it.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use aya_obj::generated::bpf_cmd::{BPF_MAP_DELETE_BATCH, BPF_MAP_UPDATE_BATCH};
use aya_obj::generated::{bpf_attr, BPF_ANY};

use super::sys::{self, attr, bpf};

/// Entries per batch call: the system call's cost is spread thin, and the
/// packed copy stays small (a Maglev chunk, the largest value, is 256 bytes).
pub(super) const BATCH: usize = 1024;

/// How entries reach the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Batching {
    /// Up to `BATCH` entries per call.
    Batched,
    /// One entry per call: kernels without the batch commands (before
    /// 5.6), and map types without them.
    OneAtATime,
}

/// Where a batch update or delete stopped: how many of its entries, from
/// the first, the kernel carried out, and the error of the entry after
/// them (or of the call itself, when the kernel refused the command).
#[derive(Debug)]
pub(super) struct BatchStop {
    pub done: usize,
    pub error: io::Error,
}

/// The batch commands' attributes: `count` entries of `keys` (and
/// `values`), packed back to back.
fn batch_attr(fd: BorrowedFd<'_>, keys: &[u8], values: Option<&[u8]>, count: usize) -> bpf_attr {
    let mut a = attr();
    a.batch.map_fd = fd.as_raw_fd() as u32;
    a.batch.keys = keys.as_ptr() as u64;
    a.batch.values = values.map_or(0, |v| v.as_ptr() as u64);
    a.batch.count = count as u32;
    a.batch.elem_flags = u64::from(BPF_ANY);
    a
}

fn batch_result(result: io::Result<i64>, a: &bpf_attr, count: usize) -> Result<(), BatchStop> {
    match result {
        Ok(_) => Ok(()),
        Err(error) => {
            // SAFETY: the batch view is the one given, which the kernel
            // writes back with the entries it carried out, when it began.
            let count_back = unsafe { a.batch.count } as usize;
            // A command refused before any entry (a map type without it)
            // leaves the count as it was: nothing was done.
            let done = if count_back >= count { 0 } else { count_back };
            Err(BatchStop { done, error })
        }
    }
}

/// Creates or replaces `count` entries in one call (BPF_MAP_UPDATE_BATCH,
/// Linux 5.6): `keys` and `values` hold them packed, each the size the
/// single-entry update takes.
fn map_update_batch(fd: BorrowedFd<'_>, keys: &[u8], values: &[u8], count: usize) -> Result<(), BatchStop> {
    assert!(
        count > 0 && keys.len().is_multiple_of(count) && values.len().is_multiple_of(count),
        "batch of whole entries"
    );
    let mut a = batch_attr(fd, keys, Some(values), count);
    let result = bpf(BPF_MAP_UPDATE_BATCH, &mut a);
    batch_result(result, &a, count)
}

/// Deletes `count` entries in one call (BPF_MAP_DELETE_BATCH). Unlike
/// `map_delete`, a missing key stops the batch (ENOENT).
fn map_delete_batch(fd: BorrowedFd<'_>, keys: &[u8], count: usize) -> Result<(), BatchStop> {
    assert!(count > 0 && keys.len().is_multiple_of(count), "batch of whole keys");
    let mut a = batch_attr(fd, keys, None, count);
    let result = bpf(BPF_MAP_DELETE_BATCH, &mut a);
    batch_result(result, &a, count)
}

/// The probe of `Feature::MapBatch`: one entry written by the batch
/// command to a small hash map of its own (which goes with its fd).
pub(super) fn supported() -> bool {
    use aya_obj::generated::bpf_map_type::BPF_MAP_TYPE_HASH;
    let Ok(map) = sys::map_create(BPF_MAP_TYPE_HASH as u32, 4, 4, 1) else { return false };
    map_update_batch(std::os::fd::AsFd::as_fd(&map), &[0; 4], &[0; 4], 1).is_ok()
}

/// What writing a run of entries did.
#[derive(Debug, Default)]
pub(super) struct Written {
    /// The entries that failed, by index, with their errors.
    pub failed: Vec<(usize, io::Error)>,
    /// The kernel refused the batch command for this map (the first entry
    /// of a batch went in alone): the rest went one at a time, and so
    /// should this map's next writes.
    pub batch_refused: bool,
}

/// The entries `at..` of a run packed back to back, up to `BATCH` of them.
fn pack<'a>(items: impl Iterator<Item = &'a [u8]>, buf: &mut Vec<u8>) -> usize {
    buf.clear();
    let mut n = 0;
    for item in items.take(BATCH) {
        buf.extend_from_slice(item);
        n += 1;
    }
    n
}

/// Whether every item has the length of the first (what a batch needs:
/// the kernel steps through them by the map's sizes).
fn uniform(items: impl Iterator<Item = usize>) -> bool {
    let mut items = items;
    let Some(first) = items.next() else { return true };
    items.all(|len| len == first)
}

/// Creates or replaces each (key, value) of `entries` in the map `fd`. A
/// long run is shared by several threads, each writing whole batches of
/// its own part in order; the parts land in no order among them, which a
/// run allows: the plan orders maps, and the entries of one map's run
/// never wait for one another.
pub(super) fn update(fd: BorrowedFd<'_>, entries: &[(&[u8], &[u8])], how: Batching) -> Written {
    let writers = writers_for(entries.len());
    if how == Batching::Batched && writers > 1 {
        return in_parts(entries, writers, |part| update_in_order(fd, part, how));
    }
    update_in_order(fd, entries, how)
}

/// A run shorter than this goes through one thread: its batches' system
/// calls cost less than starting another.
const SHARED_RUN: usize = 4 * BATCH;

/// How many threads write a run of `n` entries: one per CPU (at most 4),
/// each with two batches or more.
fn writers_for(n: usize) -> usize {
    if n < SHARED_RUN {
        return 1;
    }
    helper_threads().min(n / (2 * BATCH)).max(1)
}

/// How many threads share the kernel's work on maps (writing a long run,
/// creating maps): one per CPU, at most 4.
pub(super) fn helper_threads() -> usize {
    static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 4))
}

/// `write` run on `parts` parts of `items` at once, each a whole number of
/// batches, on threads of their own; their failures by index in `items`.
fn in_parts<T: Sync>(items: &[T], parts: usize, write: impl Fn(&[T]) -> Written + Sync) -> Written {
    let batches = items.len().div_ceil(BATCH);
    let per_part = batches.div_ceil(parts) * BATCH;
    let write = &write;
    std::thread::scope(|scope| {
        let threads: Vec<_> = items
            .chunks(per_part)
            .enumerate()
            .map(|(n, part)| (n * per_part, std::thread::Builder::new().spawn_scoped(scope, move || write(part))))
            .collect();
        let mut out = Written::default();
        for (from, thread) in threads {
            // A thread that could not start, or panicked: its part is
            // written here.
            let part = &items[from..(from + per_part).min(items.len())];
            let written = match thread {
                Ok(t) => t.join().unwrap_or_else(|_| write(part)),
                Err(_) => write(part),
            };
            out.batch_refused |= written.batch_refused;
            out.failed.extend(written.failed.into_iter().map(|(i, e)| (from + i, e)));
        }
        out
    })
}

/// `update`, in the order of `entries`, by the calling thread.
fn update_in_order(fd: BorrowedFd<'_>, entries: &[(&[u8], &[u8])], how: Batching) -> Written {
    let alone = |i: usize| sys::map_update(fd, entries[i].0, entries[i].1);
    let batched = how == Batching::Batched
        && uniform(entries.iter().map(|e| e.0.len()))
        && uniform(entries.iter().map(|e| e.1.len()));
    if !batched {
        return one_at_a_time(0, entries.len(), alone, Written::default());
    }
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    run_batches(entries.len(), alone, |at| {
        let n = pack(entries[at..].iter().map(|e| e.0), &mut keys);
        pack(entries[at..].iter().map(|e| e.1), &mut values);
        (n, map_update_batch(fd, &keys, &values, n))
    })
}

/// Deletes each key of `keys` from the hash map `fd`; a key that is not
/// there is not an error (as `sys::map_delete`).
pub(super) fn delete(fd: BorrowedFd<'_>, keys: &[&[u8]], how: Batching) -> Written {
    let alone = |i: usize| sys::map_delete(fd, keys[i]);
    if how == Batching::OneAtATime || !uniform(keys.iter().map(|k| k.len())) {
        return one_at_a_time(0, keys.len(), alone, Written::default());
    }
    let mut buf = Vec::new();
    run_batches(keys.len(), alone, |at| {
        let n = pack(keys[at..].iter().copied(), &mut buf);
        (n, map_delete_batch(fd, &buf, n))
    })
}

/// Entries `from..to`, one call each.
fn one_at_a_time(from: usize, to: usize, alone: impl Fn(usize) -> io::Result<()>, mut written: Written) -> Written {
    for i in from..to {
        if let Err(e) = alone(i) {
            written.failed.push((i, e));
        }
    }
    written
}

/// Entries `0..n` in batches: `batch(at)` sends up to `BATCH` entries
/// from `at` and says how many it sent and where the kernel stopped.
fn run_batches(
    n: usize,
    alone: impl Fn(usize) -> io::Result<()>,
    mut batch: impl FnMut(usize) -> (usize, Result<(), BatchStop>),
) -> Written {
    let mut written = Written::default();
    let mut at = 0;
    while at < n {
        let (sent, result) = batch(at);
        let Err(stop) = result else {
            at += sent;
            continue;
        };
        let stopped_at = at + stop.done;
        match alone(stopped_at) {
            // The entry goes in alone, but the batch did nothing: the
            // command itself failed (a kernel or map type without it; a
            // missing key, which stops a batch delete, aside): the rest go
            // one at a time, and this map's next writes too when the
            // kernel said it lacks the command.
            Ok(()) if stop.done == 0 && stop.error.raw_os_error() != Some(libc::ENOENT) => {
                written.batch_refused = super::sys::batch_not_supported(&stop.error);
                return one_at_a_time(stopped_at + 1, n, alone, written);
            }
            // Done by now (a delete of a key that is not there, which
            // stops a batch but is no error), or a transient failure:
            // nothing failed.
            Ok(()) => {}
            Err(e) => written.failed.push((stopped_at, e)),
        }
        at = stopped_at + 1;
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    fn err(code: i32) -> io::Error {
        io::Error::from_raw_os_error(code)
    }

    /// A kernel in a test: refuses the entries in `bad`, batches as told.
    struct Kernel {
        bad: Vec<usize>,
        batch_refused: bool,
        calls: RefCell<Vec<String>>,
        written: RefCell<Vec<usize>>,
    }

    impl Kernel {
        fn new(bad: &[usize], batch_refused: bool) -> Kernel {
            Kernel { bad: bad.to_vec(), batch_refused, calls: RefCell::default(), written: RefCell::default() }
        }

        fn alone(&self, i: usize) -> io::Result<()> {
            self.calls.borrow_mut().push(format!("alone {i}"));
            if self.bad.contains(&i) {
                return Err(err(libc::E2BIG));
            }
            self.written.borrow_mut().push(i);
            Ok(())
        }

        fn batch(&self, at: usize, n: usize) -> (usize, Result<(), BatchStop>) {
            let sent = (n - at).min(BATCH);
            self.calls.borrow_mut().push(format!("batch {at}+{sent}"));
            if self.batch_refused {
                return (sent, Err(BatchStop { done: 0, error: err(524) }));
            }
            for i in at..at + sent {
                if self.bad.contains(&i) {
                    return (sent, Err(BatchStop { done: i - at, error: err(libc::E2BIG) }));
                }
                self.written.borrow_mut().push(i);
            }
            (sent, Ok(()))
        }

        fn run(&self, n: usize) -> Written {
            run_batches(n, |i| self.alone(i), |at| self.batch(at, n))
        }
    }

    #[test]
    fn a_long_run_is_shared_by_threads_and_each_failure_keeps_its_index() {
        assert_eq!(writers_for(SHARED_RUN - 1), 1, "a short run stays on one thread");
        let n = 5 * BATCH + 7;
        let items: Vec<usize> = (0..n).collect();
        let bad = [3, BATCH + 1, 4 * BATCH + 9, n - 1];
        let threads = std::sync::Mutex::new(std::collections::HashSet::new());
        let written = std::sync::Mutex::new(Vec::new());
        let out = in_parts(&items, 3, |part| {
            threads.lock().unwrap().insert(std::thread::current().id());
            written.lock().unwrap().extend_from_slice(part);
            // Each part is whole batches but for the last.
            assert!(part.len() % BATCH == 0 || part.last() == items.last());
            let failed = part.iter().enumerate().filter(|(_, v)| bad.contains(v));
            Written {
                failed: failed.map(|(i, _)| (i, err(libc::E2BIG))).collect(),
                batch_refused: part.contains(&(2 * BATCH)),
            }
        });
        let mut failed: Vec<usize> = out.failed.iter().map(|(i, _)| *i).collect();
        failed.sort_unstable();
        assert_eq!(failed, bad, "failures by their index in the run");
        assert!(out.batch_refused, "one part's refusal is the run's");
        let mut all = written.into_inner().unwrap();
        all.sort_unstable();
        assert_eq!(all, items, "every entry written once");
        assert_eq!(threads.into_inner().unwrap().len(), 3, "three threads");
    }

    #[test]
    fn a_run_goes_in_batches_of_at_most_batch_entries() {
        let k = Kernel::new(&[], false);
        let w = k.run(2 * BATCH + 5);
        assert!(w.failed.is_empty() && !w.batch_refused);
        assert_eq!(*k.calls.borrow(), ["batch 0+1024", "batch 1024+1024", "batch 2048+5"]);
        assert_eq!(*k.written.borrow(), (0..2 * BATCH + 5).collect::<Vec<_>>());
    }

    #[test]
    fn a_refused_entry_is_reported_as_its_own_and_the_batch_goes_on_after_it() {
        let k = Kernel::new(&[3, 1030], false);
        let w = k.run(1100);
        let failed: Vec<usize> = w.failed.iter().map(|(i, _)| *i).collect();
        assert_eq!(failed, [3, 1030]);
        assert!(w.failed.iter().all(|(_, e)| e.raw_os_error() == Some(libc::E2BIG)));
        assert!(!w.batch_refused, "a bad entry is not a refused command");
        assert_eq!(
            *k.calls.borrow(),
            ["batch 0+1024", "alone 3", "batch 4+1024", "batch 1028+72", "alone 1030", "batch 1031+69"]
        );
        let expected: Vec<usize> = (0..1100).filter(|i| ![3, 1030].contains(i)).collect();
        assert_eq!(*k.written.borrow(), expected);
    }

    #[test]
    fn a_kernel_that_refuses_the_command_gets_every_entry_one_at_a_time() {
        let k = Kernel::new(&[2], true);
        let w = k.run(5);
        assert!(w.batch_refused);
        let failed: Vec<usize> = w.failed.iter().map(|(i, _)| *i).collect();
        assert_eq!(failed, [2]);
        assert_eq!(*k.calls.borrow(), ["batch 0+5", "alone 0", "alone 1", "alone 2", "alone 3", "alone 4"]);
        assert_eq!(*k.written.borrow(), [0, 1, 3, 4]);
    }

    #[test]
    fn a_batch_delete_stopped_by_a_missing_key_goes_on_batched() {
        // ENOENT stops a batch delete; alone, the key "is deleted".
        let calls = RefCell::new(Vec::new());
        let w = run_batches(
            4,
            |i| {
                calls.borrow_mut().push(format!("alone {i}"));
                Ok(())
            },
            |at| {
                calls.borrow_mut().push(format!("batch {at}"));
                let done = if at == 0 { 0 } else { 4 - at };
                (4 - at, if at == 0 { Err(BatchStop { done, error: err(libc::ENOENT) }) } else { Ok(()) })
            },
        );
        assert!(w.failed.is_empty() && !w.batch_refused);
        assert_eq!(*calls.borrow(), ["batch 0", "alone 0", "batch 1"]);
    }

    #[test]
    fn a_command_refused_without_a_count_written_back_gets_every_entry_one_at_a_time() {
        // Kernels answer a map type without batches before touching the
        // count: it reads back as the count sent.
        let calls = RefCell::new(Vec::new());
        let written = RefCell::new(Vec::new());
        let alone = |i: usize| {
            calls.borrow_mut().push(format!("alone {i}"));
            written.borrow_mut().push(i);
            Ok(())
        };
        let w = run_batches(3, alone, |at| {
            calls.borrow_mut().push(format!("batch {at}"));
            let mut a = attr();
            a.batch.count = (3 - at) as u32;
            (3 - at, batch_result(Err(err(524)), &a, 3 - at))
        });
        assert!(w.batch_refused && w.failed.is_empty());
        assert_eq!(*calls.borrow(), ["batch 0", "alone 0", "alone 1", "alone 2"]);
        assert_eq!(*written.borrow(), [0, 1, 2], "no entry skipped");
    }

    #[test]
    fn a_first_entry_refused_alone_too_is_a_bad_entry_not_a_refused_command() {
        let k = Kernel::new(&[0], false);
        let w = k.run(3);
        assert!(!w.batch_refused);
        assert_eq!(*k.calls.borrow(), ["batch 0+3", "alone 0", "batch 1+2"]);
        assert_eq!(*k.written.borrow(), [1, 2]);
    }
}
