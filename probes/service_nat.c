// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0
/*
 * Service NAT on the bpfnat veth (README.md, "Service IPs").
 *
 * Every VIP has a host route via hm-natin, so host-originated packets to a
 * VIP leave through hm-natin and arrive at hm-natout's TC ingress, where
 * hm_natout picks a backend (Maglev, on the flow's hash), records the flow
 * in HM_CT, rewrites the destination and forwards the packet straight out
 * of the right interface (FIB lookup + redirect), or lets the stack deliver
 * it when the backend is a local address. Replies come back on a host
 * interface (or lo, for local backends), where hm_reply restores the VIP
 * as the source.
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
#include "conntrack.h"
#include "packet.h"
#include "service_maps.h"

/* Rewrites the source or destination address and port, fixing checksums. */
static __always_inline int rewrite(struct __sk_buff *skb, const struct flow *f, int dst, const __u8 addr[16], __be16 port)
{
	__u32 csum_off = f->l4_off + (f->proto == IPPROTO_TCP ? OFF(struct tcphdr, check) : OFF(struct udphdr, check));
	__u64 mangled = f->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
	__be16 old_port = dst ? f->dport : f->sport;
	const __u8 *old = dst ? f->dst : f->src;

	if (!f->v6) {
		__u32 ip_off = ETH_HLEN + (dst ? OFF(struct iphdr, daddr) : OFF(struct iphdr, saddr));
		__be32 from, to;

		__builtin_memcpy(&from, old + 12, 4);
		__builtin_memcpy(&to, addr + 12, 4);
		if (bpf_l4_csum_replace(skb, csum_off, from, to, BPF_F_PSEUDO_HDR | mangled | 4))
			return -1;
		if (bpf_l3_csum_replace(skb, ETH_HLEN + OFF(struct iphdr, check), from, to, 4))
			return -1;
		if (bpf_skb_store_bytes(skb, ip_off, &to, 4, 0))
			return -1;
	} else {
		__u32 ip_off = ETH_HLEN + (dst ? OFF(struct ipv6hdr, daddr) : OFF(struct ipv6hdr, saddr));
		__be32 from[4], to[4];
		__s64 diff;

		__builtin_memcpy(from, old, 16);
		__builtin_memcpy(to, addr, 16);
		diff = bpf_csum_diff(from, 16, to, 16, 0);
		if (bpf_l4_csum_replace(skb, csum_off, 0, diff, BPF_F_PSEUDO_HDR | mangled))
			return -1;
		if (bpf_skb_store_bytes(skb, ip_off, to, 16, 0))
			return -1;
	}
	if (old_port != port) {
		__u32 port_off = f->l4_off + (dst ? OFF(struct tcphdr, dest) : OFF(struct tcphdr, source));

		if (bpf_l4_csum_replace(skb, csum_off, old_port, port, mangled | 2))
			return -1;
		if (bpf_skb_store_bytes(skb, port_off, &port, 2, 0))
			return -1;
	}
	return 0;
}

/* Sends a (NATed) packet on towards `dst`: out of the interface the FIB
 * picks, or up the stack when `dst` is a local address. */
static __always_inline int forward(struct __sk_buff *skb, const struct flow *f, const __u8 dst[16])
{
	struct bpf_fib_lookup fib = {};
	int rc;

	fib.ifindex = skb->ifindex;
	fib.l4_protocol = f->proto;
	/* tot_len 0: let the kernel check the MTU, GSO packets included. */
	fib.tot_len = 0;
	if (!f->v6) {
		fib.family = HM_AF_INET;
		__builtin_memcpy(&fib.ipv4_src, f->src + 12, 4);
		__builtin_memcpy(&fib.ipv4_dst, dst + 12, 4);
	} else {
		fib.family = HM_AF_INET6;
		__builtin_memcpy(fib.ipv6_src, f->src, 16);
		__builtin_memcpy(fib.ipv6_dst, dst, 16);
	}
	rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	switch (rc) {
	case BPF_FIB_LKUP_RET_SUCCESS:
		if (bpf_skb_store_bytes(skb, OFF(struct ethhdr, h_dest), fib.dmac, ETH_ALEN, 0) ||
		    bpf_skb_store_bytes(skb, OFF(struct ethhdr, h_source), fib.smac, ETH_ALEN, 0))
			return TC_ACT_SHOT;
		return bpf_redirect(fib.ifindex, 0);
	case BPF_FIB_LKUP_RET_NO_NEIGH:
		return bpf_redirect_neigh(fib.ifindex, NULL, 0, 0);
	case BPF_FIB_LKUP_RET_NOT_FWDED:
		/* A local address: the stack delivers it (accept_local=1). */
		return TC_ACT_OK;
	default:
		return TC_ACT_SHOT;
	}
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

static __always_inline __u16 csum_fold(__s64 sum)
{
	__u32 s = (__u32)sum;

	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)~s;
}

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

