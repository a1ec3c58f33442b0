// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The north-south datapath shared by the tc programs (nodeport.c) and
 * the XDP program (xdp.c): packets from outside the node to a node port
 * (on a node address), an external IP or a load-balancer IP are
 * translated to an endpoint (DNAT; for a remote endpoint with
 * externalTrafficPolicy Cluster also SNAT to the node's address toward
 * it), tracked in LRU maps, and forwarded; replies are translated back.
 * Both objects declare the same maps; the XDP object is loaded with the
 * tc object's maps.
 *
 * Both families share the maps; IPv4 addresses are IPv4-mapped in the
 * 16-byte fields. Only TCP, UDP and SCTP, IPv4 without fragments and
 * IPv6 without extension headers, behind an Ethernet header, are
 * handled; every other packet goes on untouched.
 *
 * The including file defines the context and how to reach its packet:
 *   CTX                                   struct __sk_buff or struct xdp_md
 *   pk_pull(ctx)                          make the headers readable by
 *                                         pk_load (before parse reads)
 *   pk_load(ctx, off, to, len)            copy bytes out of the packet
 *   pk_store(ctx, off, from, len, flags)  copy bytes into it
 *   pk_l3_csum(ctx, off, from, to, flags) bpf_l3_csum_replace's meaning
 *   pk_l4_csum(ctx, off, from, to, flags) bpf_l4_csum_replace's meaning
 *   pk_proto(ctx)                         the Ethernet type (network order)
 *   pk_ingress(ctx)                       the interface it arrived on
 *   V_STACK, V_DROP, V_NEXT               verdicts: to the stack, drop,
 *                                         untouched to what comes next
 * and, after including this file, translate() (rewrite a tracked
 * packet and send it on) and reject() (answer a packet to a frontend
 * without endpoints).
 */
#ifndef PROXYKIT_NODEPORT_H
#define PROXYKIT_NODEPORT_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "mix.h"
#include "crc32c.h"

#define AF_INET 2
#define AF_INET6 10
#define IPPROTO_ICMP 1
#define IPPROTO_TCP 6
#define IPPROTO_UDP 17
#define IPPROTO_ICMPV6 58
#define IPPROTO_SCTP 132

/* The first and last source port of SNATed flows (load-time
 * constants, Config.NorthSouthSNATPorts): by default outside the node's
 * ephemeral range (ip_local_port_range), so that the node's own
 * connections do not collide with them. */
volatile const __u16 snat_port_min = 61000;
volatile const __u16 snat_port_max = 65535;

/* Entries of a Maglev table (a prime, Config.MaglevTableSize): the
 * value size of pk_nsmag is 4 * ns_maglev_size. */
volatile const __u32 ns_maglev_size = 1021;

/* How many random SNAT ports a new flow tries before it is dropped. */
#define SNAT_TRIES 16

/* A frontend of traffic from outside: an address (the unspecified
 * address of the family, ::ffff:0.0.0.0 or ::, for a node port on
 * every node address), a port and a protocol. */
struct nsfe_key {
	__be32 addr[4];
	__be16 port;
	__u8 proto;
	__u8 pad; /* 0, or NSFE_KEY_SHORT */
};

/* The key of a frontend of an externalTrafficPolicy Local service with
 * pad NSFE_KEY_SHORT holds the endpoints that pods and the node reach
 * through it (kube-proxy's short circuit to the cluster-wide ones),
 * where the frontend's own entry holds the local ones, for sources
 * outside. Only where pods' packets reach this datapath untranslated:
 * load-balancer IPs with source ranges and SCTP. */
#define NSFE_KEY_SHORT 1

/* The frontend's endpoints have none on this node although the service
 * has some elsewhere (externalTrafficPolicy Local): drop. Without it,
 * count 0 means no endpoint at all: reject with ICMP port unreachable. */
#define NSFE_DROP 1
/* externalTrafficPolicy Local: never SNAT, the endpoint sees the
 * client. */
#define NSFE_LOCAL 2
/* A load-balancer IP with loadBalancerSourceRanges: new flows from
 * sources outside the group's ranges in pk_nsrange are dropped. */
#define NSFE_RANGES 4
/* Direct server return: a flow to a remote endpoint is not SNATed but
 * sent to the endpoint in an IPIP (IPv6: IP6IP6) packet, whose outer
 * source is the frontend's address and whose IPv4 id (IPv6: the low 16
 * bits of the flow label) is the frontend's port; the endpoint's node
 * unwraps it (pk_nsloc) and sends the replies to the client itself,
 * from the frontend. */
#define NSFE_DSR 8
/* A new flow picks the slot the group's Maglev table (pk_nsmag) holds
 * for its tuple's hash, the same on every node with the same endpoints;
 * without it, a random one. */
#define NSFE_MAGLEV 16

struct nsfe_val {
	__u32 id;           /* endpoint group: key of pk_nsbe */
	__u32 count;        /* endpoints in slots 0..count-1 */
	__u32 flags;        /* NSFE_* */
	__u32 affinity_sec; /* ClientIP session affinity timeout, 0 = none */
};

struct nsbe_key {
	__u32 id;
	__u32 slot;
};

/* The endpoint runs on this node: no SNAT. */
#define NSBE_LOCAL 1

struct nsbe_val {
	__be32 addr[4];
	__be16 port;
	__u16 flags; /* NSBE_* */
};

/* loadBalancerSourceRanges: a prefix of sources admitted to the
 * load-balancer IPs of a group. prefixlen counts the id's 32 bits, then
 * the address's (IPv4-mapped for IPv4: 96 + the prefix length). */
