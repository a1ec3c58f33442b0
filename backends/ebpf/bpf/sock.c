// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Socket-level service load balancing: cgroup v2 sock_addr programs that
 * translate a service address to an endpoint when a socket connects (TCP,
 * connected UDP) or sends (unconnected UDP), before any packet exists,
 * and translate back what recvmsg and getpeername report.
 *
 * Only sockets of the network namespaces listed in pk_netns are touched
 * (unless all_netns is set at load time); every other socket passes
 * through unchanged.
 */
#include "common.h"
#include "mix.h"

/* Load-time constants, set by the Go side. */

/* Translate in every network namespace, not only those in pk_netns. */
volatile const __u8 all_netns = 0;
/* connect() of a UDP socket to a service without endpoints succeeds
 * untranslated instead of failing with ECONNREFUSED, so that the
 * packets reach the composed nftables rules (which reject them with an
 * ICMP error, and follow the service once it has endpoints). */
volatile const __u8 udp_connect_passthrough = 0;
/* The node's own network namespace (its cookie; 0: none): its UDP
 * sockets are refused at connect even with udp_connect_passthrough,
 * since no tc program sees the packets the node sends itself (north-
 * south at tc), and frontends flagged SVC_NODE_ONLY apply to its
 * sockets alone. */
volatile const __u64 node_netns = 0;
/* Entries of a Maglev table (a prime): the value size of pk_maglev4/6
 * is 4 * maglev_size. */
volatile const __u32 maglev_size = 1021;

/* A service frontend: an address, port and protocol traffic is sent to.
 * addr 0 stands for every node address (a node port). */
struct svc4_key {
	__be32 addr;
	__be16 port;
	__u8 proto;
	__u8 pad;
};

struct svc6_key {
	__be32 addr[4];
	__be16 port;
	__u8 proto;
	__u8 pad;
};

/* No endpoint for this traffic although the service has endpoints
 * elsewhere (a Local traffic policy): fail with EPERM, a drop. Without
 * it, count 0 means the service has no endpoint: ECONNREFUSED. */
#define SVC_DROP 1
/* A new pick takes the endpoint the group's Maglev table (pk_maglev4/6)
 * holds for the client's hash; without it, a random one. */
#define SVC_MAGLEV 2
/* The frontend applies to the sockets of the node's own namespace
 * (node_netns) only: a load-balancer IP with source ranges, north-south
 * at tc. The Go side decided at its last sync whether the node's source
 * toward it is inside the ranges (a normal frontend) or not (count 0
 * with SVC_DROP). Sockets of other namespaces (pods) pass untranslated;
 * their packets meet the ranges at tc. */
#define SVC_NODE_ONLY 4

struct svc_val {
	__u32 id;           /* endpoint group: key of pk_be4/pk_be6 */
	__u32 count;        /* endpoints in slots 0..count-1 */
	__u32 affinity_sec; /* ClientIP session affinity timeout, 0 = none */
	__u32 flags;        /* SVC_* */
};

struct be_key {
	__u32 id;
	__u32 slot;
};

struct be4_val {
	__be32 addr;
	__be16 port;
	__u16 pad;
};

struct be6_val {
	__be32 addr[4];
	__be16 port;
	__u16 pad;
};

/* Session affinity: the client is the socket's network namespace (one
 * pod, or the node), whose address a socket may not have chosen yet at
 * connect time. */
struct aff_key {
	__u64 netns;
	__u32 id;
	__u32 pad;
};

struct aff_val {
	__u64 ts;       /* bpf_ktime_get_ns of the last use */
	__be32 addr[4]; /* the endpoint, IPv4-mapped for IPv4 */
	__be16 port;
	__u16 pad;
	__u32 slot;     /* where the endpoint was last seen */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct svc4_key);
	__type(value, struct svc_val);
	__uint(max_entries, 65536); /* Config.MaxServices */
	PINNED;
} pk_svc4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct svc6_key);
	__type(value, struct svc_val);
	__uint(max_entries, 65536); /* Config.MaxServices */
	PINNED;
} pk_svc6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct be_key);
	__type(value, struct be4_val);
	__uint(max_entries, 262144); /* Config.MaxBackends */
	PINNED;
} pk_be4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct be_key);
	__type(value, struct be6_val);
	__uint(max_entries, 262144); /* Config.MaxBackends */
	PINNED;
} pk_be6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct aff_key);
	__type(value, struct aff_val);
	__uint(max_entries, 65536); /* Config.MaxAffinity */
	PINNED;
} pk_aff4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct aff_key);
	__type(value, struct aff_val);
	__uint(max_entries, 65536); /* Config.MaxAffinity */
	PINNED;
} pk_aff6 SEC(".maps");

