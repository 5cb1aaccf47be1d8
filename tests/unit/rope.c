/* rope.c: the property behind moving keys in the daemon: a key computed at
 * position p and re-rotated by delta equals the key computed directly at
 * p + delta, within the dtype's rounding, for both RoPE styles and every
 * float dtype (int8 and fp8 too: dequantized, rotated, quantized again).
 *
 * The reference rotation here is written from the RoPE definition, apart
 * from src/rope.c: pair i turns by (p / scale) * theta^(-2i / dims), or by p
 * times the llama3 or YaRN frequency (ref_freq).
 */
#include <math.h>

#include "engine_fixture.h"

#define NL 2
#define NH 2
#define DK 8
#define DV 4
#define DIMS 6 /* rotary dims < DK: the last two dims are not rotated */
#define NTOK 12

typedef struct rcase {
  kvc_dtype_t dt;
  kvc_rope_style_t style;
  float scale;
  double tol; /* relative to the row's largest element */
  kvc_rope_scaling_t scaling; /* LLAMA3, YARN: theta, lo, hi, ctx below */
  double theta;
  float lo, hi;
  uint32_t ctx;
} rcase_t;

/* Pair i's frequency, from the definitions (Hugging Face's "linear",
 * "llama3" and "yarn" inv_freq), written apart from src/rope.c. */
static double ref_freq(const rcase_t *rc, uint32_t i) {
  double theta = rc->theta ? rc->theta : 10000.0, factor = rc->scale ? rc->scale : 1.0;
  double inv = 1.0 / pow(theta, (2.0 * i) / DIMS);
  if (rc->scaling == KVC_ROPE_SCALE_LLAMA3) {
    double wl = 2 * M_PI / inv, lo_wl = rc->ctx / (double)rc->lo, hi_wl = rc->ctx / (double)rc->hi;
    if (wl < hi_wl) return inv;
    if (wl > lo_wl) return inv / factor;
    double s = (rc->ctx / wl - rc->lo) / ((double)rc->hi - rc->lo);
    return (1 - s) * inv / factor + s * inv;
  }
  if (rc->scaling == KVC_ROPE_SCALE_YARN) {
    double lo = floor(DIMS * log(rc->ctx / (rc->hi * 2 * M_PI)) / (2 * log(theta)));
    double hi = ceil(DIMS * log(rc->ctx / (rc->lo * 2 * M_PI)) / (2 * log(theta)));
    lo = fmax(lo, 0), hi = fmin(hi, DIMS - 1);
    if (lo == hi) hi += 0.001;
    double ramp = fmin(fmax((i - lo) / (hi - lo), 0), 1);
    return inv / factor * ramp + inv * (1 - ramp);
  }
  return inv / factor;
}

/* Token t's key before rotation, one head of one layer. */
static void base_key(uint32_t l, uint64_t t, uint32_t h, double *x) {
  for (uint32_t d = 0; d < DK; d++) x[d] = fx_val(9, l, t, h, d, 0, 1) / 64.0;
}

static void ref_rotate(const rcase_t *rc, double p, double *x) {
  for (uint32_t i = 0; i < DIMS / 2; i++) {
    uint32_t a = rc->style == KVC_ROPE_GPTJ ? 2 * i : i;
    uint32_t b = rc->style == KVC_ROPE_GPTJ ? 2 * i + 1 : i + DIMS / 2;
    double ang = p * ref_freq(rc, i);
    double xa = x[a], xb = x[b];
    x[a] = xa * cos(ang) - xb * sin(ang);
    x[b] = xa * sin(ang) + xb * cos(ang);
  }
}

/* Puts tokens 0..NTOK-1 of seq, token t's key rotated to position t. */
static void put_keys(fx_t *f, const rcase_t *rc, uint64_t seq) {
  static float k[NL][NTOK][NH][DK], v[NL][NTOK][NH][DV];
  for (uint32_t l = 0; l < NL; l++)
    for (uint64_t t = 0; t < NTOK; t++)
      for (uint32_t h = 0; h < NH; h++) {
        double x[DK];
        base_key(l, t, h, x);
        ref_rotate(rc, (double)t, x);
        for (uint32_t d = 0; d < DK; d++) k[l][t][h][d] = (float)x[d];
        for (uint32_t d = 0; d < DV; d++) v[l][t][h][d] = fx_val(9, l, t, h, d, 1, 1) / 64;
      }
  engine_io_t io = {.seq_id = seq, .pos = 0, .ntokens = NTOK, .k = k, .v = v,
                    .k_bytes = sizeof k, .v_bytes = sizeof v};
  engine_xfer_t x = {0, 0, 0, 0, KVC_DTYPE_F32, NULL};
  ASSERT_OK(engine_put(f->eng, f->cid, &x, &io, 1));
}

