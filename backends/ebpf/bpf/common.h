/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Map layouts shared by the socket programs (sock.c) and the UDP socket
 * destroyer (destroy.c). The Go side mirrors every struct here in
 * maps.go; TestMapLayout checks that both agree with the BTF of the
 * compiled objects.
 *
 * Addresses and ports are in network byte order. IPv4 addresses in
 * 16-byte fields are IPv4-mapped IPv6 addresses (::ffff:a.b.c.d).
 */
#ifndef PROXYKIT_COMMON_H
#define PROXYKIT_COMMON_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define AF_INET 2
#define AF_INET6 10
#define IPPROTO_TCP 6
#define IPPROTO_UDP 17
#define ECONNREFUSED 111

/* Every map is pinned by name under the caller's PinPath (when set), so
 * a restarted proxier adopts it with its contents. */
#define PINNED __uint(pinning, LIBBPF_PIN_BY_NAME)

/* Reverse translation: what a socket was translated to, so that
 * recvmsg and getpeername show the service address. Written by the
 * connect and sendmsg programs. */
struct rev_key {
	__u64 cookie;     /* socket cookie */
	__be32 addr[4];   /* endpoint address */
	__be16 port;      /* endpoint port */
	__u16 pad1;
	__u32 pad2;
};

struct rev_val {
	__be32 addr[4]; /* service address */
	__be16 port;    /* service port */
	__u16 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct rev_key);
	__type(value, struct rev_val);
	__uint(max_entries, 65536); /* Config.MaxSockets */
	PINNED;
} pk_rev SEC(".maps");

#endif
