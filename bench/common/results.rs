//! bench/RESULTS.md holds one section per benchmark, between markers, so
//! each benchmark rewrites only its own.

use std::path::Path;

const HEADER: &str = "# Benchmark results\n\nEach section is written by its benchmark (`./bench/run NAME`, as root) \
                      from one run; rerunning one replaces only its section.\n\n";

pub fn write_section(path: &Path, name: &str, body: &str) -> std::io::Result<()> {
    let begin = format!("<!-- bench:{name} -->");
    let end = format!("<!-- /bench:{name} -->");
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let section = format!("{begin}\n{}\n{end}", body.trim_end());
    let new = match (old.find(&begin), old.find(&end)) {
        (Some(b), Some(e)) if e > b => format!("{}{section}{}", &old[..b], &old[e + end.len()..]),
        _ if old.trim().is_empty() => format!("{HEADER}{section}\n"),
        _ => format!("{}\n\n{section}\n", old.trim_end()),
    };
    std::fs::write(path, new)
}

/// The body of section `name` of the results file at `path`, as
/// [`write_section`] wrote it.
pub fn read_section(path: &Path, name: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let begin = format!("<!-- bench:{name} -->\n");
    let start = text.find(&begin)? + begin.len();
    let end = start + text[start..].find(&format!("<!-- /bench:{name} -->"))?;
    Some(text[start..end].to_string())
}

/// The median of a run's samples (the upper one of an even count).
pub fn median(mut samples: Vec<f64>) -> f64 {
    assert!(!samples.is_empty(), "no samples");
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}
