/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The architecture-neutral definitions: BPF programs are built with
 * -target bpfel, for which no <asm/posix_types.h> exists. */
#include <asm-generic/posix_types.h>
