// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0
/*
 * Connect-time load balancing (README.md, "Service IPs"): cgroup sock_addr
 * programs rewrite a socket's destination from a VIP to a backend at
 * connect() (TCP, connected UDP) or sendmsg() (unconnected UDP), so every
 * packet goes straight to the backend with no NAT at all.
 *
 * - The backend is picked from the service's Maglev table by the socket's
 *   cookie: one socket sticks to one backend.
 * - What the socket asked for is remembered in HM_REVERSE_SOCK, so that
 *   getpeername() and recvmsg() show the VIP, not the backend; a
 *   connected socket's entry goes when the socket is closed.
 * - A VIP with no backends refuses at once: connect() fails with
 *   ECONNREFUSED (EPERM on kernels without bpf_set_retval()).
 * - The programs act only in the daemon's network namespace (netns
 *   cookie), so daemons in two namespaces never see each other's services,
 *   even when attached to the same cgroup; and only for the protocols the
 *   configured mode gives them (HM_CFG_CTLB_*).
 */
#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "build_mark.h"
#include "service_maps.h"

#define ECONNREFUSED 111

static __always_inline struct hm_config *ours(struct bpf_sock_addr *ctx)
{
	struct hm_config *cfg = hm_config();

	if (!cfg || !cfg->netns_cookie || bpf_get_netns_cookie(ctx) != cfg->netns_cookie)
		return NULL;
	return cfg;
}

static __always_inline void read_addr(struct bpf_sock_addr *ctx, int v6, __u8 addr[16])
{
	if (v6) {
		hm_v6_words(addr, ctx->user_ip6[0], ctx->user_ip6[1], ctx->user_ip6[2], ctx->user_ip6[3]);
	} else {
		hm_v4_mapped(addr, ctx->user_ip4);
	}
}

static __always_inline void write_addr(struct bpf_sock_addr *ctx, int v6, const __u8 addr[16], __be16 port)
{
	if (v6) {
		__u32 w[4];

		__builtin_memcpy(w, addr, 16);
		ctx->user_ip6[0] = w[0];
		ctx->user_ip6[1] = w[1];
		ctx->user_ip6[2] = w[2];
		ctx->user_ip6[3] = w[3];
	} else {
		__u32 v4;

		__builtin_memcpy(&v4, addr + 12, 4);
		ctx->user_ip4 = v4;
	}
	ctx->user_port = (__u32)port;
}

/* Returning 0 refuses the call with EPERM; bpf_set_retval() (5.18) makes
 * it the ECONNREFUSED a closed port gives. Built without it as
 * service_ctlb_eperm.o for older kernels (daemon/build.rs). */
static __always_inline int refuse(void)
{
#ifndef HM_NO_SET_RETVAL
	bpf_set_retval(-ECONNREFUSED);
#endif
	return 0;
}

/* The client, for affinity: the address the socket is bound to (all
 * zeros when unbound: then every such socket is "the host"). */
static __always_inline void bound_addr(struct bpf_sock_addr *ctx, int v6, __u8 addr[16])
{
	struct bpf_sock *sk = ctx->sk;

	__builtin_memset(addr, 0, 16);
	if (!sk)
		return;
	if (v6) {
		hm_v6_words(addr, sk->src_ip6[0], sk->src_ip6[1], sk->src_ip6[2], sk->src_ip6[3]);
	} else {
		hm_v4_mapped(addr, sk->src_ip4);
	}
}

/* A connection of this host to one of its own addresses on a node port
 * (the turnaround): the node port's entry, as a client on another machine
 * gets it (HM_HOST_ADDRS holds the host interfaces' addresses, where node
 * ports answer). NULL for anything else. */
static __always_inline struct hm_svc_value *own_node_port(const struct hm_svc_key *key, int v6)
{
	struct hm_svc_key nk = {};
	struct hm_addr a = {};

	__builtin_memcpy(a.addr, key->addr, 16);
	if (!bpf_map_lookup_elem(&HM_HOST_ADDRS, &a))
		return NULL;
	/* IPv4, or IPv4-mapped on an IPv6 socket: the IPv4 node port. */
	if (!v6 || (key->addr[10] == 0xff && key->addr[11] == 0xff)) {
		nk.addr[10] = 0xff;
		nk.addr[11] = 0xff;
	}
	nk.port = key->port;
	nk.proto = key->proto;
	nk.scope = HM_SVC_SCOPE_NETWORK;
	return bpf_map_lookup_elem(&HM_SERVICES, &nk);
}

/* connect() and sendmsg(): VIP -> backend. Returns 1 to let the call go
 * on, 0 to refuse it. */