struct nsrange_key {
	__u32 prefixlen;
	__u32 id;
	__be32 addr[4];
};

/* Session affinity: a client address's endpoint in a group. */
struct nsaff_key {
	__be32 client[4];
	__u32 id;
	__u32 pad;
};

struct nsaff_val {
	__u64 ts; /* bpf_ktime_get_ns of the last new flow */
	struct nsbe_val ep;
};

/* How many slots an affinity hit searches for its endpoint (a removal
 * compacts the slots). */
#define MAX_AFFINITY_SCAN 64

/* A connection tuple as it is on the wire. */
struct tuple {
	__be32 saddr[4];
	__be32 daddr[4];
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3];
};

/* A reverse NAT entry's record of its flow (struct nat's state): a
 * TCP flow that both sides closed (a FIN each way) or that a RST ended,
 * and a UDP flow idle for UDP_IDLE_SEC, give their SNAT port to a new
 * flow that finds no free one, as conntrack lets a closed connection's
 * tuple be taken again. */
#define CT_FIN_IN 1  /* a FIN from the client */
#define CT_FIN_OUT 2 /* a FIN from the endpoint */
#define CT_RST 4     /* a RST either way */

/* How long a UDP flow is idle before its SNAT port may be taken, in
 * units of 2^30 ns (about 1.07 s): about 2 minutes, conntrack's UDP
 * stream timeout. */
#define UDP_IDLE_SEC 112

/* A tracking entry's flow goes to its endpoint by direct server
 * return (NSFE_DSR): its packets are wrapped, its replies never come
 * back through this node. */
#define NAT_DSR 1

/* The rewrite of a tracked packet: its new source and destination. */
struct nat {
	__be32 saddr[4];
	__be32 daddr[4];
	__be16 sport;
	__be16 dport;
	__u8 state;  /* CT_* (reverse entries only) */
	__u8 flags;  /* NAT_* (tracking entries only) */
	__u16 seen;  /* reverse entries: bpf_ktime_get_ns() >> 30 of the last packet, wrapping */
};

/* An interface's address of a family, the source of SNATed packets
 * leaving through it. */
struct ifaddr_key {
	__u32 ifindex;
	__u32 family; /* AF_INET or AF_INET6 */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct nsfe_key);
	__type(value, struct nsfe_val);
	__uint(max_entries, 65536); /* Config.MaxServices */
} pk_nsfe SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct nsbe_key);
	__type(value, struct nsbe_val);
	__uint(max_entries, 262144); /* Config.MaxBackends */
} pk_nsbe SEC(".maps");

/* Connection tracking: the tuple of a flow from outside, as it
 * arrives, -> its rewrite. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct tuple);
	__type(value, struct nat);
	__uint(max_entries, 65536); /* Config.MaxSockets */
} pk_nsct SEC(".maps");

/* Reverse NAT: the tuple of a reply, as the endpoint sends it, -> its
 * rewrite back to the frontend and the client. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct tuple);
	__type(value, struct nat);
	__uint(max_entries, 65536); /* Config.MaxSockets */
} pk_nsrev SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct nsrange_key);
	__type(value, __u8);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} pk_nsrange SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct nsaff_key);
	__type(value, struct nsaff_val);
	__uint(max_entries, 65536); /* Config.MaxAffinity */
} pk_nsaff SEC(".maps");

/* Maglev lookup tables: endpoint group id -> ns_maglev_size slots of
 * the group, built by the Go side from the group's endpoints. The value
 * type is a placeholder: the Go side sets the value size and
 * max_entries at load time. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, __u32[1021]);
	__uint(max_entries, 16384); /* Config.MaxMaglevTables */
	__uint(map_flags, BPF_F_NO_PREALLOC);
} pk_nsmag SEC(".maps");

/* The endpoints of this node's service ports (address and port): a
 * packet that another node's program wrapped for direct server return
 * is unwrapped only when it goes to one of them. */
struct nsloc_key {
	__be32 addr[4];
	__be16 port;
	__u16 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct nsloc_key);
	__type(value, __u8);
	__uint(max_entries, 65536); /* Config.MaxBackends */
	__uint(map_flags, BPF_F_NO_PREALLOC);
} pk_nsloc SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct ifaddr_key);
	__type(value, __be32[4]);
	__uint(max_entries, 1024);
} pk_ifaddr SEC(".maps");

/* The node's addresses node ports open on: the socket programs' maps
 * (bpf/sock.c), shared. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __be32);
	__type(value, __u8);
	__uint(max_entries, 1024);
} pk_node4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct nsfe_key); /* port, proto and pad are 0 */
	__type(value, __u8);
	__uint(max_entries, 1024);
} pk_node6 SEC(".maps");

struct iphdr4 {
	__u8 ver_ihl;
	__u8 tos;
	__be16 tot_len;
	__be16 id;
	__be16 frag_off;
	__u8 ttl;
	__u8 proto;
	__sum16 check;
	__be32 saddr;
	__be32 daddr;
};

struct iphdr6 {
	__be32 ver_tc_flow;
	__be16 payload_len;
	__u8 nexthdr;
	__u8 hop_limit;
	__be32 saddr[4];
	__be32 daddr[4];
};

#define IP_DF 0x4000
#define IP_MF 0x2000
#define IP_OFFSET 0x1fff

