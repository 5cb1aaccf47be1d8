/* engine_allocfail.c: fail the k-th heap allocation of each main operation.
 *
 * For k = 0, 1, 2, ... the operation runs with engine_fail_alloc_after(k)
 * until it succeeds. Every failing attempt must return KVC_E_NOMEM and leave
 * the engine as it was: the audit passes, every stat is the same (heap bytes
 * included: nothing kept, nothing leaked), and every sequence reads back the
 * same bytes and info. LeakSanitizer checks the sanitizer build for leaks
 * at exit as well.
 */
#include "engine_fixture.h"

#define MAXSNAP 8

/* What the engine holds, to compare before and after a failed call. */
typedef struct snap {
  engine_stats_t st;
  size_t ncaches;
  bool live[MAXSNAP];
  kvc_seq_info_t info[MAXSNAP];
  fx_buf_t data[MAXSNAP];
} snap_t;

typedef struct sweep {
  fx_t f;
  uint64_t seqs[MAXSNAP]; /* the sequences to compare */
  int nseqs;
} sweep_t;

static void snap_take(sweep_t *w, snap_t *s) {
  memset(s, 0, sizeof *s);
  ASSERT_OK(engine_cache_list(w->f.eng, NULL, 0, &s->ncaches));
  for (int j = 0; j < w->nseqs; j++) {
    kvc_seq_info_t *si = &s->info[j];
    int rc = engine_seq_info(w->f.eng, w->f.cid, w->seqs[j], si);
    ASSERT(rc == 0 || rc == KVC_E_NOSEQ);
    s->live[j] = rc == 0;
    if (!s->live[j] || si->length <= si->start) continue;
    fx_rng_t r = fx_all(&w->f.lay);
    s->data[j] = fx_buf_new(&w->f.lay, r, si->length - si->start);
    engine_io_t io = fx_io(w->seqs[j], si->start, si->length - si->start, &s->data[j]);
    engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
    ASSERT_OK(engine_get(w->f.eng, w->f.cid, &x, &io, 1));
  }
  engine_stats(w->f.eng, &s->st); /* last: the reads above move counters */
}

static void snap_free(snap_t *s) {
  for (int j = 0; j < MAXSNAP; j++) fx_buf_free(&s->data[j]);
}

/* The engine still holds exactly what a holds (except last-use clocks). */
static void snap_same(sweep_t *w, snap_t *a, int k) {
  snap_t b;
  engine_stats_t now;
  engine_stats(w->f.eng, &now);
  FX_STATS_SAME_BUT_HEAP(&a->st, &now);
  snap_take(w, &b);
  ASSERT_EQ(b.ncaches, a->ncaches);
  for (int j = 0; j < w->nseqs; j++) {
    if (a->live[j] != b.live[j]) TEST_FAIL_("k=%d: seq %" PRIu64 " %s", k, w->seqs[j], a->live[j] ? "vanished" : "appeared");
    if (!a->live[j]) continue;
    a->info[j].last_use_ms = b.info[j].last_use_ms;
    ASSERT(memcmp(&a->info[j], &b.info[j], sizeof b.info[j]) == 0);
    ASSERT_MEM_EQ(b.data[j].k, a->data[j].k, a->data[j].kb);
    ASSERT_MEM_EQ(b.data[j].v, a->data[j].v, a->data[j].vb);
  }
  snap_free(&b);
  if (now.metadata_bytes != a->st.metadata_bytes)
    TEST_FAIL_("k=%d: a failed call kept %lld heap bytes", k,
               (long long)(now.metadata_bytes - a->st.metadata_bytes));
}

typedef int (*op_fn)(sweep_t *w);

/* Runs op with the k-th allocation failing for k = 0, 1, ... until it
 * succeeds; returns how many attempts failed. */
static int sweep_run(sweep_t *w, op_fn op) {
  for (int k = 0; k < 10000; k++) {
    snap_t a;
    snap_take(w, &a);
    engine_fail_alloc_after(w->f.eng, k);
    int rc = op(w);
    engine_fail_alloc_after(w->f.eng, -1);
    FX_AUDIT(w->f.eng);
    if (rc == 0) {
      snap_free(&a);
      return k;
    }
    if (rc != KVC_E_NOMEM)
      TEST_FAIL_("k=%d: expected NOMEM or success, got %s (%s)", k, kvc_err_name(rc),
                 engine_last_error(w->f.eng)->msg);
    snap_same(w, &a, k);
    snap_free(&a);
  }
  TEST_FAIL_("the operation never succeeded");
  return -1;
}

