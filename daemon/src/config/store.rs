//! The config dirs as the daemon sees them over time: every `*.toml` in
//! force (`dirs`) read in name order, each parsed on its own, and the last good version of each
//! file kept so that a broken edit never takes away what the file declared
//! before (README.md, "Configuration").

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

use super::dirs::{ConfigDirs, Skipped, Winner};
use super::error::{ConfigError, Source};
use super::merge::merge;
use super::types::{Config, FileConfig};
use super::validate::parse_file;

/// A file's state, as the status file stores it (`applied`,
/// `rejected_keeping_last_good`, `rejected`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileState {
    /// The file as it is now is in force.
    Applied,
    /// The file is rejected; its last good version stays in force.
    RejectedKeepingLastGood,
    /// The file is rejected and nothing from it is in force.
    Rejected,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct FileReport {
    pub path: PathBuf,
    pub state: FileState,
    pub errors: Vec<ConfigError>,
}

#[derive(Debug, Clone)]
pub(crate) struct Loaded {
    /// Shared, not copied, with whoever reads it off the daemon's thread
    /// (the metrics endpoint).
    pub config: std::sync::Arc<Config>,
    pub files: Vec<FileReport>,
    /// Entries named like drop-ins that were not read, and why (not a
    /// regular file, a dangling link, still open for writing).
    pub skipped: Vec<Skipped>,
    /// Drop-ins hidden by one of the same name in an earlier dir.
    pub masked: Vec<super::dirs::Masked>,
    /// Files parsed by this load; the others' text was unchanged.
    pub parsed_files: usize,
}

impl Loaded {
    pub(crate) fn rejected(&self) -> impl Iterator<Item = &FileReport> {
        self.files.iter().filter(|f| f.state != FileState::Applied)
    }
}

#[derive(Debug, thiserror::Error)]
#[error("cannot read config dir {}: {source}", dir.display())]
pub(crate) struct DirError {
    pub dir: PathBuf,
    #[source]
    pub source: io::Error,
}

/// Remembers each file's last good version between loads, and what each
/// file's text parsed to, so a load parses only files whose text changed
/// (parsing is a function of the path and the bytes alone).
#[derive(Debug, Default)]
pub(crate) struct ConfigStore {
    last_good: BTreeMap<PathBuf, Arc<FileConfig>>,
    parsed: BTreeMap<PathBuf, Parsed>,
    /// Files parsed since the store was made.
    parses: usize,
    /// Files read since the store was made.
    reads: usize,
}

/// What one file parsed to: shared between loads (an unchanged file of
/// 100,000 services is not copied), or its errors.
type FileResult = Result<Arc<FileConfig>, Vec<ConfigError>>;

/// One file's text, by its length and hash, and what it parsed to; and
/// the file's identity and times when it was read.
#[derive(Debug, Clone)]
struct Parsed {
    len: usize,
    hash: u64,
    stamp: Stamp,
    result: FileResult,
}

/// What changes when a file is written, replaced or re-permissioned:
/// device and inode, size, and the modification and change times (ns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(m: &fs::Metadata) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

/// Which files a load reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reread {
    /// Every file, whole (its hash decides whether it is parsed again).
    All,
    /// Only files whose stamp changed: a file event's load costs what
    /// changed, not the size of the whole config.
    Changed,
}

impl ConfigStore {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The length and hash of the text of `path` that this store's last
    /// load parsed (or found unchanged); `None` for a file it has not.
    pub(crate) fn text_of(&self, path: &Path) -> Option<(usize, u64)> {
        self.parsed.get(path).map(|p| (p.len, p.hash))
    }

    /// How many files this store has read (opened and read, whole or in
    /// pieces to hash).
    #[cfg(test)]
    pub(crate) fn reads(&self) -> usize {
        self.reads
    }

    /// How many files this store has parsed.
    #[cfg(test)]
    pub(crate) fn parses(&self) -> usize {
        self.parses
    }

    /// Reads every drop-in in force of the dirs and returns the
    /// configuration in force (SIGHUP, the periodic resync, the first
    /// load).
    pub(crate) fn load(&mut self, dirs: &ConfigDirs) -> Result<Loaded, DirError> {
        self.load_with(dirs, Reread::All)
    }

    /// As `load`, reading only the files whose inode, size or times
    /// changed since they were last read (after a file event).
    pub(crate) fn load_changed(&mut self, dirs: &ConfigDirs) -> Result<Loaded, DirError> {
        self.load_with(dirs, Reread::Changed)
    }

