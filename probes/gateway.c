// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0
/*
 * Gateway peers (README.md, "Gateway peers"): TC programs on the flow-based
 * VXLAN device hm-tun0 choose the tunnel destination where the route did
 * not, and check what arrives.
 *
 * A member sends everything for remote sites to its gateway. A gateway
 * sends a packet to the member whose [[member]] CIDR holds the destination,
 * or to the peer gateway whose CIDR does (LPM tries), or — for a reply to a
 * flow a member started — back to exactly that member: when a flow arrives
 * from a member, its tunnel source is recorded under the reply's 5-tuple
 * (the seed's ct_label technique), and a reply arriving from a peer is sent
 * straight back into the tunnel to it, without needing a route to the
 * member's address.
 *
 * Both programs also carry the gateways' probes (hostmesh_abi.h, struct
 * hm_gw_probe): hm_tun_in answers a probe in the data plane, so a daemon's
 * restart is no failure to its probers, and records an answer for its own
 * prober in HM_GW_PROBES.
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "build_mark.h"
#include "clock.h"
#include "hostmesh_abi.h"
#include "packet.h"

/* Learned paths expire after seconds idle; a finer timestamp is waste. */
#define REFRESH_NS NS_PER_S

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct hm_gw_config);
} HM_GW_CONFIG SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, HM_MAX_GW_ROUTES);
	__type(key, struct hm_lpm_key);
	__type(value, struct hm_endpoint);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} HM_PEERS SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, HM_MAX_GW_ROUTES);
	__type(key, struct hm_lpm_key);
	__type(value, struct hm_endpoint);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} HM_MEMBERS SEC(".maps");

/* Underlay addresses of peer gateways: anything else sending into the
 * tunnel is a member. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, HM_MAX_GW_ROUTES);
	__type(key, struct hm_endpoint);
	__type(value, __u32);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} HM_PEER_ENDPOINTS SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, HM_MAX_GW_CONNTRACK);
	__type(key, struct hm_ct_key);
	__type(value, struct hm_gw_ct_value);
} HM_GW_CT SEC(".maps");

/* The last answer to each of this host's probes, by the prober's slot. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, HM_MAX_GW_PROBES);
	__type(key, __u32);
	__type(value, struct hm_gw_probe);
} HM_GW_PROBES SEC(".maps");

/*
 * Every hm-tun0 has the same MAC (model/gateway.rs TUN_MAC), and routes
 * into it use a permanent neighbour with that MAC, so the inner Ethernet
 * destination always matches the receiving device. The receiver drops a
 * frame whose source is its own MAC (the VXLAN driver's loop check), so
 * frames leave with this source instead.
 */
static const __u8 TUN_PEER_MAC[ETH_ALEN] = { 0x02, 0x68, 0x6d, 0x00, 0x01, 0x01 };

static __always_inline int set_inner_source(struct __sk_buff *skb)
{
	return bpf_skb_store_bytes(skb, OFF(struct ethhdr, h_source), TUN_PEER_MAC, ETH_ALEN, 0);
}

static __always_inline struct hm_gw_config *gw_config(void)
{
	__u32 zero = 0;
	struct hm_gw_config *cfg = bpf_map_lookup_elem(&HM_GW_CONFIG, &zero);

	return (cfg && cfg->role) ? cfg : NULL;
}

/* struct bpf_tunnel_key without the source address (local_ipv4/6, Linux
 * 6.0): every kernel takes this size, and it is all a receiver needs. */
#define TUNNEL_KEY_NO_SOURCE __builtin_offsetof(struct bpf_tunnel_key, local_ipv4)

/* The tunnel source of a packet that came out of the tunnel. */
static __always_inline int tunnel_source(struct __sk_buff *skb, __u8 addr[16], __u32 *vni)
{
	struct bpf_tunnel_key key = {};

	if (bpf_skb_get_tunnel_key(skb, &key, TUNNEL_KEY_NO_SOURCE, 0) == 0) {
		hm_v4_mapped(addr, bpf_htonl(key.remote_ipv4));
	} else if (bpf_skb_get_tunnel_key(skb, &key, TUNNEL_KEY_NO_SOURCE, BPF_F_TUNINFO_IPV6) == 0) {
		__builtin_memcpy(addr, key.remote_ipv6, 16);
	} else {
		return -1;
	}
	*vni = key.tunnel_id;
	return 0;
}

