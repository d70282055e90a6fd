//! Programs at TC hooks, attached one of two ways (`model::TcAttach`):
//!
//! - **TCX** (Linux 6.6+): a bpf link, pinned under `links/` like every
//!   other link, replaced atomically with BPF_LINK_UPDATE.
//! - **netlink**: a direct-action `bpf` filter on the interface's clsact
//!   qdisc at hostmesh's own priority and handle (`netlink/tc.rs`). The
//!   filter belongs to the qdisc, so it outlives the daemon like a pinned
//!   link; a new program replaces it in place (NLM_F_REPLACE on the same
//!   priority and handle), never by delete-then-add. It is observed by
//!   dumping the filters: their program id, checked against the pin under
//!   `progs/`, says whether this build's program runs there.
//!
//! Moving a hook from one way to the other (the `tc_attach` setting
//! changed) adds the new attachment before removing the old, keeps the
//! interface's clsact qdisc (see `remove_filter`), and never
//! has two programs translate one packet: TCX runs before clsact filters;
//! hostmesh's programs end classification (TC_ACT_OK, a redirect or a
//! drop) for every packet they act on, and pass on untouched what they
//! leave alone, which the other copy then leaves alone too.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use aya::programs::links::FdLink;
use aya::programs::tc::TcAttachOptions;
use aya::programs::{LinkOrder, SchedClassifier, TcAttachType};

use super::pins::PinDir;
use super::{bpf_err, chain};
use crate::backends::ifaces;
use crate::backends::netlink::tc::{self, Direction, Filter, Slot};
use crate::backends::netlink::RouteSocket;
use crate::backends::Result;
use crate::model::{Attachment, Hook, Program};

/// Attaches `p` at `a`'s TC hook with a TCX link.
pub(super) fn attach_tcx(p: &mut SchedClassifier, dev: &str, a: &Attachment) -> Result<FdLink> {
    let direction = if matches!(a.hook, Hook::TcEgress(_)) { TcAttachType::Egress } else { TcAttachType::Ingress };
    let id = p
        .attach_with_options(dev, direction, TcAttachOptions::TcxOrder(LinkOrder::default()))
        .map_err(|e| bpf_err(format!("attach {a}"), chain(&e)))?;
    let link = p.take_link(id).map_err(|e| bpf_err(format!("attach {a}"), chain(&e)))?;
    FdLink::try_from(link).map_err(|e| bpf_err(format!("attach {a}"), chain(&e)))
}

fn direction(a: &Attachment) -> Direction {
    if matches!(a.hook, Hook::TcEgress(_)) {
        Direction::Egress
    } else {
        Direction::Ingress
    }
}

pub(super) fn hook(dev: String, d: Direction) -> Hook {
    match d {
        Direction::Ingress => Hook::TcIngress(dev),
        Direction::Egress => Hook::TcEgress(dev),
    }
}

/// Every filter on one hook: an interface with a clsact qdisc, one
/// direction.
struct OnHook {
    ifindex: u32,
    direction: Direction,
    filters: Vec<Filter>,
}

/// The filters of every hook with a clsact qdisc in this namespace.
fn every_hook(sock: &mut RouteSocket) -> io::Result<Vec<OnHook>> {
    let mut out = Vec::new();
    let context = |what: String| move |e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"));
    for ifindex in tc::clsact_interfaces(sock).map_err(context("dump qdiscs".into()))? {
        for direction in [Direction::Ingress, Direction::Egress] {
            let filters =
                tc::filters(sock, ifindex, direction).map_err(context(format!("dump {} filters", direction.name())))?;
            out.push(OnHook { ifindex, direction, filters });
        }
    }
    Ok(out)
}

/// hostmesh's filters on every clsact qdisc of this namespace.
pub(super) fn hostmesh_filters(sock: &mut RouteSocket) -> io::Result<Vec<Filter>> {
    Ok(every_hook(sock)?.into_iter().flat_map(|h| h.filters).filter(Filter::is_hostmesh).collect())
}

fn dev_name(ifindex: u32) -> String {
    ifaces::name(ifindex).unwrap_or_else(|| format!("ifindex {ifindex}"))
}

fn filter_name(f: &Filter) -> String {
    format!("tc filter {} on {} of {}", f.name.as_deref().unwrap_or("?"), f.direction.name(), dev_name(f.ifindex))
}

fn slot_of(f: &Filter) -> Slot {
    Slot { ifindex: f.ifindex, direction: f.direction, prio: f.prio }
}

