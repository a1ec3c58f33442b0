// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * North-south service load balancing at tc, without netfilter (the
 * datapath itself is in nodeport.h). Translated packets are forwarded
 * with bpf_fib_lookup and bpf_redirect/bpf_redirect_neigh; a frontend
 * without endpoints is answered with ICMP port unreachable.
 *
 * pk_tc_ext runs at the ingress of the node's external interfaces,
 * pk_tc_pod at the ingress of every other interface (the node side of
 * pod veths); both translate replies, tracked flows and new flows to
 * frontends, and differ in when they SNAT (see frontend). With the XDP
 * program (xdp.c) in front, pk_tc_ext serves what it passes on.
 * pk_tc_out runs at the egress of the external interfaces, for the
 * node's own SCTP packets, which no socket program sees.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

#define CTX struct __sk_buff

#include "direct.h"

/* PK_HDRS is the most header bytes parse reads: Ethernet, IPv4 with
 * options, and the TCP header up to its flags. */
#define PK_HDRS (ETH_HLEN + 60 + 14)

/* pk_pull makes the headers parse reads (PK_HDRS, or the whole packet
 * when it is shorter) linear where they are not (rare: the stack hands
 * tc packets with their headers in the linear part), so that pk_load
 * finds them. */
static __always_inline void pk_pull(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	__u32 len = skb->len;

	if (len > PK_HDRS)
		len = PK_HDRS;
	if (data + len > end)
		bpf_skb_pull_data(skb, len);
}

/* pk_load reads the headers directly in the skb's linear part (pk_pull
 * made them linear), not through bpf_skb_load_bytes. The empty asm that
 * takes the destination's address keeps the copy in memory, as the
 * helper did: else the compiler holds the bytes (40 of an IPv6 header)
 * in registers, and their spills take pk_tc_ext past the 512-byte
 * stack. */
static __always_inline long pk_load(struct __sk_buff *skb, __u32 off, void *to, __u32 len)
{
	void *at = pk_ptr(skb, off, len);

	if (!at)
		return -1;
	__builtin_memcpy(to, at, len);
	asm volatile("" : : "r"(to));
	return 0;
}

/* The headers parse read are written directly too (pk_pull made them
 * linear; the verifier makes a cloned skb's head its own before the
 * program runs), and the IPv4 header checksum, which is always
 * complete, is updated in place. The L4 checksum goes through the
 * helper, which knows an offloaded (partial) one. */
#define pk_store pk_put
#define pk_l3_csum pk_csum
#define pk_l4_csum bpf_l4_csum_replace
#define pk_proto(ctx) ((ctx)->protocol)

/* own reports whether skb is one of the node's own packets, seen at
 * the egress by pk_tc_out: it arrived on no interface. */
static __always_inline int own(const struct __sk_buff *skb)
{
	return !skb->ingress_ifindex;
}

/* The interface a packet arrived on; for the node's own packets at
 * egress (pk_tc_out), the one it leaves by. Not written with own(): the
 * compiler would pick one of two context fields' addresses and load
 * through it, a context access the verifier refuses. */
#define pk_ingress(ctx) ((ctx)->ingress_ifindex ?: (ctx)->ifindex)
#define V_STACK TC_ACT_OK
#define V_DROP TC_ACT_SHOT
#define V_NEXT TC_ACT_UNSPEC

#include "nodeport.h"

/* send sends a packet out of the interface its route lookup (rc, f)
 * names: with the neighbour's address when the kernel knows it, else
 * resolving it (bpf_redirect_neigh); -1 for any other lookup result. */
static __always_inline int send(struct __sk_buff *skb, long rc, struct bpf_fib_lookup *f)
{
	if (rc == BPF_FIB_LKUP_RET_SUCCESS) {
		if (pk_store(skb, 0, f->dmac, ETH_ALEN, 0) || pk_store(skb, ETH_ALEN, f->smac, ETH_ALEN, 0))
			return TC_ACT_SHOT;
		return bpf_redirect(f->ifindex, 0);
	}
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH) {
		struct bpf_redir_neigh nh = {};

		/* The node's own packet (pk_tc_out) still holds the route
		 * it was sent by: a packet queued for the neighbour's
		 * resolution would leave by that route's neighbour, with
		 * its address. Without a next hop the kernel routes it
		 * again to its new destination, replacing the route. */
		if (own(skb))
			return bpf_redirect_neigh(f->ifindex, NULL, 0, 0);

		/* On return, the lookup's destination is the next hop. */
		if (f->family == AF_INET6) {
			nh.nh_family = AF_INET6;
			copy16(nh.ipv6_nh, f->ipv6_dst);
		} else {
			nh.nh_family = AF_INET;
			nh.ipv4_nh = f->ipv4_dst;
		}
		return bpf_redirect_neigh(f->ifindex, &nh, sizeof(nh), 0);
	}
	return -1;
}

