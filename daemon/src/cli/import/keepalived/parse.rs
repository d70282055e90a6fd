//! keepalived.conf as a tree of statements: a keyword, its arguments, and
//! the statements of its `{ }` block, each with its file and line;
//! `include GLOB` followed (relative to the including file's directory),
//! `!` and `#` comments, quoted words.

use std::path::{Path, PathBuf};

use super::super::dropin::{ParseError, Where};

/// Deeper than any keepalived configuration nests, files included.
const MAX_DEPTH: usize = 16;
/// More files than an include tree of a real configuration names.
const MAX_FILES: usize = 1000;

#[derive(Debug, Clone)]
pub(super) struct Node {
    pub key: String,
    pub args: Vec<String>,
    pub children: Vec<Node>,
    pub at: Where,
}

impl Node {
    /// The first statement `key` of the block.
    pub(super) fn child(&self, key: &str) -> Option<&Node> {
        self.children.iter().find(|c| c.key == key)
    }

    /// The first argument of the first statement `key` of the block.
    pub(super) fn value(&self, key: &str) -> Option<&str> {
        self.child(key).and_then(|c| c.args.first()).map(String::as_str)
    }
}

#[derive(Debug, PartialEq)]
enum Token {
    Word(String),
    Open,
    Close,
    End,
}

/// Reads `path` and what it includes: the top-level statements.
pub(super) fn read(path: &Path) -> Result<Vec<Node>, ParseError> {
    let mut files = 0;
    read_file(path, 0, &mut files)
}

fn read_file(path: &Path, depth: usize, files: &mut usize) -> Result<Vec<Node>, ParseError> {
    let at = |line| Where { file: path.display().to_string(), line };
    *files += 1;
    if depth > MAX_DEPTH || *files > MAX_FILES {
        return Err(ParseError { at: at(0), why: "includes nest too deep or name too many files".into() });
    }
    let text = std::fs::read_to_string(path).map_err(|e| ParseError { at: at(0), why: e.to_string() })?;
    let tokens = tokenize(&text);
    let mut pos = 0;
    let nodes = block(&tokens, &mut pos, path, false)?;
    let mut out = Vec::with_capacity(nodes.len());
    for n in nodes {
        if n.key != "include" {
            out.push(n);
            continue;
        }
        let pattern =
            n.args.first().ok_or_else(|| ParseError { at: n.at.clone(), why: "include without a file".into() })?;
        let dir = path.parent().unwrap_or(Path::new("."));
        for file in glob(&dir.join(pattern)).map_err(|why| ParseError { at: n.at.clone(), why })? {
            out.extend(read_file(&file, depth + 1, files)?);
        }
    }
    Ok(out)
}

/// Statements up to the end of the tokens, or (`inner`) to the `}` that
/// closes the block.
fn block(tokens: &[(Token, usize)], pos: &mut usize, path: &Path, inner: bool) -> Result<Vec<Node>, ParseError> {
    let at = |line| Where { file: path.display().to_string(), line };
    let mut out = Vec::new();
    while let Some((t, line)) = tokens.get(*pos) {
        *pos += 1;
        match t {
            Token::End => {}
            Token::Close if inner => return Ok(out),
            Token::Close => return Err(ParseError { at: at(*line), why: "'}' closes no block".into() }),
            Token::Open => return Err(ParseError { at: at(*line), why: "'{' without a keyword".into() }),
            Token::Word(key) => {
                let mut node = Node { key: key.clone(), args: Vec::new(), children: Vec::new(), at: at(*line) };
                while let Some((Token::Word(w), _)) = tokens.get(*pos) {
                    node.args.push(w.clone());
                    *pos += 1;
                }
                // A block may open on the next line.
                let mut look = *pos;
                while let Some((Token::End, _)) = tokens.get(look) {
                    look += 1;
                }
                if let Some((Token::Open, _)) = tokens.get(look) {
                    *pos = look + 1;
                    node.children = block(tokens, pos, path, true)?;
                }
                out.push(node);
            }
        }
    }
    if inner {
        return Err(ParseError { at: at(tokens.last().map_or(0, |t| t.1)), why: "a block not closed by '}'".into() });
    }
    Ok(out)
}

/// Words, braces and line ends; comments (`!`, `#`) dropped; a quoted
/// word keeps its spaces.
fn tokenize(text: &str) -> Vec<(Token, usize)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '!' | '#' => break,
                '{' => out.push((Token::Open, n)),
                '}' => out.push((Token::Close, n)),
                c if c.is_whitespace() => {}
                '"' => {
                    let w: String = chars.by_ref().take_while(|&c| c != '"').collect();
                    out.push((Token::Word(w), n));
                }
                c => {
                    let mut w = String::from(c);
                    while let Some(&c) = chars.peek() {
                        if c.is_whitespace() || c == '{' || c == '}' {
                            break;
                        }
                        w.push(c);
                        chars.next();
                    }
                    out.push((Token::Word(w), n));
                }
            }
        }
        out.push((Token::End, n));
    }
    out
}

/// The files `pattern` names: `*` and `?` in its last component, in name
/// order; a pattern without them names that one file.
fn glob(pattern: &Path) -> Result<Vec<PathBuf>, String> {
    let name = pattern.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if !name.contains(['*', '?']) {
        return Ok(vec![pattern.to_path_buf()]);
    }
    let dir = pattern.parent().unwrap_or(Path::new("."));
    let entries = std::fs::read_dir(dir).map_err(|e| format!("include {}: {e}", pattern.display()))?;
    let mut out: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_str().is_some_and(|f| matches(name.as_bytes(), f.as_bytes())))
        .map(|e| e.path())
        .collect();
    out.sort();
    Ok(out)
}

/// Shell-style matching of `*` and `?`, with glob(3)'s rule (which
/// keepalived's include follows) that a name starting with '.' matches
/// only a pattern starting with '.'.
fn matches(p: &[u8], s: &[u8]) -> bool {
    if s.first() == Some(&b'.') && p.first() != Some(&b'.') {
        return false;
    }
    wild(p, s)
}

fn wild(p: &[u8], s: &[u8]) -> bool {
    match (p.first(), s.first()) {
        (None, None) => true,
        (Some(b'*'), _) => wild(&p[1..], s) || (!s.is_empty() && wild(p, &s[1..])),
        (Some(b'?'), Some(_)) => wild(&p[1..], &s[1..]),
        (Some(a), Some(b)) if a == b => wild(&p[1..], &s[1..]),
        _ => false,
    }
}
