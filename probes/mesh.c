// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0
/*
 * Mesh redirects (README.md, "Mesh redirects"): an sk_lookup program on the
 * daemon's network namespace hands connections (and datagrams) for a
 * VIP:port to the local sidecar's listener, with no NAT and no conntrack:
 * the sidecar's socket sees the VIP:port as its local address.
 *
 * The VIP has a `local` route, so the kernel delivers it locally and runs
 * this program at socket lookup. The sidecar's listener comes from
 * HM_MESH_SOCKETS, which the daemon fills (bpf_sk_lookup_tcp is not
 * allowed in sk_lookup programs). Every miss or error returns SK_PASS:
 * this program never drops traffic. With no sidecar registered, the normal
 * lookup finds nothing on the VIP and the connection is refused at once.
 */
#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "build_mark.h"
#include "hostmesh_abi.h"
#include "packet.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, HM_MESH_MAP_SIZE);
	__type(key, struct hm_mesh_key);
	__type(value, struct hm_mesh_value);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} HM_MESH SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, HM_MESH_MAP_SIZE);
	__type(key, struct hm_sock_key);
	__type(value, __u64);
} HM_MESH_SOCKETS SEC(".maps");

SEC("sk_lookup")
int hm_mesh(struct bpf_sk_lookup *ctx)
{
	HM_BUILD_MARK();
	struct hm_mesh_key key = {};
	struct hm_sock_key sk_key = {};
	struct hm_mesh_value *v;
	struct bpf_sock *sk;

	if (ctx->protocol != IPPROTO_TCP && ctx->protocol != IPPROTO_UDP)
		return SK_PASS;
	if (ctx->family == HM_AF_INET) {
		__u32 ip = ctx->local_ip4;

		key.addr[10] = 0xff;
		key.addr[11] = 0xff;
		__builtin_memcpy(&key.addr[12], &ip, 4);
	} else if (ctx->family == HM_AF_INET6) {
		hm_v6_words(key.addr, ctx->local_ip6[0], ctx->local_ip6[1], ctx->local_ip6[2], ctx->local_ip6[3]);
	} else {
		return SK_PASS;
	}
	key.proto = ctx->protocol;
	key.port = bpf_htons(ctx->local_port);

	v = bpf_map_lookup_elem(&HM_MESH, &key);
	if (!v) {
		key.port = 0; /* every port of the VIP */
		v = bpf_map_lookup_elem(&HM_MESH, &key);
		if (!v)
			return SK_PASS;
	}

	sk_key.port = v->redirect_port;
	sk_key.family = ctx->family;
	sk_key.proto = ctx->protocol;
	sk = bpf_map_lookup_elem(&HM_MESH_SOCKETS, &sk_key);
	if (!sk)
		return SK_PASS;
	bpf_sk_assign(ctx, sk, BPF_SK_LOOKUP_F_REPLACE);
	bpf_sk_release(sk);
	return SK_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
