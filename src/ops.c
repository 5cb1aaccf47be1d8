/* ops.c: put and get, single and batched, validated in full before any
 * change: a put that fails leaves every sequence, page and counter as it was. */
#include <string.h>

#include "copy.h"
#include "dtype.h"
#include "engine_impl.h"

#define MAX_BATCH (1u << 20)

int ops_resolve(engine_t *eng, const cache_t *c, const engine_xfer_t *x, bool is_put,
                        xr_t *r) {
  kvc_xfer_t kx = {0, 0, 0, 0, 0};
  if (x) kx = (kvc_xfer_t){x->layer_begin, x->layer_end, x->head_begin, x->head_end, x->dtype};
  char why[128];
  int rc = layout_xfer(&c->layout, &kx, is_put, r, why, sizeof why);
  return rc ? engine_fail(eng, rc, "%s", why) : 0;
}

/* Buffer bytes of ntokens for r: K, V and (raw int8) each scale buffer. */
int ops_sizes(const cache_t *c, const xr_t *r, uint64_t ntokens, uint64_t *kb,
                      uint64_t *vb, uint64_t *sb) {
  (void)c;
  return layout_xfer_bytes(r, ntokens, kb, vb, sb);
}

int engine_xfer_bytes(engine_t *eng, uint32_t cache_id, const engine_xfer_t *x, bool is_put,
                      uint64_t ntokens, uint64_t *k_bytes, uint64_t *v_bytes,
                      uint64_t *scale_bytes) {
  if (!eng) return KVC_E_INVAL;
  cache_t *c = engine_cache(eng, cache_id);
  if (!c) return engine_fail(eng, KVC_E_NOCACHE, "no cache with id %u", cache_id);
  xr_t r;
  int rc = ops_resolve(eng, c, x, is_put, &r);
  if (rc) return rc;
  if (layout_xfer_bytes(&r, ntokens, k_bytes, v_bytes, scale_bytes))
    return engine_fail(eng, KVC_E_OVERFLOW, "transfer of %llu tokens overflows",
                       (unsigned long long)ntokens);
  return 0;
}

