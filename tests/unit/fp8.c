/* fp8.c: the FP8 formats against a reference written here from the OCP
 * 8-bit floating point specification (OFP8, v1.0), then through the engine.
 *
 * The reference decodes a code from its fields with ldexp, and encodes by
 * searching every finite code for the nearest value (ties to the even
 * code), saturating: it shares no arithmetic with src/fp8.c. Every code of
 * each format is decoded, and every f16 and every bf16 value encoded, by
 * the scalar loop and by the AVX2 and AVX-512 kernels (when the CPU has
 * them).
 */
#include <math.h>

#include "engine_fixture.h"
#include "dtype.h"
#include "fp8.h"

typedef struct spec {
  kvc_dtype_t t;
  int E, M, bias;
  bool ieee; /* E5M2: exponent all ones is inf (m = 0) or NaN */
  double max;
} spec_t;

static const spec_t SPECS[2] = {{KVC_DTYPE_FP8_E4M3, 4, 3, 7, false, 448.0},
                                {KVC_DTYPE_FP8_E5M2, 5, 2, 15, true, 57344.0}};

static uint32_t fbits(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  return x;
}

static float bitsf(uint32_t x) {
  float f;
  memcpy(&f, &x, 4);
  return f;
}

/* The value of a code from the spec's fields: NAN for NaN codes. */
static double ref_decode(const spec_t *s, unsigned c) {
  unsigned sign = c >> 7, e = (c >> s->M) & ((1u << s->E) - 1), m = c & ((1u << s->M) - 1);
  unsigned emax = (1u << s->E) - 1;
  double v;
  if (s->ieee && e == emax) v = m ? NAN : INFINITY;
  else if (!s->ieee && e == emax && m == (1u << s->M) - 1) v = NAN;
  else if (e == 0) v = ldexp(m, 1 - s->bias - s->M);
  else v = ldexp((1 << s->M) + m, (int)e - s->bias - s->M);
  return sign ? -v : v;
}

/* The code of v: nearest finite code, ties to even; saturating. */
static unsigned ref_encode(const spec_t *s, double v) {
  unsigned sign = signbit(v) ? 0x80 : 0;
  if (isnan(v)) return sign | (s->ieee ? 0x7e : 0x7f);
  double a = fmin(fabs(v), s->max); /* inf, and beyond max: max */
  unsigned best = 0;
  double bd = INFINITY;
  for (unsigned c = 0; c < 0x80; c++) {
    double r = ref_decode(s, c);
    if (!isfinite(r)) continue;
    double d = fabs(r - a);
    if (d < bd || (d == bd && (c & 1) == 0)) bd = d, best = c;
  }
  return sign | best;
}

#define NISA 3
static const isa_t ISAS[NISA] = {ISA_SCALAR, ISA_AVX2, ISA_AVX512};

/* A kernel the CPU lacks would fall back to another: skipped, not counted. */
static bool isa_runs(isa_t isa) {
  return isa_have(isa);
}

