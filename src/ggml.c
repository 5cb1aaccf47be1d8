/* ggml.c: q8_0 and q4_0 blocks, ggml's reference arithmetic in f32.
 *
 * Each block is read into 32 f32 values first (the same conversion a float
 * put uses), so f16 and bf16 rows quantize as their exact f32 values do.
 * Decoding a q8_0 block of f32 is vectorized with AVX2 where the CPU has it.
 */
#include "ggml.h"

#include <math.h>
#include <string.h>

#include "dtype.h"

#define QK DTYPE_QBLOCK

static uint64_t block_bytes(kvc_dtype_t fmt) { return dtype_row_bytes(fmt, QK); }

/* The block's d (f32, before f16 rounding): q8_0 amax / 127; q4_0 the
 * value of largest magnitude / -8. */
static float block_d(const float *x, kvc_dtype_t fmt) {
  float amax = 0.0f, max = 0.0f;
  for (unsigned j = 0; j < QK; j++) {
    float a = fabsf(x[j]);
    if (amax < a) amax = a, max = x[j];
  }
  return fmt == KVC_DTYPE_Q8_0 ? amax / 127.0f : max / -8.0f;
}

bool ggml_check(const void *src, kvc_dtype_t st, size_t n, kvc_dtype_t fmt) {
  float x[QK];
  for (size_t b = 0; b < n / QK; b++) {
    dtype_convert(x, KVC_DTYPE_F32, (const unsigned char *)src + dtype_row_bytes(st, b * QK),
                  st, QK);
    for (unsigned j = 0; j < QK; j++)
      if (!isfinite(x[j])) return false;
    if (!isfinite(dtype_f16_to_f32(dtype_f32_to_f16(block_d(x, fmt))))) return false;
  }
  return true;
}

static void encode_q8_0(uint8_t *y, const float *x) {
  float d = block_d(x, KVC_DTYPE_Q8_0), id = d != 0.0f ? 1.0f / d : 0.0f;
  uint16_t h = dtype_f32_to_f16(d);
  memcpy(y, &h, 2);
  for (unsigned j = 0; j < QK; j++) y[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
}

static void encode_q4_0(uint8_t *y, const float *x) {
  float d = block_d(x, KVC_DTYPE_Q4_0), id = d != 0.0f ? 1.0f / d : 0.0f;
  uint16_t h = dtype_f32_to_f16(d);
  memcpy(y, &h, 2);
  for (unsigned j = 0; j < QK / 2; j++) {
    int8_t a = (int8_t)(x[j] * id + 8.5f), b = (int8_t)(x[QK / 2 + j] * id + 8.5f);
    uint8_t lo = (uint8_t)(a < 15 ? a : 15), hi = (uint8_t)(b < 15 ? b : 15);
    y[2 + j] = (uint8_t)(lo | hi << 4);
  }
}

void ggml_encode(uint8_t *dst, kvc_dtype_t fmt, const void *src, kvc_dtype_t st, size_t n) {
  float x[QK];
  uint64_t bb = block_bytes(fmt);
  for (size_t b = 0; b < n / QK; b++) {
    dtype_convert(x, KVC_DTYPE_F32, (const unsigned char *)src + dtype_row_bytes(st, b * QK),
                  st, QK);
    if (fmt == KVC_DTYPE_Q8_0) encode_q8_0(dst + b * bb, x);
    else encode_q4_0(dst + b * bb, x);
  }
}

/* The 32 values of one block as f32. */
static void decode_block(float *x, const uint8_t *y, kvc_dtype_t fmt) {
  uint16_t h;
  memcpy(&h, y, 2);
  float d = dtype_f16_to_f32(h);
  if (fmt == KVC_DTYPE_Q8_0) {
    for (unsigned j = 0; j < QK; j++) x[j] = (float)(int8_t)y[2 + j] * d;
    return;
  }
  for (unsigned j = 0; j < QK / 2; j++) {
    x[j] = (float)((y[2 + j] & 15) - 8) * d;
    x[QK / 2 + j] = (float)((y[2 + j] >> 4) - 8) * d;
  }
}

void ggml_decode(void *dst, kvc_dtype_t dt, const uint8_t *src, kvc_dtype_t fmt, size_t n) {
  float x[QK];
  uint64_t bb = block_bytes(fmt);
  for (size_t b = 0; b < n / QK; b++) {
    decode_block(x, src + b * bb, fmt);
    dtype_convert((unsigned char *)dst + dtype_row_bytes(dt, b * QK), dt, x, KVC_DTYPE_F32, QK);
  }
}
