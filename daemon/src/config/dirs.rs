//! The three config dirs and which of their drop-ins are in force, as
//! systemd orders its own drop-ins (README.md, "Configuration"): the
//! admin's dir (`/etc/hostmesh`), a runtime dir (`/run/hostmesh.d`, for
//! tools that generate drop-ins until the next boot) and the vendor's
//! (`/usr/lib/hostmesh`, for packages). A name is the file's identity: the
//! first dir holding an entry of that name wins it and the same name in a
//! later dir is masked; a winner that is a symlink to `/dev/null` masks
//! the name away. The winners are read in name order, whatever their dir.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// Whose a config dir is, in the order of precedence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum DirRole {
    Admin,
    Runtime,
    Vendor,
}

/// The config dirs, in the order of precedence. Only the admin's must
/// exist; a runtime or vendor dir that does not holds nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConfigDirs {
    dirs: Vec<(DirRole, PathBuf)>,
}

impl ConfigDirs {
    pub(crate) fn new(admin: PathBuf, runtime: PathBuf, vendor: PathBuf) -> Self {
        ConfigDirs { dirs: vec![(DirRole::Admin, admin), (DirRole::Runtime, runtime), (DirRole::Vendor, vendor)] }
    }

    /// One dir alone (`diff` reads the copies of the files in force so;
    /// unit tests).
    pub(crate) fn only(admin: PathBuf) -> Self {
        ConfigDirs { dirs: vec![(DirRole::Admin, admin)] }
    }

    /// The admin's dir: the one that must exist.
    pub(crate) fn admin(&self) -> &Path {
        &self.dirs[0].1
    }

    /// Every dir, first in precedence first.
    pub(crate) fn in_order(&self) -> impl Iterator<Item = (DirRole, &Path)> {
        self.dirs.iter().map(|(r, p)| (*r, p.as_path()))
    }
}

/// An entry named like a drop-in that is not read, and why (not a regular
/// file, a dangling link, still open for writing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Skipped {
    pub path: PathBuf,
    pub reason: String,
}

/// A drop-in that another of the same name hides.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Masked {
    pub path: PathBuf,
    /// The entry that won the name.
    pub by: PathBuf,
    /// The winner is a symlink to /dev/null: the name is masked away.
    pub by_null: bool,
}

/// A drop-in in force, and why its dir is not trusted if it is not.
#[derive(Debug, Clone)]
pub(crate) struct Winner {
    pub path: PathBuf,
    pub dir_unsafe: Option<crate::trust::Unsafe>,
}

/// What the dirs hold: the winning drop-ins in name order, the entries
/// that won a name but are not regular files, and the masked ones.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    pub files: Vec<Winner>,
    pub skipped: Vec<Skipped>,
    pub masked: Vec<Masked>,
}

/// Lists the drop-ins of every dir. The admin's dir must be readable; a
/// runtime or vendor dir that does not exist holds nothing.
pub(crate) fn list(dirs: &ConfigDirs) -> Result<Listing, (PathBuf, io::Error)> {
    // Name -> the entries of that name, first in precedence first.
    let mut by_name: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    let mut trust: BTreeMap<PathBuf, Option<crate::trust::Unsafe>> = BTreeMap::new();
    for (role, dir) in dirs.in_order() {
        let names = match names_in(dir) {
            Ok(n) => n,
            Err(e) if role != DirRole::Admin && e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err((dir.to_path_buf(), e)),
        };
        trust.insert(dir.to_path_buf(), dir_trust(dir).err());
        for name in names {
            by_name.entry(name.clone()).or_default().push(dir.join(name));
        }
    }
    let mut out = Listing::default();
    for entries in by_name.into_values() {
        let (winner, hidden) = entries.split_first().expect("a name has an entry");
        let by_null = is_null_link(winner);
        out.masked.extend(hidden.iter().map(|p| Masked { path: p.clone(), by: winner.clone(), by_null }));
        if by_null {
            continue;
        }
        match fs::metadata(winner) {
            Ok(meta) if meta.is_file() => {}
            Ok(meta) => {
                let reason = format!("{}, not a regular file", super::read::kind_of(&meta));
                out.skipped.push(Skipped { path: winner.clone(), reason });
                continue;
            }
            // A file removed while listing is simply gone.
            Err(e) if e.kind() == io::ErrorKind::NotFound && fs::symlink_metadata(winner).is_err() => continue,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let reason = "a symlink to nothing (dangling)".to_string();
                out.skipped.push(Skipped { path: winner.clone(), reason });
                continue;
            }
            Err(_) => {} // reading it will report the error
        }
        let dir_unsafe = winner.parent().and_then(|d| trust.get(d).cloned().flatten());
        out.files.push(Winner { path: winner.clone(), dir_unsafe });
    }
    Ok(out)
}

