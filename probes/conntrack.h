/* SPDX-License-Identifier: Apache-2.0 OR GPL-2.0 */
/*
 * The bpfnat veth path's conntrack, shared by hm_natout, hm_reply and
 * hm_direct (probes/service_nat.c).
 *
 * Each flow has a forward entry (client -> VIP, as hm_natout sees it,
 * holding the backend) and a reverse one (backend -> client, as hm_reply
 * sees it, holding the VIP). Open flows live in HM_CT. A TCP flow is
 * closed once each side has sent its FIN; its entries then move to
 * HM_CT_CLOSING for its last packets. A RST ends a flow: its entries are
 * deleted at once, as HM_NAT's are (moving them, two inserts into a map
 * that a high rate of short connections keeps full, each evicting, cost
 * more than the rest of the flow's conntrack). Both maps are LRUs of the
 * same size, so when one is full the least recently used entry of that
 * map goes: closed flows push out closed flows, never an open one.
 *
 * A TCP packet of no flow that is not a SYN opens one (HM_CT_F_PICKUP): a
 * flow whose entries were lost (evicted from a full map) goes on with the
 * backend the table gives it, as before. Until its backend answers it
 * lives HM_CT_PICKUP_TIMEOUT_S: what a packet of a reset flow still on
 * its way (an ACK sent before the RST, queued on another CPU) opens is
 * answered by the backend with a RST, which ends it, or not at all (the
 * backend saw it before the RST), and is gone within seconds.
 *
 * Timeouts: closed flows 10 s, UDP and established TCP as configured, a
 * SYN never answered 60 s, a flow picked up mid-stream and never answered
 * 2 s. An open flow's times are refreshed at most once a second
 * (ct_nothing_new). An entry past its timeout is not used; the daemon
 * sweeps such entries out every 2 s.
 */
#ifndef HOSTMESH_CONNTRACK_H
#define HOSTMESH_CONNTRACK_H

#include "packet.h"
#include "service_maps.h"

static __always_inline void ct_key(struct hm_ct_key *k, const __u8 src[16], const __u8 dst[16], __be16 sport,
				   __be16 dport, __u8 proto, __u8 dir)
{
	__builtin_memcpy(k->src, src, 16);
	__builtin_memcpy(k->dst, dst, 16);
	k->sport = sport;
	k->dport = dport;
	k->proto = proto;
	k->dir = dir;
}

/* How long a flow whose entry has `flags` lives idle: HM_CT's and
 * HM_NAT's entries alike, so only their shared state bits count
 * (HM_FLOW_STATE_MASK). */
static __always_inline __u64 ct_timeout_ns(__u8 flags, __u8 proto, const struct hm_config *cfg)
{
	__u8 state = flags & HM_FLOW_STATE_MASK;

	if (state & HM_CT_F_CLOSING)
		return HM_CT_CLOSING_TIMEOUT_S * NS_PER_S;
	if (proto == IPPROTO_UDP)
		return (cfg ? cfg->udp_timeout_s : HM_CT_UDP_TIMEOUT_DEFAULT_S) * NS_PER_S;
	if (!(state & HM_CT_F_REPLIED))
		return HM_CT_SYN_TIMEOUT_S * NS_PER_S;
	return (__u64)(cfg ? cfg->tcp_timeout_s : HM_CT_TCP_TIMEOUT_DEFAULT_S) * NS_PER_S;
}

/* An HM_CT entry's: ct_timeout_ns, but HM_CT_PICKUP_TIMEOUT_S for a TCP
 * flow picked up mid-stream that the backend has not answered (the bit is
 * HM_CT_F_PICKUP only here: in HM_NAT's entries it is HM_NAT_F_REPLY). */
static __always_inline int ct_live(const struct hm_ct_value *ct, __u8 proto, __u64 now, const struct hm_config *cfg)
{
	__u64 timeout = (ct->flags & (HM_CT_F_PICKUP | HM_CT_F_REPLIED | HM_CT_F_CLOSING)) == HM_CT_F_PICKUP
				? HM_CT_PICKUP_TIMEOUT_S * NS_PER_S
				: ct_timeout_ns(ct->flags, proto, cfg);

	return hm_idle_ns(now, ct->last_seen_ns) < timeout;
}

/* The entry for `k`: an open flow's, else (TCP) a closed one's, which sets
 * *closed. */
static __always_inline struct hm_ct_value *ct_find(const struct hm_ct_key *k, int *closed)
{
	struct hm_ct_value *v = bpf_map_lookup_elem(&HM_CT, k);

	*closed = 0;
	if (v || k->proto != IPPROTO_TCP)
		return v;
	v = bpf_map_lookup_elem(&HM_CT_CLOSING, k);
	*closed = v != NULL;
	return v;
}

