/* seqops.c: the operations that reshape sequences without moving tensor
 * bytes: remove and punch, copy_prefix, attach, trim_front, info, listing. */
#include <string.h>

#include "holes.h"
#include "lru.h"
#include "page.h"
#include "pin.h"
#include "prefix.h"
#include "seq.h"
#include "shift.h"
#include "quota.h"


int engine_remove(engine_t *eng, uint32_t cache_id, uint64_t seq_id, uint64_t begin,
                  uint64_t end) {
  if (!eng) return KVC_E_INVAL;
  seq_t *s;
  int rc = engine_use_seq(eng, cache_id, seq_id, &s);
  if (rc) return rc;
  if (begin > end)
    return engine_fail(eng, KVC_E_RANGE, "begin %llu > end %llu", (unsigned long long)begin,
                       (unsigned long long)end);
  if (begin == end) return 0;
  /* The length decides, not the extent: tokens a layer-range put wrote ahead
   * of the length are not in the sequence yet, so a range reaching the length
   * truncates every layer at begin, those tokens included. */
  if (end < s->len) return shift_remove(eng, s, begin, end);
  if (begin <= s->start) {
    eng->st.removes++;
    seq_drop(eng, s);
    return 0;
  }
  if (begin >= s->extent) return 0;
  eng->st.removes++;
  seq_truncate(eng, s, begin);
  lru_touch(eng, s);
  return 0;
}

int engine_punch(engine_t *eng, uint32_t cache_id, uint64_t seq_id, int64_t p0, int64_t p1) {
  if (!eng) return KVC_E_INVAL;
  seq_t *s;
  uint64_t b, e;
  int rc = engine_use_seq(eng, cache_id, seq_id, &s);
  if (rc) return rc;
  seq_open_range(p0, p1, &b, &e);
  if (b > e)
    return engine_fail(eng, KVC_E_RANGE, "begin %llu > end %llu", (unsigned long long)b,
                       (unsigned long long)e);
  if (b < s->start) b = s->start;
  if (b >= s->extent || b >= e) return 0;
  if (e >= s->len) return engine_remove(eng, cache_id, seq_id, b, e);
  if (s->x->layer_len)
    return engine_fail(eng, KVC_E_RANGE, "sequence %llu has layers of different lengths",
                       (unsigned long long)s->id);
  if (holes_reserve(eng, s, 1)) return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  holes_add(s, b, e);
  seq_chain_cut(s, b);
  seq_release_holes(eng, s, b, e); /* a page left all holes goes back to the pool */
  lru_touch(eng, s);
  eng->st.removes++;
  return 0;
}

/* Points dst's table at pages[0..ntable) (logical pages base..) and sets
 * start and lengths; the table array is dst's from now on, and so are holes
 * and pos (dst has parts of its own if either is not NULL). */
static void share_pages(engine_t *eng, seq_t *dst, const uint32_t *pages, uint32_t *table,
                        uint32_t ntable, uint32_t cap, uint32_t base, uint64_t start,
                        uint64_t n, hole_t *holes, uint32_t nholes, uint32_t *pos,
                        uint64_t pcap) {
  for (uint32_t i = 0; i < ntable; i++) {
    table[i] = pages[i]; /* an entry with no page is copied as none */
    if (table[i] != POOL_NOPAGE) page_ref(eng, table[i]);
    seq_page_add(eng, dst, table[i]);
  }
  for (uint32_t i = 0; i < dst->ntable; i++) seq_page_release(eng, dst, dst->table[i]);
  mem_free(&eng->mem, dst->table);
  seq_ext_t *x = dst->x;
  if (seq_ext_owned(dst)) {
    mem_free(&eng->mem, x->layer_len);
    x->layer_len = NULL;
    mem_free(&eng->mem, x->layer_chain);
    x->layer_chain = NULL; /* a copy holds the chain every layer holds */
    mem_free(&eng->mem, x->holes);
    x->holes = holes;
    x->nholes = x->hcap = nholes;
    mem_free(&eng->mem, x->pos);
    x->pos = pos;
    x->pcap = pcap;
    seq_ext_release(eng, dst); /* none of them: no parts of its own */
  }
  dst->rsv_end = 0;
  dst->table = table;
  dst->ntable = ntable;
  dst->cap = cap;
  dst->base = base;
  dst->start = start;
  eng->ntokens = eng->ntokens - dst->len + n;
  dst->cache->st.tokens = dst->cache->st.tokens - dst->len + n;
  dst->len = dst->extent = n;
  dst->chain_tok = dst->chain_pages = 0;
}

/* Finds dst or makes a detached new one (map room reserved); *created says
 * which. On failure the map is as it was. */
