/* prefix.c: the prefix cache across worker processes on a real daemon:
 * sharing a prompt by match and attach, salts and extra keys, verification
 * on a changed token, cached pages outliving their sequences, the order of
 * reclaim under pressure, priorities, hard, TTL and limited pins, exact hit
 * metrics, split token-aware puts, bad requests and kvcachectl prefix. */
#include <sys/time.h>

#include "harness.h"
#include "json.h"
#include "raw.h"

#define T 16u /* page_tokens of it_layout */

/* A 1 MiB pool of 16 KiB pages: 64 pages, one page per 16 tokens. */
#define SMALL_POOL "--pool-bytes", "1MiB", "--page-bytes", "16KiB"

/* Deterministic token ids of a prompt (below a Llama-3 vocabulary). */
static void gen_tokens(uint32_t *t, size_t n, uint32_t seed) {
  uint64_t x = 0x9e3779b97f4a7c15ull * (seed + 1);
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    t[i] = (uint32_t)(x % 128256u);
  }
}

static uint32_t *tokens_new(size_t n, uint32_t seed) {
  uint32_t *t = malloc((n ? n : 1) * sizeof *t);
  ASSERT(t != NULL);
  gen_tokens(t, n, seed);
  return t;
}

/* Writes tokens [pos, pos + n) of seq with the bytes of `bytes_of` (see
 * it_fill_f32) and, unless tokens is NULL, their ids. */
static void put_bytes(kvc_cache_t *h, uint64_t seq, uint64_t pos, uint64_t n,
                      const uint32_t *tokens, uint64_t bytes_of) {
  const kvc_layout_t *l = kvc_cache_layout(h);
  float *k = calloc(it_tok_floats(l, false) * n, 4), *v = calloc(it_tok_floats(l, true) * n, 4);
  ASSERT(k && v);
  it_fill_f32(k, v, l, bytes_of, pos, n, 0);
  if (tokens) ASSERT_OK(kvc_put_tokens(h, seq, pos, n, k, v, tokens));
  else ASSERT_OK(kvc_put(h, seq, pos, n, k, v));
  free(k);
  free(v);
}

/* Tokens [pos, pos + n) of seq read back hold exactly the bytes of
 * `bytes_of` at those positions. */
static void check_bytes(kvc_cache_t *h, uint64_t seq, uint64_t pos, uint64_t n,
                        uint64_t bytes_of) {
  const kvc_layout_t *l = kvc_cache_layout(h);
  size_t kn = it_tok_floats(l, false) * n, vn = it_tok_floats(l, true) * n;
  float *k = calloc(kn, 4), *v = calloc(vn, 4), *gk = calloc(kn, 4), *gv = calloc(vn, 4);
  ASSERT(k && v && gk && gv);
  it_fill_f32(k, v, l, bytes_of, pos, n, 0);
  ASSERT_OK(kvc_get(h, seq, pos, pos + n, gk, gv));
  ASSERT_MEM_EQ(gk, k, kn * 4);
  ASSERT_MEM_EQ(gv, v, vn * 4);
  free(k), free(v), free(gk), free(gv);
}

static kvc_match_t match(kvc_cache_t *h, const uint32_t *tokens, uint64_t n) {
  kvc_match_t m = {99, 99, 99};
  ASSERT_OK(kvc_match(h, tokens, n, &m));
  return m;
}

#define ASSERT_MATCH(m, tok, pg, inel)                                         \
  do {                                                                         \
    kvc_match_t m_ = (m);                                                      \
    ASSERT_U64_EQ(m_.tokens, tok);                                             \
    ASSERT_U64_EQ(m_.pages, pg);                                               \
    ASSERT_U64_EQ(m_.ineligible, inel);                                        \
  } while (0)

static bool seq_exists(kvc_cache_t *h, uint64_t seq) {
  kvc_seq_info_t si;
  int rc = kvc_seq_info(h, seq, &si);
  if (rc == KVC_E_NOSEQ) return false;
  ASSERT_OK(rc);
  return true;
}

static uint32_t seq_pins(kvc_cache_t *h, uint64_t seq) {
  kvc_seq_info_t si;
  ASSERT_OK(kvc_seq_info(h, seq, &si));
  return si.pins;
}

static kvc_cache_t *open_salted(kvc_client_t *c, const char *name, const char *salt) {
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open_salted(c, name, &l, salt, strlen(salt), &h));
  return h;
}

/* ---- two workers ----------------------------------------------------------- */

#define SHARED 2000u /* the shared prompt: 125 pages */
#define OWN 100u     /* each worker's continuation */

typedef struct workers {
  const daemon_t *d;
  uint32_t *prompt_a; /* shared prompt + A's continuation */
  uint32_t *prompt_b; /* shared prompt + B's continuation */
  int a_ready[2], b_done[2];
} workers_t;

static void wait_byte(int fd, const char *what) {
  char ch;
  if (read(fd, &ch, 1) != 1) TEST_FAIL_("the other worker is gone before %s", what);
}

/* A: prefills the shared prompt and its own continuation with token ids. */
static void worker_a(workers_t *w) {
  close(w->a_ready[0]);
  close(w->b_done[1]);
  kvc_client_t *c = client_open(w->d);
  kvc_cache_t *h = open_salted(c, "chat", "tenant-a");
  put_bytes(h, 1, 0, SHARED + OWN, w->prompt_a, 1);
  check_bytes(h, 1, 0, SHARED + OWN, 1);
  ASSERT_EQ(write(w->a_ready[1], "r", 1), 1);
  wait_byte(w->b_done[0], "B finished");
  check_bytes(h, 1, 0, SHARED + OWN, 1); /* B's writes never reach A's view */
  kvc_client_close(c);
}

