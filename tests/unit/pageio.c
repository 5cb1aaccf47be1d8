/* pageio.c: indexed pages out of one engine and into another (a tier
 * between two nodes): tenant identities, the hooks, export, the hashes past
 * a local match, and imports that verify every page against the query. */
#include "engine_fixture.h"
#include "engine_tier.h"

#define T 4u /* tokens a page of fx_small_layout */

static const engine_pkey_t KEY = {"salt", 4, NULL, 0};
static const uint8_t ID_A[32] = {'a'}, ID_B[32] = {'b'};

static uint32_t tok(uint32_t p, uint64_t i) { return p * 100000u + (uint32_t)i; }

static uint32_t *ids_of(uint32_t p, uint64_t n) {
  uint32_t *ids = calloc(n + 1, sizeof *ids);
  for (uint64_t i = 0; i < n; i++) ids[i] = tok(p, i);
  return ids;
}

/* A node: an engine whose tenant 7 is named id, with that tenant's cache
 * "main" (tenant numbers differ between nodes: identities do not). */
static void node_open(fx_t *f, uint64_t npages, uint32_t tenant, const uint8_t *id) {
  kvc_layout_t lay = fx_small_layout();
  fx_engine(f, 1536, npages, 0);
  f->lay = lay;
  if (id) ASSERT_OK(engine_tenant_identity(f->eng, tenant, id));
  ASSERT_OK(engine_cache_open_in(f->eng, tenant, "main", &lay, &f->cid));
}

/* Puts prompt p's first n tokens as seq with its payload and ids. */
static void put_prompt(fx_t *f, uint64_t seq, uint32_t p, uint64_t n) {
  fx_rng_t r = fx_all(&f->lay);
  fx_buf_t b = fx_buf_new(&f->lay, r, n);
  uint32_t *ids = ids_of(p, n);
  fx_fill(&f->lay, r, seq, 0, n, 0, b.k, b.v);
  engine_io_t io = fx_io(seq, 0, n, &b);
  io.tokens = ids;
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  x.pkey = &KEY;
  ASSERT_OK(engine_put(f->eng, f->cid, &x, &io, 1));
  fx_buf_free(&b);
  free(ids);
}

/* What a tier holds of one node's pages: hashes and bytes, by page. */
typedef struct tier {
  uint8_t hash[16][32];
  uint8_t bytes[16][1536];
  size_t n;
} tier_t;

static void indexed_hook(void *ctx, uint32_t cache_id, const uint8_t hash[32]) {
  (void)cache_id;
  tier_t *t = ctx;
  memcpy(t->hash[t->n++], hash, 32);
}

/* Exports every page the hook saw into t->bytes. */
static void export_all(fx_t *f, tier_t *t) {
  for (size_t i = 0; i < t->n; i++) {
    engine_page_t pg;
    ASSERT_OK(engine_page_export(f->eng, f->cid, t->hash[i], &pg));
    ASSERT_EQ(pg.data_bytes, 1536);
    ASSERT_EQ(pg.page_tokens, T);
    ASSERT_EQ(!pg.head, i > 0);
    if (i) ASSERT_MEM_EQ(pg.parent, t->hash[i - 1], 32);
    for (uint32_t j = 0; j < T; j++) ASSERT_EQ(pg.tokens[j], tok(1, i * T + j));
    memcpy(t->bytes[i], pg.bytes, 1536);
  }
}

static size_t import(fx_t *f, uint32_t p, uint64_t n, uint64_t first, tier_t *t, size_t from,
                     size_t k, int *rc) {
  uint32_t *ids = ids_of(p, n);
  engine_page_in_t in[16];
  for (size_t i = 0; i < k; i++) in[i] = (engine_page_in_t){t->hash[from + i], t->bytes[from + i]};
  size_t got = 99;
  *rc = engine_tier_import(f->eng, f->cid, ids, n, &KEY, first, in, k, &got);
  free(ids);
  return got;
}

static engine_match_t attach(fx_t *f, uint64_t dst, uint32_t p, uint64_t n) {
  uint32_t *ids = ids_of(p, n);
  engine_match_t m;
  ASSERT_OK(engine_attach(f->eng, f->cid, dst, ids, n, &KEY, 0, &m));
  free(ids);
  return m;
}

