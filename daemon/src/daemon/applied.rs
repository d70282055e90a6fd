//! The copies `hostmesh diff` compares a configuration with: `applied/` in
//! the state dir holds the text of each drop-in in force (its last good
//! version, when the file is rejected now) under the file's name, which is
//! unique across the three config dirs. A load costs what changed: a file
//! is copied when its text in force changed, and its copy removed when its
//! name left the configuration. The copies outlive the daemon (a stopped
//! daemon's configuration is still what the kernel holds); `teardown`
//! removes them.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::config::{ConfigStore, FileState, Loaded};

pub(super) struct AppliedCopies {
    dir: PathBuf,
    /// Name -> the length and hash of the text copied; `None` before the
    /// first update (which also removes a former run's copies that are no
    /// longer in force).
    have: Option<BTreeMap<OsString, (usize, u64)>>,
}

impl AppliedCopies {
    pub(super) fn new(state_dir: &Path) -> Self {
        AppliedCopies { dir: state_dir.join(crate::state::APPLIED_DIR), have: None }
    }

    /// Brings the copies in line with `loaded` (what `store` just read);
    /// returns what could not be done, one sentence each.
    pub(super) fn update(&mut self, loaded: &Loaded, store: &ConfigStore) -> Vec<String> {
        if let Err(e) = self.prepare() {
            return vec![format!("cannot keep copies of the files in force in {}: {e}", self.dir.display())];
        }
        let mut problems = Vec::new();
        let have = match &mut self.have {
            Some(h) => h,
            None => {
                // A former run's copies: each one not copied again below
                // is removed.
                let former = former_names(&self.dir).unwrap_or_default();
                self.have.insert(former.into_iter().map(|n| (n, (0, 0))).collect())
            }
        };
        let mut in_force = BTreeSet::new();
        for f in &loaded.files {
            let Some(name) = f.path.file_name() else { continue };
            match f.state {
                FileState::Rejected => continue,
                // Its last good version is in force: its copy stands.
                FileState::RejectedKeepingLastGood => {
                    in_force.insert(name.to_os_string());
                    continue;
                }
                FileState::Applied => {
                    in_force.insert(name.to_os_string());
                }
            }
            let Some(text) = store.text_of(&f.path) else { continue };
            if have.get(name) == Some(&text) {
                continue;
            }
            match copy(&f.path, &self.dir.join(name), text) {
                Ok(true) => {
                    have.insert(name.to_os_string(), text);
                }
                // Written again since it was read: its writer's close
                // brings the load that copies it.
                Ok(false) => {}
                Err(e) => problems.push(format!("cannot copy {} into {}: {e}", f.path.display(), self.dir.display())),
            }
        }
        let gone: Vec<OsString> = have.keys().filter(|n| !in_force.contains(*n)).cloned().collect();
        for name in gone {
            match fs::remove_file(self.dir.join(&name)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => problems.push(format!("cannot remove {}: {e}", self.dir.join(&name).display())),
            }
            have.remove(&name);
        }
        problems
    }

    /// The dir, root's alone (0700): the copies are as private as the
    /// state dir's other files.
    fn prepare(&self) -> io::Result<()> {
        match fs::DirBuilder::new().mode(0o700).create(&self.dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let meta = fs::symlink_metadata(&self.dir)?;
        if !meta.is_dir() {
            return Err(io::Error::other("it is not a directory; remove it"));
        }
        crate::trust::check_trusted(&self.dir, meta.uid(), meta.mode()).map_err(io::Error::other)?;
        if meta.mode() & 0o077 != 0 {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(&self.dir, fs::Permissions::from_mode(0o700))?;
        }
        Ok(())
    }
}

/// The copies a former run left.
fn former_names(dir: &Path) -> io::Result<Vec<OsString>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir)? {
        let name = entry?.file_name();
        if !name.to_string_lossy().starts_with('.') {
            out.push(name);
        }
    }
    Ok(out)
}

