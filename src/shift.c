/* shift.c: moving a sequence's tokens to other positions, with their keys
 * re-rotated (remove of a middle range, llama.cpp's seq_add), and the other
 * llama.cpp-style sequence calls (seq_rm without a shift, seq_keep, pos_min,
 * pos_max).
 *
 *   remove [2, 4) of 0..7:   slots 0 1 2 3 4 5 6      0 1 4 5 6
 *                                  a b c d e f g  ->  a b e f g
 *   e, f, g move down by 2; their keys turn by -2 positions (rope.h).
 *
 * The pages written (the target slots) are made unshared first, all or
 * nothing like a put: KVC_E_FULL changes nothing.
 */
#include <string.h>

#include "shift.h"
#include "holes.h"
#include "lru.h"
#include "prefix.h"
#include "room.h"
#include "seq.h"
#include "rope.h"
#include "dtype.h"


/* Copies slot `from` to slot `to` in every layer (K, V, int8 scales), then
 * turns the key by the rope's delta (rp NULL: no rotation). */
static void slot_copy(engine_t *eng, const seq_t *s, uint64_t from, uint64_t to,
                      const rope_t *rp) {
  const geom_t *g = &s->cache->g;
  uint64_t T1 = g->T - 1, tf = from & T1, tt = to & T1, sr = (uint64_t)g->H * 4;
  unsigned char *pf = pool_page(&eng->pool, s->table[(from >> g->tshift) - s->base]);
  unsigned char *pt = pool_page(&eng->pool, s->table[(to >> g->tshift) - s->base]);
  for (uint32_t l = 0; l < g->L; l++, pf += g->layer_bytes, pt += g->layer_bytes) {
    memmove(pt + tt * g->k_row, pf + tf * g->k_row, g->k_row);
    memmove(pt + g->k_off_v + tt * g->v_row, pf + g->k_off_v + tf * g->v_row, g->v_row);
    if (g->int8) {
      memmove(pt + g->ks_off + tt * sr, pf + g->ks_off + tf * sr, sr);
      memmove(pt + g->vs_off + tt * sr, pf + g->vs_off + tf * sr, sr);
    }
    if (rp)
      rope_rotate_row(rp, g, s->cache->layout.dtype, pt + tt * g->k_row,
                      g->int8 ? pt + g->ks_off + tt * sr : NULL);
  }
}

/* What a move allocates before anything changes. */
typedef struct move_mem {
  hole_t *tmp;
  double *cs, *x;
  float *f;
  span_t *spans; /* the target's pages that are written (target_spans) */
} move_mem_t;

static void move_mem_free(engine_t *eng, move_mem_t *m) {
  mem_free(&eng->mem, m->spans);
  mem_free(&eng->mem, m->tmp);
  mem_free(&eng->mem, m->cs);
  mem_free(&eng->mem, m->x);
  mem_free(&eng->mem, m->f);
}

/* The pages of the target [p0 + delta, p1 + delta) that the move makes
 * writable, as runs of slots in m->spans (*n of them): every page the
 * sequence holds there (its slots change), and the pages with no page (all
 * holes, or past the table) that receive a token. One that would receive
 * only holes needs no page: counting it made a move over holes on a full
 * pool FULL for nothing. */
static int target_spans(engine_t *eng, seq_t *s, uint64_t p0, uint64_t p1, int64_t delta,
                        move_mem_t *m, size_t *n) {
  uint32_t sh = s->cache->g.tshift;
  uint64_t T = s->cache->g.T, dlo = p0 + (uint64_t)delta, dhi = p1 + (uint64_t)delta;
  *n = 0;
  if (dhi <= dlo) return 0;
  uint64_t first = dlo >> sh, last = (dhi - 1) >> sh;
  if (!(m->spans = mem_alloc(&eng->mem, (last - first + 1) * sizeof *m->spans)))
    return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  size_t k = 0;
  for (uint64_t idx = first; idx <= last; idx++) {
    uint64_t a = idx * T > dlo ? idx * T : dlo, b = (idx + 1) * T < dhi ? (idx + 1) * T : dhi;
    uint64_t rel = idx - s->base;
    bool held = rel < s->ntable && s->table[rel] != POOL_NOPAGE;
    if (!held && holes_cover(s->x->holes, s->x->nholes, a - (uint64_t)delta, b - (uint64_t)delta))
      continue;
    if (k && m->spans[k - 1].end == a) m->spans[k - 1].end = b;
    else m->spans[k++] = (span_t){s, a, b, false};
  }
  *n = k;
  return 0;
}

