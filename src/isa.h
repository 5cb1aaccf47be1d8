/* isa.h: which vector kernels a conversion runs, chosen at run time.
 *
 * The fp8 and ggml row kernels come in a scalar loop, an AVX2 (and F16C)
 * one and an AVX-512 one; every one gives the same bytes. A caller names
 * ISA_BEST; the tests name each in turn to compare them.
 */
#ifndef KVC_ISA_H
#define KVC_ISA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvcache/types.h"

typedef enum {
  ISA_BEST = 0,   /* the widest the CPU has */
  ISA_SCALAR = 1,
  ISA_AVX2 = 2,   /* eight f32 lanes: AVX2 and F16C */
  ISA_AVX512 = 3  /* sixteen: AVX-512 F, BW, VL, DQ (and F16C) */
} isa_t;

/* True if the CPU runs that kernel. */
bool isa_have(isa_t isa);

/* The kernel a row of dtype t runs when isa is asked for: the vector ones
 * take f32, f16 and bf16 rows (f64: scalar); one the CPU lacks falls back to
 * a narrower one, then to the scalar loop. */
isa_t isa_pick(isa_t isa, kvc_dtype_t t);

#endif
