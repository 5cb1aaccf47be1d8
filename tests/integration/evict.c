/* evict.c: eviction across clients: pins hold, LRU order, FULL with figures,
 * and the pins of a client killed with SIGKILL released. */
#include "harness.h"

/* A 1 MiB pool of 16 KiB pages: 64 pages; one 16-token sequence = 1 page.
 * These tests pin most of the pool on purpose: no pin limit. */
/* One tenant may pin the whole pool here: no fair share of the pin limit. */
static const char *const small_pool[] = {"--pool-bytes", "1MiB", "--page-bytes", "16KiB",
                                         "--pin-limit-pct", "100", "--tenant-max-pinned-pct",
                                         "100", NULL};

#define TOK 16u

static void put_seq(kvc_cache_t *h, uint64_t seq, uint64_t ntokens) {
  const kvc_layout_t *l = kvc_cache_layout(h);
  float *k = calloc(it_tok_floats(l, false) * ntokens, 4);
  float *v = calloc(it_tok_floats(l, true) * ntokens, 4);
  it_fill_f32(k, v, l, seq, 0, ntokens, 0);
  ASSERT_OK(kvc_put(h, seq, 0, ntokens, k, v));
  free(k);
  free(v);
}

static void check_seq(kvc_cache_t *h, uint64_t seq, uint64_t ntokens) {
  const kvc_layout_t *l = kvc_cache_layout(h);
  size_t kn = it_tok_floats(l, false) * ntokens, vn = it_tok_floats(l, true) * ntokens;
  float *k = calloc(kn, 4), *v = calloc(vn, 4), *gk = calloc(kn, 4), *gv = calloc(vn, 4);
  it_fill_f32(k, v, l, seq, 0, ntokens, 0);
  ASSERT_OK(kvc_get(h, seq, 0, ntokens, gk, gv));
  ASSERT_MEM_EQ(gk, k, kn * 4);
  ASSERT_MEM_EQ(gv, v, vn * 4);
  free(k), free(v), free(gk), free(gv);
}

static bool seq_exists(kvc_cache_t *h, uint64_t seq) {
  kvc_seq_info_t si;
  int rc = kvc_seq_info(h, seq, &si);
  if (rc == KVC_E_NOSEQ) return false;
  ASSERT_OK(rc);
  return true;
}

TEST(evict_pins_survive_lru_order_and_full) {
  daemon_t d;
  daemon_start_args(&d, small_pool);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_client_t *a = client_open(&d), *b = client_open(&d);
  kvc_cache_t *ha, *hb;
  ASSERT_OK(kvc_cache_open(a, "ev", &l, &ha));
  ASSERT_OK(kvc_cache_open(b, "ev", &l, &hb));
  ASSERT_U64_EQ(stat_get(a, "pool_pages", NULL), 64);

  /* A: 20 pinned sequences. B: 44 more fill the pool. */
  for (uint64_t s = 1; s <= 20; s++) {
    put_seq(ha, s, TOK);
    ASSERT_OK(kvc_seq_pin(ha, s));
  }
  for (uint64_t s = 100; s < 144; s++) put_seq(hb, s, TOK);
  ASSERT_U64_EQ(stat_get(b, "pages_free", NULL), 0);
  ASSERT_U64_EQ(stat_get(b, "pages_pinned", NULL), 20);
  ASSERT_U64_EQ(stat_get(b, "sequences_pinned", NULL), 20);

  /* Touch 100 so that 101, 102, 103 are now the least recently used. */
  check_seq(hb, 100, TOK);
  for (uint64_t s = 200; s < 203; s++) put_seq(hb, s, TOK);
  ASSERT(seq_exists(hb, 100));
  for (uint64_t s = 101; s <= 103; s++) ASSERT(!seq_exists(hb, s));
  for (uint64_t s = 104; s < 144; s++) ASSERT(seq_exists(hb, s));
  ASSERT_U64_EQ(stat_get(b, "evicted_sequences_total", NULL), 3);
  ASSERT_U64_EQ(stat_get(b, "evicted_pages_total", NULL), 3);
  ASSERT_U64_EQ(stat_get(b, "evicted_sequences_total", "ev"), 3);

  /* Pressure from B never touched A's pinned sequences. */
  for (uint64_t s = 1; s <= 20; s++) check_seq(ha, s, TOK);

  /* B pins everything it has: nothing is evictable, a put is FULL. */
  uint64_t cursor = 0;
  kvc_seq_info_t infos[128];
  size_t n = 0;
  ASSERT_OK(kvc_seq_list(hb, &cursor, infos, 128, &n));
  ASSERT_U64_EQ(cursor, 0);
  ASSERT_EQ(n, 64);
  for (size_t i = 0; i < n; i++)
    if (infos[i].seq_id > 20) ASSERT_OK(kvc_seq_pin(hb, infos[i].seq_id));
  ASSERT_U64_EQ(stat_get(b, "pages_pinned", NULL), 64);
  const kvc_layout_t *lay = kvc_cache_layout(hb);
  float *k = calloc(it_tok_floats(lay, false) * 2 * TOK, 4);
  float *v = calloc(it_tok_floats(lay, true) * 2 * TOK, 4);
  ASSERT_ERR(kvc_put(hb, 999, 0, 2 * TOK, k, v), KVC_E_FULL);
  uint64_t needed = 0, freeable = 99;
  kvc_client_last_full(b, &needed, &freeable);
  ASSERT_U64_EQ(needed, 2);
  ASSERT_U64_EQ(freeable, 0);
  ASSERT(strlen(kvc_client_last_error(b)) > 0);
  ASSERT(!seq_exists(hb, 999)); /* all or nothing */
  ASSERT_U64_EQ(stat_get(b, "full_errors_total", NULL), 1);
  ASSERT_U64_EQ(stat_get(b, "request_errors_total{op=put}", NULL), 1);

  /* A unpins one of its own: now exactly one page can be reclaimed. */
  ASSERT_OK(kvc_seq_unpin(ha, 5));
  ASSERT_ERR(kvc_put(hb, 999, 0, 2 * TOK, k, v), KVC_E_FULL);
  kvc_client_last_full(b, &needed, &freeable);
  ASSERT_U64_EQ(needed, 2);
  ASSERT_U64_EQ(freeable, 1);
  ASSERT_OK(kvc_put(hb, 999, 0, TOK, k, v));
  ASSERT(!seq_exists(ha, 5));
  ASSERT_OK(kvc_seq_unpin(ha, 6));
  ASSERT_ERR(kvc_seq_unpin(ha, 6), KVC_E_NOTPINNED);
  free(k);
  free(v);
  ASSERT_U64_EQ(stat_get(a, "full_errors_total", NULL), 2);
  ASSERT_U64_EQ(stat_get(a, "evicted_sequences_total", NULL), 4);
  kvc_client_close(a);
  kvc_client_close(b);
  daemon_stop(&d);
}

