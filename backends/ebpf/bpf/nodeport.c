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
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

#define CTX struct __sk_buff
#define pk_load bpf_skb_load_bytes
#define pk_store bpf_skb_store_bytes
#define pk_l3_csum bpf_l3_csum_replace
#define pk_l4_csum bpf_l4_csum_replace
#define pk_proto(ctx) ((ctx)->protocol)
#define pk_ingress(ctx) ((ctx)->ingress_ifindex)
#define V_STACK TC_ACT_OK
#define V_DROP TC_ACT_SHOT
#define V_NEXT TC_ACT_UNSPEC

#include "nodeport.h"

/* forward sends a translated packet (whose tuple was p's, now n's)
 * out of the interface its route names: with the neighbour's address
 * when the kernel knows it, else resolving it (bpf_redirect_neigh).
 * Anything else (a local destination, no route, a TTL about to
 * expire) goes to the stack, which forwards or answers it. */
static __always_inline int forward(struct __sk_buff *skb, const struct pkt *p, const struct nat *n)
{
	struct bpf_fib_lookup f;
	long rc;

	if (p->ttl <= 1)
		return TC_ACT_OK;
	rc = fib(skb, p, n->saddr, n->daddr, &f);
	if (rc == BPF_FIB_LKUP_RET_SUCCESS) {
		if (dec_ttl(skb, p))
			return TC_ACT_SHOT;
		if (bpf_skb_store_bytes(skb, 0, f.dmac, ETH_ALEN, 0) ||
		    bpf_skb_store_bytes(skb, ETH_ALEN, f.smac, ETH_ALEN, 0))
			return TC_ACT_SHOT;
		return bpf_redirect(f.ifindex, 0);
	}
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH) {
		struct bpf_redir_neigh nh = {};

		if (dec_ttl(skb, p))
			return TC_ACT_SHOT;
		/* On return, the lookup's destination is the next hop. */
		if (f.family == AF_INET6) {
			nh.nh_family = AF_INET6;
			copy16(nh.ipv6_nh, f.ipv6_dst);
		} else {
			nh.nh_family = AF_INET;
			nh.ipv4_nh = f.ipv4_dst;
		}
		return bpf_redirect_neigh(f.ifindex, &nh, sizeof(nh), 0);
	}
	return TC_ACT_OK;
}

/* translate rewrites p to n and forwards it. */
static __always_inline int translate(struct __sk_buff *skb, const struct pkt *p, const struct nat *n)
{
	if (rewrite(skb, p, n))
		return TC_ACT_SHOT;
	return forward(skb, p, n);
}

#define IPPROTO_ICMP 1
#define IPPROTO_ICMPV6 58
#define ICMP_DEST_UNREACH 3
#define ICMP_PORT_UNREACH 3
#define ICMPV6_DEST_UNREACH 1
#define ICMPV6_PORT_UNREACH 4

static __always_inline __u16 csum_fold(__s64 sum)
{
	__u32 c = (__u32)sum;

	c = (c & 0xffff) + (c >> 16);
	c = (c & 0xffff) + (c >> 16);
	return (__u16)~c;
}

/* reply_eth turns the Ethernet header around: the reject goes back to
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

/* reject4 turns an IPv4 packet without options into an ICMP port
 * unreachable error from its destination to its source, quoting its IP
 * header and the first 8 bytes of its TCP or UDP header. */
static __always_inline int reject4(struct __sk_buff *skb, const struct pkt *p)
{
	struct {
		__u8 type, code;
		__sum16 check;
		__u32 unused;
		__u32 quote[7]; /* IP header and 8 bytes */
	} icmp = { .type = ICMP_DEST_UNREACH, .code = ICMP_PORT_UNREACH };
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
	return bpf_redirect(skb->ingress_ifindex, 0);
}

/* reject6 is reject4 for IPv6: ICMPv6 port unreachable, quoting the IPv6
 * header and the first 8 bytes of the TCP or UDP header. */
static __always_inline int reject6(struct __sk_buff *skb, const struct pkt *p)
{
	struct {
		__u8 type, code;
		__sum16 check;
		__u32 unused;
		__u32 quote[12]; /* IPv6 header and 8 bytes */
	} icmp = { .type = ICMPV6_DEST_UNREACH, .code = ICMPV6_PORT_UNREACH };
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
	return bpf_redirect(skb->ingress_ifindex, 0);
}

/* reject answers with ICMP or ICMPv6 port unreachable. */
static __always_inline int reject(struct __sk_buff *skb, const struct pkt *p)
{
	return p->v6 ? reject6(skb, p) : reject4(skb, p);
}

/* pk_tc_ext: the ingress of the node's external interfaces. */
SEC("tc")
int pk_tc_ext(struct __sk_buff *skb)
{
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

char LICENSE[] SEC("license") = "Dual BSD/GPL";