/* Token t now at position pos: its key must be the key computed at pos. */
static void expect_keys(fx_t *f, const rcase_t *rc, uint64_t seq, uint64_t pos, uint64_t t0,
                        uint64_t n) {
  static float k[NL][NTOK][NH][DK], v[NL][NTOK][NH][DV];
  engine_io_t io = {.seq_id = seq, .pos = pos, .ntokens = n, .k = k, .v = v,
                    .k_bytes = (uint64_t)NL * n * NH * DK * 4,
                    .v_bytes = (uint64_t)NL * n * NH * DV * 4};
  engine_xfer_t x = {0, 0, 0, 0, KVC_DTYPE_F32, NULL};
  ASSERT_OK(engine_get(f->eng, f->cid, &x, &io, 1));
  const float *K = &k[0][0][0][0], *V = &v[0][0][0][0]; /* [layer][n][head][dim] */
  for (uint32_t l = 0; l < NL; l++)
    for (uint64_t i = 0; i < n; i++)
      for (uint32_t h = 0; h < NH; h++) {
        double want[DK], mx = 0;
        base_key(l, t0 + i, h, want);
        ref_rotate(rc, (double)(pos + i), want);
        for (uint32_t d = 0; d < DK; d++) mx = fmax(mx, fabs(want[d]));
        for (uint32_t d = 0; d < DK; d++)
          if (fabs(K[((l * n + i) * NH + h) * DK + d] - want[d]) > rc->tol * mx)
            TEST_FAIL_("dtype %d style %d: layer %u token %" PRIu64 " at %" PRIu64
                       " head %u dim %u: K %.9g, expected %.9g (tolerance %.3g)",
                       (int)rc->dt, (int)rc->style, l, t0 + i, pos + i, h, d,
                       (double)K[((l * n + i) * NH + h) * DK + d], want[d], rc->tol * mx);
        for (uint32_t d = 0; d < DV; d++) {
          double vw = fx_val(9, l, t0 + i, h, d, 1, 1) / 64;
          if (fabs(V[((l * n + i) * NH + h) * DV + d] - vw) > rc->tol * 8)
            TEST_FAIL_("V of token %" PRIu64 " dim %u: %g, expected %g", t0 + i, d,
                       (double)V[((l * n + i) * NH + h) * DV + d], vw);
        }
      }
}

/* An engine of 32 pages and a cache whose keys carry rc's rotation. */
static void open_case(fx_t *f, const rcase_t *rc) {
  kvc_layout_t l = fx_layout(NL, NH, DK, DV, rc->dt, 4);
  l.rope_dims = DIMS;
  l.rope_style = rc->style;
  l.rope_theta = rc->theta ? (float)rc->theta : 10000;
  l.rope_scale = rc->scale;
  l.rope_scaling = rc->scaling;
  l.rope_lo = rc->lo;
  l.rope_hi = rc->hi;
  l.rope_orig_ctx = rc->ctx;
  fx_open(f, &l, 32);
}

static void run_case(const rcase_t *rc) {
  fx_t f;
  open_case(&f, rc);
  /* shift up: tokens 6..11 to 11..16 (holes at 6..10) */
  put_keys(&f, rc, 0);
  ASSERT_OK(engine_shift(f.eng, f.cid, 0, 6, -1, 5));
  expect_keys(&f, rc, 0, 0, 0, 6);
  expect_keys(&f, rc, 0, 11, 6, 6);
  FX_AUDIT(f.eng);
  /* shift back down into the holes: the keys return to where they were */
  ASSERT_OK(engine_shift(f.eng, f.cid, 0, 11, -1, -5));
  expect_keys(&f, rc, 0, 0, 0, NTOK);
  /* remove a middle range [2, 5): tokens 5..11 at 2..8, delta -3 */
  put_keys(&f, rc, 1);
  ASSERT_OK(engine_copy_prefix(f.eng, f.cid, 1, 2, NTOK)); /* shared pages copy first */
  ASSERT_OK(engine_remove(f.eng, f.cid, 1, 2, 5));
  expect_keys(&f, rc, 1, 0, 0, 2);
  expect_keys(&f, rc, 1, 2, 5, 7);
  expect_keys(&f, rc, 2, 0, 0, NTOK);
  fx_close(&f);
}

