//! Durations as operators write them: "500ms", "2s", "1m30s", "3h", "1d".

use std::time::Duration;

pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let invalid = || {
        format!("\"{text}\" is not a duration; write a number and a unit, like \"500ms\", \"2s\", \"1m30s\" or \"3h\"")
    };
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(invalid());
    }
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        if digits == 0 {
            return Err(invalid());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| invalid())?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let unit = match &rest[..unit_len] {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n.saturating_mul(60)),
            "h" => Duration::from_secs(n.saturating_mul(3600)),
            "d" => Duration::from_secs(n.saturating_mul(86_400)),
            _ => return Err(invalid()),
        };
        total = total.saturating_add(unit);
        rest = &rest[unit_len..];
    }
    Ok(total)
}

/// A duration as an operator would write it: "200ms", "2s", "1m30s".
pub(crate) fn show_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 || !ms.is_multiple_of(1000) {
        return format!("{ms}ms");
    }
    let s = ms / 1000;
    let (h, m, s) = (s / 3600, s / 60 % 60, s % 60);
    let mut out = String::new();
    for (n, unit) in [(h, "h"), (m, "m"), (s, "s")] {
        if n > 0 {
            out += &format!("{n}{unit}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shows_what_it_parses() {
        for text in ["200ms", "1s", "2s", "1m30s", "3h", "1h1m1s", "1500ms"] {
            assert_eq!(show_duration(parse_duration(text).unwrap()), text);
        }
    }

    #[test]
    fn parses_units_and_sums() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("3h"), Ok(Duration::from_secs(10_800)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86_400)));
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["", "s", "10", "1x", "1.5s", "-1s", "1s2"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be rejected");
        }
    }
}
