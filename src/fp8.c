/* fp8.c: FP8 codes from and to floats, one element or a row at a time.
 *
 * Both directions work on f32 bits with the format's parameters, so the
 * scalar loop and the AVX2 kernel are the same arithmetic:
 *   encode |x| >= max (and inf): the max code; |x| below the smallest
 *   normal: the float sum |x| + magic, whose ulp is the subnormal step,
 *   rounds to nearest even and leaves the code in the low bits; otherwise
 *   the f32 bits rounded to nearest even at the format's mantissa width,
 *   rebiased (a carry into the exponent is the right answer).
 *   decode: normals are the code's bits shifted into an f32 and rebiased;
 *   subnormals m * step; the exponent-all-ones codes inf or a quiet NaN
 *   keeping the code's mantissa.
 */
#include "fp8.h"

#include <string.h>

#include "dtype.h"

typedef struct fmt {
  uint32_t shift;      /* 23 - mantissa bits */
  uint32_t ebias;      /* (127 - bias) << mantissa bits */
  uint32_t min_normal; /* f32 bits of the smallest normal */
  float magic;         /* 2^(23 + log2(subnormal step)) */
  uint32_t max_bits;   /* f32 bits of the largest finite value */
  uint32_t max_code, nan_code;
  uint32_t sub_lim;    /* codes (without sign) below it are subnormal */
  float step;          /* value of subnormal code 1 */
  uint32_t spec_lo;    /* codes from it up are inf or NaN */
  uint32_t inf_code;   /* the inf code, 0x100 if none */
} fmt_t;

static const fmt_t E4M3 = {20, 960, 0x3c800000u, 16384.0f, 0x43e00000u, 0x7e, 0x7f,
                           8, 0x1p-9f, 0x7f, 0x100};
static const fmt_t E5M2 = {21, 448, 0x38800000u, 128.0f, 0x47600000u, 0x7b, 0x7e,
                           4, 0x1p-16f, 0x7c, 0x7c};

static const fmt_t *fmt_of(kvc_dtype_t t) { return t == KVC_DTYPE_FP8_E5M2 ? &E5M2 : &E4M3; }

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

static uint8_t encode1(float f, const fmt_t *p) {
  uint32_t x = f32_bits(f), sign = (x >> 24) & 0x80u, ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return (uint8_t)(sign | p->nan_code);
  if (ax >= p->max_bits) return (uint8_t)(sign | p->max_code);
  if (ax < p->min_normal)
    return (uint8_t)(sign | (f32_bits(bits_f32(ax) + p->magic) - f32_bits(p->magic)));
  uint32_t r = ax + ((1u << (p->shift - 1)) - 1) + ((ax >> p->shift) & 1u);
  return (uint8_t)(sign | ((r >> p->shift) - p->ebias));
}

static float decode1(uint8_t c, const fmt_t *p) {
  uint32_t rest = c & 0x7fu, sign = (uint32_t)(c & 0x80u) << 24;
  float v;
  if (rest >= p->spec_lo)
    v = bits_f32(0x7f800000u | ((rest & ((1u << (23 - p->shift)) - 1)) << p->shift) |
                 (rest == p->inf_code ? 0 : 0x400000u));
  else if (rest < p->sub_lim)
    v = (float)rest * p->step;
  else
    v = bits_f32((rest << p->shift) + (p->ebias << p->shift));
  return bits_f32(f32_bits(v) | sign);
}

uint8_t fp8_from_f32(float f, kvc_dtype_t fmt) { return encode1(f, fmt_of(fmt)); }
float fp8_to_f32(uint8_t c, kvc_dtype_t fmt) { return decode1(c, fmt_of(fmt)); }

/* Element i of a float row as f32 (f64 narrows, rounding to even). */
static float load1(const unsigned char *s, kvc_dtype_t st, size_t i) {
  switch (st) {
  case KVC_DTYPE_F16: { uint16_t v; memcpy(&v, s + 2 * i, 2); return dtype_f16_to_f32(v); }
  case KVC_DTYPE_BF16: { uint16_t v; memcpy(&v, s + 2 * i, 2); return dtype_bf16_to_f32(v); }
  case KVC_DTYPE_F64: { double v; memcpy(&v, s + 8 * i, 8); return (float)v; }
  default: { float v; memcpy(&v, s + 4 * i, 4); return v; }
  }
}