/* forward sends a translated packet (whose tuple was p's, now n's;
 * rc and f are the route lookup from n's source to its destination)
 * out of the interface its route names (send). Anything else (a local
 * destination, no route, a TTL about to expire, a packet the route's
 * MTU cannot take whole) goes to the stack, which forwards, fragments
 * or answers it. */
static __always_inline int forward(struct __sk_buff *skb, const struct pkt *p, long rc, struct bpf_fib_lookup *f)
{
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH)
		return TC_ACT_OK;
	/* The node's own packet (pk_tc_out) is not forwarded: it keeps its
	 * TTL, as the stack's output path does. */
	if (!own(skb) && dec_ttl(skb, p))
		return TC_ACT_SHOT;
	return send(skb, rc, f);
}

/* route looks up the route of p translated to n (none when its TTL is
 * about to expire). */
static __always_inline long route(struct __sk_buff *skb, const struct pkt *p, const struct nat *n,
				  struct bpf_fib_lookup *f)
{
	if (p->ttl <= 1)
		return -1;
	return fib(skb, p, n->saddr, n->daddr, f, p->len);
}

static __always_inline int too_big(struct __sk_buff *skb, const struct pkt *p, __u32 mtu);
static __always_inline int encap(struct __sk_buff *skb, const struct pkt *p, const struct nat *n,
				 struct bpf_fib_lookup *f);

/* translate rewrites p to n and forwards it. A packet too big for the
 * route that may not be fragmented (IPv4 with DF, any IPv6) is answered,
 * untranslated, with ICMP fragmentation needed or ICMPv6 packet too
 * big, as the stack answers a packet it cannot forward: the sender
 * learns the path's MTU for its own tuple (a GSO packet is left to the
 * stack, which segments it). */
static __always_inline int translate(struct __sk_buff *skb, const struct pkt *p, const struct nat *n)
{
	struct bpf_fib_lookup f;
	long rc;

	if (n->flags & NAT_DSR)
		return encap(skb, p, n, &f);
	rc = route(skb, p, n, &f);

	if (rc == BPF_FIB_LKUP_RET_FRAG_NEEDED && skb->gso_segs <= 1 && (p->v6 || p->df))
		return too_big(skb, p, f.mtu_result);
	if (rewrite(skb, p, n))
		return TC_ACT_SHOT;
	return forward(skb, p, rc, &f);
}

#define ICMP_DEST_UNREACH 3
#define ICMP_PORT_UNREACH 3
#define ICMP_FRAG_NEEDED 4
#define ICMP_TIME_EXCEEDED 11
#define ICMP_PARAMETERPROB 12
#define ICMPV6_DEST_UNREACH 1
#define ICMPV6_PKT_TOOBIG 2
#define ICMPV6_TIME_EXCEED 3
#define ICMPV6_PARAMPROB 4
#define ICMPV6_PORT_UNREACH 4

static __always_inline __u16 csum_fold(__s64 sum)
{
	__u32 c = (__u32)sum;

	c = (c & 0xffff) + (c >> 16);
	c = (c & 0xffff) + (c >> 16);
	return (__u16)~c;
}

/* reply_eth turns the Ethernet header around: the error goes back to
 * the neighbour the packet came from. */
static __always_inline int reply_eth(struct __sk_buff *skb, __be16 proto)
{
	__u8 mac[12], out[14];

	if (bpf_skb_load_bytes(skb, 0, mac, sizeof(mac)))
		return -1;
	__builtin_memcpy(out, mac + 6, 6);
	__builtin_memcpy(out + 6, mac, 6);
	__builtin_memcpy(out + 12, &proto, 2);
	return bpf_skb_store_bytes(skb, 0, out, sizeof(out), 0);
}