/* Sets the tunnel key with its source address; kernels before 6.0 refuse
 * that size, and get the key without it (the route picks the source). */
static __always_inline int set_key(struct __sk_buff *skb, struct bpf_tunnel_key *key, __u64 flags)
{
	if (bpf_skb_set_tunnel_key(skb, key, sizeof(*key), flags) == 0)
		return 0;
	return bpf_skb_set_tunnel_key(skb, key, TUNNEL_KEY_NO_SOURCE, flags);
}

/* Sends the packet into the tunnel to `to`, from local_ip: peers know
 * each other by these addresses, so a multi-homed gateway must not let
 * the kernel pick another (a local_ip of the other family is left to the
 * kernel's choice). */
static __always_inline int set_destination(struct __sk_buff *skb, const struct hm_gw_config *cfg,
					   const __u8 to[16])
{
	struct bpf_tunnel_key key = {};

	key.tunnel_id = cfg->vni;
	key.tunnel_ttl = 64;
	if (hm_is_v4(to)) {
		__u32 v4;

		__builtin_memcpy(&v4, to + 12, 4);
		key.remote_ipv4 = bpf_ntohl(v4);
		if (hm_is_v4(cfg->local)) {
			__builtin_memcpy(&v4, cfg->local + 12, 4);
			key.local_ipv4 = bpf_ntohl(v4);
		}
		/* No outer UDP checksum over IPv4, as the kernel's own VXLAN
		 * devices default to (RFC 7348): the inner packet has its own,
		 * and computing one per segment costs throughput. */
		return set_key(skb, &key, BPF_F_ZERO_CSUM_TX);
	}
	__builtin_memcpy(key.remote_ipv6, to, 16);
	if (!hm_is_v4(cfg->local))
		__builtin_memcpy(key.local_ipv6, cfg->local, 16);
	return set_key(skb, &key, BPF_F_TUNINFO_IPV6);
}

static __always_inline void refresh(struct hm_gw_ct_value *v)
{
	__u64 now = hm_now();

	if (hm_idle_ns(now, v->last_seen_ns) > REFRESH_NS)
		v->last_seen_ns = now;
}

static __always_inline struct hm_endpoint *lpm(void *map, const __u8 addr[16])
{
	struct hm_lpm_key key = { .prefixlen = 128 };

	__builtin_memcpy(key.addr, addr, 16);
	return bpf_map_lookup_elem(map, &key);
}

static __always_inline void tuple_key(struct hm_ct_key *k, const struct flow *f, int reverse)
{
	__builtin_memcpy(k->src, reverse ? f->dst : f->src, 16);
	__builtin_memcpy(k->dst, reverse ? f->src : f->dst, 16);
	k->sport = reverse ? f->dport : f->sport;
	k->dport = reverse ? f->sport : f->dport;
	k->proto = f->proto;
}

/* Where a gateway sends a packet for f->dst that its route gave no key and
 * whose way back it did not learn: a [[member]], or a live peer. */
static __always_inline int gateway_destination(const struct flow *f, __u8 to[16])
{
	struct hm_endpoint *ep;

	ep = lpm(&HM_MEMBERS, f->dst);
	if (ep) {
		__builtin_memcpy(to, ep->addr, 16);
		return 0;
	}
	ep = lpm(&HM_PEERS, f->dst);
	if (ep && (ep->flags & HM_EP_UP)) {
		__builtin_memcpy(to, ep->addr, 16);
		return 0;
	}
	return -1;
}

/* The headers in front of a probe's payload. */
struct probe_headers {
	struct ethhdr eth;
	struct iphdr ip;
	struct udphdr udp;
} __attribute__((packed));

#define PROBE_PAYLOAD sizeof(struct probe_headers)

/* Whether the frame is a gateway probe (or its answer); fills *p. The
 * frame is ours alone: IPv4 without options, to HM_PROBE_ADDR and
 * HM_PROBE_PORT, with the magic in front of its payload. `f` is the
 * frame as parse() read it (`parsed` its answer): any other packet is
 * told from a probe by it, without copying its headers. */
static __always_inline int probe_frame(struct __sk_buff *skb, int parsed, const struct flow *f,
				       struct hm_gw_probe *p)
{
	struct probe_headers h;
	__u32 to;

