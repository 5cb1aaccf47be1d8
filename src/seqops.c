/* seqops.c: the operations that reshape sequences without moving tensor
 * bytes: remove, copy_prefix, trim_front, can_resume, pins, info, listing. */
#include <string.h>

#include "engine_impl.h"

/* Looks up (cache, seq) or records NOCACHE / NOSEQ. */
static int find(engine_t *eng, uint32_t cache_id, uint64_t seq_id, seq_t **out) {
  cache_t *c = engine_cache(eng, cache_id);
  if (!c) return engine_fail(eng, KVC_E_NOCACHE, "no cache with id %u", cache_id);
  *out = hmap_get(&c->seqs, seq_id);
  if (!*out)
    return engine_fail(eng, KVC_E_NOSEQ, "no sequence %llu in cache '%s'",
                       (unsigned long long)seq_id, c->name);
  return 0;
}

int engine_remove(engine_t *eng, uint32_t cache_id, uint64_t seq_id, uint64_t begin,
                  uint64_t end) {
  if (!eng) return KVC_E_INVAL;
  seq_t *s;
  int rc = find(eng, cache_id, seq_id, &s);
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

/* Points dst's table at pages[0..ntable) (logical pages base..) and sets
 * start and lengths; the table array is dst's from now on. */
static void share_pages(engine_t *eng, seq_t *dst, const uint32_t *pages, uint32_t *table,
                        uint32_t ntable, uint32_t cap, uint32_t base, uint64_t start,
                        uint64_t n, hole_t *holes, uint32_t nholes) {
  for (uint32_t i = 0; i < ntable; i++) {
    table[i] = pages[i];
    page_ref(eng, table[i]);
    seq_page_add(eng, dst, table[i]);
  }
  for (uint32_t i = 0; i < dst->ntable; i++) seq_page_release(eng, dst, dst->table[i]);
  mem_free(&eng->mem, dst->table);
  mem_free(&eng->mem, dst->layer_len);
  mem_free(&eng->mem, dst->holes);
  dst->holes = holes;
  dst->nholes = dst->hcap = nholes;
  dst->rsv_end = 0;
  dst->layer_len = NULL;
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
  if ((*dst = hmap_get(&c->seqs, dst_id))) return 0;
  if (eng->max_seqs && eng->nseqs + 1 > eng->max_seqs)
    return engine_fail(eng, KVC_E_TOOMANY, "at most %llu sequences",
                       (unsigned long long)eng->max_seqs);
  if (hmap_reserve(&c->seqs, &eng->mem, 1) || !(*dst = seq_new(eng, c, dst_id))) {
    (void)hmap_resize(&c->seqs, &eng->mem, *map_cap);
    return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  }
  *created = true;
  return 0;
}

static void dst_abandon(engine_t *eng, cache_t *c, seq_t *dst, bool created, size_t map_cap) {
  if (created) seq_free(eng, dst);
  (void)hmap_resize(&c->seqs, &eng->mem, map_cap);
}

static void dst_commit(engine_t *eng, cache_t *c, seq_t *dst, bool created) {
  if (!created) return;
  hmap_insert(&c->seqs, dst->id, dst);
  seq_attach(eng, dst);
}

int engine_copy_prefix(engine_t *eng, uint32_t cache_id, uint64_t src_id, uint64_t dst_id,
                       uint64_t n) {
  if (!eng) return KVC_E_INVAL;
  seq_t *src;
  int rc = find(eng, cache_id, src_id, &src);
  if (rc) return rc;
  cache_t *c = src->cache;
  if (src_id == dst_id)
    return engine_fail(eng, KVC_E_SAMESEQ, "copy_prefix of sequence %llu onto itself",
                       (unsigned long long)src_id);
  if (n > src->len || n < src->start)
    return engine_fail(eng, KVC_E_RANGE, "n %llu outside [start %llu, length %llu]",
                       (unsigned long long)n, (unsigned long long)src->start,
                       (unsigned long long)src->len);
  seq_t *dst;
  bool created;
  size_t map_cap;
  if ((rc = dst_prepare(eng, c, dst_id, &dst, &created, &map_cap))) return rc;
  uint64_t ntable = seq_pages_for(src, n);
  uint32_t cap = ntable ? (uint32_t)ntable : 1;
  uint32_t *table = mem_alloc(&eng->mem, cap * sizeof *table), nh = 0;
  while (nh < src->nholes && src->holes[nh].b < n) nh++; /* dst keeps the gaps below n */
  hole_t *holes = nh ? mem_alloc(&eng->mem, nh * sizeof *holes) : NULL;
  if (!table || (nh && !holes)) {
    mem_free(&eng->mem, table);
    dst_abandon(eng, c, dst, created, map_cap);
    return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  }
  for (uint32_t i = 0; i < nh; i++) {
    holes[i] = src->holes[i];
    if (holes[i].e > n) holes[i].e = n;
  }
  dst_commit(eng, c, dst, created);
  share_pages(eng, dst, src->table, table, (uint32_t)ntable, cap, src->base, src->start, n,
              holes, nh);
  /* dst holds src's chain as far as it copied it */
  dst->chain_key = src->chain_key;
  dst->chain_tok = src->chain_tok;
  dst->chain_pages = src->chain_pages;
  prefix_chain_cut(dst, n);
  lru_touch(eng, src);
  lru_touch(eng, dst);
  eng->st.copies++;
  return 0;
}

int engine_trim_front(engine_t *eng, uint32_t cache_id, uint64_t seq_id, uint64_t n) {
  if (!eng) return KVC_E_INVAL;
  seq_t *s;
  int rc = find(eng, cache_id, seq_id, &s);
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

/* The owner's pin of s, or NULL. */
static pin_t *pin_find(const seq_t *s, uint64_t owner) {
  for (pin_t *p = s->pins; p; p = p->s_next)
    if (p->owner->id == owner) return p;
  return NULL;
}

void pin_unlink(engine_t *eng, pin_t *p) {
  seq_t *s = p->seq;
  owner_t *o = p->owner;
  pin_soft_unlink(eng, p);
  if (p->s_prev) p->s_prev->s_next = p->s_next;
  else s->pins = p->s_next;
  if (p->s_next) p->s_next->s_prev = p->s_prev;
  if (p->o_prev) p->o_prev->o_next = p->o_next;
  else o->pins = p->o_next;
  if (p->o_next) p->o_next->o_prev = p->o_prev;
  mem_free(&eng->mem, p);
  if (!o->pins) {
    hmap_remove(&eng->owners, o->id);
    mem_free(&eng->mem, o);
  }
  eng->st.unpins++;
}

static void pin_release(engine_t *eng, pin_t *p) {
  seq_t *s = p->seq;
  pin_unlink(eng, p);
  if (--s->npins == 0) {
    for (uint32_t i = 0; i < s->ntable; i++) pool_unpin(&eng->pool, s->table[i]);
    eng->nseqs_pinned--;
    lru_insert(eng, s); /* unpinned: the most recently used */
  }
  s->last_use_ms = eng->now_ms;
}

/* Pages of s not yet pinned by anyone: what pinning s adds to the pool's. */
static uint64_t unpinned_pages(const engine_t *eng, const uint32_t *pages, uint64_t n) {
  uint64_t k = 0;
  for (uint64_t i = 0; i < n; i++) k += eng->pool.pinref[pages[i]] == 0;
  return k;
}

/* A pin record and, for a new owner, its owner (map room reserved). */
typedef struct pin_prep {
  pin_t *p;
  owner_t *o;
  bool new_owner;
  size_t map_cap;
} pin_prep_t;

static int pin_prepare(engine_t *eng, uint64_t owner, pin_prep_t *pp) {
  pp->o = hmap_get(&eng->owners, owner);
  pp->map_cap = eng->owners.cap;
  pp->new_owner = !pp->o;
  pp->p = mem_calloc(&eng->mem, 1, sizeof *pp->p);
  if (pp->p && pp->new_owner && hmap_reserve(&eng->owners, &eng->mem, 1) == 0)
    pp->o = mem_calloc(&eng->mem, 1, sizeof *pp->o);
  if (!pp->p || !pp->o) {
    /* Nothing stays prepared: a caller's failure path frees only pp->p. */
    mem_free(&eng->mem, pp->p);
    pp->p = NULL;
    pp->o = NULL;
    (void)hmap_resize(&eng->owners, &eng->mem, pp->map_cap);
    return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  }
  if (pp->new_owner) pp->o->id = owner;
  return 0;
}

/* now + ttl, saturating: a TTL too long to add never lapses. */
static uint64_t deadline(const engine_t *eng, uint64_t ttl_ms) {
  uint64_t d;
  return __builtin_add_overflow(eng->now_ms, ttl_ms, &d) ? UINT64_MAX : d;
}

static void pin_commit(engine_t *eng, seq_t *s, pin_prep_t *pp, uint64_t ttl_ms) {
  pin_t *p = pp->p;
  owner_t *o = pp->o;
  if (pp->new_owner) hmap_insert(&eng->owners, o->id, o);
  p->seq = s;
  p->owner = o;
  p->s_next = s->pins;
  if (s->pins) s->pins->s_prev = p;
  s->pins = p;
  p->o_next = o->pins;
  if (o->pins) o->pins->o_prev = p;
  o->pins = p;
  if (ttl_ms) {
    p->ttl_ms = ttl_ms;
    p->deadline_ms = deadline(eng, ttl_ms);
    p->t_next = eng->soft;
    if (eng->soft) eng->soft->t_prev = p;
    eng->soft = p;
  }
  if (s->npins++ == 0) {
    lru_remove(s);
    eng->nseqs_pinned++;
    for (uint32_t i = 0; i < s->ntable; i++) pool_pin(&eng->pool, s->table[i]);
  }
  s->last_use_ms = eng->now_ms;
  eng->st.pins++;
}

static int pin_limit_check(engine_t *eng, const uint32_t *pages, uint64_t n) {
  uint64_t more = unpinned_pages(eng, pages, n);
  if (eng->pool.npinned + more <= eng->pin_limit) return 0;
  eng->st.pin_limit_errors++;
  return engine_fail(eng, KVC_E_PINLIMIT,
                     "pinning %llu more pages would pin %llu of %u pages; the limit is %u",
                     (unsigned long long)more, (unsigned long long)(eng->pool.npinned + more),
                     eng->pool.npages, eng->pin_limit);
}

int engine_pin_ttl(engine_t *eng, uint32_t cache_id, uint64_t seq_id, uint64_t owner,
                   uint64_t ttl_ms) {
  if (!eng) return KVC_E_INVAL;
  seq_t *s;
  int rc = find(eng, cache_id, seq_id, &s);
  if (rc) return rc;
  pin_t *have = pin_find(s, owner);
  if (have) { /* pinning again sets the kind: ttl 0 makes it hard */
    if (have->ttl_ms && !ttl_ms) pin_soft_unlink(eng, have);
    if (ttl_ms) {
      if (!have->ttl_ms) {
        have->t_next = eng->soft;
        if (eng->soft) eng->soft->t_prev = have;
        eng->soft = have;
      }
      have->deadline_ms = deadline(eng, ttl_ms);
    }
    have->ttl_ms = ttl_ms;
    return 0;
  }
  if ((rc = pin_limit_check(eng, s->table, s->ntable))) return rc;
  pin_prep_t pp;
  if ((rc = pin_prepare(eng, owner, &pp))) return rc;
  pin_commit(eng, s, &pp, ttl_ms);
  return 0;
}

int engine_pin(engine_t *eng, uint32_t cache_id, uint64_t seq_id, uint64_t owner) {
  return engine_pin_ttl(eng, cache_id, seq_id, owner, 0);
}

void pin_soft_unlink(engine_t *eng, pin_t *p) {
  if (!p->ttl_ms) return;
  if (p->t_prev) p->t_prev->t_next = p->t_next;
  else eng->soft = p->t_next;
  if (p->t_next) p->t_next->t_prev = p->t_prev;
  p->t_next = p->t_prev = NULL;
  p->ttl_ms = 0;
}

int seq_attach_pages(engine_t *eng, cache_t *c, uint64_t dst_id, const uint32_t *pages,
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
  if (owner && !have && (dst->npins == 0) && (rc = pin_limit_check(eng, pages, m))) goto fail;
  if (owner && !have && (rc = pin_prepare(eng, owner, &pp))) goto fail;
  if (!(table = mem_alloc(&eng->mem, cap * sizeof *table))) {
    rc = engine_fail(eng, KVC_E_NOMEM, "out of memory");
    goto fail;
  }
  dst_commit(eng, c, dst, created);
  share_pages(eng, dst, pages, table, (uint32_t)m, cap, 0, 0, m * c->g.T, NULL, 0);
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

size_t engine_expire(engine_t *eng) {
  if (!eng) return 0;
  size_t n = 0;
  for (pin_t *p = eng->soft, *next; p; p = next) {
    next = p->t_next;
    if (p->deadline_ms > eng->now_ms) continue;
    pin_release(eng, p);
    eng->st.pins_lapsed++;
    n++;
  }
  return n;
}

int engine_set_priority(engine_t *eng, uint32_t cache_id, uint64_t seq_id, uint32_t prio) {
  if (!eng) return KVC_E_INVAL;
  seq_t *s;
  int rc = find(eng, cache_id, seq_id, &s);
  if (rc) return rc;
  if (prio >= PRIO_LEVELS)
    return engine_fail(eng, KVC_E_INVAL, "priority %u outside 0..100", prio);
  if (s->npins == 0) lru_remove(s);
  s->node.prio = (uint8_t)prio;
  if (s->npins == 0) lru_insert(eng, s);
  return 0;
}

int engine_unpin(engine_t *eng, uint32_t cache_id, uint64_t seq_id, uint64_t owner) {
  if (!eng) return KVC_E_INVAL;
  seq_t *s;
  int rc = find(eng, cache_id, seq_id, &s);
  if (rc) return rc;
  pin_t *p = pin_find(s, owner);
  if (!p)
    return engine_fail(eng, KVC_E_NOTPINNED, "sequence %llu is not pinned by owner %llu",
                       (unsigned long long)seq_id, (unsigned long long)owner);
  pin_release(eng, p);
  return 0;
}

size_t engine_unpin_all(engine_t *eng, uint64_t owner) {
  if (!eng) return 0;
  owner_t *o = hmap_get(&eng->owners, owner);
  size_t n = 0;
  while (o) { /* pin_release frees the owner with its last pin */
    bool last = o->pins->o_next == NULL;
    pin_release(eng, o->pins);
    n++;
    if (last) break;
  }
  return n;
}

int engine_seq_info(engine_t *eng, uint32_t cache_id, uint64_t seq_id, kvc_seq_info_t *out) {
  if (!eng) return KVC_E_INVAL;
  if (!out) return engine_fail(eng, KVC_E_INVAL, "NULL argument");
  seq_t *s;
  int rc = find(eng, cache_id, seq_id, &s);
  if (rc) return rc;
  seq_info_fill(eng, s, out);
  return 0;
}

int engine_seq_list(engine_t *eng, uint32_t cache_id, uint64_t *cursor, kvc_seq_info_t *out,
                    size_t cap, size_t *n) {
  if (!eng) return KVC_E_INVAL;
  if (!cursor || !n || (cap && !out)) return engine_fail(eng, KVC_E_INVAL, "NULL argument");
  cache_t *c = engine_cache(eng, cache_id);
  if (!c) return engine_fail(eng, KVC_E_NOCACHE, "no cache with id %u", cache_id);
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
  int rc = find(eng, cache_id, seq_id, &s);
  if (rc) return rc;
  if (pos < s->start || pos >= s->extent)
    return engine_fail(eng, KVC_E_RANGE, "pos %llu not held", (unsigned long long)pos);
  uint32_t page = s->table[(pos >> s->cache->g.tshift) - s->base];
  *offset = (uint64_t)page * eng->pool.page_bytes;
  return 0;
}
