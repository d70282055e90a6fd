//! The services' rows of the status: one per service, rendered on the
//! status writer's thread and kept rendered between writes (`RowCache`),
//! so a write after an edit renders only what the edit changed.

use std::sync::Arc;

use super::report::ErrorIndex;
use crate::config::{Config, CtlbMode, Loaded, Service};
use crate::model::{Desired, Object, NATIN};
use crate::reconcile::{StepError, SyncOutcome};
use crate::state::{ObjectKind, ObjectState};

/// The services' rows of the status, rendered on the status writer's
/// thread (100,000 of them take tens of milliseconds) from what a sync
/// leaves: the configuration loaded, the sync's errors, and the two facts
/// of its desired state a row shows.
pub(crate) struct ServiceRows {
    config: Arc<Config>,
    veth: bool,
    connect_time: CtlbMode,
    errors: Vec<StepError>,
}

impl ServiceRows {
    pub(crate) fn of(loaded: &Loaded, outcome: &SyncOutcome, d: &Desired) -> Self {
        Self::new(Arc::clone(&loaded.config), d.links.contains_key(NATIN), d.connect_time, &outcome.errors)
    }

    pub(crate) fn new(config: Arc<Config>, veth: bool, connect_time: CtlbMode, errors: &[StepError]) -> Self {
        ServiceRows { config, veth, connect_time, errors: errors.to_vec() }
    }

    /// The rows, in the configuration's order, each as `Status::
    /// write_with_rows` takes it: rendered again only for a service that
    /// is new or whose row changed since `cache` last saw it (its path,
    /// its errors); the others are `cache`'s.
    pub(crate) fn render<'c>(&self, cache: &'c mut RowCache) -> Vec<&'c str> {
        let index = ErrorIndex::new(&self.errors);
        let shared = shared_line(&index, self.veth);
        let services = &self.config.services;
        let same_path = cache.veth == self.veth && cache.connect_time == Some(self.connect_time);
        let before = cache.config.take().filter(|_| same_path);
        let old = std::mem::take(&mut cache.slots);
        // The services both lists share at their head and tail (an edit
        // changes what lies between): their rows stand unless their
        // errors changed.
        let (head, tail) = before.as_ref().map_or((0, 0), |b| shared_ends(&b.services, services));
        if head == 0 && tail == 0 {
            cache.text.clear();
        }
        let mut slots = Vec::with_capacity(services.len());
        for (i, s) in services.iter().enumerate() {
            let kept = if i < head {
                Some(old[i])
            } else if services.len() - i <= tail {
                Some(old[old.len() - (services.len() - i)])
            } else {
                None
            };
            let errors = if index.is_empty() {
                Vec::new()
            } else {
                let mut own = index.for_owners(&[Object::Service(&s.name)]);
                own.extend(shared.iter().cloned());
                own
            };
            let digest = errors_digest(&errors);
            slots.push(match kept {
                Some(slot) if slot.errors == digest => slot,
                _ => cache.text.push(s, self.connect_time.handles(s.protocol), &errors, digest),
            });
        }
        drop(before);
        let live: usize = slots.iter().map(|s| s.len as usize).sum();
        (cache.config, cache.veth, cache.connect_time, cache.slots) =
            (Some(Arc::clone(&self.config)), self.veth, Some(self.connect_time), slots);
        // Rows replaced leave their text behind: past a quarter of the
        // live rows', every row is rendered anew (never a second copy).
        if cache.text.len() > live + live / 4 + BLOCK {
            cache.config = None;
            return self.render(cache);
        }
        let text = &cache.text;
        cache.slots.iter().map(|s| text.row(s)).collect()
    }
}

/// How many services `a` and `b` share (the same `Arc`s) at their head,
/// and then at their tail.
fn shared_ends(a: &[Arc<Service>], b: &[Arc<Service>]) -> (usize, usize) {
    let head = a.iter().zip(b).take_while(|(x, y)| Arc::ptr_eq(x, y)).count();
    let rest = a.len().min(b.len()) - head;
    let tail = a.iter().rev().zip(b.iter().rev()).take(rest).take_while(|(x, y)| Arc::ptr_eq(x, y)).count();
    (head, tail)
}