    fn load_with(&mut self, dirs: &ConfigDirs, reread: Reread) -> Result<Loaded, DirError> {
        let listing = super::dirs::list(dirs).map_err(|(dir, source)| DirError { dir, source })?;
        let mut skipped = listing.skipped;

        // Parse every file alone. One still being written counts as its
        // last good version (or as absent) until its writer closes it.
        let mut parsed: Vec<(PathBuf, FileResult)> = Vec::new();
        let parses_before = self.parses;
        for Winner { path: p, dir_unsafe } in listing.files {
            // A dir others can write lets them plant drop-ins: nothing in
            // it is obeyed.
            if let Some(u) = &dir_unsafe {
                parsed.push((p.clone(), Err(vec![whole_file_error(&p, format!("not read: {u}"))])));
                continue;
            }
            match self.read_and_parse(&p, reread) {
                Ok(r) => parsed.push((p, r)),
                Err(NotRead { errors: Some(errors), .. }) => parsed.push((p, Err(errors))),
                Err(reason) => match self.last_good.get(&p) {
                    Some(old) if reason.keeps_last_good => parsed.push((p.clone(), Ok(old.clone()))),
                    _ => skipped.push(Skipped { path: p, reason: reason.text }),
                },
            }
        }

        // Offer each file's versions: the new one if it parsed, then the
        // last good one if it differs.
        let offers: Vec<(PathBuf, Vec<&FileConfig>)> = parsed
            .iter()
            .map(|(path, result)| {
                let mut versions = Vec::new();
                if let Ok(new) = result {
                    versions.push(&**new);
                }
                if let Some(old) = self.last_good.get(path) {
                    // The same parse (unchanged text) is the same Arc: no
                    // need to compare 100,000 services to learn it.
                    let same = result.as_ref().is_ok_and(|new| Arc::ptr_eq(new, old) || **new == **old);
                    if !same {
                        versions.push(&**old);
                    }
                }
                (path.clone(), versions)
            })
            .collect();
        let (config, merged) = merge(&offers);

        let mut files = Vec::new();
        let mut next_last_good = BTreeMap::new();
        for ((path, result), m) in parsed.iter().zip(&merged) {
            let new_ok = result.is_ok();
            let (state, errors) = match (result, m.accepted) {
                (Ok(_), Some(0)) => (FileState::Applied, Vec::new()),
                (Ok(_), Some(_)) => (FileState::RejectedKeepingLastGood, m.conflicts.clone()),
                (Ok(_), None) => (FileState::Rejected, m.conflicts.clone()),
                (Err(errs), Some(_)) => (FileState::RejectedKeepingLastGood, errs.clone()),
                (Err(errs), None) => (FileState::Rejected, errs.clone()),
            };
            match (state, new_ok) {
                (FileState::Applied, true) => {
                    next_last_good.insert(path.clone(), result.as_ref().cloned().unwrap_or_default());
                }
                _ => {
                    if let Some(old) = self.last_good.remove(path) {
                        next_last_good.insert(path.clone(), old);
                    }
                }
            }
            files.push(FileReport { path: path.clone(), state, errors: bounded(errors) });
        }
        // Files that disappeared lose their last good version with them.
        self.last_good = next_last_good;
        let present: std::collections::BTreeSet<&PathBuf> = files.iter().map(|f| &f.path).collect();
        self.parsed.retain(|p, _| present.contains(p));
        let parsed_files = self.parses - parses_before;
        Ok(Loaded { config: std::sync::Arc::new(config), files, skipped, masked: listing.masked, parsed_files })
    }
}

fn whole_file_error(path: &Path, message: String) -> ConfigError {
    ConfigError { file: path.to_path_buf(), line: 1, column: 1, key: None, message }
}

/// The most errors reported per file; the rest are counted in one more.
pub(crate) const ERRORS_PER_FILE: usize = 20;
/// The longest message reported, in characters.
const MESSAGE_MAX: usize = 240;

/// At most ERRORS_PER_FILE errors, then "and N more"; keys and messages
/// cut so that one line stays short whatever the file holds.
fn bounded(mut errors: Vec<ConfigError>) -> Vec<ConfigError> {
    let more = errors.len().saturating_sub(ERRORS_PER_FILE);
    errors.truncate(ERRORS_PER_FILE);
    for e in &mut errors {
        e.key = e.key.as_deref().map(super::error::clip);
        if e.message.chars().count() > MESSAGE_MAX {
            e.message = format!("{}...", e.message.chars().take(MESSAGE_MAX).collect::<String>());
        }
    }
    if more > 0 {
        let last = errors.last().cloned().expect("more than ERRORS_PER_FILE errors");
        errors.push(ConfigError {
            key: None,
            message: format!("and {more} more errors in this file (the first {ERRORS_PER_FILE} are shown)"),
            ..last
        });
    }
    errors
}

/// A drop-in that was not parsed this time: skipped (and whether its last
/// good version stays in force meanwhile), or rejected with these errors.
struct NotRead {
    text: String,
    keeps_last_good: bool,
    errors: Option<Vec<ConfigError>>,
}