/* Maglev lookup tables: endpoint group id -> maglev_size slots of the
 * group (keys of pk_be4/pk_be6), built by the Go side from the group's
 * endpoints, for the groups of service ports that pick with Maglev
 * (their scheduler's choice, or the proxier's). The value type is a
 * placeholder: the Go side sets the value size (4 * maglev_size) and
 * max_entries at load time; a family that is not configured gets one
 * entry. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, __u32[1021]);
	__uint(max_entries, 16384); /* Config.MaxMaglevTables */
	PINNED;
} pk_maglev4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, __u32[1021]);
	__uint(max_entries, 16384); /* Config.MaxMaglevTables */
	PINNED;
} pk_maglev6 SEC(".maps");

/* Network namespace cookies whose sockets are translated. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u64);
	__type(value, __u8);
	__uint(max_entries, 4096);
	PINNED;
} pk_netns SEC(".maps");

/* The node's addresses node ports open on. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __be32);
	__type(value, __u8);
	__uint(max_entries, 1024);
	PINNED;
} pk_node4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct svc6_key); /* port, proto and pad are 0 */
	__type(value, __u8);
	__uint(max_entries, 1024);
	PINNED;
} pk_node6 SEC(".maps");

/* How many slots an affinity hit searches for its endpoint when the
 * endpoint moved to another slot (a removal compacts the slots). */
#define MAX_AFFINITY_SCAN 64

struct ep {
	__be32 addr[4]; /* IPv4-mapped for IPv4 */
	__be16 port;
};

enum {
	SEL_OK,
	SEL_PASS,   /* leave the socket alone */
	SEL_REFUSE, /* ECONNREFUSED */
	SEL_DROP,   /* EPERM */
};

static __always_inline int netns_allowed(__u64 netns)
{
	if (all_netns)
		return 1;
	return bpf_map_lookup_elem(&pk_netns, &netns) != NULL;
}

static __always_inline void set_mapped(__be32 addr[4], __be32 v4)
{
	addr[0] = 0;
	addr[1] = 0;
	addr[2] = bpf_htonl(0xffff);
	addr[3] = v4;
}

/* lookup_be reads slot of group id; v6 is a constant in every caller. */
static __always_inline int lookup_be(int v6, __u32 id, __u32 slot, struct ep *out)
{
	struct be_key k = { .id = id, .slot = slot };

	if (v6) {
		struct be6_val *b = bpf_map_lookup_elem(&pk_be6, &k);
		if (!b)
			return -1;
		out->addr[0] = b->addr[0];
		out->addr[1] = b->addr[1];
		out->addr[2] = b->addr[2];
		out->addr[3] = b->addr[3];
		out->port = b->port;
		return 0;
	}
	struct be4_val *b = bpf_map_lookup_elem(&pk_be4, &k);
	if (!b)
		return -1;
	set_mapped(out->addr, b->addr);
	out->port = b->port;
	return 0;
}

static __always_inline int same_ep(const struct ep *e, const struct aff_val *a)
{
	return e->port == a->port && e->addr[0] == a->addr[0] && e->addr[1] == a->addr[1] &&
	       e->addr[2] == a->addr[2] && e->addr[3] == a->addr[3];
}

/* affinity_hit finds the endpoint a client is pinned to, if it is still
 * one of the group's. */
static __always_inline int affinity_hit(int v6, __u32 id, __u32 count, struct aff_val *av, struct ep *out)
{
	struct ep e = {};

	if (av->slot < count && lookup_be(v6, id, av->slot, &e) == 0 && same_ep(&e, av)) {
		*out = e;
		return 1;
	}
	for (__u32 i = 0; i < MAX_AFFINITY_SCAN; i++) {
		if (i >= count)
			break;
		if (lookup_be(v6, id, i, &e) == 0 && same_ep(&e, av)) {
			av->slot = i;
			*out = e;
			return 1;
		}
	}
	return 0;
}