/* Node a indexes prompt 1 (4 pages) and a tier keeps its pages. */
static void prefill_a(fx_t *a, tier_t *t) {
  memset(t, 0, sizeof *t);
  node_open(a, 16, 3, ID_A);
  engine_tier_hooks_t h = {t, indexed_hook, NULL};
  engine_set_tier_hooks(a->eng, &h);
  put_prompt(a, 1, 1, 4 * T + 2);
  ASSERT_EQ(t->n, 4);
  export_all(a, t);
}

TEST(pageio_bad_arguments) {
  fx_t f;
  node_open(&f, 8, 1, NULL);
  uint8_t h[32] = {0}, out[4][32];
  uint64_t local;
  size_t n;
  engine_page_t pg;
  uint32_t ids[8] = {0};
  ASSERT_ERR(engine_tenant_identity(NULL, 1, ID_A), KVC_E_INVAL);
  ASSERT_ERR(engine_tenant_identity(f.eng, 1, NULL), KVC_E_INVAL);
  ASSERT_ERR(engine_page_export(f.eng, f.cid, NULL, &pg), KVC_E_INVAL);
  ASSERT_ERR(engine_page_export(f.eng, f.cid + 1, h, &pg), KVC_E_NOCACHE);
  ASSERT_ERR(engine_page_export(f.eng, f.cid, h, &pg), KVC_E_NOSEQ);
  ASSERT_ERR(engine_tier_probe(f.eng, f.cid, ids, 8, &KEY, NULL, NULL, out, 4, &n), KVC_E_INVAL);
  ASSERT_ERR(engine_tier_probe(f.eng, f.cid, NULL, 8, &KEY, &local, NULL, out, 4, &n), KVC_E_INVAL);
  ASSERT_ERR(engine_tier_import(f.eng, f.cid, ids, 8, &KEY, 0, NULL, 1, &n), KVC_E_INVAL);
  engine_page_in_t in[3] = {{h, h}, {h, h}, {h, h}};
  ASSERT_ERR(engine_tier_import(f.eng, f.cid, ids, 8, &KEY, 1, in, 2, &n), KVC_E_RANGE);
  ASSERT_ERR(engine_tier_import(f.eng, f.cid + 1, ids, 8, &KEY, 0, in, 1, &n), KVC_E_NOCACHE);
  fx_close(&f);
}

TEST(pageio_identity_is_fixed_before_a_tenant_holds_anything) {
  fx_t f;
  node_open(&f, 8, 1, ID_A); /* tenant 1 has a cache now */
  ASSERT_OK(engine_tenant_identity(f.eng, 1, ID_A));        /* the same: no change */
  ASSERT_ERR(engine_tenant_identity(f.eng, 1, ID_B), KVC_E_BUSY);
  ASSERT_ERR(engine_tenant_identity(f.eng, 2, ID_A), KVC_E_EXISTS);
  ASSERT_OK(engine_tenant_identity(f.eng, 2, ID_B));
  fx_close(&f);
}

TEST(pageio_same_identity_same_hashes_across_engines) {
  fx_t a, b, c;
  tier_t t;
  prefill_a(&a, &t);
  node_open(&b, 16, 9, ID_A); /* another number, the same identity */
  node_open(&c, 16, 3, ID_B); /* the same number, another identity */
  uint32_t *ids = ids_of(1, 4 * T + 2);
  uint8_t hb[8][32], hc[8][32];
  uint64_t local;
  size_t n;
  ASSERT_OK(engine_tier_probe(b.eng, b.cid, ids, 4 * T + 2, &KEY, &local, NULL, hb, 8, &n));
  ASSERT_EQ(local, 0);
  ASSERT_EQ(n, 4); /* whole pages only */
  for (size_t i = 0; i < 4; i++) ASSERT_MEM_EQ(hb[i], t.hash[i], 32);
  ASSERT_OK(engine_tier_probe(c.eng, c.cid, ids, 4 * T + 2, &KEY, &local, NULL, hc, 8, &n));
  ASSERT_EQ(n, 4);
  ASSERT(memcmp(hc[0], t.hash[0], 32) != 0);
  /* past a local match: a has all four */
  ASSERT_OK(engine_tier_probe(a.eng, a.cid, ids, 4 * T + 2, &KEY, &local, NULL, hb, 8, &n));
  ASSERT_EQ(local, 4);
  ASSERT_EQ(n, 0);
  free(ids);
  fx_close(&a);
  fx_close(&b);
  fx_close(&c);
}

