/* ggml.c: q8_0 and q4_0 blocks, ggml's reference arithmetic in f32.
 *
 * Each block is read into 32 f32 values first (the same conversion a float
 * put uses), so f16 and bf16 rows quantize as their exact f32 values do.
 * With AVX-512 (chosen at run time) a block is two vectors of sixteen f32,
 * with AVX2 four of eight, and the same operations in the same order (no
 * fused multiply-add), so the bytes are the scalar loop's (tests/unit/ggml.c
 * compares all three); without either the scalar loop runs.
 */
#include "ggml.h"

#include <math.h>
#include <string.h>

#include "dtype.h"
#include "isa.h"

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

static bool check_scalar(const void *src, kvc_dtype_t st, size_t n, kvc_dtype_t fmt) {
  float x[QK];
  for (size_t b = 0; b < n / QK; b++) {
    dtype_convert_elems(x, KVC_DTYPE_F32, (const unsigned char *)src + dtype_row_bytes(st, b * QK),
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

static void encode_scalar(uint8_t *dst, kvc_dtype_t fmt, const void *src, kvc_dtype_t st,
                          size_t n) {
  float x[QK];
  uint64_t bb = block_bytes(fmt);
  for (size_t b = 0; b < n / QK; b++) {
    dtype_convert_elems(x, KVC_DTYPE_F32, (const unsigned char *)src + dtype_row_bytes(st, b * QK),
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

static void decode_scalar(void *dst, kvc_dtype_t dt, const uint8_t *src, kvc_dtype_t fmt,
                          size_t n) {
  float x[QK];
  uint64_t bb = block_bytes(fmt);
  for (size_t b = 0; b < n / QK; b++) {
    decode_block(x, src + b * bb, fmt);
    dtype_convert_elems((unsigned char *)dst + dtype_row_bytes(dt, b * QK), dt, x, KVC_DTYPE_F32, QK);
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define Z __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c")))
#define Y __attribute__((target("avx2,f16c")))

/* Sixteen values of a float row as f32 (exact for f16 and bf16). */
Z static inline __m512 load16(const unsigned char *s, kvc_dtype_t st) {
  if (st == KVC_DTYPE_F32) return _mm512_loadu_ps((const float *)s);
  __m256i h = _mm256_loadu_si256((const __m256i *)s);
  if (st == KVC_DTYPE_F16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* The largest |x| of n values, and whether one is NaN. */
Z static float amax_z(const unsigned char *s, kvc_dtype_t st, size_t n, bool *nan) {
  unsigned es = st == KVC_DTYPE_F32 ? 4 : 2;
  __m512 m = _mm512_setzero_ps();
  __mmask16 un = 0;
  for (size_t i = 0; i < n; i += 16) {
    __m512 a = _mm512_abs_ps(load16(s + i * es, st));
    un |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
    m = _mm512_max_ps(m, a);
  }
  *nan = un != 0;
  return _mm512_reduce_max_ps(m);
}

/* roundf of sixteen lanes: half away from zero (t - trunc(t) is exact). */
Z static inline __m512 roundf16(__m512 t) {
  __m512 r = _mm512_roundscale_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_abs_ps(_mm512_sub_ps(t, r));
  __mmask16 up = _mm512_cmp_ps_mask(f, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
  __m512 one = _mm512_or_ps(_mm512_set1_ps(1.0f),
                            _mm512_and_ps(t, _mm512_castsi512_ps(_mm512_set1_epi32(INT32_MIN))));
  return _mm512_mask_add_ps(r, up, r, one);
}

Z static void encode_block_z(uint8_t *y, const unsigned char *s, kvc_dtype_t st,
                             kvc_dtype_t fmt) {
  unsigned es = st == KVC_DTYPE_F32 ? 4 : 2;
  __m512 a = load16(s, st), b = load16(s + 16 * es, st);
  __m512 aa = _mm512_abs_ps(a), ab = _mm512_abs_ps(b);
  float amax = _mm512_reduce_max_ps(_mm512_max_ps(aa, ab)), d;
  if (fmt == KVC_DTYPE_Q8_0) {
    d = amax / 127.0f;
  } else { /* the first value of largest magnitude, with its sign */
    __m512 m = _mm512_set1_ps(amax);
    uint32_t hit = (uint32_t)_mm512_cmp_ps_mask(aa, m, _CMP_EQ_OQ) |
                   (uint32_t)_mm512_cmp_ps_mask(ab, m, _CMP_EQ_OQ) << 16;
    float x[QK];
    _mm512_storeu_ps(x, a);
    _mm512_storeu_ps(x + 16, b);
    d = (amax > 0.0f ? x[__builtin_ctz(hit)] : 0.0f) / -8.0f; /* zeros: 0 / -8, as ggml */
  }
  float id = d != 0.0f ? 1.0f / d : 0.0f;
  uint16_t h = dtype_f32_to_f16(d);
  memcpy(y, &h, 2);
  __m512 vid = _mm512_set1_ps(id);
  if (fmt == KVC_DTYPE_Q8_0) {
    __m128i qa = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(roundf16(_mm512_mul_ps(a, vid))));
    __m128i qb = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(roundf16(_mm512_mul_ps(b, vid))));
    _mm_storeu_si128((__m128i *)(y + 2), qa);
    _mm_storeu_si128((__m128i *)(y + 18), qb);
    return;
  }
  __m512 h85 = _mm512_set1_ps(8.5f);
  __m512i m15 = _mm512_set1_epi32(15);
  __m512i lo = _mm512_min_epi32(_mm512_cvttps_epi32(_mm512_add_ps(_mm512_mul_ps(a, vid), h85)), m15);
  __m512i hi = _mm512_min_epi32(_mm512_cvttps_epi32(_mm512_add_ps(_mm512_mul_ps(b, vid), h85)), m15);
  __m512i q = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 4));
  _mm_storeu_si128((__m128i *)(y + 2), _mm512_cvtepi32_epi8(q));
}

Z static void decode_block_z(unsigned char *d, kvc_dtype_t dt, const uint8_t *y, kvc_dtype_t fmt) {
  uint16_t h;
  memcpy(&h, y, 2);
  __m512 vd = _mm512_set1_ps(dtype_f16_to_f32(h));
  __m128i raw = _mm_loadu_si128((const __m128i *)(y + 2));
  __m512i qa, qb;
  if (fmt == KVC_DTYPE_Q8_0) {
    qa = _mm512_cvtepi8_epi32(raw);
    qb = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(y + 18)));
  } else {
    __m512i b = _mm512_cvtepu8_epi32(raw), e = _mm512_set1_epi32(8);
    qa = _mm512_sub_epi32(_mm512_and_si512(b, _mm512_set1_epi32(15)), e);
    qb = _mm512_sub_epi32(_mm512_srli_epi32(b, 4), e);
  }
  __m512 v[2] = {_mm512_mul_ps(_mm512_cvtepi32_ps(qa), vd),
                 _mm512_mul_ps(_mm512_cvtepi32_ps(qb), vd)};
  for (int k = 0; k < 2; k++) {
    if (dt == KVC_DTYPE_F32) {
      _mm512_storeu_ps((float *)d + 16 * k, v[k]);
    } else if (dt == KVC_DTYPE_F16) {
      _mm256_storeu_si256((__m256i *)(d + 32 * k), _mm512_cvtps_ph(v[k], _MM_FROUND_TO_NEAREST_INT));
    } else { /* bf16: round to nearest even; NaN as dtype_f32_to_bf16 */
      __m512i x = _mm512_castps_si512(v[k]);
      __m512i r = _mm512_add_epi32(
          x, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                              _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1))));
      __mmask16 nan = _mm512_cmp_ps_mask(v[k], v[k], _CMP_UNORD_Q);
      r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(x, _mm512_set1_epi32(0x400000)));
      _mm256_storeu_si256((__m256i *)(d + 32 * k), _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
    }
  }
}

/* ---- AVX2: the block as four vectors of eight ---- */

Y static inline __m256 load8y(const unsigned char *s, kvc_dtype_t st) {
  if (st == KVC_DTYPE_F32) return _mm256_loadu_ps((const float *)s);
  __m128i h = _mm_loadu_si128((const __m128i *)s);
  if (st == KVC_DTYPE_F16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

Y static inline __m256 absy(__m256 v) {
  return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
}

Y static inline float hmaxy(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

/* roundf of eight lanes, as roundf16. */
Y static inline __m256 roundf8(__m256 t) {
  __m256 r = _mm256_round_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  __m256 up = _mm256_cmp_ps(absy(_mm256_sub_ps(t, r)), _mm256_set1_ps(0.5f), _CMP_GE_OQ);
  __m256 one = _mm256_or_ps(_mm256_set1_ps(1.0f),
                            _mm256_and_ps(t, _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN))));
  return _mm256_add_ps(r, _mm256_and_ps(up, one));
}

/* Four vectors of int32 lanes (small) as 32 bytes, in order. */
Y static inline __m256i pack32y(__m256i a, __m256i b, __m256i c, __m256i d) {
  __m256i w = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
  return _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

Y static void encode_block_y(uint8_t *y, const unsigned char *s, kvc_dtype_t st,
                             kvc_dtype_t fmt) {
  unsigned es = st == KVC_DTYPE_F32 ? 4 : 2;
  __m256 v[4], a[4];
  for (int k = 0; k < 4; k++) v[k] = load8y(s + 8 * k * es, st), a[k] = absy(v[k]);
  float amax = hmaxy(_mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]))), d;
  if (fmt == KVC_DTYPE_Q8_0) {
    d = amax / 127.0f;
  } else { /* the first value of largest magnitude, with its sign */
    __m256 m = _mm256_set1_ps(amax);
    uint32_t hit = 0;
    for (int k = 0; k < 4; k++)
      hit |= (uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(a[k], m, _CMP_EQ_OQ)) << (8 * k);
    float x[QK];
    for (int k = 0; k < 4; k++) _mm256_storeu_ps(x + 8 * k, v[k]);
    d = (amax > 0.0f ? x[__builtin_ctz(hit)] : 0.0f) / -8.0f; /* zeros: 0 / -8, as ggml */
  }
  float id = d != 0.0f ? 1.0f / d : 0.0f;
  uint16_t h = dtype_f32_to_f16(d);
  memcpy(y, &h, 2);
  __m256 vid = _mm256_set1_ps(id);
  __m256i q[4];
  if (fmt == KVC_DTYPE_Q8_0) {
    for (int k = 0; k < 4; k++) q[k] = _mm256_cvtps_epi32(roundf8(_mm256_mul_ps(v[k], vid)));
    _mm256_storeu_si256((__m256i *)(y + 2), pack32y(q[0], q[1], q[2], q[3]));
    return;
  }
  __m256 h85 = _mm256_set1_ps(8.5f);
  __m256i m15 = _mm256_set1_epi32(15);
  for (int k = 0; k < 4; k++)
    q[k] = _mm256_min_epi32(_mm256_cvttps_epi32(_mm256_add_ps(_mm256_mul_ps(v[k], vid), h85)), m15);
  __m256i lo = _mm256_or_si256(q[0], _mm256_slli_epi32(q[2], 4));
  __m256i hi = _mm256_or_si256(q[1], _mm256_slli_epi32(q[3], 4));
  /* bytes 0..255 pack unsigned: 16 codes, then the same again */
  __m256i w = _mm256_packus_epi16(_mm256_packus_epi32(lo, hi), _mm256_setzero_si256());
  w = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 3, 6, 7));
  _mm_storeu_si128((__m128i *)(y + 2), _mm256_castsi256_si128(w));
}

