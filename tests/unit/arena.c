/* arena.c: a pool of segments owned by arenas (tenant, page size): each
 * cache's pages are its own size with no padding, any page up to a segment
 * is accepted, segments move between arenas in LRU order (evicting the
 * giver's least recent data and moving its live pages), a workload that
 * moves to another model ends with the pool serving it, and a random mix of
 * page sizes and tenants keeps every byte and every invariant of the audit
 * (src/pool.h, src/arena.c, doc/design.md "The pool"). */
#include "core.h"
#include "engine_fixture.h"
#include "engine_resize.h"

#define GRAIN 1024u
#define SEG (64u * 1024u)

/* An engine of nseg segments of SEG bytes over a grain of GRAIN, no cache. */
static void open_pool(fx_t *f, uint32_t nseg) {
  memset(f, 0, sizeof *f);
  f->page_bytes = GRAIN;
  f->base = fx_pool_alloc((uint64_t)SEG * 16);
  engine_config_t cfg = {.base = f->base, .pool_bytes = (uint64_t)SEG * nseg,
                         .page_bytes = GRAIN, .segment_bytes = SEG};
  ASSERT_OK(engine_new(&cfg, &f->eng));
  engine_set_now(f->eng, 1);
}

typedef struct cache_ref {
  uint32_t id;
  kvc_layout_t lay;
} cache_ref_t;

static cache_ref_t open_cache(fx_t *f, uint32_t tenant, const char *name, kvc_layout_t lay) {
  cache_ref_t c = {0, lay};
  ASSERT_OK(engine_cache_open_in(f->eng, tenant, name, &lay, &c.id));
  return c;
}

/* Makes c the fixture's cache (fx_put, FX_EXPECT act on it). */
static void use(fx_t *f, const cache_ref_t *c) {
  f->cid = c->id;
  f->lay = c->lay;
}

/* Layouts of 4 tokens a page: 4096 bytes (16 a segment, no tail), 1536
 * bytes (42 a segment, 1024 left), 40960 bytes (1 a segment). */
static kvc_layout_t lay_4k(void) { return fx_layout(8, 2, 8, 8, KVC_DTYPE_F32, 4); }
static kvc_layout_t lay_1536(void) { return fx_small_layout(); }
static kvc_layout_t lay_40k(void) { return fx_layout(80, 2, 8, 8, KVC_DTYPE_F32, 4); }

static bool seq_exists(fx_t *f, uint64_t seq) {
  kvc_seq_info_t si;
  return engine_seq_info(f->eng, f->cid, seq, &si) == 0;
}

TEST(arena_pages_are_each_caches_own_size) {
  fx_t f;
  open_pool(&f, 8);
  ASSERT_U64_EQ(engine_layout_page_bytes(&(kvc_layout_t){8, 2, 8, 8, KVC_DTYPE_F32, 4}), 4096);
  cache_ref_t a = open_cache(&f, 1, "a", lay_4k()), b = open_cache(&f, 2, "b", lay_1536());
  engine_stats_t s = fx_stats(&f);
  ASSERT_U64_EQ(s.arenas, 2);
  ASSERT_U64_EQ(s.segments, 8);
  ASSERT_U64_EQ(s.segments_free, 6); /* each new arena took one */
  use(&f, &a);
  ASSERT_OK(fx_put(&f, 1, 0, 4 * 20, 1)); /* 20 pages of 4 KiB: two segments */
  use(&f, &b);
  ASSERT_OK(fx_put(&f, 1, 0, 4 * 50, 2)); /* 50 pages of 1536: two segments */
  s = fx_stats(&f);
  ASSERT_U64_EQ(s.segments_free, 4);
  ASSERT_U64_EQ(s.pages_used, 70);
  /* Padding: only the 1536-byte arena's segment tails (1024 each). */
  ASSERT_U64_EQ(s.bytes_padding, 2 * 1024);
  ASSERT_U64_EQ(s.bytes_used, 20 * 4096 + 50 * 1536);
  use(&f, &a);
  FX_EXPECT(&f, 1, 0, 4 * 20, 1);
  use(&f, &b);
  FX_EXPECT(&f, 1, 0, 4 * 50, 2);
  /* Offsets: pages of a lie in a's segments at its stride. */
  uint64_t off;
  ASSERT_OK(engine_page_offset(f.eng, b.id, 1, 4, &off));
  ASSERT_U64_EQ(off % SEG, 1536);
  fx_close(&f);
}