/* client_hash hashes what identifies the client side of the connection
 * at connect (or sendmsg) time. The destination is the service itself,
 * and the protocol is the frontend's, so the client's part of the
 * 5-tuple is what varies: when the socket has a local port (bound, or
 * autobound by an earlier send), the hash is of its network namespace,
 * source address and port, so that every socket a client binds to the
 * same address and port lands on the same endpoint. An unbound socket
 * gets its port only after this program has run, so its identity is the
 * socket cookie: the socket keeps its endpoint when it connects again
 * or sends unconnected datagrams, and different sockets spread.
 * sock6: the socket is AF_INET6 (also when it connects to an
 * IPv4-mapped address). */
static __always_inline __u64 client_hash(struct bpf_sock_addr *ctx, int sock6, __u64 netns)
{
	struct bpf_sock *sk = ctx->sk;
	__u32 port = 0;

	if (sk)
		port = sk->src_port;
	if (!sk || !port)
		return mix64(bpf_get_socket_cookie(ctx));
	__u64 h = mix64(netns ^ ((__u64)port << 32));
	if (sock6) {
		h = mix64(h ^ sk->src_ip6[0] ^ ((__u64)sk->src_ip6[1] << 32));
		h = mix64(h ^ sk->src_ip6[2] ^ ((__u64)sk->src_ip6[3] << 32));
	} else {
		h = mix64(h ^ sk->src_ip4);
	}
	return h;
}

/* pick_slot picks one of the count (> 0) slots of group id for a new
 * choice: the Maglev table's entry for the client's hash, or a random
 * slot. The entry may be a slot that is being removed; the caller falls
 * back to slot 0 then. */
static __always_inline __u32 pick_slot(struct bpf_sock_addr *ctx, int v6, int sock6, __u32 id, __u32 count, __u32 flags,
				       __u64 netns)
{
	__u32 size = maglev_size;

	if ((flags & SVC_MAGLEV) && size) {
		__u32 *row = v6 ? bpf_map_lookup_elem(&pk_maglev6, &id) : bpf_map_lookup_elem(&pk_maglev4, &id);
		if (row) {
			__u32 i = (__u32)(client_hash(ctx, sock6, netns) % size);
			/* Hide from the compiler that i < size, so that
			 * the check below stays for the verifier. */
			barrier_var(i);
			if (i < size)
				return row[i];
		}
	}
	return bpf_get_prandom_u32() % count;
}

/* select_ep picks the endpoint of a new connection: v6 says which
 * family's maps the frontend is in, sock6 the socket's family. */
static __always_inline int select_ep(struct bpf_sock_addr *ctx, int v6, int sock6, const struct svc_val *sv, __u64 netns, struct ep *out)
{
	__u32 count = sv->count;
	__u32 id = sv->id;
	__u32 slot;

	if (count == 0)
		return (sv->flags & SVC_DROP) ? SEL_DROP : SEL_REFUSE;

	if (!sv->affinity_sec) {
		slot = pick_slot(ctx, v6, sock6, id, count, sv->flags, netns);
		if (lookup_be(v6, id, slot, out) == 0)
			return SEL_OK;
		/* The slots are being rewritten; slot 0 is always there. */
		return lookup_be(v6, id, 0, out) == 0 ? SEL_OK : SEL_PASS;
	}

	struct aff_key ak = { .netns = netns, .id = id, .pad = 0 };
	__u64 now = bpf_ktime_get_ns();
	__u64 timeout = (__u64)sv->affinity_sec * 1000000000ULL;
	struct aff_val *av = v6 ? bpf_map_lookup_elem(&pk_aff6, &ak) : bpf_map_lookup_elem(&pk_aff4, &ak);

	if (av && now - av->ts <= timeout && affinity_hit(v6, id, count, av, out)) {
		av->ts = now;
		return SEL_OK;
	}
	slot = pick_slot(ctx, v6, sock6, id, count, sv->flags, netns);
	if (lookup_be(v6, id, slot, out) != 0) {
		slot = 0;
		if (lookup_be(v6, id, 0, out) != 0)
			return SEL_PASS;
	}
	struct aff_val nv = {
		.ts = now,
		.addr = { out->addr[0], out->addr[1], out->addr[2], out->addr[3] },
		.port = out->port,
		.pad = 0,
		.slot = slot,
	};
	if (v6)
		bpf_map_update_elem(&pk_aff6, &ak, &nv, BPF_ANY);
	else
		bpf_map_update_elem(&pk_aff4, &ak, &nv, BPF_ANY);
	return SEL_OK;
}