/// The names in `dir` that are drop-ins' names: `*.toml`, not hidden
/// (editors' swap and backup files are).
fn names_in(dir: &Path) -> io::Result<Vec<String>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let Ok(name) = entry.file_name().into_string() else { continue };
        if name.starts_with('.') || !name.ends_with(".toml") || name.len() == ".toml".len() {
            continue;
        }
        out.push(name);
    }
    Ok(out)
}

/// A symlink whose target is `/dev/null`, as systemd masks a unit.
fn is_null_link(path: &Path) -> bool {
    fs::read_link(path).is_ok_and(|t| t == Path::new("/dev/null"))
}

fn dir_trust(dir: &Path) -> Result<(), crate::trust::Unsafe> {
    use std::os::unix::fs::MetadataExt;
    match fs::metadata(dir) {
        Ok(m) => crate::trust::check_trusted(dir, m.uid(), m.mode()),
        Err(_) => Ok(()), // listing it already worked or failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    struct Dirs(PathBuf);
    impl Drop for Dirs {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn dirs(tag: &str) -> (Dirs, ConfigDirs) {
        let root = std::env::temp_dir().join(format!("hm-dirs-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        for d in ["etc", "run", "usr"] {
            fs::create_dir_all(root.join(d)).unwrap();
            fs::set_permissions(root.join(d), fs::Permissions::from_mode(0o755)).unwrap();
        }
        let c = ConfigDirs::new(root.join("etc"), root.join("run"), root.join("usr"));
        (Dirs(root), c)
    }

    fn write(p: PathBuf) {
        fs::write(&p, "").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
    }

    fn names(l: &Listing, root: &Path) -> Vec<String> {
        l.files.iter().map(|w| w.path.strip_prefix(root).unwrap().display().to_string()).collect()
    }

    #[test]
    fn the_first_dir_with_a_name_wins_it_and_winners_are_read_in_name_order() {
        let (d, c) = dirs("order");
        write(d.0.join("usr/10-a.toml"));
        write(d.0.join("usr/30-c.toml"));
        write(d.0.join("run/30-c.toml"));
        write(d.0.join("etc/20-b.toml"));
        write(d.0.join("etc/30-c.toml"));
        write(d.0.join("etc/.30-c.toml.swp"));
        let l = list(&c).unwrap();
        assert_eq!(names(&l, &d.0), ["usr/10-a.toml", "etc/20-b.toml", "etc/30-c.toml"]);
        let masked: Vec<_> = l.masked.iter().map(|m| (m.path.clone(), m.by.clone(), m.by_null)).collect();
        assert_eq!(
            masked,
            [
                (d.0.join("run/30-c.toml"), d.0.join("etc/30-c.toml"), false),
                (d.0.join("usr/30-c.toml"), d.0.join("etc/30-c.toml"), false)
            ]
        );
    }

    #[test]
    fn a_symlink_to_dev_null_masks_the_name_away_and_a_missing_runtime_or_vendor_dir_holds_nothing() {
        let (d, c) = dirs("null");
        write(d.0.join("usr/10-a.toml"));
        symlink("/dev/null", d.0.join("run/10-a.toml")).unwrap();
        let l = list(&c).unwrap();
        assert!(l.files.is_empty() && l.skipped.is_empty(), "{l:?}");
        assert_eq!(l.masked.len(), 1);
        assert!(l.masked[0].by_null && l.masked[0].path == d.0.join("usr/10-a.toml"));

        fs::remove_dir_all(d.0.join("run")).unwrap();
        fs::remove_dir_all(d.0.join("usr")).unwrap();
        assert!(list(&c).unwrap().files.is_empty());
        fs::remove_dir_all(d.0.join("etc")).unwrap();
        let (dir, e) = list(&c).unwrap_err();
        assert_eq!((dir, e.kind()), (d.0.join("etc"), io::ErrorKind::NotFound));
    }

    #[test]
    fn a_winner_that_is_not_a_file_is_skipped_and_still_masks_the_vendor_s() {
        let (d, c) = dirs("skip");
        write(d.0.join("usr/10-a.toml"));
        symlink(d.0.join("nowhere"), d.0.join("etc/10-a.toml")).unwrap();
        let l = list(&c).unwrap();
        assert!(l.files.is_empty());
        assert_eq!(l.skipped.len(), 1);
        assert_eq!(l.masked[0].path, d.0.join("usr/10-a.toml"));
    }

    #[test]
    fn a_dir_others_can_write_marks_its_winners_untrusted() {
        let (d, c) = dirs("trust");
        write(d.0.join("usr/10-a.toml"));
        write(d.0.join("etc/20-b.toml"));
        fs::set_permissions(d.0.join("usr"), fs::Permissions::from_mode(0o777)).unwrap();
        let l = list(&c).unwrap();
        assert!(l.files[0].dir_unsafe.as_ref().is_some_and(|u| u.to_string().contains("writable by group and others")));
        assert!(l.files[1].dir_unsafe.is_none());
    }
}