/* Seqs 1 (10 tokens), 2 (copy of 1's first 6), 3 (5 tokens, pinned by
 * owner 1) in a pool of npages. */
static void sweep_open(sweep_t *w, uint64_t npages) {
  kvc_layout_t l = fx_small_layout();
  fx_open(&w->f, &l, npages);
  ASSERT_OK(fx_put(&w->f, 1, 0, 10, 0));
  ASSERT_OK(engine_copy_prefix(w->f.eng, w->f.cid, 1, 2, 6));
  ASSERT_OK(fx_put(&w->f, 3, 0, 5, 0));
  ASSERT_OK(engine_pin(w->f.eng, w->f.cid, 3, 1));
  uint64_t ids[] = {1, 2, 3, 4, 5, 6, 7};
  memcpy(w->seqs, ids, sizeof ids);
  w->nseqs = 7;
}

static void sweep_close(sweep_t *w) { fx_close(&w->f); }

/* ---- the operations ------------------------------------------------------------------ */

static int op_cache_open(sweep_t *w) {
  uint32_t id;
  return engine_cache_open(w->f.eng, "second", &w->f.lay, &id);
}

TEST(allocfail_cache_open) {
  sweep_t w;
  sweep_open(&w, 16);
  int fails = sweep_run(&w, op_cache_open);
  ASSERT_U64_EQ(fx_stats(&w.f).caches, 2);
  fprintf(stderr, "cache_open: %d failing allocations swept\n", fails);
  sweep_close(&w);
}

static int op_put_new(sweep_t *w) { return fx_put(&w->f, 4, 0, 6, 4); }

TEST(allocfail_put_new_sequence) {
  sweep_t w;
  sweep_open(&w, 16);
  int fails = sweep_run(&w, op_put_new);
  FX_EXPECT(&w.f, 4, 0, 6, 4);
  ASSERT(fails >= 1);
  sweep_close(&w);
}

/* New seqs 4, 5, 6, an append to 1 (its table grows past 4 pages), a COW
 * into 2's shared page. */
static int op_put_batch(sweep_t *w) {
  fx_rng_t r = fx_all(&w->f.lay);
  uint64_t ids[5] = {4, 5, 6, 1, 2}, pos[5] = {0, 0, 0, 10, 6}, n[5] = {3, 5, 9, 12, 1};
  fx_buf_t b[5];
  engine_io_t io[5];
  for (int j = 0; j < 5; j++) {
    b[j] = fx_buf_new(&w->f.lay, r, n[j]);
    fx_fill(&w->f.lay, r, ids[j], pos[j], n[j], 5, b[j].k, b[j].v);
    io[j] = fx_io(ids[j], pos[j], n[j], &b[j]);
  }
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  int rc = engine_put(w->f.eng, w->f.cid, &x, io, 5);
  for (int j = 0; j < 5; j++) fx_buf_free(&b[j]);
  return rc;
}

TEST(allocfail_put_batch) {
  sweep_t w;
  sweep_open(&w, 32);
  int fails = sweep_run(&w, op_put_batch);
  FX_EXPECT(&w.f, 6, 0, 9, 5);
  FX_EXPECT(&w.f, 1, 0, 10, 0);
  FX_EXPECT(&w.f, 1, 10, 12, 5);
  FX_EXPECT(&w.f, 2, 6, 1, 5);
  FX_EXPECT_RNG(&w.f, 2, 0, 6, fx_all(&w.f.lay), 1, 0);
  ASSERT(fails >= 3);
  sweep_close(&w);
}

/* A layer-range put: the first one gives seq 3 per-layer lengths. */
static int op_put_layers(sweep_t *w) { return fx_put_layers(&w->f, 3, 5, 4, 0, 2, 6); }

TEST(allocfail_put_layer_range) {
  sweep_t w;
  sweep_open(&w, 16);
  sweep_run(&w, op_put_layers);
  FX_EXPECT_RNG(&w.f, 3, 5, 4, fx_rng(&w.f.lay, 0, 2, 0, 0), 3, 6);
  ASSERT_U64_EQ(FX_INFO(&w.f, 3).length, 5);
  sweep_close(&w);
}

/* A put into a full pool: it evicts seq 1 and 2 (3 is pinned). */
static int op_put_evicting(sweep_t *w) { return fx_put(&w->f, 7, 0, 12, 7); }