/* Checks an entry's position arithmetic and buffers; not its sequence. */
static int entry_check(engine_t *eng, const cache_t *c, const xr_t *r, bool is_put,
                       const engine_io_t *e, size_t i) {
  uint64_t end, kb, vb, sb;
  if (__builtin_add_overflow(e->pos, e->ntokens, &end))
    return engine_fail(eng, KVC_E_OVERFLOW, "entry %zu: pos + ntokens overflows", i);
  if (end > KVC_MAX_SEQ_TOKENS)
    return engine_fail(eng, KVC_E_RANGE, "entry %zu: end %llu beyond the maximum of %llu", i,
                       (unsigned long long)end, (unsigned long long)KVC_MAX_SEQ_TOKENS);
  if (ops_sizes(c, r, e->ntokens, &kb, &vb, &sb))
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
static int io_begin(engine_t *eng, uint32_t cache_id, const engine_xfer_t *x, bool is_put,
                    const engine_io_t *entries, size_t n, cache_t **c, xr_t *r) {
  *c = engine_cache(eng, cache_id);
  if (!*c) return engine_fail(eng, KVC_E_NOCACHE, "no cache with id %u", cache_id);
  if (!entries || n == 0) return engine_fail(eng, KVC_E_INVAL, "no entries");
  if (n > MAX_BATCH) return engine_fail(eng, KVC_E_TOOMANY, "at most %u entries", MAX_BATCH);
  int rc = ops_resolve(eng, *c, x, is_put, r);
  for (size_t i = 0; rc == 0 && i < n; i++) rc = entry_check(eng, *c, r, is_put, &entries[i], i);
  return rc;
}

/* The smallest written length over layers [l0, l1). */
uint64_t ops_range_len(const seq_t *s, uint32_t l0, uint32_t l1) {
  if (!s->layer_len) return s->len;
  uint64_t m = UINT64_MAX;
  for (uint32_t l = l0; l < l1; l++)
    if (s->layer_len[l] < m) m = s->layer_len[l];
  return m;
}

/* Per-entry state of a put between validation and commit. */
typedef struct target {
  seq_t *s;
  uint32_t old_cap;  /* table capacity before, to undo growth */
  bool created;      /* new sequence, in the map but not yet attached */
  bool new_layers;   /* layer_len allocated by this call */
} target_t;

static void put_rollback(engine_t *eng, target_t *t, size_t n) {
  for (size_t i = n; i-- > 0;) {
    seq_t *s = t[i].s;
    if (!s) continue;
    if (t[i].created) {
      hmap_remove(&s->cache->seqs, s->id);
      seq_free(eng, s);
      continue;
    }
    if (t[i].new_layers) {
      mem_free(&eng->mem, s->layer_len);
      s->layer_len = NULL;
    }
    if (s->cap > t[i].old_cap) {
      if (t[i].old_cap == 0) {
        mem_free(&eng->mem, s->table);
        s->table = NULL;
        s->cap = 0;
      } else {
        uint32_t *tb = mem_realloc(&eng->mem, s->table, t[i].old_cap * sizeof *tb);
        if (tb) {
          s->table = tb;
          s->cap = t[i].old_cap;
        }
      }
    }
  }
}

/* Finds or creates the entry's sequence and checks positions against it. */
static int put_target(engine_t *eng, cache_t *c, const xr_t *r, const engine_io_t *e,
                      size_t i, target_t *t, uint64_t *created) {
  seq_t *s = hmap_get(&c->seqs, e->seq_id);
  if (s && s->mark == eng->epoch)
    return engine_fail(eng, KVC_E_DUPSEQ, "entry %zu: sequence %llu appears twice", i,
                       (unsigned long long)e->seq_id);
  if (!s) {
    if (e->pos != 0)
      return engine_fail(eng, KVC_E_RANGE, "entry %zu: new sequence %llu must start at 0",
                         i, (unsigned long long)e->seq_id);
    if (eng->max_seqs && eng->nseqs + *created + 1 > eng->max_seqs)
      return engine_fail(eng, KVC_E_TOOMANY, "at most %llu sequences",
                         (unsigned long long)eng->max_seqs);
    if (hmap_reserve(&c->seqs, &eng->mem, 1) || !(s = seq_new(eng, c, e->seq_id)))
      return engine_fail(eng, KVC_E_NOMEM, "out of memory");
    hmap_insert(&c->seqs, s->id, s);
    t->created = true;
    (*created)++;
  }
  t->s = s;
  t->old_cap = s->cap;
  s->mark = eng->epoch;
  uint64_t have = ops_range_len(s, r->l0, r->l1);
  if (e->pos < s->start || e->pos > have)
    return engine_fail(eng, KVC_E_RANGE,
                       "entry %zu: pos %llu outside [start %llu, written length %llu]", i,
                       (unsigned long long)e->pos, (unsigned long long)s->start,
                       (unsigned long long)have);
  if ((r->l0 != 0 || r->l1 != c->g.L) && !s->layer_len) {
    s->layer_len = mem_calloc(&eng->mem, c->g.L, sizeof *s->layer_len);
    if (!s->layer_len) return engine_fail(eng, KVC_E_NOMEM, "out of memory");
    for (uint32_t l = 0; l < c->g.L; l++) s->layer_len[l] = (uint32_t)s->len;
    t->new_layers = true;
  }
  uint64_t end = e->pos + e->ntokens;
  if ((end > s->extent && seq_reserve(eng, s, seq_pages_for(s, end))) ||
      (s->nholes && holes_reserve(eng, s, 1)))
    return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  return 0;
}

/* Calls fn(eng, page, arg) for every page of the table an entry writes;
 * returns how many pages it writes past the table. */
static uint64_t put_pages(engine_t *eng, const seq_t *s, const engine_io_t *e,
                          void (*fn)(engine_t *, uint32_t, void *), void *arg) {
  if (e->ntokens == 0) return 0;
  uint32_t sh = s->cache->g.tshift;
  uint64_t first = e->pos >> sh, last = (e->pos + e->ntokens - 1) >> sh, past = 0;
  for (uint64_t idx = first; idx <= last; idx++) {
    uint64_t rel = idx - s->base;
    if (rel < s->ntable) fn(eng, s->table[rel], arg);
    else past++;
  }
  return past;
}

/* Notes a shared page the call writes (one more writer). */
static void note_write(engine_t *eng, uint32_t page, void *arg) {
  evict_need_t *nd = arg;
  if (eng->pool.refcnt[page] < 2) return;
  if (eng->pool.sim[page] & SIM_COW) {
    for (size_t i = 0; i < nd->nnoted; i++)
      if (nd->noted[i].page == page) nd->noted[i].writers++;
    return;
  }
  eng->pool.sim[page] = SIM_COW;
  nd->noted[nd->nnoted].page = page;
  nd->noted[nd->nnoted++].writers = 1;
}

/* Counts pages an entry writes: into *arg, and the token metadata it needs. */
static void count_page(engine_t *eng, uint32_t page, void *arg) {
  (void)eng;
  (void)page;
  (*(uint64_t *)arg)++;
}

static void count_cow_meta(engine_t *eng, uint32_t page, void *arg) {
  if (ip_at(eng, page) && eng->pool.refcnt[page] > 1) (*(uint64_t *)arg)++;
}

/* Everything a put allocates beyond sequences: token metadata for the pages
 * it touches and index room. Undone by put_unprepare. */
static int put_prepare(engine_t *eng, cache_t *c, const target_t *t, const engine_io_t *e,
                       size_t n, size_t *index_cap) {
  uint64_t meta = 0, indexable = 0;
  *index_cap = c->index.cap;
  for (size_t i = 0; i < n; i++) {
    if (e[i].tokens) {
      uint64_t touched = 0;
      touched += put_pages(eng, t[i].s, &e[i], count_page, &touched);
      meta += touched;
      indexable += touched;
    } else {
      put_pages(eng, t[i].s, &e[i], count_cow_meta, &meta);
    }
  }
  if (indexable && (prefix_arrays(eng) || hmap_reserve(&c->index, &eng->mem, indexable)))
    return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  if (meta && prefix_reserve(eng, c->g.T, meta)) {
    (void)hmap_resize(&c->index, &eng->mem, *index_cap);
    return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  }
  return 0;
}

static void clear_note(engine_t *eng, uint32_t page, void *arg) {
  (void)arg;
  eng->pool.sim[page] = 0;
}

/* Makes room for the put: notes its shared pages, plans and evicts. */
static int put_room(engine_t *eng, const target_t *t, const engine_io_t *e, size_t n) {
  evict_note_t local[64];
  uint64_t written = 0;
  for (size_t i = 0; i < n; i++) written += e[i].ntokens ? 1 + ((e[i].pos + e[i].ntokens - 1) >> t[i].s->cache->g.tshift) - (e[i].pos >> t[i].s->cache->g.tshift) : 0;
  evict_need_t nd = {0, local, 0};
  if (written > 64 && !(nd.noted = mem_alloc(&eng->mem, written * sizeof *nd.noted)))
    return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  for (size_t i = 0; i < n; i++) nd.new_pages += put_pages(eng, t[i].s, &e[i], note_write, &nd);
  int rc = evict_make_room(eng, &nd);
  for (size_t i = 0; i < n; i++) put_pages(eng, t[i].s, &e[i], clear_note, NULL);
  if (nd.noted != local) mem_free(&eng->mem, nd.noted);
  return rc;
}

/* The page for logical page idx of s, allocated or copied so s owns it. */
static uint32_t page_for_write(engine_t *eng, seq_t *s, uint64_t idx) {
  pool_t *p = &eng->pool;
  uint64_t rel = idx - s->base;
  const geom_t *g = &s->cache->g;
  if (rel == s->ntable) {
    uint32_t page = pool_alloc(p);
    eng->bytes_used += g->page_bytes;
    s->table[s->ntable++] = page;
    seq_page_add(eng, s, page);
    return page;
  }
  uint32_t page = s->table[rel];
  if (p->refcnt[page] == 1) return page;
  uint32_t copy = pool_alloc(p); /* copy on write: the other holders keep page */
  eng->bytes_used += g->page_bytes;
  memcpy(pool_page(p, copy), pool_page(p, page), g->page_bytes);
  prefix_page_copied(eng, page, copy);
  seq_page_release(eng, s, page);
  s->table[rel] = copy;
  seq_page_add(eng, s, copy);
  eng->st.cow_copies++;
  s->cache->st.cow_copies++;
  return copy;
}

void ops_writable(engine_t *eng, seq_t *s, uint64_t pos, uint64_t end) {
  uint32_t sh = s->cache->g.tshift;
  if (pos >= end) return;
  for (uint64_t idx = pos >> sh; idx <= (end - 1) >> sh; idx++) (void)page_for_write(eng, s, idx);
}

/* Calls fn for every page of s's table that slots [pos, end) fall in;
 * returns how many pages they need past the table. */
static uint64_t span_pages(engine_t *eng, const span_t *sp,
                           void (*fn)(engine_t *, uint32_t, void *), void *arg) {
  engine_io_t e = {.seq_id = sp->s->id, .pos = sp->pos, .ntokens = sp->end - sp->pos};
  return sp->end > sp->pos ? put_pages(eng, sp->s, &e, fn, arg) : 0;
}

int ops_room(engine_t *eng, const span_t *sp, size_t n) {
  uint64_t written = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t sh = sp[i].s->cache->g.tshift;
    if (sp[i].end > sp[i].pos) written += 1 + ((sp[i].end - 1) >> sh) - (sp[i].pos >> sh);
  }
  evict_note_t local[64];
  evict_need_t nd = {0, local, 0};
  if (written > 64 && !(nd.noted = mem_alloc(&eng->mem, written * sizeof *nd.noted)))
    return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  /* A page copied on write takes its token metadata along: reserve the
   * blocks now (ops_writable consumes them; ops_done frees what is left). */
  uint64_t meta = 0;
  for (size_t i = 0; i < n; i++) span_pages(eng, &sp[i], count_cow_meta, &meta);
  if (meta && prefix_reserve(eng, sp[0].s->cache->g.T, meta)) {
    if (nd.noted != local) mem_free(&eng->mem, nd.noted);
    return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  }
  for (size_t i = 0; i < n; i++) nd.new_pages += span_pages(eng, &sp[i], note_write, &nd);
  int rc = evict_make_room(eng, &nd);
  for (size_t i = 0; i < n; i++) span_pages(eng, &sp[i], clear_note, NULL);
  if (nd.noted != local) mem_free(&eng->mem, nd.noted);
  if (rc) prefix_unreserve(eng);
  return rc;
}

