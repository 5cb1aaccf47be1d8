/* batch.c: a forward pass's view of a cache: reserving the slots of a batch
 * before it is computed, and gathering the history it attends to with its
 * mask (ollama's StartForward and Get).
 *
 *   batch  (s0,5) (s1,2) (s0,6)          history   s0: 0..6   s1: 0..2
 *   entries          0 1 2 3 4 5 6 | 7 8 9
 *   mask  (s0,5)     0 0 0 0 0 0 x | x x x     x = -inf
 *         (s1,2)     x x x x x x x | 0 0 0
 *         (s0,6)     0 0 0 0 0 0 0 | x x x
 */
#include <math.h>
#include <string.h>

#include "copy.h"
#include "attn.h"
#include "copy.h"
#include "holes.h"
#include "lru.h"
#include "room.h"
#include "seq.h"
#include "xfer.h"
#include "quota.h"


/* One sequence of a batch: its positions [lo, hi). */
typedef struct rec {
  seq_t *s;
  uint64_t lo, hi;
  uint64_t first; /* history: its first entry */
  bool created;
} rec_t;

static int batch_check(engine_t *eng, uint32_t cache_id, const engine_tok_t *toks, size_t n,
                       cache_t **c) {
  int rc = engine_find_cache(eng, cache_id, c);
  if (rc) return rc;
  if (!toks || n == 0) return engine_fail(eng, KVC_E_INVAL, "no tokens");
  if (n > XFER_MAX_BATCH)
    return engine_fail(eng, KVC_E_TOOMANY, "at most %u tokens", XFER_MAX_BATCH);
  return 0;
}

/* A new sequence for a reservation, in the map but not enlisted. */
static int rsv_create(engine_t *eng, cache_t *c, uint64_t id, uint64_t created, seq_t **out) {
  if (eng->max_seqs && eng->nseqs + created + 1 > eng->max_seqs)
    return engine_fail(eng, KVC_E_TOOMANY, "at most %llu sequences",
                       (unsigned long long)eng->max_seqs);
  int rc = quota_check_seqs(eng, c->q, created + 1);
  if (rc) return rc;
  if (hmap_reserve(&c->seqs, &eng->mem, 1) || !(*out = seq_new(eng, c, id)))
    return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  hmap_insert(&c->seqs, id, *out);
  return 0;
}

/* Groups the batch by sequence into r (*nr of them), checking positions. */
static int rsv_group(engine_t *eng, cache_t *c, const engine_tok_t *toks, size_t n, rec_t *r,
                     size_t *nr) {
  uint64_t created = 0;
  for (size_t i = 0; i < n; i++) {
    const engine_tok_t *t = &toks[i];
    if (t->pos >= KVC_MAX_SEQ_TOKENS)
      return engine_fail(eng, KVC_E_RANGE, "token %zu: position %llu beyond the maximum", i,
                         (unsigned long long)t->pos);
    seq_t *s = hmap_get(&c->seqs, t->seq_id);
    if (s && s->busy) return seq_busy(eng, s);
    if (s && s->mark == eng->epoch) {
      rec_t *x = &r[s->slot];
      if (t->pos != x->hi)
        return engine_fail(eng, KVC_E_POSORDER,
                           "token %zu: sequence %llu at %llu, expected %llu", i,
                           (unsigned long long)t->seq_id, (unsigned long long)t->pos,
                           (unsigned long long)x->hi);
      x->hi++;
      continue;
    }
    bool made = false;
    if (!s) {
      int rc = rsv_create(eng, c, t->seq_id, created, &s);
      if (rc) return rc;
      made = true;
      created++;
    }
    s->mark = eng->epoch;
    s->slot = (uint32_t)*nr;
    r[(*nr)++] = (rec_t){s, t->pos, t->pos + 1, 0, made};
    if (s->x->layer_len)
      return engine_fail(eng, KVC_E_RANGE, "token %zu: sequence %llu has layers of "
                         "different lengths; finish its put first", i,
                         (unsigned long long)t->seq_id);
    if (t->pos < s->start)
      return engine_fail(eng, KVC_E_RANGE, "token %zu: position %llu before start %llu", i,
                         (unsigned long long)t->pos, (unsigned long long)s->start);
  }
  return 0;
}

