/* dtype.c: float conversions with round-to-nearest-even, and int8 absmax. */
#include "dtype.h"

#include "fp8.h"
#include "ggml.h"

#include <math.h>
#include <string.h>

static uint32_t f32_bits(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  return x;
}

static float bits_f32(uint32_t x) {
  float f;
  memcpy(&f, &x, 4);
  return f;
}

uint16_t dtype_f32_to_f16(float f) {
  uint32_t x = f32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) /* NaN: keep the top payload bits, force quiet */
    return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  if (ax >= 0x477ff000u) /* >= 65520 rounds to inf; inf stays inf */
    return (uint16_t)(sign | 0x7c00u);
  if (ax < 0x38800000u) { /* below 2^-14: f16 subnormal or zero */
    /* v * 2^24 is exact and below 2^10; lrintf rounds to nearest even. */
    long r = lrintf(bits_f32(ax) * 16777216.0f);
    return (uint16_t)(sign | (uint32_t)r);
  }
  uint32_t h = ((((ax >> 23) - 112u) << 10) | ((ax >> 13) & 0x3ffu));
  uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* carry is correct */
  return (uint16_t)(sign | h);
}

float dtype_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    float v = (float)m * 5.9604644775390625e-8f; /* m * 2^-24, exact */
    return sign ? -v : v;
  }
  if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13));
  return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

uint16_t dtype_f32_to_bf16(float f) {
  uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

float dtype_bf16_to_f32(uint16_t b) { return bits_f32((uint32_t)b << 16); }

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

void dtype_convert(void *dst, kvc_dtype_t dt, const void *src, kvc_dtype_t st, size_t n) {
  if (dt == st) {
    memcpy(dst, src, dtype_row_bytes(st, n));
    return;
  }
  if (dtype_is_block(dt)) {
    ggml_encode(dst, dt, src, st, n, ISA_BEST);
    return;
  }
  if (dtype_is_block(st)) {
    ggml_decode(dst, dt, src, st, n, ISA_BEST);
    return;
  }
  if (fp8_is(dt) && !fp8_is(st)) {
    fp8_encode(dst, dt, src, st, n, 1.0f, ISA_BEST, false);
    return;
  }
  if (fp8_is(st) && !fp8_is(dt)) {
    fp8_decode(dst, dt, src, st, n, 1.0f, ISA_BEST);
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
