/* SPDX-License-Identifier: Apache-2.0 OR GPL-2.0 */
/*
 * The ABI between hostmesh's probes and the daemon: map key/value layouts
 * and constants. daemon/src/abi/mod.rs mirrors every struct and every
 * HM_ constant here; its layout test reads the BTF of the compiled objects
 * and fails when a size, a field's offset or a constant differs. Every
 * struct has explicit padding fields: no byte of a key is left to the
 * compiler (the test checks that too).
 *
 * Addresses are always 16 bytes: IPv4 is stored IPv4-mapped (::ffff:a.b.c.d)
 * so one key type serves both families. Ports are in network byte order.
 */
#ifndef HOSTMESH_ABI_H
#define HOSTMESH_ABI_H

#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/pkt_cls.h>

/* Map capacities as compiled: the defaults. The daemon creates each map at
 * the size its [daemon] key sets (daemon/src/config/capacity.rs). */
#define HM_MAX_SERVICES 65536
#define HM_MAX_BACKENDS 65536
#define HM_MAX_MAGLEV_CHUNKS 1048576
#define HM_MAX_CONNTRACK 131072
#define HM_MAX_REVERSE_SOCK 131072
#define HM_MAX_AFFINITY 131072

/* A Maglev table is stored in chunks of this many slots. */
#define HM_MAGLEV_CHUNK 64

/* HM_CONFIG[0]: what the daemon tells every probe. */
struct hm_config {
	__u64 netns_cookie;        /* act only in the daemon's namespace */
	__u32 flags;               /* HM_CFG_* */
	__u32 tcp_timeout_s;       /* conntrack: established TCP idle */
	__u32 udp_timeout_s;       /* conntrack: UDP idle */
	/* [daemon] snat_port_range, host byte order: the ports external flows
	 * to another host's backend take as their source (HM_NAT). */
	__u16 snat_port_min;
	__u16 snat_port_max;
};
_Static_assert(sizeof(struct hm_config) == 24, "hm_config layout");

#define HM_CFG_CTLB_TCP (1u << 0) /* connect-time LB handles TCP */
#define HM_CFG_CTLB_UDP (1u << 1) /* connect-time LB handles UDP */
/* A service is reached from the network (node_port or external): only then
 * do hm_reply and hm_direct look packets up in HM_NAT. */
#define HM_CFG_EXTERNAL (1u << 2)

/* Conntrack timeouts that are not configurable. */
#define HM_CT_SYN_TIMEOUT_S 60
/* A TCP flow picked up mid-stream (HM_CT_F_PICKUP) until its backend answers. */
#define HM_CT_PICKUP_TIMEOUT_S 2
#define HM_CT_CLOSING_TIMEOUT_S 10
/* The defaults of [daemon] conntrack_tcp_timeout and conntrack_udp_timeout,
 * which HM_CONFIG carries; also what applies if it cannot be read. */
#define HM_CT_TCP_TIMEOUT_DEFAULT_S 86400
#define HM_CT_UDP_TIMEOUT_DEFAULT_S 60

/* (VIP, port, protocol, scope) -> service. */
struct hm_svc_key {
	__u8 addr[16];
	__be16 port;
	__u8 proto; /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 scope; /* HM_SVC_SCOPE_* */
};
_Static_assert(sizeof(struct hm_svc_key) == 20, "hm_svc_key layout");

struct hm_svc_value {
	__u32 id;            /* stable index into per-service maps */
	__u32 backend_count; /* 0: refuse connections */
	__u32 flags;         /* HM_SVC_F_* */
	__u32 table_size;    /* Maglev table size (prime) */
};
_Static_assert(sizeof(struct hm_svc_value) == 16, "hm_svc_value layout");

/* The VIP:port is also a [[mesh]] entry: the sidecar owns it, connect-time
 * load balancing leaves it alone. */
#define HM_SVC_F_MESH (1u << 0)
/* affinity = "client-ip": a client keeps its backend (HM_AFFINITY) for the
 * service's HM_SVC_AFFINITY timeout after its last connection. */
#define HM_SVC_F_AFFINITY (1u << 1)
/* external = true: packets from the network to the VIP:port are balanced
 * at the host interfaces' ingress too (HM_NAT). */
#define HM_SVC_F_EXTERNAL (1u << 2)
/* The entry of a node port: its key has the family's unspecified address
 * (:: or ::ffff:0.0.0.0) and the node port; it matches packets from the
 * network to any address of this host on that port. */
