/* put.c: writing tokens into the pool, single and batched, validated in full
 * before any change: a put that fails leaves every sequence, page and counter
 * as it was. */
#include <string.h>

#include "attn.h"
#include "copy.h"
#include "holes.h"
#include "lru.h"
#include "page.h"
#include "prefix.h"
#include "room.h"
#include "seq.h"
#include "xfer.h"
#include "quota.h"

/* Per-entry state of a put between validation and commit. */
typedef struct target {
  seq_t *s;
  uint32_t old_cap;  /* table capacity before, to undo growth */
  bool created;      /* new sequence, in the map but not yet enlisted */
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
static int put_target(engine_t *eng, cache_t *c, const layout_xfer_t *r, const engine_io_t *e,
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
    int rc = quota_check_seqs(eng, c->q, *created + 1);
    if (rc) return rc;
    if (hmap_reserve(&c->seqs, &eng->mem, 1) || !(s = seq_new(eng, c, e->seq_id)))
      return engine_fail(eng, KVC_E_NOMEM, "out of memory");
    hmap_insert(&c->seqs, s->id, s);
    t->created = true;
    (*created)++;
  }
  t->s = s;
  t->old_cap = s->cap;
  s->mark = eng->epoch;
  uint64_t have = seq_range_len(s, r->l0, r->l1);
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

/* Counts pages an entry writes: into *arg, and the token metadata it needs. */
static void count_page(engine_t *eng, uint32_t page, void *arg) {
  (void)eng;
  (void)page;
  (*(uint64_t *)arg)++;
}

/* Everything a put allocates beyond sequences and room: token metadata for
 * the pages a put with ids touches, and index room. */
static int put_prepare(engine_t *eng, cache_t *c, const span_t *sp, const engine_io_t *e,
                       size_t n, size_t *index_cap) {
  uint64_t meta = 0;
  *index_cap = c->index.cap;
  for (size_t i = 0; i < n; i++)
    if (e[i].tokens) meta += room_pages(eng, &sp[i], count_page, &meta);
  if (meta && (page_meta_arrays(eng) || hmap_reserve(&c->index, &eng->mem, meta)))
    return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  if (meta && page_meta_reserve(eng, c->g.T, meta)) {
    (void)hmap_resize(&c->index, &eng->mem, *index_cap);
    return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  }
  return 0;
}

static void put_apply(engine_t *eng, seq_t *s, const layout_xfer_t *r, const engine_io_t *e,
                      const engine_pkey_t *key, uint32_t key_id) {
  const geom_t *g = &s->cache->g;
  copy_plan_t plan;
  copy_plan_init(&plan, g, s->cache->layout.dtype, r->l0, r->l1 - r->l0, 0, g->H, r->bt,
                 e->ntokens);
  uint64_t end = e->pos + e->ntokens;
  for (seq_run_t run = seq_run(g, e->pos, end); seq_run_next(&run);) {
    uint32_t page = room_page_for_write(eng, s, run.idx);
    copy_in(&plan, pool_page(&eng->pool, page), run.off, run.done, run.n, e->k, e->v);
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
  layout_xfer_t r;
  int rc = xfer_begin(eng, cache_id, x, true, entries, n, &c, &r);
  if (rc) return rc;
  target_t one, *t = n == 1 ? &one : mem_calloc(&eng->mem, n, sizeof *t);
  span_t one_sp, *sp = n == 1 ? &one_sp : mem_calloc(&eng->mem, n, sizeof *sp);
  if (!t || !sp) {
    if (t != &one) mem_free(&eng->mem, t);
    if (sp != &one_sp) mem_free(&eng->mem, sp);
    return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  }
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
  bool had_arrays = eng->ip != NULL, new_key = false;
  if (tokened && (rc = prefix_key(eng, c->q, key, true, &key_id, &new_key))) goto out;
  eng->epoch++;
  size_t map_cap = c->seqs.cap, index_cap = c->index.cap, done = 0;
  uint64_t created = 0;
  for (; done < n; done++) {
    if ((rc = put_target(eng, c, &r, &entries[done], done, &t[done], &created))) break;
    sp[done] = (span_t){t[done].s, entries[done].pos, entries[done].pos + entries[done].ntokens};
  }
  if (rc == 0 && (rc = put_prepare(eng, c, sp, entries, n, &index_cap)) == 0 &&
      (rc = room_make(eng, sp, n)) == KVC_E_FULL)
    c->st.full_errors++;
  if (rc) {
    page_meta_unreserve(eng);
    if (new_key) prefix_key_forget(eng, c->q, key, keys_cap); /* interned just now */
    if (!had_arrays && eng->ip) page_meta_arrays_drop(eng); /* a failed call keeps nothing */
    if (c->index.cap != index_cap) (void)hmap_resize(&c->index, &eng->mem, index_cap);
    put_rollback(eng, t, done + 1 < n ? done + 1 : n);
    if (c->seqs.cap != map_cap) (void)hmap_resize(&c->seqs, &eng->mem, map_cap);
  } else {
    for (size_t i = 0; i < n; i++) {
      if (t[i].created) seq_enlist(eng, t[i].s);
      put_apply(eng, t[i].s, &r, &entries[i], key, key_id);
    }
    page_meta_unreserve(eng);
  }
out:
  if (t != &one) mem_free(&eng->mem, t);
  if (sp != &one_sp) mem_free(&eng->mem, sp);
  return rc;
}