static int dst_prepare(engine_t *eng, cache_t *c, uint64_t dst_id, seq_t **dst, bool *created,
                       size_t *map_cap) {
  *map_cap = c->seqs.cap;
  *created = false;
  if ((*dst = hmap_get(&c->seqs, dst_id))) return (*dst)->busy ? seq_busy(eng, *dst) : 0;
  if (eng->max_seqs && eng->nseqs + 1 > eng->max_seqs)
    return engine_fail(eng, KVC_E_TOOMANY, "at most %llu sequences",
                       (unsigned long long)eng->max_seqs);
  int rc = quota_check_seqs(eng, c->q, 1);
  if (rc) return rc;
  if (hmap_reserve(&c->seqs, &eng->mem, 1) || !(*dst = seq_new(eng, c, dst_id))) {
    (void)hmap_resize(&c->seqs, &eng->mem, *map_cap);
    return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  }
  *created = true;
  return 0;
}

static void dst_abandon(engine_t *eng, cache_t *c, seq_t *dst, bool created, size_t map_cap) {
  if (created)
    seq_free(eng, dst);
  else
    seq_ext_release(eng, dst); /* parts this call gave it for holes or positions */
  (void)hmap_resize(&c->seqs, &eng->mem, map_cap);
}

static void dst_commit(engine_t *eng, cache_t *c, seq_t *dst, bool created) {
  if (!created) return;
  hmap_insert(&c->seqs, dst->id, dst);
  seq_enlist(eng, dst);
}

int engine_copy_prefix(engine_t *eng, uint32_t cache_id, uint64_t src_id, uint64_t dst_id,
                       uint64_t n) {
  return engine_copy_range(eng, cache_id, src_id, dst_id, 0, n);
}

int engine_copy_range(engine_t *eng, uint32_t cache_id, uint64_t src_id, uint64_t dst_id,
                      uint64_t p0, uint64_t n) {
  if (!eng) return KVC_E_INVAL;
  seq_t *src;
  int rc = engine_use_seq(eng, cache_id, src_id, &src);
  if (rc) return rc;
  cache_t *c = src->cache;
  if (src_id == dst_id)
    return engine_fail(eng, KVC_E_SAMESEQ, "copy of sequence %llu onto itself",
                       (unsigned long long)src_id);
  if (n > src->len || n < src->start)
    return engine_fail(eng, KVC_E_RANGE, "end %llu outside [start %llu, length %llu]",
                       (unsigned long long)n, (unsigned long long)src->start,
                       (unsigned long long)src->len);
  if (p0 > 0 && p0 >= n)
    return engine_fail(eng, KVC_E_RANGE, "copy of [%llu, %llu): an empty range",
                       (unsigned long long)p0, (unsigned long long)n);
  /* dst holds [start, n): from p0, or src's start if that is later; its table
   * starts at the page of its start (a shared first page holds tokens below
   * it that dst does not hold, as a trimmed sequence's does). */
  uint64_t start = p0 > src->start ? p0 : src->start;
  uint32_t sh = c->g.tshift, base = (uint32_t)(start >> sh);
  uint64_t ntable = ((n + c->g.T - 1) >> sh) - base; /* as seq_pages_for from base */
  const uint32_t *pages = src->table + (base - src->base);
  seq_t *dst;
  bool created;
  size_t map_cap;
  if ((rc = dst_prepare(eng, c, dst_id, &dst, &created, &map_cap))) return rc;
  uint32_t cap = ntable ? (uint32_t)ntable : 1;
  uint32_t *table = mem_alloc(&eng->mem, cap * sizeof *table), nh = 0, h0 = 0;
  while (h0 < src->x->nholes && src->x->holes[h0].e <= start) h0++; /* the gaps in [start, n) */
  while (h0 + nh < src->x->nholes && src->x->holes[h0 + nh].b < n) nh++;
  hole_t *holes = nh ? mem_alloc(&eng->mem, nh * sizeof *holes) : NULL;
  /* src's positions of its own come along (the slots' below n) */
  uint64_t pcap = src->x->pos && n > start ? (uint64_t)cap << sh : 0, pb = (uint64_t)base << sh;
  uint32_t *pos = pcap ? mem_alloc(&eng->mem, pcap * sizeof *pos) : NULL;
  if (!table || (nh && !holes) || (pcap && !pos) || ((nh || pcap) && seq_ext_own(eng, dst))) {
    mem_free(&eng->mem, table);
    mem_free(&eng->mem, holes);
    mem_free(&eng->mem, pos);
    dst_abandon(eng, c, dst, created, map_cap);
    return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  }
  for (uint32_t i = 0; i < nh; i++) {
    holes[i] = src->x->holes[h0 + i];
    if (holes[i].b < start) holes[i].b = start;
    if (holes[i].e > n) holes[i].e = n;
  }
  if (pos)
    memcpy(pos, src->x->pos + (pb - ((uint64_t)src->base << sh)), (n - pb) * sizeof *pos);
  /* A page whose slots in [start, n) are all holes for dst is none of dst's
   * (src may still hold tokens in it, past n): dst takes no page for it. */
  for (uint64_t i = 0; i < ntable; i++) {
    uint64_t b = (base + i) << sh, e = b + c->g.T;
    table[i] = holes_cover(holes, nh, b > start ? b : start, e < n ? e : n) ? POOL_NOPAGE
                                                                           : pages[i];
  }
  /* A pinned dst pins what it receives: the pin limit and quota apply. */
  if (dst->npins && (rc = pin_limit_check(eng, c, table, ntable))) {
    mem_free(&eng->mem, table);
    mem_free(&eng->mem, holes);
    mem_free(&eng->mem, pos);
    dst_abandon(eng, c, dst, created, map_cap);
    return rc;
  }
  dst_commit(eng, c, dst, created);
  share_pages(eng, dst, table, table, (uint32_t)ntable, cap, base, start, n, holes, nh, pos,
              pcap);
  /* dst holds src's chain as far as it copied it; a range from p0 > 0 holds
   * none (a chain starts at position 0) */
  if (start == 0) {
    dst->chain_key = src->chain_key;
    dst->chain_tok = src->chain_tok;
    dst->chain_pages = src->chain_pages;
    seq_chain_cut(dst, n);
  }
  lru_touch(eng, src);
  lru_touch(eng, dst);
  eng->st.copies++;
  return 0;
}