#define HM_SVC_F_NODE_PORT (1u << 3)
/* external_policy = "local": the entry's Maglev table holds this host's
 * backends only (its chunks are keyed with HM_MAGLEV_LOCAL set), and
 * backend_count counts them; a backend sees the client's own address. */
#define HM_SVC_F_LOCAL (1u << 4)

/* Whose packets an HM_SERVICES entry balances: this host's (the VIP's
 * entry connect-time LB and the bpfnat veth read), or the network's (an
 * external VIP's and a node port's entries, which hm_reply reads, and a
 * host process's connections to its own node port). */
#define HM_SVC_SCOPE_HOST 0
#define HM_SVC_SCOPE_NETWORK 1

/* HM_SVC_AFFINITY: service id -> its affinity settings (services with
 * HM_SVC_F_AFFINITY only). */
struct hm_svc_affinity {
	__u32 timeout_s; /* idle time after which a client may move */
	__u32 _pad;
};
_Static_assert(sizeof(struct hm_svc_affinity) == 8, "hm_svc_affinity layout");

/* HM_AFFINITY: (client, service) -> the backend it reached last. The
 * client is the packet's source on the veth path, the socket's bound
 * address (zero when unbound: the host) for connect-time LB. The daemon
 * deletes entries whose backend left the service. */
struct hm_aff_key {
	__u8 client[16];
	__u32 svc_id;
};
_Static_assert(sizeof(struct hm_aff_key) == 20, "hm_aff_key layout");

struct hm_aff_value {
	__u32 backend_id;
	__u32 _pad;
	__u64 last_seen_ns; /* CLOCK_MONOTONIC ns (clock.h) */
};
_Static_assert(sizeof(struct hm_aff_value) == 16, "hm_aff_value layout");

/* HM_BACKEND_STATS (per CPU): (service, backend) -> what went to that
 * backend. The backend is its address, not its id, so the veth path's
 * replies (which carry only the backend's address) count too. */
struct hm_bstats_key {
	__u8 addr[16];
	__be16 port;
	__u16 _pad;
	__u32 svc_id;
};
_Static_assert(sizeof(struct hm_bstats_key) == 24, "hm_bstats_key layout");

struct hm_bstats {
	__u64 ctlb_connections; /* connect() and unconnected UDP sendmsg() rewritten to it */
	__u64 veth_connections; /* new flows of the veth path */
	__u64 bytes_to;         /* veth path and flows from the network: client -> backend, */
	__u64 bytes_from;       /* and back: each packet's length at TC (with its Ethernet header) */
};
_Static_assert(sizeof(struct hm_bstats) == 32, "hm_bstats layout");

/* HM_BACKENDS: backend id -> address. */
struct hm_backend {
	__u8 addr[16];
	__be16 port;
	__u16 _pad;
};
_Static_assert(sizeof(struct hm_backend) == 20, "hm_backend layout");

/* HM_MAGLEV: (service id, chunk) -> backend ids of slots
 * [chunk * HM_MAGLEV_CHUNK, (chunk + 1) * HM_MAGLEV_CHUNK). */
struct hm_maglev_key {
	__u32 svc_id;
	__u32 chunk; /* | HM_MAGLEV_LOCAL: the table of this host's backends */
};
_Static_assert(sizeof(struct hm_maglev_key) == 8, "hm_maglev_key layout");
#define HM_MAGLEV_LOCAL (1u << 31)

struct hm_maglev_chunk {
	__u32 backend[HM_MAGLEV_CHUNK];
};
_Static_assert(sizeof(struct hm_maglev_chunk) == 256, "hm_maglev_chunk layout");

/* HM_CT and HM_CT_CLOSING: conntrack of the bpfnat veth path
 * (probes/conntrack.h). Each flow has two entries: forward (client -> VIP,
 * as seen on hm-natout) holding the backend, and reverse (backend ->
 * client, as seen on host interfaces) holding the VIP. Open flows are in
 * HM_CT, TCP flows that are closed in HM_CT_CLOSING. */
struct hm_ct_key {
	__u8 src[16];
	__u8 dst[16];
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 dir; /* HM_CT_FORWARD or HM_CT_REVERSE */
	__u16 _pad;
};
_Static_assert(sizeof(struct hm_ct_key) == 40, "hm_ct_key layout");

#define HM_CT_FORWARD 0
#define HM_CT_REVERSE 1

