/* SPDX-License-Identifier: Apache-2.0 OR GPL-2.0 */
/*
 * The maps of the service feature. Both service objects (service_nat.c,
 * service_ctlb.c) declare them; the daemon pins each under its bpffs dir
 * and loads both objects against the same pins, so they share one set.
 */
#ifndef HOSTMESH_SERVICE_MAPS_H
#define HOSTMESH_SERVICE_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "clock.h"
#include "hostmesh_abi.h"
#include "packet.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct hm_config);
} HM_CONFIG SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, HM_MAX_SERVICES);
	__type(key, struct hm_svc_key);
	__type(value, struct hm_svc_value);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} HM_SERVICES SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, HM_MAX_BACKENDS);
	__type(key, __u32);
	__type(value, struct hm_backend);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} HM_BACKENDS SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, HM_MAX_MAGLEV_CHUNKS);
	__type(key, struct hm_maglev_key);
	__type(value, struct hm_maglev_chunk);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} HM_MAGLEV SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, HM_MAX_CONNTRACK);
	__type(key, struct hm_ct_key);
	__type(value, struct hm_ct_value);
} HM_CT SEC(".maps");

/* Closed TCP flows, for their last packets (probes/conntrack.h). The daemon
 * sizes it as HM_CT ([daemon] conntrack_size). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, HM_MAX_CONNTRACK);
	__type(key, struct hm_ct_key);
	__type(value, struct hm_ct_value);
} HM_CT_CLOSING SEC(".maps");

/* Flows from the network (hostmesh_abi.h, HM_NAT), two entries each; the
 * daemon sizes it as HM_CT ([daemon] conntrack_size). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, HM_MAX_CONNTRACK);
	__type(key, struct hm_ct_key);
	__type(value, struct hm_nat_value);
} HM_NAT SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, HM_MAX_BACKENDS);
	__type(key, struct hm_addr);
	__type(value, struct hm_snat_value);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} HM_SNAT SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, HM_MAX_HOST_ADDRS);
	__type(key, struct hm_addr);
	__type(value, __u32);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} HM_HOST_ADDRS SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, HM_MAX_REVERSE_SOCK);
	__type(key, struct hm_revsk_key);
	__type(value, struct hm_revsk_value);
} HM_REVERSE_SOCK SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, HM_MAX_SERVICES);
	__type(key, __u32);
	__type(value, struct hm_svc_affinity);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} HM_SVC_AFFINITY SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, HM_MAX_AFFINITY);
	__type(key, struct hm_aff_key);
	__type(value, struct hm_aff_value);
} HM_AFFINITY SEC(".maps");

/* Kernel-written counters; entries are made on first use (so a full map
 * loses the counts of new pairs, never traffic). The daemon deletes the
 * entries of pairs that are no longer configured. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, HM_MAX_BACKENDS);
	__type(key, struct hm_bstats_key);
	__type(value, struct hm_bstats);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} HM_BACKEND_STATS SEC(".maps");

static __always_inline struct hm_config *hm_config(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&HM_CONFIG, &zero);
}

/* Counts for (service, backend): a new connection or flow on one of the
 * two paths (`connections`), or IP bytes each way on the veth path. */
#define HM_STAT_NONE (-1) /* bytes only: a packet of a known flow */
#define HM_STAT_CTLB 0
#define HM_STAT_VETH 1
static __always_inline void hm_count_backend(__u32 svc_id, const __u8 *addr, __be16 port, int new_flow_on,
					     __u32 to, __u32 from)
{
	struct hm_bstats_key k = {};
	struct hm_bstats *st, zero = {};

	__builtin_memcpy(k.addr, addr, 16);
	k.port = port;
	k.svc_id = svc_id;
	st = bpf_map_lookup_elem(&HM_BACKEND_STATS, &k);
	if (!st) {
		/* Another CPU may make it first: BPF_NOEXIST fails then, and the
		 * lookup finds theirs (this CPU's slot of it is zero). */
		bpf_map_update_elem(&HM_BACKEND_STATS, &k, &zero, BPF_NOEXIST);
		st = bpf_map_lookup_elem(&HM_BACKEND_STATS, &k);
		if (!st)
			return;
	}
	if (new_flow_on == HM_STAT_CTLB)
		st->ctlb_connections++;
	else if (new_flow_on == HM_STAT_VETH)
		st->veth_connections++;
	st->bytes_to += to;
	st->bytes_from += from;
}