SEC("classifier")
int hm_natout(struct __sk_buff *skb)
{
	HM_BUILD_MARK();
	struct flow f = {};
	struct hm_ct_key fk = {};
	struct hm_ct_value *ct;
	struct hm_config *cfg = hm_config();
	__u8 backend[16];
	__be16 backend_port;
	__u64 now = bpf_ktime_get_ns();
	int parsed = parse(skb, &f);
	int closed;

	if (parsed == NOT_IP)
		return TC_ACT_OK;
	if (parsed == OTHER_IP)
		/* Neighbour discovery on the veth itself is fine; anything else
		 * here came through a VIP route and would loop. */
		return (f.v6 && f.proto == IPPROTO_ICMPV6) ? TC_ACT_OK : TC_ACT_SHOT;

	ct_key(&fk, f.src, f.dst, f.sport, f.dport, f.proto, HM_CT_FORWARD);
	ct = ct_find(&fk, &closed);
	/* A SYN after a flow closed starts a new flow on its tuple. */
	if (ct && ct_live(ct, f.proto, now, cfg) && !(closed && (f.tcp_flags & TCP_SYN))) {
		__builtin_memcpy(backend, ct->nat_addr, 16);
		backend_port = ct->nat_port;
		hm_count(ct->svc_id, skb->len);
		hm_count_backend(ct->svc_id, backend, backend_port, HM_STAT_NONE, skb->len, 0);
		if (closed) {
			ct->last_seen_ns = now;
		} else {
			struct hm_ct_key rk = {};

			ct_key(&rk, backend, f.src, backend_port, f.sport, f.proto, HM_CT_REVERSE);
			ct_seen(&fk, ct, &rk, bpf_map_lookup_elem(&HM_CT, &rk), ct_end(&f, HM_CT_F_FIN_OUT), now);
		}
	} else {
		struct hm_svc_key sk = {};
		struct hm_svc_value *svc;
		struct hm_backend *be;
		struct hm_ct_value fv = {}, rv = {};
		struct hm_ct_key rk = {};

		__builtin_memcpy(sk.addr, f.dst, 16);
		sk.port = f.dport;
		sk.proto = f.proto;
		svc = bpf_map_lookup_elem(&HM_SERVICES, &sk);
		if (!svc)
			return refuse(skb, &f);
		hm_count(svc->id, skb->len);
		if (svc->backend_count == 0)
			return refuse(skb, &f);
		/* The 5-tuple's hash: a flow whose entry was lost (evicted,
		 * expired) gets the same backend again while the table is
		 * unchanged, and `hostmesh explain --from` can say which. */
		be = hm_pick_backend(svc, f.src, hm_flow_hash(f.src, f.dst, f.sport, f.dport, f.proto));
		if (!be)
			return refuse(skb, &f);
		__builtin_memcpy(backend, be->addr, 16);
		backend_port = be->port;

		__builtin_memcpy(fv.nat_addr, backend, 16);
		fv.nat_port = backend_port;
		fv.svc_id = svc->id;
		fv.flags = ct_end(&f, HM_CT_F_FIN_OUT);
		fv.last_seen_ns = now;
		__builtin_memcpy(rv.nat_addr, f.dst, 16);
		rv.nat_port = f.dport;
		rv.svc_id = svc->id;
		rv.flags = fv.flags;
		rv.last_seen_ns = now;
		ct_key(&rk, backend, f.src, backend_port, f.sport, f.proto, HM_CT_REVERSE);
		/* A RST ends what it belongs to: it goes on, remembered by no one. */
		if (!(fv.flags & HM_CT_F_RESET) &&
		    (bpf_map_update_elem(&HM_CT, &rk, &rv, BPF_ANY) || bpf_map_update_elem(&HM_CT, &fk, &fv, BPF_ANY)))
			return TC_ACT_SHOT;
		hm_count_backend(svc->id, backend, backend_port, HM_STAT_VETH, skb->len, 0);
	}

	if (rewrite(skb, &f, 1, backend, backend_port))
		return TC_ACT_SHOT;
	return forward(skb, &f, backend);
}

