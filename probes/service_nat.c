// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0
/*
 * Service NAT on the bpfnat veth (README.md, "Service IPs").
 *
 * Every VIP has a host route via hm-natin, so host-originated packets to a
 * VIP leave through hm-natin. At its TC egress, hm_natin picks a backend
 * (Maglev, on the flow's hash), records the flow in HM_CT, rewrites the
 * destination and redirects the packet straight out of the interface the
 * FIB picks: it never crosses the veth. A packet whose backend is a local
 * address (or that no backend takes) crosses untouched to hm-natout's TC
 * ingress, where hm_natout does the same and lets the stack deliver it
 * (or refuses the flow). Replies come back on a host
 * interface (or lo, for local backends), where hm_reply restores the VIP
 * as the source. hm_reply and hm_direct also balance flows from the
 * network to node ports and external VIPs (HM_NAT).
 *
 * What must survive the veth crossing lives in HM_CT, not in skb marks
 * (marks are cleared crossing a veth). A packet to a VIP must never be
 * handed back to the stack un-NATed: it would be routed into hm-natin again
 * and loop. So a TCP SYN that no backend can take is answered with a RST
 * (connect() fails at once with ECONNREFUSED), a UDP datagram with an ICMP
 * port unreachable (a connected socket gets ECONNREFUSED); anything else
 * is dropped.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "build_mark.h"
#include "clock.h"
#include "conntrack.h"
#include "packet.h"
#include "service_maps.h"

static __always_inline __u16 csum_fold(__s64 sum)
{
	__u32 s = (__u32)sum;

	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)~s;
}

/* The one's complement difference `from` -> `to` of `n` 32-bit words, a
 * 32-bit partial sum as bpf_csum_diff() gives it, computed here: a helper
 * call costs more than these few additions. */
static __always_inline __u32 csum_words_diff(const __be32 *from, const __be32 *to, int n)
{
	__u64 s = 0;

#pragma unroll
	for (int i = 0; i < n; i++)
		s += (__u64)(__u32)~from[i] + (__u32)to[i];
	s = (s & 0xffffffff) + (s >> 32);
	s = (s & 0xffffffff) + (s >> 32);
	return (__u32)s;
}

/* A 16-bit checksum field with a partial sum `diff` applied (the IPv4
 * header's, which no offload computes: bpf_l3_csum_replace's arithmetic),
 * the carry of the addition added back before csum_fold. */
static __always_inline __u16 csum_apply(__u16 check, __u32 diff)
{
	__u32 s = diff + (__u16)~check;

	return csum_fold(s + (s < diff));
}

/* Rewrites a packet of `f` to the addresses and ports given (`f` is left
 * as it was). The L4 checksum goes through bpf_l4_csum_replace, which
 * alone knows how the skb's checksum is offloaded: both addresses in one
 * difference (the pseudo-header's), both ports in another, differences
 * computed here. The stores are bpf_skb_store_bytes, one for the
 * addresses (with the IPv4 header's checksum, computed here, beside
 * them) and one for the ports: 4 helper calls where there were 8. Not
 * written straight into the packet: a program that does makes the
 * verifier add a prologue that copies every shared (cloned) skb it sees,
 * and these programs see every TCP segment the host sends (clones of its
 * retransmit queue's), at lo and host interfaces alike. */
static __always_inline int rewrite_to(struct __sk_buff *skb, const struct flow *f, const __u8 src[16], const __u8 dst[16],
				      __be16 sport, __be16 dport)
{
	__u32 csum_off = f->l4_off + (f->proto == IPPROTO_TCP ? OFF(struct tcphdr, check) : OFF(struct udphdr, check));
	__u64 mangled = f->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
	__be16 ports_from[2] = { f->sport, f->dport }, ports_to[2] = { sport, dport };
	__be32 to[8];
	__u32 diff = 0;
	int addrs, ports = f->sport != sport || f->dport != dport;

	if (!f->v6) {
		__be32 from[2];

		__builtin_memcpy(&from[0], f->src + 12, 4);
		__builtin_memcpy(&from[1], f->dst + 12, 4);
		__builtin_memcpy(&to[0], src + 12, 4);
		__builtin_memcpy(&to[1], dst + 12, 4);
		addrs = from[0] != to[0] || from[1] != to[1];
		if (addrs)
			diff = csum_words_diff(from, to, 2);
	} else {
		addrs = !hm_same_addr(f->src, src) || !hm_same_addr(f->dst, dst);
		if (addrs) {
			/* struct flow holds the two addresses side by side, as
			 * the IPv6 header does. */
			__builtin_memcpy(to, src, 16);
			__builtin_memcpy(&to[4], dst, 16);
			diff = csum_words_diff((const __be32 *)f->src, to, 8);
		}
	}
	if (addrs && bpf_l4_csum_replace(skb, csum_off, 0, diff, BPF_F_PSEUDO_HDR | mangled))
		return -1;
	if (ports && bpf_l4_csum_replace(skb, csum_off, 0,
					 csum_words_diff((const __be32 *)ports_from, (const __be32 *)ports_to, 1), mangled))
		return -1;

	if (addrs && !f->v6) {
		/* The header's checksum and both addresses, side by side. */
		struct {
			__u16 check;
			__be32 addrs[2];
		} __attribute__((packed)) h;
		struct iphdr *ip = (void *)(long)skb->data + ETH_HLEN;

		if ((void *)(ip + 1) > (void *)(long)skb->data_end)
			return -1;
		h.check = csum_apply(ip->check, diff);
		h.addrs[0] = to[0];
		h.addrs[1] = to[1];
		if (bpf_skb_store_bytes(skb, ETH_HLEN + OFF(struct iphdr, check), &h, sizeof(h), 0))
			return -1;
	} else if (addrs && bpf_skb_store_bytes(skb, ETH_HLEN + OFF(struct ipv6hdr, saddr), to, 32, 0)) {
		return -1;
	}
	if (ports && bpf_skb_store_bytes(skb, f->l4_off + OFF(struct tcphdr, source), ports_to, 4, 0))
		return -1;
	return 0;
}

/* Rewrites the source (`dst` 0) or the destination address and port. */
static __always_inline int rewrite(struct __sk_buff *skb, const struct flow *f, int dst, const __u8 addr[16], __be16 port)
{
	if (dst)
		return rewrite_to(skb, f, f->src, addr, f->sport, port);
	return rewrite_to(skb, f, addr, f->dst, port, f->dport);
}

/* Asks the FIB where a packet from `src` to `dst`, arriving where `skb`
 * did, leaves (bpf_fib_lookup's answer in `fib`). */
static __always_inline int next_hop(struct __sk_buff *skb, struct bpf_fib_lookup *fib, __u8 proto, __u8 v6,
				    const __u8 src[16], const __u8 dst[16])
{
	fib->ifindex = skb->ifindex;
	fib->l4_protocol = proto;
	/* tot_len 0: let the kernel check the MTU, GSO packets included. */
	fib->tot_len = 0;
	if (!v6) {
		fib->family = HM_AF_INET;
		__builtin_memcpy(&fib->ipv4_src, src + 12, 4);
		__builtin_memcpy(&fib->ipv4_dst, dst + 12, 4);
	} else {
		fib->family = HM_AF_INET6;
		__builtin_memcpy(fib->ipv6_src, src, 16);
		__builtin_memcpy(fib->ipv6_dst, dst, 16);
	}
	return bpf_fib_lookup(skb, fib, sizeof(*fib), 0);
}

/* Where a translated packet leaves, as next_hop() found it: the verdict
 * (BPF_FIB_LKUP_RET_*), the interface and the Ethernet header's two MACs
 * (destination, then source), apart from the lookup's 64-byte query. */
struct hop {
	__s32 rc;
	__u32 ifindex;
	__u8 macs[2 * ETH_ALEN];
};

static __always_inline void find_hop(struct __sk_buff *skb, const struct flow *f, const __u8 dst[16], struct hop *h)
{
	struct bpf_fib_lookup fib = {};

	h->rc = next_hop(skb, &fib, f->proto, f->v6, f->src, dst);
	h->ifindex = fib.ifindex;
	/* Both MACs in one store (the FIB gives them the other way round). */
	__builtin_memcpy(h->macs, fib.dmac, ETH_ALEN);
	__builtin_memcpy(h->macs + ETH_ALEN, fib.smac, ETH_ALEN);
}

/* A flow keeps where its translated packets leave (the FIB's interface
 * and MACs) in its entry: found by its first packet, and again by the
 * first in each epoch of 2^30 ns (about a second), so a route or
 * neighbour that changes reaches every flow within that. The lookup was a
 * quarter of a packet's translation. Only a next hop the FIB resolved is
 * kept: a local destination, or a neighbour not resolved yet, asks the
 * FIB every time. Two CPUs refreshing one entry at once write the same
 * answer. */
#define HM_FIB_EPOCH_SHIFT 30

static __always_inline __u32 fib_epoch(__u64 now)
{
	return (__u32)(now >> HM_FIB_EPOCH_SHIFT);
}

/* Whether a packet goes out of an interface (not up this host's stack). */
static __always_inline int hop_out(const struct hop *h)
{
	return h->rc == BPF_FIB_LKUP_RET_SUCCESS || h->rc == BPF_FIB_LKUP_RET_NO_NEIGH;
}

