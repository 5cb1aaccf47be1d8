/* copy.c: row movement between buffers and pages, converting dtypes. */
#include "copy.h"

#include <string.h>

#include "dtype.h"
#include "fp8.h"
#include "ntcopy.h"

void copy_plan_init(copy_plan_t *plan, const geom_t *g, kvc_dtype_t stored, uint32_t l0,
                    uint32_t nl, uint32_t h0, uint32_t nh, kvc_dtype_t bt, uint64_t n) {
  plan->g = g;
  plan->l0 = l0;
  plan->nl = nl;
  plan->h0 = h0;
  plan->nh = nh;
  plan->stored = stored;
  plan->bt = bt;
  plan->bes = dtype_size(bt);
  plan->n = n;
  plan->bk_row = (uint64_t)nh * dtype_row_bytes(bt, g->dk);
  plan->bv_row = (uint64_t)nh * dtype_row_bytes(bt, g->dv);
  plan->plain = nh == g->H && bt == stored && !g->int8;
  plan->k_scale = plan->v_scale = 1.0f;
}

void copy_plan_scale(copy_plan_t *plan, float k_scale, float v_scale) {
  plan->k_scale = k_scale;
  plan->v_scale = v_scale;
}

bool copy_plan_slice(const copy_plan_t *x, unsigned part, unsigned nparts, copy_plan_t *out,
                     const void **k, const void **v, const void **ks, const void **vs) {
  uint32_t a = (uint32_t)((uint64_t)x->nl * part / nparts);
  uint32_t b = (uint32_t)((uint64_t)x->nl * (part + 1) / nparts);
  *out = *x;
  out->l0 = x->l0 + a;
  out->nl = b - a;
  uint64_t rows = (uint64_t)a * x->n; /* the buffers are [layer][token][...] */
  if (*k) *k = (const unsigned char *)*k + rows * x->bk_row;
  if (*v) *v = (const unsigned char *)*v + rows * x->bv_row;
  if (ks && *ks) *ks = (const float *)*ks + rows * x->nh;
  if (vs && *vs) *vs = (const float *)*vs + rows * x->nh;
  return b > a;
}

/* Quantizes nh heads of one token's rows into the page (int8 caches). */
static void quant_rows(const copy_plan_t *x, unsigned char *rows, unsigned char *scales,
                       const unsigned char *src, uint32_t dim) {
  for (uint32_t h = 0; h < x->nh; h++) {
    float s = dtype_quantize((int8_t *)(rows + (uint64_t)h * dim),
                             src + (uint64_t)h * dim * x->bes, x->bt, dim);
    memcpy(scales + (uint64_t)h * 4, &s, 4);
  }
}

void copy_in(const copy_plan_t *x, unsigned char *page, uint64_t pt0, uint64_t bt0,
             uint64_t cnt, const void *k, const void *v) {
  const geom_t *g = x->g;
  const unsigned char *kb = k, *vb = v;
  for (uint32_t li = 0; li < x->nl; li++) {
    unsigned char *lay = page + (uint64_t)(x->l0 + li) * g->layer_bytes;
    const unsigned char *ksrc = kb + (li * x->n + bt0) * x->bk_row;
    const unsigned char *vsrc = vb + (li * x->n + bt0) * x->bv_row;
    if (x->plain) {
      /* Into pool pages nobody reads soon: past the caches (ntcopy.h). */
      ntcopy(lay + pt0 * g->k_row, ksrc, cnt * g->k_row);
      ntcopy(lay + g->k_off_v + pt0 * g->v_row, vsrc, cnt * g->v_row);
      continue;
    }
    if (fp8_is(x->stored)) {
      /* A put covers every head: the run's rows are contiguous on both
       * sides, one encoding a run, streamed into the page as ntcopy. */
      fp8_encode(lay + pt0 * g->k_row, x->stored, ksrc, x->bt, cnt * g->H * g->dk, x->k_scale,
                 ISA_BEST, true);
      fp8_encode(lay + g->k_off_v + pt0 * g->v_row, x->stored, vsrc, x->bt,
                 cnt * g->H * g->dv, x->v_scale, ISA_BEST, true);
      continue;
    }
    for (uint64_t t = 0; t < cnt; t++) {
      uint64_t pt = pt0 + t;
      if (g->int8) {
        quant_rows(x, lay + pt * g->k_row, lay + g->ks_off + pt * g->H * 4,
                   ksrc + t * x->bk_row, g->dk);
        quant_rows(x, lay + g->k_off_v + pt * g->v_row, lay + g->vs_off + pt * g->H * 4,
                   vsrc + t * x->bv_row, g->dv);
      } else {
        dtype_convert(lay + pt * g->k_row, x->stored, ksrc + t * x->bk_row, x->bt,
                      (size_t)x->nh * g->dk);
        dtype_convert(lay + g->k_off_v + pt * g->v_row, x->stored, vsrc + t * x->bv_row,
                      x->bt, (size_t)x->nh * g->dv);
      }
    }
  }
}

