/* events.c: the engine's log of prefix-index changes: what is recorded for a
 * put with token ids, an attach, a reclaim under pressure, a cache clear and
 * a drop, in which order, and what a full log keeps and drops. */
#include "engine_fixture.h"

#define T 4u /* tokens a page of the small layout */

static const engine_pkey_t KEY = {"salt", 4, NULL, 0};

static uint32_t tok(uint32_t p, uint64_t i) { return p * 1000u + (uint32_t)i; }

/* Puts [pos, pos + n) of seq with the ids of prompt p. */
static int put_range(fx_t *f, uint64_t seq, uint64_t pos, uint64_t n, uint32_t p) {
  fx_rng_t r = fx_all(&f->lay);
  fx_buf_t b = fx_buf_new(&f->lay, r, n);
  uint32_t *ids = calloc(n + 1, sizeof *ids);
  for (uint64_t i = 0; i < n; i++) ids[i] = tok(p, pos + i);
  fx_fill(&f->lay, r, seq, pos, n, 0, b.k, b.v);
  engine_io_t io = fx_io(seq, pos, n, &b);
  io.tokens = ids;
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  x.pkey = &KEY;
  int rc = engine_put(f->eng, f->cid, &x, &io, 1);
  fx_buf_free(&b);
  free(ids);
  return rc;
}

static int put_prompt(fx_t *f, uint64_t seq, uint64_t n, uint32_t p) {
  return put_range(f, seq, 0, n, p);
}

/* Every record of the log, in order, into out (at most cap). */
static size_t drain(fx_t *f, engine_event_t *out, size_t cap) {
  size_t cur = 0, n = 0;
  engine_event_t ev;
  while (engine_events_next(f->eng, &cur, &ev)) {
    ASSERT(n < cap);
    out[n++] = ev;
  }
  return n;
}

static uint64_t engine_stats_metadata(fx_t *f) {
  engine_stats_t st;
  engine_stats(f->eng, &st);
  return st.metadata_bytes;
}

static void open_small(fx_t *f, uint64_t npages) {
  kvc_layout_t lay = fx_small_layout();
  fx_open(f, &lay, npages);
}

TEST(events_off_by_default_and_bad_sizes_refused) {
  fx_t f;
  open_small(&f, 16);
  ASSERT(!engine_events_on(f.eng));
  ASSERT_OK(put_prompt(&f, 1, 8, 1));
  size_t cur = 0;
  engine_event_t ev;
  ASSERT(!engine_events_next(f.eng, &cur, &ev));
  ASSERT_U64_EQ(engine_events_reset(f.eng), 0);
  ASSERT_ERR(engine_events_enable(NULL, 65536), KVC_E_INVAL);
  ASSERT_ERR(engine_events_enable(f.eng, 100), KVC_E_INVAL);
  ASSERT(!engine_events_on(f.eng));
  for (int64_t k = 0; k < 2; k++) { /* out of memory: still off, nothing kept */
    uint64_t live = engine_stats_metadata(&f);
    engine_fail_alloc_after(f.eng, k);
    ASSERT_ERR(engine_events_enable(f.eng, 65536), KVC_E_NOMEM);
    engine_fail_alloc_after(f.eng, -1);
    ASSERT(!engine_events_on(f.eng));
    ASSERT_U64_EQ(engine_stats_metadata(&f), live);
  }
  ASSERT_OK(engine_events_enable(f.eng, 65536));
  ASSERT(engine_events_on(f.eng));
  ASSERT_OK(engine_events_enable(f.eng, 0));
  ASSERT(!engine_events_on(f.eng));
  fx_close(&f);
}

TEST(events_put_records_each_indexed_page_with_its_parent_and_ids) {
  fx_t f;
  open_small(&f, 16);
  ASSERT_OK(engine_events_enable(f.eng, 65536));
  ASSERT_OK(put_prompt(&f, 1, 3 * T + 2, 7)); /* 3 whole pages, 2 tokens over */
  engine_event_t ev[8];
  size_t n = drain(&f, ev, 8);
  ASSERT_EQ(n, 3);
  for (size_t i = 0; i < n; i++) {
    ASSERT_EQ(ev[i].kind, ENGINE_EV_STORED);
    ASSERT_EQ(ev[i].cache_id, f.cid);
    ASSERT_EQ(ev[i].page_tokens, T);
    ASSERT_EQ(ev[i].ntokens, T);
    ASSERT_EQ(ev[i].medium, ENGINE_MEDIUM_POOL);
    for (uint32_t t = 0; t < T; t++) ASSERT_EQ(ev[i].tokens[t], tok(7, i * T + t));
    ASSERT_EQ(ev[i].has_parent, i > 0);
    if (i > 0) ASSERT_MEM_EQ(ev[i].parent, ev[i - 1].hash, 32);
  }
  ASSERT(memcmp(ev[0].hash, ev[1].hash, 32) != 0);
  ASSERT_U64_EQ(engine_events_reset(f.eng), 0);
  size_t cur = 0;
  engine_event_t e;
  ASSERT(!engine_events_next(f.eng, &cur, &e)); /* emptied */
  /* Completing the fourth page records it alone; an attach records nothing. */
  ASSERT_OK(put_range(&f, 1, 3 * T + 2, 2, 7));
  n = drain(&f, ev, 8);
  ASSERT_EQ(n, 1);
  ASSERT_MEM_EQ(ev[0].tokens, ((uint32_t[]){tok(7, 12), tok(7, 13), tok(7, 14), tok(7, 15)}),
                sizeof(uint32_t) * T);
  engine_events_reset(f.eng);
  uint32_t ids[4 * T];
  for (uint32_t i = 0; i < 4 * T; i++) ids[i] = tok(7, i);
  engine_match_t m;
  ASSERT_OK(engine_attach(f.eng, f.cid, 2, ids, 4 * T, &KEY, 0, &m));
  ASSERT_U64_EQ(m.pages, 4);
  ASSERT_EQ(drain(&f, ev, 8), 0);
  FX_AUDIT(f.eng);
  fx_close(&f);
}