/* Sends a (NATed) packet where `h` says: out of the interface the FIB
 * picked, or up the stack when its destination is a local address. */
static __always_inline int send_hop(struct __sk_buff *skb, const struct hop *h)
{
	switch (h->rc) {
	case BPF_FIB_LKUP_RET_SUCCESS:
		if (bpf_skb_store_bytes(skb, OFF(struct ethhdr, h_dest), h->macs, sizeof(h->macs), 0))
			return TC_ACT_SHOT;
		return bpf_redirect(h->ifindex, 0);
	case BPF_FIB_LKUP_RET_NO_NEIGH:
		return bpf_redirect_neigh(h->ifindex, NULL, 0, 0);
	case BPF_FIB_LKUP_RET_NOT_FWDED:
		/* A local address: the stack delivers it (accept_local=1). */
		return TC_ACT_OK;
	default:
		return TC_ACT_SHOT;
	}
}

/* Sends a (NATed) packet on towards `dst`. */
static __always_inline int forward(struct __sk_buff *skb, const struct flow *f, const __u8 dst[16])
{
	struct hop h = {};

	find_hop(skb, f, dst, &h);
	return send_hop(skb, &h);
}

/* A note on a packet hm_natin, hm_natout or hm_reply translated and sends
 * out of an interface (two words of skb->cb, the qdisc layer's scratch
 * space, which a redirect keeps): hm_direct, at that interface's egress, passes it on
 * without its HM_NAT lookup, and takes the note away. A packet the stack
 * forwards or makes has its own use of cb there (IPCB, the IP layer's
 * options and offsets), never these two words; a kernel that cleared
 * them between the hooks would cost hm_direct only the lookup. */
#define HM_CB_SENT0 0x686d2d73 /* "hm-s" */
#define HM_CB_SENT1 0x656e7421 /* "ent!" */

static __always_inline int noted(struct __sk_buff *skb, int verdict)
{
	if (verdict == TC_ACT_REDIRECT) {
		skb->cb[0] = HM_CB_SENT0;
		skb->cb[1] = HM_CB_SENT1;
	}
	return verdict;
}

/* Answers a TCP SYN with a RST from the VIP, sent back into hm-natin, so
 * connect() fails at once with ECONNREFUSED. Anything else is dropped. */
static __always_inline int reset(struct __sk_buff *skb, const struct flow *f)
{
	__u32 csum_off = f->l4_off + OFF(struct tcphdr, check);
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	__u8 macs[2 * ETH_ALEN];
	__be32 old_seq, new_seq, old_ack, new_ack;
	__be16 old_word, new_word, ports[2];
	struct tcphdr *tcp;

	if (f->proto != IPPROTO_TCP || !(f->tcp_flags & TCP_SYN) || (f->tcp_flags & TCP_ACK))
		return TC_ACT_SHOT;
	if ((void *)(eth + 1) > end)
		return TC_ACT_SHOT;
	tcp = data + f->l4_off;
	if (f->l4_off > ETH_HLEN + 60 || (void *)(tcp + 1) > end)
		return TC_ACT_SHOT;
	old_seq = tcp->seq;
	old_ack = tcp->ack_seq;
	old_word = ((__be16 *)tcp)[6];
	/* ack = seq + SYN + any data the SYN carried (TCP Fast Open). */
	new_ack = bpf_htonl(bpf_ntohl(old_seq) + 1 + (f->l4_len - f->tcp_doff));
	new_seq = 0;
	new_word = bpf_htons((bpf_ntohs(old_word) & 0xf000) | TCP_RST | TCP_ACK);
	__builtin_memcpy(macs, eth->h_source, ETH_ALEN);
	__builtin_memcpy(macs + ETH_ALEN, eth->h_dest, ETH_ALEN);
	ports[0] = f->dport;
	ports[1] = f->sport;

	/* Swapping addresses and ports leaves every checksum as it was. */
	if (bpf_skb_store_bytes(skb, 0, macs, sizeof(macs), 0))
		return TC_ACT_SHOT;
	if (!f->v6) {
		__u8 addrs[8];

		__builtin_memcpy(addrs, f->dst + 12, 4);
		__builtin_memcpy(addrs + 4, f->src + 12, 4);
		if (bpf_skb_store_bytes(skb, ETH_HLEN + OFF(struct iphdr, saddr), addrs, 8, 0))
			return TC_ACT_SHOT;
	} else {
		__u8 addrs[32];

		__builtin_memcpy(addrs, f->dst, 16);
		__builtin_memcpy(addrs + 16, f->src, 16);
		if (bpf_skb_store_bytes(skb, ETH_HLEN + OFF(struct ipv6hdr, saddr), addrs, 32, 0))
			return TC_ACT_SHOT;
	}
	if (bpf_skb_store_bytes(skb, f->l4_off, ports, 4, 0) ||
	    bpf_l4_csum_replace(skb, csum_off, old_seq, new_seq, 4) ||
	    bpf_skb_store_bytes(skb, f->l4_off + OFF(struct tcphdr, seq), &new_seq, 4, 0) ||
	    bpf_l4_csum_replace(skb, csum_off, old_ack, new_ack, 4) ||
	    bpf_skb_store_bytes(skb, f->l4_off + OFF(struct tcphdr, ack_seq), &new_ack, 4, 0) ||
	    bpf_l4_csum_replace(skb, csum_off, old_word, new_word, 2) ||
	    bpf_skb_store_bytes(skb, f->l4_off + 12, &new_word, 2, 0))
		return TC_ACT_SHOT;
	return bpf_redirect(skb->ifindex, 0);
}

/* What `unreachable` writes before the quote: the client's Ethernet header
 * with its addresses swapped, a new IP header and an ICMP destination
 * unreachable (port unreachable). The quote is the datagram's IP header
 * and the 8 bytes after it (its UDP header): all RFC 792 asks, and what
 * the client's kernel needs to find the socket. A datagram with IP options
 * or IPv6 extension headers is dropped, as before. */
#define QUOTE4 (20 + 8)
#define QUOTE6 (40 + 8)

struct unreach {
	__u16 align; /* so that the IP header is 4-byte aligned */
	__u8 macs[2 * ETH_ALEN];
	__be16 h_proto;
	union {
		struct {
			struct iphdr ip;
			__u8 icmp[8];
		} v4;
		struct {
			struct ipv6hdr ip;
			__u8 icmp[8];
		} v6;
	};
};

#define HEADERS4 (ETH_HLEN + sizeof(struct iphdr) + 8)
#define HEADERS6 (ETH_HLEN + sizeof(struct ipv6hdr) + 8)

/* Answers a UDP datagram to a VIP:port nobody serves with an ICMP port
 * unreachable from the VIP, sent back into hm-natin as a RST is: the
 * client's kernel finds the socket by the quote, so a connected UDP socket
 * gets ECONNREFUSED at once, as from a port with no listener, instead of
 * waiting out its timeout. Only this host's processes send into the veth,
 * so no one else is answered. */
static __always_inline int unreachable(struct __sk_buff *skb, const struct flow *f)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct unreach r = {};
	__u32 quote, headers;
	__s64 sum;

	if (f->l4_off != ETH_HLEN + (f->v6 ? sizeof(struct ipv6hdr) : sizeof(struct iphdr)))
		return TC_ACT_SHOT;
	if (data + ETH_HLEN > end)
		return TC_ACT_SHOT;
	__builtin_memcpy(r.macs, eth->h_source, ETH_ALEN);
	__builtin_memcpy(r.macs + ETH_ALEN, eth->h_dest, ETH_ALEN);
	r.h_proto = eth->h_proto;

	if (!f->v6) {
		if (data + ETH_HLEN + QUOTE4 > end)
			return TC_ACT_SHOT;
		quote = QUOTE4;
		headers = HEADERS4;
		r.v4.ip.version = 4;
		r.v4.ip.ihl = 5;
		r.v4.ip.tot_len = bpf_htons(sizeof(r.v4) + QUOTE4);
		r.v4.ip.ttl = 64;
		r.v4.ip.protocol = IPPROTO_ICMP;
		__builtin_memcpy(&r.v4.ip.saddr, f->dst + 12, 4);
		__builtin_memcpy(&r.v4.ip.daddr, f->src + 12, 4);
		r.v4.ip.check = csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&r.v4.ip, sizeof(r.v4.ip), 0));
		r.v4.icmp[0] = 3; /* destination unreachable */
		r.v4.icmp[1] = 3; /* port unreachable */
		/* The ICMP checksum covers its header and the quote. */
		sum = bpf_csum_diff(NULL, 0, (__be32 *)r.v4.icmp, sizeof(r.v4.icmp), 0);
		sum = bpf_csum_diff(NULL, 0, data + ETH_HLEN, QUOTE4, (__u32)sum);
		*(__u16 *)&r.v4.icmp[2] = csum_fold(sum);
	} else {
		__be32 tail[2] = { bpf_htonl(sizeof(r.v6.icmp) + QUOTE6), bpf_htonl(IPPROTO_ICMPV6) };

		if (data + ETH_HLEN + QUOTE6 > end)
			return TC_ACT_SHOT;
		quote = QUOTE6;
		headers = HEADERS6;
		r.v6.ip.version = 6;
		r.v6.ip.payload_len = bpf_htons(sizeof(r.v6.icmp) + QUOTE6);
		r.v6.ip.nexthdr = IPPROTO_ICMPV6;
		r.v6.ip.hop_limit = 64;
		__builtin_memcpy(&r.v6.ip.saddr, f->dst, 16);
		__builtin_memcpy(&r.v6.ip.daddr, f->src, 16);
		r.v6.icmp[0] = 1; /* destination unreachable */
		r.v6.icmp[1] = 4; /* port unreachable */
		/* The checksum covers a pseudo-header (addresses, length, next
		 * header), the ICMPv6 header and the quote. */
		sum = bpf_csum_diff(NULL, 0, (__be32 *)&r.v6.ip.saddr, 32, 0);
		sum = bpf_csum_diff(NULL, 0, tail, sizeof(tail), (__u32)sum);
		sum = bpf_csum_diff(NULL, 0, (__be32 *)r.v6.icmp, sizeof(r.v6.icmp), (__u32)sum);
		sum = bpf_csum_diff(NULL, 0, data + ETH_HLEN, QUOTE6, (__u32)sum);
		*(__u16 *)&r.v6.icmp[2] = csum_fold(sum);
	}
	/* The packet cut to its Ethernet header and the quote, room made at
	 * the front for the new headers (the Ethernet header is rewritten
	 * there), which are then written. */
	if (bpf_skb_change_tail(skb, ETH_HLEN + quote, 0) ||
	    bpf_skb_change_head(skb, headers - ETH_HLEN, 0) ||
	    bpf_skb_store_bytes(skb, 0, r.macs, headers, 0))
		return TC_ACT_SHOT;
	return bpf_redirect(skb->ifindex, 0);
}