/* Moves slots [p0, p1) (p1 <= len) of s by delta, all or nothing; their
 * positions (and keys, when rotate) move by rdelta: delta itself unless s has
 * positions of its own. The target may overlap held tokens only where the
 * caller allows it. remove: the slots between the target and p0 are a
 * removed range (shift_remove), dropped with the tail they precede; else
 * they keep their tokens. */
static int relocate(engine_t *eng, seq_t *s, uint64_t p0, uint64_t p1, int64_t delta,
                    int64_t rdelta, bool rotate, bool remove) {
  const cache_t *c = s->cache;
  uint64_t dlo = p0 + (uint64_t)delta, dhi = p1 + (uint64_t)delta, tend = seq_table_end(s);
  move_mem_t m = {0};
  uint32_t dk = c->g.dk;
  int rc = 0;
  if (seq_reserve(eng, s, seq_pages_for(s, dhi > tend ? dhi : tend)) ||
      holes_reserve(eng, s, s->x->nholes + 4) ||
      !(m.tmp = mem_alloc(&eng->mem, (s->x->nholes + 1) * sizeof *m.tmp)) ||
      (rotate && (!(m.cs = mem_alloc(&eng->mem, (c->layout.rope_dims + 2) * sizeof *m.cs)) ||
                  !(m.x = mem_alloc(&eng->mem, dk * sizeof *m.x)) ||
                  !(m.f = mem_alloc(&eng->mem, dk * sizeof *m.f))))) {
    rc = engine_fail(eng, KVC_E_NOMEM, "out of memory");
    goto out;
  }
  size_t nsp;
  if ((rc = target_spans(eng, s, p0, p1, delta, &m, &nsp))) goto out;
  eng->epoch++;
  s->mark = eng->epoch; /* never evicted to make room for itself */
  if ((rc = room_make(eng, m.spans, nsp))) {
    if (rc == KVC_E_FULL) s->cache->st.full_errors++;
    goto out;
  }
  rope_t rp = {0, false, m.cs, m.x, m.f};
  if (rotate) rope_init(&rp, &c->layout, rdelta);
  for (size_t i = 0; i < nsp; i++) room_writable(eng, s, m.spans[i].pos, m.spans[i].end);
  room_done(eng);
  room_table_to(s, dhi); /* past the last page written: entries of no page */
  if (delta < 0)
    for (uint64_t q = p0; q < p1; q++) {
      if (!holes_has(s, q)) slot_copy(eng, s, q, q + (uint64_t)delta, rotate ? &rp : NULL);
    }
  else
    for (uint64_t q = p1; q-- > p0;) {
      if (!holes_has(s, q)) slot_copy(eng, s, q, q + (uint64_t)delta, rotate ? &rp : NULL);
    }
  if (s->x->pos) { /* the labels move with their slots, by rdelta */
    uint64_t b = (uint64_t)s->base << c->g.tshift;
    if (delta < 0)
      for (uint64_t q = p0; q < p1; q++)
        s->x->pos[q + (uint64_t)delta - b] = (uint32_t)((int64_t)s->x->pos[q - b] + rdelta);
    else
      for (uint64_t q = p1; q-- > p0;)
        s->x->pos[q + (uint64_t)delta - b] = (uint32_t)((int64_t)s->x->pos[q - b] + rdelta);
  }
  prefix_put_untokened(eng, s, dlo, dhi);
  seq_chain_cut(s, p0); /* moved up, the slots they left are holes */
  uint64_t len = s->len;
  holes_move(s, p0, p1, delta, m.tmp);
  if (delta < 0 && p1 == len && remove) {
    seq_truncate(eng, s, dhi); /* the tail moved down over the range removed */
  } else {
    if (delta < 0) holes_add(s, dhi > p0 ? dhi : p0, p1); /* vacated */
    else holes_add(s, p0, dlo < p1 ? dlo : p1);
    if (dlo > len) holes_add(s, len, dlo);
    if (dhi > len) seq_set_lengths(eng, s, 0, c->g.L, dhi);
    /* The tail moved down: the length ends at the last token (the slots
     * between the target and p0 keep theirs). */
    if (delta < 0 && p1 == len && s->x->nholes && s->x->holes[s->x->nholes - 1].e == len)
      seq_truncate(eng, s, s->x->holes[s->x->nholes - 1].b);
  }
  /* Pages the move left all holes (vacated, or holes moved in) go back. */
  seq_release_holes(eng, s, dlo < p0 ? dlo : p0, dhi > p1 ? dhi : p1);
  lru_touch(eng, s);
out:
  move_mem_free(eng, &m);
  return rc;
}