TEST(events_reclaim_clear_and_drop_record_removals_then_the_cache) {
  fx_t f;
  open_small(&f, 6);
  ASSERT_OK(engine_events_enable(f.eng, 65536));
  ASSERT_OK(put_prompt(&f, 1, 2 * T, 1));
  ASSERT_OK(engine_remove(f.eng, f.cid, 1, 0, UINT64_MAX)); /* its 2 pages stay cached */
  engine_event_t st[8];
  ASSERT_EQ(drain(&f, st, 8), 2);
  engine_events_reset(f.eng);
  /* A put needing the whole pool reclaims both cached pages: leaf first. */
  ASSERT_OK(put_prompt(&f, 2, 6 * T, 2));
  engine_event_t ev[16];
  size_t n = drain(&f, ev, 16);
  ASSERT(n >= 2);
  ASSERT_EQ(ev[0].kind, ENGINE_EV_REMOVED);
  ASSERT_MEM_EQ(ev[0].hash, st[1].hash, 32);
  ASSERT_EQ(ev[1].kind, ENGINE_EV_REMOVED);
  ASSERT_MEM_EQ(ev[1].hash, st[0].hash, 32);
  for (size_t i = 2; i < n; i++) ASSERT_EQ(ev[i].kind, ENGINE_EV_STORED);
  ASSERT_EQ(n, 2 + 6);
  engine_events_reset(f.eng);
  /* A clear removes every indexed page, then names the cache. */
  ASSERT_OK(engine_cache_clear(f.eng, f.cid));
  n = drain(&f, ev, 16);
  ASSERT_EQ(n, 7);
  for (size_t i = 0; i < 6; i++) ASSERT_EQ(ev[i].kind, ENGINE_EV_REMOVED);
  ASSERT_EQ(ev[6].kind, ENGINE_EV_CLEARED);
  ASSERT_STR_EQ(ev[6].cache_name, "main");
  engine_events_reset(f.eng);
  ASSERT_OK(put_prompt(&f, 3, T, 3));
  ASSERT_OK(engine_cache_drop(f.eng, f.cid));
  n = drain(&f, ev, 16);
  ASSERT_EQ(n, 3);
  ASSERT_EQ(ev[0].kind, ENGINE_EV_STORED);
  ASSERT_EQ(ev[1].kind, ENGINE_EV_REMOVED);
  ASSERT_MEM_EQ(ev[1].hash, ev[0].hash, 32);
  ASSERT_EQ(ev[2].kind, ENGINE_EV_DROPPED);
  ASSERT_STR_EQ(ev[2].cache_name, "main");
  fx_close(&f);
}

/* A full log keeps a prefix of the changes and counts the rest; a reset
 * makes room again. */
TEST(events_full_log_keeps_a_prefix_and_counts_drops) {
  fx_t f;
  open_small(&f, 64);
  ASSERT_OK(engine_events_enable(f.eng, 4096));
  /* A stored page of 4 ids takes 104 bytes: 39 fit in 4096. */
  ASSERT_OK(put_prompt(&f, 1, 50 * T, 1));
  engine_event_t ev[64];
  size_t n = drain(&f, ev, 64);
  ASSERT_EQ(n, 39);
  for (size_t i = 1; i < n; i++) ASSERT_MEM_EQ(ev[i].parent, ev[i - 1].hash, 32);
  ASSERT_U64_EQ(engine_events_reset(f.eng), 11);
  ASSERT_OK(put_prompt(&f, 2, T, 2));
  ASSERT_EQ(drain(&f, ev, 64), 1);
  ASSERT_U64_EQ(engine_events_reset(f.eng), 0);
  FX_AUDIT(f.eng);
  fx_close(&f);
}

/* The log replayed (stored adds a hash, removed takes it away, a clear or
 * drop empties the cache) is the index: after every random operation the
 * set holds exactly pages_indexed hashes, every stored page's parent is in
 * it, and no hash is stored twice or removed when absent. */
#define SET_CAP 4096u
typedef struct hset {
  uint8_t h[SET_CAP][32];
  size_t n;
} hset_t;