/* No backend can take a new flow to a VIP: its client hears so at once. */
static __always_inline int refuse(struct __sk_buff *skb, const struct flow *f)
{
	if (f->proto == IPPROTO_UDP)
		return unreachable(skb, f);
	return reset(skb, f);
}

/* Whether a service is reached from the network (HM_CFG_EXTERNAL in
 * HM_CONFIG, `cfg`): only then can a packet be of a flow HM_NAT holds. */
static __always_inline int external_enabled(const struct hm_config *cfg)
{
	return cfg && (cfg->flags & HM_CFG_EXTERNAL);
}

/* The key of the other entry of the flow `v` belongs to: the answer to the
 * packet `v` makes. A client's entry answered is the backend's reply,
 * which comes back to the ingress when its source was translated and
 * leaves through an egress when not; a backend's entry answered is the
 * client's next packet, at the ingress. */
static __always_inline void nat_peer_key(struct hm_ct_key *k, const struct hm_nat_value *v, __u8 proto)
{
	__u8 dir = (v->flags & (HM_NAT_F_REPLY | HM_NAT_F_SNAT)) ? HM_NAT_IN : HM_NAT_OUT;

	ct_key(k, v->dst, v->src, v->dport, v->sport, proto, dir);
}

/* Forgets the flow of the entry `k` found: both entries. */
static __always_inline void nat_forget(const struct hm_ct_key *k, const struct hm_nat_value *v, __u8 proto)
{
	struct hm_ct_key pk = {};

	nat_peer_key(&pk, v, proto);
	bpf_map_delete_elem(&HM_NAT, &pk);
	bpf_map_delete_elem(&HM_NAT, k);
}

/* A connection of the host's own takes the tuple a flow from the network
 * to another host's backend holds (`k`: that backend's reply key): the
 * host's connection wins, the flow is forgotten. */
static __always_inline void nat_yield(const struct hm_ct_key *k, __u8 proto)
{
	struct hm_nat_value *v = bpf_map_lookup_elem(&HM_NAT, k);

	if (v && (v->flags & (HM_NAT_F_REPLY | HM_NAT_F_SNAT)) == (HM_NAT_F_REPLY | HM_NAT_F_SNAT))
		nat_forget(k, v, proto);
}

/* What the steps of the programs below return besides a TC verdict
 * (hm_natout's and hm_natin's: translate and send; hm_reply's: the packet
 * is not theirs, a new flow may start; both: a new flow must be refused). */
#define NOT_MINE (-100)
#define NEW_FLOW (-101)
#define REFUSE (-102)
#define SEND (-103)

/* hm_flow_hash of a parsed packet, whose addresses are 8-aligned. */
static __always_inline __u32 flow_hash(const struct flow *f)
{
	return hm_flow_hash_words((const __u64 *)f->src, (const __u64 *)f->dst, f->sport, f->dport, f->proto);
}

/* Keeps the next hop `h` the FIB found in a flow's forward entry `v`. */
static __always_inline void keep_hop(struct hm_ct_value *v, const struct hop *h, __u64 now)
{
	v->fib_epoch = fib_epoch(now);
	v->fib_ifindex = h->ifindex;
	__builtin_memcpy(v->fib_macs, h->macs, sizeof(v->fib_macs));
}

/* The backend a packet of the veth path goes to, and where it leaves. */
struct veth_dest {
	__u8 addr[16];
	__be16 port;
	__u16 _pad;
	struct hop hop;
};

/* The veth path's flow of a packet to a VIP: the backend its entry holds,
 * or one picked (Maglev, on the flow's hash) and recorded in HM_CT; then
 * SEND, with `to` saying where. At hm-natin's egress (`egress`) only a
 * flow whose backend is reached out of an interface is taken; any other
 * packet is left (TC_ACT_OK) to cross the veth untouched, to hm_natout,
 * which delivers to local backends and refuses what no backend takes. A
 * subprogram of its own (its frame is 5.10's 512-byte stack budget's
 * largest part). */
static __attribute__((noinline)) int veth_flow(struct __sk_buff *skb, const struct flow *f, struct veth_dest *to,
					       int egress)
{
	struct hm_ct_key fk = {}, rk = {};
	struct hm_ct_value *ct;
	struct hm_config *cfg = hm_config();
	__u64 now = hm_now();
	__u32 svc_id;
	int closed, known;

	ct_key(&fk, f->src, f->dst, f->sport, f->dport, f->proto, HM_CT_FORWARD);
	/* A SYN after a flow closed starts a new flow on its tuple, so a SYN
	 * asks only the open flows (a SYN sent again is one of those). */
	if (f->proto == IPPROTO_TCP && (f->tcp_flags & (TCP_SYN | TCP_ACK)) == TCP_SYN) {
		ct = bpf_map_lookup_elem(&HM_CT, &fk);
		closed = 0;
	} else {
		ct = ct_find(&fk, &closed);
	}
	known = ct && ct_live(ct, f->proto, now, cfg) && !(closed && (f->tcp_flags & TCP_SYN));
	if (known) {
		__builtin_memcpy(to->addr, ct->nat_addr, 16);
		to->port = ct->nat_port;
		svc_id = ct->svc_id;
	} else {
		struct hm_svc_key sk = {};
		struct hm_svc_value *svc;
		struct hm_backend *be;

		__builtin_memcpy(sk.addr, f->dst, 16);
		sk.port = f->dport;
		sk.proto = f->proto;
		svc = bpf_map_lookup_elem(&HM_SERVICES, &sk);
		if (!svc || svc->backend_count == 0)
			return egress ? TC_ACT_OK : REFUSE;
		/* The 5-tuple's hash: a flow whose entry was lost (evicted,
		 * expired) gets the same backend again while the table is
		 * unchanged, and `hostmesh explain --from` can say which. */
		be = hm_pick_backend(svc, f->src, flow_hash(f));
		if (!be)
			return egress ? TC_ACT_OK : REFUSE;
		__builtin_memcpy(to->addr, be->addr, 16);
		to->port = be->port;
		svc_id = svc->id;
	}
	if (known && ct->fib_ifindex && ct->fib_epoch == fib_epoch(now)) {
		to->hop.rc = BPF_FIB_LKUP_RET_SUCCESS;
		to->hop.ifindex = ct->fib_ifindex;
		__builtin_memcpy(to->hop.macs, ct->fib_macs, sizeof(to->hop.macs));
	} else {
		find_hop(skb, f, to->addr, &to->hop);
		if (egress && !hop_out(&to->hop))
			return TC_ACT_OK;
		if (known && to->hop.rc == BPF_FIB_LKUP_RET_SUCCESS)
			keep_hop(ct, &to->hop, now);
	}

	ct_key(&rk, to->addr, f->src, to->port, f->sport, f->proto, HM_CT_REVERSE);
	if (known) {
		__u8 news = ct_end(f, HM_CT_F_FIN_OUT);

		if (closed)
			ct_refresh_closed(ct, now);
		else if (!ct_nothing_new(ct, news, now))
			/* A RST deletes both entries: the other one is not looked up. */
			ct_seen(&fk, ct, &rk, (news & HM_CT_F_RESET) ? NULL : bpf_map_lookup_elem(&HM_CT, &rk), news,
				now);
	} else {
		struct hm_ct_value fv = {}, rv = {};

		__builtin_memcpy(fv.nat_addr, to->addr, 16);
		fv.nat_port = to->port;
		fv.svc_id = svc_id;
		fv.flags = ct_end(f, HM_CT_F_FIN_OUT);
		/* Not a SYN: picked up mid-stream (conntrack.h). */
		if (f->proto == IPPROTO_TCP && !(f->tcp_flags & TCP_SYN))
			fv.flags |= HM_CT_F_PICKUP;
		fv.last_seen_ns = now;
		__builtin_memcpy(rv.nat_addr, f->dst, 16);
		rv.nat_port = f->dport;
		rv.svc_id = svc_id;
		rv.flags = fv.flags;
		rv.last_seen_ns = now;
		if (to->hop.rc == BPF_FIB_LKUP_RET_SUCCESS)
			keep_hop(&fv, &to->hop, now);
		/* A RST ends what it belongs to: it goes on, remembered by no one. */
		if (!(fv.flags & HM_CT_F_RESET) &&
		    (bpf_map_update_elem(&HM_CT, &rk, &rv, BPF_ANY) || bpf_map_update_elem(&HM_CT, &fk, &fv, BPF_ANY)))
			return TC_ACT_SHOT;
		/* A socket of the host bound on purpose to a port of
		 * snat_port_range, to a backend a flow from the network reaches
		 * from that port: the host's connection wins (as external_yield
		 * has it for connections straight to the backend), so that flow
		 * is forgotten, and hm_reply, which asks HM_NAT first, gives the
		 * backend's replies to this flow. */
		if (external_enabled(cfg) && bpf_ntohs(f->sport) >= cfg->snat_port_min &&
		    bpf_ntohs(f->sport) <= cfg->snat_port_max) {
			rk.dir = HM_NAT_IN;
			nat_yield(&rk, f->proto);
		}
	}
	hm_count_backend(svc_id, to->addr, to->port, known ? HM_STAT_NONE : HM_STAT_VETH, skb->len, 0);
	return SEND;
}