TEST(fp8_decode_every_code_matches_the_spec) {
  unsigned checked = 0;
  for (int k = 0; k < 2; k++) {
    const spec_t *s = &SPECS[k];
    /* 3 leading codes shift the row so the vector kernel meets odd offsets
     * and the scalar tail runs too. */
    uint8_t codes[259];
    for (unsigned i = 0; i < 259; i++) codes[i] = (uint8_t)(i < 3 ? 0 : i - 3);
    for (int ii = 0; ii < NISA; ii++) {
      if (!isa_runs(ISAS[ii])) continue;
      float f[259];
      uint16_t h[259], b[259];
      fp8_decode(f, KVC_DTYPE_F32, codes, s->t, 259, 1.0f, ISAS[ii]);
      fp8_decode(h, KVC_DTYPE_F16, codes, s->t, 259, 1.0f, ISAS[ii]);
      fp8_decode(b, KVC_DTYPE_BF16, codes, s->t, 259, 1.0f, ISAS[ii]);
      for (unsigned c = 0; c < 256; c++) {
        double r = ref_decode(s, c);
        float got = f[c + 3], gh = dtype_f16_to_f32(h[c + 3]), gb = dtype_bf16_to_f32(b[c + 3]);
        ASSERT_EQ(fbits(fp8_to_f32((uint8_t)c, s->t)), fbits(got));
        if (isnan(r)) {
          /* NaN stays a quiet NaN with the code's sign, in every dtype */
          ASSERT(isnan(got) && isnan(gh) && isnan(gb));
          ASSERT_EQ(fbits(got) & 0x80400000u, (c & 0x80 ? 0x80000000u : 0) | 0x400000u);
          ASSERT_EQ(!!signbit(gh), !!(c & 0x80));
          ASSERT_EQ(!!signbit(gb), !!(c & 0x80));
        } else {
          /* exact, the sign of zero too */
          ASSERT_EQ(fbits(got), fbits((float)r));
          ASSERT_EQ(fbits(gh), fbits((float)r));
          ASSERT_EQ(fbits(gb), fbits((float)r));
        }
        checked++;
      }
    }
  }
  ASSERT(checked >= 512 && checked % 512 == 0);
  if (isa_have(ISA_AVX512)) ASSERT_EQ(checked, 3 * 512);
  /* the spec's landmarks */
  ASSERT(fp8_to_f32(0x7e, KVC_DTYPE_FP8_E4M3) == 448.0f);
  ASSERT(fp8_to_f32(0x01, KVC_DTYPE_FP8_E4M3) == 0x1p-9f);
  ASSERT(fp8_to_f32(0x08, KVC_DTYPE_FP8_E4M3) == 0x1p-6f);
  ASSERT(isnan(fp8_to_f32(0x7f, KVC_DTYPE_FP8_E4M3)) && isnan(fp8_to_f32(0xff, KVC_DTYPE_FP8_E4M3)));
  ASSERT(fp8_to_f32(0x78, KVC_DTYPE_FP8_E4M3) == 256.0f); /* S.1111.000 is a number */
  ASSERT(fp8_to_f32(0x7b, KVC_DTYPE_FP8_E5M2) == 57344.0f);
  ASSERT(fp8_to_f32(0x7c, KVC_DTYPE_FP8_E5M2) == INFINITY);
  ASSERT(fp8_to_f32(0xfc, KVC_DTYPE_FP8_E5M2) == -INFINITY);
  ASSERT(fp8_to_f32(0x01, KVC_DTYPE_FP8_E5M2) == 0x1p-16f);
}

/* Encodes n values given as f32 (and in src of dtype st) with each ISA,
 * into the caches and past them (nt), and checks every code against
 * ref_encode. Returns the values checked. */
static unsigned check_encode(const spec_t *s, const float *vals, const void *src, kvc_dtype_t st,
                             size_t n) {
  uint8_t *got = malloc(n), *want = malloc(n);
  for (size_t i = 0; i < n; i++) want[i] = (uint8_t)ref_encode(s, vals[i]);
  unsigned checked = 0;
  for (int ii = 0; ii < NISA; ii++)
    for (int nt = 0; nt < 2; nt++) {
      if (!isa_runs(ISAS[ii])) continue;
      memset(got, 0x5a, n);
      fp8_encode(got, s->t, src, st, n, 1.0f, ISAS[ii], nt);
      for (size_t i = 0; i < n; i++) {
        if (got[i] != want[i])
          TEST_FAIL_("%s isa %d nt %d: %.9g (0x%08x) encoded 0x%02x, spec says 0x%02x",
                     s->t == KVC_DTYPE_FP8_E4M3 ? "e4m3" : "e5m2", (int)ISAS[ii], nt, vals[i],
                     fbits(vals[i]), got[i], want[i]);
        checked++;
      }
    }
  free(got);
  free(want);
  return checked;
}