TEST(allocfail_put_that_evicts) {
  sweep_t w;
  sweep_open(&w, 5); /* 1: 3 pages, 2: shares 2, 3: 2 pages */
  sweep_run(&w, op_put_evicting);
  FX_EXPECT(&w.f, 7, 0, 12, 7);
  kvc_seq_info_t si;
  ASSERT_ERR(engine_seq_info(w.f.eng, w.f.cid, 1, &si), KVC_E_NOSEQ);
  FX_EXPECT(&w.f, 3, 0, 5, 0);
  sweep_close(&w);
}

static int op_cache_open_new_tenant(sweep_t *w) {
  uint32_t id;
  return engine_cache_open_in(w->f.eng, 5, "second", &w->f.lay, &id);
}

/* A tenant's first cache makes its quota record: all or nothing too. */
TEST(allocfail_cache_open_of_a_new_tenant) {
  sweep_t w;
  sweep_open(&w, 16);
  sweep_run(&w, op_cache_open_new_tenant);
  engine_tenant_usage_t u;
  ASSERT_OK(engine_tenant_usage(w.f.eng, 5, NULL, &u));
  ASSERT_EQ(u.caches, 1);
  sweep_close(&w);
}

/* At its page share (5 of 5 pages held), the tenant's put evicts its own
 * (the walk of its own victims first). */
TEST(allocfail_put_over_the_page_quota) {
  sweep_t w;
  sweep_open(&w, 5);
  engine_tenant_limits_t lim = {.max_bytes = 5 * w.f.page_bytes};
  ASSERT_OK(engine_tenant_limits_set(w.f.eng, 0, &lim));
  sweep_run(&w, op_put_evicting);
  FX_EXPECT(&w.f, 7, 0, 12, 7);
  kvc_seq_info_t si;
  ASSERT_ERR(engine_seq_info(w.f.eng, w.f.cid, 1, &si), KVC_E_NOSEQ);
  FX_EXPECT(&w.f, 3, 0, 5, 0);
  engine_tenant_usage_t u;
  ASSERT_OK(engine_tenant_usage(w.f.eng, 0, NULL, &u));
  ASSERT_U64_EQ(u.pages, 5);
  ASSERT_U64_EQ(u.refused_pages, 0);
  sweep_close(&w);
}

static int op_copy_new(sweep_t *w) { return engine_copy_prefix(w->f.eng, w->f.cid, 1, 5, 9); }

TEST(allocfail_copy_prefix_to_new_dst) {
  sweep_t w;
  sweep_open(&w, 16);
  int fails = sweep_run(&w, op_copy_new);
  FX_EXPECT_RNG(&w.f, 5, 0, 9, fx_all(&w.f.lay), 1, 0);
  ASSERT(fails >= 1);
  sweep_close(&w);
}

static int op_copy_replace(sweep_t *w) { return engine_copy_prefix(w->f.eng, w->f.cid, 1, 3, 10); }

TEST(allocfail_copy_prefix_replacing_dst) {
  sweep_t w;
  sweep_open(&w, 16);
  sweep_run(&w, op_copy_replace);
  FX_EXPECT_RNG(&w.f, 3, 0, 10, fx_all(&w.f.lay), 1, 0);
  ASSERT_EQ(FX_INFO(&w.f, 3).pins, 1);
  sweep_close(&w);
}

static int op_pin_new_owner(sweep_t *w) { return engine_pin(w->f.eng, w->f.cid, 1, 42); }
static int op_pin_second(sweep_t *w) { return engine_pin(w->f.eng, w->f.cid, 2, 42); }

TEST(allocfail_pin_new_owner) {
  sweep_t w;
  sweep_open(&w, 16);
  sweep_run(&w, op_pin_new_owner);
  sweep_run(&w, op_pin_second);
  ASSERT_EQ(FX_INFO(&w.f, 1).pins, 1);
  ASSERT_U64_EQ(fx_stats(&w.f).sequences_pinned, 3);
  ASSERT_EQ(engine_unpin_all(w.f.eng, 42), 2);
  sweep_close(&w);
}

static int op_trim(sweep_t *w) { return engine_trim_front(w->f.eng, w->f.cid, 1, 9); }

