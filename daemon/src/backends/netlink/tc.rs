//! Typed traffic-control helpers: clsact qdiscs and direct-action `bpf`
//! filters, for kernels without TCX (before 6.6) or hosts that ask for
//! netlink attachment (`[daemon] tc_attach = "netlink"`).
//!
//! hostmesh's filters are the `bpf` filters at priority `PRIO` with handle
//! `HANDLE` whose program is named `hm_*`: one per interface and
//! direction. Anything else on a qdisc — another tool's filters at other
//! priorities, or a filter at ours that is not hostmesh's — is read but
//! never changed. A filter is replaced in place (`NLM_F_REPLACE` on the
//! same priority and handle, an atomic program swap in the kernel), never
//! deleted and added again.

use std::io;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};
use netlink_packet_route::tc::{TcAttribute, TcBpfFlags, TcFilterBpfOption, TcHandle, TcHeader, TcMessage, TcOption};
use netlink_packet_route::RouteNetlinkMessage;

use super::socket::errno;
use super::socket::RouteSocket;

/// The priority of hostmesh's filters: hostmesh's route protocol number,
/// clear of 1 (where Cilium and others put theirs) and of the kernel's
/// automatic priorities (49152 and down).
pub const PRIO: u16 = 104;
/// The handle of hostmesh's filter at `PRIO`.
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
    /// At hostmesh's priority and handle, a `bpf` filter named `hm_*`.
    pub fn is_hostmesh(&self) -> bool {
        self.prio == PRIO
            && self.handle == HANDLE
            && self.kind == "bpf"
            && self.name.as_deref().is_some_and(|n| n.starts_with("hm_"))
    }

    /// At hostmesh's priority and handle but not hostmesh's: a slot
    /// hostmesh will not take.
    pub fn squats(&self) -> bool {
        self.prio == PRIO && self.handle == HANDLE && !self.is_hostmesh()
    }
}

fn header(ifindex: u32, parent: TcHandle, handle: u32, info: u32) -> TcHeader {
    TcHeader { index: ifindex as i32, parent, handle: TcHandle::from(handle), info, ..TcHeader::default() }
}

/// `tcm_info` of a filter: the priority above the (network-order) protocol.
fn filter_info() -> u32 {
    (u32::from(PRIO) << 16) | u32::from(ETH_P_ALL.to_be())
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

/// Creates hostmesh's filter, or swaps the program of the one there, in
/// direct-action mode.
pub fn replace_bpf(
    sock: &mut RouteSocket,
    ifindex: u32,
    direction: Direction,
    prog_fd: i32,
    name: &str,
) -> io::Result<()> {
    let mut msg = TcMessage::from_parts(header(ifindex, direction.parent(), HANDLE, filter_info()), Vec::new());
    msg.attributes.push(TcAttribute::Kind("bpf".into()));
    msg.attributes.push(TcAttribute::Options(vec![
        TcOption::Bpf(TcFilterBpfOption::ProgFd(prog_fd as u32)),
        TcOption::Bpf(TcFilterBpfOption::ProgName(name.to_string())),
        TcOption::Bpf(TcFilterBpfOption::Flags(TcBpfFlags::DirectAction)),
    ]));
    sock.request(RouteNetlinkMessage::NewTrafficFilter(msg), NLM_F_CREATE | NLM_F_REPLACE)
}

/// Deletes hostmesh's filter (by priority and handle: only that one).
pub fn delete_bpf(sock: &mut RouteSocket, ifindex: u32, direction: Direction) -> io::Result<()> {
    let mut msg = TcMessage::from_parts(header(ifindex, direction.parent(), HANDLE, filter_info()), Vec::new());
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
    fn only_hm_bpf_filters_at_our_slot_are_ours() {
        assert!(filter(PRIO, HANDLE, "bpf", Some("hm_reply")).is_hostmesh());
        let foreign = [
            filter(1, HANDLE, "bpf", Some("hm_reply")),
            filter(PRIO, 2, "bpf", Some("hm_reply")),
            filter(PRIO, HANDLE, "u32", None),
            filter(PRIO, HANDLE, "bpf", Some("cil_from_netdev")),
            filter(PRIO, HANDLE, "bpf", None),
        ];
        for f in &foreign {
            assert!(!f.is_hostmesh(), "{f:?}");
        }
        assert!(foreign[2].squats() && foreign[3].squats() && !foreign[0].squats());
    }

    #[test]
    fn the_filter_info_carries_priority_and_protocol_as_the_kernel_reads_them() {
        let info = filter_info();
        assert_eq!(info >> 16, u32::from(PRIO));
        // TC_H_MIN(info) is the protocol in network byte order.
        assert_eq!(u16::from_be((info & 0xffff) as u16), ETH_P_ALL);
        assert_eq!(u32::from(Direction::Ingress.parent()), 0xffff_fff2);
        assert_eq!(u32::from(Direction::Egress.parent()), 0xffff_fff3);
    }
}