/// Why `program` at `prio` on a hook may not see every packet: other
/// tools' filters run before it (`tc::ahead`), because one holds priority
/// 1. `None` when none does.
fn shadow_warning(program: &str, ifindex: u32, d: Direction, filters: &[Filter], prio: u16) -> Option<String> {
    let ahead = tc::ahead(filters, prio);
    if ahead.is_empty() {
        return None;
    }
    let list: Vec<String> = ahead
        .iter()
        .map(|f| match &f.name {
            Some(n) => format!("{} {n} at priority {}", f.kind, f.prio),
            None => format!("{} at priority {}", f.kind, f.prio),
        })
        .collect();
    Some(format!(
        "{program} on tc {} of {} runs at priority {prio}, after another tool's filters ({}): priority {}, where \
         hostmesh's filters run first, is taken, and a filter ahead of hostmesh's that ends classification (action \
         pass) hides packets from it; free priority {} (hostmesh moves there at the next sync) or use a kernel with TCX \
         (6.6+)",
        d.name(),
        dev_name(ifindex),
        list.join(", "),
        tc::PRIO_FIRST,
        tc::PRIO_FIRST,
    ))
}

fn tc_err(op: impl Into<String>) -> impl FnOnce(io::Error) -> crate::backends::BackendError {
    let op = op.into();
    move |e| bpf_err(op, e)
}

/// A hostmesh filter as found: the hook it is at, the id of the program
/// it runs, a name for errors, and whether it must move (it is not where
/// `tc::slot` puts it, or the hook has two).
pub(super) struct Found {
    pub(super) attachment: Attachment,
    pub(super) prog_id: u32,
    pub(super) what: String,
    pub(super) misplaced: bool,
}

/// hostmesh's clsact filters: the rtnetlink socket they are set through,
/// the marks (under the pin dir) of the qdiscs hostmesh added, and the
/// hooks where other tools' filters run before hostmesh's.
pub(super) struct TcFilters {
    pins: PinDir,
    /// Opened when first needed.
    sock: Option<RouteSocket>,
    /// By hook: why hostmesh's filter there may not see every packet.
    shadowed: BTreeMap<(u32, Direction), String>,
}

impl TcFilters {
    pub(super) fn new(pins: PinDir) -> Self {
        TcFilters { pins, sock: None, shadowed: BTreeMap::new() }
    }

    fn sock(&mut self) -> Result<&mut RouteSocket> {
        if self.sock.is_none() {
            self.sock = Some(RouteSocket::open().map_err(tc_err("open rtnetlink for tc filters"))?);
        }
        Ok(self.sock.as_mut().expect("just opened"))
    }

    /// Sentences for the status: the hooks where other tools' filters run
    /// before hostmesh's, as last seen.
    pub(super) fn warnings(&self) -> Vec<String> {
        self.shadowed.values().cloned().collect()
    }

    /// Each hostmesh filter as the hook it is at (and the hooks where it
    /// runs after other tools' filters, for `warnings`).
    pub(super) fn observe(&mut self) -> Result<Vec<Found>> {
        let hooks = every_hook(self.sock()?).map_err(tc_err("list tc filters"))?;
        let mut out = Vec::new();
        self.shadowed.clear();
        for h in hooks {
            let ours: Vec<&Filter> = h.filters.iter().filter(|f| f.is_hostmesh()).collect();
            let slot = tc::slot(&h.filters).ok();
            for f in &ours {
                let (Some(program), Some(dev)) =
                    (f.name.as_deref().and_then(Program::from_name), ifaces::name(f.ifindex))
                else {
                    continue;
                };
                if let Some(w) =
                    slot.and_then(|p| shadow_warning(program.name(), h.ifindex, h.direction, &h.filters, p))
                {
                    self.shadowed.insert((h.ifindex, h.direction), w);
                }
                out.push(Found {
                    attachment: Attachment { program, hook: hook(dev, f.direction) },
                    prog_id: f.prog_id.unwrap_or(0),
                    what: filter_name(f),
                    misplaced: ours.len() > 1 || slot != Some(f.prio),
                });
            }
        }
        Ok(out)
    }

    /// Attaches (or replaces in place) hostmesh's clsact filter for `a`,
    /// running `prog`, at the slot `tc::slot` gives; a hostmesh filter at
    /// the other priority (an older build's, or from before priority 1 was
    /// freed) goes once the new one runs.
    pub(super) fn attach(&mut self, a: &Attachment, dev: &str, prog: BorrowedFd<'_>) -> Result<()> {
        let ifindex = ifaces::index(dev)
            .ok_or_else(|| bpf_err(format!("attach {a}"), io::Error::from_raw_os_error(libc::ENODEV)))?;
        let d = direction(a);
        let marker = self.pins.qdisc(ifindex);
        let sock = self.sock()?;
        let existing = tc::filters(sock, ifindex, d).map_err(tc_err(format!("dump {} filters of {dev}", d.name())))?;
        let prio = tc::slot(&existing).map_err(|f| {
            bpf_err(
                format!("attach {a}"),
                format!(
                    "{} of {dev} has other tools' filters at priorities {} and {} (here a {} filter, {}), the two \
                     hostmesh can take; hostmesh does not replace them (move one of them to another priority)",
                    d.name(),
                    tc::PRIO_FIRST,
                    tc::PRIO_AFTER,
                    f.kind,
                    f.name.as_deref().unwrap_or("unnamed"),
                ),
            )
        })?;
        let created = tc::create_clsact(sock, ifindex).map_err(tc_err(format!("add a clsact qdisc to {dev}")))?;
        if created {
            std::fs::create_dir_all(&marker).map_err(tc_err(format!("mark {}", marker.display())))?;
        }
        let at = Slot { ifindex, direction: d, prio };
        let replaced = tc::replace_bpf(sock, at, prog.as_raw_fd(), a.program.name());
        if let Err(e) = replaced {
            if created {
                self.release_qdisc(ifindex)?;
            }
            return Err(bpf_err(format!("attach {a} as a clsact filter at priority {prio}"), e));
        }
        for old in existing.iter().filter(|f| f.is_hostmesh() && f.prio != prio) {
            tc::delete_bpf(sock, slot_of(old)).map_err(tc_err(format!("delete {} (moved)", filter_name(old))))?;
        }
        match shadow_warning(a.program.name(), ifindex, d, &existing, prio) {
            Some(w) => self.shadowed.insert((ifindex, d), w),
            None => self.shadowed.remove(&(ifindex, d)),
        };
        Ok(())
    }

