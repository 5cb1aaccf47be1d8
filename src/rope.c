/* rope.c: turns the rotary pairs of stored keys by a position delta. */
#include "rope.h"

#include <math.h>
#include <string.h>

#include "dtype.h"

void rope_init(rope_t *r, const kvc_layout_t *l, int64_t delta) {
  r->dims = l->rope_dims;
  r->gptj = l->rope_style == KVC_ROPE_GPTJ;
  double theta = l->rope_theta, scale = l->rope_scale ? l->rope_scale : 1.0;
  for (uint32_t i = 0; i < r->dims / 2; i++) {
    double freq = pow(theta, -2.0 * (double)i / (double)r->dims);
    double a = (double)delta / scale * freq;
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
      unsigned char *p = row + (uint64_t)h * g->dk * g->es;
      dtype_convert(r->x, KVC_DTYPE_F64, p, dt, r->dims);
      rotate(r, r->x);
      dtype_convert(p, dt, r->x, KVC_DTYPE_F64, r->dims);
    }
  }
}
