/* rank.c: each tenant's caches in order of the pages they hold
 * (engine_cache_ranked, src/rank.h), kept as pages are written, shared,
 * copied on write, removed, evicted and caches dropped; a walk of random
 * operations holds it against a sort of every cache's own count. Every test
 * ends with the audit, which checks each ranking's order and places. */
#include "engine_fixture.h"

/* Opens cache `name` of tenant with the small layout; makes it f->cid. */
static uint32_t open_in(fx_t *f, uint32_t tenant, const char *name) {
  uint32_t id;
  ASSERT_OK(engine_cache_open_in(f->eng, tenant, name, &f->lay, &id));
  f->cid = id;
  return id;
}

static uint64_t cache_pages(fx_t *f, uint32_t id) {
  cache_stats_t cs;
  ASSERT_OK(engine_cache_stats(f->eng, id, &cs));
  return cs.pages;
}

/* The tenant's ranking is ids[0..n) with those page counts. */
static void expect_rank(fx_t *f, uint32_t tenant, const uint32_t *ids, const uint64_t *pages,
                        size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint32_t id;
    uint64_t p;
    ASSERT_OK(engine_cache_ranked(f->eng, tenant, i, &id, &p));
    ASSERT_U64_EQ(p, pages[i]);
    if (ids[i]) ASSERT_EQ(id, ids[i]);
    ASSERT_U64_EQ(cache_pages(f, id), p);
  }
  ASSERT_ERR(engine_cache_ranked(f->eng, tenant, n, NULL, NULL), KVC_E_RANGE);
}

TEST(rank_bad_arguments) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 16);
  uint32_t id = 7;
  uint64_t pages = 7;
  ASSERT_ERR(engine_cache_ranked(NULL, 0, 0, &id, &pages), KVC_E_RANGE);
  ASSERT_ERR(engine_cache_ranked(f.eng, 99, 0, &id, &pages), KVC_E_RANGE); /* no such tenant */
  ASSERT_ERR(engine_cache_ranked(f.eng, 0, 1, &id, &pages), KVC_E_RANGE);  /* past the last */
  ASSERT_EQ(id, 7);
  ASSERT_U64_EQ(pages, 7);
  ASSERT_OK(engine_cache_ranked(f.eng, 0, 0, &id, &pages)); /* "main", empty */
  ASSERT_EQ(id, f.cid);
  ASSERT_U64_EQ(pages, 0);
  fx_close(&f);
}