impl NotRead {
    fn errors(path: &Path, message: String) -> NotRead {
        NotRead { text: String::new(), keeps_last_good: false, errors: Some(vec![whole_file_error(path, message)]) }
    }
}

impl ConfigStore {
    /// A file read whole and parsed, or its earlier parse when its text is
    /// the same as then.
    fn read_and_parse(&mut self, path: &Path, reread: Reread) -> Result<FileResult, NotRead> {
        // Stamped before reading: a write in between changes the stamp
        // after it, and the next load reads the file again.
        let stamp = fs::metadata(path).ok().filter(|m| m.is_file()).map(|m| (Stamp::of(&m), m));
        if let (Reread::Changed, Some((stamp, meta)), Some(p)) = (reread, &stamp, self.parsed.get(path)) {
            use std::os::unix::fs::MetadataExt;
            if p.stamp == *stamp && crate::trust::check_trusted(path, meta.uid(), meta.mode()).is_ok() {
                return Ok(p.result.clone());
            }
        }
        self.reads += 1;
        let stamp = stamp.map(|(s, _)| s);
        // A reload of every file first only hashes one parsed before, as
        // it reads it: most are unchanged, and a file of 100,000 services
        // is then never held whole. A file whose stamp changed is read
        // whole at once (hashing it first would read it twice).
        if reread == Reread::All && self.parsed.contains_key(path) {
            if let Some(kept) = self.same_text(path, hash_whole(path)?, stamp) {
                return Ok(kept);
            }
        }
        let bytes = read_whole(path)?;
        let (len, hash) = super::read::TextHash::of(&bytes);
        if let Some(kept) = self.same_text(path, (len, hash), stamp) {
            return Ok(kept);
        }
        let result = parse_bytes(path, bytes).map(Arc::new);
        self.parses += 1;
        match stamp {
            Some(stamp) => {
                self.parsed.insert(path.to_path_buf(), Parsed { len, hash, stamp, result: result.clone() });
            }
            // Not statable (gone meanwhile): not cached.
            None => {
                self.parsed.remove(path);
            }
        }
        Ok(result)
    }

    /// `path`'s earlier parse, restamped, when its text (length and hash)
    /// is the same as then.
    fn same_text(&mut self, path: &Path, (len, hash): (usize, u64), stamp: Option<Stamp>) -> Option<FileResult> {
        let p = self.parsed.get_mut(path).filter(|p| p.len == len && p.hash == hash)?;
        if let Some(s) = stamp {
            p.stamp = s;
        }
        Some(p.result.clone())
    }
}

/// A drop-in's bytes, or why it is not read now (an unsafe or unreadable
/// file reads as a file of errors).
fn read_whole(path: &Path) -> Result<Vec<u8>, NotRead> {
    not_read(path, super::read::read_drop_in(path))
}

/// A drop-in's length and hash (`read::hash_drop_in`), or why it is not
/// read now, as `read_whole`.
fn hash_whole(path: &Path) -> Result<(usize, u64), NotRead> {
    not_read(path, super::read::hash_drop_in(path))
}

/// What was read, or why it was not read now.
fn not_read<T>(path: &Path, read: Result<T, super::read::Unread>) -> Result<T, NotRead> {
    use super::read::Unread;
    let bytes = match read {
        Ok(b) => b,
        Err(Unread::BeingWritten) => {
            return Err(NotRead {
                text: "still open for writing; read when it is closed".into(),
                keeps_last_good: true,
                errors: None,
            })
        }
        Err(Unread::NotAFile(kind)) => {
            return Err(NotRead { text: format!("{kind}, not a regular file"), keeps_last_good: false, errors: None })
        }
        Err(Unread::Unsafe(u)) => return Err(NotRead::errors(path, format!("not read: {u}"))),
        Err(Unread::Io(e)) => return Err(NotRead::errors(path, format!("cannot read the file: {e}"))),
    };
    Ok(bytes)
}

/// One file's bytes, as read, to its configuration or its errors.
pub(super) fn parse_bytes(path: &Path, bytes: Vec<u8>) -> Result<FileConfig, Vec<ConfigError>> {
    let text = match String::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => {
            let offset = e.utf8_error().valid_up_to();
            let text = String::from_utf8_lossy(&e.into_bytes()[..offset]).into_owned();
            let src = Source::new(path, &text);
            return Err(vec![src.error(&(offset..offset), None, "the file is not valid UTF-8 text".to_string())]);
        }
    };
    parse_file(&Source::new(path, &text))
}

/// `hostmesh check`: every error of every file, with no history.
pub(crate) fn check_dir(dirs: &ConfigDirs) -> Result<Loaded, DirError> {
    ConfigStore::new().load(dirs)
}
