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
//! changed) adds the new attachment before removing the old, and never
//! has two programs translate one packet: TCX runs before clsact filters;
//! hostmesh's programs end classification (TC_ACT_OK, a redirect or a
//! drop) for every packet they act on, and pass on untouched what they
//! leave alone, which the other copy then leaves alone too.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use aya::programs::links::FdLink;
use aya::programs::tc::TcAttachOptions;
use aya::programs::{LinkOrder, SchedClassifier, TcAttachType};

use super::pins::PinDir;
use super::{bpf_err, chain};
use crate::backends::ifaces;
use crate::backends::netlink::tc::{self, Direction, Filter};
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

/// hostmesh's filters on every clsact qdisc of this namespace.
pub(super) fn hostmesh_filters(sock: &mut RouteSocket) -> io::Result<Vec<Filter>> {
    let mut out = Vec::new();
    let context = |what: String| move |e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"));
    for ifindex in tc::clsact_interfaces(sock).map_err(context("dump qdiscs".into()))? {
        for d in [Direction::Ingress, Direction::Egress] {
            let filters = tc::filters(sock, ifindex, d).map_err(context(format!("dump {} filters", d.name())))?;
            out.extend(filters.into_iter().filter(Filter::is_hostmesh));
        }
    }
    Ok(out)
}

fn filter_name(f: &Filter) -> String {
    let dev = ifaces::name(f.ifindex).unwrap_or_else(|| format!("ifindex {}", f.ifindex));
    format!("tc filter {} on {} of {dev}", f.name.as_deref().unwrap_or("?"), f.direction.name())
}

fn tc_err(op: impl Into<String>) -> impl FnOnce(io::Error) -> crate::backends::BackendError {
    let op = op.into();
    move |e| bpf_err(op, e)
}

/// hostmesh's clsact filters: the rtnetlink socket they are set through,
/// and the marks (under the pin dir) of the qdiscs hostmesh added.
pub(super) struct TcFilters {
    pins: PinDir,
    /// Opened when first needed.
    sock: Option<RouteSocket>,
}

impl TcFilters {
    pub(super) fn new(pins: PinDir) -> Self {
        TcFilters { pins, sock: None }
    }

    fn sock(&mut self) -> Result<&mut RouteSocket> {
        if self.sock.is_none() {
            self.sock = Some(RouteSocket::open().map_err(tc_err("open rtnetlink for tc filters"))?);
        }
        Ok(self.sock.as_mut().expect("just opened"))
    }

    /// hostmesh's filters on every clsact qdisc.
    fn hostmesh_filters(&mut self) -> Result<Vec<Filter>> {
        hostmesh_filters(self.sock()?).map_err(tc_err("list tc filters"))
    }

    /// Each hostmesh filter as the hook it is at, with the id of the
    /// program it runs and a name for errors.
    pub(super) fn observe(&mut self) -> Result<Vec<(Attachment, u32, String)>> {
        let mut out = Vec::new();
        for f in self.hostmesh_filters()? {
            let (Some(program), Some(dev)) = (f.name.as_deref().and_then(Program::from_name), ifaces::name(f.ifindex))
            else {
                continue;
            };
            out.push((Attachment { program, hook: hook(dev, f.direction) }, f.prog_id.unwrap_or(0), filter_name(&f)));
        }
        Ok(out)
    }

    /// Attaches (or replaces in place) hostmesh's clsact filter for `a`,
    /// running `prog`.
    pub(super) fn attach(&mut self, a: &Attachment, dev: &str, prog: BorrowedFd<'_>) -> Result<()> {
        let ifindex = ifaces::index(dev)
            .ok_or_else(|| bpf_err(format!("attach {a}"), io::Error::from_raw_os_error(libc::ENODEV)))?;
        let d = direction(a);
        let marker = self.pins.qdisc(ifindex);
        let sock = self.sock()?;
        let existing = tc::filters(sock, ifindex, d).map_err(tc_err(format!("dump {} filters of {dev}", d.name())))?;
        if let Some(f) = existing.iter().find(|f| f.squats()) {
            return Err(bpf_err(
                format!("attach {a}"),
                format!(
                    "{} of {dev} has a {} filter ({}) at priority {} handle {} that is not hostmesh's; hostmesh does \
                     not replace it (remove it, or move it to another priority)",
                    d.name(),
                    f.kind,
                    f.name.as_deref().unwrap_or("unnamed"),
                    tc::PRIO,
                    tc::HANDLE
                ),
            ));
        }
        let created = tc::create_clsact(sock, ifindex).map_err(tc_err(format!("add a clsact qdisc to {dev}")))?;
        if created {
            std::fs::create_dir_all(&marker).map_err(tc_err(format!("mark {}", marker.display())))?;
        }
        let replaced = tc::replace_bpf(sock, ifindex, d, prog.as_raw_fd(), a.program.name());
        if let Err(e) = replaced {
            if created {
                self.release_qdisc(ifindex)?;
            }
            return Err(bpf_err(format!("attach {a} as a clsact filter"), e));
        }
        Ok(())
    }

    /// Removes hostmesh's clsact filter for `a`, if there is one, and the
    /// qdisc hostmesh added for it once nothing is left on it.
    pub(super) fn remove(&mut self, a: &Attachment) -> Result<()> {
        // An interface that is gone took its filters and qdisc with it.
        let Some(ifindex) = a.device().and_then(ifaces::index) else { return Ok(()) };
        let d = direction(a);
        let sock = self.sock()?;
        let filters = tc::filters(sock, ifindex, d).map_err(tc_err(format!("dump {} filters", d.name())))?;
        if filters.iter().any(Filter::is_hostmesh) {
            tc::delete_bpf(sock, ifindex, d).map_err(tc_err(format!("detach {a} (clsact filter)")))?;
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
        for f in self.hostmesh_filters()? {
            let sock = self.sock()?;
            tc::delete_bpf(sock, f.ifindex, f.direction).map_err(tc_err(format!("delete {}", filter_name(&f))))?;
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