/* A SYN-ACK: the answer to a SYN. */
static __always_inline int syn_ack(const struct flow *f)
{
	return f->proto == IPPROTO_TCP && (f->tcp_flags & (TCP_SYN | TCP_ACK)) == (TCP_SYN | TCP_ACK);
}

/* An ICMP error about a flow hm_natout translated (fragmentation needed,
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
static __always_inline void icmp_error_back(struct __sk_buff *skb, const struct flow *f)
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

/* TC ingress on host interfaces and lo: replies from backends get their
 * VIP back as the source, ICMP errors about their flows the VIP as the
 * quoted destination. Everything else passes untouched.
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
	struct hm_ct_key rk = {}, fk = {};
	struct hm_ct_value *rev, *fwd, *state;
	__u8 vip[16];
	__be16 vport;
	__u32 svc_id;
	__u64 now;
	int closed;

	switch (parse(skb, &f)) {
	case PARSED:
		break;
	case OTHER_IP:
		icmp_error_back(skb, &f);
		return TC_ACT_UNSPEC;
	default:
		return TC_ACT_UNSPEC;
	}
	ct_key(&rk, f.src, f.dst, f.sport, f.dport, f.proto, HM_CT_REVERSE);
	rev = ct_find(&rk, &closed);
	if (!rev)
		return TC_ACT_UNSPEC;
	__builtin_memcpy(vip, rev->nat_addr, 16);
	vport = rev->nat_port;
	svc_id = rev->svc_id;
	ct_key(&fk, f.dst, vip, f.dport, vport, f.proto, HM_CT_FORWARD);
	fwd = ct_peer(&fk, closed);

	/* The forward entry's state decides whether the flow is live (the
	 * reverse one's, should the forward one be gone). */
	state = fwd ? fwd : rev;
	now = bpf_ktime_get_ns();
	if (!ct_live(state, f.proto, now, hm_config()) || (syn_ack(&f) && (closed || (state->flags & HM_CT_F_CLOSING)))) {
		ct_forget(&fk, &rk, closed);
		return TC_ACT_UNSPEC;
	}
	if (closed) {
		rev->last_seen_ns = now;
		if (fwd)
			fwd->last_seen_ns = now;
	} else {
		ct_seen(&fk, fwd, &rk, rev, HM_CT_F_REPLIED | ct_end(&f, HM_CT_F_FIN_BACK), now);
	}

	hm_count_backend(svc_id, f.src, f.sport, HM_STAT_NONE, 0, skb->len);
	if (rewrite(skb, &f, 0, vip, vport))
		return TC_ACT_SHOT;
	return TC_ACT_UNSPEC;
}

/* TC egress on host interfaces and lo: the host sends straight to a
 * backend (a TCP SYN or a UDP datagram that did not come through the veth)
 * from a client address and port a VIP flow to that backend used. That
 * VIP flow is over — the backend could not tell two flows with one tuple
 * apart — so its entries go, and hm_reply leaves the new flow's replies
 * alone. Packets the veth path translated were received on hm-natout
 * (ingress_ifindex); only the host's own (ingress_ifindex 0) count. */
SEC("classifier")
int hm_direct(struct __sk_buff *skb)
{
	HM_BUILD_MARK();
	struct flow f = {};
	struct hm_ct_key rk = {}, fk = {};
	struct hm_ct_value *rev;
	int closed;

	if (skb->ingress_ifindex != 0 || parse(skb, &f) != PARSED)
		return TC_ACT_UNSPEC;
	if (f.proto == IPPROTO_TCP && (f.tcp_flags & (TCP_SYN | TCP_ACK)) != TCP_SYN)
		return TC_ACT_UNSPEC;
	ct_key(&rk, f.dst, f.src, f.dport, f.sport, f.proto, HM_CT_REVERSE);
	rev = ct_find(&rk, &closed);
	if (!rev)
		return TC_ACT_UNSPEC;
	ct_key(&fk, f.src, rev->nat_addr, f.sport, rev->nat_port, f.proto, HM_CT_FORWARD);
	ct_forget(&fk, &rk, closed);
	return TC_ACT_UNSPEC;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
