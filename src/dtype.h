/* dtype.h: element types, conversions between them, and int8 quantization.
 *
 * Float conversions round to nearest even and keep NaN a NaN (quiet), inf
 * an inf and the sign of zero. int8 is symmetric absmax: for one row (one
 * token, one head, one layer) scale = max|x| / 127 and q = round(x / scale),
 * so dequantized x = q * scale is within scale / 2 of the input. fp8 codes
 * are floats of their own (fp8.h).
 */
#ifndef KVC_DTYPE_H
#define KVC_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvcache/types.h"

/* Bytes of one element, 0 for an unknown dtype. Inline, so that the
 * transfer geometry (layout.c) needs no conversion code in the client. */
static inline unsigned dtype_size(kvc_dtype_t t) {
  switch (t) {
  case KVC_DTYPE_F32: return 4;
  case KVC_DTYPE_F64: return 8;
  case KVC_DTYPE_F16: return 2;
  case KVC_DTYPE_BF16: return 2;
  case KVC_DTYPE_INT8: return 1;
  case KVC_DTYPE_FP8_E4M3: return 1;
  case KVC_DTYPE_FP8_E5M2: return 1;
  case KVC_DTYPE_Q8_0: /* blocks, not elements: dtype_row_bytes */
  case KVC_DTYPE_Q4_0: return 0;
  }
  return 0;
}

/* ggml's block formats: 32 values a block along the head dimension. */
#define DTYPE_QBLOCK 32u
static inline bool dtype_is_block(kvc_dtype_t t) {
  return t == KVC_DTYPE_Q8_0 || t == KVC_DTYPE_Q4_0;
}

/* Bytes of n values of t (n a multiple of DTYPE_QBLOCK for block formats;
 * 0 for an unknown dtype). */
static inline uint64_t dtype_row_bytes(kvc_dtype_t t, uint64_t n) {
  if (t == KVC_DTYPE_Q8_0) return n / DTYPE_QBLOCK * 34;
  if (t == KVC_DTYPE_Q4_0) return n / DTYPE_QBLOCK * 18;
  return n * dtype_size(t);
}
static inline bool dtype_valid(kvc_dtype_t t) { return dtype_row_bytes(t, DTYPE_QBLOCK) != 0; }

/* half.c */
uint16_t dtype_f32_to_f16(float f);
float dtype_f16_to_f32(uint16_t h);
uint16_t dtype_f32_to_bf16(float f);
float dtype_bf16_to_f32(uint16_t b);

/* Converts n elements between two float dtypes (f32, f64, f16, bf16, the fp8
 * ones: fp8.h, and from f32 / f16 / bf16 to ggml blocks and back: ggml.h, n
 * then a multiple of DTYPE_QBLOCK); the same dtype is a plain copy. Buffers
 * may be unaligned. */
void dtype_convert(void *dst, kvc_dtype_t dt, const void *src, kvc_dtype_t st, size_t n);
/* dtype_convert between element dtypes alone (f32, f64, f16, bf16, fp8; no
 * blocks), one element at a time (dtype.c): what ggml.c converts a block's
 * values with. */
void dtype_convert_elems(void *dst, kvc_dtype_t dt, const void *src, kvc_dtype_t st, size_t n);

/* True if all n elements of src (a float dtype) are finite. */
bool dtype_all_finite(const void *src, kvc_dtype_t st, size_t n);

/* Quantizes n elements of src (f32, f16 or bf16) into q; returns the scale.
 * A non-finite input yields a saturated, still well-defined row. */
float dtype_quantize(int8_t *q, const void *src, kvc_dtype_t st, size_t n);
/* dst is f32, possibly unaligned. */
void dtype_dequantize(void *dst, const int8_t *q, float scale, size_t n);

#endif