TEST(pageio_import_then_attach_serves_the_bytes_of_the_other_engine) {
  fx_t a, b;
  tier_t t;
  prefill_a(&a, &t);
  node_open(&b, 16, 9, ID_A);
  static tier_t seen;
  engine_tier_hooks_t h = {&seen, indexed_hook, NULL};
  engine_set_tier_hooks(b.eng, &h);
  int rc;
  ASSERT_EQ(import(&b, 1, 4 * T + 2, 0, &t, 0, 4, &rc), 4);
  ASSERT_OK(rc);
  ASSERT_EQ(((tier_t *)h.ctx)->n, 0); /* an import is no put: no write-back */
  engine_stats_t s = fx_stats(&b);
  ASSERT_EQ(s.pages_indexed, 4);
  ASSERT_EQ(s.pages_cached, 4);
  ASSERT_EQ(s.puts, 0);
  engine_match_t m = attach(&b, 5, 1, 4 * T + 2);
  ASSERT_EQ(m.pages, 4);
  FX_EXPECT_RNG(&b, 5, 0, 4 * T, fx_all(&b.lay), 1, 0); /* a's payload of seq 1 */
  /* imported again: already indexed, nothing taken twice */
  ASSERT_EQ(import(&b, 1, 4 * T + 2, 0, &t, 0, 4, &rc), 0);
  ASSERT_OK(rc);
  fx_close(&a);
  fx_close(&b);
}

TEST(pageio_import_under_a_local_prefix) {
  fx_t a, b;
  tier_t t;
  prefill_a(&a, &t);
  node_open(&b, 16, 9, ID_A);
  /* b attaches page 0 from the tier, then imports the rest under it */
  int rc;
  ASSERT_EQ(import(&b, 1, T, 0, &t, 0, 1, &rc), 1);
  uint32_t *ids = ids_of(1, 4 * T);
  uint8_t hb[8][32];
  uint64_t local;
  size_t n;
  uint8_t before[32];
  ASSERT_OK(engine_tier_probe(b.eng, b.cid, ids, 4 * T, &KEY, &local, before, hb, 8, &n));
  ASSERT_EQ(local, 1);
  ASSERT_EQ(n, 3);
  ASSERT_MEM_EQ(before, t.hash[0], 32);
  ASSERT_MEM_EQ(hb[0], t.hash[1], 32);
  free(ids);
  ASSERT_EQ(import(&b, 1, 4 * T, 1, &t, 1, 3, &rc), 3);
  engine_match_t m = attach(&b, 5, 1, 4 * T);
  ASSERT_EQ(m.pages, 4);
  FX_EXPECT_RNG(&b, 5, 0, 4 * T, fx_all(&b.lay), 1, 0);
  /* first past the pages held here: nothing hangs under a missing page */
  fx_t c;
  node_open(&c, 16, 9, ID_A);
  ASSERT_EQ(import(&c, 1, 4 * T, 1, &t, 1, 3, &rc), 0);
  ASSERT_OK(rc);
  ASSERT_EQ(fx_stats(&c).pages_indexed, 0);
  fx_close(&a);
  fx_close(&b);
  fx_close(&c);
}

TEST(pageio_import_stops_at_a_page_whose_hash_is_not_the_querys) {
  fx_t a, b, c;
  tier_t t;
  prefill_a(&a, &t);
  node_open(&b, 16, 9, ID_A);
  tier_t bad = t;
  memcpy(bad.hash[2], t.hash[3], 32); /* the tier names page 3 as page 2 */
  int rc;
  ASSERT_EQ(import(&b, 1, 4 * T, 0, &bad, 0, 4, &rc), 2);
  ASSERT_EQ(fx_stats(&b).hash_verify_failed, 1);
  ASSERT_EQ(attach(&b, 5, 1, 4 * T).pages, 2);
  /* another tenant's engine takes none of them: its query hashes differ */
  node_open(&c, 16, 9, ID_B);
  ASSERT_EQ(import(&c, 1, 4 * T, 0, &t, 0, 4, &rc), 0);
  ASSERT_EQ(fx_stats(&c).pages_indexed, 0);
  /* another salt, the same tenant: none either */
  uint32_t *ids = ids_of(1, 4 * T);
  engine_page_in_t in[4];
  for (size_t i = 0; i < 4; i++) in[i] = (engine_page_in_t){t.hash[i], t.bytes[i]};
  engine_pkey_t other = {"pepper", 6, NULL, 0};
  size_t got;
  ASSERT_OK(engine_tier_import(b.eng, b.cid, ids, 4 * T, &other, 0, in, 4, &got));
  ASSERT_EQ(got, 0);
  free(ids);
  fx_close(&a);
  fx_close(&b);
  fx_close(&c);
}