	__builtin_memcpy(&to, f->dst + 12, 4);
	if (parsed != PARSED || f->v6 || f->proto != IPPROTO_UDP || f->dport != bpf_htons(HM_PROBE_PORT) ||
	    to != bpf_htonl(HM_PROBE_ADDR))
		return 0;
	if (skb->protocol != bpf_htons(ETH_P_IP) || skb->len < PROBE_PAYLOAD + sizeof(*p))
		return 0;
	if (bpf_skb_load_bytes(skb, 0, &h, sizeof(h)))
		return 0;
	if (h.ip.ihl != 5 || h.ip.protocol != IPPROTO_UDP || h.ip.daddr != bpf_htonl(HM_PROBE_ADDR) ||
	    h.udp.dest != bpf_htons(HM_PROBE_PORT))
		return 0;
	if (bpf_skb_load_bytes(skb, PROBE_PAYLOAD, p, sizeof(*p)))
		return 0;
	return p->magic == bpf_htonl(HM_PROBE_MAGIC);
}

/* A probe that came out of the tunnel from `sender`: a question is sent
 * back to it as an answer; an answer to this host's prober is recorded.
 * Either way the frame goes no further. */
static __always_inline int probe(struct __sk_buff *skb, const struct hm_gw_config *cfg, const __u8 sender[16],
				 struct hm_gw_probe *p)
{
	if (p->kind == bpf_htonl(HM_PROBE_ASK)) {
		__u32 ack = bpf_htonl(HM_PROBE_ACK);

		if (bpf_skb_store_bytes(skb, PROBE_PAYLOAD + OFF(struct hm_gw_probe, kind), &ack, sizeof(ack), 0) ||
		    set_destination(skb, cfg, sender))
			return TC_ACT_SHOT;
		return bpf_redirect(skb->ifindex, 0);
	}
	if (p->kind == bpf_htonl(HM_PROBE_ACK)) {
		__u32 slot = bpf_ntohl(p->slot);

		if (slot < HM_MAX_GW_PROBES)
			bpf_map_update_elem(&HM_GW_PROBES, &slot, p, BPF_ANY);
	}
	return TC_ACT_SHOT;
}

/* Whether the packet's route gave it its tunnel key: hostmesh's routes
 * into hm-tun0 carry it (`encap ip`, model/gateway.rs), so the device
 * sends it on with the outer route it keeps cached for that route, where
 * a key set here is looked up again for every packet. Routes without one
 * (a kernel without keys on routes, or an older daemon's until the sync
 * replaces them) leave it to this program. */
static __always_inline int routed_key(struct __sk_buff *skb, const struct hm_gw_config *cfg)
{
	struct bpf_tunnel_key key;

	return bpf_skb_get_tunnel_key(skb, &key, TUNNEL_KEY_NO_SOURCE,
				      hm_is_v4(cfg->local) ? 0 : BPF_F_TUNINFO_IPV6) == 0;
}

/* TC egress on hm-tun0: pick the tunnel destination, where the route did
 * not, or where this gateway learned a reply's way back. */
SEC("classifier")
int hm_tun_out(struct __sk_buff *skb)
{
	HM_BUILD_MARK();
	struct hm_gw_config *cfg = gw_config();
	struct hm_gw_ct_value *learned;
	struct hm_ct_key ck = {};
	struct flow f = {};
	__u8 to[16];

	struct hm_gw_probe p;
	int parsed;

	if (!cfg)
		return TC_ACT_SHOT;
	parsed = parse(skb, &f);
	if (set_inner_source(skb))
		return TC_ACT_SHOT;
	/* An answer hm_tun_in sent back: its tunnel key is set. */
	if (probe_frame(skb, parsed, &f, &p) && p.kind == bpf_htonl(HM_PROBE_ACK))
		return TC_ACT_OK;
	if (cfg->role == HM_ROLE_MEMBER) {
		if (routed_key(skb, cfg))
			return TC_ACT_OK;
		return set_destination(skb, cfg, cfg->gateway) ? TC_ACT_SHOT : TC_ACT_OK;
	}
	if (parsed == NOT_IP)
		return TC_ACT_SHOT;
	/* A reply to a member's flow goes back to that member, whatever the
	 * route to its address says. */
	tuple_key(&ck, &f, 0);
	learned = bpf_map_lookup_elem(&HM_GW_CT, &ck);
	if (learned) {
		refresh(learned);
		return set_destination(skb, cfg, learned->member) ? TC_ACT_SHOT : TC_ACT_OK;
	}
	if (routed_key(skb, cfg))
		return TC_ACT_OK;
	if (gateway_destination(&f, to))
		return TC_ACT_SHOT;
	return set_destination(skb, cfg, to) ? TC_ACT_SHOT : TC_ACT_OK;
}