struct hm_ct_value {
	__u8 nat_addr[16]; /* forward: backend; reverse: VIP */
	__be16 nat_port;
	__u8 flags;        /* HM_CT_F_* */
	__u8 _pad;
	__u32 svc_id;
	__u64 last_seen_ns; /* CLOCK_MONOTONIC ns (clock.h) */
	/* A forward entry's next hop, as the FIB found it for the flow's
	 * packets (service_nat.c, find_hop): the epoch it was found in, the
	 * interface (0: not known) and the Ethernet header's two MACs
	 * (destination, then source). Zero in reverse entries. */
	__u32 fib_epoch;
	__u32 fib_ifindex;
	__u8 fib_macs[12];
	__u32 _pad2;
};
_Static_assert(sizeof(struct hm_ct_value) == 56, "hm_ct_value layout");

#define HM_CT_F_REPLIED (1u << 0)  /* the backend answered */
#define HM_CT_F_CLOSING (1u << 1)  /* TCP: closed (a FIN each way) */
#define HM_CT_F_FIN_OUT (1u << 2)  /* TCP: the client sent its FIN */
#define HM_CT_F_FIN_BACK (1u << 3) /* TCP: the backend sent its FIN */
/* TCP: a RST, as a packet's news (earlier builds also stored it in the
 * closed entries of a reset flow, which they kept a second) */
#define HM_CT_F_RESET (1u << 4)
/* TCP: opened by a packet that was not a SYN (a flow conntrack lost, or a
 * packet of a reset flow still on its way): HM_CT_PICKUP_TIMEOUT_S until
 * the backend answers. HM_CT's entries only: HM_NAT's use the bit for
 * HM_NAT_F_REPLY. */
#define HM_CT_F_PICKUP (1u << 5)
/* The bits of the flag byte HM_CT's and HM_NAT's entries share: the
 * flow's state. The bits above them are each map's own (HM_CT_F_PICKUP,
 * HM_NAT_F_*), so code the two maps share reads a value's flags through
 * this mask (ct_timeout_ns), and a bit added to one map cannot change
 * what the other's flags mean there. */
#define HM_FLOW_STATE_MASK (HM_CT_F_REPLIED | HM_CT_F_CLOSING | HM_CT_F_FIN_OUT | HM_CT_F_FIN_BACK | HM_CT_F_RESET)
_Static_assert((HM_CT_F_PICKUP & HM_FLOW_STATE_MASK) == 0, "HM_CT's own bits are outside the shared state");

/* HM_NAT: flows from the network (node ports, external VIPs), translated
 * at the host interfaces by hm_reply (ingress) and hm_direct (egress).
 * Keyed by hm_ct_key, whose dir says where the key is looked up: every
 * packet of the client's, and the replies of a flow whose source was
 * translated (HM_NAT_F_SNAT: a backend on another host), arrive at a host
 * interface's ingress (HM_NAT_IN); replies of a backend on this host (a
 * process, or a VM or namespace behind a veth or bridge) leave through
 * one's egress (HM_NAT_OUT). Each flow has two entries, the client's
 * (forward) and the backend's (HM_NAT_F_REPLY); the value is what a packet
 * the key matches is rewritten to, and the key of the other entry is the
 * value's addresses and ports swapped. */
struct hm_nat_value {
	__u8 dst[16];
	__u8 src[16];
	__be16 dport;
	__be16 sport;
	__u8 flags; /* HM_CT_F_* and HM_NAT_F_* */
	__u8 _pad[3];
	__u32 svc_id;
	__u32 fib_epoch;    /* when the next hop below was found (service_nat.c) */
	__u64 last_seen_ns; /* CLOCK_MONOTONIC ns (clock.h), refreshed at most once a second */
	/* Where the translated packet leaves, as bpf_fib_lookup() found it:
	 * the interface (0: not known) and the Ethernet header's two MACs
	 * (destination, then source). */
	__u32 fib_ifindex;
	__u8 fib_macs[12];
};
_Static_assert(sizeof(struct hm_nat_value) == 72, "hm_nat_value layout");

#define HM_NAT_IN 0
#define HM_NAT_OUT 1
#define HM_NAT_F_REPLY (1u << 5) /* the backend's entry */
#define HM_NAT_F_SNAT (1u << 6)  /* the client's address is replaced by this host's */
#define HM_NAT_F_HOST (1u << 7)  /* the client is a process of this host (the turnaround) */
_Static_assert(((HM_NAT_F_REPLY | HM_NAT_F_SNAT | HM_NAT_F_HOST) & HM_FLOW_STATE_MASK) == 0,
	       "HM_NAT's own bits are outside the shared state");

