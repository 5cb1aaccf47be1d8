/* dtype.c: element conversions between the float dtypes (one element at a
 * time), and int8 absmax. The halves are half.c's, the vector and block
 * conversions fp8.c's and ggml.c's, and dtype_convert, which picks among
 * them, convert.c's. */
#include "dtype.h"

#include "fp8.h"

#include <math.h>
#include <string.h>

/* Reads element i of a float buffer as f32 (f64 narrows, rounding to even). */
static float load_f32(const void *src, kvc_dtype_t st, size_t i) {
  const unsigned char *p = src;
  switch (st) {
  case KVC_DTYPE_F32: { float v; memcpy(&v, p + i * 4, 4); return v; }
  case KVC_DTYPE_F64: { double v; memcpy(&v, p + i * 8, 8); return (float)v; }
  case KVC_DTYPE_F16: { uint16_t v; memcpy(&v, p + i * 2, 2); return dtype_f16_to_f32(v); }
  case KVC_DTYPE_BF16: { uint16_t v; memcpy(&v, p + i * 2, 2); return dtype_bf16_to_f32(v); }
  case KVC_DTYPE_INT8: break;
  case KVC_DTYPE_FP8_E4M3:
  case KVC_DTYPE_FP8_E5M2: return fp8_to_f32(p[i], st);
  case KVC_DTYPE_Q8_0:
  case KVC_DTYPE_Q4_0: break; /* blocks: ggml.c */
  }
  return 0.0f;
}

static void store_from_f32(void *dst, kvc_dtype_t dt, size_t i, float v) {
  unsigned char *p = dst;
  switch (dt) {
  case KVC_DTYPE_F32: memcpy(p + i * 4, &v, 4); return;
  case KVC_DTYPE_F64: { double d = v; memcpy(p + i * 8, &d, 8); return; }
  case KVC_DTYPE_F16: { uint16_t h = dtype_f32_to_f16(v); memcpy(p + i * 2, &h, 2); return; }
  case KVC_DTYPE_BF16: { uint16_t h = dtype_f32_to_bf16(v); memcpy(p + i * 2, &h, 2); return; }
  case KVC_DTYPE_INT8: return;
  case KVC_DTYPE_FP8_E4M3:
  case KVC_DTYPE_FP8_E5M2: p[i] = fp8_from_f32(v, dt); return;
  case KVC_DTYPE_Q8_0:
  case KVC_DTYPE_Q4_0: return; /* blocks: ggml.c */
  }
}

void dtype_convert_elems(void *dst, kvc_dtype_t dt, const void *src, kvc_dtype_t st, size_t n) {
  if (dt == st) {
    memcpy(dst, src, dtype_row_bytes(st, n));
    return;
  }
  if (dt == KVC_DTYPE_F64 && st == KVC_DTYPE_F32) { /* widening is exact */
    for (size_t i = 0; i < n; i++) {
      double d = load_f32(src, st, i);
      memcpy((unsigned char *)dst + i * 8, &d, 8);
    }
    return;
  }
  for (size_t i = 0; i < n; i++) store_from_f32(dst, dt, i, load_f32(src, st, i));
}

bool dtype_all_finite(const void *src, kvc_dtype_t st, size_t n) {
  if (st == KVC_DTYPE_F64) {
    for (size_t i = 0; i < n; i++) {
      double d;
      memcpy(&d, (const unsigned char *)src + i * 8, 8);
      if (!isfinite(d)) return false;
    }
    return true;
  }
  for (size_t i = 0; i < n; i++)
    if (!isfinite(load_f32(src, st, i))) return false;
  return true;
}

float dtype_quantize(int8_t *q, const void *src, kvc_dtype_t st, size_t n) {
  float amax = 0.0f;
  for (size_t i = 0; i < n; i++) {
    float a = fabsf(load_f32(src, st, i));
    if (a > amax) amax = a; /* NaN compares false and is skipped */
  }
  if (amax == 0.0f || !isfinite(amax)) {
    memset(q, 0, n);
    return 0.0f;
  }
  float inv = 127.0f / amax;
  for (size_t i = 0; i < n; i++) {
    float v = load_f32(src, st, i) * inv;
    /* Clamp before rounding; a NaN (input changed under us) becomes 0. */
    v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v == v ? v : 0.0f;
    q[i] = (int8_t)lrintf(v);
  }
  return amax / 127.0f;
}

void dtype_dequantize(void *dst, const int8_t *q, float scale, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float v = (float)q[i] * scale;
    memcpy((unsigned char *)dst + i * 4, &v, 4);
  }
}