int engine_trim_front(engine_t *eng, uint32_t cache_id, uint64_t seq_id, uint64_t n) {
  if (!eng) return KVC_E_INVAL;
  seq_t *s;
  int rc = engine_use_seq(eng, cache_id, seq_id, &s);
  if (rc) return rc;
  if (n > s->len)
    return engine_fail(eng, KVC_E_RANGE, "trim to %llu beyond length %llu",
                       (unsigned long long)n, (unsigned long long)s->len);
  if (n <= s->start) return 0;
  seq_trim(eng, s, n);
  lru_touch(eng, s);
  eng->st.trims++;
  return 0;
}

/* Makes dst (created or replaced) exactly pages[0..m) from position 0,
 * holding their chain under key_id, and pins it for owner (0: no pin); all
 * or nothing. */
static int attach_pages(engine_t *eng, cache_t *c, uint64_t dst_id, const uint32_t *pages,
                        uint64_t m, uint64_t owner, uint32_t key_id) {
  seq_t *dst;
  bool created;
  size_t map_cap;
  int rc = dst_prepare(eng, c, dst_id, &dst, &created, &map_cap);
  if (rc) return rc;
  pin_t *have = owner ? pin_find(dst, owner) : NULL;
  pin_prep_t pp = {NULL, NULL, false, 0};
  uint32_t cap = m ? (uint32_t)m : 1;
  uint32_t *table = NULL;
  if (((owner && !have) || dst->npins) && (rc = pin_limit_check(eng, c, pages, m))) goto fail;
  if (owner && !have && (rc = pin_prepare(eng, owner, &pp))) goto fail;
  if (!(table = mem_alloc(&eng->mem, cap * sizeof *table))) {
    rc = engine_fail(eng, KVC_E_NOMEM, "out of memory");
    goto fail;
  }
  dst_commit(eng, c, dst, created);
  share_pages(eng, dst, pages, table, (uint32_t)m, cap, 0, 0, m * c->g.T, NULL, 0, NULL, 0);
  dst->chain_key = key_id; /* the matched chain, every page of it hashed */
  dst->chain_tok = m * c->g.T;
  dst->chain_pages = (uint32_t)m;
  if (pp.p) pin_commit(eng, dst, &pp, 0);
  lru_touch(eng, dst);
  return 0;
fail:
  if (pp.p) {
    mem_free(&eng->mem, pp.p);
    if (pp.new_owner) mem_free(&eng->mem, pp.o);
    (void)hmap_resize(&eng->owners, &eng->mem, pp.map_cap);
  }
  dst_abandon(eng, c, dst, created, map_cap);
  return rc;
}

int engine_seq_info(engine_t *eng, uint32_t cache_id, uint64_t seq_id, kvc_seq_info_t *out) {
  if (!eng) return KVC_E_INVAL;
  if (!out) return engine_fail(eng, KVC_E_INVAL, "NULL argument");
  seq_t *s;
  int rc = engine_find_seq(eng, cache_id, seq_id, &s);
  if (rc) return rc;
  seq_info_fill(eng, s, out);
  return 0;
}

