//! Typed policy-rule helpers (`ip rule`). hostmesh's rules carry its route
//! protocol number (FRA_PROTOCOL), which is how they are found again;
//! nobody else's is touched.

use std::io;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::route::RouteProtocol;
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleFlags, RuleMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::socket::errno;
use super::socket::RouteSocket as NetlinkSocket;
use crate::model::RuleSpec;

/// The rules with protocol `protocol`, of both families, as hostmesh
/// writes them; one of another shape is left out (never ours).
pub(super) fn dump(sock: &mut NetlinkSocket, protocol: u8) -> io::Result<Vec<RuleSpec>> {
    let mut out = Vec::new();
    for family in [AddressFamily::Inet, AddressFamily::Inet6] {
        let mut req = RuleMessage::default();
        req.header.family = family;
        for m in sock.dump(RouteNetlinkMessage::GetRule(req))? {
            if let RouteNetlinkMessage::NewRule(r) = m {
                out.extend(parse(&r, protocol));
            }
        }
    }
    Ok(out)
}

fn parse(m: &RuleMessage, protocol: u8) -> Option<RuleSpec> {
    let (mut ours, mut priority, mut mark, mut table) = (false, 0, None, u32::from(m.header.table));
    for a in &m.attributes {
        match a {
            RuleAttribute::Protocol(p) => ours = u8::from(*p) == protocol,
            RuleAttribute::Priority(p) => priority = *p,
            RuleAttribute::FwMark(v) => mark = Some(*v),
            RuleAttribute::Table(t) => table = *t,
            _ => {}
        }
    }
    if !ours || !m.header.flags.contains(RuleFlags::Invert) || m.header.action != RuleAction::ToTable {
        return None;
    }
    Some(RuleSpec { v6: m.header.family == AddressFamily::Inet6, priority, not_fwmark: mark?, table })
}

fn message(rule: &RuleSpec, protocol: u8) -> RuleMessage {
    let mut m = RuleMessage::default();
    m.header.family = if rule.v6 { AddressFamily::Inet6 } else { AddressFamily::Inet };
    m.header.action = RuleAction::ToTable;
    m.header.flags = RuleFlags::Invert;
    // RT_TABLE_UNSPEC: the attribute carries the id.
    m.header.table = 0;
    m.attributes.push(RuleAttribute::Priority(rule.priority));
    m.attributes.push(RuleAttribute::FwMark(rule.not_fwmark));
    m.attributes.push(RuleAttribute::FwMask(u32::MAX));
    m.attributes.push(RuleAttribute::Table(rule.table));
    m.attributes.push(RuleAttribute::Protocol(RouteProtocol::from(protocol)));
    m
}

/// `ip rule add priority P not fwmark M lookup T proto P`; one that exists
/// already is fine.
pub(super) fn add(sock: &mut NetlinkSocket, rule: &RuleSpec, protocol: u8) -> io::Result<()> {
    match sock.request(RouteNetlinkMessage::NewRule(message(rule, protocol)), NLM_F_CREATE | NLM_F_EXCL) {
        Err(e) if errno(&e) == Some(libc::EEXIST) => Ok(()),
        r => r,
    }
}

/// `ip rule del …`; one that is gone already is fine.
pub(super) fn delete(sock: &mut NetlinkSocket, rule: &RuleSpec, protocol: u8) -> io::Result<()> {
    match sock.request(RouteNetlinkMessage::DelRule(message(rule, protocol)), 0) {
        Err(e) if matches!(errno(&e), Some(libc::ENOENT) | Some(libc::ESRCH)) => Ok(()),
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_rule_reads_back_as_itself_and_only_ours_count() {
        let rule = RuleSpec { v6: true, priority: 32700, not_fwmark: 0x686d_7767, table: 26733 };
        assert_eq!(parse(&message(&rule, 0x68), 0x68), Some(rule.clone()));
        assert_eq!(parse(&message(&rule, 0x68), 0x69), None, "another protocol's rule is not ours");
        let mut plain = message(&rule, 0x68);
        plain.header.flags = RuleFlags::empty();
        assert_eq!(parse(&plain, 0x68), None, "a rule without `not` is not of our shape");
    }
}
