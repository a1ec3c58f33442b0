/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The architecture-neutral definitions: BPF programs are built with
 * -target bpfel, for which no <asm/bitsperlong.h> exists. */
#include <asm-generic/bitsperlong.h>