void ops_done(engine_t *eng) { prefix_unreserve(eng); }

static void put_apply(engine_t *eng, seq_t *s, const xr_t *r, const engine_io_t *e,
                      const engine_pkey_t *key, uint32_t key_id) {
  const geom_t *g = &s->cache->g;
  copy_plan_t plan;
  copy_plan_init(&plan, g, s->cache->layout.dtype, r->l0, r->l1 - r->l0, 0, g->H, r->bt,
                 e->ntokens);
  uint64_t pos = e->pos, end = e->pos + e->ntokens;
  while (pos < end) {
    uint64_t idx = pos >> g->tshift, pstart = idx << g->tshift;
    uint64_t cnt = (pstart + g->T < end ? pstart + g->T : end) - pos;
    uint32_t page = page_for_write(eng, s, idx);
    copy_in(&plan, pool_page(&eng->pool, page), pos - pstart, pos - e->pos, cnt, e->k, e->v);
    pos += cnt;
  }
  if (e->tokens) prefix_put_tokens(eng, s, e, key, key_id);
  else if (e->ntokens) prefix_put_untokened(eng, s, e->pos, end);
  seq_set_lengths(eng, s, r->l0, r->l1, end);
  holes_cut(s, e->pos, end);
  attn_trim(eng, s, e->pos < s->len ? e->pos : s->len);
  lru_touch(eng, s);
  eng->st.puts++;
  eng->st.put_tokens += e->ntokens;
  eng->st.bytes_in += e->k_bytes + e->v_bytes;
  s->cache->st.puts++;
}