TEST_TIMEOUT(fp8_encode_every_f16_and_bf16_value_matches_the_spec, 300) {
  uint16_t *h = malloc(65536 * 2);
  float *f = malloc(65536 * 4);
  unsigned checked = 0;
  for (int k = 0; k < 2; k++) {
    for (unsigned i = 0; i < 65536; i++) h[i] = (uint16_t)i, f[i] = dtype_f16_to_f32((uint16_t)i);
    checked += check_encode(&SPECS[k], f, h, KVC_DTYPE_F16, 65536);
    checked += check_encode(&SPECS[k], f, f, KVC_DTYPE_F32, 65536);
    for (unsigned i = 0; i < 65536; i++) f[i] = dtype_bf16_to_f32((uint16_t)i);
    checked += check_encode(&SPECS[k], f, h, KVC_DTYPE_BF16, 65536);
  }
  ASSERT(checked >= 2 * 3 * 65536);
  free(h);
  free(f);
}

/* Ties, the edges of the subnormals and of saturation, in f32. */
TEST(fp8_encode_ties_edges_and_random_f32) {
  float v[4096];
  size_t n = 0;
  for (int k = 0; k < 2; k++) {
    const spec_t *s = &SPECS[k];
    for (unsigned c = 0; c < 0x7f; c++) {
      double a = ref_decode(s, c), b = ref_decode(s, c + 1);
      if (!isfinite(a) || !isfinite(b)) continue;
      v[n++] = (float)((a + b) / 2); /* exact tie in f32 */
      v[n++] = nextafterf((float)((a + b) / 2), INFINITY);
      v[n++] = -nextafterf((float)((a + b) / 2), 0);
    }
    v[n++] = (float)s->max;
    v[n++] = nextafterf((float)s->max, INFINITY);
    v[n++] = (float)(s->max * 1.0625); /* halfway to the next binade step */
    v[n++] = 1e30f;
    v[n++] = -INFINITY;
    v[n++] = INFINITY;
    v[n++] = NAN;
    v[n++] = -NAN;
    v[n++] = 0x1p-149f;
    v[n++] = -0.0f;
  }
  uint64_t r = 88172645463325252ull;
  while (n < 4096) {
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    /* magnitudes around both formats' ranges: exponents 2^-30..2^20 */
    uint32_t x = (uint32_t)(r & 0x807fffffu) | (uint32_t)((97 + (r >> 40) % 51) << 23);
    v[n++] = bitsf(x);
  }
  unsigned checked = 0;
  for (int k = 0; k < 2; k++) checked += check_encode(&SPECS[k], v, v, KVC_DTYPE_F32, n);
  ASSERT(checked >= 2 * 4096);
  ASSERT_EQ(fp8_from_f32(INFINITY, KVC_DTYPE_FP8_E4M3), 0x7e);
  ASSERT_EQ(fp8_from_f32(-1e9f, KVC_DTYPE_FP8_E5M2), 0xfb);
  ASSERT_EQ(fp8_from_f32(NAN, KVC_DTYPE_FP8_E4M3), 0x7f);
  ASSERT_EQ(fp8_from_f32(NAN, KVC_DTYPE_FP8_E5M2), 0x7e);
  ASSERT_EQ(fp8_from_f32(464.0f, KVC_DTYPE_FP8_E4M3), 0x7e); /* would round to 480: saturates */
}

/* ---- through the engine --------------------------------------------------- */

static void open_fp8(fx_t *f, kvc_dtype_t dt, uint32_t dim) {
  kvc_layout_t l = fx_layout(2, 2, dim, dim, dt, 4);
  fx_open(f, &l, 16);
}

static int xfer(fx_t *f, bool put, kvc_dtype_t dt, uint64_t seq, uint64_t pos, uint64_t n,
                void *k, void *v) {
  uint64_t bytes = n * 2 * 2 * f->lay.head_dim_k * (dt ? dtype_size(dt) : 1);
  engine_io_t io = {seq, pos, n, k, v, bytes, bytes, NULL, NULL, 0, 0};
  engine_xfer_t x = {.dtype = dt};
  return put ? engine_put(f->eng, f->cid, &x, &io, 1) : engine_get(f->eng, f->cid, &x, &io, 1);
}

