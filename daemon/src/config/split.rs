//! Where a large file may be cut into parts that parse on their own.
//!
//! The TOML parser holds a whole document as a tree before anything is
//! deserialized: ~3 KB per service, 300 MB at the peak for a file of
//! 100,000. A file is therefore parsed in parts of about `PART_BYTES`,
//! cut only before an array-of-tables header of an object list
//! (`[[service]]`, `[[mesh]]`, `[[peer]]`, `[[member]]`) that starts a
//! line outside any string or bracket. Each such element is a table of its
//! own, so the parts mean together what the file means whole; the
//! reader (`validate::parse_file`) still parses the file whole whenever a
//! part fails, or `[daemon]`/`[gateway]` show up in two parts, so any error
//! is reported exactly as for the whole file. A file with anything but
//! comments before its first header is never cut (a top-level
//! `service = [...]` would join the lists that the whole parse refuses).

use std::ops::Range;

/// About how large a part is.
pub(super) const PART_BYTES: usize = 64 * 1024;

/// The headers a part may start with.
const LISTS: [&str; 4] = ["service", "mesh", "peer", "member"];

/// The parts of `text`, in order, covering it; `None` when it is small or
/// cannot be cut.
pub(super) fn parts(text: &str) -> Option<Vec<Range<usize>>> {
    parts_of(text, PART_BYTES)
}

pub(super) fn parts_of(text: &str, part_bytes: usize) -> Option<Vec<Range<usize>>> {
    if text.len() < 2 * part_bytes {
        return None;
    }
    let mut scan = Scan::default();
    let mut cuts = vec![0];
    let mut seen_header = false;
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        if scan.at_top_level() {
            let head = line.trim_start();
            if head.starts_with('[') {
                if cuts.last().is_some_and(|&c| at - c >= part_bytes) && is_list_header(head) {
                    cuts.push(at);
                }
                seen_header = true;
                // A header line holds nothing that carries over (a
                // trailing comment at most).
                at += line.len();
                continue;
            }
            if !seen_header && !head.is_empty() && !head.starts_with('#') {
                return None;
            }
        }
        scan.line(line);
        at += line.len();
    }
    if cuts.len() < 2 {
        return None;
    }
    cuts.push(text.len());
    Some(cuts.windows(2).map(|w| w[0]..w[1]).collect())
}

/// `[[service]]` (with blanks inside the brackets, a comment after).
fn is_list_header(head: &str) -> bool {
    let Some(rest) = head.strip_prefix("[[") else { return false };
    let Some((name, tail)) = rest.split_once("]]") else { return false };
    let tail = tail.trim_start();
    LISTS.contains(&name.trim()) && (tail.is_empty() || tail.starts_with('#'))
}

/// The lexical state carried from line to line: inside a multi-line
/// string, or inside brackets (an array or inline table over lines).
#[derive(Default)]
struct Scan {
    depth: usize,
    multiline: Option<&'static str>,
}

impl Scan {
    fn at_top_level(&self) -> bool {
        self.depth == 0 && self.multiline.is_none()
    }

    fn line(&mut self, line: &str) {
        let b = line.as_bytes();
        let mut i = 0;
        while i < b.len() {
            if let Some(close) = self.multiline {
                match line[i..].find(close) {
                    Some(j) => {
                        // A run of quotes ends the string at its last
                        // three (`""""` is a quote and the close).
                        let mut end = i + j + 3;
                        while end < b.len() && b[end] == close.as_bytes()[0] {
                            end += 1;
                        }
                        if close == "\"\"\"" && escaped(b, i + j) {
                            i += j + 1;
                            continue;
                        }
                        self.multiline = None;
                        i = end;
                    }
                    None => return,
                }
                continue;
            }
            match b[i] {
                b'#' => return,
                b'"' | b'\'' if line[i..].starts_with("\"\"\"") || line[i..].starts_with("'''") => {
                    self.multiline = Some(if b[i] == b'"' { "\"\"\"" } else { "'''" });
                    i += 3;
                }
                b'"' => i = string_end(b, i + 1, true),
                b'\'' => i = string_end(b, i + 1, false),
                b'[' | b'{' => {
                    self.depth += 1;
                    i += 1;
                }
                b']' | b'}' => {
                    self.depth = self.depth.saturating_sub(1);
                    i += 1;
                }
                _ => i += 1,
            }
        }
    }
}

