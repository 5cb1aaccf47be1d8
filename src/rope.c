/* rope.c: turns the rotary pairs of stored keys by a position delta. */
#include "rope.h"

#include <math.h>
#include <string.h>

#include "dtype.h"

/* The frequency of pair i (radians a position) under the layout's scaling,
 * as Hugging Face's rope_init_fn computes inv_freq for "linear", "llama3"
 * and "yarn" (YaRN's attention factor scales the keys' magnitude at their
 * computation; a re-rotation turns them and leaves it as it is). */
double rope_freq(const kvc_layout_t *l, uint32_t i) {
  double d = l->rope_dims, theta = l->rope_theta, factor = l->rope_scale ? l->rope_scale : 1.0;
  double ctx = (double)l->rope_orig_ctx, lo_f = l->rope_lo, hi_f = l->rope_hi;
  double f = pow(theta, -2.0 * (double)i / d);
  switch (l->rope_scaling) {
  case KVC_ROPE_SCALE_LLAMA3: {
    double lo_wavelen = ctx / lo_f, hi_wavelen = ctx / hi_f;
    double wavelen = 2 * M_PI / f;
    if (wavelen < hi_wavelen) return f;
    if (wavelen > lo_wavelen) return f / factor;
    double smooth = (ctx / wavelen - lo_f) / (hi_f - lo_f);
    return (1 - smooth) * f / factor + smooth * f;
  }
  case KVC_ROPE_SCALE_YARN: {
    /* the dims that turn fewer than beta_slow times over the original
     * context are interpolated, more than beta_fast extrapolated, a ramp
     * between */
    double lo = floor(d * log(ctx / (hi_f * 2 * M_PI)) / (2 * log(theta)));
    double hi = ceil(d * log(ctx / (lo_f * 2 * M_PI)) / (2 * log(theta)));
    if (lo < 0) lo = 0;
    if (hi > d - 1) hi = d - 1;
    if (hi == lo) hi += 0.001;
    double ramp = ((double)i - lo) / (hi - lo);
    ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
    double extrapolation = 1 - ramp; /* its weight */
    return f / factor * (1 - extrapolation) + f * extrapolation;
  }
  default:
    return f / factor;
  }
}

void rope_init(rope_t *r, const kvc_layout_t *l, int64_t delta) {
  r->dims = l->rope_dims;
  r->gptj = l->rope_style == KVC_ROPE_GPTJ;
  for (uint32_t i = 0; i < r->dims / 2; i++) {
    double a = (double)delta * rope_freq(l, i);
    r->cs[2 * i] = cos(a);
    r->cs[2 * i + 1] = sin(a);
  }
}

static void rotate(const rope_t *r, double *x) {
  uint32_t half = r->dims / 2;
  for (uint32_t i = 0; i < half; i++) {
    uint32_t a = r->gptj ? 2 * i : i, b = r->gptj ? 2 * i + 1 : i + half;
    double c = r->cs[2 * i], s = r->cs[2 * i + 1], xa = x[a], xb = x[b];
    x[a] = xa * c - xb * s;
    x[b] = xa * s + xb * c;
  }
}

void rope_rotate_row(const rope_t *r, const geom_t *g, kvc_dtype_t dt, unsigned char *row,
                     unsigned char *ks) {
  for (uint32_t h = 0; h < g->H; h++) {
    if (dt == KVC_DTYPE_INT8) {
      int8_t *q = (int8_t *)row + (uint64_t)h * g->dk;
      float scale;
      memcpy(&scale, ks + 4 * h, 4);
      dtype_dequantize(r->f, q, scale, g->dk);
      dtype_convert(r->x, KVC_DTYPE_F64, r->f, KVC_DTYPE_F32, g->dk);
      rotate(r, r->x);
      dtype_convert(r->f, KVC_DTYPE_F32, r->x, KVC_DTYPE_F64, g->dk);
      scale = dtype_quantize(q, r->f, KVC_DTYPE_F32, g->dk);
      memcpy(ks + 4 * h, &scale, 4);
    } else {
      unsigned char *p = row + (uint64_t)h * g->k_head;
      dtype_convert(r->x, KVC_DTYPE_F64, p, dt, r->dims);
      rotate(r, r->x);
      dtype_convert(p, dt, r->x, KVC_DTYPE_F64, r->dims);
    }
  }
}