static void rsv_rollback(engine_t *eng, cache_t *c, rec_t *r, size_t nr, size_t map_cap) {
  for (size_t i = nr; i-- > 0;) {
    if (!r[i].created) continue;
    hmap_remove(&c->seqs, r[i].s->id);
    seq_free(eng, r[i].s);
  }
  if (c->seqs.cap != map_cap) (void)hmap_resize(&c->seqs, &eng->mem, map_cap);
}

static void rsv_apply(engine_t *eng, rec_t *x, const span_t *sp) {
  seq_t *s = x->s;
  if (x->created) seq_enlist(eng, s);
  room_writable(eng, s, sp->pos, sp->end);
  if (x->hi > s->rsv_end) s->rsv_end = x->hi;
  if (x->lo > s->len) { /* the slots skipped are holes: whole pages of them hold none */
    uint64_t len = s->len;
    holes_add(s, len, x->lo);
    seq_set_lengths(eng, s, 0, s->cache->g.L, x->lo);
    seq_release_holes(eng, s, len, x->lo);
  }
  lru_touch(eng, s);
}

/* Trims every sequence of c the current call does not name (and no put holds
 * busy) to what a token at its length can still attend to. */
static void rsv_trim_idle(engine_t *eng, cache_t *c) {
  size_t pos = 0;
  seq_t *s;
  while ((s = hmap_next(&c->seqs, &pos, NULL)))
    if (s->mark != eng->epoch && !s->busy) attn_trim(eng, s, s->len);
}

int engine_reserve(engine_t *eng, uint32_t cache_id, const engine_tok_t *toks, size_t n) {
  if (!eng) return KVC_E_INVAL;
  cache_t *c;
  int rc = batch_check(eng, cache_id, toks, n, &c);
  if (rc) return rc;
  rec_t *r = mem_calloc(&eng->mem, n, sizeof *r);
  span_t *sp = mem_calloc(&eng->mem, n, sizeof *sp);
  size_t nr = 0, map_cap = c->seqs.cap;
  if (!r || !sp) {
    rc = engine_fail(eng, KVC_E_NOMEM, "out of memory");
    goto out;
  }
  eng->epoch++;
  rc = rsv_group(eng, c, toks, n, r, &nr);
  for (size_t i = 0; rc == 0 && i < nr; i++) {
    seq_t *s = r[i].s;
    /* Only the batch's slots need pages: a gap before them (lo past the
     * length) becomes holes, its whole pages table entries with none. */
    sp[i] = (span_t){s, r[i].lo, r[i].hi};
    if (seq_reserve(eng, s, seq_pages_for(s, r[i].hi)) ||
        (r[i].lo > s->len && holes_reserve(eng, s, 1))) /* rsv_apply's gap */
      rc = engine_fail(eng, KVC_E_NOMEM, "out of memory");
  }
  /* What the batch makes unreachable goes first, so a window cache reuses its
   * own pages; it stays freed even if the reservation then fails. So does
   * what the cache's idle sequences can no longer reach: their next token
   * (at their length) sees nothing before its horizon (ollama trims every
   * sequence at each StartForward). */
  for (size_t i = 0; rc == 0 && i < nr; i++) attn_trim(eng, r[i].s, r[i].lo);
  if (rc == 0 && (c->layout.attn == KVC_ATTN_WINDOW || c->layout.attn == KVC_ATTN_CHUNKED))
    rsv_trim_idle(eng, c);
  if (rc == 0 && (rc = room_make(eng, sp, nr)) == KVC_E_FULL) c->st.full_errors++;
  if (rc) {
    rsv_rollback(eng, c, r, nr, map_cap);
    goto out;
  }
  for (size_t i = 0; i < nr; i++) rsv_apply(eng, &r[i], &sp[i]);
  room_done(eng);
out:
  mem_free(&eng->mem, r);
  mem_free(&eng->mem, sp);
  return rc;
}

