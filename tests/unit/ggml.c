/* ggml.c: q8_0 and q4_0 blocks against a reference written here from
 * ggml's block format (block_q8_0 {f16 d; int8 qs[32]}, block_q4_0 {f16 d;
 * uint8 qs[16]}, low nibbles elements 0..15, high 16..31; the reference
 * quantizers quantize_row_q8_0_ref / quantize_row_q4_0_ref), then through
 * the engine: bytes as given, conversions, refusals.
 */
#include <math.h>

#include "engine_fixture.h"
#include "dtype.h"
#include "ggml.h"

static const isa_t ISAS[3] = {ISA_SCALAR, ISA_AVX2, ISA_AVX512};
/* kernels this CPU runs */
static unsigned nisa(void) { return isa_have(ISA_AVX512) ? 3 : isa_have(ISA_AVX2) ? 2 : 1; }

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint64_t next(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return rng;
}
/* Uniform in [-1, 1) times scale. */
static float uni(float scale) {
  return (float)((double)(next() >> 11) / 4503599627370496.0 - 1.0) * scale;
}

/* ---- the reference, from ggml's documented format ------------------------ */

static void put_f16(uint8_t *p, float d) {
  uint16_t h = dtype_f32_to_f16(d);
  p[0] = (uint8_t)h, p[1] = (uint8_t)(h >> 8); /* little endian */
}

