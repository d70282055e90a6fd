use std::fs;
use std::path::{Path, PathBuf};

/// A scratch dir under /tmp, removed on drop. Any mount below it (a
/// daemon's bpffs) is detached first, which also releases its pins.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub fn new(prefix: &str) -> TempDir {
        let path = std::env::temp_dir().join(crate::unique(prefix));
        fs::create_dir_all(&path).expect("create temp dir");
        TempDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn join(&self, p: &str) -> PathBuf {
        self.path.join(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let prefix = format!("{}/", self.path.display());
        let mut below: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(1))
            .filter(|m| m.starts_with(&prefix) || *m == self.path.to_str().unwrap_or(""))
            .collect();
        below.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in below {
            let _ = nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH);
        }
        let _ = fs::remove_dir_all(&self.path);
    }
}