TEST(pageio_import_fits_what_the_pool_can_hold) {
  fx_t a, b;
  tier_t t;
  prefill_a(&a, &t);
  node_open(&b, 4, 9, ID_A);
  ASSERT_OK(fx_put(&b, 1, 0, 2 * T, 0));     /* 2 pages held by a sequence */
  ASSERT_OK(engine_pin(b.eng, b.cid, 1, 1)); /* and pinned: 2 pages of room */
  int rc;
  ASSERT_EQ(import(&b, 1, 4 * T, 0, &t, 0, 4, &rc), 2);
  ASSERT_OK(rc);
  engine_stats_t s = fx_stats(&b);
  ASSERT_EQ(s.full_errors, 0); /* fitting fewer is not a write refused */
  ASSERT_EQ(s.pages_cached, 2);
  ASSERT_OK(fx_put(&b, 2, 0, T, 0)); /* a put still evicts the imported tail */
  ASSERT_EQ(fx_stats(&b).pages_cached, 1);
  ASSERT_OK(fx_put(&b, 2, T, T, 0)); /* and then the head */
  ASSERT_EQ(fx_stats(&b).pages_cached, 0);
  ASSERT_OK(engine_pin(b.eng, b.cid, 2, 1)); /* nothing left to evict */
  ASSERT_EQ(import(&b, 1, 4 * T, 0, &t, 0, 4, &rc), 0);
  ASSERT_ERR(rc, KVC_E_FULL);
  ASSERT_EQ(fx_stats(&b).full_errors, 0);
  fx_close(&a);
  fx_close(&b);
}

typedef struct kept {
  size_t n;
  uint8_t hash[32];
  uint8_t bytes[1536];
} kept_t;

static void reclaimed_hook(void *ctx, const engine_page_t *pg) {
  kept_t *k = ctx;
  k->n++;
  memcpy(k->hash, pg->hash, 32);
  memcpy(k->bytes, pg->bytes, (size_t)pg->data_bytes);
}

TEST(pageio_reclaimed_hook_sees_the_page_before_it_goes) {
  fx_t a;
  tier_t t;
  prefill_a(&a, &t); /* 16 pages: 5 held by seq 1 */
  kept_t k = {0};
  engine_tier_hooks_t h = {&k, NULL, reclaimed_hook};
  engine_set_tier_hooks(a.eng, &h);
  ASSERT_OK(engine_remove(a.eng, a.cid, 1, 0, UINT64_MAX)); /* 4 cached pages */
  ASSERT_OK(fx_put(&a, 2, 0, 12 * T + 1, 0));               /* needs 13 of 16: 1 reclaimed */
  ASSERT_EQ(k.n, 1);
  ASSERT_MEM_EQ(k.hash, t.hash[3], 32); /* the chain's tail goes first */
  ASSERT_MEM_EQ(k.bytes, t.bytes[3], 1536);
  fx_close(&a);
}

TEST(pageio_import_failing_allocations_change_nothing) {
  fx_t a, b;
  tier_t t;
  prefill_a(&a, &t);
  node_open(&b, 16, 9, ID_A);
  ASSERT_OK(fx_put(&b, 3, 0, 2 * T, 0));
  uint32_t *ids = ids_of(1, 4 * T);
  uint8_t h[4][32];
  uint64_t local;
  size_t n;
  ASSERT_OK(engine_tier_probe(b.eng, b.cid, ids, 4 * T, &KEY, &local, NULL, h, 4, &n));
  free(ids); /* (a query's scratch, kept by the first match as by any) */
  for (int k = 0;; k++) {
    ASSERT(k < 1000);
    engine_stats_t before = fx_stats(&b);
    engine_fail_alloc_after(b.eng, k);
    int rc;
    size_t got = import(&b, 1, 4 * T, 0, &t, 0, 4, &rc);
    engine_fail_alloc_after(b.eng, -1);
    FX_AUDIT(b.eng);
    if (rc == 0) {
      ASSERT_EQ(got, 4);
      break;
    }
    ASSERT_ERR(rc, KVC_E_NOMEM);
    ASSERT_EQ(got, 0);
    engine_stats_t after = fx_stats(&b);
    FX_STATS_SAME(&before, &after);
  }
  ASSERT_EQ(attach(&b, 5, 1, 4 * T).pages, 4);
  FX_EXPECT_RNG(&b, 5, 0, 4 * T, fx_all(&b.lay), 1, 0);
  fx_close(&a);
  fx_close(&b);
}