static void store1(unsigned char *d, kvc_dtype_t dt, size_t i, float v) {
  switch (dt) {
  case KVC_DTYPE_F16: { uint16_t h = dtype_f32_to_f16(v); memcpy(d + 2 * i, &h, 2); return; }
  case KVC_DTYPE_BF16: { uint16_t h = dtype_f32_to_bf16(v); memcpy(d + 2 * i, &h, 2); return; }
  case KVC_DTYPE_F64: { double w = v; memcpy(d + 8 * i, &w, 8); return; }
  default: memcpy(d + 4 * i, &v, 4); return;
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define AVX2 __attribute__((target("avx2,f16c")))

/* The format's constants as vectors, made once a row (the stores of a row
 * may alias anything, so constants read through a pointer would be
 * reloaded every step). */
typedef struct vk {
  __m256i abs, sgn, inf, max, half, one, ebias, minn, nan, mant, quiet, infc, sublim, speclo,
      nbias;
  __m256 magic, step;
  __m128i sh;
} vk_t;

AVX2 static vk_t vk_of(const fmt_t *p) {
  vk_t k;
  k.abs = _mm256_set1_epi32(0x7fffffff);
  k.sgn = _mm256_set1_epi32(0x80);
  k.inf = _mm256_set1_epi32(0x7f800000);
  k.max = _mm256_set1_epi32((int)p->max_bits);
  k.half = _mm256_set1_epi32((int)((1u << (p->shift - 1)) - 1));
  k.one = _mm256_set1_epi32(1);
  k.ebias = _mm256_set1_epi32((int)p->ebias);
  k.minn = _mm256_set1_epi32((int)p->min_normal);
  k.nan = _mm256_set1_epi32((int)p->nan_code);
  k.mant = _mm256_set1_epi32((int)((1u << (23 - p->shift)) - 1));
  k.quiet = _mm256_set1_epi32(0x400000);
  k.infc = _mm256_set1_epi32((int)p->inf_code);
  k.sublim = _mm256_set1_epi32((int)p->sub_lim);
  k.speclo = _mm256_set1_epi32((int)p->spec_lo - 1);
  k.nbias = _mm256_set1_epi32((int)(p->ebias << p->shift));
  k.magic = _mm256_set1_ps(p->magic);
  k.step = _mm256_set1_ps(p->step);
  k.sh = _mm_cvtsi32_si128((int)p->shift);
  return k;
}

AVX2 static inline __m256i encode8(__m256 f, const vk_t *k) {
  __m256i x = _mm256_castps_si256(f);
  __m256i ax = _mm256_and_si256(x, k->abs);
  __m256i sign = _mm256_and_si256(_mm256_srli_epi32(x, 24), k->sgn);
  __m256i nan = _mm256_cmpgt_epi32(ax, k->inf);
  ax = _mm256_min_epi32(ax, k->max); /* saturate (inf too); NaN lanes replaced below */
  __m256i sub = _mm256_sub_epi32(
      _mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(ax), k->magic)),
      _mm256_castps_si256(k->magic));
  __m256i odd = _mm256_and_si256(_mm256_srl_epi32(ax, k->sh), k->one);
  __m256i r = _mm256_add_epi32(_mm256_add_epi32(ax, odd), k->half);
  __m256i nrm = _mm256_sub_epi32(_mm256_srl_epi32(r, k->sh), k->ebias);
  __m256i c = _mm256_blendv_epi8(nrm, sub, _mm256_cmpgt_epi32(k->minn, ax));
  c = _mm256_blendv_epi8(c, k->nan, nan);
  return _mm256_or_si256(c, sign);
}

/* Sixteen elements of a float row as two f32 vectors. */
AVX2 static inline void load16(const unsigned char *s, kvc_dtype_t st, __m256 *a, __m256 *b) {
  if (st == KVC_DTYPE_F32) {
    *a = _mm256_loadu_ps((const float *)s);
    *b = _mm256_loadu_ps((const float *)s + 8);
    return;
  }
  __m256i h = _mm256_loadu_si256((const __m256i *)s);
  if (st == KVC_DTYPE_F16) {
    *a = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    *b = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
    return;
  }
  *a = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(h)), 16));
  *b = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1)), 16));
}