/* Groups a history's batch: per sequence [start, highest position + 1). */
static int hist_group(engine_t *eng, cache_t *c, const layout_xfer_t *xr, const engine_tok_t *toks,
                      size_t n, rec_t *r, size_t *nr, uint64_t *nentries) {
  for (size_t i = 0; i < n; i++) {
    const engine_tok_t *t = &toks[i];
    seq_t *s = hmap_get(&c->seqs, t->seq_id);
    if (!s)
      return engine_fail(eng, KVC_E_NOSEQ, "token %zu: no sequence %llu", i,
                         (unsigned long long)t->seq_id);
    if (s->busy) return seq_busy(eng, s);
    if (t->pos < s->start || t->pos >= seq_range_len(s, xr->l0, xr->l1))
      return engine_fail(eng, KVC_E_RANGE,
                         "token %zu: position %llu not written (start %llu, length %llu)", i,
                         (unsigned long long)t->pos, (unsigned long long)s->start,
                         (unsigned long long)seq_range_len(s, xr->l0, xr->l1));
    /* encoder entries are read whole; positional kinds up to the batch */
    uint64_t hi = c->layout.attn == KVC_ATTN_ENCODER ? seq_range_len(s, xr->l0, xr->l1)
                                                     : t->pos + 1;
    if (s->mark == eng->epoch) {
      if (hi > r[s->slot].hi) r[s->slot].hi = hi;
      continue;
    }
    s->mark = eng->epoch;
    s->slot = (uint32_t)*nr;
    r[(*nr)++] = (rec_t){s, s->start, hi, 0, false};
  }
  uint64_t total = 0;
  for (size_t i = 0; i < *nr; i++) {
    r[i].first = total;
    total += r[i].hi - r[i].lo;
  }
  *nentries = total;
  return 0;
}

static void hist_gather(engine_t *eng, const cache_t *c, const copy_plan_t *plan,
                        const rec_t *x, engine_hist_t *h) {
  const geom_t *g = &c->g;
  seq_t *s = x->s;
  for (uint64_t pos = x->lo; pos < x->hi;) {
    uint64_t idx = pos >> g->tshift, pstart = idx << g->tshift;
    uint64_t cnt = (pstart + g->T < x->hi ? pstart + g->T : x->hi) - pos;
    uint32_t page = s->table[idx - s->base];
    if (page != POOL_NOPAGE) /* else all holes: zeroed below */
      copy_out(plan, pool_page(&eng->pool, page), pos - pstart, x->first + pos - x->lo, cnt,
               h->k, h->v, NULL, NULL);
    pos += cnt;
  }
  for (uint32_t i = 0; i < s->x->nholes; i++) {
    uint64_t b = s->x->holes[i].b, e = s->x->holes[i].e < x->hi ? s->x->holes[i].e : x->hi;
    if (b < e) copy_zero(plan, x->first + b - x->lo, e - b, h->k, h->v, NULL, NULL);
  }
}

/* The mask goes by positions (the slots' unless a sequence has its own): a
 * token at position p sees an entry at position q where the kind allows it,
 * as llama.cpp masks its cells. */
static void hist_mask(const cache_t *c, const engine_tok_t *toks, size_t n, const rec_t *r,
                      uint64_t nentries, float *mask) {
  for (size_t i = 0; i < n; i++) {
    float *row = mask + i * nentries;
    for (uint64_t j = 0; j < nentries; j++) row[j] = -INFINITY;
    const seq_t *s = hmap_get(&c->seqs, toks[i].seq_id);
    const rec_t *x = &r[s->slot];
    uint64_t p = seq_pos(s, toks[i].pos);
    for (uint64_t q = x->lo; q < x->hi; q++)
      if (attn_allows(c, p, seq_pos(s, q)) && !holes_has(s, q)) row[x->first + q - x->lo] = 0;
  }
}

/* Each entry's position, and whether any sequence has positions of its own. */
static void hist_positions(const rec_t *r, size_t nr, engine_hist_t *h) {
  h->own_positions = false;
  for (size_t i = 0; i < nr; i++) {
    if (r[i].s->x->pos) h->own_positions = true;
    if (h->positions)
      for (uint64_t q = r[i].lo; q < r[i].hi; q++)
        h->positions[r[i].first + q - r[i].lo] = (int64_t)seq_pos(r[i].s, q);
  }
}

