//! The probe programs hostmesh loads and attaches, by their function names
//! in the object files, with the object each is in.

use serde::Serialize;

/// A probe program, by its function name in the object file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Program {
    /// TC egress on hm-natin: service NAT for the bpfnat veth path, for
    /// flows whose backend is reached out of an interface.
    NatIn,
    /// TC ingress on hm-natout: service NAT for the bpfnat veth path, for
    /// what hm_natin leaves (local backends, refusals).
    NatOut,
    /// TC ingress on host interfaces and lo: reverse NAT of replies.
    Reply,
    /// TC egress on host interfaces and lo: the host's own traffic straight
    /// to a backend retires the conntrack entries of its tuple.
    Direct,
    Connect4,
    Connect6,
    Sendmsg4,
    Sendmsg6,
    Recvmsg4,
    Recvmsg6,
    Getpeername4,
    Getpeername6,
    /// cgroup sock_release: a closed socket's entry in HM_REVERSE_SOCK
    /// goes (attached where the kernel has the hook: `Feature::SockRelease`).
    SockRelease,
    /// sk_lookup on the daemon's network namespace: mesh redirects.
    Mesh,
    /// TC ingress on hm-tun0: VNI check, return-path learning.
    TunIn,
    /// TC egress on hm-tun0: the tunnel destination.
    TunOut,
    /// TC ingress on hm-wg0: marks what WireGuard decrypted, so hm_tun_in
    /// takes an encrypted peer's VXLAN only from there.
    WgIn,
}

impl Program {
    pub const ALL: [Program; 17] = [
        Program::NatIn,
        Program::NatOut,
        Program::Reply,
        Program::Direct,
        Program::Connect4,
        Program::Connect6,
        Program::Sendmsg4,
        Program::Sendmsg6,
        Program::Recvmsg4,
        Program::Recvmsg6,
        Program::Getpeername4,
        Program::Getpeername6,
        Program::SockRelease,
        Program::Mesh,
        Program::TunIn,
        Program::TunOut,
        Program::WgIn,
    ];

    /// The connect-time programs, attached together to one cgroup
    /// (`SockRelease` only where the kernel has its hook).
    pub const CONNECT_TIME: [Program; 9] = [
        Program::Connect4,
        Program::Connect6,
        Program::Sendmsg4,
        Program::Sendmsg6,
        Program::Recvmsg4,
        Program::Recvmsg6,
        Program::Getpeername4,
        Program::Getpeername6,
        Program::SockRelease,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Program::NatIn => "hm_natin",
            Program::NatOut => "hm_natout",
            Program::Reply => "hm_reply",
            Program::Direct => "hm_direct",
            Program::Connect4 => "hm_connect4",
            Program::Connect6 => "hm_connect6",
            Program::Sendmsg4 => "hm_sendmsg4",
            Program::Sendmsg6 => "hm_sendmsg6",
            Program::Recvmsg4 => "hm_recvmsg4",
            Program::Recvmsg6 => "hm_recvmsg6",
            Program::Getpeername4 => "hm_getpeername4",
            Program::Getpeername6 => "hm_getpeername6",
            Program::SockRelease => "hm_sock_release",
            Program::Mesh => "hm_mesh",
            Program::TunIn => "hm_tun_in",
            Program::TunOut => "hm_tun_out",
            Program::WgIn => "hm_wg_in",
        }
    }

    pub fn from_name(name: &str) -> Option<Program> {
        Program::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The probe object that holds it (for the connect-time programs, the
    /// loader takes the variant the kernel runs).
    pub fn object(self) -> crate::abi::ProbeObject {
        use crate::abi::ProbeObject;
        match self {
            Program::NatIn | Program::NatOut | Program::Reply | Program::Direct => ProbeObject::ServiceNat,
            Program::Connect4
            | Program::Connect6
            | Program::Sendmsg4
            | Program::Sendmsg6
            | Program::Recvmsg4
            | Program::Recvmsg6
            | Program::Getpeername4
            | Program::Getpeername6
            | Program::SockRelease => ProbeObject::ServiceCtlb,
            Program::Mesh => ProbeObject::Mesh,
            Program::TunIn | Program::TunOut | Program::WgIn => ProbeObject::Gateway,
        }
    }
}