/* B: finds the shared prompt, attaches it, extends it with its own. */
static void worker_b(workers_t *w) {
  close(w->a_ready[1]);
  close(w->b_done[0]);
  wait_byte(w->a_ready[0], "A prefilled");
  kvc_client_t *c = client_open(w->d);
  kvc_cache_t *h = open_salted(c, "chat", "tenant-a");
  /* Whole pages of the shared prompt; B's own 100 tokens differ from A's. */
  ASSERT_MATCH(match(h, w->prompt_b, SHARED + OWN), SHARED, SHARED / T, (SHARED + OWN) % T);
  kvc_match_t m;
  ASSERT_OK(kvc_attach(h, 2, w->prompt_b, SHARED + OWN, true, &m));
  ASSERT_MATCH(m, SHARED, SHARED / T, (SHARED + OWN) % T);
  kvc_seq_info_t si;
  ASSERT_OK(kvc_seq_info(h, 2, &si));
  ASSERT_U64_EQ(si.length, SHARED);
  ASSERT_EQ(si.pages, SHARED / T);
  ASSERT_EQ(si.shared_pages, SHARED / T);
  ASSERT_EQ(si.pins, 1);
  put_bytes(h, 2, SHARED, OWN, w->prompt_b + SHARED, 2);
  check_bytes(h, 2, 0, SHARED, 1);  /* A's prefill, no byte copied */
  check_bytes(h, 2, SHARED, OWN, 2); /* B's own */

  /* Another tenant's salt, or another extra key, matches nothing. */
  kvc_cache_t *other = open_salted(c, "chat", "tenant-b");
  ASSERT_MATCH(match(other, w->prompt_a, SHARED), 0, 0, 0);
  ASSERT_OK(kvc_cache_set_extra(h, "adapter-7", 9));
  ASSERT_MATCH(match(h, w->prompt_a, SHARED), 0, 0, 0);
  ASSERT_OK(kvc_cache_set_extra(h, NULL, 0));

  /* One token changed in page 3: the match stops after page 2. */
  uint32_t *changed = malloc(SHARED * sizeof *changed);
  memcpy(changed, w->prompt_a, SHARED * sizeof *changed);
  changed[2 * T + 7] ^= 1;
  ASSERT_MATCH(match(h, changed, SHARED), 2 * T, 2, 0);
  free(changed);
  ASSERT_EQ(write(w->b_done[1], "d", 1), 1);
  kvc_client_close(c);
}

static pid_t spawn(void (*fn)(workers_t *), workers_t *w) {
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    fn(w);
    fflush(NULL);
    _exit(0);
  }
  return pid;
}