/// The services' rows the status writer rendered, in the order of the
/// configuration it rendered them for (kept, so no service it holds can
/// be another's), their text in blocks of `BLOCK` bytes: at 100,000
/// services about 19 MB (17 of text; each row a block of the heap of its
/// own and a hash map of them took 28).
#[derive(Default)]
pub(crate) struct RowCache {
    config: Option<Arc<Config>>,
    veth: bool,
    connect_time: Option<CtlbMode>,
    slots: Vec<Slot>,
    text: Text,
}

impl RowCache {
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }
}

/// Where a row's text is, and which errors it shows.
#[derive(Clone, Copy)]
struct Slot {
    block: u32,
    start: u32,
    len: u32,
    /// `errors_digest` of the errors the row shows.
    errors: u64,
}

/// The rows' text: appended to the last block, a new one begun when a
/// row does not fit.
#[derive(Default)]
struct Text {
    blocks: Vec<String>,
    len: usize,
}

/// The size of a block of rows' text (some 6,000 rows).
const BLOCK: usize = 1 << 20;

impl Text {
    fn clear(&mut self) {
        *self = Text::default();
    }

    /// The bytes of every block.
    fn len(&self) -> usize {
        self.len
    }

    fn row(&self, s: &Slot) -> &str {
        &self.blocks[s.block as usize][s.start as usize..(s.start + s.len) as usize]
    }

    /// Renders `s`'s row at the end.
    fn push(&mut self, s: &Service, connect_time: bool, errors: &[String], digest: u64) -> Slot {
        if self.blocks.last().is_none_or(|b| b.len() + ROW_ROOM > b.capacity()) {
            self.blocks.push(String::with_capacity(BLOCK));
        }
        let block = self.blocks.last_mut().expect("a block");
        let start = block.len();
        service_row(s, connect_time, errors, block);
        let len = block.len() - start;
        self.len += len;
        Slot { block: (self.blocks.len() - 1) as u32, start: start as u32, len: len as u32, errors: digest }
    }
}

/// The room a block keeps for one more row: a row of a service with the
/// most backends and errors may still grow the block past it.
const ROW_ROOM: usize = 64 << 10;

/// A digest of a row's errors; 0 for none.
fn errors_digest(errors: &[String]) -> u64 {
    use std::hash::BuildHasher;
    if errors.is_empty() {
        return 0;
    }
    foldhash::quality::FixedState::with_seed(7).hash_one(errors).max(1)
}

/// A service's row, appended to `out`: what `render_row` makes of
/// `service_object`, written from the service's own parts (the object
/// took ten allocations a row, which at 100,000 services left the heap in
/// pieces).
fn service_row(s: &Service, connect_time: bool, errors: &[String], out: &mut String) {
    use std::fmt::Write;
    thread_local! {
        static DETAIL: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
        static ROW: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    DETAIL.with_borrow_mut(|detail| {
        detail.clear();
        let _ = match s.vip {
            std::net::IpAddr::V6(v6) => write!(detail, "[{v6}]:{}/{} -> ", s.port, s.protocol),
            v4 => write!(detail, "{v4}:{}/{} -> ", s.port, s.protocol),
        };
        for (i, b) in s.backends.iter().enumerate() {
            let _ = match (i, b.weight) {
                (0, 1) => write!(detail, "{}", b.addr),
                (0, w) => write!(detail, "{} (weight {w})", b.addr),
                (_, 1) => write!(detail, ", {}", b.addr),
                (_, w) => write!(detail, ", {} (weight {w})", b.addr),
            };
        }
        if s.backends.is_empty() {
            detail.push_str("no backends");
        }
        detail.push_str(if connect_time { " (connect-time)" } else { " (bpfnat veth)" });
        let row = Row {
            kind: ObjectKind::Service,
            name: &s.name,
            origin: Shown(&s.origin),
            state: if errors.is_empty() { ObjectState::Applied } else { ObjectState::Error },
            detail,
            errors,
        };
        ROW.with_borrow_mut(|json| {
            json.clear();
            serde_json::to_writer(&mut *json, &row).expect("a row is JSON");
            out.push_str(std::str::from_utf8(json).expect("JSON is UTF-8"));
        })
    })
}

/// `ObjectStatus`'s fields, in its order, borrowed.
#[derive(serde::Serialize)]
struct Row<'a> {
    kind: ObjectKind,
    name: &'a str,
    origin: Shown<'a>,
    state: ObjectState,
    detail: &'a str,
    errors: &'a [String],
}