/* A parsed packet: its tuple and where its fields are. */
struct pkt {
	struct tuple t;
	__u32 l4off;   /* offset of the TCP or UDP header */
	__u32 csumoff; /* offset of the L4 checksum (SCTP: its CRC32c) */
	__u8 v6;
	__u8 ttl;
	__u8 tos;
	__u8 tcpflags; /* the TCP header's flags byte (FIN 0x01, SYN 0x02, RST 0x04, ACK 0x10) */
	__be32 flow; /* IPv6 flow info */
	__u16 len;   /* length from the IP header on */
	__u8 df;     /* IPv4: don't fragment */
	__u8 pad;
};

/* translate rewrites p to n and sends it on (the including file's). */
static int translate(CTX *ctx, const struct pkt *p, const struct nat *n);

/* reject answers p, to a frontend without endpoints, with ICMP port
 * unreachable (the including file's). */
static int reject(CTX *ctx, const struct pkt *p);

/* related translates p, an ICMP or ICMPv6 packet, when it is an error
 * about a packet of a tracked flow, as conntrack translates a related
 * packet (the including file's). */
static int related(CTX *ctx, struct pkt *p);


static __always_inline void set_mapped(__be32 a[4], __be32 v4)
{
	a[0] = 0;
	a[1] = 0;
	a[2] = bpf_htonl(0xffff);
	a[3] = v4;
}

static __always_inline void copy16(__be32 d[4], const __be32 s[4])
{
	d[0] = s[0];
	d[1] = s[1];
	d[2] = s[2];
	d[3] = s[3];
}

/* parse_l4 fills p's ports; 1 for ICMP (ICMPv6 for IPv6), which
 * related() looks at, -1 for other protocols. */
static __always_inline int parse_l4(CTX *ctx, struct pkt *p, __u8 proto)
{
	__be16 ports[2];

	if (proto == (p->v6 ? IPPROTO_ICMPV6 : IPPROTO_ICMP)) {
		p->t.proto = proto;
		return 1;
	}
	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP && proto != IPPROTO_SCTP)
		return -1;
	if (pk_load(ctx, p->l4off, ports, sizeof(ports)))
		return -1;
	if (proto == IPPROTO_TCP && pk_load(ctx, p->l4off + 13, &p->tcpflags, 1))
		return -1;
	p->t.proto = proto;
	p->t.sport = ports[0];
	p->t.dport = ports[1];
	p->csumoff = p->l4off + (proto == IPPROTO_TCP ? 16 : proto == IPPROTO_UDP ? 6 : 8);
	return 0;
}

/* parse fills p from ctx; -1 for a packet the programs leave alone, 1
 * for an ICMP one (parse_l4). */
static __always_inline int parse(CTX *ctx, struct pkt *p)
{
	__be16 proto = pk_proto(ctx);

	pk_pull(ctx);
	if (proto == bpf_htons(ETH_P_IP)) {
		struct iphdr4 h;

		if (pk_load(ctx, ETH_HLEN, &h, sizeof(h)))
			return -1;
		if ((h.ver_ihl >> 4) != 4 || (h.ver_ihl & 0xf) < 5)
			return -1;
		if (h.frag_off & bpf_htons(IP_MF | IP_OFFSET))
			return -1;
		p->v6 = 0;
		p->df = !!(h.frag_off & bpf_htons(IP_DF));
		p->ttl = h.ttl;
		p->tos = h.tos;
		p->len = bpf_ntohs(h.tot_len);
		set_mapped(p->t.saddr, h.saddr);
		set_mapped(p->t.daddr, h.daddr);
		p->l4off = ETH_HLEN + (h.ver_ihl & 0xf) * 4;
		return parse_l4(ctx, p, h.proto);
	}
	if (proto == bpf_htons(ETH_P_IPV6)) {
		struct iphdr6 h;

		if (pk_load(ctx, ETH_HLEN, &h, sizeof(h)))
			return -1;
		if ((bpf_ntohl(h.ver_tc_flow) >> 28) != 6)
			return -1;
		p->v6 = 1;
		p->ttl = h.hop_limit;
		p->flow = h.ver_tc_flow & bpf_htonl(0x0fffffff);
		p->len = bpf_ntohs(h.payload_len) + sizeof(h);
		copy16(p->t.saddr, h.saddr);
		copy16(p->t.daddr, h.daddr);
		p->l4off = ETH_HLEN + sizeof(h);
		return parse_l4(ctx, p, h.nexthdr);
	}
	return -1;
}

static __always_inline int same16(const __be32 a[4], const __be32 b[4])
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3];
}

/* rewrite_addr replaces the address at off (the source or destination
 * of the IP header) and fixes the IPv4 header checksum and the L4
 * checksum (whose pseudo-header covers it; SCTP's CRC32c covers no
 * address). */
static __always_inline int rewrite_addr(CTX *ctx, const struct pkt *p, __u32 off, const __be32 old[4],
					const __be32 new[4])
{
	__u64 flags = BPF_F_PSEUDO_HDR;
	__be32 o[4], n[4];
	__s64 diff;

	if (p->t.proto == IPPROTO_UDP)
		flags |= BPF_F_MARK_MANGLED_0;
	copy16(o, old);
	copy16(n, new);
	if (!p->v6) {
		/* A 4-byte replacement, no bpf_csum_diff call. */
		if (pk_l3_csum(ctx, ETH_HLEN + 10, o[3], n[3], 4))
			return -1;
		if (p->t.proto != IPPROTO_SCTP && pk_l4_csum(ctx, p->csumoff, o[3], n[3], flags | 4))
			return -1;
		return pk_store(ctx, off, &n[3], 4, 0);
	}
	if (p->t.proto == IPPROTO_SCTP)
		return pk_store(ctx, off, n, 16, 0);
	diff = bpf_csum_diff(o, 16, n, 16, 0);
	if (diff < 0)
		return -1;
	if (pk_l4_csum(ctx, p->csumoff, 0, diff, flags))
		return -1;
	return pk_store(ctx, off, n, 16, 0);
}