/* TC ingress on hm-wg0: everything WireGuard decrypted (the VXLAN and
 * probes of encrypted peers) gets HM_WG_RX_MARK, by which hm_tun_in tells
 * it from clear VXLAN that claims the same source. */
SEC("classifier")
int hm_wg_in(struct __sk_buff *skb)
{
	HM_BUILD_MARK();
	skb->mark = HM_WG_RX_MARK;
	return TC_ACT_UNSPEC;
}

/* Whether a packet from the tunnel may be taken as `sender`'s: not when
 * `sender` is an encrypted peer's gateway and the packet came in clear
 * (without hm_wg_in's mark): forged, since that peer's VXLAN only travels
 * inside WireGuard. The mark is taken away, so the inner packet goes on
 * as any other. `peer` is set to whether `sender` is a peer gateway. */
static __always_inline int sender_trusted(struct __sk_buff *skb, const struct hm_endpoint *sender, int *peer)
{
	__u32 *ep = bpf_map_lookup_elem(&HM_PEER_ENDPOINTS, sender);
	int sealed = skb->mark == HM_WG_RX_MARK;

	if (sealed)
		skb->mark = 0;
	*peer = ep != NULL;
	return !ep || !(*ep & HM_PEER_EP_ENCRYPTED) || sealed;
}

/* TC ingress on hm-tun0: only our VNI, and from an encrypted peer only
 * through WireGuard; on a gateway, learn return paths of flows members
 * start, and hand replies from peers straight back. */
SEC("classifier")
int hm_tun_in(struct __sk_buff *skb)
{
	HM_BUILD_MARK();
	struct hm_gw_config *cfg = gw_config();
	struct hm_endpoint sender = {};
	struct hm_gw_probe p;
	struct flow f = {};
	__u32 vni;
	int parsed;
	int peer = 0;

	if (!cfg || tunnel_source(skb, sender.addr, &vni) || vni != cfg->vni)
		return TC_ACT_SHOT;
	if (cfg->role == HM_ROLE_GATEWAY && !sender_trusted(skb, &sender, &peer))
		return TC_ACT_SHOT;
	parsed = parse(skb, &f);
	if (probe_frame(skb, parsed, &f, &p))
		return probe(skb, cfg, sender.addr, &p);
	if (cfg->role != HM_ROLE_GATEWAY || parsed == NOT_IP)
		return TC_ACT_OK;

	if (!peer) {
		/* From a member: remember where to send the replies, unless
		 * the route of its address leads back to it anyway (a
		 * [[member]] CIDR of this member's holds it): those replies
		 * take the route, and its cached tunnel key, with no entry
		 * made per flow. A known flow is only refreshed, at most once
		 * per REFRESH_NS, so bulk traffic does not rewrite the entry
		 * for every packet. */
		struct hm_endpoint *home = lpm(&HM_MEMBERS, f.src);
		struct hm_ct_key rk = {};
		struct hm_gw_ct_value *known;
		struct hm_gw_ct_value v = {};

		if (home && hm_same_addr(home->addr, sender.addr))
			return TC_ACT_OK;
		tuple_key(&rk, &f, 1);
		known = bpf_map_lookup_elem(&HM_GW_CT, &rk);
		if (known && hm_same_addr(known->member, sender.addr)) {
			refresh(known);
			return TC_ACT_OK;
		}
		__builtin_memcpy(v.member, sender.addr, 16);
		v.last_seen_ns = hm_now();
		bpf_map_update_elem(&HM_GW_CT, &rk, &v, BPF_ANY);
		return TC_ACT_OK;
	}

	/* From a peer: a reply to a member's flow goes back to that member
	 * directly (its address may have no route here). */
	{
		struct hm_ct_key ck = {};
		struct hm_gw_ct_value *learned;

		tuple_key(&ck, &f, 0);
		learned = bpf_map_lookup_elem(&HM_GW_CT, &ck);
		if (!learned)
			return TC_ACT_OK;
		refresh(learned);
		if (set_destination(skb, cfg, learned->member))
			return TC_ACT_SHOT;
		return bpf_redirect(skb->ifindex, 0);
	}
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