/// Copies `from` to `to` a piece at a time (a file of 100,000 services is
/// never held whole) if its text is still the one read (`text`);
/// `Ok(false)`, and `to` as it was, if it is not.
fn copy(from: &Path, to: &Path, text: (usize, u64)) -> io::Result<bool> {
    use crate::config::Unread;
    // Written again, still open for writing, or no longer safe since it
    // was read: the change brings another load, which copies it.
    let mut stale = false;
    let written =
        crate::state::write_atomic_as(to, 0o600, false, |w: &mut dyn Write| {
            match crate::config::copy_drop_in(from, w) {
                Ok(copied) if copied == text => Ok(()),
                Ok(_) | Err(Unread::BeingWritten | Unread::NotAFile(_) | Unread::Unsafe(_)) => {
                    stale = true;
                    Err(io::Error::other("not copied"))
                }
                Err(Unread::Io(e)) => Err(e),
            }
        });
    match written {
        Ok(()) => Ok(true),
        Err(_) if stale => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigDirs;
    use std::os::unix::fs::PermissionsExt;

    fn put(dir: &Path, name: &str, text: &str) {
        let p = dir.join(name);
        fs::write(&p, text).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
    }

    fn copies(dir: &Path) -> BTreeMap<String, String> {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap())
            .map(|e| (e.file_name().into_string().unwrap(), fs::read_to_string(e.path()).unwrap()))
            .collect()
    }

    #[test]
    fn a_copy_follows_each_file_s_text_in_force_and_only_changed_files_are_copied() {
        let root = tempfile::tempdir().unwrap();
        let (conf, state) = (root.path().join("conf"), root.path().join("state"));
        fs::create_dir_all(&conf).unwrap();
        fs::create_dir_all(&state).unwrap();
        let dirs = ConfigDirs::only(conf.clone());
        let web = "[[service]]\nname = \"web\"\nvip = \"10.96.0.10\"\nport = 80\n";
        let api = "[[service]]\nname = \"api\"\nvip = \"10.96.0.20\"\nport = 80\n";
        put(&conf, "a-web.toml", web);
        put(&conf, "b-api.toml", api);
        // A former run's copy of a file since removed.
        fs::create_dir_all(state.join("applied")).unwrap();
        fs::write(state.join("applied/z-old.toml"), "").unwrap();

        let mut store = ConfigStore::new();
        let mut c = AppliedCopies::new(&state);
        let loaded = store.load(&dirs).unwrap();
        assert!(c.update(&loaded, &store).is_empty());
        let applied = state.join("applied");
        assert_eq!(fs::metadata(&applied).unwrap().mode() & 0o777, 0o700);
        assert_eq!(copies(&applied), [("a-web.toml".into(), web.into()), ("b-api.toml".into(), api.into())].into());

        // Broken: the last good version's copy stands. Then the file goes.
        put(&conf, "b-api.toml", "[[service]]\nname = 3\n");
        let loaded = store.load(&dirs).unwrap();
        assert!(c.update(&loaded, &store).is_empty());
        assert_eq!(copies(&applied)["b-api.toml"], api);
        fs::remove_file(conf.join("b-api.toml")).unwrap();
        let web2 = web.replace("port = 80", "port = 81");
        put(&conf, "a-web.toml", &web2);
        let loaded = store.load(&dirs).unwrap();
        assert!(c.update(&loaded, &store).is_empty());
        assert_eq!(copies(&applied), [("a-web.toml".into(), web2.clone())].into());

        // Unchanged: nothing is written again.
        let before = fs::metadata(applied.join("a-web.toml")).unwrap().ino();
        let loaded = store.load(&dirs).unwrap();
        assert!(c.update(&loaded, &store).is_empty());
        assert_eq!(fs::metadata(applied.join("a-web.toml")).unwrap().ino(), before);
    }
}
