//! Typed traffic-control helpers: clsact qdiscs and direct-action `bpf`
//! filters, for kernels without TCX (before 6.6) or hosts that ask for
//! netlink attachment (`[daemon] tc_attach = "netlink"`).
//!
//! hostmesh's filters are the `bpf` filters with handle `HANDLE` whose
//! program is named `hm_*`, at priority `PRIO_FIRST` or `PRIO_AFTER`: one
//! per interface and direction. They go first (priority 1), where TCX
//! programs run on newer kernels, so that another tool's filter that ends
//! classification (`action pass`) cannot hide packets from them; they pass
//! on what they leave alone. Only where another tool holds priority 1 do
//! they go after it, at `PRIO_AFTER` (`slot`). Anything else on a qdisc is
//! read but never changed. A filter is replaced in place (`NLM_F_REPLACE`
//! on the same priority and handle, an atomic program swap in the kernel),
//! never deleted and added again.

use std::io;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};
use netlink_packet_route::tc::{TcAttribute, TcBpfFlags, TcFilterBpfOption, TcHandle, TcHeader, TcMessage, TcOption};
use netlink_packet_route::RouteNetlinkMessage;

use super::socket::errno;
use super::socket::RouteSocket;

/// The priority of hostmesh's filters: the first a filter can have, so
/// they run before every other filter on the hook, as TCX programs run
/// before every clsact filter.
pub const PRIO_FIRST: u16 = 1;
/// Where they go when another tool holds priority 1 (and where builds
/// before Dec 2026 put them all): hostmesh's route protocol number, clear
/// of the kernel's automatic priorities (49152 and down).
pub const PRIO_AFTER: u16 = 104;
/// The handle of hostmesh's filters.
pub const HANDLE: u32 = 1;

const ETH_P_ALL: u16 = libc::ETH_P_ALL as u16;
/// `TC_H_MAKE(TC_H_CLSACT, 0)`: the clsact qdisc's own handle.
const CLSACT_HANDLE: u32 = 0xffff_0000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Direction {
    Ingress,
    Egress,
}

impl Direction {
    fn parent(self) -> TcHandle {
        let minor = match self {
            Direction::Ingress => TcHandle::MIN_INGRESS,
            Direction::Egress => TcHandle::MIN_EGRESS,
        };
        TcHandle { major: 0xffff, minor }
    }

    pub fn name(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }
}

/// A filter on a clsact qdisc, as dumped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    pub ifindex: u32,
    pub direction: Direction,
    pub prio: u16,
    pub handle: u32,
    /// `bpf`, `u32`, `flower`...
    pub kind: String,
    /// bpf filters: the name given when it was attached.
    pub name: Option<String>,
    pub prog_id: Option<u32>,
    pub tag: Option<[u8; 8]>,
}

impl Filter {
    /// At one of hostmesh's priorities with its handle, a `bpf` filter
    /// named `hm_*`.
    pub fn is_hostmesh(&self) -> bool {
        [PRIO_FIRST, PRIO_AFTER].contains(&self.prio)
            && self.handle == HANDLE
            && self.kind == "bpf"
            && self.name.as_deref().is_some_and(|n| n.starts_with("hm_"))
    }
}

/// Where hostmesh's filter goes on a hook holding `filters` (all of them,
/// hostmesh's included): `PRIO_FIRST` unless another tool's filter holds
/// that priority, then `PRIO_AFTER`; when another tool holds both, that
/// tool's filter at `PRIO_AFTER`.
pub fn slot(filters: &[Filter]) -> Result<u16, &Filter> {
    let held = |prio: u16| filters.iter().find(|f| f.prio == prio && !f.is_hostmesh());
    match (held(PRIO_FIRST), held(PRIO_AFTER)) {
        (None, _) => Ok(PRIO_FIRST),
        (Some(_), None) => Ok(PRIO_AFTER),
        (Some(_), Some(f)) => Err(f),
    }
}

/// Other tools' filters on the hook that run before a filter at `prio`:
/// any of them that ends classification hides packets from it.
pub fn ahead(filters: &[Filter], prio: u16) -> Vec<&Filter> {
    filters.iter().filter(|f| f.prio < prio && !f.is_hostmesh()).collect()
}

fn header(ifindex: u32, parent: TcHandle, handle: u32, info: u32) -> TcHeader {
    TcHeader { index: ifindex as i32, parent, handle: TcHandle::from(handle), info, ..TcHeader::default() }
}