/* rewrite_port replaces the L4 port at off and fixes the L4 checksum. */
static __always_inline int rewrite_port(CTX *ctx, const struct pkt *p, __u32 off, __be16 old, __be16 new)
{
	__u64 flags = sizeof(new);

	if (p->t.proto == IPPROTO_UDP)
		flags |= BPF_F_MARK_MANGLED_0;
	if (pk_l4_csum(ctx, p->csumoff, old, new, flags))
		return -1;
	return pk_store(ctx, off, &new, sizeof(new), 0);
}

/* The CRC32c polynomial (SCTP's checksum, RFC 9260 appendix A),
 * bit-reversed: bit 31 is x^0. */
#define CRC32C_POLY 0x82f63b78

/* crc32c_mask is all ones when bit 0 of v is set, else 0, hidden from
 * the compiler: it would turn the masks below into branches, which
 * multiply the paths the verifier walks. */
static __always_inline __u32 crc32c_mask(__u32 v)
{
	__u32 m = -(v & 1);

	barrier_var(m);
	return m;
}

/* crc32c_mul returns a * b modulo the CRC32c polynomial, both in its
 * bit-reversed form, without branches. */
static __always_inline __u32 crc32c_mul(__u32 a, __u32 b)
{
	__u32 p = 0;

	for (int i = 0; i < 32; i++) {
		p ^= b & crc32c_mask(a >> (31 - i));
		b = (b >> 1) ^ (CRC32C_POLY & crc32c_mask(b));
	}
	return p;
}

/* crc32c_delta returns how the CRC32c of a packet changes when its 4
 * bytes at some offset, followed by n more bytes, change by the xor d
 * (the 4 bytes as loaded from the packet, little-endian; n + 4 <
 * 65536): the CRC, without pre- and post-inversion, of d followed by n
 * zero bytes, which is d times x^32 (its own CRC) times x^(8n). The CRC
 * is linear in the message, so the inversions of two messages of one
 * length cancel out. A global function without branches: the verifier
 * walks it once per program, on one path. */
__attribute__((noinline)) __u32 crc32c_delta(__u32 d, __u32 n)
{
	__u32 k = n + 4;

	return crc32c_mul(d, crc32c_mul(crc32c_x8k[k & 0xff], crc32c_x2048k[(k >> 8) & 0xff]));
}

/* rewrite_sctp_ports replaces an SCTP packet's ports with n's and
 * updates its CRC32c by what the change does to it (crc32c_delta), as
 * conntrack's NAT recomputes it: ports are the first 4 bytes of the
 * packet's SCTP header, and the CRC covers that header (with the CRC
 * field as zero) and the chunks after it. The CRC is stored
 * little-endian: as a __u32 loaded on this little-endian target, it is
 * the CRC's value. */
static __always_inline int rewrite_sctp_ports(CTX *ctx, const struct pkt *p, const struct nat *n)
{
	__be16 ports[2] = { n->sport, n->dport };
	__be16 was[2] = { p->t.sport, p->t.dport };
	__u32 len = p->len - (p->l4off - ETH_HLEN); /* the SCTP packet's */
	__u32 from, to, crc;

	if (was[0] == ports[0] && was[1] == ports[1])
		return 0;
	if (len < 12 || len > 0xffff)
		return -1;
	__builtin_memcpy(&from, was, 4);
	__builtin_memcpy(&to, ports, 4);
	if (pk_load(ctx, p->csumoff, &crc, sizeof(crc)))
		return -1;
	crc ^= crc32c_delta(from ^ to, len - 4);
	if (pk_store(ctx, p->l4off, ports, sizeof(ports), 0))
		return -1;
	return pk_store(ctx, p->csumoff, &crc, sizeof(crc), 0);
}

/* rewrite makes the packet's addresses and ports those of n. */
static __always_inline int rewrite(CTX *ctx, const struct pkt *p, const struct nat *n)
{
	__u32 saddr = p->v6 ? ETH_HLEN + 8 : ETH_HLEN + 12;
	__u32 daddr = p->v6 ? ETH_HLEN + 24 : ETH_HLEN + 16;

	if (!same16(p->t.saddr, n->saddr) && rewrite_addr(ctx, p, saddr, p->t.saddr, n->saddr))
		return -1;
	if (!same16(p->t.daddr, n->daddr) && rewrite_addr(ctx, p, daddr, p->t.daddr, n->daddr))
		return -1;
	if (p->t.proto == IPPROTO_SCTP)
		return rewrite_sctp_ports(ctx, p, n);
	if (p->t.sport != n->sport && rewrite_port(ctx, p, p->l4off, p->t.sport, n->sport))
		return -1;
	if (p->t.dport != n->dport && rewrite_port(ctx, p, p->l4off + 2, p->t.dport, n->dport))
		return -1;
	return 0;
}

/* dec_ttl decrements the IPv4 TTL or the IPv6 hop limit of a packet
 * forwarded by the program (the stack does not see it). */
static __always_inline int dec_ttl(CTX *ctx, const struct pkt *p)
{
	__u8 ttl = p->ttl - 1;

	if (p->v6)
		return pk_store(ctx, ETH_HLEN + 7, &ttl, 1, 0);
	/* The TTL is the high byte of the 16-bit word it shares with the
	 * protocol. */
	__be16 old = bpf_htons((__u16)p->ttl << 8 | p->t.proto);
	__be16 new = bpf_htons((__u16)ttl << 8 | p->t.proto);
	if (pk_l3_csum(ctx, ETH_HLEN + 10, old, new, sizeof(new)))
		return -1;
	return pk_store(ctx, ETH_HLEN + 8, &ttl, 1, 0);
}

