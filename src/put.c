/* put.c: writing tokens into the pool, single and batched, validated in full
 * before any change: a put that fails leaves every sequence, page and counter
 * as it was. */
#include <stdio.h>
#include <string.h>

#include "attn.h"
#include "copy.h"
#include "holes.h"
#include "lru.h"
#include "ntcopy.h"
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
  uint64_t old_pcap; /* entries of its own positions before, likewise */
  bool created;      /* new sequence, in the map but not yet enlisted */
  bool new_layers;   /* layer_len allocated by this call */
  bool new_chain;    /* layer_chain allocated by this call */
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
      mem_free(&eng->mem, s->x->layer_len);
      s->x->layer_len = NULL;
    }
    if (t[i].new_chain) {
      mem_free(&eng->mem, s->x->layer_chain);
      s->x->layer_chain = NULL;
    }
    seq_pos_shrink(eng, s, t[i].old_pcap);
    seq_ext_release(eng, s); /* made by this call and left empty */
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
  if (s && s->busy) return seq_busy(eng, s);
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
  t->old_pcap = s->x->pcap;
  s->mark = eng->epoch;
  uint64_t have = seq_range_len(s, r->l0, r->l1);
  if (e->pos < s->start || e->pos > have)
    return engine_fail(eng, KVC_E_RANGE,
                       "entry %zu: pos %llu outside [start %llu, written length %llu]", i,
                       (unsigned long long)e->pos, (unsigned long long)s->start,
                       (unsigned long long)have);
  /* Per-layer lengths only when a layer range can make them differ: an
   * overwrite below the length changes none (seq_set_lengths), and
   * allocating them for it, to free them again at the end, was a third of
   * a one-token put's bookkeeping. */
  if ((r->l0 != 0 || r->l1 != c->g.L) && !s->x->layer_len && e->pos + e->ntokens > s->len) {
    if (seq_ext_own(eng, s) ||
        !(s->x->layer_len = mem_calloc(&eng->mem, c->g.L, sizeof *s->x->layer_len)))
      return engine_fail(eng, KVC_E_NOMEM, "out of memory"); /* the rollback releases x */
    for (uint32_t l = 0; l < c->g.L; l++) s->x->layer_len[l] = (uint32_t)s->len;
    t->new_layers = true;
  }
  /* A layer-range put with ids chains those layers alone (layer_chain). */
  if (e->tokens && (r->l0 != 0 || r->l1 != c->g.L) && !s->x->layer_chain) {
    if (seq_ext_own(eng, s) ||
        !(s->x->layer_chain = mem_alloc(&eng->mem, c->g.L * sizeof *s->x->layer_chain)))
      return engine_fail(eng, KVC_E_NOMEM, "out of memory");
    for (uint32_t l = 0; l < c->g.L; l++) s->x->layer_chain[l] = (uint32_t)s->chain_tok;
    t->new_chain = true;
  }
  uint64_t end = e->pos + e->ntokens;
  if ((end > s->extent && seq_reserve(eng, s, seq_pages_for(s, end))) ||
      (s->x->nholes && holes_reserve(eng, s, 1)))
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
                       size_t n, size_t *index_cap, uint64_t *index_need) {
  uint64_t meta = 0;
  *index_cap = c->index.cap;
  for (size_t i = 0; i < n; i++)
    if (e[i].tokens) meta += room_pages(eng, &sp[i], count_page, &meta);
  *index_need = meta;
  /* The index keeps room for the puts in flight too (their commit inserts). */
  if (meta && (page_meta_arrays(eng) ||
               hmap_reserve(&c->index, &eng->mem, meta + c->index_pending)))
    return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  if (meta && page_meta_reserve(eng, c->g.T, meta)) {
    (void)hmap_resize(&c->index, &eng->mem, *index_cap);
    return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  }
  return 0;
}

/* A put between its begin (validated, room made, the pages it writes
 * resolved, its sequences busy) and its end (the metadata committed). */
struct engine_put_job {
  put_flight_t f;                 /* first: on eng->put_jobs; seqs, n, key_id, tags */
  cache_t *c;                    /* kept: a cache with busy sequences is not dropped */
  layout_xfer_t r;
  size_t npages;
  uint64_t index_need;           /* index entries reserved for it (c->index_pending) */
  void *reserve;                 /* its reserved ipage blocks */
  engine_pkey_t key;             /* a copy, pointing at salt and extra below */
  uint8_t salt[64], extra[64];
  copy_plan_t *plans;            /* per entry */
  engine_io_t *io;               /* per entry: the buffers */
  unsigned char **pages;         /* per page run, in entry and run order */
  size_t *tag0;                  /* per entry + 1: where its tags begin in tags */
};

