/* fp8.h: OCP FP8 (E4M3 and E5M2) codes to and from f32, f16 and bf16.
 *
 *   E4M3: s eeee mmm, bias 7. No infinities; S.1111.111 is NaN; max 448
 *         (S.1111.110); subnormals m * 2^-9. torch.float8_e4m3fn.
 *   E5M2: s eeeee mm, bias 15, IEEE-like: S.11111.00 is inf, S.11111.mm
 *         (mm != 0) NaN; max 57344; subnormals m * 2^-16. The top byte of
 *         an f16. torch.float8_e5m2.
 *
 * A code's value times the transfer's scale (vLLM's k_scale / v_scale of a
 * layer, 1 by default) is the element: doc/design.md "Inside a page".
 *
 * Encoding rounds to nearest even and saturates: a finite value beyond the
 * format's max, and +-inf, become +-max (as vLLM's CUDA kernels convert,
 * __NV_SATFINITE); NaN becomes the format's NaN (E4M3 S.1111.111, E5M2
 * S.11111.10) with its sign; the sign of zero is kept. Decoding is exact
 * into f32, f16 and bf16 alike (every code is representable in all three).
 *
 * The row kernels are vectorized with AVX-512 or AVX2 (and F16C) when the
 * CPU has them, chosen at run time; a scalar loop otherwise. All give the
 * same bytes (tests/unit/fp8.c checks every code and every f16 value on
 * each).
 */
#ifndef KVC_FP8_H
#define KVC_FP8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "isa.h"
#include "kvcache/types.h"

static inline bool fp8_is(kvc_dtype_t t) {
  return t == KVC_DTYPE_FP8_E4M3 || t == KVC_DTYPE_FP8_E5M2;
}

/* One code of format fmt (an fp8 dtype) from f32, and back. */
uint8_t fp8_from_f32(float f, kvc_dtype_t fmt);
float fp8_to_f32(uint8_t c, kvc_dtype_t fmt);

/* n codes of fmt into dst from src of dtype st (f32, f16 or bf16; f64 goes
 * through f32): the codes of x / scale (vLLM's convention; scale 1: of x,
 * the division skipped). Buffers may be unaligned. A kernel the CPU lacks
 * falls back to a narrower one, then to the scalar loop. nt: dst is pool
 * memory nobody reads soon; the stores may go past the caches (ntcopy.h):
 * ntcopy_fence before the bytes are handed on. */
void fp8_encode(uint8_t *dst, kvc_dtype_t fmt, const void *src, kvc_dtype_t st, size_t n,
                float scale, isa_t isa, bool nt);
/* n codes of fmt from src into dst of dtype dt (f32, f16, bf16 or f64): each
 * code's value times scale in f32, rounded to dt (nearest even; exact for
 * scale 1). */
void fp8_decode(void *dst, kvc_dtype_t dt, const uint8_t *src, kvc_dtype_t fmt, size_t n,
                float scale, isa_t isa);

#endif
