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

use super::asm::{add_imm, call, exit, mov_imm, mov_reg, zero_stack};
use super::sys::{self, Insn};
use crate::model::{Feature, KernelFeatures};
use aya_obj::generated::bpf_attach_type::{
    BPF_CGROUP_INET4_CONNECT, BPF_CGROUP_INET4_GETPEERNAME, BPF_CGROUP_INET_SOCK_RELEASE, BPF_SK_LOOKUP,
    BPF_TCX_INGRESS,
};
use aya_obj::generated::bpf_func_id::{
    BPF_FUNC_get_netns_cookie, BPF_FUNC_get_socket_cookie, BPF_FUNC_ktime_get_coarse_ns, BPF_FUNC_redirect_neigh,
    BPF_FUNC_set_retval, BPF_FUNC_skb_set_tunnel_key,
};
use aya_obj::generated::bpf_prog_type::{
    BPF_PROG_TYPE_CGROUP_SOCK, BPF_PROG_TYPE_CGROUP_SOCK_ADDR, BPF_PROG_TYPE_SCHED_CLS, BPF_PROG_TYPE_SK_LOOKUP,
    BPF_PROG_TYPE_SOCKET_FILTER,
};

/// The kernel refuses BPF altogether: nothing hostmesh does could work.
#[derive(Debug, thiserror::Error)]
#[error(
    "this kernel refuses to load BPF programs (bpf(BPF_PROG_LOAD): {0}); hostmesh needs the bpf() system call and \
     root, or CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON"
)]
pub(crate) struct NoBpf(pub io::Error);

/// `sizeof(struct bpf_tunnel_key)` with the tunnel's source address;
/// kernels before the field refuse the size.
const TUNNEL_KEY_WITH_SOURCE: i32 = crate::abi::TUNNEL_KEY_SIZE as i32;

fn loads(
    prog_type: aya_obj::generated::bpf_prog_type,
    attach_type: Option<aya_obj::generated::bpf_attach_type>,
    insns: &[Insn],
) -> bool {
    sys::prog_load(prog_type, attach_type, insns).is_ok()
}

/// Probes every feature of `model::Feature`.
pub(crate) fn probe() -> Result<KernelFeatures, NoBpf> {
    // A socket filter that returns 0: if even this is refused, stop here.
    sys::prog_load(BPF_PROG_TYPE_SOCKET_FILTER, None, &[mov_imm(0, 0), exit()]).map_err(|(e, _)| NoBpf(e))?;

    // Side by side, a thread each, and aya's own probes (which its first
    // load would run) beside them: each probe waits on the kernel, and in
    // the emulated VMs they took a start 1.5 s one after another.
    let missing = std::thread::scope(|s| {
        let aya = s.spawn(aya::features);
        let probes: Vec<_> = Feature::ALL.into_iter().map(|f| (f, s.spawn(move || has(f)))).collect();
        let missing: Vec<Feature> = probes
            .into_iter()
            .filter_map(|(f, probe)| {
                let has = probe.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                (!has).then_some(f)
            })
            .collect();
        let _ = aya.join();
        missing
    });
    Ok(KernelFeatures::lacking(missing))
}

fn has(feature: Feature) -> bool {
    match feature {
        Feature::Tcx => {
            let Ok(prog) = sys::prog_load(BPF_PROG_TYPE_SCHED_CLS, None, &[mov_imm(0, 0), exit()]) else {
                return false;
            };
            matches!(
                sys::link_create(prog.as_fd(), 0, BPF_TCX_INGRESS),
                Err(e) if e.raw_os_error() == Some(libc::ENODEV)
            )
        }
        Feature::NetnsCookieSockopt => super::netns_cookie::read_with_sockopt().is_ok(),
        // bpf_set_retval(0); return 1;
        Feature::SetRetval => loads(
            BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
            Some(BPF_CGROUP_INET4_CONNECT),
            &[mov_imm(1, 0), call(BPF_FUNC_set_retval), mov_imm(0, 1), exit()],
        ),
        // A getpeername4 program (the newest hook the connect-time
        // programs use) calling bpf_get_netns_cookie(ctx), the context
        // being in r1 on entry; return 1.
        Feature::ConnectTimeHooks => loads(
            BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
            Some(BPF_CGROUP_INET4_GETPEERNAME),
            &[call(BPF_FUNC_get_netns_cookie), mov_imm(0, 1), exit()],
        ),
        Feature::SockRelease => sock_release_loads(),
        // return SK_PASS;
        Feature::SkLookup => loads(BPF_PROG_TYPE_SK_LOOKUP, Some(BPF_SK_LOOKUP), &[mov_imm(0, 1), exit()]),
        // return bpf_skb_set_tunnel_key(skb, &(struct bpf_tunnel_key){},
        // sizeof(struct bpf_tunnel_key), 0), run once on a packet: 0 if
        // the kernel knows the size that carries a source address,
        // -EINVAL if not.
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
                call(BPF_FUNC_skb_set_tunnel_key),
                exit(),
            ];
            let Ok(prog) = sys::prog_load(BPF_PROG_TYPE_SCHED_CLS, None, &insns) else { return false };
            sys::prog_test_run(prog.as_fd(), &[0u8; 64], &[]).is_ok_and(|r| r.retval == 0)
        }
        Feature::SockDestroy => crate::backends::netlink::sock_destroy::supported(),
        // bpf_ktime_get_coarse_ns(); return 0; (a TC program, as the
        // veth path's programs that read it are)
        Feature::CoarseClock => {
            loads(BPF_PROG_TYPE_SCHED_CLS, None, &[call(BPF_FUNC_ktime_get_coarse_ns), mov_imm(0, 0), exit()])
        }
        Feature::MapBatch => super::batch::supported(),
        Feature::Wireguard => crate::backends::netlink::link::wireguard_supported(),
        Feature::RouteEncap => crate::backends::netlink::route::encap_supported(),
        // return bpf_redirect_neigh(1, NULL, 0, 0);
        Feature::RedirectNeigh => loads(
            BPF_PROG_TYPE_SCHED_CLS,
            None,
            &[mov_imm(1, 1), mov_imm(2, 0), mov_imm(3, 0), mov_imm(4, 0), call(BPF_FUNC_redirect_neigh), exit()],
        ),
    }
}

/// A sock_release program calling what hm_sock_release calls,
/// bpf_get_netns_cookie(ctx) and bpf_get_socket_cookie(ctx); return 1.
fn sock_release_loads() -> bool {
    loads(
        BPF_PROG_TYPE_CGROUP_SOCK,
        Some(BPF_CGROUP_INET_SOCK_RELEASE),
        &[
            mov_reg(6, 1),
            call(BPF_FUNC_get_netns_cookie),
            mov_reg(1, 6),
            call(BPF_FUNC_get_socket_cookie),
            mov_imm(0, 1),
            exit(),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tunnel_key_size_is_the_one_with_a_source_address() {
        assert_eq!(TUNNEL_KEY_WITH_SOURCE, 44, "with local_ipv4/local_ipv6");
    }
}