    /// Removes hostmesh's clsact filter for `a`, if there is one: the hook
    /// moved to a TCX link. The qdisc stays, even one hostmesh added and
    /// left empty: adding or deleting a clsact qdisc deactivates the
    /// interface (`qdisc_graft` in the kernel), and what it sends in that
    /// moment is dropped, so a hook that stays is never moved through that.
    pub(super) fn remove_filter(&mut self, a: &Attachment) -> Result<()> {
        // An interface that is gone took its filters and qdisc with it.
        let Some(ifindex) = a.device().and_then(ifaces::index) else { return Ok(()) };
        let d = direction(a);
        self.shadowed.remove(&(ifindex, d));
        let sock = self.sock()?;
        let filters = tc::filters(sock, ifindex, d).map_err(tc_err(format!("dump {} filters", d.name())))?;
        for f in filters.iter().filter(|f| f.is_hostmesh()) {
            tc::delete_bpf(sock, slot_of(f)).map_err(tc_err(format!("detach {a} (clsact filter)")))?;
        }
        Ok(())
    }

    /// Removes hostmesh's clsact filter for `a` (its hook is no longer
    /// wanted), and the qdisc hostmesh added on that interface once
    /// hostmesh has no hook there at all (no filter, no pinned TCX link)
    /// and nothing else is on it.
    pub(super) fn remove(&mut self, a: &Attachment) -> Result<()> {
        self.remove_filter(a)?;
        let (Some(dev), Some(ifindex)) = (a.device(), a.device().and_then(ifaces::index)) else { return Ok(()) };
        let links = self.pins.link_names().map_err(|e| bpf_err("list pinned links", e))?;
        if links.iter().filter_map(|n| Attachment::from_pin_name(n)).any(|l| l.device() == Some(dev)) {
            return Ok(());
        }
        self.release_qdisc(ifindex).map(|_| ())
    }

    /// Deletes the clsact qdisc hostmesh added to `ifindex` once no filter
    /// at all is left on it (another tool's keeps it), and forgets it.
    fn release_qdisc(&mut self, ifindex: u32) -> Result<bool> {
        let marker = self.pins.qdisc(ifindex);
        if !marker.exists() {
            return Ok(false);
        }
        let sock = self.sock()?;
        let mut empty = true;
        for d in [Direction::Ingress, Direction::Egress] {
            empty &= tc::filters(sock, ifindex, d).map_err(tc_err("dump filters"))?.is_empty();
        }
        if !empty {
            return Ok(false);
        }
        tc::delete_clsact(sock, ifindex).map_err(tc_err(format!("delete the clsact qdisc of ifindex {ifindex}")))?;
        std::fs::remove_dir(&marker).map_err(tc_err(format!("remove {}", marker.display())))?;
        Ok(true)
    }

    /// Teardown: every hostmesh filter, then the qdiscs hostmesh added
    /// that are empty now. Returns one line per thing removed.
    pub(super) fn remove_all(&mut self) -> Result<Vec<String>> {
        let mut done = Vec::new();
        self.shadowed.clear();
        let ours = hostmesh_filters(self.sock()?).map_err(tc_err("list tc filters"))?;
        for f in ours {
            let sock = self.sock()?;
            tc::delete_bpf(sock, slot_of(&f)).map_err(tc_err(format!("delete {}", filter_name(&f))))?;
            done.push(format!("deleted {}", filter_name(&f)));
        }
        let marks = self.pins.qdisc_marks().map_err(|e| bpf_err("list qdisc marks", e))?;
        for ifindex in marks {
            let dev = ifaces::name(ifindex);
            if dev.is_some() && self.release_qdisc(ifindex)? {
                done.push(format!("deleted clsact qdisc of {}", dev.unwrap_or_default()));
            }
            // Gone, or kept for another tool's filters: forget it.
            let _ = std::fs::remove_dir(self.pins.qdisc(ifindex));
        }
        Ok(done)
    }
}