TEST(evict_sigkilled_client_releases_pins) {
  daemon_t d;
  daemon_start_args(&d, small_pool);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  int ready[2];
  ASSERT(pipe(ready) == 0);
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    kvc_client_t *c = client_open(&d);
    kvc_cache_t *h;
    ASSERT_OK(kvc_cache_open(c, "crash", &l, &h));
    for (uint64_t s = 1; s <= 10; s++) {
      put_seq(h, s, TOK);
      ASSERT_OK(kvc_seq_pin(h, s));
    }
    ASSERT_EQ(write(ready[1], "x", 1), 1);
    for (;;) pause();
  }
  char ch;
  ASSERT_EQ(read(ready[0], &ch, 1), 1);
  kvc_client_t *a = client_open(&d);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_find(a, "crash", &h));
  kvc_seq_info_t si;
  ASSERT_OK(kvc_seq_info(h, 3, &si));
  ASSERT_EQ(si.pins, 1);
  ASSERT_U64_EQ(stat_get(a, "sequences_pinned", NULL), 10);

  ASSERT_EQ(kill(pid, SIGKILL), 0);
  int st;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  /* The daemon sees the EOF on its next loop turn. */
  uint64_t pinned = 1;
  for (int i = 0; i < 1000 && pinned; i++) {
    pinned = stat_get(a, "sequences_pinned", NULL);
    if (pinned) it_sleep_ms(10);
  }
  ASSERT_U64_EQ(pinned, 0);
  ASSERT_U64_EQ(stat_get(a, "unpins_total", NULL), 10);
  ASSERT_U64_EQ(stat_get(a, "connections_current", NULL), 1);
  ASSERT_OK(kvc_seq_info(h, 3, &si));
  ASSERT_EQ(si.pins, 0);
  ASSERT_U64_EQ(si.length, TOK); /* the data stays, only the pins went */

  /* Its pages are reclaimable: 64 new one-page sequences in one batch need
   * the 54 free pages plus the 10 of the dead client's sequences. */
  size_t kn = it_tok_floats(&l, false) * TOK, vn = it_tok_floats(&l, true) * TOK;
  float *k = calloc(kn * 64, 4), *v = calloc(vn * 64, 4);
  kvc_io_t io[64];
  for (int i = 0; i < 64; i++)
    io[i] = (kvc_io_t){.seq_id = 1000u + (unsigned)i, .pos = 0, .ntokens = TOK,
                       .k = k + kn * (size_t)i, .v = v + vn * (size_t)i};
  ASSERT_OK(kvc_put_batch(h, NULL, io, 64));
  ASSERT_U64_EQ(stat_get(a, "evicted_sequences_total", NULL), 10);
  ASSERT_U64_EQ(stat_get(a, "pages_free", NULL), 0);
  ASSERT_U64_EQ(stat_get(a, "sequences", "crash"), 64);
  ASSERT_ERR(kvc_seq_info(h, 3, &si), KVC_E_NOSEQ);
  ASSERT_OK(kvc_ping(a));
  free(k);
  free(v);
  kvc_client_close(a);
  daemon_stop(&d);
}