/* HM_SNAT: backend address -> the source external flows to it take: this
 * host's address on the way to it, or none (all zero) for a backend on
 * this host, which sees the client's own address. A backend of an
 * external service without an entry is not used by external flows. */
struct hm_addr {
	__u8 addr[16];
};
_Static_assert(sizeof(struct hm_addr) == 16, "hm_addr layout");

struct hm_snat_value {
	__u8 src[16];
};
_Static_assert(sizeof(struct hm_snat_value) == 16, "hm_snat_value layout");

/* HM_HOST_ADDRS: the addresses of the host interfaces (hm_addr -> 1),
 * where node ports answer. */
#define HM_MAX_HOST_ADDRS 4096

/* Tries of a port for a new flow's source before it is dropped. */
#define HM_SNAT_TRIES 16

/* HM_REVERSE_SOCK: connect-time LB's memory of what a socket asked for,
 * so getpeername() and recvmsg() show the VIP, not the backend. */
struct hm_revsk_key {
	__u64 cookie; /* bpf_get_socket_cookie() */
	__u8 addr[16]; /* backend */
	__be16 port;
	__u16 _pad[3];
};
_Static_assert(sizeof(struct hm_revsk_key) == 32, "hm_revsk_key layout");

struct hm_revsk_value {
	__u8 addr[16]; /* VIP */
	__be16 port;
	__u16 _pad;
};
_Static_assert(sizeof(struct hm_revsk_value) == 20, "hm_revsk_value layout");

/* HM_MESH: (VIP, port, protocol) -> the sidecar's redirect port. Port 0
 * matches every port of the VIP; an exact port wins over it. */
struct hm_mesh_key {
	__u8 addr[16];
	__be16 port;
	__u8 proto;
	__u8 _pad;
};
_Static_assert(sizeof(struct hm_mesh_key) == 20, "hm_mesh_key layout");

struct hm_mesh_value {
	__u16 redirect_port; /* host byte order */
	__u16 _pad;
};
_Static_assert(sizeof(struct hm_mesh_value) == 4, "hm_mesh_value layout");

/* HM_MESH_SOCKETS (a SOCKHASH): the sidecar listener for a redirect port. */
struct hm_sock_key {
	__u16 port;  /* host byte order */
	__u8 family; /* HM_AF_INET or HM_AF_INET6 */
	__u8 proto;  /* IPPROTO_TCP or IPPROTO_UDP */
};
_Static_assert(sizeof(struct hm_sock_key) == 4, "hm_sock_key layout");

/* The kernel's address families (the probes include no libc header). */
#define HM_AF_INET 2
#define HM_AF_INET6 10

/* Default capacity of the mesh maps; [daemon] mesh_map_size overrides it. */
#define HM_MESH_MAP_SIZE 16384

/* Gateway peers (probes/gateway.c). */
#define HM_MAX_GW_ROUTES 16384
#define HM_MAX_GW_CONNTRACK 131072

/* HM_GW_CONFIG[0]. */
struct hm_gw_config {
	__u32 vni;
	__u32 role;      /* HM_ROLE_* */
	__u8 gateway[16]; /* members: this site's gateway (underlay) */
	__u8 local[16];   /* this host's underlay address: the tunnel source */
	/* Learned return paths expire when idle this long (the daemon
	 * expires them; the probes only refresh them). */
	__u32 tcp_timeout_s;
	__u32 udp_timeout_s;
};
_Static_assert(sizeof(struct hm_gw_config) == 48, "hm_gw_config layout");

#define HM_ROLE_MEMBER 1
#define HM_ROLE_GATEWAY 2

/* HM_PEERS and HM_MEMBERS: LPM tries, overlay CIDR -> underlay endpoint.
 * Addresses are 16 bytes (IPv4-mapped); an IPv4 /n is /(96 + n). */
struct hm_lpm_key {
	__u32 prefixlen;
	__u8 addr[16];
};
_Static_assert(sizeof(struct hm_lpm_key) == 20, "hm_lpm_key layout");

struct hm_endpoint {
	__u8 addr[16];   /* underlay address */
	__u32 flags;     /* HM_EP_* */
};
_Static_assert(sizeof(struct hm_endpoint) == 20, "hm_endpoint layout");