/* lookup_svc4 finds the frontend addr:port/proto, or the node port when
 * addr is a node address. */
static __always_inline struct svc_val *lookup_svc4(__be32 addr, __be16 port, __u8 proto)
{
	struct svc4_key k = { .addr = addr, .port = port, .proto = proto, .pad = 0 };
	struct svc_val *sv = bpf_map_lookup_elem(&pk_svc4, &k);

	if (sv)
		return sv;
	if (!bpf_map_lookup_elem(&pk_node4, &addr))
		return NULL;
	k.addr = 0;
	return bpf_map_lookup_elem(&pk_svc4, &k);
}

static __always_inline struct svc_val *lookup_svc6(const __be32 addr[4], __be16 port, __u8 proto)
{
	struct svc6_key k = {
		.addr = { addr[0], addr[1], addr[2], addr[3] },
		.port = port,
		.proto = proto,
		.pad = 0,
	};
	struct svc_val *sv = bpf_map_lookup_elem(&pk_svc6, &k);

	if (sv)
		return sv;
	k.port = 0;
	k.proto = 0;
	if (!bpf_map_lookup_elem(&pk_node6, &k))
		return NULL;
	k.addr[0] = 0;
	k.addr[1] = 0;
	k.addr[2] = 0;
	k.addr[3] = 0;
	k.port = port;
	k.proto = proto;
	return bpf_map_lookup_elem(&pk_svc6, &k);
}

static __always_inline void remember(struct bpf_sock_addr *ctx, const struct ep *e, const __be32 svc[4], __be16 port)
{
	struct rev_key rk = {
		.cookie = bpf_get_socket_cookie(ctx),
		.addr = { e->addr[0], e->addr[1], e->addr[2], e->addr[3] },
		.port = e->port,
		.pad1 = 0,
		.pad2 = 0,
	};
	struct rev_val rv = {
		.addr = { svc[0], svc[1], svc[2], svc[3] },
		.port = port,
		.pad = 0,
	};
	bpf_map_update_elem(&pk_rev, &rk, &rv, BPF_ANY);
}

/* verdict turns a selection into the program's return value, or -1 to
 * go on translating. */
static __always_inline int verdict(int sel, int connect, __u8 proto, __u64 netns)
{
	switch (sel) {
	case SEL_OK:
		return -1;
	case SEL_DROP:
		return 0;
	case SEL_REFUSE:
		if (connect && proto == IPPROTO_UDP && udp_connect_passthrough && netns != node_netns)
			return 1;
		bpf_set_retval(-ECONNREFUSED);
		return 0;
	}
	return 1;
}

static __always_inline int xlate4(struct bpf_sock_addr *ctx, int connect)
{
	__u64 netns = bpf_get_netns_cookie(ctx);
	__u8 proto = ctx->protocol;
	struct svc_val *sv;
	struct ep e = {};
	__be32 svc[4];
	int v;

	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return 1;
	if (!netns_allowed(netns))
		return 1;
	__be32 daddr = ctx->user_ip4;
	__be16 dport = (__be16)ctx->user_port;
	sv = lookup_svc4(daddr, dport, proto);
	if (!sv || ((sv->flags & SVC_NODE_ONLY) && netns != node_netns))
		return 1;
	v = verdict(select_ep(ctx, 0, 0, sv, netns, &e), connect, proto, netns);
	if (v >= 0)
		return v;
	set_mapped(svc, daddr);
	remember(ctx, &e, svc, dport);
	ctx->user_ip4 = e.addr[3];
	ctx->user_port = (__u32)e.port;
	return 1;
}

static __always_inline int is_mapped(__be32 a0, __be32 a1, __be32 a2)
{
	return a0 == 0 && a1 == 0 && a2 == bpf_htonl(0xffff);
}

