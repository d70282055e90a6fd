//! Feature probes: what this kernel offers, found by loading tiny programs
//! and issuing the syscalls hostmesh will issue, never by version number
//! (RHEL and others backport). Each probe is a complete, valid program for
//! the hook it stands for, so a load that fails means the kernel lacks the
//! feature, not that the probe is wrong. Nothing is attached anywhere: the
//! TCX probe asks for a link on interface 0, which a kernel with TCX
//! answers with ENODEV (cilium/ebpf probes it the same way).
//!
//! The table of features and what each one's absence costs is
//! `model/kernel.rs`.

use std::io;
use std::os::fd::AsFd;

use super::sys::{self, Insn};
use crate::model::{Feature, KernelFeatures};

const BPF_PROG_TYPE_SOCKET_FILTER: u32 = 1;
const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
const BPF_PROG_TYPE_CGROUP_SOCK_ADDR: u32 = 18;
const BPF_PROG_TYPE_SK_LOOKUP: u32 = 30;

const BPF_CGROUP_INET4_CONNECT: u32 = 10;
const BPF_CGROUP_INET4_GETPEERNAME: u32 = 29;
const BPF_SK_LOOKUP: u32 = 36;
const BPF_TCX_INGRESS: u32 = 46;

const FN_SKB_SET_TUNNEL_KEY: i32 = 21;
const FN_GET_NETNS_COOKIE: i32 = 122;
const FN_REDIRECT_NEIGH: i32 = 152;
const FN_SET_RETVAL: i32 = 187;

/// The kernel refuses BPF altogether: nothing hostmesh does could work.
#[derive(Debug, thiserror::Error)]
#[error(
    "this kernel refuses to load BPF programs (bpf(BPF_PROG_LOAD): {0}); hostmesh needs the bpf() system call and \
     root, or CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON"
)]
pub(crate) struct NoBpf(pub io::Error);

/// `mov64 dst, imm`
const fn mov_imm(dst: u8, imm: i32) -> Insn {
    Insn { code: 0xb7, regs: dst, off: 0, imm }
}

const fn call(helper: i32) -> Insn {
    Insn { code: 0x85, regs: 0, off: 0, imm: helper }
}

const EXIT: Insn = Insn { code: 0x95, regs: 0, off: 0, imm: 0 };

/// `mov64 dst, src`
const fn mov_reg(dst: u8, src: u8) -> Insn {
    Insn { code: 0xbf, regs: dst | (src << 4), off: 0, imm: 0 }
}

/// `*(u64 *)(r10 + off) = 0`
const fn zero_stack(off: i16) -> Insn {
    Insn { code: 0x7a, regs: 10, off, imm: 0 }
}

/// `dst += imm`
const fn add_imm(dst: u8, imm: i32) -> Insn {
    Insn { code: 0x07, regs: dst, off: 0, imm }
}

/// `sizeof(struct bpf_tunnel_key)` with the tunnel's source address
/// (`local_ipv4`/`local_ipv6`); kernels before the field refuse the size.
const TUNNEL_KEY_WITH_SOURCE: i32 = 44;

fn loads(prog_type: u32, attach_type: u32, insns: &[Insn]) -> bool {
    sys::prog_load(prog_type, attach_type, insns).is_ok()
}

/// Probes every feature of `model::Feature`.
pub(crate) fn probe() -> Result<KernelFeatures, NoBpf> {
    // A socket filter that returns 0: if even this is refused, stop here.
    sys::prog_load(BPF_PROG_TYPE_SOCKET_FILTER, 0, &[mov_imm(0, 0), EXIT]).map_err(|(e, _)| NoBpf(e))?;

    let mut missing = Vec::new();
    for feature in Feature::ALL {
        if !has(feature) {
            missing.push(feature);
        }
    }
    Ok(KernelFeatures::lacking(missing))
}

fn has(feature: Feature) -> bool {
    match feature {
        Feature::Tcx => {
            let Ok(prog) = sys::prog_load(BPF_PROG_TYPE_SCHED_CLS, 0, &[mov_imm(0, 0), EXIT]) else { return false };
            matches!(
                sys::link_create(prog.as_fd(), 0, BPF_TCX_INGRESS),
                Err(e) if e.raw_os_error() == Some(libc::ENODEV)
            )
        }
        Feature::NetnsCookieSockopt => super::netns_cookie::read_with_sockopt().is_ok(),
        // bpf_set_retval(0); return 1;
        Feature::SetRetval => loads(
            BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
            BPF_CGROUP_INET4_CONNECT,
            &[mov_imm(1, 0), call(FN_SET_RETVAL), mov_imm(0, 1), EXIT],
        ),
        // A getpeername4 program (the newest hook the connect-time
        // programs use) calling bpf_get_netns_cookie(ctx), the context
        // being in r1 on entry; return 1.
        Feature::ConnectTimeHooks => loads(
            BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
            BPF_CGROUP_INET4_GETPEERNAME,
            &[call(FN_GET_NETNS_COOKIE), mov_imm(0, 1), EXIT],
        ),
        // return SK_PASS;
        Feature::SkLookup => loads(BPF_PROG_TYPE_SK_LOOKUP, BPF_SK_LOOKUP, &[mov_imm(0, 1), EXIT]),
        // return bpf_skb_set_tunnel_key(skb, &(struct bpf_tunnel_key){},
        // 44, 0), run once on a packet: 0 if the kernel knows the size
        // that carries a source address, -EINVAL if not.
        Feature::TunnelSource => {
            let insns = [
                mov_reg(6, 1),
                zero_stack(-48),
                zero_stack(-40),
                zero_stack(-32),
                zero_stack(-24),
                zero_stack(-16),
                zero_stack(-8),
                mov_reg(2, 10),
                add_imm(2, -48),
                mov_reg(1, 6),
                mov_imm(3, TUNNEL_KEY_WITH_SOURCE),
                mov_imm(4, 0),
                call(FN_SKB_SET_TUNNEL_KEY),
                EXIT,
            ];
            let Ok(prog) = sys::prog_load(BPF_PROG_TYPE_SCHED_CLS, 0, &insns) else { return false };
            sys::prog_test_run(prog.as_fd(), &[0u8; 64]).is_ok_and(|rc| rc == 0)
        }
        Feature::SockDestroy => crate::backends::netlink::sock_destroy::supported(),
        // return bpf_redirect_neigh(1, NULL, 0, 0);
        Feature::RedirectNeigh => loads(
            BPF_PROG_TYPE_SCHED_CLS,
            0,
            &[mov_imm(1, 1), mov_imm(2, 0), mov_imm(3, 0), mov_imm(4, 0), call(FN_REDIRECT_NEIGH), EXIT],
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_encode_as_the_kernel_reads_them() {
        assert_eq!(std::mem::size_of::<Insn>(), 8);
        let m = mov_imm(2, 7);
        assert_eq!((m.code, m.regs, m.imm), (0xb7, 0x02, 7));
        let r = mov_reg(2, 10);
        assert_eq!((r.code, r.regs), (0xbf, 0xa2));
        let z = zero_stack(-48);
        assert_eq!((z.code, z.regs, z.off), (0x7a, 0x0a, -48));
        let c = call(FN_SET_RETVAL);
        assert_eq!((c.code, c.imm), (0x85, 187));
    }
}
