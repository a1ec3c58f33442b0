// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Direct packet access for the north-south programs (xdp.c and
 * nodeport.c): bounds-checked pointers into the packet, copies in and
 * out of it, and the in-place checksum update. The including file
 * defines CTX (struct xdp_md or struct __sk_buff: both have data and
 * data_end). Direct access, not the byte and checksum helpers
 * (bpf_xdp_load_bytes, bpf_skb_store_bytes, bpf_l3_csum_replace...),
 * which cost a call, a memcpy and (on an skb) a writability check per
 * field: 18% of a forwarding CPU's time at XDP with the sink benchmark.
 *
 * The copies and the checksum's read and write claim no alignment of
 * the packet side: the IP header is at offset 14 (2 mod 4 from where
 * the frame starts) and IPv4 options move the L4 header, so the
 * compiler copies byte by byte.
 */
#ifndef PROXYKIT_DIRECT_H
#define PROXYKIT_DIRECT_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

/* PK_MAX_OFF bounds the offsets the datapath reads and writes at (the
 * headers: Ethernet, IPv4 with options or IPv6, the L4 ports and
 * checksum), so that the verifier can bound a pointer into the packet. */
#define PK_MAX_OFF 255

/* pk_ptr returns a pointer to the len bytes at off in the packet, or
 * NULL when they are not all there (in an skb: in its linear part). */
static __always_inline void *pk_ptr(CTX *ctx, __u32 off, __u32 len)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	void *at;

	if (off > PK_MAX_OFF)
		return NULL;
	at = data + off;
	if (at + len > end)
		return NULL;
	return at;
}

/* pk_put copies len bytes from from into the packet at off (pk_store's
 * meaning; flags are the helper's and unused: no checksum is
 * recomputed). */
static __always_inline long pk_put(CTX *ctx, __u32 off, const void *from, __u32 len, __u64 flags)
{
	void *at = pk_ptr(ctx, off, len);

	if (!at)
		return -1;
	__builtin_memcpy(at, from, len);
	return 0;
}

/* pk_csum updates the checksum at off as bpf_l3_csum_replace and
 * bpf_l4_csum_replace do for a packet without checksum offload: flags'
 * low bits are the size of the replaced field (2 or 4: from -> to), or
 * 0 when to is a bpf_csum_diff result; BPF_F_MARK_MANGLED_0 keeps a
 * zero (absent) UDP checksum and never writes one. Right for an IPv4
 * header's checksum (always complete) and for packets from the wire;
 * an skb's L4 checksum may be partial (offloaded), which only the
 * helper handles. */
static __always_inline long pk_csum(CTX *ctx, __u32 off, __u64 from, __u64 to, __u64 flags)
{
	void *at = pk_ptr(ctx, off, sizeof(__u16));
	__u16 check;
	__u64 s;

	if (!at)
		return -1;
	__builtin_memcpy(&check, at, sizeof(check));
	if ((flags & BPF_F_MARK_MANGLED_0) && check == 0)
		return 0;
	s = (__u16)~check;
	switch (flags & BPF_F_HDR_FIELD_MASK) {
	case 0:
		s += (__u32)to;
		break;
	case 2:
		s += (__u16)~from + (__u16)to;
		break;
	case 4:
		from = ~from;
		s += (from & 0xffff) + ((from >> 16) & 0xffff) + (to & 0xffff) + ((to >> 16) & 0xffff);
		break;
	default:
		return -1;
	}
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	check = (__u16)~s;
	if ((flags & BPF_F_MARK_MANGLED_0) && check == 0)
		check = 0xffff;
	__builtin_memcpy(at, &check, sizeof(check));
	return 0;
}

#endif
