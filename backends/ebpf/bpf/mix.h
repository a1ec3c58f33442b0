/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * mix64, shared by the socket programs (sock.c) and the north-south
 * datapath (nodeport.h) for their Maglev hashes.
 */
#ifndef PROXYKIT_MIX_H
#define PROXYKIT_MIX_H

#include <linux/types.h>

/* mix64 is the finalizer of splitmix64: every input bit affects every
 * output bit. */
static __always_inline __u64 mix64(__u64 x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebULL;
	x ^= x >> 31;
	return x;
}

#endif /* PROXYKIT_MIX_H */
