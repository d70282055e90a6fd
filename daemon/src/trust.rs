//! What hostmesh trusts on disk, for the config dir and its files as for
//! the state dir: the one rule, in one place. A leaf: it imports nothing of
//! the crate.

use std::path::{Path, PathBuf};

/// A file or dir that others could have written, like sshd's StrictModes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unsafe {
    #[error("{} is owned by uid {uid}, not root; fix: chown root {}", path.display(), path.display())]
    Owner { path: PathBuf, uid: u32 },
    #[error("{} is writable by {who} (mode {mode:04o}); fix: chmod go-w {}", path.display(), path.display())]
    Writable { path: PathBuf, who: &'static str, mode: u32 },
}

/// The one rule for what hostmesh trusts: owned by root (or the uid the
/// daemon runs as) and writable by no group and no other user.
pub(crate) fn check_trusted(path: &Path, uid: u32, mode: u32) -> Result<(), Unsafe> {
    let me = nix::unistd::geteuid().as_raw();
    if uid != 0 && uid != me {
        return Err(Unsafe::Owner { path: path.to_path_buf(), uid });
    }
    let who = match (mode & 0o020 != 0, mode & 0o002 != 0) {
        (true, true) => "group and others",
        (true, false) => "its group",
        (false, true) => "others",
        (false, false) => return Ok(()),
    };
    Err(Unsafe::Writable { path: path.to_path_buf(), who, mode: mode & 0o7777 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trust_needs_root_and_no_group_or_other_write() {
        let p = Path::new("/etc/hostmesh/10-web.toml");
        assert_eq!(check_trusted(p, 0, 0o100644), Ok(()));
        assert_eq!(check_trusted(p, 0, 0o100600), Ok(()));
        let e = check_trusted(p, 0, 0o100664).unwrap_err();
        assert_eq!(
            e.to_string(),
            "/etc/hostmesh/10-web.toml is writable by its group (mode 0664); fix: chmod go-w /etc/hostmesh/10-web.toml"
        );
        assert!(matches!(check_trusted(p, 0, 0o100666), Err(Unsafe::Writable { who: "group and others", .. })));
        assert!(matches!(check_trusted(p, 0, 0o40777), Err(Unsafe::Writable { mode: 0o777, .. })));
        let e = check_trusted(p, 1000, 0o100644).unwrap_err();
        assert!(e.to_string().contains("owned by uid 1000"), "{e}");
    }
}