/* back sends an ICMP error where the packet it answers came from: out
 * of the interface it arrived on or, for the node's own packet at
 * egress (pk_tc_out), into the node's stack, as if the interface had
 * received it. */
static __always_inline int back(struct __sk_buff *skb)
{
	if (own(skb))
		return bpf_redirect(skb->ifindex, BPF_F_INGRESS);
	return bpf_redirect(skb->ingress_ifindex, 0);
}

/* error4 turns an IPv4 packet without options into an ICMP error (type,
 * code and the header's second word, rest) from its destination to its
 * source, quoting its IP header and the first 8 bytes of its TCP or UDP
 * header, and sends it back where it came from. */
static __always_inline int error4(struct __sk_buff *skb, const struct pkt *p, __u8 type, __u8 code, __be32 rest)
{
	struct {
		__u8 type, code;
		__sum16 check;
		__be32 rest;
		__u32 quote[7]; /* IP header and 8 bytes */
	} icmp = { .type = type, .code = code, .rest = rest };
	struct iphdr4 ip = {
		.ver_ihl = 0x45,
		.tot_len = bpf_htons(sizeof(ip) + sizeof(icmp)),
		.ttl = 64,
		.proto = IPPROTO_ICMP,
		.saddr = p->t.daddr[3],
		.daddr = p->t.saddr[3],
	};

	if (p->l4off != ETH_HLEN + sizeof(ip))
		return TC_ACT_SHOT;
	if (bpf_skb_load_bytes(skb, ETH_HLEN, icmp.quote, sizeof(icmp.quote)))
		return TC_ACT_SHOT;
	ip.check = csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&ip, sizeof(ip), 0));
	icmp.check = csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&icmp, sizeof(icmp), 0));
	if (bpf_skb_change_tail(skb, ETH_HLEN + sizeof(ip) + sizeof(icmp), 0) ||
	    reply_eth(skb, bpf_htons(ETH_P_IP)) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN, &ip, sizeof(ip), 0) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN + sizeof(ip), &icmp, sizeof(icmp), 0))
		return TC_ACT_SHOT;
	return back(skb);
}

/* error6 is error4 for IPv6: an ICMPv6 error quoting the IPv6 header
 * and the first 8 bytes of the TCP or UDP header. */
static __always_inline int error6(struct __sk_buff *skb, const struct pkt *p, __u8 type, __u8 code, __be32 rest)
{
	struct {
		__u8 type, code;
		__sum16 check;
		__be32 rest;
		__u32 quote[12]; /* IPv6 header and 8 bytes */
	} icmp = { .type = type, .code = code, .rest = rest };
	struct iphdr6 ip = {
		.ver_tc_flow = bpf_htonl(0x60000000),
		.payload_len = bpf_htons(sizeof(icmp)),
		.nexthdr = IPPROTO_ICMPV6,
		.hop_limit = 64,
	};
	struct {
		__be32 saddr[4];
		__be32 daddr[4];
		__be32 len;
		__be32 nexthdr;
	} pseudo = { .len = bpf_htonl(sizeof(icmp)), .nexthdr = bpf_htonl(IPPROTO_ICMPV6) };

	copy16(ip.saddr, p->t.daddr);
	copy16(ip.daddr, p->t.saddr);
	copy16(pseudo.saddr, p->t.daddr);
	copy16(pseudo.daddr, p->t.saddr);
	if (bpf_skb_load_bytes(skb, ETH_HLEN, icmp.quote, sizeof(icmp.quote)))
		return TC_ACT_SHOT;
	__s64 sum = bpf_csum_diff(NULL, 0, (__be32 *)&pseudo, sizeof(pseudo), 0);
	icmp.check = csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&icmp, sizeof(icmp), sum));
	if (bpf_skb_change_tail(skb, ETH_HLEN + sizeof(ip) + sizeof(icmp), 0) ||
	    reply_eth(skb, bpf_htons(ETH_P_IPV6)) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN, &ip, sizeof(ip), 0) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN + sizeof(ip), &icmp, sizeof(icmp), 0))
		return TC_ACT_SHOT;
	return back(skb);
}