int engine_put(engine_t *eng, uint32_t cache_id, const engine_xfer_t *x,
               const engine_io_t *entries, size_t n) {
  if (!eng) return KVC_E_INVAL;
  cache_t *c;
  xr_t r;
  int rc = io_begin(eng, cache_id, x, true, entries, n, &c, &r);
  if (rc) return rc;
  target_t one, *t = n == 1 ? &one : mem_calloc(&eng->mem, n, sizeof *t);
  if (!t) return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  memset(t, 0, n * sizeof *t);
  uint32_t key_id = 0;
  const engine_pkey_t *key = x ? x->pkey : NULL;
  bool tokened = false;
  for (size_t i = 0; i < n; i++) tokened |= entries[i].tokens != NULL;
  if (tokened && (r.l0 != 0 || r.l1 != c->g.L)) {
    rc = engine_fail(eng, KVC_E_INVAL, "token ids go with puts of every layer");
    goto out;
  }
  size_t keys_cap = eng->keys.cap;
  uint32_t nkeys = eng->nkeys;
  bool had_arrays = eng->ip != NULL;
  if (tokened && (rc = prefix_key(eng, key, true, &key_id))) {
    rc = engine_fail(eng, rc, rc == KVC_E_NOMEM ? "out of memory"
                                                : "salt and extra key are at most 64 bytes");
    goto out;
  }
  eng->epoch++;
  size_t map_cap = c->seqs.cap, index_cap = c->index.cap, done = 0;
  uint64_t created = 0;
  for (; done < n; done++)
    if ((rc = put_target(eng, c, &r, &entries[done], done, &t[done], &created))) break;
  if (rc == 0 && (rc = put_prepare(eng, c, t, entries, n, &index_cap)) == 0 &&
      (rc = put_room(eng, t, entries, n)) == KVC_E_FULL)
    c->st.full_errors++;
  if (rc) {
    prefix_unreserve(eng);
    if (eng->nkeys != nkeys) prefix_key_forget(eng, key, keys_cap); /* interned just now */
    if (!had_arrays && eng->ip) prefix_arrays_drop(eng); /* a failed call keeps nothing */
    if (c->index.cap != index_cap) (void)hmap_resize(&c->index, &eng->mem, index_cap);
    put_rollback(eng, t, done + 1 < n ? done + 1 : n);
    if (c->seqs.cap != map_cap) (void)hmap_resize(&c->seqs, &eng->mem, map_cap);
  } else {
    for (size_t i = 0; i < n; i++) {
      if (t[i].created) seq_attach(eng, t[i].s);
      put_apply(eng, t[i].s, &r, &entries[i], key, key_id);
    }
    prefix_unreserve(eng);
  }
out:
  if (t != &one) mem_free(&eng->mem, t);
  return rc;
}