TEST(arena_any_page_up_to_a_segment) {
  fx_t f;
  open_pool(&f, 4);
  cache_ref_t big = open_cache(&f, 0, "big", lay_40k());
  use(&f, &big);
  ASSERT_OK(fx_put(&f, 1, 0, 4 * 3, 7)); /* 3 pages: 3 segments */
  FX_EXPECT(&f, 1, 0, 12, 7);
  kvc_layout_t huge = fx_layout(160, 2, 8, 8, KVC_DTYPE_F32, 4); /* 80 KiB */
  uint32_t id;
  ASSERT_ERR(engine_cache_open_in(f.eng, 0, "huge", &huge, &id), KVC_E_PAGESIZE);
  ASSERT(strstr(engine_last_error(f.eng)->msg, "segment holds 64KiB") != NULL);
  fx_close(&f);
}

/* A tenant's arena fills the pool; another tenant's puts take segments
 * back from it, least recent data first, its live pages moved, every byte
 * of what stays intact. */
TEST(arena_segments_move_from_the_least_recent_arena) {
  fx_t f;
  open_pool(&f, 4);
  cache_ref_t a = open_cache(&f, 1, "a", lay_4k());
  use(&f, &a);
  for (uint64_t s = 1; s <= 16; s++) { /* 16 sequences of 4 pages: the whole pool */
    engine_set_now(f.eng, s);
    ASSERT_OK(fx_put(&f, s, 0, 16, (uint32_t)s));
  }
  ASSERT_U64_EQ(fx_stats(&f).segments_free, 0);
  /* Every other one goes: each segment of a keeps half its pages. */
  for (uint64_t s = 1; s <= 16; s += 2) ASSERT_OK(engine_remove(f.eng, a.id, s, 0, UINT64_MAX));
  cache_ref_t b = open_cache(&f, 2, "b", lay_1536());
  use(&f, &b);
  engine_set_now(f.eng, 100);
  ASSERT_OK(fx_put(&f, 1, 0, 4 * 40, 9)); /* 40 pages of 1536: one segment */
  engine_stats_t st = fx_stats(&f);
  ASSERT_U64_EQ(st.segment_moves, 1);
  ASSERT(st.segment_moved_pages > 0); /* a's half-full segment was emptied by moving */
  ASSERT_U64_EQ(st.evicted_sequences, 0); /* its free pages elsewhere held them */
  FX_AUDIT(f.eng);
  /* Now b needs more: a has no free page left, so its least recent
   * sequences are evicted (older than b's: reads touch them), the rest moved. */
  ASSERT_OK(fx_put(&f, 2, 0, 4 * 80, 10)); /* two more segments */
  FX_AUDIT(f.eng);
  st = fx_stats(&f);
  ASSERT_U64_EQ(st.segment_moves, 3);
  ASSERT_U64_EQ(st.evicted_sequences, 4); /* a's 4 oldest: 16 pages, a segment */
  FX_EXPECT(&f, 1, 0, 160, 9);
  FX_EXPECT(&f, 2, 0, 320, 10);
  use(&f, &a);
  uint64_t kept = 0, gone_before_kept = 0;
  for (uint64_t s = 2; s <= 16; s += 2) {
    if (seq_exists(&f, s)) {
      FX_EXPECT(&f, s, 0, 16, (uint32_t)s);
      kept++;
    } else {
      gone_before_kept += kept; /* an older one went while a newer stayed: 0 */
    }
  }
  ASSERT_U64_EQ(gone_before_kept, 0);
  ASSERT_U64_EQ(kept, 4); /* one segment of a is left: 16 pages */
  fx_close(&f);
}

/* A pinned or leased page is never lost: a segment holding a leased page is
 * not given up, and when nothing else can be, the put is FULL with nothing
 * changed. */
