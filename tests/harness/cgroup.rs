use std::fs;
use std::path::{Path, PathBuf};

/// A cgroup v2 dir of the test's own, under the machine's cgroup2 mount.
/// Removed on drop (processes the test put in it must have exited).
pub struct Cgroup {
    path: PathBuf,
}

/// Where cgroup2 is mounted (/sys/fs/cgroup, or /sys/fs/cgroup/unified on
/// hybrid hosts).
pub fn cgroup2_root() -> PathBuf {
    let mounts = fs::read_to_string("/proc/self/mounts").expect("read /proc/self/mounts");
    mounts
        .lines()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .find(|f| f.len() > 2 && f[2] == "cgroup2")
        .map(|f| PathBuf::from(f[1]))
        .expect("a cgroup2 mount is needed for connect-time tests")
}

impl Cgroup {
    pub fn new() -> Cgroup {
        let path = cgroup2_root().join(crate::unique("hm-test"));
        fs::create_dir(&path).expect("create test cgroup");
        Cgroup { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Moves a process into this cgroup.
    pub fn add(&self, pid: u32) {
        fs::write(self.path.join("cgroup.procs"), pid.to_string()).expect("move process into test cgroup");
    }
}

impl Default for Cgroup {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Retry briefly: a killed process leaves the cgroup asynchronously.
        for _ in 0..50 {
            if fs::remove_dir(&self.path).is_ok() || !self.path.exists() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}
