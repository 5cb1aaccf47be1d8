/* xfer.c: the ranges and sizes of a transfer (layers, heads, buffer dtype,
 * bytes per buffer), checked in full before a put or a get changes anything. */
#include "xfer.h"

#include "dtype.h"
#include "ggml.h"

int xfer_resolve(engine_t *eng, const cache_t *c, const engine_xfer_t *x, bool is_put,
                 layout_xfer_t *r) {
  kvc_xfer_t kx = {0, 0, 0, 0, 0, 0, 0};
  if (x)
    kx = (kvc_xfer_t){x->layer_begin, x->layer_end, x->head_begin, x->head_end, x->dtype,
                      x->k_scale, x->v_scale};
  char why[128];
  int rc = layout_xfer(&c->layout, &kx, is_put, r, why, sizeof why);
  return rc ? engine_fail(eng, rc, "%s", why) : 0;
}


int engine_xfer_bytes(engine_t *eng, uint32_t cache_id, const engine_xfer_t *x, bool is_put,
                      uint64_t ntokens, uint64_t *k_bytes, uint64_t *v_bytes,
                      uint64_t *scale_bytes) {
  if (!eng) return KVC_E_INVAL;
  cache_t *c;
  int rc = engine_find_cache(eng, cache_id, &c);
  if (rc) return rc;
  layout_xfer_t r;
  rc = xfer_resolve(eng, c, x, is_put, &r);
  if (rc) return rc;
  if (layout_xfer_bytes(&r, ntokens, k_bytes, v_bytes, scale_bytes))
    return engine_fail(eng, KVC_E_OVERFLOW, "transfer of %llu tokens overflows",
                       (unsigned long long)ntokens);
  return 0;
}

/* Checks an entry's position arithmetic and buffers; not its sequence. */
static int entry_check(engine_t *eng, const cache_t *c, const layout_xfer_t *r, bool is_put,
                       const engine_io_t *e, size_t i) {
  uint64_t end, kb, vb, sb;
  if (__builtin_add_overflow(e->pos, e->ntokens, &end))
    return engine_fail(eng, KVC_E_OVERFLOW, "entry %zu: pos + ntokens overflows", i);
  if (end > KVC_MAX_SEQ_TOKENS)
    return engine_fail(eng, KVC_E_RANGE, "entry %zu: end %llu beyond the maximum of %llu", i,
                       (unsigned long long)end, (unsigned long long)KVC_MAX_SEQ_TOKENS);
  if (layout_xfer_bytes(r, e->ntokens, &kb, &vb, &sb))
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
  kvc_dtype_t st = c->layout.dtype;
  if (is_put && dtype_is_block(st) && r->bt != st && e->ntokens &&
      (!ggml_check(e->k, r->bt, kb / dtype_size(r->bt), st) ||
       !ggml_check(e->v, r->bt, vb / dtype_size(r->bt), st)))
    return engine_fail(eng, KVC_E_NONFINITE,
                       "entry %zu: NaN, inf, or a block whose scale overflows f16 cannot be "
                       "quantized to %s (ggml leaves them undefined)", i,
                       st == KVC_DTYPE_Q8_0 ? "q8_0" : "q4_0");
  return 0;
}

/* Checks what every put and get checks first: the cache, the entry count,
 * the transfer's ranges and each entry's arithmetic and buffers. */
int xfer_begin(engine_t *eng, uint32_t cache_id, const engine_xfer_t *x, bool is_put,
                    const engine_io_t *entries, size_t n, cache_t **c, layout_xfer_t *r) {
  int rc = engine_find_cache(eng, cache_id, c);
  if (rc) return rc;
  if (!entries || n == 0) return engine_fail(eng, KVC_E_INVAL, "no entries");
  if (n > XFER_MAX_BATCH) return engine_fail(eng, KVC_E_TOOMANY, "at most %u entries", XFER_MAX_BATCH);
  rc = xfer_resolve(eng, *c, x, is_put, r);
  for (size_t i = 0; rc == 0 && i < n; i++) rc = entry_check(eng, *c, r, is_put, &entries[i], i);
  return rc;
}