AVX2 static size_t encode_avx2(uint8_t *d, const fmt_t *p, const unsigned char *s,
                               kvc_dtype_t st, size_t n, float scale, bool nt) {
  vk_t k = vk_of(p);
  bool sc = scale != 1.0f;
  __m256 vs = _mm256_set1_ps(scale);
  unsigned es = st == KVC_DTYPE_F32 ? 4 : 2;
  __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 a, b;
    load16(s + i * es, st, &a, &b);
    if (sc) a = _mm256_div_ps(a, vs), b = _mm256_div_ps(b, vs);
    /* two vectors of codes -> 16 bytes: packs interleave the 128-bit lanes */
    __m256i w = _mm256_packus_epi32(encode8(a, &k), encode8(b, &k));
    w = _mm256_packus_epi16(w, w);
    w = _mm256_permutevar8x32_epi32(w, order);
    if (nt) /* past the caches, as ntcopy (d + i stays 16-byte aligned) */
      _mm_stream_si128((__m128i *)(d + i), _mm256_castsi256_si128(w));
    else
      _mm_storeu_si128((__m128i *)(d + i), _mm256_castsi256_si128(w));
  }
  return i;
}

AVX2 static inline __m256 decode8(__m128i bytes, const vk_t *k) {
  __m256i x = _mm256_cvtepu8_epi32(bytes);
  __m256i rest = _mm256_andnot_si256(k->sgn, x);
  __m256i sign = _mm256_slli_epi32(_mm256_and_si256(x, k->sgn), 24);
  __m256i nrm = _mm256_add_epi32(_mm256_sll_epi32(rest, k->sh), k->nbias);
  __m256i sub = _mm256_castps_si256(_mm256_mul_ps(_mm256_cvtepi32_ps(rest), k->step));
  __m256i quiet = _mm256_andnot_si256(_mm256_cmpeq_epi32(rest, k->infc), k->quiet);
  __m256i spec = _mm256_or_si256(
      _mm256_or_si256(k->inf, _mm256_sll_epi32(_mm256_and_si256(rest, k->mant), k->sh)), quiet);
  __m256i v = _mm256_blendv_epi8(nrm, sub, _mm256_cmpgt_epi32(k->sublim, rest));
  v = _mm256_blendv_epi8(v, spec, _mm256_cmpgt_epi32(rest, k->speclo));
  return _mm256_castsi256_ps(_mm256_or_si256(v, sign));
}

/* Eight f32 lanes as bf16 bits, rounded to nearest even (NaN as
 * dtype_f32_to_bf16: its top half, quiet). */
AVX2 static inline __m256i bf16_rne8(__m256 v) {
  __m256i x = _mm256_castps_si256(v);
  __m256i r = _mm256_add_epi32(
      x, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                          _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1))));
  __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(r, _mm256_or_si256(x, _mm256_set1_epi32(0x400000)), nan);
}

/* Eight f32 lanes stored as dt: a code's exact value (round false), or a
 * scaled one (bf16 rounded to nearest even). */
AVX2 static inline void store8(unsigned char *d, kvc_dtype_t dt, __m256 v, bool round) {
  if (dt == KVC_DTYPE_F32) {
    _mm256_storeu_ps((float *)d, v);
  } else if (dt == KVC_DTYPE_F16) {
    /* Exact: every code is an f16 value (NaN keeps its top bits). */
    _mm_storeu_si128((__m128i *)d, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  } else {
    /* Exact unscaled: every code is a bf16 value; its f32's low half is zero. */
    __m256i w = _mm256_srli_epi32(round ? bf16_rne8(v) : _mm256_castps_si256(v), 16);
    w = _mm256_permute4x64_epi64(_mm256_packus_epi32(w, w), 0x08);
    _mm_storeu_si128((__m128i *)d, _mm256_castsi256_si128(w));
  }
}

AVX2 static size_t decode_avx2(unsigned char *d, kvc_dtype_t dt, const uint8_t *s,
                               const fmt_t *p, size_t n, float scale) {
  vk_t k = vk_of(p);
  unsigned es = dt == KVC_DTYPE_F32 ? 4 : 2;
  bool sc = scale != 1.0f;
  __m256 vs = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m128i b = _mm_loadu_si128((const __m128i *)(s + i));
    __m256 lo = decode8(b, &k), hi = decode8(_mm_srli_si128(b, 8), &k);
    if (sc) lo = _mm256_mul_ps(lo, vs), hi = _mm256_mul_ps(hi, vs);
    store8(d + i * es, dt, lo, sc);
    store8(d + (i + 8) * es, dt, hi, sc);
  }
  return i;
}