TEST(fp8_cache_refuses_other_dtypes) {
  for (int k = 0; k < 2; k++) {
    fx_t f;
    open_fp8(&f, SPECS[k].t, 8);
    kvc_dtype_t other = k ? KVC_DTYPE_FP8_E4M3 : KVC_DTYPE_FP8_E5M2;
    uint8_t b[2 * 2 * 8 * 8 * 3] = {0};
    ASSERT_ERR(xfer(&f, true, other, 1, 0, 3, b, b), KVC_E_DTYPE);
    ASSERT_ERR(xfer(&f, true, KVC_DTYPE_INT8, 1, 0, 3, b, b), KVC_E_DTYPE);
    ASSERT_ERR(xfer(&f, true, KVC_DTYPE_F64, 1, 0, 1, b, b), KVC_E_DTYPE);
    ASSERT_OK(xfer(&f, true, SPECS[k].t, 1, 0, 3, b, b));
    ASSERT_ERR(xfer(&f, false, KVC_DTYPE_INT8, 1, 0, 3, b, b), KVC_E_DTYPE);
    ASSERT_ERR(xfer(&f, false, other, 1, 0, 3, b, b), KVC_E_DTYPE);
    fx_close(&f);
  }
}

/* Stored as given: every byte back, NaN codes included, through the
 * plain path (all heads) and a head range; the natural dtype is the cache's. */
TEST(fp8_stored_as_given_bit_exact) {
  for (int k = 0; k < 2; k++) {
    fx_t f;
    open_fp8(&f, SPECS[k].t, 16);
    enum { N = 11, EL = 2 * N * 2 * 16 };
    uint8_t kb[EL], vb[EL], kg[EL], vg[EL];
    for (unsigned i = 0; i < EL; i++) kb[i] = (uint8_t)(i * 7 + 3), vb[i] = (uint8_t)(i * 13 + k);
    ASSERT_OK(xfer(&f, true, 0, 1, 0, N, kb, vb));
    ASSERT_OK(xfer(&f, false, SPECS[k].t, 1, 0, N, kg, vg));
    ASSERT_MEM_EQ(kg, kb, EL);
    ASSERT_MEM_EQ(vg, vb, EL);
    /* head 1 alone: the converting path */
    uint8_t h1[2 * N * 16];
    engine_io_t io = {1, 0, N, h1, h1, sizeof h1, sizeof h1, NULL, NULL, 0, 0};
    engine_xfer_t x = {.head_begin = 1, .head_end = 2, .dtype = SPECS[k].t};
    ASSERT_OK(engine_get(f.eng, f.cid, &x, &io, 1));
    for (unsigned l = 0; l < 2; l++)
      for (unsigned t = 0; t < N; t++)
        ASSERT_MEM_EQ(h1 + (l * N + t) * 16, vb + ((l * N + t) * 2 + 1) * 16, 16);
    fx_close(&f);
  }
}

/* Put f32, f16, bf16 -> codes as fp8_encode gives them; get f32 within half
 * a code's step (relative 2^-4 for E4M3, 2^-3 for E5M2 in the normal range)
 * and get f16 / bf16 exact. */