static float get_f16(const uint8_t *p) { return dtype_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

static void ref_q8_0(uint8_t y[34], const float x[32]) {
  float amax = 0;
  for (int j = 0; j < 32; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
  float d = amax / 127, id = d ? 1.0f / d : 0.0f;
  put_f16(y, d);
  for (int j = 0; j < 32; j++) {
    y[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id); /* half away from zero */
  }
}

static void ref_q4_0(uint8_t y[18], const float x[32]) {
  float amax = 0, max = 0;
  for (int j = 0; j < 32; j++)
    if (fabsf(x[j]) > amax) amax = fabsf(x[j]), max = x[j];
  float d = max / -8, id = d ? 1.0f / d : 0.0f;
  put_f16(y, d);
  for (int j = 0; j < 16; j++) {
    int a = (int)(x[j] * id + 8.5f), b = (int)(x[16 + j] * id + 8.5f); /* toward zero */
    y[2 + j] = (uint8_t)((a < 15 ? a : 15) | (b < 15 ? b : 15) << 4);
  }
}

static float ref_dec(const uint8_t *y, bool q8, int j) {
  float d = get_f16(y);
  if (q8) return (float)(int8_t)y[2 + j] * d;
  int q = j < 16 ? y[2 + j] & 15 : y[2 + j - 16] >> 4;
  return (float)(q - 8) * d;
}

/* Encodes nb blocks of x with ggml_encode from f32, f16 and bf16 (x is
 * exact in each), with the scalar loop and each vector kernel the CPU
 * has, and checks each block against the reference; decodes (f32, and
 * bf16 / f16 as the f32 rounded) and checks every value. Returns the blocks
 * checked. */
static unsigned check_blocks(const float *x, size_t nb, kvc_dtype_t fmt, bool exact16) {
  bool q8 = fmt == KVC_DTYPE_Q8_0;
  size_t bb = q8 ? 34 : 18, n = nb * 32;
  uint8_t *got = malloc(nb * bb), *want = malloc(nb * bb);
  uint16_t *h = malloc(n * 2), *h2 = malloc(n * 2);
  float *back = malloc(n * 4);
  unsigned checked = 0;
  for (size_t b = 0; b < nb; b++) {
    if (q8) ref_q8_0(want + b * bb, x + b * 32);
    else ref_q4_0(want + b * bb, x + b * 32);
  }
  ASSERT(ggml_check(x, KVC_DTYPE_F32, n, fmt));
  for (unsigned vi = 0; vi < nisa(); vi++)
    for (int src = 0; src < (exact16 ? 3 : 1); src++) {
      if (src == 0) {
        ggml_encode(got, fmt, x, KVC_DTYPE_F32, n, ISAS[vi]);
      } else if (src == 1) {
        for (size_t i = 0; i < n; i++) h[i] = dtype_f32_to_f16(x[i]);
        ggml_encode(got, fmt, h, KVC_DTYPE_F16, n, ISAS[vi]);
      } else {
        for (size_t i = 0; i < n; i++) h[i] = dtype_f32_to_bf16(x[i]);
        ggml_encode(got, fmt, h, KVC_DTYPE_BF16, n, ISAS[vi]);
      }
      for (size_t b = 0; b < nb; b++, checked++)
        if (memcmp(got + b * bb, want + b * bb, bb) != 0)
          TEST_FAIL_("%s block %zu from source %d (f32, f16, bf16), isa %d: bytes differ "
                     "from ggml's reference", q8 ? "q8_0" : "q4_0", b, src, (int)ISAS[vi]);
      ggml_decode(back, KVC_DTYPE_F32, got, fmt, n, ISAS[vi]);
      for (size_t i = 0; i < n; i++) {
        float r = ref_dec(got + i / 32 * bb, q8, (int)(i % 32));
        if (memcmp(&r, &back[i], 4) != 0)
          TEST_FAIL_("value %zu decoded %g, expected %g", i, (double)back[i], (double)r);
      }
      ggml_decode(h2, KVC_DTYPE_BF16, got, fmt, n, ISAS[vi]);
      for (size_t i = 0; i < n; i++) ASSERT_EQ(h2[i], dtype_f32_to_bf16(back[i]));
      ggml_decode(h2, KVC_DTYPE_F16, got, fmt, n, ISAS[vi]);
      for (size_t i = 0; i < n; i++) ASSERT_EQ(h2[i], dtype_f32_to_f16(back[i]));
    }
  free(got), free(want), free(h), free(h2), free(back);
  return checked;
}

TEST(ggml_random_blocks_match_the_reference) {
  enum { NB = 4096 };
  float *x = malloc(NB * 32 * 4);
  unsigned checked = 0;
  for (int f = 0; f < 2; f++) {
    kvc_dtype_t fmt = f ? KVC_DTYPE_Q4_0 : KVC_DTYPE_Q8_0;
    /* magnitudes 2^-20..2^12 a block, values that are exact f16 and bf16 */
    for (size_t b = 0; b < NB; b++) {
      float scale = ldexpf(1, (int)(next() % 33) - 20);
      for (int j = 0; j < 32; j++) x[b * 32 + j] = dtype_bf16_to_f32(dtype_f32_to_bf16(uni(scale)));
      for (int j = 0; j < 32; j++) x[b * 32 + j] = dtype_f16_to_f32(dtype_f32_to_f16(x[b * 32 + j]));
    }
    checked += check_blocks(x, NB, fmt, true);
    for (size_t i = 0; i < NB * 32; i++) x[i] = uni(1000); /* f32 only */
    checked += check_blocks(x, NB, fmt, false);
  }
  ASSERT_EQ(checked, 2 * (3 + 1) * NB * nisa());
  free(x);
}

/* Zeros, one huge value, ties, the sign of q4_0's d, the clamped code. */
TEST(ggml_edge_blocks) {
  float x[32] = {0};
  uint8_t y[34];
  /* zeros: d 0, codes 0 (q8_0) and 8 (q4_0: both nibbles); q4_0's d is
   * 0 / -8 = -0 (f16 0x8000), as ggml stores it */
  ggml_encode(y, KVC_DTYPE_Q8_0, x, KVC_DTYPE_F32, 32, ISA_BEST);
  for (int j = 0; j < 34; j++) ASSERT_EQ(y[j], 0);
  ggml_encode(y, KVC_DTYPE_Q4_0, x, KVC_DTYPE_F32, 32, ISA_BEST);
  ASSERT(y[0] == 0 && y[1] == 0x80);
  for (int j = 2; j < 18; j++) ASSERT_EQ(y[j], 0x88);
  unsigned nv = nisa();
  ASSERT_EQ(check_blocks(x, 1, KVC_DTYPE_Q8_0, true) + check_blocks(x, 1, KVC_DTYPE_Q4_0, true), 6 * nv);
  /* one huge value among small ones: they quantize to 0, it to +-127 */
  for (int j = 0; j < 32; j++) x[j] = (float)(j - 16) / 64;
  x[5] = 30000;
  ggml_encode(y, KVC_DTYPE_Q8_0, x, KVC_DTYPE_F32, 32, ISA_BEST);
  ASSERT_EQ(get_f16(y), dtype_f16_to_f32(dtype_f32_to_f16(30000.0f / 127)));
  ASSERT_EQ((int8_t)y[2 + 5], 127);
  for (int j = 0; j < 32; j++) ASSERT(j == 5 || y[2 + j] == 0);
  ASSERT_EQ(check_blocks(x, 1, KVC_DTYPE_Q8_0, false), nv);
  /* ties round half away from zero (roundf), not to even */
  for (int j = 0; j < 32; j++) x[j] = 0;
  x[0] = 127, x[1] = 2.5f, x[2] = -2.5f, x[3] = 0.5f;
  ggml_encode(y, KVC_DTYPE_Q8_0, x, KVC_DTYPE_F32, 32, ISA_BEST);
  ASSERT_EQ((int8_t)y[3], 3);
  ASSERT_EQ((int8_t)y[4], -3);
  ASSERT_EQ((int8_t)y[5], 1);
  /* q4_0: d = max / -8 with the sign of the largest value; the other sign's
   * largest magnitude clamps to code 15 */
  for (int j = 0; j < 32; j++) x[j] = 0;
  x[0] = -3, x[20] = 3, x[7] = 1.5f;
  ggml_encode(y, KVC_DTYPE_Q4_0, x, KVC_DTYPE_F32, 32, ISA_BEST);
  ASSERT(get_f16(y) == 0.375f);
  ASSERT_EQ(y[2] & 15, 0);          /* -3 / 0.375 + 8.5 = 0.5 -> 0 */
  ASSERT_EQ(y[2 + 4] >> 4, 15);     /* 3 / 0.375 + 8.5 = 16.5 -> 16, clamped to 15 */
  ASSERT_EQ(y[2 + 7] & 15, 12);     /* 1.5 / 0.375 + 8.5 = 12.5 -> 12 */
  ASSERT_EQ(check_blocks(x, 1, KVC_DTYPE_Q4_0, true), 3 * nv);
  /* NaN, inf and a scale beyond f16 are refused by the check */
  x[3] = NAN;
  ASSERT(!ggml_check(x, KVC_DTYPE_F32, 32, KVC_DTYPE_Q8_0));
  x[3] = -INFINITY;
  ASSERT(!ggml_check(x, KVC_DTYPE_F32, 32, KVC_DTYPE_Q4_0));
  x[3] = 127.0f * 65504; /* d = 65504: the largest f16 */
  ASSERT(ggml_check(x, KVC_DTYPE_F32, 32, KVC_DTYPE_Q8_0));
  x[3] = 127.0f * 65536; /* d rounds to f16 inf */
  ASSERT(!ggml_check(x, KVC_DTYPE_F32, 32, KVC_DTYPE_Q8_0));
  x[3] = 8.0f * 65536;
  ASSERT(!ggml_check(x, KVC_DTYPE_F32, 32, KVC_DTYPE_Q4_0));
  ASSERT(ggml_check(x, KVC_DTYPE_F32, 32, KVC_DTYPE_Q8_0));
}

/* Decoding: every finite f16 scale with every int8 code (q8_0) and every
 * nibble in both halves (q4_0), against q * d. */
TEST(ggml_decode_every_scale_and_code) {
  uint8_t blk[8 * 34];
  float out[8 * 32];
  unsigned checked = 0;
  for (unsigned vi = 0; vi < nisa(); vi++)
    for (uint32_t h = 0; h < 0x10000; h++) {
      if (((h >> 10) & 0x1f) == 0x1f) continue; /* inf and NaN scales: never written */
      for (int b = 0; b < 8; b++) {
        blk[b * 34] = (uint8_t)h, blk[b * 34 + 1] = (uint8_t)(h >> 8);
        for (int j = 0; j < 32; j++) blk[b * 34 + 2 + j] = (uint8_t)(b * 32 + j);
      }
      ggml_decode(out, KVC_DTYPE_F32, blk, KVC_DTYPE_Q8_0, 8 * 32, ISAS[vi]);
      float d = dtype_f16_to_f32((uint16_t)h);
      for (int i = 0; i < 256; i++, checked++)
        if (out[i] != (float)(int8_t)(uint8_t)i * d)
          TEST_FAIL_("q8_0 isa %d d 0x%04x code %d: %g", (int)ISAS[vi], h, i, (double)out[i]);
      for (int j = 0; j < 16; j++) blk[2 + j] = (uint8_t)(j | (15 - j) << 4);
      ggml_decode(out, KVC_DTYPE_F32, blk, KVC_DTYPE_Q4_0, 32, ISAS[vi]);
      for (int j = 0; j < 16; j++, checked += 2)
        if (out[j] != (float)(j - 8) * d || out[16 + j] != (float)(7 - j) * d)
          TEST_FAIL_("q4_0 isa %d d 0x%04x nibble %d: %g %g", (int)ISAS[vi], h, j, (double)out[j],
                     (double)out[16 + j]);
    }
  ASSERT_EQ(checked, 63488u * (256 + 32) * nisa());
}

/* ---- through the engine --------------------------------------------------- */

static int xfer(fx_t *f, bool put, kvc_dtype_t dt, uint64_t seq, uint64_t n, void *k, void *v,
                uint32_t h0, uint32_t h1) {
  uint32_t nh = (h1 ? h1 : 2) - h0;
  uint64_t bytes = n * 2 * nh * dtype_row_bytes(dt ? dt : f->lay.dtype, f->lay.head_dim_k);
  engine_io_t io = {seq, 0, n, k, v, bytes, bytes, NULL, NULL, 0, 0};
  engine_xfer_t x = {.head_begin = h0, .head_end = h1, .dtype = dt};
  return put ? engine_put(f->eng, f->cid, &x, &io, 1) : engine_get(f->eng, f->cid, &x, &io, 1);
}

TEST(ggml_layout_needs_whole_blocks) {
  fx_t f;
  fx_engine(&f, 64 * 1024, 8, 0);
  uint32_t id;
  for (int q = 0; q < 2; q++) {
    kvc_layout_t l = fx_layout(2, 2, 48, 64, q ? KVC_DTYPE_Q4_0 : KVC_DTYPE_Q8_0, 4);
    ASSERT_ERR(engine_cache_open(f.eng, "q", &l, &id), KVC_E_HEADDIM);
    ASSERT(strstr(engine_last_error(f.eng)->msg, "multiples of 32") != NULL);
    l.head_dim_k = 64, l.head_dim_v = 16;
    ASSERT_ERR(engine_cache_open(f.eng, "q", &l, &id), KVC_E_HEADDIM);
    l.head_dim_v = 32;
    /* 2 layers x 4 tokens x 2 heads x (2 + 1) blocks */
    ASSERT_EQ(engine_layout_page_bytes(&l), 2 * 4 * 2 * 3 * (q ? 18 : 34));
  }
  fx_close(&f);
}

/* Bytes as given, bit for bit (any bytes: the daemon never reads them), a
 * head range too; converted puts equal the reference; gets into f32 within
 * the format's bound; bf16 and f16 gets are the f32 values rounded. */
TEST(ggml_cache_as_given_and_converted) {
  for (int q = 0; q < 2; q++) {
    kvc_dtype_t fmt = q ? KVC_DTYPE_Q4_0 : KVC_DTYPE_Q8_0;
    size_t bb = q ? 18 : 34;
    fx_t f;
    kvc_layout_t l = fx_layout(2, 2, 64, 64, fmt, 4);
    fx_open(&f, &l, 16);
    enum { N = 7, ROWS = 2 * N * 2, EL = ROWS * 64 };
    size_t RB = ROWS * 2 * bb; /* bytes of a buffer: 2 blocks a head row */
    uint8_t *kb = malloc(RB), *vb = malloc(RB), *kg = malloc(RB), *vg = malloc(RB);
    for (size_t i = 0; i < RB; i++) kb[i] = (uint8_t)next(), vb[i] = (uint8_t)next();
    ASSERT_OK(xfer(&f, true, 0, 1, N, kb, vb, 0, 0));
    ASSERT_OK(xfer(&f, false, fmt, 1, N, kg, vg, 0, 0));
    ASSERT_MEM_EQ(kg, kb, RB);
    ASSERT_MEM_EQ(vg, vb, RB);
    ASSERT_OK(xfer(&f, false, fmt, 1, N, kg, vg, 1, 2)); /* head 1: 2 blocks a token */
    for (size_t r = 0; r < 2 * N; r++) ASSERT_MEM_EQ(kg + r * 2 * bb, kb + (r * 2 + 1) * 2 * bb, 2 * bb);
    float *x = malloc(EL * 4), *y = malloc(EL * 4);
    for (size_t i = 0; i < EL; i++) x[i] = uni(8);
    ASSERT_OK(xfer(&f, true, KVC_DTYPE_F32, 2, N, x, x, 0, 0));
    ASSERT_OK(xfer(&f, false, fmt, 2, N, kg, vg, 0, 0));
    for (size_t b = 0; b < EL / 32; b++) {
      uint8_t want[34];
      if (q) ref_q4_0(want, x + b * 32);
      else ref_q8_0(want, x + b * 32);
      ASSERT_MEM_EQ(kg + b * bb, want, bb);
    }
    ASSERT_OK(xfer(&f, false, KVC_DTYPE_F32, 2, N, y, y, 0, 0));
    for (size_t b = 0; b < EL / 32; b++) {
      float d = fabsf(get_f16(kg + b * bb)), bound = (q ? d : d / 2) + 128 * d / 2048;
      for (size_t j = b * 32; j < b * 32 + 32; j++)
        if (fabsf(y[j] - x[j]) > bound)
          TEST_FAIL_("value %zu: %g came back %g (d %g)", j, (double)x[j], (double)y[j], (double)d);
    }
    uint16_t *h = malloc(EL * 2);
    ASSERT_OK(xfer(&f, false, KVC_DTYPE_BF16, 2, N, h, h, 0, 0));
    for (size_t i = 0; i < EL; i++) ASSERT_EQ(h[i], dtype_f32_to_bf16(y[i]));
    ASSERT_OK(xfer(&f, false, KVC_DTYPE_F16, 2, N, h, h, 0, 0));
    for (size_t i = 0; i < EL; i++) ASSERT_EQ(h[i], dtype_f32_to_f16(y[i]));
    /* refused before anything changes: NaN, a scale beyond f16; raw int8 */
    engine_stats_t s0 = fx_stats(&f);
    x[EL - 1] = NAN;
    ASSERT_ERR(xfer(&f, true, KVC_DTYPE_F32, 3, N, x, x, 0, 0), KVC_E_NONFINITE);
    x[EL - 1] = 1e9f;
    ASSERT_ERR(xfer(&f, true, KVC_DTYPE_F32, 3, N, x, x, 0, 0), KVC_E_NONFINITE);
    ASSERT_ERR(xfer(&f, false, KVC_DTYPE_INT8, 2, N, kg, vg, 0, 0), KVC_E_DTYPE);
    ASSERT_ERR(xfer(&f, true, q ? KVC_DTYPE_Q8_0 : KVC_DTYPE_Q4_0, 3, N, kb, vb, 0, 0), KVC_E_DTYPE);
    engine_stats_t s1 = fx_stats(&f);
    ASSERT_U64_EQ(s1.sequences, s0.sequences);
    ASSERT_U64_EQ(s1.pages_used, s0.pages_used);
    free(kb), free(vb), free(kg), free(vg), free(x), free(y), free(h);
    fx_close(&f);
  }
}

/* A shift re-rotates RoPE keys: not built for blocks, refused; keys without
 * positions (rope_style NONE) move as bytes. */
TEST(ggml_shift_refused_with_rope_moves_without) {
  for (int rope = 0; rope < 2; rope++) {
    fx_t f;
    kvc_layout_t l = fx_layout(1, 1, 32, 32, KVC_DTYPE_Q8_0, 4);
    if (rope) l.rope_dims = 32, l.rope_theta = 10000;
    else l.rope_style = KVC_ROPE_NONE;
    fx_open(&f, &l, 16);
    uint8_t k[6 * 34], v[6 * 34], g[8 * 34];
    for (size_t i = 0; i < sizeof k; i++) k[i] = (uint8_t)next(), v[i] = (uint8_t)i;
    engine_io_t io = {1, 0, 6, k, v, sizeof k, sizeof v, NULL, NULL, 0, 0};
    engine_xfer_t x = {.dtype = 0};
    ASSERT_OK(engine_put(f.eng, f.cid, &x, &io, 1));
    if (rope) {
      ASSERT_ERR(engine_shift(f.eng, f.cid, 1, 2, 6, 3), KVC_E_DTYPE);
      ASSERT(strstr(engine_last_error(f.eng)->msg, "q8_0") != NULL);
    } else {
      ASSERT_OK(engine_shift(f.eng, f.cid, 1, 2, 6, 3));
      engine_io_t o = {1, 5, 4, g, g + 4 * 34, 4 * 34, 4 * 34, NULL, NULL, 0, 0};
      ASSERT_OK(engine_get(f.eng, f.cid, &x, &o, 1));
      ASSERT_MEM_EQ(g, k + 2 * 34, 4 * 34); /* tokens 2..5 now at 5..8, bytes unchanged */
    }
    fx_close(&f);
  }
}