typedef struct filler {
  const tier_t *t;
  size_t i, refuse; /* the page it is, the page it refuses */
} filler_t;

static bool fill_page(void *arg, void *dst, uint64_t n) {
  const filler_t *f = arg;
  if (f->i == f->refuse) return false;
  memcpy(dst, f->t->bytes[f->i], (size_t)n);
  return true;
}

TEST(pageio_import_fill_writes_in_place_and_a_refusal_stops_there) {
  fx_t a, b;
  tier_t t;
  prefill_a(&a, &t);
  node_open(&b, 16, 9, ID_A);
  uint32_t *ids = ids_of(1, 4 * T);
  filler_t fl[4];
  engine_page_in_t in[4];
  for (size_t i = 0; i < 4; i++) {
    fl[i] = (filler_t){&t, i, 2};
    in[i] = (engine_page_in_t){.hash = t.hash[i], .fill = fill_page, .arg = &fl[i]};
  }
  engine_stats_t before = fx_stats(&b);
  size_t got;
  ASSERT_OK(engine_tier_import(b.eng, b.cid, ids, 4 * T, &KEY, 0, in, 4, &got));
  ASSERT_EQ(got, 2);
  engine_stats_t after = fx_stats(&b);
  ASSERT_EQ(after.pages_indexed, 2);
  ASSERT_EQ(after.pages_used, before.pages_used + 2); /* the refused page went back */
  FX_AUDIT(b.eng);
  ASSERT_EQ(attach(&b, 5, 1, 4 * T).pages, 2);
  FX_EXPECT_RNG(&b, 5, 0, 2 * T, fx_all(&b.lay), 1, 0);
  /* refused at its first page: nothing imported, no error */
  fx_close(&a); /* (its pages were exported already) */
  node_open(&a, 16, 9, ID_A);
  for (size_t i = 0; i < 4; i++) fl[i].refuse = 0;
  ASSERT_OK(engine_tier_import(a.eng, a.cid, ids, 4 * T, &KEY, 0, in, 4, &got));
  ASSERT_EQ(got, 0);
  ASSERT_EQ(fx_stats(&a).pages_used, 0);
  free(ids);
  fx_close(&a);
  fx_close(&b);
}

/* Pages read straight into the pool (a cluster lookup: each value into a
 * page taken by engine_tier_import_begin) are indexed as they are: the
 * import takes the jobs of the pages it imports, the rest stay the
 * caller's; a job of another cache, or jobs mixed with bytes, are refused. */
