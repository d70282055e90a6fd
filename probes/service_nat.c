// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0
/*
 * Service NAT on the bpfnat veth (DESIGN.md, Service IPs).
 *
 * Every VIP has a host route via hm-natin, so host-originated packets to a
 * VIP leave through hm-natin and arrive here, on hm-natout's TC ingress.
 * This program recognises them by (VIP, port, protocol) and accounts them
 * per service.
 *
 * A packet to a VIP must never be handed back to the stack here: the
 * stack would route it into hm-natin again and it would loop until its TTL
 * ran out. Until a backend is chosen it is therefore dropped; everything
 * that is not a service packet (neighbour discovery, say) passes untouched.
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

#include "hostmesh_abi.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, HM_MAX_SERVICES);
	__type(key, struct hm_svc_key);
	__type(value, struct hm_svc_value);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} HM_SERVICES SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, HM_MAX_SERVICES);
	__type(key, __u32);
	__type(value, struct hm_svc_stats);
} HM_SVC_STATS SEC(".maps");

/* Fill key with the packet's destination (address, port, protocol).
 * Returns 0 on success, -1 for anything that is not TCP/UDP over IP. */
static __always_inline int parse_dst(struct __sk_buff *skb, struct hm_svc_key *key)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	void *l4;
	__u8 proto;

	if ((void *)(eth + 1) > end)
		return -1;

	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);

		if ((void *)(ip + 1) > end || ip->ihl < 5)
			return -1;
		/* Fragments after the first carry no ports. */
		if (ip->frag_off & bpf_htons(0x1fff))
			return -1;
		key->addr[10] = 0xff;
		key->addr[11] = 0xff;
		__builtin_memcpy(&key->addr[12], &ip->daddr, 4);
		proto = ip->protocol;
		l4 = (void *)ip + ip->ihl * 4;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > end)
			return -1;
		__builtin_memcpy(key->addr, &ip6->daddr, 16);
		proto = ip6->nexthdr;
		l4 = ip6 + 1;
	} else {
		return -1;
	}

	if (proto == IPPROTO_TCP) {
		struct tcphdr *tcp = l4;

		if ((void *)(tcp + 1) > end)
			return -1;
		key->port = tcp->dest;
	} else if (proto == IPPROTO_UDP) {
		struct udphdr *udp = l4;

		if ((void *)(udp + 1) > end)
			return -1;
		key->port = udp->dest;
	} else {
		return -1;
	}
	key->proto = proto;
	return 0;
}

SEC("classifier")
int hm_natout(struct __sk_buff *skb)
{
	struct hm_svc_key key = {};
	struct hm_svc_value *svc;
	struct hm_svc_stats *stats;

	if (parse_dst(skb, &key) < 0)
		return TC_ACT_OK;

	svc = bpf_map_lookup_elem(&HM_SERVICES, &key);
	if (!svc)
		return TC_ACT_OK;

	stats = bpf_map_lookup_elem(&HM_SVC_STATS, &svc->id);
	if (stats) {
		stats->packets++;
		stats->bytes += skb->len;
	}
	return TC_ACT_SHOT;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