TEST(arena_leased_and_pinned_pages_stay) {
  fx_t f;
  open_pool(&f, 2);
  cache_ref_t a = open_cache(&f, 1, "a", lay_4k());
  use(&f, &a);
  ASSERT_OK(fx_put(&f, 1, 0, 64, 1)); /* segment 0 */
  ASSERT_OK(fx_put(&f, 2, 0, 64, 2)); /* segment 1 */
  engine_lease_t l;
  ASSERT_OK(engine_lease(f.eng, a.id, 1, 0, 4, 5, &l));
  unsigned char *leased = (unsigned char *)f.base + engine_page_pool_offset(f.eng, l.pages[0]);
  unsigned char snap[4096];
  memcpy(snap, leased, sizeof snap);
  ASSERT_OK(engine_pin(f.eng, a.id, 2, 6));
  cache_ref_t b = open_cache(&f, 2, "b", lay_4k());
  use(&f, &b);
  engine_stats_t before = fx_stats(&f);
  ASSERT_ERR(fx_put(&f, 1, 0, 4, 3), KVC_E_FULL);
  engine_stats_t after = fx_stats(&f);
  before.full_errors = after.full_errors; /* the refusal is counted */
  before.errors = after.errors;
  FX_STATS_SAME_BUT_HEAP(&before, &after);
  ASSERT_OK(engine_unpin(f.eng, a.id, 2, 6)); /* seq 2's segment can go now */
  ASSERT_OK(fx_put(&f, 1, 0, 4, 3));
  FX_EXPECT(&f, 1, 0, 4, 3);
  uint64_t off;
  ASSERT_OK(engine_page_offset(f.eng, b.id, 1, 0, &off));
  ASSERT_U64_EQ(off / SEG, 1); /* not the leased page's segment */
  ASSERT_MEM_EQ(leased, snap, sizeof snap); /* read in place: never moved or written */
  use(&f, &a);
  ASSERT(!seq_exists(&f, 2));
  ASSERT_OK(engine_lease_release(f.eng, 5, l.id));
  fx_close(&f);
}

/* A model that moves from one layout to another: the new one ends holding
 * at least 0.9 of the pool. */
TEST(arena_workload_switch_serves_the_new_model) {
  fx_t f;
  open_pool(&f, 16);
  cache_ref_t a = open_cache(&f, 0, "old", lay_4k()), b = open_cache(&f, 0, "new", lay_1536());
  use(&f, &a);
  uint64_t now = 1;
  for (uint64_t s = 1; s <= 80; s++) { /* more than the pool: it fills */
    engine_set_now(f.eng, now++);
    ASSERT_OK(fx_put(&f, s, 0, 16, 1));
  }
  use(&f, &b);
  for (uint64_t s = 1; s <= 300; s++) {
    engine_set_now(f.eng, now++);
    ASSERT_OK(fx_put(&f, s, 0, 16, 2));
  }
  FX_AUDIT(f.eng);
  engine_tenant_usage_t u;
  ASSERT_OK(engine_tenant_usage(f.eng, 0, NULL, &u));
  engine_stats_t st = fx_stats(&f);
  uint64_t new_bytes = 0;
  kvc_cache_info_t ci;
  ASSERT_OK(engine_cache_info(f.eng, b.id, &ci));
  new_bytes = ci.pages * 1536;
  ASSERT(new_bytes * 10 >= st.pool_bytes * 9);
  fx_close(&f);
}

/* Random puts, removes, pins, leases, drops and reopens over three page
 * sizes and two tenants in a small pool: every live sequence reads back its
 * bytes, a pinned one is never evicted, and the audit holds after each op
 * (4000 ops; 100,000 with KVC_LONG=1). */