/* Whether every slot of [b, e) below the length is a hole. */
static bool all_holes(const seq_t *s, uint64_t b, uint64_t e) {
  if (e > s->len) e = s->len;
  while (b < e) {
    uint32_t i = 0;
    while (i < s->x->nholes && s->x->holes[i].e <= b) i++;
    if (i == s->x->nholes || s->x->holes[i].b > b) return false;
    b = s->x->holes[i].e;
  }
  return true;
}


/* Checks that s can move its tokens (RoPE, kind, uniform layers). */
static int movable(engine_t *eng, const seq_t *s, bool need_rope) {
  const kvc_layout_t *l = &s->cache->layout;
  if (need_rope && l->attn == KVC_ATTN_ENCODER)
    return engine_fail(eng, KVC_E_KIND, "encoder entries have no positions to shift");
  if (l->attn != KVC_ATTN_ENCODER && l->rope_dims == 0 && l->rope_style != KVC_ROPE_NONE)
    return engine_fail(eng, KVC_E_NOROPE,
                       "moving tokens of cache '%s' needs its keys re-rotated: the cache "
                       "has no RoPE description (rope_style NONE declares keys without "
                       "positions, NoPE or ALiBi)", s->cache->name);
  if (l->rope_dims && dtype_is_block(l->dtype))
    return engine_fail(eng, KVC_E_DTYPE,
                       "moving tokens of cache '%s' needs its keys re-rotated, which is not "
                       "built for q8_0 and q4_0 blocks (fp8 and the float dtypes re-rotate)",
                       s->cache->name);
  if (s->x->layer_len)
    return engine_fail(eng, KVC_E_RANGE, "sequence %llu has layers of different lengths",
                       (unsigned long long)s->id);
  return 0;
}

int shift_remove(engine_t *eng, seq_t *s, uint64_t b, uint64_t e) {
  int rc = movable(eng, s, false);
  if (rc) return rc;
  if (b < s->start) b = s->start;
  /* With positions of their own, the later tokens take the removed range's
   * place in positions too: they go down by pos(e) - pos(b), which is
   * e - b while positions are the slots. */
  int64_t rdelta = -(int64_t)(e - b);
  if (s->x->pos) {
    rdelta = (int64_t)seq_pos(s, b) - (int64_t)seq_pos(s, e);
    for (uint64_t q = e; q < s->len; q++) {
      int64_t np = (int64_t)seq_pos(s, q) + rdelta;
      if (!holes_has(s, q) && (np < 0 || np >= (int64_t)KVC_MAX_SEQ_TOKENS))
        return engine_fail(eng, KVC_E_RANGE, "removing [%llu, %llu) of sequence %llu moves "
                           "the token in slot %llu to position %lld",
                           (unsigned long long)b, (unsigned long long)e,
                           (unsigned long long)s->id, (unsigned long long)q, (long long)np);
    }
  }
  rc = relocate(eng, s, e, s->len, -(int64_t)(e - b), rdelta, s->cache->layout.rope_dims > 0,
                true);
  if (rc == 0) eng->st.removes++;
  return rc;
}

/* Turns the key of slot q by the rope's delta in every layer. */
static void slot_rotate(engine_t *eng, const seq_t *s, uint64_t q, const rope_t *rp) {
  const geom_t *g = &s->cache->g;
  uint64_t tq = q & (g->T - 1), sr = (uint64_t)g->H * 4;
  unsigned char *p = pool_page(&eng->pool, s->table[(q >> g->tshift) - s->base]);
  for (uint32_t l = 0; l < g->L; l++, p += g->layer_bytes)
    rope_rotate_row(rp, g, s->cache->layout.dtype, p + tq * g->k_row,
                    g->int8 ? p + g->ks_off + tq * sr : NULL);
}

/* A token's new position: pos + delta (d 1, a shift) or pos / d (seq_div). */
static int64_t relabelled(uint64_t pos, int64_t delta, int64_t d) {
  return d > 1 ? (int64_t)pos / d : (int64_t)pos + delta;
}

/* Relabels the tokens of s whose positions are in [b, e) (llama.cpp's
 * seq_add with d 1, its seq_div with d > 1) without moving a slot: each key
 * turns by its own position change. All or nothing: the pages rewritten are
 * made unshared first (KVC_E_FULL with figures); a new position outside
 * [0, KVC_MAX_SEQ_TOKENS) is KVC_E_RANGE. */