/* reject answers with ICMP or ICMPv6 port unreachable. */
static __always_inline int reject(struct __sk_buff *skb, const struct pkt *p)
{
	if (p->v6)
		return error6(skb, p, ICMPV6_DEST_UNREACH, ICMPV6_PORT_UNREACH, 0);
	return error4(skb, p, ICMP_DEST_UNREACH, ICMP_PORT_UNREACH, 0);
}

/* too_big answers with ICMP fragmentation needed or ICMPv6 packet too
 * big, naming the route's MTU. */
static __always_inline int too_big(struct __sk_buff *skb, const struct pkt *p, __u32 mtu)
{
	if (p->v6)
		return error6(skb, p, ICMPV6_PKT_TOOBIG, 0, bpf_htonl(mtu));
	return error4(skb, p, ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED, bpf_htonl(mtu & 0xffff));
}

/* is_error reports whether an ICMP (ICMPv6 with v6) type is an error
 * that quotes the packet it is about. */
static __always_inline int is_error(__u8 type, int v6)
{
	if (v6)
		return type == ICMPV6_DEST_UNREACH || type == ICMPV6_PKT_TOOBIG || type == ICMPV6_TIME_EXCEED ||
		       type == ICMPV6_PARAMPROB;
	return type == ICMP_DEST_UNREACH || type == ICMP_TIME_EXCEEDED || type == ICMP_PARAMETERPROB;
}

/* set_addr writes address a at off: 4 bytes (the last word) for IPv4,
 * 16 for IPv6; the checksum at csum (if any) covers it (l3: an IPv4
 * header's; else an ICMP one's, flags BPF_F_PSEUDO_HDR when the address
 * is in its pseudo-header). */
static __always_inline int set_addr(struct __sk_buff *skb, __u32 off, const __be32 old[4], const __be32 new[4], int v6,
				    __u32 csum, int l3, __u64 flags)
{
	__be32 o[4], n[4];
	__u32 len = v6 ? 16 : 4;
	__s64 diff;

	if (same16(old, new))
		return 0;
	copy16(o, old);
	copy16(n, new);
	diff = v6 ? bpf_csum_diff(o, 16, n, 16, 0) : bpf_csum_diff(&o[3], 4, &n[3], 4, 0);
	if (diff < 0)
		return -1;
	if (csum && (l3 ? bpf_l3_csum_replace(skb, csum, 0, diff, 0) : bpf_l4_csum_replace(skb, csum, 0, diff, flags)))
		return -1;
	return bpf_skb_store_bytes(skb, off, v6 ? (void *)n : (void *)&n[3], len, 0);
}

/* related translates an ICMP error about a packet of a tracked flow,
 * as conntrack translates a related packet, and forwards it. The error
 * quotes the packet as it was sent: either a packet of the flow toward
 * its endpoint (translated; the error comes from the endpoint's side
 * and goes to the client) or a reply toward the client (translated
 * back; the error comes from the client's side and goes to the
 * endpoint). The quoted packet's addresses and ports become those the
 * other side sent or saw, and the error's own addresses those of a
 * packet of the flow in its direction. The quoted TCP or UDP checksum
 * is left as it is (receivers do not check it); the quoted IPv4
 * header's is fixed, which leaves the ICMP checksum as it is. */