/* Reads nh heads of one token's int8 rows: raw with scales, or dequantized. */
static void dequant_rows(const copy_plan_t *x, unsigned char *dst, unsigned char *scale_dst,
                         const unsigned char *rows, const unsigned char *scales,
                         uint32_t dim) {
  if (x->bt == KVC_DTYPE_INT8) {
    memcpy(dst, rows, (uint64_t)x->nh * dim);
    memcpy(scale_dst, scales, (uint64_t)x->nh * 4);
    return;
  }
  for (uint32_t h = 0; h < x->nh; h++) {
    float s;
    memcpy(&s, scales + (uint64_t)h * 4, 4);
    dtype_dequantize(dst + (uint64_t)h * dim * 4, (const int8_t *)(rows + (uint64_t)h * dim),
                     s, dim);
  }
}

void copy_out(const copy_plan_t *x, const unsigned char *page, uint64_t pt0, uint64_t bt0,
              uint64_t cnt, void *k, void *v, void *ks, void *vs) {
  const geom_t *g = x->g;
  unsigned char *kb = k, *vb = v, *ksb = ks, *vsb = vs;
  uint64_t khead = (uint64_t)x->h0 * g->k_head, vhead = (uint64_t)x->h0 * g->v_head;
  for (uint32_t li = 0; li < x->nl; li++) {
    const unsigned char *lay = page + (uint64_t)(x->l0 + li) * g->layer_bytes;
    unsigned char *kdst = kb + (li * x->n + bt0) * x->bk_row;
    unsigned char *vdst = vb + (li * x->n + bt0) * x->bv_row;
    if (x->plain) {
      memcpy(kdst, lay + pt0 * g->k_row, cnt * g->k_row);
      memcpy(vdst, lay + g->k_off_v + pt0 * g->v_row, cnt * g->v_row);
      continue;
    }
    if (fp8_is(x->stored) && x->bt != x->stored && x->nh == g->H) {
      /* whole heads: the run's rows are contiguous on both sides */
      fp8_decode(kdst, x->bt, lay + pt0 * g->k_row, x->stored, cnt * g->H * g->dk, x->k_scale,
                 ISA_BEST);
      fp8_decode(vdst, x->bt, lay + g->k_off_v + pt0 * g->v_row, x->stored,
                 cnt * g->H * g->dv, x->v_scale, ISA_BEST);
      continue;
    }
    for (uint64_t t = 0; t < cnt; t++) {
      uint64_t pt = pt0 + t;
      const unsigned char *krow = lay + pt * g->k_row + khead;
      const unsigned char *vrow = lay + g->k_off_v + pt * g->v_row + vhead;
      if (g->int8) {
        uint64_t srow = (li * x->n + bt0 + t) * x->nh * 4, sh = ((uint64_t)pt * g->H + x->h0) * 4;
        dequant_rows(x, kdst + t * x->bk_row, ksb ? ksb + srow : NULL, krow,
                     lay + g->ks_off + sh, g->dk);
        dequant_rows(x, vdst + t * x->bv_row, vsb ? vsb + srow : NULL, vrow,
                     lay + g->vs_off + sh, g->dv);
      } else if (fp8_is(x->stored) && x->bt != x->stored) {
        fp8_decode(kdst + t * x->bk_row, x->bt, krow, x->stored, (size_t)x->nh * g->dk,
                   x->k_scale, ISA_BEST);
        fp8_decode(vdst + t * x->bv_row, x->bt, vrow, x->stored, (size_t)x->nh * g->dv,
                   x->v_scale, ISA_BEST);
      } else {
        dtype_convert(kdst + t * x->bk_row, x->bt, krow, x->stored, (size_t)x->nh * g->dk);
        dtype_convert(vdst + t * x->bv_row, x->bt, vrow, x->stored, (size_t)x->nh * g->dv);
      }
    }
  }
}

void copy_zero(const copy_plan_t *x, uint64_t bt0, uint64_t cnt, void *k, void *v, void *ks,
               void *vs) {
  bool raw = x->bt == KVC_DTYPE_INT8;
  for (uint32_t l = 0; l < x->nl; l++) {
    uint64_t t = (uint64_t)l * x->n + bt0;
    memset((unsigned char *)k + t * x->bk_row, 0, cnt * x->bk_row);
    memset((unsigned char *)v + t * x->bv_row, 0, cnt * x->bv_row);
    if (raw) {
      memset((float *)ks + t * x->nh, 0, cnt * x->nh * sizeof(float));
      memset((float *)vs + t * x->nh, 0, cnt * x->nh * sizeof(float));
    }
  }
}