/// A value serialized as the string it displays as.
struct Shown<'a>(&'a dyn std::fmt::Display);

impl serde::Serialize for Shown<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self.0)
    }
}

/// The errors charged to what every service uses (the services' own maps
/// and programs, the bpfnat veth while it is in use) as one line of each
/// service's row: how many, and where they are listed whole. Each row
/// repeating them made 156 MB of status at 100,000 services with a
/// connect-time attach that failed (8 errors), and twice the daemon's
/// memory; the connect-time and bpfnat rows and the last sync list them.
fn shared_line(index: &ErrorIndex, veth: bool) -> Option<String> {
    let owners: &[Object] = if veth { &[Object::Services, Object::Bpfnat] } else { &[Object::Services] };
    let count = index.count_of(owners)?;
    let errors = if count == 1 { "error" } else { "errors" };
    Some(format!(
        "{count} {errors} in what every service shares (listed under the last sync, and the connect-time or bpfnat row)"
    ))
}

/// A service's row: where its traffic goes and by which path (as
/// `service_row` writes it).
#[cfg(test)]
fn service_object(s: &Service, connect_time: bool, errors: Vec<String>) -> crate::state::ObjectStatus {
    use super::report::{bracketed, object};
    let path = if connect_time { "connect-time" } else { "bpfnat veth" };
    let backends: Vec<String> = s
        .backends
        .iter()
        .map(|b| if b.weight == 1 { b.addr.to_string() } else { format!("{} (weight {})", b.addr, b.weight) })
        .collect();
    let detail = format!(
        "{}:{}/{} -> {} ({path})",
        bracketed(s.vip),
        s.port,
        s.protocol,
        if backends.is_empty() { "no backends".to_string() } else { backends.join(", ") }
    );
    object(ObjectKind::Service, &s.name, Some(s.origin.to_string()), detail, errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_s_row_is_what_its_object_renders_to() {
        let text = "[[service]]\nname = \"web-1\"\nvip = \"10.96.0.10\"\nport = 80\nbackends = [\"192.168.1.1:80\", \
                    { address = \"192.168.1.2:80\", weight = 3 }]\n\
                    [[service]]\nname = \"v6\"\nvip = \"fd00::10\"\nport = 53\nprotocol = \"udp\"\nbackends = \
                    [{ address = \"[fd00::1]:53\", weight = 0 }, \"[fd00::2]:53\"]\n\
                    [[service]]\nname = \"none\"\nvip = \"10.96.0.11\"\nport = 80\n";
        let config = crate::config::from_text(text);
        assert_eq!(config.services.len(), 3, "{:?}", config);
        for s in &config.services {
            for errors in [vec![], vec!["no \"room\"\n".to_string(), "second".to_string()]] {
                for connect_time in [true, false] {
                    let reference = crate::state::render_row(&service_object(s, connect_time, errors.clone()));
                    let mut row = "before".to_string();
                    service_row(s, connect_time, &errors, &mut row);
                    assert_eq!(row, format!("before{reference}"));
                }
            }
        }
    }

    fn services(n: usize) -> Arc<Config> {
        let text: String = (0..n)
            .map(|i| {
                format!(
                    "[[service]]\nname = \"s{i}\"\nvip = \"10.0.{}.{}\"\nport = 80\nbackends = [\"10.1.0.1:80\"]\n",
                    i / 250,
                    i % 250
                )
            })
            .collect();
        Arc::new(crate::config::from_text(&text))
    }

    fn addresses(rows: &[&str]) -> Vec<usize> {
        rows.iter().map(|r| r.as_ptr() as usize).collect()
    }

    #[test]
    fn an_edit_renders_what_lies_between_the_services_it_left_alone() {
        let config = services(30);
        let mut cache = RowCache::default();
        let render = |c: &Arc<Config>, cache: &mut RowCache| -> (Vec<usize>, Vec<String>) {
            let rows = ServiceRows::new(Arc::clone(c), false, CtlbMode::Tcp, &[]).render(cache);
            (addresses(&rows), rows.iter().map(|r| r.to_string()).collect())
        };
        let (first, _) = render(&config, &mut cache);
        // Service 10 changed, one added after 20: 10..=20 rendered anew.
        let mut edited = config.services.clone();
        edited[10] = Arc::new(Service { port: 81, ..(*edited[10]).clone() });
        edited.insert(21, services(31).services[30].clone());
        let edited = Arc::new(Config { services: edited, ..(*config).clone() });
        let (second, text) = render(&edited, &mut cache);
        assert_eq!(second[..10], first[..10]);
        assert_eq!(second[22..], first[21..]);
        assert!(second[10..22].iter().all(|a| !first.contains(a)));
        assert!(text[10].contains("10.0.0.10:81/tcp"), "{}", text[10]);
        assert!(text[21].contains("\"s30\""), "{}", text[21]);
        let fresh = ServiceRows::new(Arc::clone(&edited), false, CtlbMode::Tcp, &[])
            .render(&mut RowCache::default())
            .iter()
            .map(|r| r.to_string())
            .collect::<Vec<_>>();
        assert_eq!(text, fresh);
    }

    #[test]
    fn rows_rendered_again_and_again_leave_text_of_a_quarter_of_the_live_rows_at_most() {
        let mut config = services(40);
        let mut cache = RowCache::default();
        let mut renders_whole = 0;
        // Past BLOCK bytes of rows replaced: every row is rendered anew.
        for i in 0..10_000u16 {
            let mut edited = config.services.clone();
            edited[20] = Arc::new(Service { port: 1000 + i % 2, ..(*edited[20]).clone() });
            config = Arc::new(Config { services: edited, ..(*config).clone() });
            let rows = ServiceRows::new(Arc::clone(&config), false, CtlbMode::Tcp, &[]).render(&mut cache);
            let live: usize = rows.iter().map(|r| r.len()).sum();
            let whole = rows.windows(2).all(|w| w[0].as_ptr() < w[1].as_ptr());
            renders_whole += usize::from(whole && i > 0);
            assert!(cache.text.len() <= live + live / 4 + BLOCK, "{} bytes for {live} live", cache.text.len());
        }
        assert!(renders_whole >= 1, "never rendered anew");
    }

    #[test]
    fn errors_every_service_shares_take_one_line_of_each_row_not_all_of_them() {
        // An attach of the connect-time programs that fails, with long
        // errors, beside one service's own error: 10,000 rows stay small.
        let config = services(10_000);
        let shared = |i: usize| StepError {
            step: format!("attach connect-time program {i}"),
            owners: ["services"].into(),
            error: format!("{i}: {}", "x".repeat(1_000)),
        };
        let own = StepError {
            step: "update HM_SERVICES entry".into(),
            owners: ["service/s7"].into(),
            error: "Argument list too long".into(),
        };
        let errors: Vec<StepError> = (0..5).map(shared).chain([own]).collect();
        let mut cache = RowCache::default();
        let rows = ServiceRows::new(Arc::clone(&config), true, CtlbMode::Tcp, &errors).render(&mut cache);
        let total: usize = rows.iter().map(|r| r.len()).sum();
        assert!(total < 10_000 * 400, "{total} bytes of rows");
        for (i, row) in rows.iter().enumerate() {
            let o: crate::state::ObjectStatus = serde_json::from_str(row.trim_end_matches(',')).unwrap();
            assert_eq!(o.state, ObjectState::Error, "{row}");
            assert_eq!(o.errors.len(), 1 + usize::from(i == 7), "{row}");
            let line = o.errors.last().unwrap();
            assert_eq!(
                line,
                "5 errors in what every service shares (listed under the last sync, and the connect-time or bpfnat row)"
            );
        }
        assert!(rows[7].contains("update HM_SERVICES entry: Argument list too long"), "{}", rows[7]);
    }
}