/* ---- AVX-512: the same arithmetic, sixteen lanes and masks ---- */
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c")))

typedef struct zk {
  __m512i abs, sgn, inf, max, half, one, ebias, minn, nan, mant, quiet, infc, sublim, speclo,
      nbias;
  __m512 magic, step;
  __m128i sh;
} zk_t;

AVX512 static zk_t zk_of(const fmt_t *p) {
  zk_t k;
  k.abs = _mm512_set1_epi32(0x7fffffff);
  k.sgn = _mm512_set1_epi32(0x80);
  k.inf = _mm512_set1_epi32(0x7f800000);
  k.max = _mm512_set1_epi32((int)p->max_bits);
  k.half = _mm512_set1_epi32((int)((1u << (p->shift - 1)) - 1));
  k.one = _mm512_set1_epi32(1);
  k.ebias = _mm512_set1_epi32((int)p->ebias);
  k.minn = _mm512_set1_epi32((int)p->min_normal);
  k.nan = _mm512_set1_epi32((int)p->nan_code);
  k.mant = _mm512_set1_epi32((int)((1u << (23 - p->shift)) - 1));
  k.quiet = _mm512_set1_epi32(0x400000);
  k.infc = _mm512_set1_epi32((int)p->inf_code);
  k.sublim = _mm512_set1_epi32((int)p->sub_lim);
  k.speclo = _mm512_set1_epi32((int)p->spec_lo);
  k.nbias = _mm512_set1_epi32((int)(p->ebias << p->shift));
  k.magic = _mm512_set1_ps(p->magic);
  k.step = _mm512_set1_ps(p->step);
  k.sh = _mm_cvtsi32_si128((int)p->shift);
  return k;
}

AVX512 static inline __m128i encode16(__m512 f, const zk_t *k) {
  __m512i x = _mm512_castps_si512(f);
  __m512i ax = _mm512_and_si512(x, k->abs);
  __m512i sign = _mm512_and_si512(_mm512_srli_epi32(x, 24), k->sgn);
  __mmask16 nan = _mm512_cmpgt_epi32_mask(ax, k->inf);
  ax = _mm512_min_epi32(ax, k->max);
  __m512i sub = _mm512_sub_epi32(
      _mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(ax), k->magic)),
      _mm512_castps_si512(k->magic));
  __m512i odd = _mm512_and_si512(_mm512_srl_epi32(ax, k->sh), k->one);
  __m512i r = _mm512_add_epi32(_mm512_add_epi32(ax, odd), k->half);
  __m512i c = _mm512_sub_epi32(_mm512_srl_epi32(r, k->sh), k->ebias);
  c = _mm512_mask_blend_epi32(_mm512_cmplt_epi32_mask(ax, k->minn), c, sub);
  c = _mm512_mask_blend_epi32(nan, c, k->nan);
  return _mm512_cvtepi32_epi8(_mm512_or_si512(c, sign));
}