/* Validates a get completely (nothing changes); fills *cp and *r_. */
static int get_check(engine_t *eng, uint32_t cache_id, const engine_xfer_t *x,
                     const engine_io_t *entries, size_t n, cache_t **cp, xr_t *r_) {
  cache_t *c;
  xr_t r;
  int rc = io_begin(eng, cache_id, x, false, entries, n, &c, &r);
  if (rc) return rc;
  for (size_t i = 0; i < n; i++) {
    const engine_io_t *e = &entries[i];
    seq_t *s = hmap_get(&c->seqs, e->seq_id);
    if (!s)
      return engine_fail(eng, KVC_E_NOSEQ, "entry %zu: no sequence %llu", i,
                         (unsigned long long)e->seq_id);
    uint64_t have = ops_range_len(s, r.l0, r.l1);
    if (e->pos < s->start || e->pos + e->ntokens > have)
      return engine_fail(eng, KVC_E_RANGE,
                         "entry %zu: tokens [%llu, %llu) outside [start %llu, length %llu)", i,
                         (unsigned long long)e->pos, (unsigned long long)(e->pos + e->ntokens),
                         (unsigned long long)s->start, (unsigned long long)have);
  }
  *cp = c;
  *r_ = r;
  return 0;
}

/* Holes (positions never written, or vacated by a shift) read as zeros. */
static void get_zero_holes(const seq_t *s, const copy_plan_t *plan, const engine_io_t *e) {
  uint64_t end = e->pos + e->ntokens;
  for (uint32_t h = 0; h < s->nholes; h++) {
    uint64_t b = s->holes[h].b > e->pos ? s->holes[h].b : e->pos;
    uint64_t z = s->holes[h].e < end ? s->holes[h].e : end;
    if (b < z) copy_zero(plan, b - e->pos, z - b, e->k, e->v, e->k_scale, e->v_scale);
  }
}