static __always_inline int xlate6(struct bpf_sock_addr *ctx, int connect)
{
	__u64 netns = bpf_get_netns_cookie(ctx);
	__u8 proto = ctx->protocol;
	struct svc_val *sv;
	struct ep e = {};
	__be32 svc[4];
	int v4, v;

	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return 1;
	if (!netns_allowed(netns))
		return 1;
	svc[0] = ctx->user_ip6[0];
	svc[1] = ctx->user_ip6[1];
	svc[2] = ctx->user_ip6[2];
	svc[3] = ctx->user_ip6[3];
	__be16 dport = (__be16)ctx->user_port;
	v4 = is_mapped(svc[0], svc[1], svc[2]);
	if (v4)
		sv = lookup_svc4(svc[3], dport, proto);
	else
		sv = lookup_svc6(svc, dport, proto);
	if (!sv || ((sv->flags & SVC_NODE_ONLY) && netns != node_netns))
		return 1;
	if (v4)
		v = verdict(select_ep(ctx, 0, 1, sv, netns, &e), connect, proto, netns);
	else
		v = verdict(select_ep(ctx, 1, 1, sv, netns, &e), connect, proto, netns);
	if (v >= 0)
		return v;
	remember(ctx, &e, svc, dport);
	ctx->user_ip6[0] = e.addr[0];
	ctx->user_ip6[1] = e.addr[1];
	ctx->user_ip6[2] = e.addr[2];
	ctx->user_ip6[3] = e.addr[3];
	ctx->user_port = (__u32)e.port;
	return 1;
}

/* rev4 and rev6 show the service address instead of the endpoint a
 * socket was translated to. */
static __always_inline int rev4(struct bpf_sock_addr *ctx)
{
	struct rev_key rk = {
		.cookie = bpf_get_socket_cookie(ctx),
		.port = (__be16)ctx->user_port,
		.pad1 = 0,
		.pad2 = 0,
	};
	struct rev_val *rv;

	set_mapped(rk.addr, ctx->user_ip4);
	rv = bpf_map_lookup_elem(&pk_rev, &rk);
	if (!rv)
		return 1;
	ctx->user_ip4 = rv->addr[3];
	ctx->user_port = (__u32)rv->port;
	return 1;
}

static __always_inline int rev6(struct bpf_sock_addr *ctx)
{
	struct rev_key rk = {
		.cookie = bpf_get_socket_cookie(ctx),
		.addr = { ctx->user_ip6[0], ctx->user_ip6[1], ctx->user_ip6[2], ctx->user_ip6[3] },
		.port = (__be16)ctx->user_port,
		.pad1 = 0,
		.pad2 = 0,
	};
	struct rev_val *rv = bpf_map_lookup_elem(&pk_rev, &rk);

	if (!rv)
		return 1;
	ctx->user_ip6[0] = rv->addr[0];
	ctx->user_ip6[1] = rv->addr[1];
	ctx->user_ip6[2] = rv->addr[2];
	ctx->user_ip6[3] = rv->addr[3];
	ctx->user_port = (__u32)rv->port;
	return 1;
}

SEC("cgroup/connect4")
int pk_connect4(struct bpf_sock_addr *ctx)
{
	return xlate4(ctx, 1);
}

SEC("cgroup/connect6")
int pk_connect6(struct bpf_sock_addr *ctx)
{
	return xlate6(ctx, 1);
}

SEC("cgroup/sendmsg4")
int pk_sendmsg4(struct bpf_sock_addr *ctx)
{
	return xlate4(ctx, 0);
}

SEC("cgroup/sendmsg6")
int pk_sendmsg6(struct bpf_sock_addr *ctx)
{
	return xlate6(ctx, 0);
}

SEC("cgroup/recvmsg4")
int pk_recvmsg4(struct bpf_sock_addr *ctx)
{
	return rev4(ctx);
}

SEC("cgroup/recvmsg6")
int pk_recvmsg6(struct bpf_sock_addr *ctx)
{
	return rev6(ctx);
}

SEC("cgroup/getpeername4")
int pk_getpeername4(struct bpf_sock_addr *ctx)
{
	return rev4(ctx);
}

SEC("cgroup/getpeername6")
int pk_getpeername6(struct bpf_sock_addr *ctx)
{
	return rev6(ctx);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
