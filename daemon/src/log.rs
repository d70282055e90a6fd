//! Logs: one event per line on stderr (journald adds time and unit), as
//! `level=info msg="sync done" generation=3 steps=11`, so they read well in
//! `journalctl -u hostmesh` and parse with any logfmt tool.

use std::fmt::{self, Write as _};
use std::io::{self, Write};
use std::sync::Mutex;

use slog::{Drain, Key, Level, OwnedKVList, Record, Serializer, KV};

pub(crate) use slog::Logger;

/// A drain writing logfmt lines to any writer (stderr in production).
pub(crate) struct LogfmtDrain<W: Write + Send> {
    out: Mutex<W>,
    min: Level,
}

impl<W: Write + Send> LogfmtDrain<W> {
    pub(crate) fn new(out: W, min: Level) -> Self {
        LogfmtDrain { out: Mutex::new(out), min }
    }
}

impl<W: Write + Send> Drain for LogfmtDrain<W> {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &Record<'_>, values: &OwnedKVList) -> Result<(), slog::Never> {
        if !record.level().is_at_least(self.min) {
            return Ok(());
        }
        let mut line = format!("level={} msg={}", level_name(record.level()), quote(&record.msg().to_string()));
        let mut ser = LineSerializer(&mut line);
        let _ = record.kv().serialize(record, &mut ser);
        let _ = values.serialize(record, &mut ser);
        line.push('\n');
        if let Ok(mut out) = self.out.lock() {
            let _ = out.write_all(line.as_bytes());
            let _ = out.flush();
        }
        Ok(())
    }
}

fn level_name(l: Level) -> &'static str {
    match l {
        Level::Critical => "crit",
        Level::Error => "error",
        Level::Warning => "warn",
        Level::Info => "info",
        Level::Debug => "debug",
        Level::Trace => "trace",
    }
}

struct LineSerializer<'a>(&'a mut String);

impl Serializer for LineSerializer<'_> {
    fn emit_arguments(&mut self, key: Key, val: &fmt::Arguments<'_>) -> slog::Result {
        let _ = write!(self.0, " {key}={}", quote(&val.to_string()));
        Ok(())
    }
}

/// Quotes a value when it has spaces, quotes, `=` or is empty; newlines
/// become `\n` so one event stays one line.
pub(crate) fn quote(v: &str) -> String {
    let plain = !v.is_empty() && !v.contains(|c: char| c.is_whitespace() || c == '"' || c == '=' || c == '\\');
    if plain {
        return v.to_string();
    }
    let mut s = String::with_capacity(v.len() + 2);
    s.push('"');
    for c in v.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

/// The daemon's logger: stderr, info and above (debug with HOSTMESH_DEBUG=1).
pub(crate) fn stderr_logger() -> Logger {
    let min = if std::env::var_os("HOSTMESH_DEBUG").is_some() { Level::Debug } else { Level::Info };
    Logger::root(LogfmtDrain::new(io::stderr(), min).fuse(), slog::o!())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn one_line_per_event_with_key_values() {
        let buf = Buf::default();
        let log = Logger::root(LogfmtDrain::new(buf.clone(), Level::Info).fuse(), slog::o!("unit" => "hm"));
        slog::info!(log, "sync done"; "steps" => 3, "file" => "/etc/hostmesh/a b.toml");
        slog::debug!(log, "hidden");
        slog::warn!(log, "two\nlines"; "err" => "x=\"y\"");
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert_eq!(
            text,
            "level=info msg=\"sync done\" file=\"/etc/hostmesh/a b.toml\" steps=3 unit=hm\n\
             level=warn msg=\"two\\nlines\" err=\"x=\\\"y\\\"\" unit=hm\n"
        );
    }
}