/* Eight f32 lanes stored as dt (bf16 and f16 rounded to nearest even). */
Y static inline void store8y(unsigned char *d, kvc_dtype_t dt, __m256 v) {
  if (dt == KVC_DTYPE_F32) {
    _mm256_storeu_ps((float *)d, v);
  } else if (dt == KVC_DTYPE_F16) {
    _mm_storeu_si128((__m128i *)d, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  } else { /* NaN as dtype_f32_to_bf16 */
    __m256i x = _mm256_castps_si256(v);
    __m256i r = _mm256_add_epi32(
        x, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                            _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1))));
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(x, _mm256_set1_epi32(0x400000)), nan);
    __m256i w = _mm256_srli_epi32(r, 16);
    w = _mm256_permute4x64_epi64(_mm256_packus_epi32(w, w), 0x08);
    _mm_storeu_si128((__m128i *)d, _mm256_castsi256_si128(w));
  }
}

Y static void decode_block_y(unsigned char *d, kvc_dtype_t dt, const uint8_t *y, kvc_dtype_t fmt) {
  uint16_t h;
  memcpy(&h, y, 2);
  __m256 vd = _mm256_set1_ps(dtype_f16_to_f32(h));
  __m256i q[4];
  if (fmt == KVC_DTYPE_Q8_0) {
    for (int k = 0; k < 4; k++)
      q[k] = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(y + 2 + 8 * k)));
  } else {
    __m256i e = _mm256_set1_epi32(8), m = _mm256_set1_epi32(15);
    for (int k = 0; k < 2; k++) {
      __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(y + 2 + 8 * k)));
      q[k] = _mm256_sub_epi32(_mm256_and_si256(b, m), e);
      q[k + 2] = _mm256_sub_epi32(_mm256_srli_epi32(b, 4), e);
    }
  }
  unsigned es = dt == KVC_DTYPE_F32 ? 4 : 2;
  for (int k = 0; k < 4; k++)
    store8y(d + 8 * k * es, dt, _mm256_mul_ps(_mm256_cvtepi32_ps(q[k]), vd));
}
#endif