/* refuse(), as a subprogram of its own: its frame and veth_flow's are
 * not added up (5.10 allows 512 bytes for a chain of calls). */
static __attribute__((noinline)) int veth_refuse(struct __sk_buff *skb, const struct flow *f)
{
	return refuse(skb, f);
}

/* Translates a packet to its backend and sends it on, as a subprogram
 * of its own for the same reason. */
static __attribute__((noinline)) int veth_send(struct __sk_buff *skb, const struct flow *f, const struct veth_dest *to)
{
	if (rewrite(skb, f, 1, to->addr, to->port))
		return TC_ACT_SHOT;
	return noted(skb, send_hop(skb, &to->hop));
}

/* A packet to a VIP, at hm-natin's egress or hm-natout's ingress. */
static __always_inline int veth_nat(struct __sk_buff *skb, int egress)
{
	struct flow f = {};
	struct veth_dest to = {};
	int verdict;

	switch (parse(skb, &f)) {
	case PARSED:
		break;
	case OTHER_IP:
		/* Neighbour discovery on the veth itself is fine; anything else
		 * here came through a VIP route and would loop (hm_natout drops
		 * it; hm_natin leaves it to hm_natout). */
		return (egress || (f.v6 && f.proto == IPPROTO_ICMPV6)) ? TC_ACT_OK : TC_ACT_SHOT;
	default:
		return TC_ACT_OK;
	}
	verdict = veth_flow(skb, &f, &to, egress);
	if (verdict == REFUSE)
		return veth_refuse(skb, &f);
	if (verdict != SEND)
		return verdict;
	return veth_send(skb, &f, &to);
}

/* TC egress on hm-natin: a packet to a VIP whose backend is reached out
 * of an interface is translated here and redirected to that interface,
 * without crossing the veth (no second receive, no backlog queue); the
 * rest goes on to hm_natout. */
SEC("classifier")
int hm_natin(struct __sk_buff *skb)
{
	HM_BUILD_MARK();
	return veth_nat(skb, 1);
}

/* TC ingress on hm-natout: every packet hm_natin left, as every packet to
 * a VIP was before hm_natin (and is while a restart attaches it). */
SEC("classifier")
int hm_natout(struct __sk_buff *skb)
{
	HM_BUILD_MARK();
	return veth_nat(skb, 0);
}

/* Flows from the network: node ports and external VIPs (hostmesh_abi.h,
 * HM_NAT). A client's packet arrives at a host interface's ingress
 * (hm_reply), is given a backend by the service's Maglev table as a host
 * client's would be, and is forwarded to it; a backend on another host
 * sees this host's address and a port of [daemon] snat_port_range (so its
 * replies come back here, to the same ingress), a backend on this host
 * the client's own address (its replies leave through a host interface's
 * egress, hm_direct). */

/* The steps of hm_reply return NOT_MINE, NEW_FLOW or REFUSE (above)
 * besides a TC verdict. Each step is a function of its own (a BPF
 * subprogram), called one after the other from hm_reply, so their stacks
 * are not added up: inlined into one, they exceed the 512 bytes the
 * verifier allows. */
/* lo's ifindex in every namespace (LOOPBACK_IFINDEX): the host's own
 * packets, which the network's flows never are. */
#define HM_LOOPBACK_IFINDEX 1


/* Rewrites a packet as its flow's entry says (addresses and ports), and
 * `f` with it. */
static __always_inline int nat_rewrite(struct __sk_buff *skb, struct flow *f, const struct hm_nat_value *v)
{
	if (rewrite_to(skb, f, v->src, v->dst, v->sport, v->dport))
		return -1;
	__builtin_memcpy(f->src, v->src, 16);
	__builtin_memcpy(f->dst, v->dst, 16);
	f->sport = v->sport;
	f->dport = v->dport;
	return 0;
}

/* Whether a packet may use the entry found for it: not idle past its
 * timeout, and not a SYN on the client's entry of a closed flow (which
 * starts a new flow on the tuple). */
static __always_inline int nat_live(const struct hm_nat_value *v, const struct flow *f, __u64 now)
{
	if (hm_idle_ns(now, v->last_seen_ns) >= ct_timeout_ns(v->flags, f->proto, hm_config()))
		return 0;
	return (v->flags & HM_NAT_F_REPLY) || !(v->flags & HM_CT_F_CLOSING) || f->proto != IPPROTO_TCP ||
	       (f->tcp_flags & (TCP_SYN | TCP_ACK)) != TCP_SYN;
}

/* What a packet of a known flow says: a FIN from either side (a FIN each
 * way closes the flow, which then lives HM_CT_CLOSING_TIMEOUT_S), the
 * backend's answer, a RST (the flow is forgotten: returns 1, and `v` is
 * not to be touched again). Both entries share the state, and their
 * times are refreshed at most once a second: a write per packet to a
 * shared cache line costs more than the second is worth. */
static __always_inline int nat_seen(const struct hm_ct_key *k, struct hm_nat_value *v, const struct flow *f,
				    __u64 now)
{
	struct hm_ct_key pk = {};
	struct hm_nat_value *peer;
	__u8 reply = v->flags & HM_NAT_F_REPLY;
	__u8 state = ct_end(f, reply ? HM_CT_F_FIN_BACK : HM_CT_F_FIN_OUT) | (reply ? HM_CT_F_REPLIED : 0);
	const __u8 kept = HM_CT_F_REPLIED | HM_CT_F_CLOSING | HM_CT_F_FIN_OUT | HM_CT_F_FIN_BACK;

	if (state & HM_CT_F_RESET) {
		nat_forget(k, v, f->proto);
		return 1;
	}
	/* Nothing new, and refreshed within the second: every packet that
	 * brought news wrote it to both entries, so the peer holds no more
	 * (its lookup is the one saved on most packets). */
	if (!(state & ~v->flags) && hm_idle_ns(now, v->last_seen_ns) < NS_PER_S)
		return 0;
	nat_peer_key(&pk, v, f->proto);
	peer = bpf_map_lookup_elem(&HM_NAT, &pk);
	state = (state | v->flags | (peer ? peer->flags : 0)) & kept;
	if ((state & (HM_CT_F_FIN_OUT | HM_CT_F_FIN_BACK)) == (HM_CT_F_FIN_OUT | HM_CT_F_FIN_BACK))
		state |= HM_CT_F_CLOSING;
	if ((v->flags | state) != v->flags || hm_idle_ns(now, v->last_seen_ns) >= NS_PER_S) {
		v->flags |= state;
		v->last_seen_ns = now;
	}
	if (peer && ((peer->flags | state) != peer->flags || hm_idle_ns(now, peer->last_seen_ns) >= NS_PER_S)) {
		peer->flags |= state;
		peer->last_seen_ns = now;
	}
	return 0;
}

/* Whether the packet is to an address of a host interface, where node
 * ports answer (HM_HOST_ADDRS, which the daemon keeps). */
static __always_inline int to_this_host(const struct flow *f)
{
	struct hm_addr a = {};

	__builtin_memcpy(a.addr, f->dst, 16);
	return bpf_map_lookup_elem(&HM_HOST_ADDRS, &a) != NULL;
}

/* What snat_port_take tries ports for: a new flow to a backend on another
 * host as the backend will see it, but for this host's port, and the
 * backend's entry to make in HM_NAT. snat_port writes it before its
 * tries; one per CPU, where a program runs to its end. */
struct snat_probe {
	struct hm_nat_value rv;
	__u8 backend[16];
	__u8 host[16];
	__be16 backend_port;
	__u8 proto;
	__u8 v6;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct snat_probe);
} HM_SNAT_PROBE SEC(".maps");

/* Whether a socket of this host would take a packet backend -> host:port:
 * a connection of the host's own (bound to a port of the range on
 * purpose) or a listener. Such a port is never given to a flow, so the
 * host's connection is never broken by one. */