static __always_inline int related(struct __sk_buff *skb, struct pkt *p)
{
	__u8 type;
	__u32 in = p->l4off + 8; /* the quoted packet */
	__u32 icsum = p->l4off + 2;
	__u32 inl4, sa, da;
	struct tuple k = { .pad = { 0, 0, 0 } };
	struct nat to, *n;
	__be16 ports[2];

	if (bpf_skb_load_bytes(skb, p->l4off, &type, 1) || !is_error(type, p->v6))
		return TC_ACT_UNSPEC;
	/* k: the reverse of the quoted packet's tuple. */
	if (p->v6) {
		struct iphdr6 h;

		if (bpf_skb_load_bytes(skb, in, &h, sizeof(h)))
			return TC_ACT_UNSPEC;
		copy16(k.daddr, h.saddr);
		copy16(k.saddr, h.daddr);
		k.proto = h.nexthdr;
		inl4 = in + sizeof(h);
		sa = in + 8;
		da = in + 24;
	} else {
		struct iphdr4 h;

		if (bpf_skb_load_bytes(skb, in, &h, sizeof(h)) || (h.ver_ihl & 0xf) < 5)
			return TC_ACT_UNSPEC;
		set_mapped(k.daddr, h.saddr);
		set_mapped(k.saddr, h.daddr);
		k.proto = h.proto;
		inl4 = in + (h.ver_ihl & 0xf) * 4;
		sa = in + 12;
		da = in + 16;
	}
	if ((k.proto != IPPROTO_TCP && k.proto != IPPROTO_UDP && k.proto != IPPROTO_SCTP) ||
	    bpf_skb_load_bytes(skb, inl4, ports, sizeof(ports)))
		return TC_ACT_UNSPEC;
	k.dport = ports[0];
	k.sport = ports[1];
	/* The quoted packet went to the endpoint: k is its reply's tuple,
	 * whose rewrite (the frontend to the client) is what the quoted
	 * packet was before translation, turned around. Else it was a
	 * reply to the client: k is its flow's tuple, whose rewrite (the
	 * flow's SNAT source to the endpoint) is the reply as the endpoint
	 * sent it, turned around. */
	n = bpf_map_lookup_elem(&pk_nsrev, &k);
	if (!n)
		n = bpf_map_lookup_elem(&pk_nsct, &k);
	if (!n)
		return TC_ACT_UNSPEC;
	to = *n;
	/* to: the quoted packet's new destination (saddr, sport) and source
	 * (daddr, dport). */
	__be32 qs[4], qd[4];
	copy16(qs, k.daddr);
	copy16(qd, k.saddr);
	if (set_addr(skb, sa, qs, to.daddr, p->v6, p->v6 ? icsum : in + 10, !p->v6, 0) ||
	    set_addr(skb, da, qd, to.saddr, p->v6, p->v6 ? icsum : in + 10, !p->v6, 0))
		return TC_ACT_SHOT;
	if (ports[0] != to.dport &&
	    (bpf_l4_csum_replace(skb, icsum, ports[0], to.dport, sizeof(__be16)) ||
	     bpf_skb_store_bytes(skb, inl4, &to.dport, sizeof(__be16), 0)))
		return TC_ACT_SHOT;
	if (ports[1] != to.sport &&
	    (bpf_l4_csum_replace(skb, icsum, ports[1], to.sport, sizeof(__be16)) ||
	     bpf_skb_store_bytes(skb, inl4 + 2, &to.sport, sizeof(__be16), 0)))
		return TC_ACT_SHOT;
	/* The error itself: from the quoted packet's new destination to its
	 * new source. */
	struct nat out = {};
	copy16(out.saddr, to.saddr);
	copy16(out.daddr, to.daddr);
	__u32 osa = p->v6 ? ETH_HLEN + 8 : ETH_HLEN + 12;
	__u32 oda = p->v6 ? ETH_HLEN + 24 : ETH_HLEN + 16;
	if (set_addr(skb, osa, p->t.saddr, out.saddr, p->v6, p->v6 ? icsum : ETH_HLEN + 10, !p->v6, BPF_F_PSEUDO_HDR) ||
	    set_addr(skb, oda, p->t.daddr, out.daddr, p->v6, p->v6 ? icsum : ETH_HLEN + 10, !p->v6, BPF_F_PSEUDO_HDR))
		return TC_ACT_SHOT;
	struct bpf_fib_lookup f;
	long rc = route(skb, p, &out, &f);
	return forward(skb, p, rc, &f);
}

#define IPPROTO_IPIP 4
#define IPPROTO_IPV6 41

/* encap sends p, translated to n (DNAT alone: a flow by direct server
 * return), to its endpoint inside an outer IPv4 (IPv6) header from the
 * frontend's address to the endpoint's, which names the frontend's port
 * in its id (the low 16 bits of its flow label); the endpoint's node
 * unwraps it (decap). A packet that the route's MTU cannot take with
 * the outer header is answered as translate answers one, naming the MTU
 * left for it. Without a route (or with a TTL about to expire) the
 * packet goes to the stack translated and unwrapped. */
static __always_inline int encap(struct __sk_buff *skb, const struct pkt *p, const struct nat *n,
				 struct bpf_fib_lookup *f)
{
	__u32 hl = p->v6 ? sizeof(struct iphdr6) : sizeof(struct iphdr4);
	long rc = -1;