static __always_inline int to_backend(struct bpf_sock_addr *ctx, int v6)
{
	struct hm_config *cfg = ours(ctx);
	struct hm_svc_key key = {};
	struct hm_revsk_key rk = {};
	struct hm_revsk_value rv = {}, *known;
	struct hm_svc_value *svc;
	struct hm_backend *be;
	__u8 client[16];
	__u32 proto, sport, hash;
	__u64 cookie;

	if (!cfg)
		return 1;
	proto = ctx->protocol;
	if (!((proto == IPPROTO_TCP && (cfg->flags & HM_CFG_CTLB_TCP)) ||
	      (proto == IPPROTO_UDP && (cfg->flags & HM_CFG_CTLB_UDP))))
		return 1;

	read_addr(ctx, v6, key.addr);
	key.port = (__be16)ctx->user_port;
	key.proto = proto;
	svc = bpf_map_lookup_elem(&HM_SERVICES, &key);
	if (!svc)
		svc = own_node_port(&key, v6);
	/* A mesh VIP:port belongs to its sidecar. */
	if (!svc || (svc->flags & HM_SVC_F_MESH))
		return 1;
	if (svc->backend_count == 0)
		return refuse();
	cookie = bpf_get_socket_cookie(ctx);
	bound_addr(ctx, v6, client);
	/* A socket bound to a source port has its 5-tuple now: it gets that
	 * tuple's backend, as the veth path would pick it (and as `hostmesh
	 * explain --from ADDR:PORT` predicts); any other socket a backend by
	 * its cookie, at random. */
	sport = ctx->sk ? ctx->sk->src_port : 0;
	if (sport)
		hash = hm_flow_hash(client, key.addr, bpf_htons((__u16)sport), key.port, (__u8)proto);
	else
		hash = hm_mix64(cookie);
	be = hm_pick_backend(svc, client, hash);
	if (!be)
		return refuse();

	rk.cookie = cookie;
	__builtin_memcpy(rk.addr, be->addr, 16);
	rk.port = be->port;
	/* Unconnected UDP comes here for every datagram: write the entry only
	 * when it is not already there (an LRU update costs far more than a
	 * lookup). */
	known = bpf_map_lookup_elem(&HM_REVERSE_SOCK, &rk);
	if (!known || known->port != key.port || !hm_same_addr(known->addr, key.addr)) {
		__builtin_memcpy(rv.addr, key.addr, 16);
		rv.port = key.port;
		bpf_map_update_elem(&HM_REVERSE_SOCK, &rk, &rv, BPF_ANY);
	}

	hm_count_backend(svc->id, be->addr, be->port, HM_STAT_CTLB, 0, 0);
	write_addr(ctx, v6, be->addr, be->port);
	return 1;
}

/* recvmsg() and getpeername(): backend -> the VIP the socket asked for. */
static __always_inline int to_vip(struct bpf_sock_addr *ctx, int v6)
{
	struct hm_revsk_key rk = {};
	struct hm_revsk_value *rv;

	if (!ours(ctx))
		return 1;
	rk.cookie = bpf_get_socket_cookie(ctx);
	read_addr(ctx, v6, rk.addr);
	rk.port = (__be16)ctx->user_port;
	rv = bpf_map_lookup_elem(&HM_REVERSE_SOCK, &rk);
	if (rv)
		write_addr(ctx, v6, rv->addr, rv->port);
	return 1;
}

SEC("cgroup/connect4")
int hm_connect4(struct bpf_sock_addr *ctx)
{
	HM_BUILD_MARK();
	return to_backend(ctx, 0);
}

SEC("cgroup/connect6")
int hm_connect6(struct bpf_sock_addr *ctx)
{
	HM_BUILD_MARK();
	return to_backend(ctx, 1);
}

SEC("cgroup/sendmsg4")
int hm_sendmsg4(struct bpf_sock_addr *ctx)
{
	HM_BUILD_MARK();
	return to_backend(ctx, 0);
}

SEC("cgroup/sendmsg6")
int hm_sendmsg6(struct bpf_sock_addr *ctx)
{
	HM_BUILD_MARK();
	return to_backend(ctx, 1);
}

SEC("cgroup/recvmsg4")
int hm_recvmsg4(struct bpf_sock_addr *ctx)
{
	HM_BUILD_MARK();
	return to_vip(ctx, 0);
}

SEC("cgroup/recvmsg6")
int hm_recvmsg6(struct bpf_sock_addr *ctx)
{
	HM_BUILD_MARK();
	return to_vip(ctx, 1);
}

SEC("cgroup/getpeername4")
int hm_getpeername4(struct bpf_sock_addr *ctx)
{
	HM_BUILD_MARK();
	return to_vip(ctx, 0);
}

SEC("cgroup/getpeername6")
int hm_getpeername6(struct bpf_sock_addr *ctx)
{
	HM_BUILD_MARK();
	return to_vip(ctx, 1);
}

/* close() of a socket (its last reference): a connected socket's entry
 * in HM_REVERSE_SOCK (TCP, connected UDP: keyed by its cookie and the
 * backend it is connected to) goes with it, so the map holds the sockets
 * that are open, and churn neither pushes out a live socket's entry (whose
 * getpeername() and recvmsg() would then show the backend) nor makes every
 * connect() evict one. An unconnected UDP socket's entries (one per backend
 * it sent to) are left to the LRU. */
SEC("cgroup/sock_release")
int hm_sock_release(struct bpf_sock *ctx)
{
	struct hm_config *cfg = hm_config();
	struct hm_revsk_key rk = {};

	HM_BUILD_MARK();
	if (!cfg || !cfg->netns_cookie || bpf_get_netns_cookie(ctx) != cfg->netns_cookie)
		return 1;
	if (ctx->protocol != IPPROTO_TCP && ctx->protocol != IPPROTO_UDP)
		return 1;
	rk.port = (__be16)ctx->dst_port;
	if (!rk.port)
		return 1;
	if (ctx->family == HM_AF_INET6) {
		hm_v6_words(rk.addr, ctx->dst_ip6[0], ctx->dst_ip6[1], ctx->dst_ip6[2], ctx->dst_ip6[3]);
	} else if (ctx->family == HM_AF_INET) {
		hm_v4_mapped(rk.addr, ctx->dst_ip4);
	} else {
		return 1;
	}
	rk.cookie = bpf_get_socket_cookie(ctx);
	bpf_map_delete_elem(&HM_REVERSE_SOCK, &rk);
	return 1;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