static int relabel(engine_t *eng, seq_t *s, uint64_t b, uint64_t e, int64_t delta, int64_t d) {
  const cache_t *c = s->cache;
  uint64_t first = UINT64_MAX, last = 0;
  for (uint64_t q = s->start; q < s->len; q++) {
    uint64_t p = seq_pos(s, q);
    if (p < b || p >= e || holes_has(s, q)) continue;
    int64_t np = relabelled(p, delta, d);
    if (np < 0 || np >= (int64_t)KVC_MAX_SEQ_TOKENS)
      return engine_fail(eng, KVC_E_RANGE, "the token in slot %llu of sequence %llu would "
                         "move from position %llu to %lld", (unsigned long long)q,
                         (unsigned long long)s->id, (unsigned long long)p, (long long)np);
    if (first == UINT64_MAX) first = q;
    last = q;
  }
  if (first == UINT64_MAX || (d == 1 && delta == 0)) return 0;
  bool rotate = c->layout.rope_dims > 0, made = !s->x->pos;
  move_mem_t m = {0};
  uint32_t dk = c->g.dk;
  int rc = 0;
  if (seq_pos_own(eng, s) ||
      (rotate && (!(m.cs = mem_alloc(&eng->mem, (c->layout.rope_dims + 2) * sizeof *m.cs)) ||
                  !(m.x = mem_alloc(&eng->mem, dk * sizeof *m.x)) ||
                  !(m.f = mem_alloc(&eng->mem, dk * sizeof *m.f))))) {
    rc = engine_fail(eng, KVC_E_NOMEM, "out of memory");
    goto out;
  }
  if (rotate) {
    eng->epoch++;
    s->mark = eng->epoch; /* never evicted to make room for itself */
    span_t sp = {s, first, last + 1, true}; /* keys turned in place: no page of holes */
    if ((rc = room_make(eng, &sp, 1))) {
      if (rc == KVC_E_FULL) s->cache->st.full_errors++;
      goto out;
    }
    room_writable_held(eng, s, first, last + 1);
    room_done(eng);
  }
  rope_t rp = {0, false, m.cs, m.x, m.f};
  uint64_t pb = (uint64_t)s->base << c->g.tshift;
  for (uint64_t q = first; q <= last; q++) {
    uint64_t p = s->x->pos[q - pb];
    if (p < b || p >= e || holes_has(s, q)) continue;
    int64_t np = relabelled(p, delta, d);
    if (rotate && np != (int64_t)p) {
      rope_init(&rp, &c->layout, np - (int64_t)p);
      slot_rotate(eng, s, q, &rp);
    }
    s->x->pos[q - pb] = (uint32_t)np;
  }
  /* the bytes (or, without RoPE, what attended to them) are no longer the
   * prompt's from the first token relabelled */
  if (rotate) prefix_put_untokened(eng, s, first, last + 1);
  else seq_chain_cut(s, first);
  lru_touch(eng, s);
out:
  if (rc && made) seq_pos_drop(eng, s);
  move_mem_free(eng, &m);
  return rc;
}

/* Checks that s's positions can be divided: a causal cache (window and
 * chunked caches free and mask by slot ranges), keys described. */
static int dividable(engine_t *eng, const seq_t *s) {
  const kvc_layout_t *l = &s->cache->layout;
  if (l->attn != KVC_ATTN_CAUSAL)
    return engine_fail(eng, KVC_E_KIND, "seq_div needs a causal cache: cache '%s' is %s, "
                       "whose freeing and masks go by slot ranges (doc/attention.md)",
                       s->cache->name, l->attn == KVC_ATTN_ENCODER ? "an encoder cache"
                       : l->attn == KVC_ATTN_WINDOW ? "a sliding-window cache"
                                                    : "a chunked cache");
  return movable(eng, s, true);
}

int engine_seq_div(engine_t *eng, uint32_t cache_id, uint64_t seq_id, int64_t p0, int64_t p1,
                   int64_t d) {
  if (!eng) return KVC_E_INVAL;
  seq_t *s;
  uint64_t b, e;
  int rc = engine_use_seq(eng, cache_id, seq_id, &s);
  if (rc) return rc;
  if (d < 1)
    return engine_fail(eng, KVC_E_INVAL, "divisor %lld: positions divide by 1 or more",
                       (long long)d);
  seq_open_range(p0, p1, &b, &e);
  if (b > e)
    return engine_fail(eng, KVC_E_RANGE, "begin %llu > end %llu", (unsigned long long)b,
                       (unsigned long long)e);
  if ((rc = dividable(eng, s))) return rc;
  if (d == 1 || b == e) return 0;
  return relabel(eng, s, b, e, 0, d);
}