	if (p->ttl > 1)
		rc = fib(skb, p, p->t.daddr, n->daddr, f, p->len + hl);
	if (rc == BPF_FIB_LKUP_RET_FRAG_NEEDED && skb->gso_segs <= 1 && (p->v6 || p->df))
		return too_big(skb, p, f->mtu_result - hl);
	if (rewrite(skb, p, n))
		return TC_ACT_SHOT;
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH)
		return TC_ACT_OK;
	if (dec_ttl(skb, p))
		return TC_ACT_SHOT;
	if (p->v6) {
		struct iphdr6 h = {
			.ver_tc_flow = bpf_htonl(0x60000000) | (p->flow & bpf_htonl(0x0ff00000)) |
				       bpf_htonl(bpf_ntohs(p->t.dport)),
			.payload_len = bpf_htons(p->len),
			.nexthdr = IPPROTO_IPV6,
			.hop_limit = 64,
		};
		copy16(h.saddr, p->t.daddr);
		copy16(h.daddr, n->daddr);
		if (bpf_skb_adjust_room(skb, hl, BPF_ADJ_ROOM_MAC, BPF_F_ADJ_ROOM_ENCAP_L3_IPV6) ||
		    bpf_skb_store_bytes(skb, ETH_HLEN, &h, sizeof(h), 0))
			return TC_ACT_SHOT;
	} else {
		struct iphdr4 h = {
			.ver_ihl = 0x45,
			.tos = p->tos,
			.tot_len = bpf_htons(p->len + sizeof(h)),
			.id = p->t.dport,
			.frag_off = p->df ? bpf_htons(IP_DF) : 0,
			.ttl = 64,
			.proto = IPPROTO_IPIP,
			.saddr = p->t.daddr[3],
			.daddr = n->daddr[3],
		};
		h.check = csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&h, sizeof(h), 0));
		if (bpf_skb_adjust_room(skb, hl, BPF_ADJ_ROOM_MAC, BPF_F_ADJ_ROOM_ENCAP_L3_IPV4) ||
		    bpf_skb_store_bytes(skb, ETH_HLEN, &h, sizeof(h), 0))
			return TC_ACT_SHOT;
	}
	rc = send(skb, rc, f);
	return rc < 0 ? TC_ACT_SHOT : rc;
}

/* decap unwraps a packet another node's program wrapped for direct
 * server return (encap) when it goes to an endpoint of this node
 * (pk_nsloc; the inner destination is the outer one), records the
 * reverse entry that makes the endpoint's replies come from the
 * frontend the outer header names, and forwards the inner packet. -1
 * for any other packet. */
static __always_inline int decap(struct __sk_buff *skb)
{
	struct nsloc_key k = { .pad = 0 };
	struct tuple rk = { .pad = { 0, 0, 0 } };
	struct nat rv = { .state = 0, .flags = 0 };
	__be32 ep[4], client[4], fe[4];
	__be16 ports[2];
	__u32 hl;
	__u8 l4;

	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct iphdr4 o, i;

		if (bpf_skb_load_bytes(skb, ETH_HLEN, &o, sizeof(o)) || o.ver_ihl != 0x45 || o.proto != IPPROTO_IPIP ||
		    (o.frag_off & bpf_htons(IP_MF | IP_OFFSET)))
			return -1;
		if (bpf_skb_load_bytes(skb, ETH_HLEN + sizeof(o), &i, sizeof(i)) || i.ver_ihl != 0x45 ||
		    (i.frag_off & bpf_htons(IP_MF | IP_OFFSET)) || i.daddr != o.daddr)
			return -1;
		hl = sizeof(o);
		l4 = i.proto;
		set_mapped(ep, i.daddr);
		set_mapped(client, i.saddr);
		set_mapped(fe, o.saddr);
		rv.sport = o.id;
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct iphdr6 o, i;

		if (bpf_skb_load_bytes(skb, ETH_HLEN, &o, sizeof(o)) || (bpf_ntohl(o.ver_tc_flow) >> 28) != 6 ||
		    o.nexthdr != IPPROTO_IPV6)
			return -1;
		if (bpf_skb_load_bytes(skb, ETH_HLEN + sizeof(o), &i, sizeof(i)) || (bpf_ntohl(i.ver_tc_flow) >> 28) != 6 ||
		    !same16(i.daddr, o.daddr))
			return -1;
		hl = sizeof(o);
		l4 = i.nexthdr;
		copy16(ep, i.daddr);
		copy16(client, i.saddr);
		copy16(fe, o.saddr);
		rv.sport = bpf_htons((__u16)bpf_ntohl(o.ver_tc_flow));
	} else {
		return -1;
	}
	copy16(k.addr, ep);
	copy16(rk.saddr, ep);
	copy16(rk.daddr, client);
	copy16(rv.saddr, fe);
	copy16(rv.daddr, client);
	if ((l4 != IPPROTO_TCP && l4 != IPPROTO_UDP && l4 != IPPROTO_SCTP) ||
	    bpf_skb_load_bytes(skb, ETH_HLEN + 2 * hl, ports, sizeof(ports)))
		return -1;
	k.port = ports[1];
	if (!bpf_map_lookup_elem(&pk_nsloc, &k))
		return -1;
	rk.sport = ports[1];
	rk.dport = ports[0];
	rk.proto = l4;
	rv.dport = ports[0];
	struct nat *r = bpf_map_lookup_elem(&pk_nsrev, &rk);
	if (!r || r->sport != rv.sport || !same16(r->saddr, rv.saddr)) {
		rv.seen = now_units();
		if (bpf_map_update_elem(&pk_nsrev, &rk, &rv, BPF_ANY))
			return TC_ACT_SHOT;
	}
	if (bpf_skb_adjust_room(skb, -(__s32)hl, BPF_ADJ_ROOM_MAC, 0))
		return TC_ACT_SHOT;
	struct pkt p = {};
	if (parse(skb, &p) != 0)
		return TC_ACT_OK;
	struct bpf_fib_lookup f;
	long rc = p.ttl > 1 ? fib(skb, &p, p.t.saddr, p.t.daddr, &f, p.len) : -1;
	return forward(skb, &p, rc, &f);
}