TEST(fp8_put_f32_get_f32_within_the_format_bound) {
  for (int k = 0; k < 2; k++) {
    const spec_t *s = &SPECS[k];
    fx_t f;
    open_fp8(&f, s->t, 32);
    enum { N = 9, EL = 2 * N * 2 * 32 };
    float *in = malloc(EL * 4), *out = malloc(EL * 4);
    uint8_t *codes = malloc(EL);
    uint16_t *h = malloc(EL * 2);
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (unsigned i = 0; i < EL; i++) {
      r ^= r << 13, r ^= r >> 7, r ^= r << 17;
      in[i] = (float)((double)(r >> 11) / 9007199254740992.0 * 2 - 1) * (k ? 1000.0f : 100.0f);
    }
    ASSERT_OK(xfer(&f, true, KVC_DTYPE_F32, 1, 0, N, in, in));
    ASSERT_OK(xfer(&f, false, s->t, 1, 0, N, codes, codes));
    ASSERT_OK(xfer(&f, false, KVC_DTYPE_F32, 1, 0, N, out, out));
    double rel = k ? 0x1p-3 : 0x1p-4, sub = ref_decode(s, 1) / 2;
    for (unsigned i = 0; i < EL; i++) {
      ASSERT_EQ(codes[i], ref_encode(s, in[i]));
      double err = fabs((double)out[i] - in[i]);
      if (err > fabs(in[i]) * rel && err > sub)
        TEST_FAIL_("%g came back %g (err %g)", in[i], out[i], err);
    }
    /* head 1 alone, converted: the per-token path */
    float h1[2 * N * 32];
    engine_io_t io1 = {1, 0, N, h1, h1, sizeof h1, sizeof h1, NULL, NULL, 0, 0};
    engine_xfer_t x1 = {.head_begin = 1, .head_end = 2, .dtype = KVC_DTYPE_F32};
    ASSERT_OK(engine_get(f.eng, f.cid, &x1, &io1, 1));
    for (unsigned row = 0; row < 2 * N; row++)
      ASSERT_MEM_EQ(h1 + row * 32, out + (row * 2 + 1) * 32, 32 * 4);
    ASSERT_OK(xfer(&f, false, KVC_DTYPE_BF16, 1, 0, N, h, h));
    for (unsigned i = 0; i < EL; i++) ASSERT_EQ(fbits(dtype_bf16_to_f32(h[i])), fbits(out[i]));
    ASSERT_OK(xfer(&f, false, KVC_DTYPE_F16, 1, 0, N, h, h));
    for (unsigned i = 0; i < EL; i++) ASSERT_EQ(fbits(dtype_f16_to_f32(h[i])), fbits(out[i]));
    /* a bf16 put of the same values gives the codes of the bf16 values */
    for (unsigned i = 0; i < EL; i++) h[i] = dtype_f32_to_bf16(in[i]);
    ASSERT_OK(xfer(&f, true, KVC_DTYPE_BF16, 2, 0, N, h, h));
    ASSERT_OK(xfer(&f, false, s->t, 2, 0, N, codes, codes));
    for (unsigned i = 0; i < EL; i++) ASSERT_EQ(codes[i], ref_encode(s, dtype_bf16_to_f32(h[i])));
    free(in), free(out), free(codes), free(h);
    fx_close(&f);
  }
}

/* vLLM's scales: a put encodes x / k_scale (x / v_scale), a get decodes
 * code x scale, on every kernel; the scale is the transfer's, for fp8
 * conversions only. */
