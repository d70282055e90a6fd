//! The daemon's state dir (`--state-dir`, default /run/hostmesh): the
//! status file `hostmesh status` reads (so it works while the daemon is
//! down), the sysctl originals and the instance lock. Root writes here, so
//! the dir must be root's alone and nothing in it is followed blindly:
//! files are replaced through a fresh temp file (O_EXCL, random name) and
//! a rename, which replaces a planted symlink instead of writing through it.

mod lock;
mod status;

pub use lock::{InstanceLock, LockError, LOCK_FILE};

pub use status::*;

use crate::trust::{check_trusted, Unsafe};

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The dir in the state dir that holds a copy of each drop-in's text in
/// force, under the file's name, for `hostmesh diff` (`daemon/src/daemon/applied.rs`
/// writes it).
pub const APPLIED_DIR: &str = "applied";

/// Why a state dir (or config dir) cannot be trusted or used.
#[derive(Debug, thiserror::Error)]
pub enum StateDirError {
    #[error("cannot create state dir {}: {source}", dir.display())]
    Create { dir: PathBuf, source: io::Error },
    #[error("state dir {} is not a directory (a symlink or another file is in its place); remove it", dir.display())]
    NotADir { dir: PathBuf },
    #[error("{0}")]
    Unsafe(#[from] Unsafe),
}

/// Creates the state dir (0755) if needed and checks it is a real dir
/// that only root can write.
pub fn prepare_state_dir(dir: &Path) -> Result<(), StateDirError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(|source| StateDirError::Create { dir: dir.to_path_buf(), source })?;
    let meta = fs::symlink_metadata(dir).map_err(|source| StateDirError::Create { dir: dir.to_path_buf(), source })?;
    if !meta.is_dir() {
        return Err(StateDirError::NotADir { dir: dir.to_path_buf() });
    }
    check_trusted(dir, meta.uid(), meta.mode())?;
    Ok(())
}

/// Reads a file hostmesh keeps in the state dir: the one way every such
/// file is read. Never through a symlink (O_NOFOLLOW), only a regular file
/// that root (or hostmesh's own user) owns and nobody else may write (the
/// rule of `trust.rs`), and whole but at most `max` bytes (a larger one is
/// an error naming the cap, never a truncated read).
pub fn read_state_file(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let f = fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("{} is not a regular file", path.display())));
    }
    check_trusted(path, meta.uid(), meta.mode()).map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, e))?;
    if meta.len() > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is {} bytes; hostmesh reads at most {max}", path.display(), meta.len()),
        ));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    f.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("{} grew past {max} bytes", path.display())));
    }
    Ok(bytes)
}

/// A JSON file hostmesh saved in the state dir, read as `read_state_file`
/// reads (at most `max` bytes); `None` when there is none. A file that is
/// not such JSON is an error naming it.
pub fn read_saved_json<T: serde::de::DeserializeOwned>(path: &Path, max: u64) -> io::Result<Option<T>> {
    let bytes = match read_state_file(path, max) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    serde_json::from_slice(&bytes).map(Some).map_err(|e| io::Error::other(format!("{}: {e}", path.display())))
}

/// Saves `value` as JSON at `path` (`write_atomic_with`).
pub fn save_json<T: serde::Serialize>(path: &Path, value: &T) -> io::Result<()> {
    write_atomic_with(path, |w| serde_json::to_writer(w, value).map_err(io::Error::other))
}

/// Writes `bytes` to `path` via a new temporary file (random name, created
/// exclusively, so no planted link is followed) and a rename, so readers
/// never see a partial file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomic_with(path, |w| w.write_all(bytes))
}

/// `write_atomic`, the contents written by `fill` through a buffer: a
/// large file (the status of 100,000 services, ~30 MB of JSON) is never
/// held in memory whole.
pub fn write_atomic_with(path: &Path, fill: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> io::Result<()> {
    write_atomic_as(path, 0o644, true, fill)
}

/// `write_atomic_with`, the file left with `mode`, and synced to disk
/// first when `sync` (a copy that is made again at every start need not
/// be).
pub fn write_atomic_as(
    path: &Path,
    mode: u32,
    sync: bool,
    fill: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("state");
    let tmp = tempfile::Builder::new().prefix(&format!(".{name}.")).suffix(".tmp").tempfile_in(dir)?;
    let mut out = io::BufWriter::with_capacity(64 * 1024, tmp.as_file());
    fill(&mut out)?;
    out.into_inner().map_err(io::IntoInnerError::into_error)?;
    if sync {
        tmp.as_file().sync_data()?;
    }
    // The temp file is 0600; the status is for everyone to read.
    if mode != 0o600 {
        fs::set_permissions(tmp.path(), std::os::unix::fs::PermissionsExt::from_mode(mode))?;
    }
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("hm-state-test-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn state_files_are_read_whole_and_only_when_safe() {
        use std::os::unix::fs::PermissionsExt;
        let dir = scratch("read");
        let file = dir.join("status.json");
        fs::write(&file, "{}").unwrap();
        fs::set_permissions(&file, fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(read_state_file(&file, 2).unwrap(), b"{}");
        let big = read_state_file(&file, 1).unwrap_err();
        assert!(big.to_string().contains("2 bytes; hostmesh reads at most 1"), "{big}");
        fs::set_permissions(&file, fs::Permissions::from_mode(0o664)).unwrap();
        let writable = read_state_file(&file, 100).unwrap_err();
        assert!(writable.to_string().contains("writable by its group"), "{writable}");
        let link = dir.join("linked.json");
        symlink(&file, &link).unwrap();
        assert_eq!(read_state_file(&link, 100).unwrap_err().raw_os_error(), Some(libc::ELOOP), "no symlink followed");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp_file() {
        let dir = scratch("atomic");
        let p = dir.join("status.json");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn atomic_write_replaces_a_planted_link_instead_of_following_it() {
        let dir = scratch("link");
        let victim = dir.join("victim");
        fs::write(&victim, b"keep").unwrap();
        let p = dir.join("status.json");
        symlink(&victim, &p).unwrap();
        // The old predictable temp name, planted too.
        symlink(&victim, dir.join(format!(".status.json.tmp.{}", std::process::id()))).unwrap();
        write_atomic(&p, b"new").unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"keep");
        assert!(!fs::symlink_metadata(&p).unwrap().file_type().is_symlink());
        assert_eq!(fs::read(&p).unwrap(), b"new");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_group_writable_state_dir_is_refused() {
        let dir = scratch("mode");
        let sub = dir.join("state");
        prepare_state_dir(&sub).unwrap();
        assert_eq!(fs::metadata(&sub).unwrap().mode() & 0o777, 0o755);
        fs::set_permissions(&sub, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        let e = prepare_state_dir(&sub).unwrap_err();
        assert!(e.to_string().contains("chmod go-w"), "{e}");
        let link = dir.join("link");
        symlink(&sub, &link).unwrap();
        assert!(matches!(prepare_state_dir(&link), Err(StateDirError::NotADir { .. })));
        fs::remove_dir_all(&dir).unwrap();
    }
}
