// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * North-south service load balancing at XDP: the datapath of
 * nodeport.h, run on the node's external interfaces before the kernel
 * builds an skb. A packet the program can finish here, it translates and
 * sends: back out of the interface it came in on (XDP_TX, the usual case
 * of a node with one uplink toward clients and other nodes) or out of
 * another interface that takes XDP frames (XDP_REDIRECT through
 * pk_xdptx). Everything else it passes on untranslated to the tc program
 * behind it (pk_tc_ext), which finds the flow it recorded in the shared
 * maps: a route to a pod's veth, a neighbour not resolved yet, a
 * frontend without endpoints (the ICMP reject), a TTL about to expire.
 *
 * The program reads and writes the packet directly (direct.h), not
 * through the byte helpers. XDP has no checksum helpers: pk_l3_csum and
 * pk_l4_csum update the checksums in place (pk_csum, RFC 1624). That is right
 * for packets from the wire, whose checksums are complete; the kernel
 * hands XDP programs no packet with a partial (offloaded) checksum on a
 * physical device.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define CTX struct xdp_md
#define V_STACK XDP_PASS
#define V_DROP XDP_DROP
#define V_NEXT XDP_PASS

#include "direct.h"

/* pk_load copies len bytes at off out of the packet. Frames here are
 * linear where the headers are. */
static __always_inline long pk_load(struct xdp_md *ctx, __u32 off, void *to, __u32 len)
{
	void *at = pk_ptr(ctx, off, len);

	if (!at)
		return -1;
	__builtin_memcpy(to, at, len);
	return 0;
}

#define pk_store pk_put

/* XDP frames are linear where the headers are. */
#define pk_pull(ctx)
#define pk_l3_csum pk_csum
#define pk_l4_csum pk_csum

static __always_inline __be16 pk_proto(struct xdp_md *ctx)
{
	void *at = pk_ptr(ctx, 12, sizeof(__be16));
	__be16 proto = 0;

	if (at)
		__builtin_memcpy(&proto, at, sizeof(proto));
	return proto;
}

#define pk_ingress(ctx) ((ctx)->ingress_ifindex)

#include "nodeport.h"

/* The interfaces XDP frames may leave through (XDP_TX when it is the
 * one the packet came in on, XDP_REDIRECT else): the node's external
 * interfaces whose driver sends XDP frames. */
struct {
	__uint(type, BPF_MAP_TYPE_DEVMAP_HASH);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 256);
} pk_xdptx SEC(".maps");

/* What the program did with the packets it served, per CPU: the
 * indices below. */
#define XDP_STAT_TX 0
#define XDP_STAT_REDIRECT 1
#define XDP_STAT_PASS 2
#define XDP_STATS 3

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, XDP_STATS);
} pk_xdpstat SEC(".maps");

static __always_inline void count(__u32 stat)
{
	__u64 *v = bpf_map_lookup_elem(&pk_xdpstat, &stat);

	if (v)
		*v += 1;
}

/* translate sends p, translated to n, out of the interface its route
 * names when XDP frames can leave there; else it passes p on
 * untranslated (pk_tc_ext translates the flow it finds tracked). The
 * route is looked up before anything is rewritten. */
static __always_inline int translate(struct xdp_md *ctx, const struct pkt *p, const struct nat *n)
{
	struct bpf_fib_lookup f;
	__u32 out;

	if (p->ttl <= 1 || (n->flags & NAT_DSR) ||
	    fib(ctx, p, n->saddr, n->daddr, &f, p->len) != BPF_FIB_LKUP_RET_SUCCESS)
		goto pass;
	out = f.ifindex;
	if (!bpf_map_lookup_elem(&pk_xdptx, &out))
		goto pass;
	if (rewrite(ctx, p, n) || dec_ttl(ctx, p) || pk_store(ctx, 0, f.dmac, ETH_ALEN, 0) ||
	    pk_store(ctx, ETH_ALEN, f.smac, ETH_ALEN, 0))
		return XDP_ABORTED;
	if (out == ctx->ingress_ifindex) {
		count(XDP_STAT_TX);
		return XDP_TX;
	}
	count(XDP_STAT_REDIRECT);
	return bpf_redirect_map(&pk_xdptx, out, 0);
pass:
	count(XDP_STAT_PASS);
	return XDP_PASS;
}

/* reject leaves the ICMP error to pk_tc_ext. */
static __always_inline int reject(struct xdp_md *ctx, const struct pkt *p)
{
	count(XDP_STAT_PASS);
	return XDP_PASS;
}

/* related leaves ICMP errors to pk_tc_ext. */
static __always_inline int related(struct xdp_md *ctx, struct pkt *p)
{
	return XDP_PASS;
}

/* pk_xdp_ext: the node's external interfaces, in front of pk_tc_ext. */
SEC("xdp")
int pk_xdp_ext(struct xdp_md *ctx)
{
	return serve(ctx, 0);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