/* fib looks up the route of a packet from src to dst (ports and
 * protocol of p) arriving on the packet's interface: with len (not 0),
 * whether a packet of that length fits the route's MTU
 * (BPF_FIB_LKUP_RET_FRAG_NEEDED when not, without the interface). */
static __always_inline long fib(CTX *ctx, const struct pkt *p, const __be32 src[4], const __be32 dst[4],
				struct bpf_fib_lookup *f, __u16 len)
{
	__builtin_memset(f, 0, sizeof(*f));
	f->ifindex = pk_ingress(ctx);
	f->l4_protocol = p->t.proto;
	f->tot_len = len;
	if (p->v6) {
		f->family = AF_INET6;
		f->flowinfo = p->flow;
		copy16(f->ipv6_src, src);
		copy16(f->ipv6_dst, dst);
	} else {
		f->family = AF_INET;
		f->tos = p->tos;
		f->ipv4_src = src[3];
		f->ipv4_dst = dst[3];
	}
	return bpf_fib_lookup(ctx, f, sizeof(*f), 0);
}

#define TCP_FIN 0x01
#define TCP_SYN 0x02
#define TCP_RST 0x04
#define TCP_ACK 0x10

/* now_units is the time in the units of a reverse entry's seen (about
 * a second): the coarse clock (CLOCK_MONOTONIC_COARSE, a tick behind at
 * most) is plenty, and unlike bpf_ktime_get_ns it reads no clock
 * source. Read once per packet. */
static __always_inline __u16 now_units(void)
{
	return (__u16)(bpf_ktime_get_coarse_ns() >> 30);
}

/* note records a packet of a flow in its reverse entry r: its time
 * (now, now_units()), and a FIN (fin_bit: from which side) or RST. */
static __always_inline void note(struct nat *r, const struct pkt *p, __u8 fin_bit, __u16 now)
{
	__u8 state = r->state;

	if (p->t.proto == IPPROTO_TCP) {
		if (p->tcpflags & TCP_RST)
			state |= CT_RST;
		else if (p->tcpflags & TCP_FIN)
			state |= fin_bit;
	}
	/* Written only when it changes: every packet of the flow would
	 * otherwise dirty the entry's cache line. */
	if (r->seen != now)
		r->seen = now;
	if (r->state != state)
		r->state = state;
}

/* closed reports whether the flow of reverse entry r is over: a TCP
 * flow closed both ways or reset, a UDP flow idle for UDP_IDLE_SEC. A
 * flow by direct server return (dsr) shows this node only the client's
 * side: its FIN closes it. */
static __always_inline int closed(const struct nat *r, __u8 proto, int dsr)
{
	if (proto == IPPROTO_TCP && dsr)
		return (r->state & (CT_RST | CT_FIN_IN)) != 0;
	if (proto == IPPROTO_TCP)
		return (r->state & CT_RST) || (r->state & (CT_FIN_IN | CT_FIN_OUT)) == (CT_FIN_IN | CT_FIN_OUT);
	return (__u16)(now_units() - r->seen) >= UDP_IDLE_SEC;
}

/* V_TRANSLATE: what reply, tracked and frontend return when the packet
 * is to be translated to the rewrite they filled in (serve calls
 * translate once, for all three: one copy of it to verify). */
#define V_TRANSLATE 1000

/* reply finds the rewrite of a reply of a tracked flow: its source
 * becomes the frontend, its destination the client. */
static __always_inline int reply(CTX *ctx, const struct pkt *p, struct nat *out)
{
	struct nat *n = bpf_map_lookup_elem(&pk_nsrev, &p->t);

	if (!n)
		return -1;
	note(n, p, CT_FIN_OUT, now_units());
	*out = *n;
	out->flags = 0;
	return V_TRANSLATE;
}

/* reverse_of fills the reverse NAT entry of a flow from the client
 * tuple t translated to n, seen now (now_units()). */
static __always_inline void reverse_of(const struct tuple *t, const struct nat *n, struct tuple *rk, struct nat *rv,
				       __u16 now)
{
	copy16(rk->saddr, n->daddr);
	copy16(rk->daddr, n->saddr);
	rk->sport = n->dport;
	rk->dport = n->sport;
	rk->proto = t->proto;
	rk->pad[0] = 0;
	rk->pad[1] = 0;
	rk->pad[2] = 0;
	copy16(rv->saddr, t->daddr);
	copy16(rv->daddr, t->saddr);
	rv->sport = t->dport;
	rv->dport = t->sport;
	rv->state = 0;
	rv->flags = 0;
	rv->seen = now;
}

static __always_inline struct nsfe_val *lookup_fe(const struct pkt *p, __u8 variant);
__attribute__((noinline)) int still_in(__u32 id, __u32 count, const struct nsbe_val *ep);

/* stale reports whether the UDP flow p, translated to n, goes to an
 * endpoint that left its frontend (or a frontend that is gone): its
 * next datagram is a new flow, as kube-proxy's conntrack cleanup makes
 * it. TCP and SCTP flows keep their endpoint, as with kube-proxy. */
