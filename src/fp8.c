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

bool fp8_have_avx2(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
}

/* Eight elements of a float row as f32 lanes. */
AVX2 static __m256 load8(const unsigned char *s, kvc_dtype_t st) {
  switch (st) {
  case KVC_DTYPE_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)s));
  case KVC_DTYPE_BF16:
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)s)), 16));
  default: return _mm256_loadu_ps((const float *)s);
  }
}

AVX2 static __m256i encode8(__m256 f, const fmt_t *p) {
  __m256i x = _mm256_castps_si256(f);
  __m256i ax = _mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff));
  __m256i sign = _mm256_and_si256(_mm256_srli_epi32(x, 24), _mm256_set1_epi32(0x80));
  __m256i nan = _mm256_cmpgt_epi32(ax, _mm256_set1_epi32(0x7f800000));
  /* Clamp to max (inf too); NaN lanes are replaced below. */
  ax = _mm256_min_epi32(ax, _mm256_set1_epi32((int)p->max_bits));
  __m256 magic = _mm256_set1_ps(p->magic);
  __m256i sub = _mm256_sub_epi32(
      _mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(ax), magic)),
      _mm256_castps_si256(magic));
  __m128i sh = _mm_cvtsi32_si128((int)p->shift);
  __m256i odd = _mm256_and_si256(_mm256_srl_epi32(ax, sh), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(_mm256_add_epi32(ax, odd),
                               _mm256_set1_epi32((int)((1u << (p->shift - 1)) - 1)));
  __m256i nrm = _mm256_sub_epi32(_mm256_srl_epi32(r, sh), _mm256_set1_epi32((int)p->ebias));
  __m256i is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)p->min_normal), ax);
  __m256i c = _mm256_blendv_epi8(nrm, sub, is_sub);
  c = _mm256_blendv_epi8(c, _mm256_set1_epi32((int)p->nan_code), nan);
  return _mm256_or_si256(c, sign);
}

/* Eight codes (int32 lanes, 0..255) stored as eight bytes. */
AVX2 static void store_codes8(uint8_t *d, __m256i c) {
  __m256i w = _mm256_packus_epi32(c, c);
  w = _mm256_packus_epi16(w, w);
  w = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4));
  _mm_storel_epi64((__m128i *)d, _mm256_castsi256_si128(w));
}

AVX2 static size_t encode_avx2(uint8_t *d, const fmt_t *p, const unsigned char *s,
                               kvc_dtype_t st, size_t n) {
  unsigned es = st == KVC_DTYPE_F32 ? 4 : 2;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) store_codes8(d + i, encode8(load8(s + i * es, st), p));
  return i;
}

AVX2 static __m256 decode8(const uint8_t *s, const fmt_t *p) {
  __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)s));
  __m256i rest = _mm256_and_si256(x, _mm256_set1_epi32(0x7f));
  __m256i sign = _mm256_slli_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x80)), 24);
  __m128i sh = _mm_cvtsi32_si128((int)p->shift);
  __m256i nrm = _mm256_add_epi32(_mm256_sll_epi32(rest, sh),
                                 _mm256_set1_epi32((int)(p->ebias << p->shift)));
  __m256i sub = _mm256_castps_si256(
      _mm256_mul_ps(_mm256_cvtepi32_ps(rest), _mm256_set1_ps(p->step)));
  __m256i mmask = _mm256_set1_epi32((int)((1u << (23 - p->shift)) - 1));
  __m256i quiet = _mm256_andnot_si256(_mm256_cmpeq_epi32(rest, _mm256_set1_epi32((int)p->inf_code)),
                                      _mm256_set1_epi32(0x400000));
  __m256i spec = _mm256_or_si256(
      _mm256_or_si256(_mm256_set1_epi32(0x7f800000),
                      _mm256_sll_epi32(_mm256_and_si256(rest, mmask), sh)),
      quiet);
  __m256i is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)p->sub_lim), rest);
  __m256i is_spec = _mm256_cmpgt_epi32(rest, _mm256_set1_epi32((int)p->spec_lo - 1));
  __m256i v = _mm256_blendv_epi8(nrm, sub, is_sub);
  v = _mm256_blendv_epi8(v, spec, is_spec);
  return _mm256_castsi256_ps(_mm256_or_si256(v, sign));
}

AVX2 static size_t decode_avx2(unsigned char *d, kvc_dtype_t dt, const uint8_t *s,
                               const fmt_t *p, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = decode8(s + i, p);
    if (dt == KVC_DTYPE_F32) {
      _mm256_storeu_ps((float *)(d + 4 * i), v);
    } else if (dt == KVC_DTYPE_F16) {
      /* Exact: every code is an f16 value (NaN keeps its top bits). */
      _mm_storeu_si128((__m128i *)(d + 2 * i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    } else {
      /* Exact: every code is a bf16 value; its f32's low half is zero. */
      __m256i w = _mm256_srli_epi32(_mm256_castps_si256(v), 16);
      w = _mm256_permute4x64_epi64(_mm256_packus_epi32(w, w), 0x08);
      _mm_storeu_si128((__m128i *)(d + 2 * i), _mm256_castsi256_si128(w));
    }
  }
  return i;
}
#else
bool fp8_have_avx2(void) { return false; }
#endif

/* The vector kernels take f32, f16 and bf16 rows; f64 runs the scalar loop. */
static bool use_avx2(fp8_isa_t isa, kvc_dtype_t t) {
  return isa != FP8_ISA_SCALAR && t != KVC_DTYPE_F64 && fp8_have_avx2();
}

void fp8_encode(uint8_t *dst, kvc_dtype_t fmt, const void *src, kvc_dtype_t st, size_t n,
                fp8_isa_t isa) {
  const fmt_t *p = fmt_of(fmt);
  const unsigned char *s = src;
  size_t i = 0;
#if defined(__x86_64__) && defined(__GNUC__)
  if (use_avx2(isa, st)) i = encode_avx2(dst, p, s, st, n);
#endif
  for (; i < n; i++) dst[i] = encode1(load1(s, st, i), p);
}

void fp8_decode(void *dst, kvc_dtype_t dt, const uint8_t *src, kvc_dtype_t fmt, size_t n,
                fp8_isa_t isa) {
  const fmt_t *p = fmt_of(fmt);
  unsigned char *d = dst;
  size_t i = 0;
#if defined(__x86_64__) && defined(__GNUC__)
  if (use_avx2(isa, dt)) i = decode_avx2(d, dt, src, p, n);
#endif
  for (; i < n; i++) store1(d, dt, i, decode1(src[i], p));
}