TEST_TIMEOUT(arena_random_mix_keeps_every_byte, 600) {
  fx_t f;
  open_pool(&f, 6);
  enum { NC = 3, NS = 12 };
  const char *names[NC] = {"x", "y", "z"};
  kvc_layout_t lays[NC] = {lay_4k(), lay_1536(), lay_40k()};
  uint32_t tenant[NC] = {1, 2, 1};
  cache_ref_t c[NC];
  for (int i = 0; i < NC; i++) c[i] = open_cache(&f, tenant[i], names[i], lays[i]);
  uint32_t salt[NC][NS] = {{0}};
  uint64_t len[NC][NS] = {{0}};
  bool pinned[NC][NS] = {{false}};
  uint64_t leased[NC] = {0};
  uint64_t x = getenv("KVC_SEED") ? strtoull(getenv("KVC_SEED"), NULL, 10) : 12345;
  uint64_t puts = 0, full = 0, moves = 0;
  int nops = test_long() ? 100000 : 4000; /* make check runs it long */
  for (int op = 0; op < nops; op++) {
    x = fx_mix(x + (uint64_t)op);
    int ci = (int)(x % NC), s = (int)((x >> 8) % NS);
    uint32_t kind = (uint32_t)((x >> 16) % 100);
    use(&f, &c[ci]);
    engine_set_now(f.eng, (uint64_t)op + 2);
    if (kind < 60) {
      uint64_t n = 4 + (x >> 24) % (ci == 2 ? 8 : 60);
      int rc = fx_put(&f, (uint64_t)s + 1, 0, n, (uint32_t)op + 1);
      if (rc == 0) {
        salt[ci][s] = (uint32_t)op + 1;
        len[ci][s] = n > len[ci][s] ? n : len[ci][s];
        if (n < len[ci][s]) len[ci][s] = n; /* keep it simple: the put's length */
        puts++;
      } else {
        if (rc != KVC_E_FULL && rc != KVC_E_PINLIMIT)
          TEST_FAIL_("op %d put: %s (%s)", op, kvc_err_name(rc), engine_last_error(f.eng)->msg);
        full++;
      }
    } else if (kind < 70) {
      if (len[ci][s] && engine_remove(f.eng, c[ci].id, (uint64_t)s + 1, 0, UINT64_MAX) == 0) {
        len[ci][s] = 0;
        pinned[ci][s] = false;
      }
    } else if (kind < 80) {
      if (len[ci][s] && !pinned[ci][s] && seq_exists(&f, (uint64_t)s + 1) &&
          engine_pin(f.eng, c[ci].id, (uint64_t)s + 1, 99) == 0)
        pinned[ci][s] = true;
    } else if (kind < 90) {
      if (pinned[ci][s]) {
        ASSERT_OK(engine_unpin(f.eng, c[ci].id, (uint64_t)s + 1, 99));
        pinned[ci][s] = false;
      }
    } else if (kind < 96) {
      engine_lease_t l;
      if (leased[ci]) {
        ASSERT_OK(engine_lease_release(f.eng, 7, leased[ci]));
        leased[ci] = 0;
      } else if (len[ci][s] && seq_exists(&f, (uint64_t)s + 1) &&
                 engine_lease(f.eng, c[ci].id, (uint64_t)s + 1, 0, 1, 7, &l) == 0) {
        leased[ci] = l.id;
      }
    } else if (kind < 98 && !leased[ci]) { /* drop and reopen: every sequence goes */
      ASSERT_OK(engine_cache_drop(f.eng, c[ci].id));
      c[ci] = open_cache(&f, tenant[ci], names[ci], lays[ci]);
      for (int k = 0; k < NS; k++) len[ci][k] = 0, pinned[ci][k] = false;
    }
    FX_AUDIT(f.eng);
    /* Every sequence still there holds its bytes; pinned ones are there. */
    if (op % 16 == 0 || kind >= 96) {
      for (int k = 0; k < NC; k++) {
        use(&f, &c[k]);
        for (int q = 0; q < NS; q++) {
          if (!len[k][q]) continue;
          if (!seq_exists(&f, (uint64_t)q + 1)) {
            ASSERT(!pinned[k][q]);
            len[k][q] = 0;
            continue;
          }
          FX_EXPECT(&f, (uint64_t)q + 1, 0, len[k][q], salt[k][q]);
        }
      }
    }
  }
  moves = fx_stats(&f).segment_moves;
  fprintf(stderr, "arena mix: %llu puts, %llu FULL, %llu segment moves\n",
          (unsigned long long)puts, (unsigned long long)full, (unsigned long long)moves);
  ASSERT(moves > 0);
  for (int k = 0; k < NC; k++)
    if (leased[k]) ASSERT_OK(engine_lease_release(f.eng, 7, leased[k]));
  fx_close(&f);
}

/* A shrink moves each arena's pages below the new end, within its arena. */
TEST(arena_shrink_keeps_each_arenas_pages) {
  fx_t f;
  open_pool(&f, 8);
  cache_ref_t a = open_cache(&f, 1, "a", lay_4k()), b = open_cache(&f, 2, "b", lay_1536());
  use(&f, &a);
  ASSERT_OK(fx_put(&f, 1, 0, 40, 1)); /* 10 pages: 1 segment + 10 of another... */
  use(&f, &b);
  ASSERT_OK(fx_put(&f, 1, 0, 4 * 60, 2)); /* 60 pages: two segments */
  use(&f, &a);
  ASSERT_OK(fx_put(&f, 2, 0, 40, 3));
  ASSERT_OK(engine_pool_shrink(f.eng, 5ull * SEG, NULL));
  FX_AUDIT(f.eng);
  ASSERT_U64_EQ(fx_stats(&f).segments, 5);
  FX_EXPECT(&f, 1, 0, 40, 1);
  FX_EXPECT(&f, 2, 0, 40, 3);
  use(&f, &b);
  FX_EXPECT(&f, 1, 0, 240, 2);
  ASSERT_OK(engine_pool_grow(f.eng, 8ull * SEG));
  FX_AUDIT(f.eng);
  fx_close(&f);
}

