//! Configuration errors: always a file, a line, a column, the key, and one
//! plain sentence.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
pub(crate) struct ConfigError {
    pub file: PathBuf,
    pub line: usize,
    pub column: usize,
    /// The key the error is about (`port`, `service.backends`), when there is one.
    pub key: Option<String>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: {}", self.file.display(), self.line, self.column, self.message)
    }
}

/// Maps byte offsets in one file's text to 1-based line and column.
pub(crate) struct Source<'a> {
    pub path: &'a Path,
    pub text: &'a str,
    /// The file's line number of `text`'s first line: 1, or more for a
    /// part of a file (`part`).
    first_line: usize,
    /// Byte offset of each line's start, computed on first use: every
    /// lookup is then a binary search, not a scan from the top (a file of
    /// 30,000 services asks 60,000 times).
    line_starts: std::cell::OnceCell<Vec<usize>>,
    /// `path`, shared by the origins of every object it declares.
    shared_path: std::cell::OnceCell<Arc<Path>>,
}

impl<'a> Source<'a> {
    pub(crate) fn new(path: &'a Path, text: &'a str) -> Self {
        Source {
            path,
            text,
            first_line: 1,
            line_starts: std::cell::OnceCell::new(),
            shared_path: std::cell::OnceCell::new(),
        }
    }

    /// The lines of `range` (which starts a line) as a source of their
    /// own, whose positions are still the file's.
    pub(crate) fn part(&self, range: std::ops::Range<usize>) -> Source<'a> {
        let (line, _) = self.line_col(range.start);
        Source {
            path: self.path,
            text: &self.text[range],
            first_line: line,
            line_starts: std::cell::OnceCell::new(),
            shared_path: self.shared_path.clone(),
        }
    }

    /// The path, shared: each origin holds a count, not a copy.
    pub(crate) fn shared_path(&self) -> Arc<Path> {
        Arc::clone(self.shared_path.get_or_init(|| Arc::from(self.path)))
    }

    /// 1-based (line, column); the column counts characters, not bytes.
    pub(crate) fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = floor_char_boundary(self.text, offset.min(self.text.len()));
        let starts = self
            .line_starts
            .get_or_init(|| std::iter::once(0).chain(self.text.match_indices('\n').map(|(i, _)| i + 1)).collect());
        let line = starts.partition_point(|&s| s <= offset);
        let line_start = starts[line - 1];
        let column = self.text[line_start..offset].chars().count() + 1;
        (line + self.first_line - 1, column)
    }

    pub(crate) fn error(&self, span: &std::ops::Range<usize>, key: Option<&str>, message: String) -> ConfigError {
        let (line, column) = self.line_col(span.start);
        ConfigError { file: self.path.to_path_buf(), line, column, key: key.map(str::to_string), message }
    }

    /// The key written at the start of the line holding `offset`
    /// (`port = 0` -> `port`), for errors from the TOML parser, which
    /// report a position but not the key.
    pub(crate) fn key_on_line(&self, offset: usize) -> Option<String> {
        let offset = floor_char_boundary(self.text, offset.min(self.text.len()));
        let start = self.text[..offset].rfind('\n').map_or(0, |i| i + 1);
        let end = self.text[start..].find('\n').map_or(self.text.len(), |i| start + i);
        let line = self.text[start..end].trim_start();
        let (key, _) = line.split_once('=')?;
        let key = key.trim().trim_matches('"');
        let valid = !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        valid.then(|| key.to_string())
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Where a configuration object was declared, for status and errors.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub(crate) struct Origin {
    /// Shared by every object of the file (100,000 services name one).
    #[serde(serialize_with = "path_as_is")]
    pub file: Arc<Path>,
    pub line: usize,
    pub column: usize,
}

impl Origin {
    pub(crate) fn at(src: &Source<'_>, span: &std::ops::Range<usize>) -> Self {
        let (line, column) = src.line_col(span.start);
        Origin { file: src.shared_path(), line, column }
    }
}

fn path_as_is<S: serde::Serializer>(path: &Arc<Path>, s: S) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(&**path, s)
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.file.file_name().map(Path::new).unwrap_or(&self.file);
        write!(f, "{}:{}:{}", name.display(), self.line, self.column)
    }
}

/// The longest a value quoted in a message may be, in characters.
pub(crate) const QUOTE_MAX: usize = 80;

/// `s` cut to QUOTE_MAX characters (with "..." and the full length when
/// cut), for quoting operator input in messages without echoing 200 KB.
pub(crate) fn clip(s: &str) -> String {
    if s.chars().count() <= QUOTE_MAX {
        return s.to_string();
    }
    let head: String = s.chars().take(QUOTE_MAX).collect();
    format!("{head}... ({} characters)", s.chars().count())
}