/* Pages an entry's runs write (one per logical page its range touches). */
static uint64_t entry_runs(const geom_t *g, const engine_io_t *e) {
  if (e->ntokens == 0) return 0;
  return ((e->pos + e->ntokens - 1) >> g->tshift) - (e->pos >> g->tshift) + 1;
}

/* The job in one allocation, its arrays after the header. */
static engine_put_job_t *job_new(engine_t *eng, const cache_t *c, const engine_io_t *e,
                                 size_t n) {
  uint64_t np = 0, nt = 0;
  for (size_t i = 0; i < n; i++) {
    np += entry_runs(&c->g, &e[i]);
    nt += e[i].nspans; /* checked: each at most KVC_MAX_SPAN_KEYS */
  }
  size_t a = (sizeof(engine_put_job_t) + 15) & ~(size_t)15;
  size_t b = a + ((n * sizeof(copy_plan_t) + 15) & ~(size_t)15);
  size_t d = b + ((n * sizeof(engine_io_t) + 15) & ~(size_t)15);
  size_t t0 = d + ((n * sizeof(seq_t *) + 15) & ~(size_t)15);
  size_t tg = t0 + (((n + 1) * sizeof(size_t) + 15) & ~(size_t)15);
  size_t f = tg + ((nt * sizeof(span_tag_t) + 15) & ~(size_t)15);
  if (np > (SIZE_MAX - f) / sizeof(unsigned char *)) return NULL;
  unsigned char *m = mem_alloc(&eng->mem, f + np * sizeof(unsigned char *));
  if (!m) return NULL;
  engine_put_job_t *j = (engine_put_job_t *)(void *)m;
  memset(j, 0, sizeof *j);
  j->plans = (copy_plan_t *)(void *)(m + a);
  j->io = (engine_io_t *)(void *)(m + b);
  j->f.seqs = (seq_t **)(void *)(m + d);
  j->tag0 = (size_t *)(void *)(m + t0);
  j->f.tags = (span_tag_t *)(void *)(m + tg);
  j->pages = (unsigned char **)(void *)(m + f);
  memset(j->tag0, 0, (n + 1) * sizeof *j->tag0);
  j->f.n = n;
  j->npages = np;
  memcpy(j->io, e, n * sizeof *e);
  return j;
}

/* Begun: the sequences are busy, the pages each run writes are the
 * sequence's own (new, or copied on write now), the plans are made. */
static void job_stage(engine_t *eng, engine_put_job_t *j) {
  const geom_t *g = &j->c->g;
  size_t k = 0;
  for (size_t i = 0; i < j->f.n; i++) {
    seq_t *s = j->f.seqs[i];
    const engine_io_t *e = &j->io[i];
    copy_plan_init(&j->plans[i], g, j->c->layout.dtype, j->r.l0, j->r.l1 - j->r.l0, 0, g->H,
                   j->r.bt, e->ntokens);
    copy_plan_scale(&j->plans[i], j->r.k_scale, j->r.v_scale);
    for (seq_run_t run = seq_run(g, e->pos, e->pos + e->ntokens); seq_run_next(&run);)
      j->pages[k++] = pool_page(&eng->pool, room_page_for_write(eng, s, run.idx));
    s->busy = true;
    j->c->nbusy++;
  }
  j->reserve = eng->reserve; /* what the commit's token metadata takes */
  eng->reserve = NULL;
  j->f.next = eng->put_jobs;
  if (j->f.next) j->f.next->prev = &j->f;
  eng->put_jobs = &j->f;
}

void engine_put_run_part(const engine_put_job_t *j, unsigned part, unsigned nparts) {
  const geom_t *g = &j->c->g;
  size_t k = 0;
  for (size_t i = 0; i < j->f.n; i++) {
    const engine_io_t *e = &j->io[i];
    copy_plan_t sub;
    const void *kb = e->k, *vb = e->v;
    bool mine = copy_plan_slice(&j->plans[i], part, nparts, &sub, &kb, &vb, NULL, NULL);
    for (seq_run_t run = seq_run(g, e->pos, e->pos + e->ntokens); seq_run_next(&run); k++)
      if (mine) copy_in(&sub, j->pages[k], run.off, run.done, run.n, kb, vb);
  }
  ntcopy_fence(); /* the streamed bytes before the hand-off (copy.h) */
}