/// `tcm_info` of a filter: the priority above the (network-order) protocol.
fn filter_info(prio: u16) -> u32 {
    (u32::from(prio) << 16) | u32::from(ETH_P_ALL.to_be())
}

/// The interfaces that have a clsact qdisc.
pub fn clsact_interfaces(sock: &mut RouteSocket) -> io::Result<Vec<u32>> {
    let mut out = Vec::new();
    for m in sock.dump(RouteNetlinkMessage::GetQueueDiscipline(TcMessage::default()))? {
        if let RouteNetlinkMessage::NewQueueDiscipline(q) = m {
            let clsact = q.attributes.iter().any(|a| matches!(a, TcAttribute::Kind(k) if k == "clsact"));
            if clsact && q.header.index > 0 {
                out.push(q.header.index as u32);
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Adds a clsact qdisc. Returns false when the interface already has one
/// (then it is someone else's, or hostmesh's from before).
pub fn create_clsact(sock: &mut RouteSocket, ifindex: u32) -> io::Result<bool> {
    let mut msg = TcMessage::from_parts(header(ifindex, TcHandle::CLSACT, CLSACT_HANDLE, 0), Vec::new());
    msg.attributes.push(TcAttribute::Kind("clsact".into()));
    match sock.request(RouteNetlinkMessage::NewQueueDiscipline(msg), NLM_F_CREATE | NLM_F_EXCL) {
        Ok(()) => Ok(true),
        Err(e) if errno(&e) == Some(libc::EEXIST) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Deletes the interface's clsact qdisc (and whatever is still on it:
/// callers check that nothing is).
pub fn delete_clsact(sock: &mut RouteSocket, ifindex: u32) -> io::Result<()> {
    let mut msg = TcMessage::from_parts(header(ifindex, TcHandle::CLSACT, CLSACT_HANDLE, 0), Vec::new());
    msg.attributes.push(TcAttribute::Kind("clsact".into()));
    match sock.request(RouteNetlinkMessage::DelQueueDiscipline(msg), 0) {
        Err(e) if matches!(errno(&e), Some(libc::ENOENT) | Some(libc::ENODEV) | Some(libc::EINVAL)) => Ok(()),
        r => r,
    }
}

/// Every filter in one direction of an interface's clsact qdisc.
pub fn filters(sock: &mut RouteSocket, ifindex: u32, direction: Direction) -> io::Result<Vec<Filter>> {
    let req = TcMessage::from_parts(header(ifindex, direction.parent(), 0, 0), Vec::new());
    let answers = match sock.dump(RouteNetlinkMessage::GetTrafficFilter(req)) {
        // The interface or its qdisc went away meanwhile.
        Err(e) if matches!(errno(&e), Some(libc::ENODEV) | Some(libc::EINVAL) | Some(libc::ENOENT)) => {
            return Ok(Vec::new())
        }
        r => r?,
    };
    let mut out = Vec::new();
    for m in answers {
        let RouteNetlinkMessage::NewTrafficFilter(f) = m else { continue };
        let handle = u32::from(f.header.handle);
        // Each priority's chain element comes first, with handle 0.
        if handle == 0 {
            continue;
        }
        let mut filter = Filter {
            ifindex,
            direction,
            prio: (f.header.info >> 16) as u16,
            handle,
            kind: String::new(),
            name: None,
            prog_id: None,
            tag: None,
        };
        for attr in &f.attributes {
            match attr {
                TcAttribute::Kind(k) => filter.kind = k.clone(),
                TcAttribute::Options(opts) => {
                    for o in opts {
                        match o {
                            TcOption::Bpf(TcFilterBpfOption::ProgName(n)) => filter.name = Some(n.clone()),
                            TcOption::Bpf(TcFilterBpfOption::ProgId(id)) => filter.prog_id = Some(*id),
                            TcOption::Bpf(TcFilterBpfOption::ProgTag(t)) => filter.tag = Some(*t),
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        out.push(filter);
    }
    Ok(out)
}

/// Where a filter is: interface, direction and priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub ifindex: u32,
    pub direction: Direction,
    pub prio: u16,
}

/// Creates hostmesh's filter at `at`, or swaps the program of the one
/// there, in direct-action mode.
pub fn replace_bpf(sock: &mut RouteSocket, at: Slot, prog_fd: i32, name: &str) -> io::Result<()> {
    let mut msg =
        TcMessage::from_parts(header(at.ifindex, at.direction.parent(), HANDLE, filter_info(at.prio)), Vec::new());
    msg.attributes.push(TcAttribute::Kind("bpf".into()));
    msg.attributes.push(TcAttribute::Options(vec![
        TcOption::Bpf(TcFilterBpfOption::ProgFd(prog_fd as u32)),
        TcOption::Bpf(TcFilterBpfOption::ProgName(name.to_string())),
        TcOption::Bpf(TcFilterBpfOption::Flags(TcBpfFlags::DirectAction)),
    ]));
    sock.request(RouteNetlinkMessage::NewTrafficFilter(msg), NLM_F_CREATE | NLM_F_REPLACE)
}

/// Deletes hostmesh's filter at `at` (by priority and handle: only that
/// one).
pub fn delete_bpf(sock: &mut RouteSocket, at: Slot) -> io::Result<()> {
    let mut msg =
        TcMessage::from_parts(header(at.ifindex, at.direction.parent(), HANDLE, filter_info(at.prio)), Vec::new());
    msg.attributes.push(TcAttribute::Kind("bpf".into()));
    match sock.request(RouteNetlinkMessage::DelTrafficFilter(msg), 0) {
        Err(e) if matches!(errno(&e), Some(libc::ENOENT) | Some(libc::ENODEV) | Some(libc::EINVAL)) => Ok(()),
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(prio: u16, handle: u32, kind: &str, name: Option<&str>) -> Filter {
        Filter {
            ifindex: 2,
            direction: Direction::Ingress,
            prio,
            handle,
            kind: kind.into(),
            name: name.map(String::from),
            prog_id: Some(7),
            tag: None,
        }
    }

    #[test]
    fn only_hm_bpf_filters_at_our_slots_are_ours() {
        for prio in [PRIO_FIRST, PRIO_AFTER] {
            assert!(filter(prio, HANDLE, "bpf", Some("hm_reply")).is_hostmesh());
        }
        let foreign = [
            filter(2, HANDLE, "bpf", Some("hm_reply")),
            filter(PRIO_FIRST, 2, "bpf", Some("hm_reply")),
            filter(PRIO_AFTER, HANDLE, "u32", None),
            filter(PRIO_FIRST, HANDLE, "bpf", Some("cil_from_netdev")),
            filter(PRIO_AFTER, HANDLE, "bpf", None),
        ];
        for f in &foreign {
            assert!(!f.is_hostmesh(), "{f:?}");
        }
    }

    #[test]
    fn hostmesh_goes_first_unless_another_tool_holds_priority_1() {
        let ours_after = filter(PRIO_AFTER, HANDLE, "bpf", Some("hm_reply"));
        let ours_first = filter(PRIO_FIRST, HANDLE, "bpf", Some("hm_reply"));
        let pass_at_7 = filter(7, 1, "matchall", None);
        // Nothing there, another tool after 1, or hostmesh's own filter
        // at either priority (an older build's at 104 moves to 1).
        assert_eq!(slot(&[]), Ok(PRIO_FIRST));
        assert_eq!(slot(&[pass_at_7.clone(), ours_after.clone()]), Ok(PRIO_FIRST));
        assert_eq!(slot(std::slice::from_ref(&ours_first)), Ok(PRIO_FIRST));
        assert!(ahead(&[pass_at_7.clone(), ours_first.clone()], PRIO_FIRST).is_empty());
        // Another tool at 1, whatever its handle: hostmesh goes after it,
        // and the filters ahead of it are named.
        let cilium = filter(PRIO_FIRST, 1, "bpf", Some("cil_from_netdev"));
        let held = [cilium.clone(), pass_at_7.clone(), ours_first.clone()];
        assert_eq!(slot(&held), Ok(PRIO_AFTER));
        assert_eq!(ahead(&held, PRIO_AFTER), [&cilium, &pass_at_7]);
        assert_eq!(slot(&[filter(PRIO_FIRST, 9, "u32", None)]), Ok(PRIO_AFTER));
        // Both held: no slot; the error names the one at 104.
        let squat = filter(PRIO_AFTER, HANDLE, "u32", None);
        assert_eq!(slot(&[cilium, squat.clone()]), Err(&squat));
    }

    #[test]
    fn the_filter_info_carries_priority_and_protocol_as_the_kernel_reads_them() {
        let info = filter_info(PRIO_AFTER);
        assert_eq!(info >> 16, u32::from(PRIO_AFTER));
        // TC_H_MIN(info) is the protocol in network byte order.
        assert_eq!(u16::from_be((info & 0xffff) as u16), ETH_P_ALL);
        assert_eq!(u32::from(Direction::Ingress.parent()), 0xffff_fff2);
        assert_eq!(u32::from(Direction::Egress.parent()), 0xffff_fff3);
    }
}