#define HM_EP_UP (1u << 0) /* a peer answering its probes */

/* HM_PEER_ENDPOINTS: a peer gateway's underlay address (hm_endpoint, flags
 * 0) -> HM_PEER_EP_* bits. */
#define HM_PEER_EP_KNOWN (1u << 0)
/* An encrypted peer's (WireGuard): what claims to come from it is taken
 * only when it came through hm-wg0 (HM_WG_RX_MARK), never in clear. */
#define HM_PEER_EP_ENCRYPTED (1u << 1)
/* The mark hm_wg_in gives every packet hm-wg0 receives ("hmwr"; WireGuard
 * clears marks as it decrypts, so no packet arrives with it from
 * anywhere else), which hm_tun_in checks on the VXLAN inside and takes
 * away. Not WireGuard's own mark (model/encryption.rs WG_FWMARK), so the
 * steering's rules still apply to the reverse-path check of what arrives
 * (src_valid_mark). */
#define HM_WG_RX_MARK 0x686d7772

/* HM_GW_CT: return paths learned on a gateway. Key: the reply's 5-tuple
 * (hm_ct_key with dir 0); value: the member that sent the request. */
struct hm_gw_ct_value {
	__u8 member[16];
	__u64 last_seen_ns;
};
_Static_assert(sizeof(struct hm_gw_ct_value) == 24, "hm_gw_ct_value layout");

/*
 * Gateway probes (daemon/src/peer_health): a prober sends each gateway it
 * watches, to the tunnel's UDP port, a VXLAN frame of our VNI holding an
 * IPv4/UDP datagram to HM_PROBE_ADDR port HM_PROBE_PORT (inner Ethernet
 * from TUN_PEER_MAC to the tunnel MAC, UDP checksum 0) whose payload is
 * struct hm_gw_probe. hm_tun_in of every host answers it in the data plane
 * (kind becomes HM_PROBE_ACK; the frame goes back through the tunnel to
 * its tunnel source), so a gateway whose daemon restarts keeps answering;
 * the prober's hm_tun_in stores an answer in HM_GW_PROBES[slot]. Fields
 * are in network byte order; the programs compare magic and kind and
 * read slot, and echo the rest.
 */
struct hm_gw_probe {
	__u32 magic;     /* HM_PROBE_MAGIC */
	__u32 kind;      /* HM_PROBE_ASK, HM_PROBE_ACK */
	__u32 slot;      /* the prober's index of the target, < HM_MAX_GW_PROBES */
	__u32 _pad;
	__u64 seq;
	__u64 nonce;     /* the prober's, so answers cannot be guessed */
	__u8 target[16]; /* the address the prober sent to (a gateway may
			  * answer from another of its addresses) */
};
_Static_assert(sizeof(struct hm_gw_probe) == 48, "hm_gw_probe layout");

#define HM_PROBE_MAGIC 0x686d7072 /* "hmpr" */
#define HM_PROBE_ASK 1
#define HM_PROBE_ACK 2
#define HM_PROBE_ADDR 0xa9fe0202 /* 169.254.2.2, never routed: the frame is answered or dropped */
#define HM_PROBE_PORT 26733
#define HM_MAX_GW_PROBES 1024

/* probes/netns_cookie.c records the cookie of sockets that connect to
 * this address and port over UDP (127.0.0.1:9, discard: nothing is sent). */
#define HM_NETNS_COOKIE_ADDR 0x7f000001
#define HM_NETNS_COOKIE_PORT 9

/* The size of struct bpf_tunnel_key with the tunnel's source address
 * (local_ipv4/local_ipv6, its last member): the daemon's feature probe asks
 * whether the kernel takes this size (backends/bpf/features.rs). */
#define HM_TUNNEL_KEY_SIZE sizeof(struct bpf_tunnel_key)

/* What the programs return (linux/pkt_cls.h, linux/bpf.h), for the probe
 * tests (daemon/src/backends/bpf/probe_tests.rs). */
#define HM_TC_ACT_UNSPEC TC_ACT_UNSPEC
#define HM_TC_ACT_OK TC_ACT_OK
#define HM_TC_ACT_REDIRECT TC_ACT_REDIRECT
#define HM_TC_ACT_SHOT TC_ACT_SHOT
#define HM_SK_PASS SK_PASS

#endif /* HOSTMESH_ABI_H */
