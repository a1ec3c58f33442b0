// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * A UDP socket iterator that destroys connected UDP sockets whose
 * endpoint left the service they were translated from (kernel 6.5+:
 * bpf_sock_destroy). The Go side fills pk_stale with the removed
 * (endpoint, service) pairs and reads the iterator once in each
 * translated network namespace: an iterator walks the sockets of the
 * namespace it is opened in.
 *
 * Kernel structures are declared with only the fields used, and
 * relocated against the running kernel's BTF (CO-RE).
 */
#include "common.h"

/* A (removed endpoint, service frontend) pair of a UDP service port. */
struct stale_key {
	__be32 be_addr[4];
	__be32 svc_addr[4];
	__be16 be_port;
	__be16 svc_port;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct stale_key);
	__type(value, __u8);
	__uint(max_entries, 65536);
} pk_stale SEC(".maps");

struct in6_addr {
	union {
		__u8 u6_addr8[16];
		__be16 u6_addr16[8];
		__be32 u6_addr32[4];
	} in6_u;
} __attribute__((preserve_access_index));

struct sock_common {
	__be32 skc_daddr;
	__be16 skc_dport;
	unsigned short skc_family;
	struct in6_addr skc_v6_daddr;
} __attribute__((preserve_access_index));

struct sock {
	struct sock_common __sk_common;
} __attribute__((preserve_access_index));

struct udp_sock;
struct bpf_iter_meta;

struct bpf_iter__udp {
	struct bpf_iter_meta *meta;
	struct udp_sock *udp_sk;
} __attribute__((preserve_access_index));

extern int bpf_sock_destroy(struct sock_common *sk) __ksym;

SEC("iter/udp")
int pk_destroy_udp(struct bpf_iter__udp *ctx)
{
	struct sock *sk = (struct sock *)ctx->udp_sk;
	struct rev_key rk = {};
	struct rev_val *rv;
	__u16 family;

	if (!sk)
		return 0;
	family = sk->__sk_common.skc_family;
	if (family == AF_INET) {
		rk.addr[2] = bpf_htonl(0xffff);
		rk.addr[3] = sk->__sk_common.skc_daddr;
	} else if (family == AF_INET6) {
		rk.addr[0] = sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32[0];
		rk.addr[1] = sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32[1];
		rk.addr[2] = sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32[2];
		rk.addr[3] = sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32[3];
	} else {
		return 0;
	}
	rk.port = sk->__sk_common.skc_dport;
	if (!rk.port)
		return 0; /* not connected */
	rk.cookie = bpf_get_socket_cookie(sk);
	rv = bpf_map_lookup_elem(&pk_rev, &rk);
	if (!rv)
		return 0; /* not translated by us */

	struct stale_key stk = {
		.be_addr = { rk.addr[0], rk.addr[1], rk.addr[2], rk.addr[3] },
		.svc_addr = { rv->addr[0], rv->addr[1], rv->addr[2], rv->addr[3] },
		.be_port = rk.port,
		.svc_port = rv->port,
		.pad = 0,
	};
	if (!bpf_map_lookup_elem(&pk_stale, &stk))
		return 0;
	bpf_sock_destroy((struct sock_common *)sk);
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