static __always_inline int stale(const struct pkt *p, const struct nat *n)
{
	if (p->t.proto != IPPROTO_UDP)
		return 0;
	struct nsfe_val *fe = lookup_fe(p, 0);
	if (!fe)
		return 1;
	struct nsbe_val ep = { .port = n->dport, .flags = 0 };
	copy16(ep.addr, n->daddr);
	if (still_in(fe->id, fe->count, &ep))
		return 0;
	if (!(fe->flags & NSFE_LOCAL))
		return 1;
	/* A pod's flow may have gone by the short circuit. */
	fe = lookup_fe(p, NSFE_KEY_SHORT);
	return !fe || !still_in(fe->id, fe->count, &ep);
}

/* tracked finds the rewrite of a packet of a flow in pk_nsct, restoring
 * its reverse entry if the LRU evicted it. A new TCP connection (a bare
 * SYN) on the tuple of a closed one is a new flow: it picks its endpoint
 * again, as conntrack reopens a closed connection's entry. */
static __always_inline int tracked(CTX *ctx, const struct pkt *p, struct nat *out)
{
	struct nat *e = bpf_map_lookup_elem(&pk_nsct, &p->t);
	struct tuple rk;
	struct nat rv;

	if (!e)
		return -1;
	struct nat n = *e;
	__u16 now = now_units();
	reverse_of(&p->t, &n, &rk, &rv, now);
	struct nat *r = bpf_map_lookup_elem(&pk_nsrev, &rk);
	int reopen = r && p->t.proto == IPPROTO_TCP && (p->tcpflags & (TCP_SYN | TCP_ACK)) == TCP_SYN && closed(r, IPPROTO_TCP, n.flags & NAT_DSR);
	if (reopen || stale(p, &n)) {
		bpf_map_delete_elem(&pk_nsct, &p->t);
		bpf_map_delete_elem(&pk_nsrev, &rk);
		return -1;
	}
	if (r)
		note(r, p, CT_FIN_IN, now);
	else
		bpf_map_update_elem(&pk_nsrev, &rk, &rv, BPF_ANY);
	*out = n;
	return V_TRANSLATE;
}

/* lookup_fe finds the frontend of p's destination: the address itself,
 * or a node port when it is a node address; its entry for outside
 * sources (variant 0) or its short circuit (NSFE_KEY_SHORT). */
static __always_inline struct nsfe_val *lookup_fe(const struct pkt *p, __u8 variant)
{
	struct nsfe_key k = {
		.addr = { p->t.daddr[0], p->t.daddr[1], p->t.daddr[2], p->t.daddr[3] },
		.port = p->t.dport,
		.proto = p->t.proto,
		.pad = variant,
	};
	struct nsfe_val *v = bpf_map_lookup_elem(&pk_nsfe, &k);

	if (v)
		return v;
	if (p->v6) {
		struct nsfe_key nk = {
			.addr = { k.addr[0], k.addr[1], k.addr[2], k.addr[3] },
			.port = 0,
			.proto = 0,
			.pad = 0,
		};
		if (!bpf_map_lookup_elem(&pk_node6, &nk))
			return NULL;
		k.addr[3] = 0;
	} else {
		__be32 a = k.addr[3];
		if (!bpf_map_lookup_elem(&pk_node4, &a))
			return NULL;
		k.addr[3] = 0; /* ::ffff:0.0.0.0 */
	}
	if (p->v6) {
		k.addr[0] = 0;
		k.addr[1] = 0;
		k.addr[2] = 0;
	}
	return bpf_map_lookup_elem(&pk_nsfe, &k);
}

/* tuple_hash hashes a flow's tuple as it arrives (the Go side's
 * tupleHash in the tests computes the same). */
static __always_inline __u64 tuple_hash(const struct tuple *t)
{
	__u64 h = mix64(((__u64)t->saddr[0] << 32 | t->saddr[1]) ^ 0x70726f78796b6974ULL);

	h = mix64(h ^ ((__u64)t->saddr[2] << 32 | t->saddr[3]));
	h = mix64(h ^ ((__u64)t->daddr[0] << 32 | t->daddr[1]));
	h = mix64(h ^ ((__u64)t->daddr[2] << 32 | t->daddr[3]));
	return mix64(h ^ ((__u64)t->sport << 32 | (__u64)t->dport << 16 | t->proto));
}

/* pick_slot returns the slot a new flow t picks in fe's group: the
 * Maglev table's entry for its hash, or a random one. */
static __always_inline __u32 pick_slot(const struct nsfe_val *fe, const struct tuple *t)
{
	__u32 size = ns_maglev_size;

	if ((fe->flags & NSFE_MAGLEV) && size) {
		__u32 *row = bpf_map_lookup_elem(&pk_nsmag, &fe->id);
		if (row) {
			__u32 i = (__u32)(tuple_hash(t) % size);
			/* Hide from the compiler that i < size, so that
			 * the check below stays for the verifier. */
			barrier_var(i);
			if (i < size)
				return row[i];
		}
	}
	return bpf_get_prandom_u32() % fe->count;
}

/* pick_random returns an endpoint of fe's group for a new flow t (by
 * Maglev or at random, pick_slot). */
static __always_inline int pick_random(const struct nsfe_val *fe, const struct tuple *t, struct nsbe_val *out,
				       __u32 *slot)
{
	struct nsbe_key k = { .id = fe->id, .slot = pick_slot(fe, t) };
	struct nsbe_val *b = bpf_map_lookup_elem(&pk_nsbe, &k);

	if (!b) {
		/* The slots are being rewritten; slot 0 is always there. */
		k.slot = 0;
		b = bpf_map_lookup_elem(&pk_nsbe, &k);
		if (!b)
			return -1;
	}
	*out = *b;
	*slot = k.slot;
	return 0;
}