bool ggml_check(const void *src, kvc_dtype_t st, size_t n, kvc_dtype_t fmt) {
#if defined(__x86_64__) && defined(__GNUC__)
  /* Every block passes if the whole row's largest |x| gives a finite d. */
  if (isa_pick(ISA_BEST, st) == ISA_AVX512) {
    bool nan;
    float a = amax_z(src, st, n, &nan), lim = fmt == KVC_DTYPE_Q8_0 ? 127.0f : 8.0f;
    if (!nan && isfinite(dtype_f16_to_f32(dtype_f32_to_f16(a / lim)))) return true;
  }
#endif
  return check_scalar(src, st, n, fmt);
}

void ggml_encode(uint8_t *dst, kvc_dtype_t fmt, const void *src, kvc_dtype_t st, size_t n,
                 isa_t isa) {
  const unsigned char *s = src;
  uint64_t bb = block_bytes(fmt);
  switch (isa_pick(isa, st)) {
#if defined(__x86_64__) && defined(__GNUC__)
  case ISA_AVX512:
    for (size_t b = 0; b < n / QK; b++)
      encode_block_z(dst + b * bb, s + dtype_row_bytes(st, b * QK), st, fmt);
    return;
  case ISA_AVX2:
    for (size_t b = 0; b < n / QK; b++)
      encode_block_y(dst + b * bb, s + dtype_row_bytes(st, b * QK), st, fmt);
    return;
#endif
  default: encode_scalar(dst, fmt, src, st, n); return;
  }
}

void ggml_decode(void *dst, kvc_dtype_t dt, const uint8_t *src, kvc_dtype_t fmt, size_t n,
                 isa_t isa) {
  unsigned char *d = dst;
  uint64_t bb = block_bytes(fmt);
  switch (isa_pick(isa, dt)) {
#if defined(__x86_64__) && defined(__GNUC__)
  case ISA_AVX512:
    for (size_t b = 0; b < n / QK; b++)
      decode_block_z(d + dtype_row_bytes(dt, b * QK), dt, src + b * bb, fmt);
    return;
  case ISA_AVX2:
    for (size_t b = 0; b < n / QK; b++)
      decode_block_y(d + dtype_row_bytes(dt, b * QK), dt, src + b * bb, fmt);
    return;
#endif
  default: decode_scalar(dst, dt, src, fmt, n); return;
  }
}
