/* SPDX-License-Identifier: Apache-2.0 OR GPL-2.0 */
/*
 * The ABI between hostmesh's probes and the daemon: map key/value layouts
 * and constants. daemon/src/dataplane/abi.rs mirrors every struct here with
 * #[repr(C)] types; both sides assert the sizes so a mismatch fails the
 * build instead of corrupting a map.
 *
 * Addresses are always 16 bytes: IPv4 is stored IPv4-mapped (::ffff:a.b.c.d)
 * so one key type serves both families.
 */
#ifndef HOSTMESH_ABI_H
#define HOSTMESH_ABI_H

#include <linux/types.h>

/* Bump when a pinned map's layout changes incompatibly. */
#define HM_ABI_VERSION 1

/* Default capacity; the daemon overrides it from [daemon] max_services. */
#define HM_MAX_SERVICES 16384

/* (VIP, port, protocol) -> service. */
struct hm_svc_key {
	__u8 addr[16];  /* IPv6, or IPv4-mapped IPv6 */
	__be16 port;    /* network byte order */
	__u8 proto;     /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 _pad;
};
_Static_assert(sizeof(struct hm_svc_key) == 20, "hm_svc_key layout");

struct hm_svc_value {
	__u32 id;            /* stable index into per-service arrays */
	__u32 backend_count; /* configured backends */
	__u32 flags;         /* HM_SVC_F_* */
	__u32 _pad;
};
_Static_assert(sizeof(struct hm_svc_value) == 16, "hm_svc_value layout");

/* Per-service counters, per CPU, indexed by hm_svc_value.id. */
struct hm_svc_stats {
	__u64 packets;
	__u64 bytes;
};
_Static_assert(sizeof(struct hm_svc_stats) == 16, "hm_svc_stats layout");

#endif /* HOSTMESH_ABI_H */