TEST(allocfail_trim_front) {
  sweep_t w;
  sweep_open(&w, 16);
  sweep_run(&w, op_trim);
  ASSERT_U64_EQ(FX_INFO(&w.f, 1).start, 9);
  FX_EXPECT(&w.f, 1, 9, 1, 0);
  FX_EXPECT_RNG(&w.f, 2, 0, 6, fx_all(&w.f.lay), 1, 0);
  sweep_close(&w);
}

static int op_truncate(sweep_t *w) { return engine_remove(w->f.eng, w->f.cid, 1, 3, UINT64_MAX); }
static int op_drop(sweep_t *w) { return engine_remove(w->f.eng, w->f.cid, 3, 0, UINT64_MAX); }

TEST(allocfail_remove) {
  sweep_t w;
  sweep_open(&w, 16);
  sweep_run(&w, op_truncate);
  ASSERT_U64_EQ(FX_INFO(&w.f, 1).length, 3);
  sweep_run(&w, op_drop);
  kvc_seq_info_t si;
  ASSERT_ERR(engine_seq_info(w.f.eng, w.f.cid, 3, &si), KVC_E_NOSEQ);
  FX_EXPECT_RNG(&w.f, 2, 0, 6, fx_all(&w.f.lay), 1, 0);
  sweep_close(&w);
}

static int op_drop_cache(sweep_t *w) { return engine_cache_drop(w->f.eng, w->f.cid); }

TEST(allocfail_cache_drop) {
  sweep_t w;
  sweep_open(&w, 16);
  sweep_run(&w, op_drop_cache);
  engine_stats_t s = fx_stats(&w.f);
  ASSERT_U64_EQ(s.caches, 0);
  ASSERT_U64_EQ(s.pages_free, 16);
  engine_free(w.f.eng);
  free(w.f.base);
}

/* The first sequence of a cache grows its (empty) sequence map. */
TEST(allocfail_put_first_sequence_of_a_cache) {
  sweep_t w;
  kvc_layout_t l = fx_small_layout();
  fx_open(&w.f, &l, 16);
  w.seqs[0] = 4, w.nseqs = 1;
  int fails = sweep_run(&w, op_put_new);
  FX_EXPECT(&w.f, 4, 0, 6, 4);
  ASSERT(fails >= 2);
  sweep_close(&w);
}

/* A lease of seq 1's tokens [2, 9): three pages. */
static int op_lease(sweep_t *w) {
  engine_lease_t l;
  return engine_lease(w->f.eng, w->f.cid, 1, 2, 9, 42, &l);
}

TEST(allocfail_lease) {
  sweep_t w;
  sweep_open(&w, 16);
  int fails = sweep_run(&w, op_lease);
  ASSERT(fails >= 1);
  ASSERT_U64_EQ(fx_stats(&w.f).leases, 1);
  ASSERT_U64_EQ(fx_stats(&w.f).leased_pages, 3);
  ASSERT_EQ(engine_lease_release_all(w.f.eng, 42), 1);
  sweep_close(&w);
}

/* A get job of seq 1 [1, 9) and seq 2 [0, 6): begin, run, end. */
static int op_get_job(sweep_t *w) {
  fx_rng_t r = fx_all(&w->f.lay);
  fx_buf_t b1 = fx_buf_new(&w->f.lay, r, 8), b2 = fx_buf_new(&w->f.lay, r, 6);
  engine_io_t io[2] = {fx_io(1, 1, 8, &b1), fx_io(2, 0, 6, &b2)};
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  engine_get_job_t *job;
  int rc = engine_get_begin(w->f.eng, w->f.cid, &x, io, 2, &job);
  if (rc == 0) {
    engine_get_run(job);
    engine_get_end(w->f.eng, job);
  }
  fx_buf_free(&b1);
  fx_buf_free(&b2);
  return rc;
}

TEST(allocfail_get_job) {
  sweep_t w;
  sweep_open(&w, 16);
  int fails = sweep_run(&w, op_get_job);
  ASSERT(fails >= 4);
  ASSERT_U64_EQ(fx_stats(&w.f).leases, 0);
  sweep_close(&w);
}

/* ---- the prefix cache ------------------------------------------------------------ */

static uint32_t ids16[16] = {11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26};

/* Seq 5: 8 tokens written with ids16 (two full pages of the small layout
 * when it has 4-token pages; whole pages get indexed). */
