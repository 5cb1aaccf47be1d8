/* ggml.h: ggml's q8_0 and q4_0 blocks to and from floats.
 *
 * A block is 32 consecutive values of one head row (the head dimension is a
 * multiple of 32, so a block never straddles heads), laid out as ggml lays
 * out block_q8_0 and block_q4_0, little endian:
 *
 *   q8_0: [d: f16][qs: 32 x int8]                     34 bytes, x[j] = qs[j] * d
 *   q4_0: [d: f16][qs: 16 x uint8]                    18 bytes,
 *         qs[j] = (q[j] & 15) | q[j + 16] << 4,        x[j] = (q[j] - 8) * d
 *
 * Encoding is ggml's reference (quantize_row_q8_0_ref, quantize_row_q4_0_ref)
 * in f32: q8_0 d = amax / 127, q = roundf(x / d) (half away from zero, x
 * times 1/d); q4_0 d = max / -8 with max the value of largest magnitude
 * (the first of equal ones), q = min(15, (int8)(x / d + 8.5)). d is stored
 * rounded to f16 (nearest even); the codes come from the f32 d, as in ggml.
 * A block of zeros has d = 0 and codes 0 (q8_0) or 8 (q4_0).
 *
 * ggml leaves NaN and inf undefined (a cast of NaN to int8), and a block
 * whose d overflows f16 stores an infinite scale. kvcached refuses both
 * before anything changes (ggml_check, KVC_E_NONFINITE): a value must be
 * finite and each block's d must round to a finite f16 (amax below about
 * 127 x 65520 for q8_0, 8 x 65520 for q4_0). Decoding is q * d in f32, then
 * rounded to the buffer's dtype (nearest even). A block's bytes given as
 * they are (a put of the cache's dtype) are never looked at.
 */
#ifndef KVC_GGML_H
#define KVC_GGML_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "isa.h"
#include "kvcache/types.h"

/* True if the n values of src (f32, f16 or bf16; n a multiple of 32) can be
 * encoded as fmt: all finite, every block's scale a finite f16. */
bool ggml_check(const void *src, kvc_dtype_t st, size_t n, kvc_dtype_t fmt);

/* n values of src (dtype st: f32, f16, bf16) as n / 32 blocks of fmt at
 * dst, with the kernel isa (isa.h; every kernel gives the same bytes). */
void ggml_encode(uint8_t *dst, kvc_dtype_t fmt, const void *src, kvc_dtype_t st, size_t n,
                 isa_t isa);

/* n / 32 blocks of fmt at src as n values of dtype dt (f32, f16, bf16, f64). */
void ggml_decode(void *dst, kvc_dtype_t dt, const uint8_t *src, kvc_dtype_t fmt, size_t n,
                 isa_t isa);

#endif
