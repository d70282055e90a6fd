//! The services' rows of the status: one per service, rendered on the
//! status writer's thread and kept rendered between writes (`RowCache`),
//! so a write after an edit renders only what the edit changed.

use std::sync::Arc;

use serde_json::value::RawValue;

use super::report::{bracketed, object, ErrorIndex};
use crate::config::Loaded;
use crate::model::{Desired, Object, NATIN};
use crate::reconcile::{StepError, SyncOutcome};
use crate::state::{ObjectKind, ObjectStatus};

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
        let row = crate::state::render_row(&service_object(s, connect_time, errors.clone()));
        CachedRow { _service: Arc::clone(s), veth, connect_time, errors, row, pass }
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

/// A service's row: where its traffic goes and by which path.
fn service_object(s: &crate::config::Service, connect_time: bool, errors: Vec<String>) -> ObjectStatus {
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