/* Checks the caller's buffers against the view's sizes. */
static int hist_sizes(engine_t *eng, const layout_xfer_t *xr, size_t n, size_t nr,
                      const engine_hist_t *h) {
  uint64_t kb, vb, mb;
  if (layout_xfer_bytes(xr, h->nentries, &kb, &vb, NULL) ||
      __builtin_mul_overflow((uint64_t)n, h->nentries, &mb) ||
      __builtin_mul_overflow(mb, 4, &mb))
    return engine_fail(eng, KVC_E_OVERFLOW, "history of %llu entries overflows",
                       (unsigned long long)h->nentries);
  if (!h->k || !h->v || !h->mask || h->k_bytes != kb || h->v_bytes != vb ||
      h->mask_bytes != mb || (h->spans && h->spans_cap < nr))
    return engine_fail(eng, KVC_E_SIZE,
                       "history of %llu entries, %zu sequences needs K %llu, V %llu, mask "
                       "%llu bytes",
                       (unsigned long long)h->nentries, nr, (unsigned long long)kb,
                       (unsigned long long)vb, (unsigned long long)mb);
  return 0;
}

int engine_history(engine_t *eng, uint32_t cache_id, const engine_xfer_t *x,
                   const engine_tok_t *toks, size_t n, engine_hist_t *h) {
  if (!eng) return KVC_E_INVAL;
  cache_t *c;
  int rc = batch_check(eng, cache_id, toks, n, &c);
  if (rc) return rc;
  if (!h) return engine_fail(eng, KVC_E_INVAL, "NULL argument");
  layout_xfer_t xr;
  if ((rc = xfer_resolve(eng, c, x, false, &xr))) return rc;
  if (xr.bt == KVC_DTYPE_INT8)
    return engine_fail(eng, KVC_E_DTYPE, "a history view returns floats, not raw int8");
  rec_t *r = mem_calloc(&eng->mem, n, sizeof *r);
  if (!r) return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  size_t nr = 0;
  eng->epoch++;
  if ((rc = hist_group(eng, c, &xr, toks, n, r, &nr, &h->nentries))) goto out;
  h->nspans = nr;
  if (h->positions && h->positions_cap < h->nentries) {
    rc = engine_fail(eng, KVC_E_SIZE, "positions of %llu entries need room for as many",
                     (unsigned long long)h->nentries);
    goto out;
  }
  if (!h->positions) hist_positions(r, nr, h); /* own_positions: even for the sizes */
  if (!h->k && !h->v && !h->mask && !h->spans) goto out; /* sizes only */
  if (!h->k && !h->v) { /* the mask (if asked) and the spans only: a zero-copy view */
    uint64_t mb;
    if (__builtin_mul_overflow((uint64_t)n, h->nentries, &mb) || __builtin_mul_overflow(mb, 4, &mb) ||
        (h->mask && h->mask_bytes != mb) || (h->spans && h->spans_cap < nr)) {
      rc = engine_fail(eng, KVC_E_SIZE, "a mask of %zu x %llu entries needs %llu bytes", n,
                       (unsigned long long)h->nentries, (unsigned long long)mb);
      goto out;
    }
    for (size_t i = 0; i < nr; i++)
      if (h->spans) h->spans[i] = (engine_span_t){r[i].s->id, r[i].lo, r[i].first,
                                                  r[i].hi - r[i].lo};
    if (h->mask) hist_mask(c, toks, n, r, h->nentries, h->mask);
    hist_positions(r, nr, h);
    goto out;
  }
  if ((rc = hist_sizes(eng, &xr, n, nr, h))) goto out;
  copy_plan_t plan;
  copy_plan_init(&plan, &c->g, c->layout.dtype, xr.l0, xr.l1 - xr.l0, xr.h0, xr.h1 - xr.h0,
                 xr.bt, h->nentries);
  copy_plan_scale(&plan, xr.k_scale, xr.v_scale);
  for (size_t i = 0; i < nr; i++) {
    hist_gather(eng, c, &plan, &r[i], h);
    if (h->spans) h->spans[i] = (engine_span_t){r[i].s->id, r[i].lo, r[i].first,
                                                r[i].hi - r[i].lo};
    lru_touch(eng, r[i].s);
  }
  hist_mask(c, toks, n, r, h->nentries, h->mask);
  hist_positions(r, nr, h);
  eng->st.gets++;
  eng->st.get_tokens += h->nentries;
  eng->st.bytes_out += h->k_bytes + h->v_bytes + h->mask_bytes;
  c->st.gets++;
out:
  mem_free(&eng->mem, r);
  return rc;
}
