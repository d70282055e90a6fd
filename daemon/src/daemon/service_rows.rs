//! The services' rows of the status: one per service, rendered on the
//! status writer's thread and kept rendered between writes (`RowCache`),
//! so a write after an edit renders only what the edit changed.

use std::sync::Arc;

use serde_json::value::RawValue;

use super::report::ErrorIndex;
use crate::config::Loaded;
use crate::model::{Desired, Object, NATIN};
use crate::reconcile::{StepError, SyncOutcome};
use crate::state::{ObjectKind, ObjectState};

/// The services' rows of the status, rendered on the status writer's
/// thread (100,000 of them take tens of milliseconds) from what a sync
/// leaves: the configuration loaded, the sync's errors, and the two facts
/// of its desired state a row shows.
pub(crate) struct ServiceRows {
    config: std::sync::Arc<crate::config::Config>,
    veth: bool,
    connect_time: crate::config::CtlbMode,
    errors: Vec<StepError>,
}

impl ServiceRows {
    pub(crate) fn of(loaded: &Loaded, outcome: &SyncOutcome, d: &Desired) -> Self {
        Self::new(std::sync::Arc::clone(&loaded.config), d.links.contains_key(NATIN), d.connect_time, &outcome.errors)
    }

    pub(crate) fn new(
        config: std::sync::Arc<crate::config::Config>,
        veth: bool,
        connect_time: crate::config::CtlbMode,
        errors: &[StepError],
    ) -> Self {
        ServiceRows { config, veth, connect_time, errors: errors.to_vec() }
    }

    /// The rows, in the configuration's order, each as `Status::
    /// write_with_rows` takes it: rendered again only for a service that
    /// is new or whose row changed since `cache` last saw it (its path,
    /// its errors); the others are `cache`'s.
    pub(crate) fn render<'c>(&self, cache: &'c mut RowCache) -> Vec<&'c RawValue> {
        let index = ErrorIndex::new(&self.errors);
        cache.pass += 1;
        let pass = cache.pass;
        for s in &self.config.services {
            let errors = if index.is_empty() { Vec::new() } else { index.for_owners(&service_owners(s, self.veth)) };
            let connect_time = self.connect_time.handles(s.protocol);
            let row = cache.rows.entry(Arc::as_ptr(s) as usize);
            match row {
                std::collections::hash_map::Entry::Occupied(mut o) => {
                    let c = o.get_mut();
                    if c.veth != self.veth || c.connect_time != connect_time || c.errors != errors {
                        *c = CachedRow::new(s, self.veth, connect_time, errors, pass);
                    }
                    c.pass = pass;
                }
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(CachedRow::new(s, self.veth, connect_time, errors, pass));
                }
            }
        }
        cache.rows.retain(|_, c| c.pass == pass);
        let rows = &cache.rows;
        self.config.services.iter().map(|s| &*rows[&(Arc::as_ptr(s) as usize)].row).collect()
    }
}

/// The services' rows the status writer rendered, by service (the
/// address of its `Arc`, which the row holds on to, so no other service
/// can come to have it). Rows of services no longer configured are let
/// go at each render. At 100,000 services about 25 MB.
#[derive(Default)]
pub(crate) struct RowCache {
    rows: std::collections::HashMap<usize, CachedRow, foldhash::quality::RandomState>,
    pass: u64,
}

impl RowCache {
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.rows.len()
    }
}

struct CachedRow {
    _service: Arc<crate::config::Service>,
    veth: bool,
    connect_time: bool,
    errors: Vec<String>,
    row: Box<RawValue>,
    pass: u64,
}

impl CachedRow {
    fn new(s: &Arc<crate::config::Service>, veth: bool, connect_time: bool, errors: Vec<String>, pass: u64) -> Self {
        let row = service_row(s, connect_time, &errors);
        CachedRow { _service: Arc::clone(s), veth, connect_time, errors, row, pass }
    }
}

/// A service's row: what `render_row` makes of `service_object`, written
/// from the service's own parts (the object took ten allocations a row,
/// which at 100,000 services left the heap in pieces).
fn service_row(s: &crate::config::Service, connect_time: bool, errors: &[String]) -> Box<RawValue> {
    use std::fmt::Write;
    thread_local!(static DETAIL: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) });
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
        serde_json::value::to_raw_value(&row).expect("a row is JSON")
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

/// What a service's errors are charged to: itself, the services, and
/// the bpfnat veth when it is in use.
fn service_owners(s: &crate::config::Service, veth: bool) -> Vec<Object<'_>> {
    let mut owners = vec![Object::Service(&s.name), Object::Services];
    if veth {
        owners.push(Object::Bpfnat);
    }
    owners
}

/// A service's row: where its traffic goes and by which path (as
/// `service_row` writes it).
#[cfg(test)]
fn service_object(s: &crate::config::Service, connect_time: bool, errors: Vec<String>) -> crate::state::ObjectStatus {
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
                    assert_eq!(service_row(s, connect_time, &errors).get(), reference.get());
                }
            }
        }
    }
}