AVX512 static inline __m512 load16z(const unsigned char *s, kvc_dtype_t st) {
  if (st == KVC_DTYPE_F32) return _mm512_loadu_ps((const float *)s);
  __m256i h = _mm256_loadu_si256((const __m256i *)s);
  if (st == KVC_DTYPE_F16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Sixteen values of a row as f32, divided by the scale (sc). */
AVX512 static inline __m512 load16s(const unsigned char *s, kvc_dtype_t st, bool sc, __m512 vs) {
  __m512 f = load16z(s, st);
  return sc ? _mm512_div_ps(f, vs) : f;
}

AVX512 static size_t encode_avx512(uint8_t *d, const fmt_t *p, const unsigned char *s,
                                   kvc_dtype_t st, size_t n, float scale, bool nt) {
  zk_t k = zk_of(p);
  unsigned es = st == KVC_DTYPE_F32 ? 4 : 2;
  bool sc = scale != 1.0f;
  __m512 vs = _mm512_set1_ps(scale);
  size_t i = 0;
  if (nt && ((uintptr_t)d & 15) == 0) { /* past the caches: as ntcopy */
    for (; i + 16 <= n; i += 16)
      _mm_stream_si128((__m128i *)(d + i), encode16(load16s(s + i * es, st, sc, vs), &k));
    return i;
  }
  for (; i + 16 <= n; i += 16)
    _mm_storeu_si128((__m128i *)(d + i), encode16(load16s(s + i * es, st, sc, vs), &k));
  return i;
}

AVX512 static inline __m512 decode16(__m128i bytes, const zk_t *k) {
  __m512i x = _mm512_cvtepu8_epi32(bytes);
  __m512i rest = _mm512_andnot_si512(k->sgn, x);
  __m512i sign = _mm512_slli_epi32(_mm512_and_si512(x, k->sgn), 24);
  __m512i v = _mm512_add_epi32(_mm512_sll_epi32(rest, k->sh), k->nbias);
  __m512i sub = _mm512_castps_si512(_mm512_mul_ps(_mm512_cvtepi32_ps(rest), k->step));
  __m512i spec = _mm512_or_si512(k->inf, _mm512_sll_epi32(_mm512_and_si512(rest, k->mant), k->sh));
  spec = _mm512_mask_or_epi32(spec, _mm512_cmpneq_epi32_mask(rest, k->infc), spec, k->quiet);
  v = _mm512_mask_blend_epi32(_mm512_cmplt_epi32_mask(rest, k->sublim), v, sub);
  v = _mm512_mask_blend_epi32(_mm512_cmpge_epi32_mask(rest, k->speclo), v, spec);
  return _mm512_castsi512_ps(_mm512_or_si512(v, sign));
}

/* Sixteen f32 lanes as bf16 bits rounded to nearest even, as bf16_rne8. */
AVX512 static inline __m512i bf16_rne16(__m512 v) {
  __m512i x = _mm512_castps_si512(v);
  __m512i r = _mm512_add_epi32(
      x, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                          _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1))));
  __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(x, _mm512_set1_epi32(0x400000)));
}

AVX512 static size_t decode_avx512(unsigned char *d, kvc_dtype_t dt, const uint8_t *s,
                                   const fmt_t *p, size_t n, float scale) {
  zk_t k = zk_of(p);
  bool sc = scale != 1.0f;
  __m512 vs = _mm512_set1_ps(scale);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 v = decode16(_mm_loadu_si128((const __m128i *)(s + i)), &k);
    if (sc) v = _mm512_mul_ps(v, vs);
    if (dt == KVC_DTYPE_F32)
      _mm512_storeu_ps((float *)(d + 4 * i), v);
    else if (dt == KVC_DTYPE_F16) /* exact unscaled, as in store8; else rounded */
      _mm256_storeu_si256((__m256i *)(d + 2 * i), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    else
      _mm256_storeu_si256((__m256i *)(d + 2 * i),
                          _mm512_cvtepi32_epi16(_mm512_srli_epi32(
                              sc ? bf16_rne16(v) : _mm512_castps_si512(v), 16)));
  }
  return i;
}
#endif

void fp8_encode(uint8_t *dst, kvc_dtype_t fmt, const void *src, kvc_dtype_t st, size_t n,
                float scale, isa_t isa, bool nt) {
  const fmt_t *p = fmt_of(fmt);
  const unsigned char *s = src;
  size_t i = 0;
#if defined(__x86_64__) && defined(__GNUC__)
  switch (isa_pick(isa, st)) {
  case ISA_AVX512: i = encode_avx512(dst, p, s, st, n, scale, nt); break;
  case ISA_AVX2:
    i = encode_avx2(dst, p, s, st, n, scale, nt && ((uintptr_t)dst & 15) == 0);
    break;
  default: break;
  }
#else
  (void)nt;
#endif
  for (; i < n; i++) {
    float v = load1(s, st, i);
    dst[i] = encode1(scale != 1.0f ? v / scale : v, p);
  }
}

void fp8_decode(void *dst, kvc_dtype_t dt, const uint8_t *src, kvc_dtype_t fmt, size_t n,
                float scale, isa_t isa) {
  const fmt_t *p = fmt_of(fmt);
  unsigned char *d = dst;
  size_t i = 0;
#if defined(__x86_64__) && defined(__GNUC__)
  switch (isa_pick(isa, dt)) {
  case ISA_AVX512: i = decode_avx512(d, dt, src, p, n, scale); break;
  case ISA_AVX2: i = decode_avx2(d, dt, src, p, n, scale); break;
  default: break;
  }
#endif
  for (; i < n; i++) {
    float v = decode1(src[i], p);
    store1(d, dt, i, scale != 1.0f ? v * scale : v);
  }
}