int engine_seq_list(engine_t *eng, uint32_t cache_id, uint64_t *cursor, kvc_seq_info_t *out,
                    size_t cap, size_t *n) {
  if (!eng) return KVC_E_INVAL;
  if (!cursor || !n || (cap && !out)) return engine_fail(eng, KVC_E_INVAL, "NULL argument");
  cache_t *c;
  int rc = engine_find_cache(eng, cache_id, &c);
  if (rc) return rc;
  size_t pos = (size_t)*cursor, k = 0;
  seq_t *s;
  while (k < cap && (s = hmap_next(&c->seqs, &pos, NULL))) seq_info_fill(eng, s, &out[k++]);
  *n = k;
  *cursor = (k == cap && hmap_next(&c->seqs, &(size_t){pos}, NULL)) ? pos : 0;
  return 0;
}

int engine_page_offset(engine_t *eng, uint32_t cache_id, uint64_t seq_id, uint64_t pos,
                       uint64_t *offset) {
  if (!eng) return KVC_E_INVAL;
  if (!offset) return engine_fail(eng, KVC_E_INVAL, "NULL argument");
  seq_t *s;
  int rc = engine_use_seq(eng, cache_id, seq_id, &s);
  if (rc) return rc;
  if (pos < s->start || pos >= s->extent)
    return engine_fail(eng, KVC_E_RANGE, "pos %llu not held", (unsigned long long)pos);
  uint32_t page = s->table[(pos >> s->cache->g.tshift) - s->base];
  if (page == POOL_NOPAGE)
    return engine_fail(eng, KVC_E_RANGE, "pos %llu is in a hole of whole pages: no page holds it",
                       (unsigned long long)pos);
  *offset = pool_page_offset(&eng->pool, page);
  return 0;
}

int engine_attach(engine_t *eng, uint32_t cache_id, uint64_t dst_id, const uint32_t *tokens,
                  uint64_t n, const engine_pkey_t *key, uint64_t owner,
                  engine_match_t *out) {
  if (!eng) return KVC_E_INVAL;
  if (!out) return engine_fail(eng, KVC_E_INVAL, "NULL argument");
  cache_t *c;
  uint32_t key_id;
  int rc = prefix_match_args(eng, cache_id, tokens, n, key, &c, &key_id);
  if (rc) return rc;
  uint32_t *pages = eng->scratch;
  uint64_t m = prefix_match_pages(eng, c, tokens, n, key, key_id, pages);
  prefix_match_end(eng);
  if ((rc = attach_pages(eng, c, dst_id, pages, m, owner, key_id))) return rc;
  prefix_match_done(eng, c, pages, m, n, out);
  return 0;
}

int engine_seq_create(engine_t *eng, uint32_t cache_id, size_t n, uint64_t *ids) {
  if (!eng) return KVC_E_INVAL;
  cache_t *c;
  int rc = engine_find_cache(eng, cache_id, &c);
  if (rc) return rc;
  if (!ids || n == 0 || n > 4096)
    return engine_fail(eng, KVC_E_INVAL, "create 1 to 4096 sequences, not %zu", n);
  if (eng->max_seqs && eng->nseqs + n > eng->max_seqs)
    return engine_fail(eng, KVC_E_TOOMANY, "at most %llu sequences",
                       (unsigned long long)eng->max_seqs);
  if ((rc = quota_check_seqs(eng, c->q, n))) return rc;
  size_t cap = c->seqs.cap, made = 0;
  if (hmap_reserve(&c->seqs, &eng->mem, n)) return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  seq_t *s[64], **made_s = n <= 64 ? s : mem_alloc(&eng->mem, n * sizeof *made_s);
  if (!made_s) {
    (void)hmap_resize(&c->seqs, &eng->mem, cap);
    return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  }
  if (eng->next_seq_id < ENGINE_AUTO_SEQ_ID) eng->next_seq_id = ENGINE_AUTO_SEQ_ID;
  for (; made < n; made++) {
    while (hmap_get(&c->seqs, eng->next_seq_id))
      if (++eng->next_seq_id == 0) eng->next_seq_id = ENGINE_AUTO_SEQ_ID; /* 2^63 ids: wraps */
    uint64_t id = eng->next_seq_id++;
    if (eng->next_seq_id == 0) eng->next_seq_id = ENGINE_AUTO_SEQ_ID;
    if (!(made_s[made] = seq_new(eng, c, id))) break;
    hmap_insert(&c->seqs, id, made_s[made]);
  }
  if (made < n) { /* out of memory: none of them stays */
    for (size_t i = 0; i < made; i++) {
      hmap_remove(&c->seqs, made_s[i]->id);
      seq_free(eng, made_s[i]);
    }
    (void)hmap_resize(&c->seqs, &eng->mem, cap);
    rc = engine_fail(eng, KVC_E_NOMEM, "out of memory");
  } else {
    for (size_t i = 0; i < n; i++) {
      seq_enlist(eng, made_s[i]);
      ids[i] = made_s[i]->id;
    }
  }
  if (made_s != s) mem_free(&eng->mem, made_s);
  return rc;
}
