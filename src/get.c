/* get.c: reading tokens out of the pool: a get copied on the engine's
 * thread, or split so the copy runs on another (begin, run, end). Holes read
 * as zeros. Validated in full before anything is counted or touched. */
#include <string.h>

#include "copy.h"
#include "holes.h"
#include "lease.h"
#include "lru.h"
#include "seq.h"
#include "xfer.h"

/* Validates a get completely (nothing changes); fills *cp and *r_. */
static int get_check(engine_t *eng, uint32_t cache_id, const engine_xfer_t *x,
                     const engine_io_t *entries, size_t n, cache_t **cp, layout_xfer_t *r_) {
  cache_t *c;
  layout_xfer_t r;
  int rc = xfer_begin(eng, cache_id, x, false, entries, n, &c, &r);
  if (rc) return rc;
  for (size_t i = 0; i < n; i++) {
    const engine_io_t *e = &entries[i];
    seq_t *s = hmap_get(&c->seqs, e->seq_id);
    if (!s)
      return engine_fail(eng, KVC_E_NOSEQ, "entry %zu: no sequence %llu", i,
                         (unsigned long long)e->seq_id);
    if (s->busy) return seq_busy(eng, s);
    uint64_t have = seq_range_len(s, r.l0, r.l1);
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
typedef struct zero_ctx {
  const copy_plan_t *plan;
  const engine_io_t *e;
} zero_ctx_t;

static void zero_now(uint64_t off, uint64_t n, void *arg) {
  const zero_ctx_t *z = arg;
  copy_zero(z->plan, off, n, z->e->k, z->e->v, z->e->k_scale, z->e->v_scale);
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
  layout_xfer_t r;
  int rc = get_check(eng, cache_id, x, entries, n, &c, &r);
  if (rc) return rc;
  const geom_t *g = &c->g;
  for (size_t i = 0; i < n; i++) {
    const engine_io_t *e = &entries[i];
    seq_t *s = hmap_get(&c->seqs, e->seq_id);
    copy_plan_t plan;
    copy_plan_init(&plan, g, c->layout.dtype, r.l0, r.l1 - r.l0, r.h0, r.h1 - r.h0, r.bt,
                   e->ntokens);
    copy_plan_scale(&plan, r.k_scale, r.v_scale);
    for (seq_run_t run = seq_run(g, e->pos, e->pos + e->ntokens); seq_run_next(&run);) {
      uint32_t page = s->table[run.idx - s->base];
      if (page != POOL_NOPAGE) /* else all holes: zeroed below */
        copy_out(&plan, pool_page(&eng->pool, page), run.off, run.done, run.n, e->k, e->v,
                 e->k_scale, e->v_scale);
    }
    zero_ctx_t z = {&plan, e};
    holes_within(s, e->pos, e->pos + e->ntokens, zero_now, &z);
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

/* Records the holes the job's entries cover (counted first, then kept). */
typedef struct zero_rec {
  engine_get_job_t *j;
  uint32_t entry;
  size_t count;
} zero_rec_t;

static void zero_note(uint64_t off, uint64_t n, void *arg) {
  zero_rec_t *z = arg;
  if (z->j->zeros) z->j->zeros[z->j->nzeros++] = (zero_run_t){off, n, z->entry};
  else z->count++;
}

static int get_job_holes(engine_t *eng, cache_t *c, engine_get_job_t *j,
                         const engine_io_t *entries) {
  zero_rec_t z = {j, 0, 0};
  j->zeros = NULL;
  j->nzeros = 0;
  for (int pass = 0; pass < 2; pass++) {
    for (size_t i = 0; i < j->n; i++) {
      const engine_io_t *e = &entries[i];
      z.entry = (uint32_t)i;
      holes_within(hmap_get(&c->seqs, e->seq_id), e->pos, e->pos + e->ntokens, zero_note, &z);
    }
    if (!z.count) return 0;
    if (pass == 0 && !(j->zeros = mem_calloc(&eng->mem, z.count, sizeof *j->zeros)))
      return KVC_E_NOMEM;
  }
  return 0;
}

int engine_get_begin(engine_t *eng, uint32_t cache_id, const engine_xfer_t *x,
                     const engine_io_t *entries, size_t n, engine_get_job_t **job) {
  if (!eng) return KVC_E_INVAL;
  if (!job) return engine_fail(eng, KVC_E_INVAL, "NULL argument");
  cache_t *c;
  layout_xfer_t r;
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
    copy_plan_scale(&plans[i], r.k_scale, r.v_scale);
    for (seq_run_t run = seq_run(g, e->pos, e->pos + e->ntokens); seq_run_next(&run);) {
      uint32_t page = s->table[run.idx - s->base];
      if (page == POOL_NOPAGE) continue; /* all holes: a zero run covers it */
      pages[k] = page;
      j->chunks[k++] = (chunk_t){pool_page(&eng->pool, page), run.off, run.done, run.n,
                                 (uint32_t)i};
    }
  }
  j->nchunks = k;
  if (get_job_holes(eng, c, j, entries)) goto nomem;
  if (!(j->lease = lease_pages(eng, pages, (uint32_t)k, g->page_bytes))) goto nomem;
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

/* Entry e's share part of nparts: its plan and buffers sliced by layers. */
static bool get_share(const engine_get_job_t *j, uint32_t entry, unsigned part, unsigned nparts,
                      copy_plan_t *sub, void **k, void **v, void **ks, void **vs) {
  const engine_io_t *e = &j->io[entry];
  const void *kb = e->k, *vb = e->v, *ksb = e->k_scale, *vsb = e->v_scale;
  bool mine = copy_plan_slice(&j->plans[entry], part, nparts, sub, &kb, &vb, &ksb, &vsb);
  *k = (void *)kb, *v = (void *)vb, *ks = (void *)ksb, *vs = (void *)vsb;
  return mine;
}

void engine_get_run_part(const engine_get_job_t *j, unsigned part, unsigned nparts) {
  copy_plan_t sub;
  void *k, *v, *ks, *vs;
  for (size_t c = 0; c < j->nchunks; c++) {
    const chunk_t *ch = &j->chunks[c];
    if (get_share(j, ch->entry, part, nparts, &sub, &k, &v, &ks, &vs))
      copy_out(&sub, ch->page, ch->pt0, ch->bt0, ch->cnt, k, v, ks, vs);
  }
  for (size_t z = 0; z < j->nzeros; z++) {
    const zero_run_t *zr = &j->zeros[z];
    if (get_share(j, zr->entry, part, nparts, &sub, &k, &v, &ks, &vs))
      copy_zero(&sub, zr->bt0, zr->cnt, k, v, ks, vs);
  }
}

void engine_get_run(const engine_get_job_t *j) { engine_get_run_part(j, 0, 1); }

unsigned engine_get_job_layers(const engine_get_job_t *j) { return j->n ? j->plans[0].nl : 1; }

void engine_get_end(engine_t *eng, engine_get_job_t *j) {
  if (!j) return;
  lease_drop(eng, j->lease);
  mem_free(&eng->mem, j->zeros);
  mem_free(&eng->mem, j->plans);
  mem_free(&eng->mem, j->io);
  mem_free(&eng->mem, j);
}