void engine_put_run(const engine_put_job_t *j) { engine_put_run_part(j, 0, 1); }

unsigned engine_put_job_layers(const engine_put_job_t *j) { return j->r.l1 - j->r.l0; }

/* The metadata of a written entry: token ids and chain, lengths, holes,
 * the attention's trim, LRU, counters. */
static void put_commit(engine_t *eng, const engine_put_job_t *j, seq_t *s, const engine_io_t *e) {
  const engine_pkey_t *key = &j->key;
  uint64_t end = e->pos + e->ntokens;
  size_t i = (size_t)(e - j->io);
  /* Ids chain tokens at their own slots' positions only: a sequence whose
   * positions moved below end (a seq_div, a shift of its own positions)
   * writes them as untokened (doc/attention.md). */
  if (e->tokens && !(s->x->pos && seq_pos_first_moved(s) < end))
    prefix_put_tokens(eng, s, e, j->r.l0, j->r.l1, key, j->f.key_id, j->f.tags + j->tag0[i],
                      j->tag0[i + 1] - j->tag0[i]);
  else if (e->ntokens) prefix_put_untokened(eng, s, e->pos, end);
  seq_set_lengths(eng, s, j->r.l0, j->r.l1, end);
  holes_cut(s, e->pos, end);
  attn_trim(eng, s, e->pos < s->len ? e->pos : s->len);
  lru_touch(eng, s);
  eng->st.puts++;
  eng->st.put_tokens += e->ntokens;
  eng->st.bytes_in += e->k_bytes + e->v_bytes;
  s->cache->st.puts++;
}

void engine_put_end(engine_t *eng, engine_put_job_t *j) {
  if (!j) return;
  if (j->f.prev) j->f.prev->next = j->f.next;
  else eng->put_jobs = j->f.next;
  if (j->f.next) j->f.next->prev = j->f.prev;
  eng->reserve = j->reserve;
  j->c->index_pending -= j->index_need;
  for (size_t i = 0; i < j->f.n; i++) {
    j->f.seqs[i]->busy = false;
    j->c->nbusy--;
  }
  for (size_t i = 0; i < j->f.n; i++) put_commit(eng, j, j->f.seqs[i], &j->io[i]);
  page_meta_unreserve(eng);
  mem_free(&eng->mem, j);
}

/* Copies a key of up to 64 + 64 bytes into the job (the caller's goes). */
static void job_key(engine_put_job_t *j, const engine_pkey_t *key) {
  j->key = (engine_pkey_t){0};
  if (!key) return;
  j->key.salt_len = key->salt_len <= sizeof j->salt ? key->salt_len : 0;
  j->key.extra_len = key->extra_len <= sizeof j->extra ? key->extra_len : 0;
  if (j->key.salt_len) memcpy(j->salt, key->salt, j->key.salt_len);
  if (j->key.extra_len) memcpy(j->extra, key->extra, j->key.extra_len);
  j->key.salt = j->salt;
  j->key.extra = j->extra;
}

/* Forgets the span keys entries [0, upto) of j interned. */
static void job_tags_forget(engine_t *eng, engine_put_job_t *j, const engine_io_t *e,
                            size_t upto, prefix_keys_cap_t cap) {
  for (size_t i = upto; i-- > 0;)
    prefix_spans_forget(eng, j->c->q, e[i].spans, j->f.tags + j->tag0[i],
                        j->tag0[i + 1] - j->tag0[i], cap);
}

/* Interns the span keys of every entry, clipped to its range, into j. */
static int job_tags(engine_t *eng, engine_put_job_t *j, const engine_io_t *e) {
  prefix_keys_cap_t cap = prefix_keys_cap(eng);
  for (size_t i = 0; i < j->f.n; i++) {
    size_t k = 0;
    j->tag0[i] = j->f.ntags;
    int rc = e[i].nspans ? prefix_spans_resolve(eng, j->c->q, e[i].spans, e[i].nspans, e[i].pos,
                                                e[i].pos + e[i].ntokens, true,
                                                j->f.tags + j->f.ntags, &k)
                         : 0;
    if (rc) {
      j->tag0[i + 1] = j->f.ntags;
      job_tags_forget(eng, j, e, i, cap);
      return rc;
    }
    j->f.ntags += k;
  }
  j->tag0[j->f.n] = j->f.ntags;
  return 0;
}