static __always_inline int same_ep(const struct nsbe_val *a, const struct nsbe_val *b)
{
	return a->port == b->port && same16(a->addr, b->addr);
}

/* still_in reports whether ep is still one of the first count slots of
 * group id (looking at up to MAX_AFFINITY_SCAN slots). It is a global
 * function, which the verifier checks once with unknown arguments
 * instead of once on every path that reaches it: inlined, its loop was
 * about two thirds of the instructions the verifier processed. */
__attribute__((noinline)) int still_in(__u32 id, __u32 count, const struct nsbe_val *ep)
{
	if (!ep)
		return 0;
	for (__u32 i = 0; i < MAX_AFFINITY_SCAN; i++) {
		if (i >= count)
			break;
		struct nsbe_key k = { .id = id, .slot = i };
		struct nsbe_val *b = bpf_map_lookup_elem(&pk_nsbe, &k);
		if (b && same_ep(b, ep))
			return 1;
	}
	return 0;
}

/* pick returns the endpoint of a new flow t to fe: the client's
 * endpoint of the group while its affinity lasts, else pick_random's. */
static __always_inline int pick(const struct nsfe_val *fe, const struct tuple *t, struct nsbe_val *out)
{
	const __be32 *client = t->saddr;
	__u32 slot;

	if (!fe->affinity_sec)
		return pick_random(fe, t, out, &slot);
	struct nsaff_key ak = { .client = { client[0], client[1], client[2], client[3] }, .id = fe->id, .pad = 0 };
	struct nsaff_val *av = bpf_map_lookup_elem(&pk_nsaff, &ak);
	__u64 now = bpf_ktime_get_ns();
	__u64 timeout = (__u64)fe->affinity_sec * 1000000000ULL;

	if (av && now - av->ts <= timeout && still_in(fe->id, fe->count, &av->ep)) {
		av->ts = now;
		*out = av->ep;
		return 0;
	}
	if (pick_random(fe, t, out, &slot))
		return -1;
	struct nsaff_val nv = { .ts = now, .ep = *out };
	bpf_map_update_elem(&pk_nsaff, &ak, &nv, BPF_ANY);
	return 0;
}

/* snat_addr finds the node's address on the interface the route to
 * the endpoint leaves through. */
static __always_inline int snat_addr(CTX *ctx, const struct pkt *p, const __be32 ep[4], __be32 out[4])
{
	struct bpf_fib_lookup f;
	/* Without the MTU check, which would leave out the interface; tc's
	 * lookup still checks the packet against it and says so. */
	long rc = fib(ctx, p, p->t.saddr, ep, &f, 0);

	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH && rc != BPF_FIB_LKUP_RET_FRAG_NEEDED)
		return -1;
	struct ifaddr_key k = { .ifindex = f.ifindex, .family = p->v6 ? AF_INET6 : AF_INET };
	__be32 *a = bpf_map_lookup_elem(&pk_ifaddr, &k);
	if (!a)
		return -1;
	copy16(out, a);
	return 0;
}

/* take gives the SNAT port of the closed flow whose reverse entry is
 * at rk to the new flow p (translated to n): the old flow's tracking
 * entry goes (its client tuple is the reverse of its reverse entry's
 * rewrite), the reverse entry becomes the new flow's. */
static __always_inline int take(const struct pkt *p, struct nat *n, const struct tuple *rk, const struct nat *rv)
{
	struct nat *old = bpf_map_lookup_elem(&pk_nsrev, rk);

	if (old) {
		struct tuple ot = {
			.saddr = { old->daddr[0], old->daddr[1], old->daddr[2], old->daddr[3] },
			.daddr = { old->saddr[0], old->saddr[1], old->saddr[2], old->saddr[3] },
			.sport = old->dport,
			.dport = old->sport,
			.proto = p->t.proto,
		};
		bpf_map_delete_elem(&pk_nsct, &ot);
	}
	if (bpf_map_update_elem(&pk_nsrev, rk, rv, BPF_ANY))
		return -1;
	return bpf_map_update_elem(&pk_nsct, &p->t, n, BPF_ANY);
}

/* own_port is the SNAT port a client tuple t prefers: its own source
 * port when the range holds it, as conntrack keeps it; else the port
 * moved into the range by an offset that depends on the client's
 * address only. One client's ports thus map one to one onto the range
 * when its ephemeral range is no wider than the SNAT range, and the
 * same client tuple gets the same SNAT tuple each time it comes back.
 * That matters to the endpoint: it keeps a tuple it closed first in
 * TIME_WAIT for a minute and takes a new SYN on it only from the same
 * client tuple, whose sequence numbers and timestamps grow from one
 * connection to the next; a SYN of another client tuple carries
 * unrelated ones (the client's kernel offsets them per tuple: measured
 * on 6.18) and is refused (PAWS) about half of the time, and its client
 * waits a second for the retransmission. */
static __always_inline __be16 own_port(const struct tuple *t, __u32 span)
{
	__u32 port = bpf_ntohs(t->sport);
	__u32 a = t->saddr[0] ^ t->saddr[1] ^ t->saddr[2] ^ t->saddr[3];

	if (port >= snat_port_min && port <= snat_port_max)
		return t->sport;
	return bpf_htons((__u16)(snat_port_min + (port + (a >> 16) + (a & 0xffff)) % span));
}

/* same_client reports whether reverse entry r belongs to the client
 * tuple t (its rewrite restores t's source and destination). */
static __always_inline int same_client(const struct nat *r, const struct tuple *t)
{
	return r->dport == t->sport && r->sport == t->dport && same16(r->daddr, t->saddr) && same16(r->saddr, t->daddr);
}