/* The entry for `k` in the map its flow's other entry was found in. */
static __always_inline struct hm_ct_value *ct_peer(const struct hm_ct_key *k, int closed)
{
	if (closed)
		return bpf_map_lookup_elem(&HM_CT_CLOSING, k);
	return bpf_map_lookup_elem(&HM_CT, k);
}

/* Forgets a flow: both entries, in the map they are in. */
static __always_inline void ct_forget(const struct hm_ct_key *fk, const struct hm_ct_key *rk, int closed)
{
	if (closed) {
		bpf_map_delete_elem(&HM_CT_CLOSING, fk);
		bpf_map_delete_elem(&HM_CT_CLOSING, rk);
	} else {
		bpf_map_delete_elem(&HM_CT, fk);
		bpf_map_delete_elem(&HM_CT, rk);
	}
}

/* What a packet says about the end of its TCP flow: a FIN from its sender
 * (`fin`: HM_CT_F_FIN_OUT or HM_CT_F_FIN_BACK), or a RST, which ends it. */
static __always_inline __u8 ct_end(const struct flow *f, __u8 fin)
{
	if (f->proto != IPPROTO_TCP)
		return 0;
	if (f->tcp_flags & TCP_RST)
		return HM_CT_F_RESET;
	return (f->tcp_flags & TCP_FIN) ? fin : 0;
}

/* Moves a flow's entries (those there are) to the closed flows, with
 * `flags`, last seen `now`: each is changed where it is, then copied (no
 * copy on the stack, which 5.10's 512 bytes for a chain of calls could
 * not spare). */
static __always_inline void ct_close(struct hm_ct_key *fk, struct hm_ct_value *fwd, struct hm_ct_key *rk,
				     struct hm_ct_value *rev, __u8 flags, __u64 now)
{
	if (fwd) {
		fwd->flags = flags;
		fwd->last_seen_ns = now;
		bpf_map_update_elem(&HM_CT_CLOSING, fk, fwd, BPF_ANY);
	}
	if (rev) {
		rev->flags = flags;
		rev->last_seen_ns = now;
		bpf_map_update_elem(&HM_CT_CLOSING, rk, rev, BPF_ANY);
	}
	bpf_map_delete_elem(&HM_CT, fk);
	bpf_map_delete_elem(&HM_CT, rk);
}

/* A packet of an open flow: both entries are refreshed and take `flags`;
 * a flow closed by FINs now moves to HM_CT_CLOSING, for the last ACK and
 * any FIN sent again. A flow reset is over: nothing of it is answered
 * after a RST (a late packet of the other side meets a socket that is
 * gone and is reset by that host), so its entries are deleted. */
static __always_inline void ct_seen(struct hm_ct_key *fk, struct hm_ct_value *fwd, struct hm_ct_key *rk,
				    struct hm_ct_value *rev, __u8 flags, __u64 now)
{
	__u8 all = flags;

	if (flags & HM_CT_F_RESET) {
		ct_forget(fk, rk, 0);
		return;
	}
	if (fwd)
		all |= fwd->flags;
	if (rev)
		all |= rev->flags;
	if ((all & (HM_CT_F_FIN_OUT | HM_CT_F_FIN_BACK)) == (HM_CT_F_FIN_OUT | HM_CT_F_FIN_BACK))
		all |= HM_CT_F_CLOSING;
	if (all & HM_CT_F_CLOSING) {
		ct_close(fk, fwd, rk, rev, all, now);
		return;
	}
	if (fwd) {
		fwd->flags |= flags;
		fwd->last_seen_ns = now;
	}
	if (rev) {
		rev->flags |= flags;
		rev->last_seen_ns = now;
	}
}

/* Whether a packet of an open flow that brings `flags` (HM_CT_F_*) to the
 * entry `v` it found has nothing to write: no news, and `v` refreshed
 * within the second. Every packet that brought news wrote it to both
 * entries, so the other entry holds no more, and its lookup is the one
 * saved on most packets; a write per packet to entries the other
 * direction's CPU reads costs more than the second of expiry it is worth
 * (so a flow may expire up to a second early). */
static __always_inline int ct_nothing_new(const struct hm_ct_value *v, __u8 flags, __u64 now)
{
	return !(flags & ~v->flags) && hm_idle_ns(now, v->last_seen_ns) < NS_PER_S;
}

/* A packet of a closed flow keeps it (its last ACK, a FIN sent again),
 * unless a RST ended it (entries an earlier build moved there at a RST,
 * until they expire). */
static __always_inline void ct_refresh_closed(struct hm_ct_value *v, __u64 now)
{
	if (v && !(v->flags & HM_CT_F_RESET))
		v->last_seen_ns = now;
}

#endif /* HOSTMESH_CONNTRACK_H */
