/* SPDX-License-Identifier: Apache-2.0 OR GPL-2.0 */
/*
 * The flows' clock: CLOCK_MONOTONIC in nanoseconds, which the daemon
 * reads too (idle times in explain, the conntrack sweep).
 *
 * Flow and affinity times are compared against timeouts of a second or
 * more, so the per-packet programs read the clock as the last tick left
 * it (bpf_ktime_get_coarse_ns, Linux 5.11): a load of the timekeeper's
 * value instead of a clocksource read, which under a hypervisor's clock
 * took a fifth of a packet's translation. The object built with
 * HM_COARSE_CLOCK is loaded where the kernel has the helper
 * (model/kernel.rs, coarse_clock); the other objects, and service_nat.o
 * on older kernels, read the precise clock.
 *
 * Both clocks are CLOCK_MONOTONIC, the coarse one up to a tick behind, so
 * a time written by one program can be a little ahead of another's now:
 * an idle time is never negative (hm_idle_ns), or a flow just refreshed
 * would look idle for centuries.
 */
#ifndef HOSTMESH_CLOCK_H
#define HOSTMESH_CLOCK_H

#include <linux/types.h>
#include <bpf/bpf_helpers.h>

static __always_inline __u64 hm_now(void)
{
#ifdef HM_COARSE_CLOCK
	return bpf_ktime_get_coarse_ns();
#else
	return bpf_ktime_get_ns();
#endif
}

/* How long since `then`, 0 if `then` is ahead of `now`. The difference
 * is taken modulo 2^64 and read as signed, as the kernel's time_after()
 * does: a time set back from `now` (as earlier builds did for a reset
 * flow's entries, which an upgrade adopts) may have wrapped below zero in
 * a machine's first minute. */
static __always_inline __u64 hm_idle_ns(__u64 now, __u64 then)
{
	__s64 d = (__s64)(now - then);

	return d > 0 ? (__u64)d : 0;
}

#endif /* HOSTMESH_CLOCK_H */