/* claim records a new flow: its reverse entry (with a free SNAT port
 * when it is SNATed: the reverse tuple must be unique) and its
 * tracking entry. A SNATed flow first tries its own port (own_port),
 * which it also takes back from its own closed flow; then SNAT_TRIES
 * random ports; when none is free it takes the first of them whose flow
 * is over (closed). */
static __always_inline int claim(const struct pkt *p, struct nat *n, int snat)
{
	struct tuple rk;
	struct nat rv;
	__u32 span = (__u32)snat_port_max - snat_port_min + 1;
	__be16 reuse = 0;
	__u16 now = now_units();

	if (!snat) {
		reverse_of(&p->t, n, &rk, &rv, now);
		bpf_map_update_elem(&pk_nsrev, &rk, &rv, BPF_ANY);
		return bpf_map_update_elem(&pk_nsct, &p->t, n, BPF_ANY);
	}
	n->sport = own_port(&p->t, span);
	reverse_of(&p->t, n, &rk, &rv, now);
	if (bpf_map_update_elem(&pk_nsrev, &rk, &rv, BPF_NOEXIST) == 0)
		return bpf_map_update_elem(&pk_nsct, &p->t, n, BPF_ANY);
	struct nat *own = bpf_map_lookup_elem(&pk_nsrev, &rk);
	if (own && same_client(own, &p->t) && closed(own, p->t.proto, 0))
		return take(p, n, &rk, &rv);
	for (int i = 0; i < SNAT_TRIES; i++) {
		n->sport = bpf_htons((__u16)(snat_port_min + bpf_get_prandom_u32() % span));
		reverse_of(&p->t, n, &rk, &rv, now);
		if (bpf_map_update_elem(&pk_nsrev, &rk, &rv, BPF_NOEXIST) == 0)
			return bpf_map_update_elem(&pk_nsct, &p->t, n, BPF_ANY);
		if (!reuse) {
			struct nat *r = bpf_map_lookup_elem(&pk_nsrev, &rk);
			if (r && closed(r, p->t.proto, 0))
				reuse = n->sport;
		}
	}
	if (!reuse)
		return -1;
	n->sport = reuse;
	reverse_of(&p->t, n, &rk, &rv, now);
	return take(p, n, &rk, &rv);
}

/* admitted reports whether one of the source ranges of fe's group
 * holds src. */
static __always_inline int admitted(const struct nsfe_val *fe, const __be32 src[4])
{
	struct nsrange_key k = {
		.prefixlen = 32 + 128,
		.id = fe->id,
		.addr = { src[0], src[1], src[2], src[3] },
	};

	return bpf_map_lookup_elem(&pk_nsrange, &k) != NULL;
}

/* frontend finds the rewrite of the first packet of a flow to a
 * frontend (into out), or its verdict. From
 * outside (from_pod 0), a flow to a remote endpoint is SNATed to the
 * node unless the policy is Local; from a pod (a socket the connect
 * programs did not translate), only a flow to the pod itself
 * (hairpin) is. */
static __always_inline int frontend(CTX *ctx, const struct pkt *p, int from_pod, struct nat *out)
{
	struct nsfe_val *e = lookup_fe(p, 0);
	struct nsbe_val ep = {};
	struct nat n = {};
	struct nsfe_val v;
	const struct nsfe_val *fe = &v;
	int snat;

	if (!e)
		return -1;
	if ((e->flags & NSFE_RANGES) && !admitted(e, p->t.saddr))
		return V_DROP;
	v = *e;
	if (from_pod && (v.flags & NSFE_LOCAL)) {
		/* externalTrafficPolicy Local applies to sources outside
		 * the cluster: a pod goes by the short circuit. (A copy on
		 * the stack: two map value pointers would make the verifier
		 * walk the rest twice.) */
		struct nsfe_val *sc = lookup_fe(p, NSFE_KEY_SHORT);
		if (sc)
			v = *sc;
	}
	if (fe->count == 0 && (fe->flags & NSFE_DROP))
		return V_DROP;
	if (fe->count == 0)
		return reject(ctx, p);
	if (pick(fe, &p->t, &ep))
		return V_DROP;
	copy16(n.daddr, ep.addr);
	n.dport = ep.port;
	copy16(n.saddr, p->t.saddr);
	n.sport = p->t.sport;
	if (from_pod)
		snat = same16(ep.addr, p->t.saddr);
	else
		snat = !(fe->flags & NSFE_LOCAL) && !(ep.flags & NSBE_LOCAL);
	if (snat && !from_pod && (fe->flags & NSFE_DSR)) {
		snat = 0;
		n.flags = NAT_DSR;
	}
	if (snat && snat_addr(ctx, p, ep.addr, n.saddr))
		return V_DROP;
	if (claim(p, &n, snat))
		return V_DROP;
	*out = n;
	return V_TRANSLATE;
}

/* serve translates replies, tracked flows and new flows to frontends;
 * anything else goes on. */
static __always_inline int serve(CTX *ctx, int from_pod)
{
	struct pkt p = {};
	struct nat n = {};
	int v;

	v = parse(ctx, &p);
	if (v > 0)
		return related(ctx, &p);
	if (v < 0)
		return V_NEXT;
	if ((v = reply(ctx, &p, &n)) < 0 && (v = tracked(ctx, &p, &n)) < 0 && (v = frontend(ctx, &p, from_pod, &n)) < 0)
		return V_NEXT;
	if (v == V_TRANSLATE)
		return translate(ctx, &p, &n);
	return v;
}

#endif /* PROXYKIT_NODEPORT_H */