/* wrapped reports whether skb is an IPIP or IP6IP6 packet (which serve
 * would pass on untouched). */
static __always_inline int wrapped(struct __sk_buff *skb)
{
	__u8 proto;

	if (skb->protocol == bpf_htons(ETH_P_IP))
		return !bpf_skb_load_bytes(skb, ETH_HLEN + 9, &proto, 1) && proto == IPPROTO_IPIP;
	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return !bpf_skb_load_bytes(skb, ETH_HLEN + 6, &proto, 1) && proto == IPPROTO_IPV6;
	return 0;
}

/* pk_tc_ext: the ingress of the node's external interfaces. Wrapped
 * packets go to decap alone and everything else to serve alone, so
 * that the verifier walks each once (serve after decap's every exit
 * came within 6% of its instruction limit). */
SEC("tc")
int pk_tc_ext(struct __sk_buff *skb)
{
	if (wrapped(skb)) {
		int v = decap(skb);

		return v >= 0 ? v : TC_ACT_UNSPEC;
	}
	return serve(skb, 0);
}

/* pk_tc_pod: the ingress of every other interface (the node side of
 * pod veths): replies of flows to pods, and flows of pod sockets that
 * the connect programs did not translate. */
SEC("tc")
int pk_tc_pod(struct __sk_buff *skb)
{
	return serve(skb, 1);
}

/* pk_tc_out: the egress of the node's external interfaces, where the
 * node's own packets to a cluster IP (or any frontend) leave by the
 * route toward it (the default route, as with kube-proxy, whose rules
 * see them on the output path). Only the node's own SCTP packets are
 * served: the socket programs translate its TCP and UDP sockets, and
 * forwarded packets (which arrived on an interface) were served at its
 * ingress. They are translated as a pod's (no SNAT; the short circuit
 * of externalTrafficPolicy Local), routed again and sent where the
 * endpoint's route leads; the replies come back through pk_tc_pod or
 * pk_tc_ext. */
SEC("tc")
int pk_tc_out(struct __sk_buff *skb)
{
	struct pkt p = {};
	struct nat n = {};
	int v;

	if (!own(skb) || parse(skb, &p) != 0 || p.t.proto != IPPROTO_SCTP)
		return TC_ACT_UNSPEC;
	if ((v = tracked(skb, &p, &n)) < 0 && (v = frontend(skb, &p, 1, &n)) < 0)
		return TC_ACT_UNSPEC;
	if (v == V_TRANSLATE)
		return translate(skb, &p, &n);
	return v;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