TEST(rope_shift_equals_direct_rotation_all_dtypes_both_styles) {
  const rcase_t cases[] = {
      {KVC_DTYPE_F32, KVC_ROPE_NEOX, 0, 1e-5},   {KVC_DTYPE_F32, KVC_ROPE_GPTJ, 0, 1e-5},
      {KVC_DTYPE_F64, KVC_ROPE_NEOX, 0, 1e-6},   {KVC_DTYPE_F64, KVC_ROPE_GPTJ, 2, 1e-6},
      {KVC_DTYPE_F16, KVC_ROPE_NEOX, 0, 4e-3},   {KVC_DTYPE_F16, KVC_ROPE_GPTJ, 0, 4e-3},
      {KVC_DTYPE_BF16, KVC_ROPE_NEOX, 0, 3e-2},  {KVC_DTYPE_BF16, KVC_ROPE_GPTJ, 4, 3e-2},
      {KVC_DTYPE_INT8, KVC_ROPE_NEOX, 0, 3.0 / 127}, {KVC_DTYPE_INT8, KVC_ROPE_GPTJ, 0, 3.0 / 127},
      /* fp8: decoded, rotated, encoded again: 3 half-steps of 2^-3 (2^-2) */
      {KVC_DTYPE_FP8_E4M3, KVC_ROPE_NEOX, 0, 3.0 / 16}, {KVC_DTYPE_FP8_E4M3, KVC_ROPE_GPTJ, 0, 3.0 / 16},
      {KVC_DTYPE_FP8_E5M2, KVC_ROPE_NEOX, 0, 3.0 / 8}, {KVC_DTYPE_FP8_E5M2, KVC_ROPE_GPTJ, 2, 3.0 / 8},
      {KVC_DTYPE_F32, KVC_ROPE_NEOX, 8, 1e-5},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
}

/* Frequency-scaled RoPE (Llama 3.1 and YaRN): the re-rotation uses the
 * scaled frequencies of each pair, so a moved key equals one computed at its
 * new position; the cases reach each branch (kept, interpolated, smoothed /
 * ramped). A bad description is refused. */
TEST(rope_llama3_and_yarn_scaling_shift_equals_direct_rotation) {
  const rcase_t cases[] = {
      /* theta 100: wavelengths 6.3, 29, 136 against 64/8 = 8 and 64/1 = 64 */
      {KVC_DTYPE_F32, KVC_ROPE_NEOX, 8, 1e-5, KVC_ROPE_SCALE_LLAMA3, 100, 1, 8, 64},
      {KVC_DTYPE_F64, KVC_ROPE_GPTJ, 4, 1e-6, KVC_ROPE_SCALE_LLAMA3, 100, 1, 8, 64},
      {KVC_DTYPE_F32, KVC_ROPE_NEOX, 16, 1e-5, KVC_ROPE_SCALE_YARN, 10000, 1, 32, 64},
      {KVC_DTYPE_BF16, KVC_ROPE_GPTJ, 4, 3e-2, KVC_ROPE_SCALE_YARN, 500, 1, 32, 4096},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
  kvc_layout_t l = fx_layout(NL, NH, DK, DV, KVC_DTYPE_F32, 4);
  l.rope_dims = DIMS, l.rope_theta = 10000, l.rope_scale = 8;
  l.rope_scaling = KVC_ROPE_SCALE_LLAMA3, l.rope_lo = 4, l.rope_hi = 1, l.rope_orig_ctx = 64;
  fx_t f;
  fx_engine(&f, 4096, 8, 0);
  uint32_t id;
  ASSERT_ERR(engine_cache_open(f.eng, "bad", &l, &id), KVC_E_ROPE); /* lo above hi */
  l.rope_lo = 1, l.rope_hi = 4, l.rope_orig_ctx = 0;
  ASSERT_ERR(engine_cache_open(f.eng, "bad", &l, &id), KVC_E_ROPE); /* no context */
  l.rope_scaling = KVC_ROPE_SCALE_LINEAR, l.rope_orig_ctx = 64;
  ASSERT_ERR(engine_cache_open(f.eng, "bad", &l, &id), KVC_E_ROPE); /* linear takes none */
  l.rope_scaling = (kvc_rope_scaling_t)3;
  ASSERT_ERR(engine_cache_open(f.eng, "bad", &l, &id), KVC_E_ROPE);
  fx_close(&f);
}

/* The key in slot q (token q of put_keys) must be the key computed at
 * position want[q]. */
static void expect_slot_keys(fx_t *f, const rcase_t *rc, uint64_t seq, const uint64_t *want) {
  static float k[NL][NTOK][NH][DK], v[NL][NTOK][NH][DV];
  engine_io_t io = {.seq_id = seq, .pos = 0, .ntokens = NTOK, .k = k, .v = v,
                    .k_bytes = sizeof k, .v_bytes = sizeof v};
  engine_xfer_t x = {0, 0, 0, 0, KVC_DTYPE_F32, NULL};
  ASSERT_OK(engine_get(f->eng, f->cid, &x, &io, 1));
  for (uint32_t l = 0; l < NL; l++)
    for (uint64_t q = 0; q < NTOK; q++)
      for (uint32_t h = 0; h < NH; h++) {
        double w[DK], mx = 0;
        base_key(l, q, h, w);
        ref_rotate(rc, (double)want[q], w);
        for (uint32_t d = 0; d < DK; d++) mx = fmax(mx, fabs(w[d]));
        for (uint32_t d = 0; d < DK; d++)
          if (fabs(k[l][q][h][d] - w[d]) > rc->tol * mx)
            TEST_FAIL_("dtype %d style %d: layer %u slot %" PRIu64 " at position %" PRIu64
                       " dim %u: K %.9g, expected %.9g", (int)rc->dt, (int)rc->style, l, q,
                       want[q], d, (double)k[l][q][h][d], w[d]);
        for (uint32_t d = 0; d < DV; d++)
          if (v[l][q][h][d] != fx_val(9, l, q, h, d, 1, 1) / 64 && rc->dt == KVC_DTYPE_F32)
            TEST_FAIL_("V of slot %" PRIu64 " changed", q);
      }
}

/* seq_div(4, -1, 3) then seq_add(7, -1, 2): every key equals the key
 * computed directly at its new position (pos / d, then + 2), each token
 * turned by its own delta, in every dtype and both styles. */
static void run_div_case(const rcase_t *rc) {
  fx_t f;
  open_case(&f, rc);
  put_keys(&f, rc, 0);
  ASSERT_OK(engine_seq_div(f.eng, f.cid, 0, 4, -1, 3));
  uint64_t want[NTOK];
  for (uint64_t q = 0; q < NTOK; q++) want[q] = q < 4 ? q : q / 3;
  expect_slot_keys(&f, rc, 0, want);
  FX_AUDIT(f.eng);
  /* positions 7.. are none now (the highest is 11 / 3 = 3): nothing moves */
  ASSERT_OK(engine_shift(f.eng, f.cid, 0, 7, -1, 2));
  expect_slot_keys(&f, rc, 0, want);
  /* [3, 4) are slots 3, 9, 10, 11 */
  ASSERT_OK(engine_shift(f.eng, f.cid, 0, 3, 4, 2));
  for (uint64_t q = 0; q < NTOK; q++) want[q] += want[q] == 3 ? 2 : 0;
  expect_slot_keys(&f, rc, 0, want);
  fx_close(&f);
}

TEST(rope_seq_div_equals_direct_rotation_all_dtypes_both_styles) {
  const rcase_t cases[] = {
      {KVC_DTYPE_F32, KVC_ROPE_NEOX, 0, 1e-5},   {KVC_DTYPE_F32, KVC_ROPE_GPTJ, 0, 1e-5},
      {KVC_DTYPE_F64, KVC_ROPE_NEOX, 0, 1e-6},   {KVC_DTYPE_F64, KVC_ROPE_GPTJ, 2, 1e-6},
      {KVC_DTYPE_F16, KVC_ROPE_NEOX, 0, 4e-3},   {KVC_DTYPE_F16, KVC_ROPE_GPTJ, 0, 4e-3},
      {KVC_DTYPE_BF16, KVC_ROPE_NEOX, 0, 3e-2},  {KVC_DTYPE_BF16, KVC_ROPE_GPTJ, 4, 3e-2},
      {KVC_DTYPE_INT8, KVC_ROPE_NEOX, 0, 3.0 / 127}, {KVC_DTYPE_INT8, KVC_ROPE_GPTJ, 0, 3.0 / 127},
      {KVC_DTYPE_FP8_E4M3, KVC_ROPE_NEOX, 0, 3.0 / 16}, {KVC_DTYPE_FP8_E5M2, KVC_ROPE_GPTJ, 0, 3.0 / 8},
      {KVC_DTYPE_F32, KVC_ROPE_NEOX, 16, 1e-5, KVC_ROPE_SCALE_YARN, 10000, 1, 32, 64},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_div_case(&cases[i]);
}