static __always_inline int port_taken(struct __sk_buff *skb, const struct snat_probe *p, __be16 port)
{
	struct bpf_sock_tuple t = {};
	struct bpf_sock *sk;
	__u32 len;

	if (!p->v6) {
		__builtin_memcpy(&t.ipv4.saddr, p->backend + 12, 4);
		__builtin_memcpy(&t.ipv4.daddr, p->host + 12, 4);
		t.ipv4.sport = p->backend_port;
		t.ipv4.dport = port;
		len = sizeof(t.ipv4);
	} else {
		__builtin_memcpy(t.ipv6.saddr, p->backend, 16);
		__builtin_memcpy(t.ipv6.daddr, p->host, 16);
		t.ipv6.sport = p->backend_port;
		t.ipv6.dport = port;
		len = sizeof(t.ipv6);
	}
	if (p->proto == IPPROTO_TCP)
		sk = bpf_sk_lookup_tcp(skb, &t, len, BPF_F_CURRENT_NETNS, 0);
	else
		sk = bpf_sk_lookup_udp(skb, &t, len, BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return 0;
	bpf_sk_release(sk);
	return 1;
}

/* Takes `port` for the flow HM_SNAT_PROBE holds, returning 1, unless a
 * socket of the host's takes the backend's replies to it (port_taken), a
 * connection of the host's through the veth path, from a socket bound to
 * the port on purpose, to this backend holds it (the backend's replies on
 * it are that connection's), or another flow's entry is on its reply key
 * (the entry is made there BPF_NOEXIST, so two CPUs never share one).
 *
 * A global function, which the verifier checks once, on its own: as a
 * static one it was checked again in each of HM_SNAT_TRIES tries from
 * each calling context, three quarters of the work of verifying hm_reply
 * and hm_direct (57,000 of 77,000 instructions each; under a VM's
 * emulation over a second of each daemon start). Its arguments are the
 * context and a scalar, all that 5.10 lets a global function take. */
__attribute__((noinline)) int snat_port_take(struct __sk_buff *skb, __be16 port)
{
	__u32 zero = 0;
	struct snat_probe *p = bpf_map_lookup_elem(&HM_SNAT_PROBE, &zero);
	struct hm_ct_key rk = {};
	int closed;

	if (!p || port_taken(skb, p, port))
		return 0;
	ct_key(&rk, p->backend, p->host, p->backend_port, port, p->proto, HM_CT_REVERSE);
	if (ct_find(&rk, &closed))
		return 0;
	rk.dir = HM_NAT_IN;
	return bpf_map_update_elem(&HM_NAT, &rk, &p->rv, BPF_NOEXIST) == 0;
}

/* A source port of [daemon] snat_port_range for a new flow to a backend on
 * another host (`fv`, its source already this host's address, and `rv`,
 * the backend's entry): the first of HM_SNAT_TRIES ports from the flow's
 * hash that snat_port_take takes. Returns 0 when it takes none. */
static __attribute__((noinline)) int snat_port(struct __sk_buff *skb, struct hm_nat_value *fv,
					       const struct hm_nat_value *rv, const struct flow *f, __u32 hash)
{
	struct hm_config *cfg = hm_config();
	struct snat_probe *p;
	__u32 min, span, zero = 0;

	if (!cfg || cfg->snat_port_min == 0 || cfg->snat_port_max < cfg->snat_port_min)
		return 0;
	p = bpf_map_lookup_elem(&HM_SNAT_PROBE, &zero);
	if (!p)
		return 0;
	__builtin_memcpy(&p->rv, rv, sizeof(*rv));
	__builtin_memcpy(p->backend, fv->dst, 16);
	__builtin_memcpy(p->host, fv->src, 16);
	p->backend_port = fv->dport;
	p->proto = f->proto;
	p->v6 = f->v6;
	min = cfg->snat_port_min;
	span = cfg->snat_port_max - min + 1;
	for (__u32 i = 0; i < HM_SNAT_TRIES; i++) {
		__be16 port = bpf_htons((__u16)(min + (hash + i) % span));

		if (snat_port_take(skb, port)) {
			fv->sport = port;
			return 1;
		}
	}
	return 0;
}

/* The first packet of a flow from the network: to an external VIP:port, or
 * to an address of this host on a node port. Picks the backend and fills
 * the flow's two entries (`fv` the client's, `rv` the backend's) but for
 * the source a backend on another host sees, which nat_record chooses.
 * Returns 0 then, REFUSE when no backend can take the flow, a verdict for
 * a packet that starts none (anything else passes). */
static __attribute__((noinline)) int nat_new(struct __sk_buff *skb, const struct flow *f, struct hm_nat_value *fv,
					     struct hm_nat_value *rv)
{
	struct hm_svc_key sk = {};
	struct hm_svc_value *svc;
	struct hm_backend *be;
	struct hm_snat_value *snat;
	struct hm_addr ba = {};
	__u64 now = hm_now();
	int vip = 1;

	__builtin_memcpy(sk.addr, f->dst, 16);
	sk.port = f->dport;
	sk.proto = f->proto;
	sk.scope = HM_SVC_SCOPE_NETWORK;
	svc = bpf_map_lookup_elem(&HM_SERVICES, &sk);
	if (!svc) {
		vip = 0;
		__builtin_memset(sk.addr, 0, 16);
		if (!f->v6) {
			sk.addr[10] = 0xff;
			sk.addr[11] = 0xff;
		}
		svc = bpf_map_lookup_elem(&HM_SERVICES, &sk);
		if (!svc || !(svc->flags & HM_SVC_F_NODE_PORT) || !to_this_host(f))
			return TC_ACT_UNSPEC;
	}
	/* Only a SYN starts a TCP flow. A segment of no flow to a host
	 * address goes to the host, which resets it; one to an external VIP
	 * has nowhere to go. */
	if (f->proto == IPPROTO_TCP && (f->tcp_flags & (TCP_SYN | TCP_ACK | TCP_RST)) != TCP_SYN)
		return vip ? TC_ACT_SHOT : TC_ACT_UNSPEC;
	if (svc->backend_count == 0)
		return REFUSE;
	be = hm_pick_backend(svc, f->src, flow_hash(f));
	if (!be)
		return REFUSE;
	__builtin_memcpy(ba.addr, be->addr, 16);
	snat = bpf_map_lookup_elem(&HM_SNAT, &ba);
	if (!snat)
		return TC_ACT_SHOT;

	__builtin_memcpy(fv->dst, be->addr, 16);
	fv->dport = be->port;
	fv->svc_id = svc->id;
	fv->last_seen_ns = now;
	__builtin_memcpy(rv->dst, f->src, 16);
	rv->dport = f->sport;
	__builtin_memcpy(rv->src, f->dst, 16);
	rv->sport = f->dport;
	rv->svc_id = svc->id;
	rv->last_seen_ns = now;
	rv->flags = HM_NAT_F_REPLY;
	/* The turnaround: the client is a process of this host. */
	if (skb->ifindex == HM_LOOPBACK_IFINDEX) {
		fv->flags = HM_NAT_F_HOST;
		rv->flags |= HM_NAT_F_HOST;
	}
	if (hm_same_addr(snat->src, (const __u8[16]){})) {
		__builtin_memcpy(fv->src, f->src, 16);
		fv->sport = f->sport;
	} else {
		fv->flags |= HM_NAT_F_SNAT;
		rv->flags |= HM_NAT_F_SNAT;
		__builtin_memcpy(fv->src, snat->src, 16);
	}
	return 0;
}

/* Records a new flow's two entries: a backend on another host's reply key
 * was made by snat_port with the port it chose (called before, from
 * external_flow: called from here, its frame and this one's together
 * passed the 512 bytes 5.10's verifier allows a chain of calls). Returns
 * 0, or a verdict when the flow cannot be recorded (a full map). */
static __attribute__((noinline)) int nat_record(struct __sk_buff *skb, const struct flow *f, struct hm_nat_value *fv,
						struct hm_nat_value *rv)
{
	struct hm_ct_key fk = {}, rk = {};

	if (fv->flags & HM_NAT_F_SNAT) {
		ct_key(&rk, fv->dst, fv->src, fv->dport, fv->sport, f->proto, HM_NAT_IN);
	} else {
		ct_key(&rk, fv->dst, fv->src, fv->dport, fv->sport, f->proto, HM_NAT_OUT);
		if (bpf_map_update_elem(&HM_NAT, &rk, rv, BPF_ANY))
			return TC_ACT_SHOT;
	}
	ct_key(&fk, f->src, f->dst, f->sport, f->dport, f->proto, HM_NAT_IN);
	if (bpf_map_update_elem(&HM_NAT, &fk, fv, BPF_ANY)) {
		bpf_map_delete_elem(&HM_NAT, &rk);
		return TC_ACT_SHOT;
	}
	return 0;
}

/* A flow from the network keeps where its translated packets leave in
 * each of its entries (as the veth path's forward entries do: fib_epoch
 * above): found by the first packet each way, and again by the first in
 * each epoch. */
static __always_inline int nat_hop_known(const struct hm_nat_value *v, __u64 now)
{
	return v->fib_ifindex && v->fib_epoch == fib_epoch(now);
}

/* Finds where the packets of `v`'s flow leave, and keeps it in `v` (none
 * for the turnaround's replies, which go to lo). */
static __attribute__((noinline)) void nat_find_hop(struct __sk_buff *skb, struct hm_nat_value *v, __u8 proto, __u8 v6,
						   __u64 now)
{
	struct bpf_fib_lookup fib = {};

	v->fib_ifindex = 0;
	if ((v->flags & (HM_NAT_F_REPLY | HM_NAT_F_HOST)) == (HM_NAT_F_REPLY | HM_NAT_F_HOST))
		return;
	if (next_hop(skb, &fib, proto, v6, v->src, v->dst) != BPF_FIB_LKUP_RET_SUCCESS)
		return;
	v->fib_epoch = fib_epoch(now);
	__builtin_memcpy(v->fib_macs, fib.dmac, ETH_ALEN);
	__builtin_memcpy(v->fib_macs + ETH_ALEN, fib.smac, ETH_ALEN);
	v->fib_ifindex = fib.ifindex;
}

/* Hands a reply to a process of this host (the turnaround: it connected
 * to its own node port) to the host as lo receives it: a packet from one
 * of the host's addresses arriving on another interface is a martian
 * source, dropped; lo, whose accept_local the daemon sets while node
 * ports and the turnaround exist, takes it. lo's address is all zeros. */
static __always_inline int to_host_via_lo(struct __sk_buff *skb)
{
	__u8 macs[2 * ETH_ALEN] = {};

	if (bpf_skb_store_bytes(skb, 0, macs, sizeof(macs), 0))
		return TC_ACT_SHOT;
	return bpf_redirect(HM_LOOPBACK_IFINDEX, BPF_F_INGRESS);
}

/* Sends a packet of a flow from the network on as its entry `v` says:
 * where its next hop is known, straight there. */
static __attribute__((noinline)) int nat_send(struct __sk_buff *skb, struct flow *f, const struct hm_nat_value *v)
{
	if (v->flags & HM_NAT_F_REPLY)
		hm_count_backend(v->svc_id, f->src, f->sport, HM_STAT_NONE, 0, skb->len);
	else
		hm_count_backend(v->svc_id, v->dst, v->dport, HM_STAT_NONE, skb->len, 0);
	if (nat_rewrite(skb, f, v))
		return TC_ACT_SHOT;
	if ((v->flags & (HM_NAT_F_REPLY | HM_NAT_F_HOST)) == (HM_NAT_F_REPLY | HM_NAT_F_HOST) &&
	    skb->ifindex != HM_LOOPBACK_IFINDEX)
		return to_host_via_lo(skb);
	if (v->fib_ifindex) {
		if (bpf_skb_store_bytes(skb, OFF(struct ethhdr, h_dest), v->fib_macs, sizeof(v->fib_macs), 0))
			return TC_ACT_SHOT;
		return noted(skb, bpf_redirect(v->fib_ifindex, 0));
	}
	return noted(skb, forward(skb, f, f->dst));
}

/* A packet at a host interface's ingress: a packet of a flow from the
 * network (the client's, or the reply of a backend on another host),
 * whose entry it copies to `out` (returning 0); NEW_FLOW when it may be
 * the first of one; NOT_MINE when it was a backend's reply to a flow that
 * is over (it may still be a veth-path reply). */
static __attribute__((noinline)) int external_in(struct __sk_buff *skb, struct flow *f, struct hm_nat_value *out)
{
	struct hm_ct_key k = {};
	struct hm_nat_value *v;
	__u64 now;
	__u8 reply;

	now = hm_now();
	ct_key(&k, f->src, f->dst, f->sport, f->dport, f->proto, HM_NAT_IN);
	v = bpf_map_lookup_elem(&HM_NAT, &k);
	if (v) {
		if (nat_live(v, f, now)) {
			*out = *v;
			/* The copy: nat_seen may forget the entry (a RST). */
			if (nat_seen(&k, v, f, now)) {
				if (!nat_hop_known(out, now))
					out->fib_ifindex = 0;
				return 0;
			}
			if (!nat_hop_known(out, now)) {
				nat_find_hop(skb, out, f->proto, f->v6, now);
				v->fib_epoch = out->fib_epoch;
				v->fib_ifindex = out->fib_ifindex;
				__builtin_memcpy(v->fib_macs, out->fib_macs, sizeof(v->fib_macs));
			}
			return 0;
		}
		/* Over: forgotten, and the packet may start a new flow. */
		reply = v->flags & HM_NAT_F_REPLY;
		nat_forget(&k, v, f->proto);
		if (reply)
			return NOT_MINE;
	}
	return NEW_FLOW;
}

/* A packet at a host interface's egress: the reply of a backend on this
 * host to a client of a flow from the network gets the VIP (or this
 * host's address and node port) back as its source. Returns 1 when it
 * was one (and `*verdict` says what becomes of it). */
static __attribute__((noinline)) int external_out(struct __sk_buff *skb, struct flow *f, int *verdict)
{
	struct hm_ct_key k = {};
	struct hm_nat_value *v, nv;
	__u64 now;

	ct_key(&k, f->src, f->dst, f->sport, f->dport, f->proto, HM_NAT_OUT);
	v = bpf_map_lookup_elem(&HM_NAT, &k);
	if (!v)
		return 0;
	now = hm_now();
	nv = *v;
	if (!nat_live(v, f, now)) {
		nat_forget(&k, &nv, f->proto);
		return 0;
	}
	nat_seen(&k, v, f, now);
	hm_count_backend(nv.svc_id, f->src, f->sport, HM_STAT_NONE, 0, skb->len);
	*verdict = nat_rewrite(skb, f, &nv) ? TC_ACT_SHOT : TC_ACT_UNSPEC;
	return 1;
}

/* The host sends from a tuple a flow from the network uses on its way to
 * a backend on another host (a socket bound on purpose to a port of the
 * range): the host's connection wins, the flow is forgotten. Only a
 * socket's own packet counts: a host process's packet to its own node
 * port, translated at lo (the turnaround), leaves here too, from its
 * flow's tuple but of a socket on another port. */
static __attribute__((noinline)) void external_yield(struct __sk_buff *skb, const struct flow *f)
{
	struct hm_ct_key k = {};
	struct bpf_sock *sk = skb->sk;

	if (!sk || sk->src_port != bpf_ntohs(f->sport))
		return;

	ct_key(&k, f->dst, f->src, f->dport, f->sport, f->proto, HM_NAT_IN);
	nat_yield(&k, f->proto);
}

/* A SYN-ACK: the answer to a SYN. */
static __always_inline int syn_ack(const struct flow *f)
{
	return f->proto == IPPROTO_TCP && (f->tcp_flags & (TCP_SYN | TCP_ACK)) == (TCP_SYN | TCP_ACK);
}

/* An ICMP error about a flow the veth path translated (fragmentation needed,
 * packet too big, port unreachable, time exceeded) quotes the packet as
 * the backend was sent it: client -> backend. The client's socket knows
 * only client -> VIP, so untranslated the error is lost: path MTU
 * discovery stalls behind a smaller link, a connected UDP socket never
 * hears ECONNREFUSED. The quoted destination gets the VIP and port back;
 * the checksums are adjusted so the ICMP message's sum is unchanged (so
 * a CHECKSUM_COMPLETE skb's csum stays right): the quoted IPv4 header's
 * own checksum absorbs its address change, the ICMP checksum the port's
 * (and, for IPv6, the address's). The quoted L4 checksum is left: the
 * quote is truncated and nobody checks it. Nothing else is touched, and
 * the flow's entries are not refreshed by an error. */
static __attribute__((noinline)) void icmp_error_back(struct __sk_buff *skb, const struct flow *f)
{
	__u32 icmp_off = f->l4_off, in_off = f->l4_off + 8, in_l4;
	__u8 type, in_proto, in_src[16], in_dst[16];
	struct hm_ct_key rk = {};
	struct hm_ct_value *rev;
	__be16 ports[2], vport;
	int closed;

	if (bpf_skb_load_bytes(skb, icmp_off, &type, 1))
		return;
	if (!f->v6) {
		struct iphdr in;

		/* Destination unreachable, time exceeded, parameter problem. */
		if (f->proto != IPPROTO_ICMP || (type != 3 && type != 11 && type != 12))
			return;
		if (bpf_skb_load_bytes(skb, in_off, &in, sizeof(in)) || in.ihl < 5 ||
		    (in.frag_off & bpf_htons(0x1fff)))
			return;
		in_proto = in.protocol;
		in_l4 = in_off + in.ihl * 4;
		hm_v4_mapped(in_src, in.saddr);
		hm_v4_mapped(in_dst, in.daddr);
	} else {
		struct ipv6hdr in;

		/* Destination unreachable, packet too big, time exceeded,
		 * parameter problem. */
		if (f->proto != IPPROTO_ICMPV6 || type < 1 || type > 4)
			return;
		if (bpf_skb_load_bytes(skb, in_off, &in, sizeof(in)))
			return;
		in_proto = in.nexthdr;
		in_l4 = in_off + sizeof(in);
		__builtin_memcpy(in_src, &in.saddr, 16);
		__builtin_memcpy(in_dst, &in.daddr, 16);
	}
	if ((in_proto != IPPROTO_TCP && in_proto != IPPROTO_UDP) || bpf_skb_load_bytes(skb, in_l4, ports, 4))
		return;
	/* The quoted packet went client -> backend; its flow's reverse
	 * entry (backend -> client) holds the VIP. */
	ct_key(&rk, in_dst, in_src, ports[1], ports[0], in_proto, HM_CT_REVERSE);
	rev = ct_find(&rk, &closed);
	if (!rev)
		return;
	vport = rev->nat_port;
	if (!f->v6) {
		__be32 from, to;

		__builtin_memcpy(&from, in_dst + 12, 4);
		__builtin_memcpy(&to, rev->nat_addr + 12, 4);
		if (bpf_l3_csum_replace(skb, in_off + OFF(struct iphdr, check), from, to, 4) ||
		    bpf_skb_store_bytes(skb, in_off + OFF(struct iphdr, daddr), &to, 4, 0))
			return;
	} else {
		__u8 vip[16];
		__s64 diff;

		__builtin_memcpy(vip, rev->nat_addr, 16);
		diff = bpf_csum_diff((__be32 *)in_dst, 16, (__be32 *)vip, 16, 0);
		if (bpf_l3_csum_replace(skb, icmp_off + 2, 0, diff, 0) ||
		    bpf_skb_store_bytes(skb, in_off + OFF(struct ipv6hdr, daddr), vip, 16, 0))
			return;
	}
	if (ports[1] != vport) {
		if (bpf_l3_csum_replace(skb, icmp_off + 2, ports[1], vport, 2))
			return;
		bpf_skb_store_bytes(skb, in_l4 + 2, &vport, 2, 0);
	}
}

/* A reply of the veth path's: the VIP back as its source (NOT_MINE when
 * the packet is none). */
static __attribute__((noinline)) int veth_reply(struct __sk_buff *skb, struct flow *f)
{
	struct hm_ct_key rk = {}, fk = {};
	struct hm_ct_value *rev, *fwd, *state;
	__u8 vip[16];
	__be16 vport;
	__u32 svc_id;
	__u64 now;
	__u8 news;
	int closed;

	ct_key(&rk, f->src, f->dst, f->sport, f->dport, f->proto, HM_CT_REVERSE);
	rev = ct_find(&rk, &closed);
	if (!rev)
		return NOT_MINE;
	__builtin_memcpy(vip, rev->nat_addr, 16);
	vport = rev->nat_port;
	svc_id = rev->svc_id;
	now = hm_now();
	news = HM_CT_F_REPLIED | ct_end(f, HM_CT_F_FIN_BACK);
	/* Most replies: an open flow, refreshed within the second (so live),
	 * and nothing new; the forward entry is not looked up. */
	if (closed || !ct_nothing_new(rev, news, now) || (syn_ack(f) && (rev->flags & HM_CT_F_CLOSING))) {
		ct_key(&fk, f->dst, vip, f->dport, vport, f->proto, HM_CT_FORWARD);
		fwd = ct_peer(&fk, closed);
		/* The forward entry's state decides whether the flow is live
		 * (the reverse one's, should the forward one be gone). */
		state = fwd ? fwd : rev;
		if (!ct_live(state, f->proto, now, hm_config()) ||
		    (syn_ack(f) && (closed || (state->flags & HM_CT_F_CLOSING)))) {
			ct_forget(&fk, &rk, closed);
			return TC_ACT_UNSPEC;
		}
		if (closed) {
			ct_refresh_closed(rev, now);
			ct_refresh_closed(fwd, now);
		} else {
			ct_seen(&fk, fwd, &rk, rev, news, now);
		}
	}

	hm_count_backend(svc_id, f->src, f->sport, HM_STAT_NONE, 0, skb->len);
	if (rewrite(skb, f, 0, vip, vport))
		return TC_ACT_SHOT;
	return TC_ACT_UNSPEC;
}


/* An ICMP error about a flow from the network to another host's backend
 * (fragmentation needed, packet too big, port unreachable, time exceeded),
 * from a router on the way to the backend or from the backend: it is sent
 * to this host's address and quotes the packet as the backend was sent it
 * (this host's address and source port -> backend). The client knows only
 * client -> node port or VIP: the error goes on to the client with the
 * quote translated back, so path MTU discovery works through hostmesh.
 * IPv4: the outer destination and both quoted addresses change (the
 * outer and the quoted header checksums absorb theirs; the ICMP checksum
 * covers only the quoted ports' change). IPv6: the ICMPv6 checksum covers
 * the outer destination (pseudo-header) and every quoted change. Returns
 * the verdict: the error forwarded, or TC_ACT_UNSPEC for anything else. */
static __attribute__((noinline)) int external_icmp(struct __sk_buff *skb, struct flow *f)
{
	__u32 icmp_off = f->l4_off, in_off = f->l4_off + 8, in_l4, sum_off = f->l4_off + 2;
	__u8 type, in_proto, in_src[16], in_dst[16];
	struct hm_ct_key k = {};
	struct hm_nat_value *v, nv;
	__be16 ports[2], new_ports[2];

	if (skb->ifindex == HM_LOOPBACK_IFINDEX || bpf_skb_load_bytes(skb, icmp_off, &type, 1))
		return TC_ACT_UNSPEC;
	if (!f->v6) {
		struct iphdr in;

		if (f->proto != IPPROTO_ICMP || (type != 3 && type != 11 && type != 12))
			return TC_ACT_UNSPEC;
		if (bpf_skb_load_bytes(skb, in_off, &in, sizeof(in)) || in.ihl != 5 || (in.frag_off & bpf_htons(0x1fff)))
			return TC_ACT_UNSPEC;
		in_proto = in.protocol;
		in_l4 = in_off + sizeof(in);
		hm_v4_mapped(in_src, in.saddr);
		hm_v4_mapped(in_dst, in.daddr);
	} else {
		struct ipv6hdr in;

		if (f->proto != IPPROTO_ICMPV6 || type < 1 || type > 4)
			return TC_ACT_UNSPEC;
		if (bpf_skb_load_bytes(skb, in_off, &in, sizeof(in)))
			return TC_ACT_UNSPEC;
		in_proto = in.nexthdr;
		in_l4 = in_off + sizeof(in);
		__builtin_memcpy(in_src, &in.saddr, 16);
		__builtin_memcpy(in_dst, &in.daddr, 16);
	}
	if ((in_proto != IPPROTO_TCP && in_proto != IPPROTO_UDP) || bpf_skb_load_bytes(skb, in_l4, ports, 4))
		return TC_ACT_UNSPEC;
	/* The quoted packet went host -> backend; the backend's entry is
	 * keyed by its answer. */
	ct_key(&k, in_dst, in_src, ports[1], ports[0], in_proto, HM_NAT_IN);
	v = bpf_map_lookup_elem(&HM_NAT, &k);
	if (!v || (v->flags & (HM_NAT_F_REPLY | HM_NAT_F_SNAT)) != (HM_NAT_F_REPLY | HM_NAT_F_SNAT))
		return TC_ACT_UNSPEC;
	nv = *v;
	/* The quote becomes client -> node port or VIP: the entry rewrites to
	 * (src: node port or VIP, dst: client), the quote the other way. */
	new_ports[0] = nv.dport;
	new_ports[1] = nv.sport;
	if (!f->v6) {
		__be32 host, client, backend, service;

		__builtin_memcpy(&host, in_src + 12, 4);
		__builtin_memcpy(&backend, in_dst + 12, 4);
		__builtin_memcpy(&client, nv.dst + 12, 4);
		__builtin_memcpy(&service, nv.src + 12, 4);
		if (bpf_l3_csum_replace(skb, ETH_HLEN + OFF(struct iphdr, check), host, client, 4) ||
		    bpf_skb_store_bytes(skb, ETH_HLEN + OFF(struct iphdr, daddr), &client, 4, 0) ||
		    bpf_l3_csum_replace(skb, in_off + OFF(struct iphdr, check), host, client, 4) ||
		    bpf_skb_store_bytes(skb, in_off + OFF(struct iphdr, saddr), &client, 4, 0) ||
		    bpf_l3_csum_replace(skb, in_off + OFF(struct iphdr, check), backend, service, 4) ||
		    bpf_skb_store_bytes(skb, in_off + OFF(struct iphdr, daddr), &service, 4, 0))
			return TC_ACT_SHOT;
	} else {
		__s64 diff;

		/* The outer destination (in the pseudo-header) and the two
		 * quoted addresses, in one difference. */
		diff = bpf_csum_diff((__be32 *)in_src, 16, (__be32 *)nv.dst, 16, 0);
		diff = bpf_csum_diff((__be32 *)in_src, 16, (__be32 *)nv.dst, 16, (__u32)diff);
		diff = bpf_csum_diff((__be32 *)in_dst, 16, (__be32 *)nv.src, 16, (__u32)diff);
		if (bpf_l3_csum_replace(skb, sum_off, 0, diff, 0) ||
		    bpf_skb_store_bytes(skb, ETH_HLEN + OFF(struct ipv6hdr, daddr), nv.dst, 16, 0) ||
		    bpf_skb_store_bytes(skb, in_off + OFF(struct ipv6hdr, saddr), nv.dst, 16, 0) ||
		    bpf_skb_store_bytes(skb, in_off + OFF(struct ipv6hdr, daddr), nv.src, 16, 0))
			return TC_ACT_SHOT;
	}
	if (bpf_l3_csum_replace(skb, sum_off, ports[0], new_ports[0], 2) ||
	    bpf_l3_csum_replace(skb, sum_off, ports[1], new_ports[1], 2) ||
	    bpf_skb_store_bytes(skb, in_l4, new_ports, 4, 0))
		return TC_ACT_SHOT;
	__builtin_memcpy(f->dst, nv.dst, 16);
	return forward(skb, f, f->dst);
}

/* ICMP errors hm_reply sends to the network are limited as the kernel
 * limits its own (net.ipv4.icmp_msgs_per_sec and icmp_msgs_burst, whose
 * defaults these are): a flood of datagrams to a node port nobody serves,
 * from forged sources, must not be reflected at line rate. One budget for
 * the host, kept as the time the next error is due (GCRA: an error may go
 * while that time is at most a burst ahead of now). Updates from several
 * CPUs may race; the limit is then a few errors looser. It lives in the
 * object's .bss: a restart starts with a full burst. The veth path's
 * refusals go to the host's own clients and are not limited (the kernel
 * does not limit errors to itself either); nor are TCP resets (nor are the
 * kernel's, for a port nothing listens on). */
#define HM_ICMP_INTERVAL_NS (NS_PER_S / 1000)
#define HM_ICMP_BURST_NS (50 * HM_ICMP_INTERVAL_NS)

__u64 hm_icmp_due_ns = 0;

static __always_inline int icmp_allowed(void)
{
	__u64 now = hm_now(), due = hm_icmp_due_ns;

	if (hm_idle_ns(now, due) > 0)
		due = now;
	if (due - now > HM_ICMP_BURST_NS - HM_ICMP_INTERVAL_NS)
		return 0;
	hm_icmp_due_ns = due + HM_ICMP_INTERVAL_NS;
	return 1;
}

/* No backend can take a new flow from the network (refuse, as a
 * subprogram of its own): a RST, or an ICMP error within the budget. */
static __attribute__((noinline)) int refuse_flow(struct __sk_buff *skb, const struct flow *f)
{
	if (f->proto == IPPROTO_UDP && !icmp_allowed())
		return TC_ACT_SHOT;
	return refuse(skb, f);
}

/* A packet that may be of a flow from the network: one known (the
 * client's next packet, or another host's backend's reply), or the first
 * of a new one, balanced and recorded; anything else passes. At a host
 * interface's ingress (`replies`), a packet of no flow from the network
 * may be a reply of the veth path's, which is looked for next: HM_NAT
 * first, because on a host that serves the network most packets at its
 * interfaces are of its flows, and one lookup finds them (the veth path's
 * reverse entry, asked first, missed in one or two maps for each). The
 * two never hold one tuple: snat_port skips a port a veth-path flow to
 * the backend holds, and hm_natout forgets a flow from the network whose
 * port a host connection through the veth path takes. Also a host process's packets to
 * its own node port, at lo's egress (the turnaround), which go as a
 * client's on another machine would. */
static __attribute__((noinline)) int external_flow(struct __sk_buff *skb, struct flow *f, int replies)
{
	struct hm_nat_value fv = {}, rv = {};
	int verdict = external_in(skb, f, &fv);

	if (verdict == NEW_FLOW || verdict == NOT_MINE) {
		/* A TCP SYN answers nothing: it is no veth-path reply. */
		int reply = replies && !(f->proto == IPPROTO_TCP && (f->tcp_flags & (TCP_SYN | TCP_ACK)) == TCP_SYN)
				    ? veth_reply(skb, f)
				    : NOT_MINE;

		if (reply != NOT_MINE)
			return reply;
		if (verdict == NOT_MINE)
			return TC_ACT_UNSPEC;
		__builtin_memset(&fv, 0, sizeof(fv));
		verdict = nat_new(skb, f, &fv, &rv);
		/* Another host's backend: a source port, or no flow. */
		if (verdict == 0 && (fv.flags & HM_NAT_F_SNAT) && !snat_port(skb, &fv, &rv, f, flow_hash(f)))
			verdict = TC_ACT_SHOT;
		if (verdict == 0) {
			nat_find_hop(skb, &fv, f->proto, f->v6, fv.last_seen_ns);
			verdict = nat_record(skb, f, &fv, &rv);
		}
	}
	if (verdict == REFUSE)
		return refuse_flow(skb, f);
	if (verdict != 0)
		return verdict;
	return nat_send(skb, f, &fv);
}

/* TC ingress on host interfaces and lo: replies from backends get their
 * VIP back as the source, ICMP errors about their flows the VIP as the
 * quoted destination; then flows from the network (node ports, external
 * VIPs) are balanced and translated (external_in, nat_new, nat_record,
 * nat_send above). Everything else passes untouched.
 *
 * Only replies of a flow hostmesh translated, and that is not over: the
 * host may talk to a backend straight, from an address and port a VIP
 * flow used before (clients cycle through the whole port range), and the
 * replies of that connection must reach it untouched. So a flow that has
 * expired, or a SYN-ACK for a flow that is closed (the veth path starts a
 * new flow for every SYN after a close, so that SYN did not go to the
 * VIP), is forgotten instead of used; and hm_direct below forgets the
 * flow of a tuple the moment the host sends to the backend straight.
 *
 * These are other tools' interfaces too: every packet goes on with
 * TC_ACT_UNSPEC ("next"), so TC programs and filters after hostmesh's
 * still see it (TC_ACT_OK would end classification there). A translated
 * reply no longer matches any reverse entry, so a second copy of this
 * program (while a hook moves between TCX and clsact) leaves it alone. */
SEC("classifier")
int hm_reply(struct __sk_buff *skb)
{
	HM_BUILD_MARK();
	struct flow f = {};
	int verdict;

	switch (parse(skb, &f)) {
	case PARSED:
		break;
	case OTHER_IP:
		icmp_error_back(skb, &f);
		return external_enabled(hm_config()) ? external_icmp(skb, &f) : TC_ACT_UNSPEC;
	default:
		return TC_ACT_UNSPEC;
	}
	/* lo carries the host's own packets, which the network's flows never
	 * are (a host process's to its own node port are taken at lo's
	 * egress, hm_direct). */
	if (skb->ifindex == HM_LOOPBACK_IFINDEX || !external_enabled(hm_config())) {
		verdict = veth_reply(skb, &f);
		return verdict == NOT_MINE ? TC_ACT_UNSPEC : verdict;
	}
	return external_flow(skb, &f, 1);
}

/* TC egress on host interfaces and lo: replies of backends on this host
 * to clients of flows from the network get their VIP or node port back
 * (external_out); at lo's, a host process's packets to its own node port
 * are balanced as a client's on another machine (external_flow: a
 * backend on another host sees this host's address towards it, and its
 * replies reach the process through lo, nat_send). And the host sends straight to a
 * backend (a TCP SYN or a UDP datagram that did not come through the veth)
 * from a client address and port a VIP flow to that backend used. That
 * VIP flow is over — the backend could not tell two flows with one tuple
 * apart — so its entries go, and hm_reply leaves the new flow's replies
 * alone. Packets the veth path translated carry the note (noted()) or
 * were received on hm-natout (ingress_ifindex); only the host's own
 * (ingress_ifindex 0) count. */
/* The host's own first packet to a backend (hm_direct): a VIP flow of
 * the same tuple is over. A subprogram of its own, so hm_direct's frame
 * stays small beside external_flow's chain. */
static __attribute__((noinline)) void direct_forget(struct __sk_buff *skb, const struct flow *f)
{
	struct hm_ct_key rk = {}, fk = {};
	struct hm_ct_value *rev;
	int closed;

	external_yield(skb, f);
	ct_key(&rk, f->dst, f->src, f->dport, f->sport, f->proto, HM_CT_REVERSE);
	rev = ct_find(&rk, &closed);
	if (!rev)
		return;
	ct_key(&fk, f->src, rev->nat_addr, f->sport, rev->nat_port, f->proto, HM_CT_FORWARD);
	ct_forget(&fk, &rk, closed);
}

SEC("classifier")
int hm_direct(struct __sk_buff *skb)
{
	HM_BUILD_MARK();
	struct flow f = {};
	int external;
	int verdict;

	/* Translated and sent here by hm_natin, hm_natout or hm_reply (noted()). */
	if (skb->cb[0] == HM_CB_SENT0 && skb->cb[1] == HM_CB_SENT1) {
		skb->cb[0] = 0;
		skb->cb[1] = 0;
		return TC_ACT_UNSPEC;
	}
	if (parse(skb, &f) != PARSED)
		return TC_ACT_UNSPEC;
	external = external_enabled(hm_config());
	if (external && external_out(skb, &f, &verdict))
		return verdict;
	if (skb->ingress_ifindex != 0)
		return TC_ACT_UNSPEC;
	/* The turnaround: a process of this host sends to one of its own
	 * addresses (HM_HOST_ADDRS: only while a node port exists) on a node
	 * port, a protocol connect-time LB did not take at connect(). */
	if (external && skb->ifindex == HM_LOOPBACK_IFINDEX && to_this_host(&f)) {
		verdict = external_flow(skb, &f, 0);
		if (verdict != TC_ACT_UNSPEC)
			return verdict;
	}
	if (f.proto == IPPROTO_TCP && (f.tcp_flags & (TCP_SYN | TCP_ACK)) != TCP_SYN)
		return TC_ACT_UNSPEC;
	direct_forget(skb, &f);
	return TC_ACT_UNSPEC;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