int engine_shift(engine_t *eng, uint32_t cache_id, uint64_t seq_id, int64_t p0, int64_t p1,
                 int64_t delta) {
  if (!eng) return KVC_E_INVAL;
  seq_t *s;
  uint64_t b, e;
  int rc = engine_use_seq(eng, cache_id, seq_id, &s);
  if (rc || (rc = movable(eng, s, true))) return rc;
  seq_open_range(p0, p1, &b, &e);
  if (b > e)
    return engine_fail(eng, KVC_E_RANGE, "begin %llu > end %llu", (unsigned long long)b,
                       (unsigned long long)e);
  if (s->x->pos) return relabel(eng, s, b, e, delta, 1);
  if (b < s->start) b = s->start;
  if (e > s->len) e = s->len;
  if (b >= e || delta == 0) return 0;
  if (delta <= -(int64_t)KVC_MAX_SEQ_TOKENS || delta >= (int64_t)KVC_MAX_SEQ_TOKENS ||
      (delta < 0 && (uint64_t)-delta > b - s->start) ||
      e + (uint64_t)delta > KVC_MAX_SEQ_TOKENS)
    return engine_fail(eng, KVC_E_RANGE, "shifting [%llu, %llu) by %lld leaves [start %llu, "
                       "%llu)", (unsigned long long)b, (unsigned long long)e,
                       (long long)delta, (unsigned long long)s->start,
                       (unsigned long long)KVC_MAX_SEQ_TOKENS);
  uint64_t tb = b + (uint64_t)delta, te = e + (uint64_t)delta;
  if (!(delta < 0 ? all_holes(s, tb, te < b ? te : b)
                  : all_holes(s, e > tb ? e : tb, te)))
    return engine_fail(eng, KVC_E_RANGE, "shifting [%llu, %llu) by %lld would overwrite "
                       "tokens; remove them first", (unsigned long long)b,
                       (unsigned long long)e, (long long)delta);
  return relocate(eng, s, b, e, delta, delta, s->cache->layout.rope_dims > 0, false);
}


int engine_keep(engine_t *eng, uint32_t cache_id, uint64_t seq_id) {
  if (!eng) return KVC_E_INVAL;
  cache_t *c;
  int rc = engine_find_cache(eng, cache_id, &c);
  if (rc) return rc;
  if (c->nbusy) return cache_busy(eng, c);
  size_t n = c->seqs.count, k = 0, pos = 0;
  uint64_t *ids = n ? mem_alloc(&eng->mem, n * sizeof *ids) : NULL;
  if (n && !ids) return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  seq_t *s;
  while ((s = hmap_next(&c->seqs, &pos, NULL)))
    if (s->id != seq_id) ids[k++] = s->id;
  for (size_t i = 0; i < k; i++) {
    eng->st.removes++;
    seq_drop(eng, hmap_get(&c->seqs, ids[i]));
  }
  mem_free(&eng->mem, ids);
  return 0;
}

int engine_pos_range(engine_t *eng, uint32_t cache_id, uint64_t seq_id, int64_t *pmin,
                     int64_t *pmax) {
  if (!eng) return KVC_E_INVAL;
  if (!pmin || !pmax) return engine_fail(eng, KVC_E_INVAL, "NULL argument");
  cache_t *c;
  int rc = engine_find_cache(eng, cache_id, &c);
  if (rc) return rc;
  const seq_t *s = hmap_get(&c->seqs, seq_id);
  *pmin = *pmax = -1;
  if (!s) return 0;
  if (s->x->pos) {
    for (uint64_t q = s->start; q < s->len; q++) {
      if (holes_has(s, q)) continue;
      int64_t p = (int64_t)seq_pos(s, q);
      if (*pmin < 0 || p < *pmin) *pmin = p;
      if (p > *pmax) *pmax = p;
    }
    return 0;
  }
  uint64_t lo = s->start, hi = s->len;
  for (uint32_t i = 0; i < s->x->nholes && s->x->holes[i].b <= lo; i++)
    if (s->x->holes[i].e > lo) lo = s->x->holes[i].e;
  for (uint32_t i = s->x->nholes; i-- > 0 && s->x->holes[i].e >= hi;)
    if (s->x->holes[i].b < hi) hi = s->x->holes[i].b;
  if (lo < hi) {
    *pmin = (int64_t)lo;
    *pmax = (int64_t)hi - 1;
  }
  return 0;
}
