// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0
/*
 * The daemon's network namespace cookie, on kernels without
 * SO_NETNS_COOKIE (before 5.14): attached for a moment to the daemon's own
 * cgroup, this records bpf_get_netns_cookie() under the socket's cookie
 * when a socket connects to 127.0.0.1:9 over UDP (which sends nothing).
 * The daemon connects such a socket, reads its entry and detaches the
 * program (backends/bpf/netns_cookie.rs). Every other connect() passes
 * untouched.
 */
#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "hostmesh_abi.h"

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 64);
	__type(key, __u64);   /* the socket's cookie */
	__type(value, __u64); /* its network namespace's cookie */
} HM_NETNS_COOKIE SEC(".maps");

SEC("cgroup/connect4")
int hm_netns_cookie(struct bpf_sock_addr *ctx)
{
	__u64 sk, ns;

	if (ctx->protocol != IPPROTO_UDP || ctx->user_ip4 != bpf_htonl(HM_NETNS_COOKIE_ADDR) ||
	    ctx->user_port != bpf_htons(HM_NETNS_COOKIE_PORT))
		return 1;
	sk = bpf_get_socket_cookie(ctx);
	ns = bpf_get_netns_cookie(ctx);
	bpf_map_update_elem(&HM_NETNS_COOKIE, &sk, &ns, BPF_ANY);
	return 1;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