static int op_put_tokens(sweep_t *w) {
  fx_rng_t r = fx_all(&w->f.lay);
  fx_buf_t b = fx_buf_new(&w->f.lay, r, 8);
  fx_fill(&w->f.lay, r, 5, 0, 8, 0, b.k, b.v);
  engine_io_t io = fx_io(5, 0, 8, &b);
  io.tokens = ids16;
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  int rc = engine_put(w->f.eng, w->f.cid, &x, &io, 1);
  fx_buf_free(&b);
  return rc;
}

static int op_attach_pinned(sweep_t *w) {
  engine_match_t m;
  return engine_attach(w->f.eng, w->f.cid, 6, ids16, 8, NULL, 77, &m);
}

static int op_match(sweep_t *w) {
  engine_match_t m;
  return engine_match(w->f.eng, w->f.cid, ids16, 8, NULL, &m);
}

/* Regression: the first token-aware put, failing, kept what it had set up
 * for the prefix index: the key map grown for its (salt, extra) key when the
 * key record failed to allocate, and the index's per-page arrays when a
 * later allocation failed (256 bytes each here). */
TEST(allocfail_first_put_with_tokens_keeps_nothing) {
  sweep_t w;
  sweep_open(&w, 16);
  int fails = sweep_run(&w, op_put_tokens);
  ASSERT(fails >= 2);
  sweep_close(&w);
}

/* Regression: an attach with a pin for a new owner whose pin allocation
 * failed freed the pin record twice (pin_prepare freed it, then the attach's
 * failure path did again), a double free found by the handler fuzzer's
 * prefix seeds. */
TEST(allocfail_attach_pin_new_owner_frees_the_pin_once) {
  sweep_t w;
  sweep_open(&w, 16);
  sweep_run(&w, op_put_tokens);
  sweep_run(&w, op_match);
  int fails = sweep_run(&w, op_attach_pinned);
  ASSERT(fails >= 2);
  kvc_seq_info_t si = FX_INFO(&w.f, 6);
  ASSERT_EQ(si.pins, 1);
  ASSERT_EQ(engine_unpin_all(w.f.eng, 77), 1);
  sweep_close(&w);
}

/* ---- positions of a sequence's own (seq_div) ------------------------------------------ */

/* sweep_open's sequences in a RoPE cache; seq 2 shares 1's first pages. */
static void sweep_open_rope(sweep_t *w, uint64_t npages) {
  kvc_layout_t l = fx_small_layout();
  l.rope_dims = 4;
  l.rope_theta = 10000;
  fx_open(&w->f, &l, npages);
  ASSERT_OK(fx_put(&w->f, 1, 0, 10, 0));
  ASSERT_OK(engine_copy_prefix(w->f.eng, w->f.cid, 1, 2, 6));
  ASSERT_OK(fx_put(&w->f, 3, 0, 5, 0));
  uint64_t ids[] = {1, 2, 3, 4, 5, 6, 7};
  memcpy(w->seqs, ids, sizeof ids);
  w->nseqs = 7;
}

static int op_div_shared(sweep_t *w) { return engine_seq_div(w->f.eng, w->f.cid, 2, 1, -1, 2); }
static int op_copy_divided(sweep_t *w) { return engine_copy_prefix(w->f.eng, w->f.cid, 3, 6, 5); }
static int op_put_divided(sweep_t *w) { return fx_put(&w->f, 3, 5, 9, 2); }

/* A div that copies shared pages and makes its positions, a copy of a
 * divided sequence, an append that grows one's table: every failure leaves
 * everything as it was (heap bytes included). */
TEST(allocfail_seq_div_copy_and_append) {
  sweep_t w;
  sweep_open_rope(&w, 16);
  ASSERT(sweep_run(&w, op_div_shared) >= 3);
  int64_t lo, hi;
  ASSERT_OK(engine_pos_range(w.f.eng, w.f.cid, 2, &lo, &hi));
  ASSERT_EQ(hi, 2); /* 5 / 2 */
  ASSERT_OK(engine_seq_div(w.f.eng, w.f.cid, 3, 0, -1, 2));
  ASSERT(sweep_run(&w, op_copy_divided) >= 1);
  ASSERT_OK(engine_pos_range(w.f.eng, w.f.cid, 6, &lo, &hi));
  ASSERT_EQ(hi, 2);
  ASSERT(sweep_run(&w, op_put_divided) >= 1);
  ASSERT_OK(engine_pos_range(w.f.eng, w.f.cid, 3, &lo, &hi));
  ASSERT_EQ(hi, 11); /* 2, then 3 .. 11 */
  sweep_close(&w);
}