TEST(pageio_import_of_pages_filled_in_the_pool_takes_their_jobs) {
  fx_t a, b;
  tier_t t;
  prefill_a(&a, &t);
  node_open(&b, 16, 9, ID_A);
  uint32_t other;
  kvc_layout_t lay = fx_small_layout();
  ASSERT_OK(engine_cache_open_in(b.eng, 9, "other", &lay, &other));
  uint32_t *ids = ids_of(1, 4 * T);
  engine_tier_job_t *job[4], *stray;
  engine_page_in_t in[4];
  void *dst;
  for (size_t i = 0; i < 4; i++) {
    ASSERT_OK(engine_tier_import_begin(b.eng, b.cid, &job[i], &dst, NULL));
    memcpy(dst, t.bytes[i], 1536);
    in[i] = (engine_page_in_t){.hash = t.hash[i], .job = job[i]};
  }
  ASSERT_EQ(fx_stats(&b).pages_used, 4); /* taken, held by the jobs */
  size_t got = 99;
  /* jobs mixed with bytes; a job of another cache */
  engine_page_in_t mixed[2] = {in[0], {.hash = t.hash[1], .bytes = t.bytes[1]}};
  ASSERT_ERR(engine_tier_import(b.eng, b.cid, ids, 4 * T, &KEY, 0, mixed, 2, &got), KVC_E_INVAL);
  ASSERT_OK(engine_tier_import_begin(b.eng, other, &stray, &dst, NULL));
  engine_page_in_t wrong[2] = {in[0], {.hash = t.hash[1], .job = stray}};
  ASSERT_ERR(engine_tier_import(b.eng, b.cid, ids, 4 * T, &KEY, 0, wrong, 2, &got), KVC_E_INVAL);
  engine_tier_import_abort(b.eng, stray); /* freed */
  engine_tier_import_abort(b.eng, NULL);
  /* the run stops at page 2, whose hash is not the query's: pages 0, 1 taken */
  uint8_t bad[32];
  memcpy(bad, t.hash[2], 32);
  bad[0] ^= 1;
  in[2].hash = bad;
  engine_stats_t before = fx_stats(&b);
  ASSERT_OK(engine_tier_import(b.eng, b.cid, ids, 4 * T, &KEY, 0, in, 4, &got));
  ASSERT_EQ(got, 2);
  engine_stats_t after = fx_stats(&b);
  ASSERT_EQ(after.pages_indexed, before.pages_indexed + 2);
  ASSERT_EQ(after.pages_used, before.pages_used); /* no page taken, none copied */
  FX_AUDIT(b.eng);
  /* the others are still the caller's: page 2 filled in place, imported after */
  in[2].hash = t.hash[2];
  ASSERT_OK(engine_tier_import(b.eng, b.cid, ids, 4 * T, &KEY, 2, in + 2, 2, &got));
  ASSERT_EQ(got, 2);
  ASSERT_EQ(fx_stats(&b).pages_used, 4);
  FX_AUDIT(b.eng);
  ASSERT_EQ(attach(&b, 5, 1, 4 * T).pages, 4);
  FX_EXPECT_RNG(&b, 5, 0, 4 * T, fx_all(&b.lay), 1, 0);
  FX_AUDIT(b.eng);
  /* a job given back: its page freed, no error counted */
  ASSERT_OK(engine_tier_import_begin(b.eng, b.cid, &stray, &dst, NULL));
  ASSERT_EQ(fx_stats(&b).pages_used, 5);
  uint64_t errors = fx_stats(&b).errors;
  engine_tier_import_abort(b.eng, stray);
  ASSERT_EQ(fx_stats(&b).pages_used, 4);
  ASSERT_EQ(fx_stats(&b).errors, errors);
  FX_AUDIT(b.eng);
  free(ids);
  fx_close(&a);
  fx_close(&b);
}

TEST(pageio_a_held_page_keeps_its_bytes_until_released) {
  fx_t a;
  tier_t t;
  prefill_a(&a, &t); /* 16 pages: 5 held by seq 1, 4 of them indexed */
  engine_page_t pg;
  engine_hold_t *hold = NULL;
  uint8_t none[32] = {0};
  ASSERT_ERR(engine_page_hold(a.eng, a.cid, none, &pg, &hold), KVC_E_NOSEQ);
  ASSERT_ERR(engine_page_hold(a.eng, a.cid, t.hash[3], &pg, NULL), KVC_E_INVAL);
  ASSERT_OK(engine_page_hold(a.eng, a.cid, t.hash[3], &pg, &hold));
  ASSERT_OK(engine_remove(a.eng, a.cid, 1, 0, UINT64_MAX)); /* cached, and held */
  ASSERT_OK(fx_put(&a, 2, 0, 12 * T, 0));                    /* the 12 free pages */
  ASSERT_OK(engine_pin(a.eng, a.cid, 2, 1));
  /* pages 0-2 are cached, but page 3, held, is in the index under them:
   * not one of them can go (a chain loses its tail first) */
  ASSERT_ERR(fx_put(&a, 3, 0, 4 * T, 0), KVC_E_FULL);
  ASSERT_MEM_EQ(pg.bytes, t.bytes[3], 1536);
  FX_AUDIT(a.eng);
  engine_page_release(a.eng, hold);
  engine_page_release(a.eng, NULL);
  FX_AUDIT(a.eng);
  ASSERT_OK(fx_put(&a, 3, 0, 4 * T, 0)); /* the page is cached again: the chain goes */
  ASSERT_EQ(fx_stats(&a).pages_cached, 0);
  fx_close(&a);
}