/* The id of the backend a hash selects from the service's Maglev table;
 * 0 when there is none (ids start at 0, so the found flag is apart). */
static __always_inline int hm_pick_id(const struct hm_svc_value *svc, __u32 hash, __u32 *id)
{
	struct hm_maglev_key key = {};
	struct hm_maglev_chunk *chunk;
	__u32 size = svc->table_size;
	__u32 slot;

	if (size == 0)
		return 0;
	slot = hash % size;
	key.svc_id = svc->id;
	key.chunk = slot / HM_MAGLEV_CHUNK | ((svc->flags & HM_SVC_F_LOCAL) ? HM_MAGLEV_LOCAL : 0);
	chunk = bpf_map_lookup_elem(&HM_MAGLEV, &key);
	if (!chunk)
		return 0;
	*id = chunk->backend[slot & (HM_MAGLEV_CHUNK - 1)];
	return 1;
}

/* The backend for a new connection of `client`: with affinity, the one it
 * reached last while that is fresh (the daemon removes entries of
 * backends that left the service), else the hash's pick, remembered. */
static __always_inline struct hm_backend *hm_pick_backend(const struct hm_svc_value *svc, const __u8 *client,
							  __u32 hash)
{
	struct hm_aff_key ak = {};
	struct hm_aff_value av = {}, *known;
	struct hm_svc_affinity *a = NULL;
	struct hm_backend *be;
	__u64 now = 0;
	__u32 id;

	if (svc->flags & HM_SVC_F_AFFINITY)
		a = bpf_map_lookup_elem(&HM_SVC_AFFINITY, &svc->id);
	if (a) {
		__builtin_memcpy(ak.client, client, 16);
		ak.svc_id = svc->id;
		now = hm_now();
		known = bpf_map_lookup_elem(&HM_AFFINITY, &ak);
		if (known && hm_idle_ns(now, known->last_seen_ns) < (__u64)a->timeout_s * NS_PER_S) {
			be = bpf_map_lookup_elem(&HM_BACKENDS, &known->backend_id);
			if (be) {
				known->last_seen_ns = now;
				return be;
			}
		}
	}
	if (!hm_pick_id(svc, hash, &id))
		return NULL;
	be = bpf_map_lookup_elem(&HM_BACKENDS, &id);
	if (be && a) {
		av.backend_id = id;
		av.last_seen_ns = now;
		bpf_map_update_elem(&HM_AFFINITY, &ak, &av, BPF_ANY);
	}
	return be;
}

/* splitmix64's finaliser. */
static __always_inline __u64 hm_mix(__u64 x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebULL;
	x ^= x >> 31;
	return x;
}

/* A 64-bit mix folded to 32 bits. */
static __always_inline __u32 hm_mix64(__u64 x)
{
	x = hm_mix(x);
	return (__u32)(x ^ (x >> 32));
}

/* The backend hash of a 5-tuple (ports in network byte order, as in the
 * packet): the same on every host and boot, unlike the kernel's skb hash
 * (seeded per boot), so `hostmesh explain --from` computes it too
 * (daemon/src/model/flow_hash.rs is its mirror; the explain test checks
 * the two agree on real connections). Words are read little-endian, as
 * the BPF target is. */
/* hm_flow_hash on addresses already in 64-bit words. */
static __always_inline __u32 hm_flow_hash_words(const __u64 src[2], const __u64 dst[2], __be16 sport, __be16 dport,
						__u8 proto)
{
	__u64 h = 0x9e3779b97f4a7c15ULL;

	h = hm_mix(h ^ src[0]);
	h = hm_mix(h ^ src[1]);
	h = hm_mix(h ^ dst[0]);
	h = hm_mix(h ^ dst[1]);
	h = hm_mix(h ^ ((__u64)sport << 24 | (__u64)dport << 8 | proto));
	return (__u32)(h ^ (h >> 32));
}

static __always_inline __u32 hm_flow_hash(const __u8 *src, const __u8 *dst, __be16 sport, __be16 dport, __u8 proto)
{
	__u64 s[2], d[2];

	__builtin_memcpy(s, src, 16);
	__builtin_memcpy(d, dst, 16);
	return hm_flow_hash_words(s, d, sport, dport, proto);
}


#endif /* HOSTMESH_SERVICE_MAPS_H */