static void reap(pid_t pid, const char *who) {
  int st;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
    TEST_FAIL_("worker %s failed: exited=%d status=%d signal=%d", who, WIFEXITED(st),
               WIFEXITED(st) ? WEXITSTATUS(st) : -1, WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

TEST(prefix_two_workers_share_a_prompt) {
  static const char *const args[] = {"--pool-bytes", "16MiB", NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  workers_t w = {.d = &d};
  w.prompt_a = tokens_new(SHARED + OWN, 1);
  w.prompt_b = tokens_new(SHARED + OWN, 2);
  memcpy(w.prompt_b, w.prompt_a, SHARED * sizeof *w.prompt_a);
  ASSERT(pipe(w.a_ready) == 0 && pipe(w.b_done) == 0);
  pid_t a = spawn(worker_a, &w), b = spawn(worker_b, &w);
  close(w.a_ready[0]), close(w.a_ready[1]), close(w.b_done[0]), close(w.b_done[1]);
  reap(b, "B");
  reap(a, "A");

  kvc_client_t *c = client_open(&d);
  /* A's 131 full pages are indexed, then B's 6 full pages after the shared
   * 125; B's pin went with its connection. */
  ASSERT_U64_EQ(stat_get(c, "pages_indexed", "chat"), (SHARED + OWN) / T + OWN / T);
  ASSERT_U64_EQ(stat_get(c, "pages_cached", "chat"), 0);
  /* A's 132 pages and B's 7 own: the 125 shared ones are held once. */
  ASSERT_U64_EQ(stat_get(c, "pages_used", NULL), (SHARED + OWN + T - 1) / T + (OWN + T - 1) / T);
  ASSERT_U64_EQ(stat_get(c, "sequences_pinned", NULL), 0);
  /* match 2100, attach 2100, two misses of 2000, one short match of 2000. */
  ASSERT_U64_EQ(stat_get(c, "prefix_matches_total", "chat"), 5);
  ASSERT_U64_EQ(stat_get(c, "prefix_tokens_queried_total", "chat"), 2 * (SHARED + OWN) + 3 * SHARED);
  ASSERT_U64_EQ(stat_get(c, "prefix_tokens_hit_total", "chat"), 2 * SHARED + 2 * T);
  ASSERT_U64_EQ(stat_get(c, "prefix_tokens_ineligible_total", "chat"), 2 * ((SHARED + OWN) % T));
  ASSERT_U64_EQ(stat_get(c, "hash_verify_failed_total", "chat"), 0);
  ASSERT_U64_EQ(stat_get(c, "requests_total{op=attach}", NULL), 1);
  ASSERT_U64_EQ(stat_get(c, "requests_total{op=match}", NULL), 4);
  kvc_client_close(c);
  free(w.prompt_a);
  free(w.prompt_b);
  daemon_stop(&d);
}

/* ---- cached pages ------------------------------------------------------------ */

TEST(prefix_cached_pages_outlive_their_sequence) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *a = client_open(&d), *b = client_open(&d);
  kvc_cache_t *ha = open_salted(a, "doc", "t"), *hb = open_salted(b, "doc", "t");
  uint32_t *p = tokens_new(8 * T + 5, 3);
  put_bytes(ha, 1, 0, 8 * T + 5, p, 1);
  ASSERT_U64_EQ(stat_get(a, "pages_indexed", "doc"), 8);
  ASSERT_U64_EQ(stat_get(a, "pages_cached", "doc"), 0);

  /* A's sequence goes: its 8 full pages stay, cached; the partial one goes. */
  ASSERT_OK(kvc_seq_remove(ha, 1, 0, UINT64_MAX));
  ASSERT_U64_EQ(stat_get(a, "sequences", "doc"), 0);
  ASSERT_U64_EQ(stat_get(a, "pages_cached", "doc"), 8);
  ASSERT_U64_EQ(stat_get(a, "pages_indexed", "doc"), 8);
  ASSERT_U64_EQ(stat_get(a, "pages_free", NULL), stat_get(a, "pool_pages", NULL) - 8);

  /* B still finds them, and attaching serves A's bytes. */
  ASSERT_MATCH(match(hb, p, 8 * T + 5), 8 * T, 8, 5);
  kvc_match_t m;
  ASSERT_OK(kvc_attach(hb, 2, p, 8 * T + 5, false, &m));
  ASSERT_MATCH(m, 8 * T, 8, 5);
  ASSERT_U64_EQ(stat_get(b, "pages_cached", "doc"), 0);
  check_bytes(hb, 2, 0, 8 * T, 1);

  /* Overwriting inside an indexed page copies it: the index keeps A's. */
  uint64_t cow = stat_get(b, "cow_copies_total", NULL);
  put_bytes(hb, 2, 6 * T + 3, 4, NULL, 9);
  ASSERT_U64_EQ(stat_get(b, "cow_copies_total", NULL), cow + 1);
  ASSERT_OK(kvc_attach(hb, 3, p, 8 * T, false, &m));
  ASSERT_MATCH(m, 8 * T, 8, 0);
  check_bytes(hb, 3, 0, 8 * T, 1);

  /* Both go: the pages are cached again, still matchable. */
  ASSERT_OK(kvc_seq_remove(hb, 2, 0, UINT64_MAX));
  ASSERT_OK(kvc_seq_remove(hb, 3, 0, UINT64_MAX));
  ASSERT_U64_EQ(stat_get(b, "pages_cached", "doc"), 8);
  ASSERT_MATCH(match(ha, p, 8 * T), 8 * T, 8, 0);
  ASSERT_U64_EQ(stat_get(b, "cached_reclaimed_total", "doc"), 0);
  free(p);
  kvc_client_close(a);
  kvc_client_close(b);
  daemon_stop(&d);
}

/* ---- reclaim order ------------------------------------------------------------ */

/* A put of n tokens to a new sequence; returns its code. */
static int try_put(kvc_cache_t *h, uint64_t seq, uint64_t n) {
  const kvc_layout_t *l = kvc_cache_layout(h);
  float *k = calloc(it_tok_floats(l, false) * n, 4), *v = calloc(it_tok_floats(l, true) * n, 4);
  int rc = kvc_put(h, seq, 0, n, k, v);
  free(k);
  free(v);
  return rc;
}

/* n one-page sequences first..first+n-1 without token ids. */
static void fill(kvc_cache_t *h, uint64_t first, uint64_t n) {
  for (uint64_t s = first; s < first + n; s++) put_bytes(h, s, 0, T, NULL, s);
}

TEST(prefix_pressure_reclaims_lru_then_chain_tails_first) {
  static const char *const args[] = {SMALL_POOL, "--pin-limit-pct", "100",
                                     "--tenant-max-pinned-pct", "100", NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  kvc_client_t *c = client_open(&d);
  kvc_cache_t *h = open_salted(c, "lru", "t");
  uint32_t *p = tokens_new(8 * T, 4);

  /* Cached pages are reclaimed in LRU order with the sequences: the prefix,
   * last used before the fillers were written, goes first, page by page,
   * before any filler sequence. */
  put_bytes(h, 1, 0, 8 * T, p, 1);
  ASSERT_OK(kvc_seq_remove(h, 1, 0, UINT64_MAX));
  ASSERT_MATCH(match(h, p, 8 * T), 8 * T, 8, 0);
  fill(h, 100, 56);
  ASSERT_U64_EQ(stat_get(c, "pages_free", NULL), 0);
  for (uint64_t k = 1; k <= 8; k++) {
    fill(h, 200 + k, 1);
    ASSERT_U64_EQ(stat_get(c, "cached_reclaimed_total", "lru"), k);
    ASSERT_U64_EQ(stat_get(c, "pages_cached", "lru"), 8 - k);
    ASSERT_U64_EQ(stat_get(c, "evicted_sequences_total", NULL), 0);
  }
  ASSERT_MATCH(match(h, p, 8 * T), 0, 0, 0);
  fill(h, 300, 1); /* now the least recent filler */
  ASSERT_U64_EQ(stat_get(c, "evicted_sequences_total", NULL), 1);
  ASSERT(!seq_exists(h, 100));
  ASSERT(seq_exists(h, 101));

  /* Chain tails first: with every sequence pinned, each new page reclaims
   * one cached page, and the prefix shrinks from its end, never a hole. */
  put_bytes(h, 2, 0, 8 * T, p, 1); /* evicts 8 more fillers */
  ASSERT_OK(kvc_seq_remove(h, 2, 0, UINT64_MAX));
  ASSERT_U64_EQ(stat_get(c, "pages_cached", "lru"), 8);
  uint64_t cursor = 0;
  kvc_seq_info_t infos[64];
  size_t n = 0;
  ASSERT_OK(kvc_seq_list(h, &cursor, infos, 64, &n));
  ASSERT_EQ(n, 56);
  for (size_t i = 0; i < n; i++) ASSERT_OK(kvc_seq_pin(h, infos[i].seq_id));
  for (uint64_t k = 1; k <= 8; k++) {
    fill(h, 400 + k, 1);
    ASSERT_OK(kvc_seq_pin(h, 400 + k));
    ASSERT_MATCH(match(h, p, 8 * T), (8 - k) * T, 8 - k, 0);
    ASSERT_U64_EQ(stat_get(c, "pages_cached", "lru"), 8 - k);
  }
  ASSERT_U64_EQ(stat_get(c, "cached_reclaimed_total", "lru"), 16);
  ASSERT_U64_EQ(stat_get(c, "evicted_sequences_total", NULL), 9);
  ASSERT_ERR(try_put(h, 500, T), KVC_E_FULL); /* nothing left to reclaim */
  free(p);
  kvc_client_close(c);
  daemon_stop(&d);
}

TEST(prefix_lower_priority_goes_first) {
  static const char *const args[] = {SMALL_POOL, NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  kvc_client_t *c = client_open(&d);
  kvc_cache_t *h = open_salted(c, "prio", "t");
  /* 1 (oldest) keeps 80, 3 (newest) drops to 10, 2 stays at the default. */
  fill(h, 1, 3);
  ASSERT_OK(kvc_seq_set_priority(h, 1, 80));
  ASSERT_OK(kvc_seq_set_priority(h, 3, 10));
  fill(h, 100, 61);
  ASSERT_U64_EQ(stat_get(c, "pages_free", NULL), 0);
  fill(h, 200, 1);
  ASSERT(!seq_exists(h, 3) && seq_exists(h, 2) && seq_exists(h, 1));
  fill(h, 201, 1); /* then LRU within 35: 2 is older than every filler */
  ASSERT(!seq_exists(h, 2) && seq_exists(h, 1) && seq_exists(h, 100));
  fill(h, 202, 61); /* every older sequence at 35 goes, 1 stays */
  ASSERT(seq_exists(h, 1) && !seq_exists(h, 160) && seq_exists(h, 200));
  ASSERT_U64_EQ(stat_get(c, "evicted_sequences_total", NULL), 63);
  put_bytes(h, 300, 0, 64 * T, NULL, 300); /* the whole pool: 1 goes last */
  ASSERT(!seq_exists(h, 1));
  check_bytes(h, 300, 0, 64 * T, 300);
  ASSERT_ERR(kvc_seq_set_priority(h, 300, 101), KVC_E_INVAL);
  ASSERT(strstr(kvc_client_last_error(c), "priority 101") != NULL);
  ASSERT_ERR(kvc_seq_set_priority(h, 9999, 5), KVC_E_NOSEQ);
  ASSERT_U64_EQ(stat_get(c, "request_errors_total{op=set_priority}", NULL), 2);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* ---- pins ------------------------------------------------------------------------ */

TEST(prefix_hard_pinned_prefix_survives_pressure) {
  static const char *const args[] = {SMALL_POOL, NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  kvc_client_t *a = client_open(&d), *b = client_open(&d);
  kvc_cache_t *ha = open_salted(a, "sys", "t"), *hb = open_salted(b, "sys", "t");
  uint32_t *p = tokens_new(8 * T, 5);
  put_bytes(ha, 1, 0, 8 * T, p, 1);
  kvc_match_t m;
  ASSERT_OK(kvc_attach(ha, 2, p, 8 * T, true, &m)); /* the system prompt, pinned */
  ASSERT_MATCH(m, 8 * T, 8, 0);
  ASSERT_OK(kvc_seq_remove(ha, 1, 0, UINT64_MAX));
  ASSERT_U64_EQ(stat_get(a, "pages_pinned", NULL), 8);

  /* B writes 200 pages' worth: everything else is evicted, many times. */
  fill(hb, 1000, 200);
  ASSERT_U64_EQ(stat_get(b, "sequences", "sys"), 1 + 56);
  ASSERT_U64_EQ(stat_get(b, "evicted_sequences_total", NULL), 200 - 56);
  ASSERT(!seq_exists(hb, 1000) && seq_exists(hb, 1199));
  ASSERT_EQ(seq_pins(hb, 2), 1);
  check_bytes(hb, 2, 0, 8 * T, 1);
  ASSERT_MATCH(match(hb, p, 8 * T), 8 * T, 8, 0);

  /* A's connection closes: its pin goes, and pressure takes the prefix. */
  kvc_client_close(a);
  for (int i = 0; i < 1000 && stat_get(b, "sequences_pinned", NULL); i++) it_sleep_ms(10);
  ASSERT_U64_EQ(stat_get(b, "sequences_pinned", NULL), 0);
  fill(hb, 2000, 64);
  ASSERT(!seq_exists(hb, 2));
  ASSERT_MATCH(match(hb, p, 8 * T), 0, 0, 0);
  ASSERT_U64_EQ(stat_get(b, "pages_indexed", "sys"), 0);
  free(p);
  kvc_client_close(b);
  daemon_stop(&d);
}

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

TEST(prefix_ttl_pin_lapses) {
  static const char *const args[] = {SMALL_POOL, NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  kvc_client_t *c = client_open(&d), *b = client_open(&d);
  kvc_cache_t *h = open_salted(c, "ttl", "t"), *hb = open_salted(b, "ttl", "t");
  fill(h, 1, 2);
  uint64_t t0 = now_ms();
  ASSERT_OK(kvc_seq_pin_ttl(h, 1, 300));
  ASSERT_OK(kvc_seq_pin_ttl(h, 2, 300));
  ASSERT_OK(kvc_seq_pin_ttl(h, 2, 0)); /* pinning again with 0: a hard pin */
  ASSERT_EQ(seq_pins(h, 1), 1);
  ASSERT_U64_EQ(stat_get(c, "sequences_pinned", NULL), 2);
  fill(hb, 100, 70); /* pressure: both survive while pinned */
  ASSERT(seq_exists(h, 1) && seq_exists(h, 2));

  /* The daemon's 1 s timer lapses the soft pin, never before its time. */
  uint64_t lapsed = 0;
  while (now_ms() - t0 < 10000 && !(lapsed = stat_get(c, "pins_lapsed_total", NULL))) it_sleep_ms(50);
  ASSERT_U64_EQ(lapsed, 1);
  ASSERT(now_ms() - t0 >= 300);
  ASSERT_EQ(seq_pins(h, 1), 0);
  ASSERT_EQ(seq_pins(h, 2), 1);
  ASSERT_U64_EQ(stat_get(c, "sequences_pinned", NULL), 1);
  fill(hb, 200, 64); /* now 1 goes with the rest; 2 stays */
  ASSERT(!seq_exists(h, 1));
  ASSERT(seq_exists(h, 2));
  ASSERT_U64_EQ(stat_get(c, "pins_lapsed_total", NULL), 1);
  ASSERT_ERR(kvc_seq_pin_ttl(h, 2, KVC_MAX_TTL_MS + 1), KVC_E_RANGE);
  ASSERT_ERR(kvc_seq_pin_ttl(h, 9999, 100), KVC_E_NOSEQ);
  kvc_client_close(c);
  kvc_client_close(b);
  daemon_stop(&d);
}

TEST(prefix_pins_beyond_the_limit_fail) {
  static const char *const args[] = {SMALL_POOL, "--pin-limit-pct", "20", /* 12 of 64 */
                                     "--tenant-max-pinned-pct", "100", NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  kvc_client_t *c = client_open(&d);
  kvc_cache_t *h = open_salted(c, "lim", "t");
  put_bytes(h, 1, 0, 10 * T, NULL, 1);
  put_bytes(h, 2, 0, 3 * T, NULL, 2);
  put_bytes(h, 3, 0, 2 * T, NULL, 3);
  ASSERT_OK(kvc_seq_pin(h, 1));
  ASSERT_ERR(kvc_seq_pin(h, 2), KVC_E_PINLIMIT);
  ASSERT(strstr(kvc_client_last_error(c), "limit") != NULL);
  ASSERT_EQ(seq_pins(h, 2), 0);
  ASSERT_ERR(kvc_seq_pin_ttl(h, 2, 1000), KVC_E_PINLIMIT);
  ASSERT_OK(kvc_seq_pin(h, 3)); /* exactly the limit */
  ASSERT_U64_EQ(stat_get(c, "pages_pinned", NULL), 12);

  /* Pages already pinned do not count twice. */
  ASSERT_OK(kvc_seq_copy_prefix(h, 1, 4, 10 * T));
  ASSERT_OK(kvc_seq_pin(h, 4));

  /* An attach with a pin beyond the limit changes nothing; without, it works. */
  uint32_t *p = tokens_new(T, 6);
  put_bytes(h, 5, 0, T, p, 5);
  kvc_match_t m;
  ASSERT_ERR(kvc_attach(h, 6, p, T, true, &m), KVC_E_PINLIMIT);
  ASSERT(!seq_exists(h, 6));
  ASSERT_OK(kvc_attach(h, 6, p, T, false, &m));
  ASSERT_MATCH(m, T, 1, 0);
  ASSERT_U64_EQ(stat_get(c, "pin_limit_errors_total", NULL), 3);
  ASSERT_U64_EQ(stat_get(c, "request_errors_total{op=attach}", NULL), 1);

  /* Unpinning makes room. */
  ASSERT_OK(kvc_seq_unpin(h, 1));
  ASSERT_ERR(kvc_seq_pin(h, 2), KVC_E_PINLIMIT); /* 4 still pins those pages */
  ASSERT_OK(kvc_seq_unpin(h, 4));
  ASSERT_OK(kvc_seq_pin(h, 2));
  ASSERT_U64_EQ(stat_get(c, "pages_pinned", NULL), 5);
  free(p);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* ---- metrics -------------------------------------------------------------------- */

TEST(prefix_metrics_match_a_scripted_scenario) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  kvc_cache_t *h = open_salted(c, "m", "t");
  uint32_t *p = tokens_new(100, 7), *r = tokens_new(50, 8);
  put_bytes(h, 1, 0, 100, p, 1);                  /* 6 full pages + 4 tokens */
  ASSERT_MATCH(match(h, p, 100), 96, 6, 4);
  ASSERT_MATCH(match(h, p, 40), 32, 2, 8);
  ASSERT_MATCH(match(h, r, 50), 0, 0, 2);
  kvc_match_t m;
  ASSERT_OK(kvc_attach(h, 2, p, 96, false, &m));
  ASSERT_MATCH(m, 96, 6, 0);
  ASSERT_MATCH(match(h, p, 15), 0, 0, 15);        /* shorter than a page */
  ASSERT_MATCH(match(h, p, 0), 0, 0, 0);
  /* 6 requests; queried 100+40+50+96+15+0, hit 96+32+96, ineligible 4+8+2+15. */
  static char out[1 << 18];
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "stats --json"), 0);
  json_t *j = json_parse_or_fail(out);
  /* Exported names: counters end in _total, per-cache families in cache_. */
  static const char *const figs[] = {"prefix_matches_total", "prefix_tokens_queried_total",
                                     "prefix_tokens_hit_total", "prefix_tokens_ineligible_total",
                                     "pages_indexed", "pages_cached", "hash_verify_failed_total"};
  static const uint64_t want[] = {6, 301, 224, 29, 6, 0, 0};
  for (int scope = 0; scope < 2; scope++) {
    const json_t *x = scope ? json_get(j, "caches", "m", NULL) : json_get(j, "global", NULL);
    for (size_t i = 0; i < sizeof figs / sizeof figs[0]; i++) {
      char name[96];
      snprintf(name, sizeof name, "%s%s", scope ? "cache_" : "", figs[i]);
      uint64_t v = json_u64(json_get(x, name, "value", NULL));
      if (v != want[i]) TEST_FAIL_("%s %s: expected %" PRIu64 ", got %" PRIu64,
                                   scope ? "cache m" : "global", name, want[i], v);
    }
  }
  ASSERT_STR_EQ(json_get(j, "global", "prefix_tokens_hit_total", "kind", NULL)->str, "counter");
  json_free(j);
  ASSERT_U64_EQ(stat_get(c, "requests_total{op=match}", NULL), 5);
  ASSERT_U64_EQ(stat_get(c, "requests_total{op=attach}", NULL), 1);
  ASSERT_U64_EQ(stat_get(c, "prefix_tokens_hit_total", "m"), 224);
  static char prom[1 << 18];
  ASSERT_EQ(ctl_run(&d, prom, sizeof prom, false, "stats --prometheus"), 0);
  ASSERT(strstr(prom, "# TYPE kvcached_prefix_tokens_hit_total counter\n") != NULL);
  ASSERT(strstr(prom, "\nkvcached_prefix_tokens_queried_total 301\n") != NULL);
  ASSERT(strstr(prom, "\nkvcached_cache_prefix_tokens_ineligible_total{cache=\"m\",tenant=\"uid:0\"} 29\n") != NULL);
  ASSERT(strstr(prom, "# TYPE kvcached_cache_pages_indexed gauge\n") != NULL);
  ASSERT(strstr(prom, "\nkvcached_requests_total{op=\"attach\"} 1\n") != NULL);
  ASSERT_EQ(ctl_run(&d, prom, sizeof prom, false, "stats"), 0);
  ASSERT(strstr(prom, "prefix_tokens_hit") && strstr(prom, "pins_lapsed") &&
         strstr(prom, "\n  match "));

  /* The same figures through kvcachectl prefix, and the one chain head:
   * three matches reached it, six pages deep. */
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "prefix --cache m"), 0);
  ASSERT(strstr(out, "cache m\n") != NULL);
  ASSERT(strstr(out, "tokens queried                      301\n") != NULL);
  ASSERT(strstr(out, "hit rate 74.42%") != NULL);
  ASSERT(strstr(out, "tokens ineligible                    29\n") != NULL);
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "prefix --json"), 0);
  j = json_parse_or_fail(out);
  const json_t *pm = json_get(j, "caches", "m", NULL), *top = json_get(pm, "top", NULL);
  ASSERT_U64_EQ(json_u64(json_get(pm, "prefix_tokens_queried", NULL)), 301);
  ASSERT_U64_EQ(json_u64(json_get(pm, "prefix_tokens_hit", NULL)), 224);
  double rate = json_num(json_get(pm, "hit_rate", NULL));
  ASSERT(rate > 0.74415 && rate < 0.74425); /* 224 / 301, to four places 0.7442 */
  ASSERT_EQ(json_len(top), 1);
  const json_t *hash = json_get(json_at(top, 0), "hash", NULL);
  ASSERT(hash->kind == JSON_STR);
  ASSERT_EQ(strlen(hash->str), 64);
  ASSERT_U64_EQ(json_u64(json_get(json_at(top, 0), "hits", NULL)), 3);
  ASSERT_U64_EQ(json_u64(json_get(json_at(top, 0), "depth", NULL)), 6);
  json_free(j);
  ASSERT_EQ(ctl_run(&d, out, sizeof out, true, "prefix --cache nope"), 1);
  ASSERT(strstr(out, "NOCACHE") != NULL);
  ASSERT_EQ(ctl_run(&d, out, sizeof out, true, "prefix --top 0"), 2);
  ASSERT(strstr(out, "--top takes 1..1000") != NULL);
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "prefix --top 1"), 0);
  ASSERT(strstr(out, "top prefixes by hits") != NULL);
  kvc_prefix_head_t heads[4];
  size_t n = 0;
  ASSERT_OK(kvc_prefix_top(h, heads, 4, &n));
  ASSERT_EQ(n, 1);
  ASSERT_EQ(heads[0].hash_len, 32);
  ASSERT_U64_EQ(heads[0].hits, 3);
  ASSERT_EQ(heads[0].depth, 6);
  free(p);
  free(r);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* ---- transfers with token ids ------------------------------------------------- */

/* Puts [0, n) of seq with the bytes of bytes_of, the ids and span keys,
 * in one kvc_put_batch (split by the library if the buffer is small). */
static void put_spans(kvc_cache_t *h, uint64_t seq, uint64_t n, const uint32_t *tokens,
                      const kvc_span_key_t *sp, size_t nsp, uint64_t bytes_of) {
  const kvc_layout_t *l = kvc_cache_layout(h);
  float *k = calloc(it_tok_floats(l, false) * n, 4), *v = calloc(it_tok_floats(l, true) * n, 4);
  ASSERT(k && v);
  it_fill_f32(k, v, l, bytes_of, 0, n, 0);
  kvc_io_t io = {.seq_id = seq, .ntokens = n, .k = k, .v = v, .tokens = tokens,
                 .span_keys = sp, .nspan_keys = nsp};
  ASSERT_OK(kvc_put_batch(h, NULL, &io, 1));
  free(k), free(v);
}

static uint64_t match_spans(kvc_cache_t *h, const uint32_t *t, uint64_t n,
                            const kvc_span_key_t *sp, size_t nsp) {
  kvc_match_t m = {99, 99, 99};
  ASSERT_OK(kvc_match_spans(h, t, n, sp, nsp, &m));
  return m.tokens;
}

TEST(prefix_span_keys_keep_images_apart_across_workers) {
  daemon_t d;
  daemon_start(&d);
  /* Two workers prefill the same 2,000 ids: a system prompt, then an
   * image's placeholder tokens at [40, 1064), each worker with its own
   * image. The first worker's buffer holds ~1,000 tokens, so its put goes
   * in parts, each with the image's span key. */
  kvc_client_t *a = client_open_shm(&d, 1u << 20), *b = client_open(&d), *c = client_open(&d);
  kvc_cache_t *ha = open_salted(a, "mm", "t"), *hb = open_salted(b, "mm", "t"),
              *hc = open_salted(c, "mm", "t");
  enum { N = 2000 };
  uint32_t *p = tokens_new(N, 40);
  const kvc_span_key_t img1 = {40, 1064, "sha256:image-one", 16},
                       img2 = {40, 1064, "sha256:image-two", 16};
  uint64_t puts = stat_get(a, "requests_total{op=put}", NULL);
  put_spans(ha, 1, N, p, &img1, 1, 1);
  ASSERT(stat_get(a, "requests_total{op=put}", NULL) > puts + 1); /* split */
  put_spans(hb, 2, N, p, &img2, 1, 2);
  ASSERT_U64_EQ(match_spans(hc, p, N, &img1, 1), N / T * T);
  ASSERT_U64_EQ(match_spans(hc, p, N, &img2, 1), N / T * T);
  ASSERT_U64_EQ(match_spans(hc, p, N, NULL, 0), 32); /* the pages before the image */
  kvc_match_t m;
  ASSERT_OK(kvc_attach_spans(hc, 30, p, N, &img1, 1, KVC_ATTACH_PIN, &m));
  ASSERT_U64_EQ(m.tokens, N / T * T);
  check_bytes(hc, 30, 0, m.tokens, 1);
  /* The pages before the image are the first worker's (the second one's
   * twins stay private); the image's on are the second worker's, indexed
   * under those twins. */
  ASSERT_OK(kvc_attach_spans(hc, 31, p, N, &img2, 1, 0, &m));
  ASSERT_U64_EQ(m.tokens, N / T * T);
  check_bytes(hc, 31, 0, 32, 1);
  check_bytes(hc, 31, 32, m.tokens - 32, 2);
  /* The direct-buffer form carries them too. */
  void *shm;
  uint64_t shm_bytes, kb, vb;
  kvc_client_shm(c, &shm, &shm_bytes);
  ASSERT_OK(kvc_xfer_bytes(hc, NULL, true, 2 * T, &kb, &vb, NULL));
  const kvc_layout_t *l = kvc_cache_layout(hc);
  it_fill_f32(shm, (float *)shm + kb / 4, l, 3, 0, 2 * T, 0);
  memcpy((uint8_t *)shm + kb + vb, p, 2 * T * sizeof *p);
  const kvc_span_key_t img3 = {4, 20, "sha256:image-three", 18};
  kvc_shm_io_t e = {.seq_id = 3, .ntokens = 2 * T, .k_off = 0, .v_off = kb,
                    .tok_off = kb + vb, .tok_len = 2 * T * sizeof *p, .span_keys = &img3,
                    .nspan_keys = 1};
  ASSERT_OK(kvc_put_shm(hc, NULL, &e, 1));
  ASSERT_U64_EQ(match_spans(ha, p, 2 * T, &img3, 1), 2 * T);
  check_bytes(hc, 3, 0, 2 * T, 3);
  /* Bad lists are refused, the connection goes on. */
  const kvc_span_key_t overlap[2] = {{4, 10, "x", 1}, {8, 12, "y", 1}};
  ASSERT_ERR(kvc_match_spans(hc, p, N, overlap, 2, &m), KVC_E_INVAL);
  ASSERT(strstr(kvc_client_last_error(c), "span key 1") != NULL);
  const kvc_span_key_t empty = {4, 10, "", 0};
  ASSERT_ERR(kvc_attach_spans(hc, 32, p, N, &empty, 1, 0, &m), KVC_E_INVAL);
  ASSERT(!seq_exists(hc, 32));
  const kvc_layout_t *la = kvc_cache_layout(hc);
  float *k = calloc(it_tok_floats(la, false) * T, 4), *v = calloc(it_tok_floats(la, true) * T, 4);
  const kvc_span_key_t img4 = {0, 8, "sha256:image-four", 17};
  kvc_io_t io = {.seq_id = 33, .ntokens = T, .k = k, .v = v, .span_keys = &img4,
                 .nspan_keys = 1}; /* span keys without ids */
  ASSERT_ERR(kvc_put_batch(hc, NULL, &io, 1), KVC_E_INVAL);
  ASSERT(!seq_exists(hc, 33));
  free(k), free(v);
  ASSERT_OK(kvc_ping(c));
  ASSERT_U64_EQ(match_spans(hc, p, N, &img1, 1), N / T * T);
  free(p);
  kvc_client_close(a), kvc_client_close(b), kvc_client_close(c);
  daemon_stop(&d);
}

TEST(prefix_split_puts_keep_ids_with_their_tokens) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open_shm(&d, 1u << 20); /* ~1000 tokens per request */
  kvc_cache_t *h = open_salted(c, "split", "t");
  uint32_t *p = tokens_new(SHARED, 9);
  uint64_t puts = stat_get(c, "requests_total{op=put}", NULL);
  put_bytes(h, 1, 0, SHARED, p, 1); /* split by tokens, mid-page */
  ASSERT_U64_EQ(stat_get(c, "requests_total{op=put}", NULL), puts + 2);
  ASSERT_MATCH(match(h, p, SHARED), SHARED, SHARED / T, 0);
  check_bytes(h, 1, 0, SHARED, 1);

  /* A batch of 8 prompts split by entries and tokens. */
  const kvc_layout_t *l = kvc_cache_layout(h);
  enum { N = 8, LEN = 300 };
  size_t kn = it_tok_floats(l, false) * LEN, vn = it_tok_floats(l, true) * LEN;
  float *k = calloc(kn * N, 4), *v = calloc(vn * N, 4);
  uint32_t *ids[N];
  kvc_io_t io[N];
  for (int i = 0; i < N; i++) {
    ids[i] = tokens_new(LEN, 100u + (unsigned)i);
    it_fill_f32(k + kn * (size_t)i, v + vn * (size_t)i, l, 10u + (unsigned)i, 0, LEN, 0);
    io[i] = (kvc_io_t){.seq_id = 10u + (unsigned)i, .ntokens = LEN, .k = k + kn * (size_t)i,
                       .v = v + vn * (size_t)i, .tokens = ids[i]};
  }
  ASSERT_OK(kvc_put_batch(h, NULL, io, N));
  for (int i = 0; i < N; i++) {
    ASSERT_MATCH(match(h, ids[i], LEN), LEN / T * T, LEN / T, LEN % T);
    check_bytes(h, 10u + (unsigned)i, 0, LEN, 10u + (unsigned)i);
  }
  /* Layer by layer (vLLM's save_kv_layer): each layer of every prompt in
   * its own batched put with the ids; no page is matched until its last
   * layer is in, then another connection attaches them byte for byte. */
  uint32_t nl = l->num_layers;
  size_t kl = kn / nl, vl = vn / nl; /* one layer of one prompt */
  ASSERT_OK(kvc_cache_clear(h)); /* the prompts' pages go: nothing matches */
  ASSERT_MATCH(match(h, ids[0], LEN), 0, 0, LEN % T);
  for (uint32_t layer = 0; layer < nl; layer++) {
    kvc_xfer_t one = {.layer_begin = layer, .layer_end = layer + 1};
    kvc_io_t lio[N];
    for (int i = 0; i < N; i++)
      lio[i] = (kvc_io_t){.seq_id = 50u + (unsigned)i, .ntokens = LEN,
                          .k = k + kn * (size_t)i + kl * layer,
                          .v = v + vn * (size_t)i + vl * layer, .tokens = ids[i]};
    ASSERT_OK(kvc_put_batch(h, &one, lio, N));
    for (int i = 0; i < N; i++) {
      uint64_t want = layer + 1 == nl ? LEN / T * T : 0;
      ASSERT_MATCH(match(h, ids[i], LEN), want, want / T, LEN % T);
    }
  }
  kvc_client_t *c2 = client_open_shm(&d, 1u << 20);
  kvc_cache_t *h2 = open_salted(c2, "split", "t");
  for (int i = 0; i < N; i++) ASSERT_OK(kvc_seq_remove(h, 50u + (unsigned)i, 0, UINT64_MAX));
  for (int i = 0; i < N; i++) {
    kvc_match_t m;
    ASSERT_OK(kvc_attach(h2, 70u + (unsigned)i, ids[i], LEN, false, &m));
    ASSERT_U64_EQ(m.tokens, LEN / T * T);
    check_bytes(h2, 70u + (unsigned)i, 0, m.tokens, 10u + (unsigned)i);
  }
  /* A layer saved with other ids keeps that prompt's pages out. */
  uint32_t *other = tokens_new(LEN, 777);
  for (uint32_t layer = 0; layer < nl; layer++) {
    kvc_xfer_t one = {.layer_begin = layer, .layer_end = layer + 1};
    kvc_io_t lio = {.seq_id = 99, .ntokens = LEN, .k = k + kl * layer, .v = v + vl * layer,
                    .tokens = layer == 1 ? other : ids[0]};
    ASSERT_OK(kvc_put_batch(h, &one, &lio, 1));
  }
  ASSERT_MATCH(match(h, other, LEN), 0, 0, LEN % T);
  free(other);
  kvc_cache_close(h2);
  kvc_client_close(c2);

  /* The direct-buffer form: the caller places bytes and ids itself. */
  void *shm;
  uint64_t shm_bytes, kb, vb;
  kvc_client_shm(c, &shm, &shm_bytes);
  ASSERT_OK(kvc_xfer_bytes(h, NULL, true, 2 * T, &kb, &vb, NULL));
  uint32_t *q = tokens_new(2 * T, 11);
  it_fill_f32(shm, (float *)shm + kb / 4, l, 20, 0, 2 * T, 0);
  memcpy((uint8_t *)shm + kb + vb, q, 2 * T * sizeof *q);
  kvc_shm_io_t e = {.seq_id = 20, .ntokens = 2 * T, .k_off = 0, .v_off = kb,
                    .tok_off = kb + vb, .tok_len = 2 * T * sizeof *q};
  ASSERT_OK(kvc_put_shm(h, NULL, &e, 1));
  ASSERT_MATCH(match(h, q, 2 * T), 2 * T, 2, 0);
  check_bytes(h, 20, 0, 2 * T, 20);
  for (int i = 0; i < N; i++) free(ids[i]);
  free(k), free(v), free(p), free(q);
  kvc_client_close(c);
  daemon_stop(&d);
}

