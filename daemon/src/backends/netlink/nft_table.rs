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

#[cfg(test)]
mod tests {
    use super::*;

    fn nft(script: &str) {
        use std::io::Write;
        let mut child = std::process::Command::new("nft")
            .args(["-f", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("run nft");
        child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
        assert!(child.wait().unwrap().success(), "nft -f - <<< {script}");
    }

    /// In a network namespace of its own (a thread's): no table, then the
    /// one nft made (and no other), then none again.
    #[test]
    fn the_kernel_says_whether_a_table_exists() {
        std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
            assert!(!inet_table_exists("hostmesh").unwrap());
            nft("table inet hostmesh\n");
            assert!(inet_table_exists("hostmesh").unwrap());
            assert!(!inet_table_exists("hostmesh2").unwrap());
            nft("table ip hm-other\n");
            assert!(!inet_table_exists("hm-other").unwrap(), "an ip table is not an inet one");
            nft("delete table inet hostmesh\n");
            assert!(!inet_table_exists("hostmesh").unwrap());
        })
        .join()
        .unwrap();
    }
}
