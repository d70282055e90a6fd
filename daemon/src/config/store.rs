//! The config dir as the daemon sees it over time: every `*.toml` read in
//! lexical order, each parsed on its own, and the last good version of each
//! file kept so that a broken edit never takes away what the file declared
//! before (DESIGN.md, "Configuration contract").

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::error::{ConfigError, Source};
use super::merge::merge;
use super::types::{Config, FileConfig};
use super::validate::parse_file;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
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
pub struct FileReport {
    pub path: PathBuf,
    pub state: FileState,
    pub errors: Vec<ConfigError>,
}

#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: Config,
    pub files: Vec<FileReport>,
}

impl Loaded {
    pub fn rejected(&self) -> impl Iterator<Item = &FileReport> {
        self.files.iter().filter(|f| f.state != FileState::Applied)
    }
}

#[derive(Debug, thiserror::Error)]
#[error("cannot read config dir {}: {source}", dir.display())]
pub struct DirError {
    pub dir: PathBuf,
    #[source]
    pub source: io::Error,
}

/// Remembers each file's last good version between loads.
#[derive(Debug, Default)]
pub struct ConfigStore {
    last_good: BTreeMap<PathBuf, FileConfig>,
}

impl ConfigStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads the whole dir and returns the configuration in force.
    pub fn load(&mut self, dir: &Path) -> Result<Loaded, DirError> {
        let paths = list_drop_ins(dir).map_err(|source| DirError { dir: dir.to_path_buf(), source })?;

        // Parse every file alone.
        let parsed: Vec<(PathBuf, Result<FileConfig, Vec<ConfigError>>)> = paths
            .into_iter()
            .map(|p| {
                let r = read_and_parse(&p);
                (p, r)
            })
            .collect();

        // Offer each file's versions: the new one if it parsed, then the
        // last good one if it differs.
        let offers: Vec<(PathBuf, Vec<&FileConfig>)> = parsed
            .iter()
            .map(|(path, result)| {
                let mut versions = Vec::new();
                if let Ok(new) = result {
                    versions.push(new);
                }
                if let Some(old) = self.last_good.get(path) {
                    if versions.first() != Some(&old) {
                        versions.push(old);
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
            files.push(FileReport { path: path.clone(), state, errors });
        }
        // Files that disappeared lose their last good version with them.
        self.last_good = next_last_good;
        Ok(Loaded { config, files })
    }
}

/// The drop-ins of a dir: regular files (or links to them) named `*.toml`,
/// not hidden (editors' swap and backup files are), in lexical order.
pub fn list_drop_ins(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.starts_with('.') || !name.ends_with(".toml") || name.len() == ".toml".len() {
            continue;
        }
        let path = entry.path();
        match fs::metadata(&path) {
            Ok(meta) if meta.is_file() => out.push(path),
            Ok(_) => {}
            // A dangling link or a file removed while listing: skip it.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(_) => out.push(path), // reading it will report the error
        }
    }
    out.sort();
    Ok(out)
}

fn read_and_parse(path: &Path) -> Result<FileConfig, Vec<ConfigError>> {
    let bytes = fs::read(path).map_err(|e| {
        vec![ConfigError {
            file: path.to_path_buf(),
            line: 1,
            column: 1,
            key: None,
            message: format!("cannot read the file: {e}"),
        }]
    })?;
    let text = String::from_utf8(bytes).map_err(|e| {
        let offset = e.utf8_error().valid_up_to();
        let text = String::from_utf8_lossy(&e.into_bytes()[..offset]).into_owned();
        let src = Source::new(path, &text);
        vec![src.error(&(offset..offset), None, "the file is not valid UTF-8 text".to_string())]
    })?;
    parse_file(&Source::new(path, &text))
}

/// `hostmesh check`: every error of every file, with no history.
pub fn check_dir(dir: &Path) -> Result<Loaded, DirError> {
    ConfigStore::new().load(dir)
}