TEST(fp8_scaled_conversions_divide_and_multiply) {
  enum { N = 1000 };
  float x[N], q[N], y[N];
  uint16_t h[N];
  uint8_t got[N], codes[N];
  uint64_t r = 0x1234567887654321ull;
  for (int i = 0; i < N; i++) {
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    x[i] = (float)((double)(r >> 11) / 9007199254740992.0 * 2 - 1) * 300.0f;
    codes[i] = (uint8_t)(r >> 3);
  }
  const float s = 0.37f;
  unsigned checked = 0;
  for (int k = 0; k < 2; k++)
    for (int ii = 0; ii < NISA; ii++) {
      if (!isa_runs(ISAS[ii])) continue;
      fp8_encode(got, SPECS[k].t, x, KVC_DTYPE_F32, N, s, ISAS[ii], false);
      for (int i = 0; i < N; i++, checked++) ASSERT_EQ(got[i], ref_encode(&SPECS[k], x[i] / s));
      fp8_decode(y, KVC_DTYPE_F32, codes, SPECS[k].t, N, s, ISAS[ii]);
      for (int i = 0; i < N; i++) q[i] = fp8_to_f32(codes[i], SPECS[k].t) * s;
      for (int i = 0; i < N; i++) ASSERT(fbits(y[i]) == fbits(q[i]) || (isnan(y[i]) && isnan(q[i])));
      fp8_decode(h, KVC_DTYPE_BF16, codes, SPECS[k].t, N, s, ISAS[ii]);
      for (int i = 0; i < N; i++) ASSERT_EQ(h[i], dtype_f32_to_bf16(q[i]));
      fp8_decode(h, KVC_DTYPE_F16, codes, SPECS[k].t, N, s, ISAS[ii]);
      for (int i = 0; i < N; i++) ASSERT_EQ(h[i], dtype_f32_to_f16(q[i]));
    }
  ASSERT(checked >= 2 * N);
  /* through the engine: K and V with scales of their own */
  fx_t f;
  open_fp8(&f, KVC_DTYPE_FP8_E4M3, 16);
  enum { T = 5, EL = 2 * T * 2 * 16 };
  float in[EL];
  uint8_t kc[EL], vc[EL];
  for (int i = 0; i < EL; i++) in[i] = x[i];
  uint64_t fb = EL * 4, cb = EL;
  engine_io_t io = {1, 0, T, in, in, fb, fb, NULL, NULL, 0, 0};
  engine_xfer_t xs = {.dtype = KVC_DTYPE_F32, .k_scale = 2.0f, .v_scale = 0.5f};
  ASSERT_OK(engine_put(f.eng, f.cid, &xs, &io, 1));
  engine_io_t raw = {1, 0, T, kc, vc, cb, cb, NULL, NULL, 0, 0};
  engine_xfer_t own = {.dtype = KVC_DTYPE_FP8_E4M3};
  ASSERT_OK(engine_get(f.eng, f.cid, &own, &raw, 1));
  for (int i = 0; i < EL; i++) {
    ASSERT_EQ(kc[i], ref_encode(&SPECS[0], in[i] / 2.0f));
    ASSERT_EQ(vc[i], ref_encode(&SPECS[0], in[i] / 0.5f));
  }
  float ko[EL], vo[EL];
  engine_io_t bk = {1, 0, T, ko, vo, fb, fb, NULL, NULL, 0, 0};
  ASSERT_OK(engine_get(f.eng, f.cid, &xs, &bk, 1));
  for (int i = 0; i < EL; i++) {
    ASSERT_EQ(fbits(ko[i]), fbits(fp8_to_f32(kc[i], KVC_DTYPE_FP8_E4M3) * 2.0f));
    ASSERT_EQ(fbits(vo[i]), fbits(fp8_to_f32(vc[i], KVC_DTYPE_FP8_E4M3) * 0.5f));
  }
  /* refused: a scale on bytes as given, a NaN, a negative scale */
  own.k_scale = 2.0f;
  ASSERT_ERR(engine_put(f.eng, f.cid, &own, &raw, 1), KVC_E_DTYPE);
  xs.k_scale = NAN;
  ASSERT_ERR(engine_put(f.eng, f.cid, &xs, &io, 1), KVC_E_DTYPE);
  xs.k_scale = -1.0f;
  ASSERT_ERR(engine_get(f.eng, f.cid, &xs, &bk, 1), KVC_E_DTYPE);
  fx_close(&f);
  /* and on a cache that is not fp8 */
  kvc_layout_t l = fx_layout(2, 2, 16, 16, KVC_DTYPE_BF16, 4);
  fx_open(&f, &l, 16);
  xs.k_scale = 2.0f;
  ASSERT_ERR(engine_put(f.eng, f.cid, &xs, &io, 1), KVC_E_DTYPE);
  fx_close(&f);
}