/* Counts a served get entry and touches its sequence. */
static void get_count(engine_t *eng, cache_t *c, seq_t *s, const engine_io_t *e) {
  lru_touch(eng, s);
  eng->st.gets++;
  eng->st.get_tokens += e->ntokens;
  eng->st.bytes_out += e->k_bytes + e->v_bytes + e->k_scale_bytes + e->v_scale_bytes;
  c->st.gets++;
}

int engine_get(engine_t *eng, uint32_t cache_id, const engine_xfer_t *x,
               const engine_io_t *entries, size_t n) {
  if (!eng) return KVC_E_INVAL;
  cache_t *c;
  xr_t r;
  int rc = get_check(eng, cache_id, x, entries, n, &c, &r);
  if (rc) return rc;
  const geom_t *g = &c->g;
  for (size_t i = 0; i < n; i++) {
    const engine_io_t *e = &entries[i];
    seq_t *s = hmap_get(&c->seqs, e->seq_id);
    copy_plan_t plan;
    copy_plan_init(&plan, g, c->layout.dtype, r.l0, r.l1 - r.l0, r.h0, r.h1 - r.h0, r.bt,
                   e->ntokens);
    uint64_t pos = e->pos, end = e->pos + e->ntokens;
    while (pos < end) {
      uint64_t idx = pos >> g->tshift, pstart = idx << g->tshift;
      uint64_t cnt = (pstart + g->T < end ? pstart + g->T : end) - pos;
      const unsigned char *page = pool_page(&eng->pool, s->table[idx - s->base]);
      copy_out(&plan, page, pos - pstart, pos - e->pos, cnt, e->k, e->v, e->k_scale,
               e->v_scale);
      pos += cnt;
    }
    get_zero_holes(s, &plan, e);
    get_count(eng, c, s, e);
  }
  return 0;
}

/* ---- a get copied outside the engine's thread ------------------------------ */

/* One page's share of one entry. */
typedef struct chunk {
  const unsigned char *page;
  uint64_t pt0, bt0, cnt; /* page tokens [pt0, +cnt) -> buffer tokens [bt0, +cnt) */
  uint32_t entry;
} chunk_t;

/* A range of an entry's buffer that reads as zeros (a hole). */
typedef struct zero_run {
  uint64_t bt0, cnt;
  uint32_t entry;
} zero_run_t;

struct engine_get_job {
  geom_t g;               /* the cache's geometry: the cache may go meanwhile */
  lease_t *lease;         /* holds every page a chunk reads */
  zero_run_t *zeros;      /* holes, zeroed after the chunks are copied */
  size_t nzeros;
  size_t n, nchunks;
  copy_plan_t *plans;     /* per entry, pointing at g */
  engine_io_t *io;        /* per entry: the buffers */
  chunk_t chunks[];
};

/* Records the holes the job's entries cover; 0 or NOMEM. */
static int get_job_holes(engine_t *eng, cache_t *c, engine_get_job_t *j,
                         const engine_io_t *entries) {
  size_t nz = 0;
  j->zeros = NULL;
  j->nzeros = 0;
  for (int pass = 0; pass < 2; pass++) {
    for (size_t i = 0; i < j->n; i++) {
      const engine_io_t *e = &entries[i];
      const seq_t *s = hmap_get(&c->seqs, e->seq_id);
      uint64_t end = e->pos + e->ntokens;
      for (uint32_t h = 0; h < s->nholes; h++) {
        uint64_t b = s->holes[h].b > e->pos ? s->holes[h].b : e->pos;
        uint64_t z = s->holes[h].e < end ? s->holes[h].e : end;
        if (b >= z) continue;
        if (pass) j->zeros[j->nzeros++] = (zero_run_t){b - e->pos, z - b, (uint32_t)i};
        else nz++;
      }
    }
    if (pass == 0 && nz && !(j->zeros = mem_calloc(&eng->mem, nz, sizeof *j->zeros)))
      return KVC_E_NOMEM;
    if (pass == 0 && !nz) return 0;
  }
  return 0;
}

