//! Whether an nftables table exists, asked of the kernel (NFT_MSG_GETTABLE
//! on nfnetlink), so that a sync with no table to read starts no `nft`:
//! starting that tool costs tens of milliseconds here and about a second
//! of CPU in a VM under emulation, at every full sync.

use std::io;

use netlink_packet_netfilter::nftables::{NfTablesMessage, TableAttribute, TableMessage};
use netlink_packet_netfilter::{NetfilterHeader, NetfilterMessage, NetfilterProtoFamily};
use netlink_sys::protocols::NETLINK_NETFILTER;

use super::socket::{errno, NetlinkSocket};

/// Whether table `inet NAME` exists in this network namespace. A kernel
/// without nf_tables has none; any other failure is the caller's to
/// handle (it can still ask the nft tool).
pub(crate) fn inet_table_exists(name: &str) -> io::Result<bool> {
    let mut sock: NetlinkSocket<NetfilterMessage> = match NetlinkSocket::open_protocol(NETLINK_NETFILTER) {
        Ok(sock) => sock,
        Err(e) if no_nftables(&e) => return Ok(false),
        Err(e) => return Err(e),
    };
    let request = NetfilterMessage::new(
        NetfilterHeader::new(NetfilterProtoFamily::Inet, 0, 0),
        NfTablesMessage::GetTable(TableMessage { attributes: vec![TableAttribute::Name(name.to_string())] }),
    );
    match sock.query(request) {
        Ok(answers) => Ok(!answers.is_empty()),
        Err(e) if errno(&e) == Some(libc::ENOENT) || no_nftables(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// nfnetlink, or its nf_tables subsystem, is not in this kernel.
fn no_nftables(e: &io::Error) -> bool {
    matches!(errno(e), Some(libc::EPROTONOSUPPORT | libc::EOPNOTSUPP | libc::EAFNOSUPPORT))
}