int engine_put_begin(engine_t *eng, uint32_t cache_id, const engine_xfer_t *x,
                     const engine_io_t *entries, size_t n, engine_put_job_t **job) {
  if (!eng) return KVC_E_INVAL;
  if (!job) return engine_fail(eng, KVC_E_INVAL, "NULL argument");
  cache_t *c;
  layout_xfer_t r;
  int rc = xfer_begin(eng, cache_id, x, true, entries, n, &c, &r);
  if (rc) return rc;
  for (size_t i = 0; i < n; i++) {
    if (!entries[i].nspans) continue; /* nothing to check (and no name to format) */
    char what[32];
    snprintf(what, sizeof what, "entry %zu", i);
    if (entries[i].nspans && !entries[i].tokens)
      return engine_fail(eng, KVC_E_INVAL, "%s: span keys go with token ids", what);
    if ((rc = prefix_spans_check(eng, entries[i].spans, entries[i].nspans, what))) return rc;
  }
  engine_put_job_t *j = job_new(eng, c, entries, n);
  target_t one, *t = n == 1 ? &one : mem_calloc(&eng->mem, n, sizeof *t);
  span_t one_sp, *sp = n == 1 ? &one_sp : mem_calloc(&eng->mem, n, sizeof *sp);
  if (!j || !t || !sp) {
    mem_free(&eng->mem, j);
    if (t != &one) mem_free(&eng->mem, t);
    if (sp != &one_sp) mem_free(&eng->mem, sp);
    return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  }
  memset(t, 0, n * sizeof *t);
  j->c = c;
  j->r = r;
  const engine_pkey_t *key = x ? x->pkey : NULL;
  bool tokened = false;
  for (size_t i = 0; i < n; i++) tokened |= entries[i].tokens != NULL;
  prefix_keys_cap_t keys_cap = prefix_keys_cap(eng);
  bool had_arrays = eng->ip != NULL, new_key = false;
  if (tokened && (rc = prefix_key(eng, c->q, key, true, &j->f.key_id, &new_key))) goto out;
  if ((rc = job_tags(eng, j, entries))) {
    if (new_key) prefix_key_forget(eng, c->q, key, keys_cap);
    goto out;
  }
  eng->epoch++;
  size_t map_cap = c->seqs.cap, index_cap = c->index.cap, done = 0;
  uint64_t created = 0;
  for (; done < n; done++) {
    if ((rc = put_target(eng, c, &r, &entries[done], done, &t[done], &created))) break;
    sp[done] = (span_t){t[done].s, entries[done].pos, entries[done].pos + entries[done].ntokens};
  }
  if (rc == 0 && (rc = put_prepare(eng, c, sp, entries, n, &index_cap, &j->index_need)) == 0 &&
      (rc = room_make(eng, sp, n)) == KVC_E_FULL)
    c->st.full_errors++;
  if (rc) {
    page_meta_unreserve(eng);
    job_tags_forget(eng, j, entries, n, keys_cap); /* interned just now */
    if (new_key) prefix_key_forget(eng, c->q, key, keys_cap);
    if (!had_arrays && eng->ip) page_meta_arrays_drop(eng); /* a failed call keeps nothing */
    if (c->index.cap != index_cap) (void)hmap_resize(&c->index, &eng->mem, index_cap);
    put_rollback(eng, t, done + 1 < n ? done + 1 : n);
    if (c->seqs.cap != map_cap) (void)hmap_resize(&c->seqs, &eng->mem, map_cap);
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    if (t[i].created) seq_enlist(eng, t[i].s);
    j->f.seqs[i] = t[i].s;
  }
  c->index_pending += j->index_need;
  job_key(j, key);
  job_stage(eng, j); /* the pages it writes are its own from here */
  for (size_t i = 0; i < n; i++)
    if (j->f.seqs[i]->x->nholes)
      holes_zero(eng, j->f.seqs[i], entries[i].pos, entries[i].pos + entries[i].ntokens);
  *job = j;
  j = NULL;
out:
  mem_free(&eng->mem, j);
  if (t != &one) mem_free(&eng->mem, t);
  if (sp != &one_sp) mem_free(&eng->mem, sp);
  return rc;
}

int engine_put(engine_t *eng, uint32_t cache_id, const engine_xfer_t *x,
               const engine_io_t *entries, size_t n) {
  engine_put_job_t *j;
  int rc = engine_put_begin(eng, cache_id, x, entries, n, &j);
  if (rc) return rc;
  engine_put_run(j);
  engine_put_end(eng, j);
  return 0;
}