int engine_get_begin(engine_t *eng, uint32_t cache_id, const engine_xfer_t *x,
                     const engine_io_t *entries, size_t n, engine_get_job_t **job) {
  if (!eng) return KVC_E_INVAL;
  if (!job) return engine_fail(eng, KVC_E_INVAL, "NULL argument");
  cache_t *c;
  xr_t r;
  int rc = get_check(eng, cache_id, x, entries, n, &c, &r);
  if (rc) return rc;
  const geom_t *g = &c->g;
  size_t nchunks = 0;
  for (size_t i = 0; i < n; i++)
    if (entries[i].ntokens)
      nchunks += ((entries[i].pos + entries[i].ntokens - 1) >> g->tshift) -
                 (entries[i].pos >> g->tshift) + 1;
  if (nchunks > UINT32_MAX) return engine_fail(eng, KVC_E_TOOMANY, "get of too many pages");
  engine_get_job_t *j = mem_alloc(&eng->mem, sizeof *j + nchunks * sizeof j->chunks[0]);
  copy_plan_t *plans = mem_calloc(&eng->mem, n, sizeof *plans);
  engine_io_t *io = mem_calloc(&eng->mem, n, sizeof *io);
  uint32_t *pages = mem_calloc(&eng->mem, nchunks ? nchunks : 1, sizeof *pages);
  if (j) {
    j->zeros = NULL;
    j->nzeros = 0;
  }
  if (!j || !plans || !io || !pages) goto nomem;
  j->g = *g;
  j->n = n;
  j->nchunks = nchunks;
  j->plans = plans;
  j->io = io;
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    const engine_io_t *e = &entries[i];
    seq_t *s = hmap_get(&c->seqs, e->seq_id);
    io[i] = *e;
    copy_plan_init(&plans[i], &j->g, c->layout.dtype, r.l0, r.l1 - r.l0, r.h0, r.h1 - r.h0,
                   r.bt, e->ntokens);
    for (uint64_t pos = e->pos, end = e->pos + e->ntokens; pos < end;) {
      uint64_t idx = pos >> g->tshift, pstart = idx << g->tshift;
      uint64_t cnt = (pstart + g->T < end ? pstart + g->T : end) - pos;
      pages[k] = s->table[idx - s->base];
      j->chunks[k] = (chunk_t){pool_page(&eng->pool, pages[k]), pos - pstart, pos - e->pos, cnt,
                               (uint32_t)i};
      k++;
      pos += cnt;
    }
  }
  if (get_job_holes(eng, c, j, entries)) goto nomem;
  if (!(j->lease = lease_pages(eng, pages, (uint32_t)nchunks, g->page_bytes))) goto nomem;
  mem_free(&eng->mem, pages);
  for (size_t i = 0; i < n; i++) get_count(eng, c, hmap_get(&c->seqs, entries[i].seq_id), &entries[i]);
  *job = j;
  return 0;
nomem:
  if (j) mem_free(&eng->mem, j->zeros);
  mem_free(&eng->mem, j);
  mem_free(&eng->mem, plans);
  mem_free(&eng->mem, io);
  mem_free(&eng->mem, pages);
  return engine_fail(eng, KVC_E_NOMEM, "out of memory");
}

void engine_get_run(const engine_get_job_t *j) {
  for (size_t k = 0; k < j->nchunks; k++) {
    const chunk_t *ch = &j->chunks[k];
    const engine_io_t *e = &j->io[ch->entry];
    copy_out(&j->plans[ch->entry], ch->page, ch->pt0, ch->bt0, ch->cnt, e->k, e->v, e->k_scale,
             e->v_scale);
  }
  for (size_t k = 0; k < j->nzeros; k++) {
    const zero_run_t *z = &j->zeros[k];
    const engine_io_t *e = &j->io[z->entry];
    copy_zero(&j->plans[z->entry], z->bt0, z->cnt, e->k, e->v, e->k_scale, e->v_scale);
  }
}

void engine_get_end(engine_t *eng, engine_get_job_t *j) {
  if (!j) return;
  lease_drop(eng, j->lease);
  mem_free(&eng->mem, j->zeros);
  mem_free(&eng->mem, j->plans);
  mem_free(&eng->mem, j->io);
  mem_free(&eng->mem, j);
}