static long set_find(const hset_t *s, const uint8_t h[32]) {
  for (size_t i = 0; i < s->n; i++)
    if (memcmp(s->h[i], h, 32) == 0) return (long)i;
  return -1;
}

TEST(events_replayed_log_is_the_index) {
  fx_t f;
  open_small(&f, 24);
  ASSERT_OK(engine_events_enable(f.eng, 1 << 20));
  static hset_t set;
  set.n = 0;
  uint64_t rng = 12345, stored = 0, removed = 0, clears = 0;
  for (int op = 0; op < 3000; op++) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t r = (uint32_t)(rng >> 33);
    uint64_t seq = 1 + r % 6;
    uint32_t prompt = 1 + (r >> 8) % 3;
    if (r % 10 < 6) {
      uint64_t n = 1 + (r >> 12) % (5 * T);
      (void)put_prompt(&f, seq, n, prompt); /* FULL now and then: nothing changes */
    } else if (r % 10 < 9) {
      (void)engine_remove(f.eng, f.cid, seq, 0, UINT64_MAX);
    } else if (r % 50 == 9) {
      ASSERT_OK(engine_cache_clear(f.eng, f.cid));
    }
    size_t cur = 0;
    engine_event_t ev;
    while (engine_events_next(f.eng, &cur, &ev)) {
      long at = set_find(&set, ev.hash);
      switch (ev.kind) {
      case ENGINE_EV_STORED:
        ASSERT(at < 0);
        ASSERT(!ev.has_parent || set_find(&set, ev.parent) >= 0);
        ASSERT(set.n < SET_CAP);
        memcpy(set.h[set.n++], ev.hash, 32);
        stored++;
        break;
      case ENGINE_EV_REMOVED:
        ASSERT(at >= 0);
        memcpy(set.h[at], set.h[--set.n], 32);
        removed++;
        break;
      case ENGINE_EV_CLEARED:
        ASSERT_EQ(set.n, 0);
        clears++;
        break;
      default:
        TEST_FAIL_("unexpected event kind %d", (int)ev.kind);
      }
    }
    ASSERT_U64_EQ(engine_events_reset(f.eng), 0);
    engine_stats_t st;
    engine_stats(f.eng, &st);
    ASSERT_U64_EQ(set.n, st.pages_indexed);
  }
  engine_stats_t st;
  engine_stats(f.eng, &st);
  /* It went through every path: stores, reclaims under pressure, clears. */
  ASSERT(stored > 200 && removed > 200 && clears > 0 && st.cached_reclaimed > 50);
  FX_AUDIT(f.eng);
  fx_close(&f);
}

TEST(events_tier_records_come_in_order_with_their_cache_name) {
  fx_t f;
  open_small(&f, 16);
  engine_events_tier(f.eng, ENGINE_EV_STORED, ENGINE_MEDIUM_DISK, 3, "c", T, (uint8_t[32]){1},
                     NULL, (uint32_t[T]){1, 2, 3, 4}); /* off: nothing */
  ASSERT_OK(engine_events_enable(f.eng, 1 << 16));
  ASSERT_OK(put_prompt(&f, 1, T, 1));
  uint8_t h[32] = {7}, parent[32] = {6};
  uint32_t ids[T] = {9, 8, 7, 6};
  engine_events_tier(f.eng, ENGINE_EV_STORED, ENGINE_MEDIUM_DISK, 3, "kept-cache", T, h, parent,
                     ids);
  engine_events_tier(f.eng, ENGINE_EV_REMOVED, ENGINE_MEDIUM_REMOTE, 3, "kept-cache", 0, h, NULL,
                     NULL);
  engine_events_tier(f.eng, ENGINE_EV_CLEARED, ENGINE_MEDIUM_DISK, 3, "x", 0, h, NULL, NULL);
  engine_event_t ev[8];
  size_t n = drain(&f, ev, 8);
  ASSERT_EQ(n, 3); /* the put's page, then the two tier records (a CLEARED is refused) */
  ASSERT_EQ(ev[0].medium, ENGINE_MEDIUM_POOL);
  ASSERT(ev[0].cache_name == NULL);
  ASSERT_EQ(ev[1].kind, ENGINE_EV_STORED);
  ASSERT_EQ(ev[1].medium, ENGINE_MEDIUM_DISK);
  ASSERT_EQ(ev[1].cache_id, UINT32_MAX);
  ASSERT_EQ(ev[1].tenant, 3);
  ASSERT_STR_EQ(ev[1].cache_name, "kept-cache");
  ASSERT(ev[1].has_parent && memcmp(ev[1].parent, parent, 32) == 0);
  ASSERT(memcmp(ev[1].hash, h, 32) == 0);
  ASSERT_EQ(ev[1].ntokens, T);
  ASSERT_MEM_EQ(ev[1].tokens, ids, sizeof ids);
  ASSERT_EQ(ev[2].kind, ENGINE_EV_REMOVED);
  ASSERT_EQ(ev[2].medium, ENGINE_MEDIUM_REMOTE);
  ASSERT_STR_EQ(ev[2].cache_name, "kept-cache");
  fx_close(&f);
}
