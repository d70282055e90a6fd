/* SPDX-License-Identifier: Apache-2.0 OR GPL-2.0 */
/*
 * Parsing a packet that starts with an Ethernet header (TC on a veth, a
 * host interface, lo, or a VXLAN device after decapsulation): addresses
 * as 16 bytes (IPv4-mapped), protocol, ports, TCP flags and offsets.
 */
#ifndef HOSTMESH_PACKET_H
#define HOSTMESH_PACKET_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define ETH_HLEN 14
#define NS_PER_S 1000000000ULL
#define OFF(type, field) __builtin_offsetof(type, field)

#define TCP_FIN 0x01
#define TCP_SYN 0x02
#define TCP_RST 0x04
#define TCP_ACK 0x10

static __always_inline void hm_v4_mapped(__u8 addr[16], __be32 v4)
{
	__builtin_memset(addr, 0, 10);
	addr[10] = 0xff;
	addr[11] = 0xff;
	__builtin_memcpy(&addr[12], &v4, 4);
}

/* An IPv6 address read from a BPF context's four 32-bit words (contexts
 * allow only word-sized loads of them: `user_ip6`, `src_ip6`, `dst_ip6`,
 * `local_ip6`). */
static __always_inline void hm_v6_words(__u8 addr[16], __u32 w0, __u32 w1, __u32 w2, __u32 w3)
{
	__u32 w[4] = { w0, w1, w2, w3 };

	__builtin_memcpy(addr, w, 16);
}

/* Is a 16-byte address IPv4-mapped? */
static __always_inline int hm_is_v4(const __u8 a[16])
{
	__u64 hi;
	__u32 mid;

	__builtin_memcpy(&hi, a, 8);
	__builtin_memcpy(&mid, a + 8, 4);
	return hi == 0 && mid == bpf_htonl(0xffff);
}

/* memcmp is a library call BPF does not have: compare two 64-bit halves. */
static __always_inline int hm_same_addr(const __u8 a[16], const __u8 b[16])
{
	__u64 x[2], y[2];

	__builtin_memcpy(x, a, 16);
	__builtin_memcpy(y, b, 16);
	return x[0] == y[0] && x[1] == y[1];
}

/* What hostmesh needs to know about a packet. */
struct flow {
	/* 8-aligned: copies and compares of the addresses take two 64-bit
	 * words, not 16 bytes one by one (and their spills). */
	__u8 src[16] __attribute__((aligned(8)));
	__u8 dst[16] __attribute__((aligned(8)));
	__be16 sport;
	__be16 dport;
	__u8 v6;
	__u8 proto;
	__u8 tcp_flags;
	__u8 tcp_doff;   /* TCP header length, in bytes */
	__u16 l4_off;
	__u16 l4_len;    /* L4 header + payload */
};

enum parsed { PARSED, NOT_IP, OTHER_IP };

static __always_inline int parse_l4(void *l4, void *end, struct flow *f)
{
	if (f->proto == IPPROTO_TCP) {
		struct tcphdr *tcp = l4;

		if ((void *)(tcp + 1) > end)
			return OTHER_IP;
		f->sport = tcp->source;
		f->dport = tcp->dest;
		f->tcp_flags = ((__u8 *)tcp)[13];
		f->tcp_doff = tcp->doff * 4;
		return PARSED;
	}
	if (f->proto == IPPROTO_UDP) {
		struct udphdr *udp = l4;

		if ((void *)(udp + 1) > end)
			return OTHER_IP;
		f->sport = udp->source;
		f->dport = udp->dest;
		return PARSED;
	}
	return OTHER_IP;
}

static __always_inline int parse(struct __sk_buff *skb, struct flow *f)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > end)
		return NOT_IP;

	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);
		__u32 hlen;

		if ((void *)(ip + 1) > end || ip->ihl < 5)
			return OTHER_IP;
		/* Fragments carry no (or not all) ports. */
		if (ip->frag_off & bpf_htons(0x3fff))
			return OTHER_IP;
		hlen = ip->ihl * 4;
		hm_v4_mapped(f->src, ip->saddr);
		hm_v4_mapped(f->dst, ip->daddr);
		f->proto = ip->protocol;
		f->l4_off = ETH_HLEN + hlen;
		f->l4_len = bpf_ntohs(ip->tot_len) - hlen;
		return parse_l4((void *)ip + hlen, end, f);
	}
	if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > end)
			return OTHER_IP;
		__builtin_memcpy(f->src, &ip6->saddr, 16);
		__builtin_memcpy(f->dst, &ip6->daddr, 16);
		f->v6 = 1;
		f->proto = ip6->nexthdr;
		f->l4_off = ETH_HLEN + sizeof(*ip6);
		f->l4_len = bpf_ntohs(ip6->payload_len);
		return parse_l4(ip6 + 1, end, f);
	}
	return NOT_IP;
}

#endif /* HOSTMESH_PACKET_H */