/// Whether the byte at `at` follows an odd run of backslashes.
fn escaped(b: &[u8], at: usize) -> bool {
    b[..at].iter().rev().take_while(|&&c| c == b'\\').count() % 2 == 1
}

/// Past the closing quote of a one-line string opened before `from`.
fn string_end(b: &[u8], mut i: usize, basic: bool) -> usize {
    let quote = if basic { b'"' } else { b'\'' };
    while i < b.len() {
        if basic && b[i] == b'\\' {
            i += 2;
            continue;
        }
        if b[i] == quote {
            return i + 1;
        }
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(i: usize) -> String {
        format!(
            "[[service]]\nname = \"s{i}\"\nvip = \"10.0.0.{}\"\nport = 80\nbackends = [\"10.1.0.1:80\"]\n\n",
            i % 250
        )
    }

    fn cut_at(text: &str, part: usize) -> Vec<String> {
        parts_of(text, part).unwrap_or_default().into_iter().map(|r| text[r].to_string()).collect()
    }

    #[test]
    fn cuts_only_before_list_headers_and_covers_the_text() {
        let text: String = "# services\n[daemon]\nconnect_time_lb = \"all\"\n\n".to_string()
            + &(0..40).map(service).collect::<String>()
            + "[gateway]\nrole = \"member\"\n";
        let parts = cut_at(&text, 500);
        assert!(parts.len() > 5, "{} parts", parts.len());
        assert_eq!(parts.concat(), text);
        assert!(parts[1..].iter().all(|p| p.starts_with("[[service]]")), "{parts:?}");
        assert!(parts.iter().all(|p| p.len() < 500 + service(0).len()));
        assert!(parts_of(&text, text.len()).is_none(), "small files are parsed whole");
    }

    #[test]
    fn never_cuts_inside_strings_or_brackets() {
        // Each of these holds a line that looks like a header, far enough
        // into the construct for a part to end there.
        let pad = "x".repeat(400);
        let traps = [
            format!("note = \"\"\"\n{pad}\n[[service]]\n\"\"\"\n"),
            format!("note = '''\n{pad}\n[[service]]\n'''\n"),
            format!("note = \"\"\"\\\"\"\"\n{pad}\n[[service]]\n\"\"\"\n"),
            format!("backends = [\n\"10.1.0.1:80\", # {pad}\n[[service]]\n]\n"),
            format!("t = {{ a = \"]\" , b = [ # {pad}\n[[service]]\n] }}\n"),
        ];
        for trap in &traps {
            let text: String =
                (0..10).map(service).collect::<String>() + "[[service]]\n" + trap + &service(11).repeat(20);
            let trap_at = text.find(trap.as_str()).unwrap();
            for part in [50, 100, 200, 300] {
                let parts = parts_of(&text, part).expect("cut");
                assert_eq!(parts.last().unwrap().end, text.len());
                for r in parts {
                    assert!(
                        r.start <= trap_at || r.start >= trap_at + trap.len(),
                        "cut inside {trap:?} at {}",
                        r.start
                    );
                }
            }
        }
    }

    #[test]
    fn a_file_with_top_level_keys_is_never_cut() {
        let text = "service = []\n".to_string() + &(0..40).map(service).collect::<String>();
        assert!(parts_of(&text, 300).is_none());
    }

    #[test]
    fn headers_are_recognized_with_blanks_and_comments() {
        assert!(is_list_header("[[service]]\n"));
        assert!(is_list_header("[[ mesh ]] # sidecars\n"));
        assert!(!is_list_header("[[service.backends]]\n"));
        assert!(!is_list_header("[service]\n"));
        assert!(!is_list_header("[[gateway]]\n"));
        assert!(!is_list_header("[[service]] x = 1\n"));
    }
}