TEST(rank_orders_a_tenants_caches_by_pages_held) {
  fx_t f;
  kvc_layout_t l = fx_small_layout(); /* 4 tokens a page */
  fx_open(&f, &l, 64);
  uint32_t a = open_in(&f, 1, "a"), b = open_in(&f, 1, "b"), c = open_in(&f, 1, "c");
  uint32_t d = open_in(&f, 1, "d");
  uint32_t other = open_in(&f, 2, "a"); /* another tenant's: never in tenant 1's ranking */
  f.cid = other;
  ASSERT_OK(fx_put(&f, 1, 0, 40, 0)); /* 10 pages */
  f.cid = a;
  ASSERT_OK(fx_put(&f, 1, 0, 12, 0)); /* 3 pages */
  f.cid = b;
  ASSERT_OK(fx_put(&f, 1, 0, 1, 0)); /* 1 page */
  f.cid = c;
  ASSERT_OK(fx_put(&f, 1, 0, 20, 0)); /* 5 pages */
  expect_rank(&f, 1, (uint32_t[]){c, a, b, d}, (uint64_t[]){5, 3, 1, 0}, 4);
  expect_rank(&f, 2, (uint32_t[]){other}, (uint64_t[]){10}, 1);
  FX_AUDIT(f.eng);
  /* b grows past a, one page at a time. */
  ASSERT_OK(fx_put(&f, 1, 20, 4, 0)); /* c: 6 */
  f.cid = b;
  ASSERT_OK(fx_put(&f, 1, 1, 15, 0)); /* b: 4 pages */
  expect_rank(&f, 1, (uint32_t[]){c, b, a, d}, (uint64_t[]){6, 4, 3, 0}, 4);
  /* A copy of a prefix holds its pages too (shared, counted per sequence). */
  f.cid = d;
  ASSERT_OK(fx_put(&f, 1, 0, 8, 0));
  ASSERT_OK(engine_copy_prefix(f.eng, d, 1, 2, 8)); /* d: 2 + 2 */
  expect_rank(&f, 1, (uint32_t[]){c, b, 0, 0}, (uint64_t[]){6, 4, 4, 3}, 4);
  /* c's sequence removed: it goes last. */
  ASSERT_OK(engine_remove(f.eng, c, 1, 0, UINT64_MAX));
  expect_rank(&f, 1, (uint32_t[]){0, 0, a, c}, (uint64_t[]){4, 4, 3, 0}, 4);
  FX_AUDIT(f.eng);
  /* Dropping a cache with pages, and an empty one. */
  ASSERT_OK(engine_cache_drop(f.eng, b));
  expect_rank(&f, 1, (uint32_t[]){d, a, c}, (uint64_t[]){4, 3, 0}, 3);
  ASSERT_OK(engine_cache_drop(f.eng, c));
  expect_rank(&f, 1, (uint32_t[]){d, a}, (uint64_t[]){4, 3}, 2);
  /* A cleared cache keeps its place in the tenant, with no page. */
  ASSERT_OK(engine_cache_clear(f.eng, d));
  expect_rank(&f, 1, (uint32_t[]){a, d}, (uint64_t[]){3, 0}, 2);
  engine_stats_t st;
  engine_stats(f.eng, &st);
  ASSERT_U64_EQ(st.caches, 4); /* main; a and d of tenant 1; a of tenant 2 */
  fx_close(&f);
}

/* Random puts, removes, trims and copies over 6 caches of 2 tenants in a
 * pool small enough to evict: after each, every ranking is its caches'
 * counts sorted (most first), and every cache is in its tenant's. */
TEST(rank_random_walk_matches_a_sort) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 48);
  uint32_t ids[6];
  static const char *const names[6] = {"r0", "r1", "r2", "r3", "r4", "r5"};
  for (int i = 0; i < 6; i++) ids[i] = open_in(&f, 1 + (uint32_t)(i % 2), names[i]);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (int step = 0; step < 3000; step++) {
    x = fx_mix(x + (uint64_t)step);
    int ci = (int)(x % 6);
    uint64_t seq = 1 + (x >> 8) % 5, r = (x >> 16) % 8;
    f.cid = ids[ci];
    kvc_seq_info_t si;
    bool have = engine_seq_info(f.eng, f.cid, seq, &si) == 0;
    uint64_t len = have ? si.length : 0;
    int rc = 0;
    if (r < 4) {
      rc = fx_put(&f, seq, len, 1 + (x >> 24) % 9, 0);
    } else if (r < 6 && have) {
      rc = engine_remove(f.eng, f.cid, seq, (x >> 24) % (len + 1), UINT64_MAX);
    } else if (r == 6 && have) {
      rc = engine_trim_front(f.eng, f.cid, seq, si.start + (x >> 24) % (len - si.start + 1));
    } else if (have) {
      rc = engine_copy_prefix(f.eng, f.cid, seq, seq == 5 ? 1 : seq + 1, len);
    }
    ASSERT(rc == 0 || rc == KVC_E_FULL || rc == KVC_E_RANGE);
    for (uint32_t t = 1; t <= 2; t++) {
      uint64_t prev = UINT64_MAX;
      size_t n = 0;
      uint32_t id;
      uint64_t p;
      for (; engine_cache_ranked(f.eng, t, n, &id, &p) == 0; n++) {
        if (p > prev) TEST_FAIL_("step %d: tenant %u ranks %" PRIu64 " pages after %" PRIu64,
                                 step, t, p, prev);
        ASSERT_U64_EQ(cache_pages(&f, id), p);
        prev = p;
      }
      ASSERT_EQ(n, 3);
    }
    if (step % 100 == 0) FX_AUDIT(f.eng);
  }
  fx_close(&f);
}
