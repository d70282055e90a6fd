/* SPDX-License-Identifier: Apache-2.0 OR GPL-2.0 */
/*
 * Never loaded. Compiled so that every HM_ constant of hostmesh_abi.h is
 * in BTF, where the daemon's ABI test (daemon/src/abi/layout_tests.rs)
 * compares it with the Rust mirror: a #define leaves no trace in an
 * object, an enum constant does. Each entry is ABI_<the #define>; the
 * test fails when the header has a constant this list lacks.
 */
#include "hostmesh_abi.h"

enum hm_abi_constants {
	ABI_HM_MAX_SERVICES = HM_MAX_SERVICES,
	ABI_HM_MAX_BACKENDS = HM_MAX_BACKENDS,
	ABI_HM_MAX_MAGLEV_CHUNKS = HM_MAX_MAGLEV_CHUNKS,
	ABI_HM_MAX_CONNTRACK = HM_MAX_CONNTRACK,
	ABI_HM_MAX_REVERSE_SOCK = HM_MAX_REVERSE_SOCK,
	ABI_HM_MAGLEV_CHUNK = HM_MAGLEV_CHUNK,
	ABI_HM_CFG_CTLB_TCP = HM_CFG_CTLB_TCP,
	ABI_HM_CFG_CTLB_UDP = HM_CFG_CTLB_UDP,
	ABI_HM_CT_SYN_TIMEOUT_S = HM_CT_SYN_TIMEOUT_S,
	ABI_HM_CT_CLOSING_TIMEOUT_S = HM_CT_CLOSING_TIMEOUT_S,
	ABI_HM_SVC_F_MESH = HM_SVC_F_MESH,
	ABI_HM_CT_FORWARD = HM_CT_FORWARD,
	ABI_HM_CT_REVERSE = HM_CT_REVERSE,
	ABI_HM_CT_F_REPLIED = HM_CT_F_REPLIED,
	ABI_HM_CT_F_CLOSING = HM_CT_F_CLOSING,
	ABI_HM_CT_F_FIN_OUT = HM_CT_F_FIN_OUT,
	ABI_HM_CT_F_FIN_BACK = HM_CT_F_FIN_BACK,
	ABI_HM_CT_F_RESET = HM_CT_F_RESET,
	ABI_HM_AF_INET = HM_AF_INET,
	ABI_HM_AF_INET6 = HM_AF_INET6,
	ABI_HM_MESH_MAP_SIZE = HM_MESH_MAP_SIZE,
	ABI_HM_MAX_GW_ROUTES = HM_MAX_GW_ROUTES,
	ABI_HM_MAX_GW_CONNTRACK = HM_MAX_GW_CONNTRACK,
	ABI_HM_ROLE_MEMBER = HM_ROLE_MEMBER,
	ABI_HM_ROLE_GATEWAY = HM_ROLE_GATEWAY,
	ABI_HM_EP_UP = HM_EP_UP,
	ABI_HM_NETNS_COOKIE_ADDR = HM_NETNS_COOKIE_ADDR,
	ABI_HM_NETNS_COOKIE_PORT = HM_NETNS_COOKIE_PORT,
};

/* A variable of the type makes clang emit the enum into BTF. */
enum hm_abi_constants hm_abi_constants;

