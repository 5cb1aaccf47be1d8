/* rope.c: the property behind moving keys in the daemon: a key computed at
 * position p and re-rotated by delta equals the key computed directly at
 * p + delta, within the dtype's rounding, for both RoPE styles and every
 * float dtype (int8 too: dequantized, rotated, quantized again).
 *
 * The reference rotation here is written from the RoPE definition, apart
 * from src/rope.c: pair i turns by (p / scale) * theta^(-2i / dims).
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
} rcase_t;

/* Token t's key before rotation, one head of one layer. */
static void base_key(uint32_t l, uint64_t t, uint32_t h, double *x) {
  for (uint32_t d = 0; d < DK; d++) x[d] = fx_val(9, l, t, h, d, 0, 1) / 64.0;
}

static void ref_rotate(const rcase_t *rc, double p, double *x) {
  for (uint32_t i = 0; i < DIMS / 2; i++) {
    uint32_t a = rc->style == KVC_ROPE_GPTJ ? 2 * i : i;
    uint32_t b = rc->style == KVC_ROPE_GPTJ ? 2 * i + 1 : i + DIMS / 2;
    double ang = p / (rc->scale ? rc->scale : 1.0) * pow(10000.0, -2.0 * i / DIMS);
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

static void run_case(const rcase_t *rc) {
  kvc_layout_t l = fx_layout(NL, NH, DK, DV, rc->dt, 4);
  l.rope_dims = DIMS;
  l.rope_style = rc->style;
  l.rope_theta = 10000;
  l.rope_scale = rc->scale;
  fx_t f;
  fx_open(&f, &l, 32);
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
      {KVC_DTYPE_F32, KVC_ROPE_NEOX, 8, 1e-5},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
}