TEST(prefix_xxh3_for_a_declared_single_tenant) {
  static const char *const args[] = {"--prefix-hash", "xxh3", "--prefix-single-tenant", "true",
                                     NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  kvc_client_t *c = client_open(&d);
  kvc_cache_t *h = open_salted(c, "x", "t"), *other = open_salted(c, "x", "u");
  uint32_t *p = tokens_new(5 * T, 12);
  put_bytes(h, 1, 0, 5 * T, p, 1);
  ASSERT_MATCH(match(h, p, 5 * T), 5 * T, 5, 0);
  ASSERT_MATCH(match(other, p, 5 * T), 0, 0, 0);
  kvc_prefix_head_t head;
  size_t n = 0;
  ASSERT_OK(kvc_prefix_top(h, &head, 1, &n));
  ASSERT_EQ(n, 1);
  ASSERT_EQ(head.hash_len, 16); /* xxHash3-128 */
  ASSERT_EQ(head.depth, 5);
  ASSERT_U64_EQ(head.hits, 1);
  free(p);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* ---- bad requests ----------------------------------------------------------------- */

TEST(prefix_bad_requests_are_refused_and_change_nothing) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h, *gone;
  char big[KVC_MAX_KEY_BYTES + 1];
  memset(big, 'x', sizeof big);
  ASSERT_ERR(kvc_cache_open_salted(c, "bad", &l, big, sizeof big, &h), KVC_E_INVAL);
  ASSERT_ERR(kvc_cache_open_salted(c, "bad", &l, NULL, 3, &h), KVC_E_INVAL);
  ASSERT_OK(kvc_cache_open_salted(c, "bad", &l, big, KVC_MAX_KEY_BYTES, &h));
  ASSERT_ERR(kvc_cache_set_extra(h, big, sizeof big), KVC_E_INVAL);
  uint32_t *p = tokens_new(T, 13);
  put_bytes(h, 1, 0, T, p, 1);
  void *shm;
  uint64_t shm_bytes, kb, vb;
  kvc_client_shm(c, &shm, &shm_bytes);
  ASSERT_OK(kvc_xfer_bytes(h, NULL, true, T, &kb, &vb, NULL));

  /* Token regions of a direct put: size, alignment, bounds, overflow. */
  kvc_shm_io_t e = {.seq_id = 2, .ntokens = T, .k_off = 0, .v_off = kb, .tok_off = kb + vb,
                    .tok_len = 4 * T + 4};
  ASSERT_ERR(kvc_put_shm(h, NULL, &e, 1), KVC_E_SIZE);
  ASSERT(strstr(kvc_client_last_error(c), "tok_len") != NULL);
  e.tok_len = 4 * T;
  e.tok_off = kb + vb + 2;
  ASSERT_ERR(kvc_put_shm(h, NULL, &e, 1), KVC_E_OFFSET);
  ASSERT(strstr(kvc_client_last_error(c), "multiple of 4") != NULL);
  e.tok_off = shm_bytes - 4 * T + 4;
  ASSERT_ERR(kvc_put_shm(h, NULL, &e, 1), KVC_E_OFFSET);
  e.tok_off = UINT64_MAX - 3;
  ASSERT_ERR(kvc_put_shm(h, NULL, &e, 1), KVC_E_OFFSET);
  e.tok_off = kb + vb;
  ASSERT_ERR(kvc_get_shm(h, NULL, &(kvc_shm_io_t){.seq_id = 1, .ntokens = T, .v_off = kb,
                                                  .tok_off = kb + vb, .tok_len = 4 * T}, 1),
             KVC_E_INVAL);
  ASSERT(!seq_exists(h, 2));

  /* Library checks of match and attach. */
  kvc_match_t m;
  ASSERT_ERR(kvc_match(h, NULL, 5, &m), KVC_E_INVAL);
  ASSERT_ERR(kvc_match(h, p, shm_bytes / 4 + 1, &m), KVC_E_SIZE);
  ASSERT_ERR(kvc_match(h, p, T, NULL), KVC_E_INVAL);
  kvc_prefix_head_t head;
  size_t n;
  ASSERT_ERR(kvc_prefix_top(h, &head, 0, &n), KVC_E_INVAL);
  ASSERT_OK(kvc_cache_open(c, "gone", &l, &gone));
  ASSERT_OK(kvc_cache_drop(gone));
  ASSERT_ERR(kvc_match(gone, p, T, &m), KVC_E_NOCACHE);
  ASSERT_ERR(kvc_attach(gone, 1, p, T, true, &m), KVC_E_NOCACHE);
  ASSERT_ERR(kvc_prefix_top(gone, &head, 1, &n), KVC_E_NOCACHE);
  ASSERT_MATCH(match(h, p, T), T, 1, 0); /* usable, and unchanged */

  /* The daemon's checks, by hand: each is answered, the connection lives. */
  int fd = it_connect_raw(d.sock);
  ASSERT(fd >= 0);
  raw_hello(fd, KVC_PROTOCOL_VERSION);
  Kvcache__V1__Response *resp = raw_reply(fd);
  ASSERT(resp && resp->status == KVCACHE__V1__STATUS__OK);
  uint64_t raw_shm = resp->hello->shm_bytes;
  kvcache__v1__response__free_unpacked(resp, NULL);
  struct {
    uint64_t off, ntokens;
    size_t salt_len;
    Kvcache__V1__Status want;
    const char *why;
  } cases[] = {
      {raw_shm, 1, 0, KVCACHE__V1__STATUS__OFFSET, "outside"},
      {raw_shm - 4, 2, 0, KVCACHE__V1__STATUS__OFFSET, "outside"},
      {2, 1, 0, KVCACHE__V1__STATUS__OFFSET, "multiple of 4"},
      {0, UINT64_MAX / 2, 0, KVCACHE__V1__STATUS__OVERFLOW, "overflow"},
      {UINT64_MAX - 3, 2, 0, KVCACHE__V1__STATUS__OFFSET, "overflows"},
      {0, 1, KVC_MAX_KEY_BYTES + 1, KVCACHE__V1__STATUS__INVAL, "salt"},
  };
  uint64_t id = 2;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    for (int attach = 0; attach < 2; attach++) {
      Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
      Kvcache__V1__Match mb = KVCACHE__V1__MATCH__INIT;
      Kvcache__V1__Attach ab = KVCACHE__V1__ATTACH__INIT;
      ProtobufCBinaryData salt = {cases[i].salt_len, (uint8_t *)big};
      req.id = id++;
      if (attach) {
        ab.cache_id = kvc_cache_id(h), ab.dst_seq = 7, ab.tok_off = cases[i].off;
        ab.ntokens = cases[i].ntokens, ab.salt = salt, ab.pin = true;
        req.body_case = KVCACHE__V1__REQUEST__BODY_ATTACH;
        req.attach = &ab;
      } else {
        mb.cache_id = kvc_cache_id(h), mb.tok_off = cases[i].off;
        mb.ntokens = cases[i].ntokens, mb.salt = salt;
        req.body_case = KVCACHE__V1__REQUEST__BODY_MATCH;
        req.match = &mb;
      }
      raw_send_request(fd, &req);
      resp = raw_reply(fd);
      ASSERT(resp != NULL);
      if (resp->status != cases[i].want || !strstr(resp->error, cases[i].why))
        TEST_FAIL_("case %zu (%s): expected status %d with \"%s\", got %d \"%s\"", i,
                   attach ? "attach" : "match", cases[i].want, cases[i].why, resp->status,
                   resp->error);
      kvcache__v1__response__free_unpacked(resp, NULL);
    }
  }
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__PrefixTop tb = KVCACHE__V1__PREFIX_TOP__INIT;
  tb.cache_id = 77;
  req.id = id++;
  req.body_case = KVCACHE__V1__REQUEST__BODY_PREFIX_TOP;
  req.prefix_top = &tb;
  raw_send_request(fd, &req);
  resp = raw_reply(fd);
  ASSERT(resp && resp->status == KVCACHE__V1__STATUS__NOCACHE);
  kvcache__v1__response__free_unpacked(resp, NULL);
  Kvcache__V1__Ping ping = KVCACHE__V1__PING__INIT;
  req.id = id++;
  req.body_case = KVCACHE__V1__REQUEST__BODY_PING;
  req.ping = &ping;
  raw_send_request(fd, &req);
  resp = raw_reply(fd);
  ASSERT(resp && resp->status == KVCACHE__V1__STATUS__OK);
  kvcache__v1__response__free_unpacked(resp, NULL);
  close(fd);

  ASSERT(!seq_exists(h, 7));
  ASSERT_U64_EQ(stat_get(c, "request_errors_total{op=match}", NULL), 6 + 1);
  ASSERT_U64_EQ(stat_get(c, "request_errors_total{op=attach}", NULL), 6 + 1);
  ASSERT_U64_EQ(stat_get(c, "prefix_matches_total", NULL), 1);
  ASSERT_U64_EQ(stat_get(c, "sequences_pinned", NULL), 0);
  free(p);
  kvc_client_close(c);
  daemon_stop(&d);
}
