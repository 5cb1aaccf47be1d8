/* xfer.c: the ranges and sizes of a transfer (layers, heads, buffer dtype,
 * bytes per buffer), checked in full before a put or a get changes anything. */
#include "xfer.h"

#include "dtype.h"

int xfer_resolve(engine_t *eng, const cache_t *c, const engine_xfer_t *x, bool is_put,
                        xrange_t *r) {
  engine_xfer_t d = {0, 0, 0, 0, 0, NULL};
  if (!x) x = &d;
  const geom_t *g = &c->g;
  r->l0 = x->layer_begin;
  r->l1 = x->layer_end ? x->layer_end : g->L;
  r->h0 = x->head_begin;
  r->h1 = x->head_end ? x->head_end : g->H;
  if (r->l0 >= r->l1 || r->l1 > g->L)
    return engine_fail(eng, KVC_E_LAYER, "layer range [%u, %u) outside 0..%u", r->l0, r->l1,
                       g->L);
  if (r->h0 >= r->h1 || r->h1 > g->H)
    return engine_fail(eng, KVC_E_HEAD, "head range [%u, %u) outside 0..%u", r->h0, r->h1,
                       g->H);
  if (is_put && (r->h0 != 0 || r->h1 != g->H))
    return engine_fail(eng, KVC_E_HEAD, "a put writes every head");
  kvc_dtype_t st = c->layout.dtype, bt = x->dtype;
  if (bt == 0) bt = g->int8 ? KVC_DTYPE_F32 : st;
  bool ok;
  if (g->int8)
    ok = is_put ? (bt == KVC_DTYPE_F32 || bt == KVC_DTYPE_F16 || bt == KVC_DTYPE_BF16)
                : (bt == KVC_DTYPE_F32 || bt == KVC_DTYPE_INT8);
  else
    ok = bt == st || bt == KVC_DTYPE_F32;
  if (!ok)
    return engine_fail(eng, KVC_E_DTYPE, "cannot %s dtype %d for a cache of dtype %d",
                       is_put ? "put" : "get", (int)bt, (int)st);
  r->bt = bt;
  return 0;
}

/* Buffer bytes of ntokens for r: K, V and (raw int8) each scale buffer. */
int xfer_sizes(const cache_t *c, const xrange_t *r, uint64_t ntokens, uint64_t *kb,
                      uint64_t *vb, uint64_t *sb) {
  uint64_t rows, krow = (uint64_t)c->g.dk * dtype_size(r->bt);
  uint64_t vrow = (uint64_t)c->g.dv * dtype_size(r->bt);
  if (__builtin_mul_overflow((uint64_t)(r->l1 - r->l0) * (r->h1 - r->h0), ntokens, &rows) ||
      __builtin_mul_overflow(rows, krow, kb) || __builtin_mul_overflow(rows, vrow, vb) ||
      __builtin_mul_overflow(rows, 4, sb))
    return KVC_E_OVERFLOW;
  if (!(c->g.int8 && r->bt == KVC_DTYPE_INT8)) *sb = 0;
  return 0;
}

int engine_xfer_bytes(engine_t *eng, uint32_t cache_id, const engine_xfer_t *x, bool is_put,
                      uint64_t ntokens, uint64_t *k_bytes, uint64_t *v_bytes,
                      uint64_t *scale_bytes) {
  if (!eng) return KVC_E_INVAL;
  cache_t *c;
  int rc = engine_find_cache(eng, cache_id, &c);
  if (rc) return rc;
  xrange_t r;
  uint64_t kb, vb, sb;
  rc = xfer_resolve(eng, c, x, is_put, &r);
  if (rc) return rc;
  if (xfer_sizes(c, &r, ntokens, &kb, &vb, &sb))
    return engine_fail(eng, KVC_E_OVERFLOW, "transfer of %llu tokens overflows",
                       (unsigned long long)ntokens);
  if (k_bytes) *k_bytes = kb;
  if (v_bytes) *v_bytes = vb;
  if (scale_bytes) *scale_bytes = sb;
  return 0;
}

/* Checks an entry's position arithmetic and buffers; not its sequence. */
static int entry_check(engine_t *eng, const cache_t *c, const xrange_t *r, bool is_put,
                       const engine_io_t *e, size_t i) {
  uint64_t end, kb, vb, sb;
  if (__builtin_add_overflow(e->pos, e->ntokens, &end))
    return engine_fail(eng, KVC_E_OVERFLOW, "entry %zu: pos + ntokens overflows", i);
  if (end > KVC_MAX_SEQ_TOKENS)
    return engine_fail(eng, KVC_E_RANGE, "entry %zu: end %llu beyond the maximum of %llu", i,
                       (unsigned long long)end, (unsigned long long)KVC_MAX_SEQ_TOKENS);
  if (xfer_sizes(c, r, e->ntokens, &kb, &vb, &sb))
    return engine_fail(eng, KVC_E_OVERFLOW, "entry %zu: size overflows", i);
  if (e->k_bytes != kb || e->v_bytes != vb || (sb && (e->k_scale_bytes != sb ||
                                                      e->v_scale_bytes != sb)))
    return engine_fail(eng, KVC_E_SIZE,
                       "entry %zu: buffers of %llu/%llu bytes, layout needs %llu/%llu", i,
                       (unsigned long long)e->k_bytes, (unsigned long long)e->v_bytes,
                       (unsigned long long)kb, (unsigned long long)vb);
  if (e->ntokens && (!e->k || !e->v || (sb && (!e->k_scale || !e->v_scale))))
    return engine_fail(eng, KVC_E_INVAL, "entry %zu: NULL buffer", i);
  if (is_put && c->g.int8 && e->ntokens &&
      (!dtype_all_finite(e->k, r->bt, kb / dtype_size(r->bt)) ||
       !dtype_all_finite(e->v, r->bt, vb / dtype_size(r->bt))))
    return engine_fail(eng, KVC_E_NONFINITE, "entry %zu: NaN or inf cannot be quantized", i);
  return 0;
}

/* Checks what every put and get checks first: the cache, the entry count,
 * the transfer's ranges and each entry's arithmetic and buffers. */
int xfer_begin(engine_t *eng, uint32_t cache_id, const engine_xfer_t *x, bool is_put,
                    const engine_io_t *entries, size_t n, cache_t **c, xrange_t *r) {
  int rc = engine_find_cache(eng, cache_id, c);
  if (rc) return rc;
  if (!entries || n == 0) return engine_fail(eng, KVC_E_INVAL, "no entries");
  if (n > XFER_MAX_BATCH) return engine_fail(eng, KVC_E_TOOMANY, "at most %u entries", XFER_MAX_BATCH);
  rc = xfer_resolve(eng, *c, x, is_put, r);
  for (size_t i = 0; rc == 0 && i < n; i++) rc = entry_check(eng, *c, r, is_put, &entries[i], i);
  return rc;
}
