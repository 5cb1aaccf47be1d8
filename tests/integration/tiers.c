/* tiers.c: the disk tier and the warm restart on a real daemon (doc/tiers.md):
 * a prompt evicted to disk and attached again byte for byte, the tier's
 * bound and LRU, a full file system (a small tmpfs) that never fails a put,
 * a restart whose first match hits, and files that must never be served: a
 * SIGKILL during writes, torn and corrupted files, another tenant's or
 * layout's page, another format version; fp8 and ggml pages as given. */
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include "../../daemon/tiers/disk/diskfmt.h"
#include "harness.h"

#define T 16u        /* page_tokens of it_layout */
#define PAGE 16384u  /* its page bytes: one 16 KiB pool page */
#define FILE_BYTES (4096u + PAGE) /* a page file: header and data */
#define UID_OTHER 64011u

/* A pool of 64 pages of 16 KiB. */
#define POOL "--pool-bytes", "1MiB", "--page-bytes", "16KiB"

static uint32_t *prompt(size_t n, uint32_t seed) {
  uint32_t *t = malloc(n * sizeof *t);
  ASSERT(t != NULL);
  uint64_t x = 0x9e3779b97f4a7c15ull * (seed + 1);
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    t[i] = (uint32_t)(x % 128256u);
  }
  return t;
}

/* Writes [0, n) of seq with the bytes of `bytes_of` and, unless ids is
 * NULL, the ids. */
static void put_bytes(kvc_cache_t *h, uint64_t seq, uint64_t n, const uint32_t *ids,
                      uint64_t bytes_of) {
  const kvc_layout_t *l = kvc_cache_layout(h);
  float *k = calloc(it_tok_floats(l, false) * n, 4), *v = calloc(it_tok_floats(l, true) * n, 4);
  ASSERT(k && v);
  it_fill_f32(k, v, l, bytes_of, 0, n, 0);
  if (ids) ASSERT_OK(kvc_put_tokens(h, seq, 0, n, k, v, ids));
  else ASSERT_OK(kvc_put(h, seq, 0, n, k, v));
  free(k);
  free(v);
}

/* [0, n) of seq holds exactly the bytes of `bytes_of`. */
static void check_bytes(kvc_cache_t *h, uint64_t seq, uint64_t n, uint64_t bytes_of) {
  const kvc_layout_t *l = kvc_cache_layout(h);
  size_t kn = it_tok_floats(l, false) * n, vn = it_tok_floats(l, true) * n;
  float *k = calloc(kn, 4), *v = calloc(vn, 4), *gk = calloc(kn, 4), *gv = calloc(vn, 4);
  ASSERT(k && v && gk && gv);
  it_fill_f32(k, v, l, bytes_of, 0, n, 0);
  ASSERT_OK(kvc_get(h, seq, 0, n, gk, gv));
  ASSERT_MEM_EQ(gk, k, kn * 4);
  ASSERT_MEM_EQ(gv, v, vn * 4);
  free(k), free(v), free(gk), free(gv);
}

/* Waits (10 s at most) until a figure reaches at least want. */
static uint64_t wait_stat(kvc_client_t *c, const char *name, uint64_t want) {
  return it_wait_stat(c, name, want, true);
}

/* Waits until the start-up scan is done. */
static void wait_loaded(kvc_client_t *c) { it_wait_stat(c, "tier_disk_loading", 0, false); }

static kvc_cache_t *open_cache(kvc_client_t *c, const char *name, kvc_dtype_t dt) {
  kvc_layout_t l = it_layout(dt);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, name, &l, &h));
  return h;
}

/* A tier directory outside the daemon's own (which its stop removes). */
static void tier_mkdir(char *dir, size_t len) {
  snprintf(dir, len, "/tmp/kvctier-XXXXXX");
  ASSERT(mkdtemp(dir) != NULL);
}

static void rm_rf(const char *dir) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ASSERT(system(cmd) == 0);
}

static void start_tier(daemon_t *d, const char *dir, const char *bytes) {
  const char *args[] = {POOL, "--disk-dir", dir, "--disk-bytes", bytes, NULL};
  daemon_start_args(d, args);
}

/* Prompt p (n tokens, bytes of seq 1) written, left cached, then pushed out
 * of memory by 64 pages without ids; waits for the pages' files. */
static void spill(kvc_client_t *c, kvc_cache_t *h, const uint32_t *p, uint64_t n,
                  uint64_t bytes_of) {
  uint64_t writes = stat_get(c, "tier_disk_writes_total", NULL);
  put_bytes(h, 1, n, p, bytes_of);
  ASSERT_OK(kvc_seq_remove(h, 1, 0, UINT64_MAX));
  put_bytes(h, 2, 64 * T, NULL, 99);
  ASSERT_OK(kvc_seq_remove(h, 2, 0, UINT64_MAX));
  wait_stat(c, "tier_disk_writes_total", writes + n / T);
}

static kvc_match_t match(kvc_cache_t *h, const uint32_t *p, uint64_t n) {
  kvc_match_t m = {99, 99, 99};
  ASSERT_OK(kvc_match(h, p, n, &m));
  return m;
}

TEST(tier_prompt_evicted_to_disk_attached_byte_exact) {
  char dir[64];
  tier_mkdir(dir, sizeof dir);
  daemon_t d;
  start_tier(&d, dir, "64MiB");
  kvc_client_t *c = client_open(&d);
  kvc_cache_t *h = open_cache(c, "chat", KVC_DTYPE_F32);
  uint32_t *p = prompt(20 * T + 5, 1);
  spill(c, h, p, 20 * T, 1);
  ASSERT_U64_EQ(stat_get(c, "pages_indexed", NULL), 0); /* none left in memory */
  ASSERT_U64_EQ(stat_get(c, "tier_disk_pages", NULL), 20);
  ASSERT_U64_EQ(stat_get(c, "tier_disk_bytes", NULL), 20 * FILE_BYTES);
  kvc_match_t m;
  ASSERT_OK(kvc_attach(h, 3, p, 20 * T + 5, false, &m));
  ASSERT_U64_EQ(m.pages, 20);
  ASSERT_U64_EQ(m.tokens, 20 * T);
  check_bytes(h, 3, 20 * T, 1);
  ASSERT_U64_EQ(stat_get(c, "tier_disk_reads_total", NULL), 20);
  ASSERT_U64_EQ(stat_get(c, "tier_disk_hits_total", NULL), 20);
  ASSERT_U64_EQ(stat_get(c, "tier_disk_read_bytes_total", NULL), 20 * FILE_BYTES);
  ASSERT_U64_EQ(stat_get(c, "tier_disk_discarded_total", NULL), 0);
  /* Resident again: the next match reads nothing. */
  ASSERT_U64_EQ(match(h, p, 20 * T).pages, 20);
  ASSERT_U64_EQ(stat_get(c, "tier_disk_reads_total", NULL), 20);
  /* Evicted once more, it is on disk already: nothing is written again. */
  uint64_t w = stat_get(c, "tier_disk_writes_total", NULL);
  ASSERT_OK(kvc_seq_remove(h, 3, 0, UINT64_MAX));
  put_bytes(h, 2, 64 * T, NULL, 99);
  ASSERT_U64_EQ(stat_get(c, "tier_disk_writes_total", NULL), w);
  kvc_client_close(c);
  daemon_stop(&d);
  rm_rf(dir);
  free(p);
}

/* A tier is its own file and one line of daemon/tiers/tiers.c's list: the
 * test-only member (daemon/tiers/testmem.c, on with KVCACHED_TEST_TIER=mem)
 * keeps in memory what the pool reclaims, and a prompt pushed out of the
 * pool comes back from it byte exact, through the same lookup, wait and
 * resume as the disk's and the cluster's. */
TEST(tier_test_only_member_registered_by_one_line) {
  daemon_t d;
  const char *args[] = {POOL, NULL};
  const char *env[] = {"KVCACHED_TEST_TIER=mem", NULL};
  daemon_spawn(&d, NULL, args, env);
  daemon_wait_accepting(&d);
  kvc_client_t *c = client_open(&d);
  kvc_cache_t *h = open_cache(c, "chat", KVC_DTYPE_F32);
  uint32_t *p = prompt(20 * T + 5, 7);
  put_bytes(h, 1, 20 * T, p, 7);
  ASSERT_OK(kvc_seq_remove(h, 1, 0, UINT64_MAX));
  put_bytes(h, 2, 64 * T, NULL, 99); /* the 1 MiB pool's 64 pages: the prompt's go */
  ASSERT_OK(kvc_seq_remove(h, 2, 0, UINT64_MAX));
  ASSERT_U64_EQ(stat_get(c, "pages_indexed", NULL), 0); /* none left in memory */
  uint64_t parked = stat_get(c, "parked_requests_total", NULL);
  kvc_match_t m;
  ASSERT_OK(kvc_attach(h, 3, p, 20 * T + 5, false, &m));
  ASSERT_U64_EQ(m.pages, 20);
  ASSERT_U64_EQ(m.tokens, 20 * T);
  check_bytes(h, 3, 20 * T, 7);
  /* the wait on a tier is not a busy sequence's */
  ASSERT_U64_EQ(stat_get(c, "parked_requests_total", NULL), parked);
  /* without the variable the member is off: nothing comes back */
  kvc_client_close(c);
  daemon_stop(&d);
  start_tier(&d, "", "64MiB");
  c = client_open(&d);
  h = open_cache(c, "chat", KVC_DTYPE_F32);
  put_bytes(h, 1, 20 * T, p, 7);
  ASSERT_OK(kvc_seq_remove(h, 1, 0, UINT64_MAX));
  put_bytes(h, 2, 64 * T, NULL, 99);
  ASSERT_OK(kvc_seq_remove(h, 2, 0, UINT64_MAX));
  ASSERT_OK(kvc_attach(h, 3, p, 20 * T + 5, false, &m));
  ASSERT_U64_EQ(m.pages, 0);
  kvc_client_close(c);
  daemon_stop(&d);
  free(p);
}

/* Every lookup has a deadline (tier_lookup_timeout_ms, kept by tiers.c for
 * every tier): a tier that never answers (the test tier, silent) is let go
 * then, counted as its timeout, and the request runs with what the pool
 * holds; the connection, and the tier's next lookups, go on. */
TEST(tier_lookup_past_its_deadline_lets_the_request_run) {
  daemon_t d;
  const char *args[] = {POOL, "--tier-lookup-timeout-ms", "50", NULL};
  const char *env[] = {"KVCACHED_TEST_TIER=mem-silent", NULL};
  daemon_spawn(&d, NULL, args, env);
  daemon_wait_accepting(&d);
  kvc_client_t *c = client_open(&d);
  kvc_cache_t *h = open_cache(c, "chat", KVC_DTYPE_F32);
  uint32_t *p = prompt(20 * T + 5, 8);
  put_bytes(h, 1, 20 * T, p, 8);
  ASSERT_OK(kvc_seq_remove(h, 1, 0, UINT64_MAX));
  put_bytes(h, 2, 64 * T, NULL, 99); /* the prompt's pages go to the test tier */
  ASSERT_OK(kvc_seq_remove(h, 2, 0, UINT64_MAX));
  ASSERT_U64_EQ(stat_get(c, "tier_writes_total{tier=testmem}", NULL), 20);
  ASSERT_U64_EQ(stat_get(c, "tier_errors_total{tier=testmem,kind=timeout}", NULL), 0);
  kvc_match_t m;
  ASSERT_OK(kvc_attach(h, 3, p, 20 * T + 5, false, &m)); /* waits 50 ms, then runs */
  ASSERT_U64_EQ(m.pages, 0);
  ASSERT_U64_EQ(stat_get(c, "tier_lookups_total{tier=testmem}", NULL), 1);
  ASSERT_U64_EQ(stat_get(c, "tier_errors_total{tier=testmem,kind=timeout}", NULL), 1);
  ASSERT_U64_EQ(match(h, p, 20 * T).pages, 0); /* asked again, let go again */
  ASSERT_U64_EQ(stat_get(c, "tier_errors_total{tier=testmem,kind=timeout}", NULL), 2);
  put_bytes(h, 4, 2 * T, NULL, 4); /* the connection serves the rest as ever */
  check_bytes(h, 4, 2 * T, 4);
  kvc_client_close(c);
  daemon_stop(&d);
  free(p);
}

/* A disk lookup let go at its deadline while its reads are in flight (the
 * first held by the test gate): the request runs without them; the reads,
 * orphaned, give their pool pages back as they end; the next attach reads
 * the prompt whole. The audit runs after every request. */
TEST(tier_disk_reads_past_the_deadline_give_their_pages_back) {
  char dir[64], gdir[IT_GATE_DIR], genv[300];
  tier_mkdir(dir, sizeof dir);
  it_gate_open(gdir, "KVCACHED_TEST_DISK_GATE", genv, sizeof genv);
  const char *args[] = {POOL, "--disk-dir", dir, "--tier-lookup-timeout-ms", "50", NULL};
  const char *env[] = {genv, NULL};
  daemon_t d;
  daemon_spawn(&d, NULL, args, env);
  daemon_wait_accepting(&d);
  kvc_client_t *c = client_open(&d);
  wait_loaded(c);
  kvc_cache_t *h = open_cache(c, "chat", KVC_DTYPE_F32);
  uint32_t *p = prompt(20 * T + 5, 9);
  spill(c, h, p, 20 * T, 9);
  uint64_t free0 = stat_get(c, "pages_free", NULL);
  kvc_match_t m;
  ASSERT_OK(kvc_attach(h, 3, p, 20 * T + 5, false, &m)); /* its first read is held */
  ASSERT_U64_EQ(m.pages, 0);
  ASSERT_U64_EQ(stat_get(c, "tier_errors_total{tier=disk,kind=timeout}", NULL), 1);
  ASSERT(stat_get(c, "pages_free", NULL) < free0); /* the reads hold pool pages */
  it_gate(gdir, "reached", false);
  it_gate(gdir, "go", true); /* the reads end, orphaned: their pages go back */
  it_wait_stat(c, "pages_free", free0, false);
  ASSERT_U64_EQ(stat_get(c, "tier_disk_hits_total", NULL), 0);
  ASSERT_OK(kvc_attach(h, 4, p, 20 * T + 5, false, &m));
  ASSERT_U64_EQ(m.pages, 20);
  check_bytes(h, 4, 20 * T, 9);
  ASSERT_U64_EQ(stat_get(c, "tier_disk_hits_total", NULL), 20);
  kvc_client_close(c);
  daemon_stop(&d);
  rm_rf(dir);
  it_gate_close(gdir);
  free(p);
}

TEST(tier_disk_bounded_least_recent_out) {
  char dir[64];
  tier_mkdir(dir, sizeof dir);
  daemon_t d;
  start_tier(&d, dir, "1MiB"); /* 51 page files */
  kvc_client_t *c = client_open(&d);
  kvc_cache_t *h = open_cache(c, "chat", KVC_DTYPE_F32);
  uint32_t *a = prompt(24 * T, 2), *b = prompt(24 * T, 3), *x = prompt(24 * T, 4);
  spill(c, h, a, 24 * T, 1);
  spill(c, h, b, 24 * T, 1);
  ASSERT_U64_EQ(match(h, a, 24 * T).pages, 24); /* a read back: used after b */
  spill(c, h, x, 24 * T, 1);                    /* a goes out again, already on disk */
  uint64_t bytes = stat_get(c, "tier_disk_bytes", NULL);
  ASSERT(bytes <= 1024 * 1024);
  ASSERT_U64_EQ(stat_get(c, "tier_disk_pages", NULL), bytes / FILE_BYTES);
  ASSERT(stat_get(c, "tier_disk_evicted_total", NULL) >= 72 - 51);
  /* The least recently used prompt (b) lost its tail; a and x are whole. */
  ASSERT_U64_EQ(match(h, x, 24 * T).pages, 24);
  ASSERT_U64_EQ(match(h, a, 24 * T).pages, 24);
  uint64_t got = match(h, b, 24 * T).pages;
  ASSERT(got > 0 && got < 24);
  kvc_client_close(c);
  daemon_stop(&d);
  char out[256];
  ASSERT_EQ(it_sh(out, sizeof out, "ls '%s' | grep -c kvp", dir), 0);
  ASSERT(strtoull(out, NULL, 10) <= 51); /* the files too */
  rm_rf(dir);
  free(a), free(b), free(x);
}

/* The tier at its bound, read back in order (issue 30): 64 prompts of 4 MiB
 * through a 64 MiB pool into a 128 MiB tier (or, full_fs, into a tier told
 * 1 GiB on a 32 MiB tmpfs: the bound falls to what the disk holds);
 * attaching them oldest first, each read-back evicts memory pages to the
 * tier, which at its bound drops its oldest files: the very files the read
 * is about to load. A read-back holds what it reads: every prompt still on
 * disk comes back whole and byte for byte (the daemon crashed attaching the
 * oldest on disk). */
static void read_back_at_the_bound(bool full_fs) {
  char dir[64];
  tier_mkdir(dir, sizeof dir);
  if (full_fs) {
    if (geteuid() != 0) TEST_SKIP("mounting a tmpfs needs root");
    if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("tmpfs", dir, "tmpfs", 0, "size=32m,mode=0700") != 0)
      TEST_SKIP("cannot mount a tmpfs here");
  }
  daemon_t d;
  const char *args[] = {"--pool-bytes", "64MiB", "--page-bytes", "256KiB", "--disk-dir", dir,
                        "--disk-bytes", full_fs ? "1GiB" : "128MiB", "--shm-default-bytes",
                        "8MiB", NULL};
  daemon_start_args(&d, args);
  kvc_client_t *c = client_open(&d);
  kvc_layout_t l = {.num_layers = 4, .num_kv_heads = 8, .head_dim_k = 32, .head_dim_v = 32,
                    .dtype = KVC_DTYPE_F32, .page_tokens = 16}; /* 256 KiB: one pool page */
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "chat", &l, &h));
  enum { N = 64, LEN = 256 }; /* 16 pages: 4 MiB a prompt */
  uint32_t *p[N];
  for (int i = 0; i < N; i++) {
    p[i] = prompt(LEN, 100 + (uint32_t)i);
    put_bytes(h, 1000 + (uint64_t)i, LEN, p[i], 1000 + (uint64_t)i);
    ASSERT_OK(kvc_seq_remove(h, 1000 + (uint64_t)i, 0, UINT64_MAX)); /* cached, then evicted */
  }
  /* Every page the pool reclaimed went to the tier: written, failed (the
   * full file system) or dropped. Attach once all are settled: a page still
   * being written is not read back, and under load the writes lag the puts
   * (the attaches then found nothing on disk: reads 0, 2 runs in 60). */
  /* The reclaims ran in the puts, which are all answered: the count is final. */
  static const char *const fates[] = {"tier_disk_writes_total", "tier_disk_write_errors_total",
                                      "tier_disk_spill_dropped_total"};
  uint64_t reclaimed = stat_get(c, "cached_reclaimed_total", NULL);
  ASSERT(reclaimed > 0);
  ASSERT_U64_EQ(it_wait_sum(c, fates, 3, reclaimed, false), reclaimed);
  ASSERT(stat_get(c, "tier_disk_writes_total", NULL) > 0);
  uint64_t whole = 0;
  for (int i = 0; i < N; i++) {
    kvc_match_t m;
    ASSERT_OK(kvc_attach(h, 2000 + (uint64_t)i, p[i], LEN, false, &m));
    if (m.tokens == LEN) {
      check_bytes(h, 2000 + (uint64_t)i, LEN, 1000 + (uint64_t)i);
      whole++;
    }
    ASSERT_OK(kvc_seq_remove(h, 2000 + (uint64_t)i, 0, UINT64_MAX));
  }
  ASSERT(whole > 0); /* some were on disk, and came back whole */
  ASSERT_OK(kvc_ping(c));
  ASSERT(stat_get(c, "tier_disk_reads_total", NULL) > 0);
  kvc_client_close(c);
  daemon_stop(&d);
  if (full_fs) ASSERT_EQ(umount(dir), 0);
  rm_rf(dir);
  for (int i = 0; i < N; i++) free(p[i]);
}

TEST(tier_read_back_at_the_bound_holds_what_it_reads) { read_back_at_the_bound(false); }
TEST(tier_read_back_on_a_full_disk_holds_what_it_reads) { read_back_at_the_bound(true); }

TEST(tier_disk_full_never_fails_a_put) {
  if (geteuid() != 0) TEST_SKIP("mounting a tmpfs needs root");
  char dir[64];
  tier_mkdir(dir, sizeof dir);
  /* 256 KiB hold 12 page files; the tier is told 64 MiB. The mount lives
   * in this test's own mount namespace (the daemon it forks shares it), so
   * it goes with the test however the test ends. */
  if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
      mount("tmpfs", dir, "tmpfs", 0, "size=256k,mode=0700") != 0)
    TEST_SKIP("cannot mount a tmpfs here");
  daemon_t d;
  start_tier(&d, dir, "64MiB");
  kvc_client_t *c = client_open(&d);
  kvc_cache_t *h = open_cache(c, "chat", KVC_DTYPE_F32);
  uint32_t *a = prompt(30 * T, 5), *b = prompt(8 * T, 6);
  uint64_t w0 = stat_get(c, "tier_disk_writes_total", NULL);
  put_bytes(h, 1, 30 * T, a, 1);
  ASSERT_OK(kvc_seq_remove(h, 1, 0, UINT64_MAX));
  put_bytes(h, 2, 64 * T, NULL, 99); /* every put succeeds, whatever the disk holds */
  ASSERT_OK(kvc_seq_remove(h, 2, 0, UINT64_MAX));
  /* Every one of a's 30 pages was written or failed; some failed. */
  uint64_t errs = 0;
  for (int i = 0; i < 1000; i++) {
    errs = stat_get(c, "tier_disk_write_errors_total", NULL);
    if (stat_get(c, "tier_disk_writes_total", NULL) - w0 + errs == 30) break;
    it_sleep_ms(10);
  }
  ASSERT_U64_EQ(stat_get(c, "tier_disk_writes_total", NULL) - w0 + errs, 30);
  ASSERT(errs > 0);
  ASSERT(stat_get(c, "tier_disk_bound_bytes", NULL) < 256 * 1024);
  /* The tier goes on within what the file system holds: b goes out and
   * comes back whole. */
  spill(c, h, b, 8 * T, 2);
  kvc_match_t m;
  ASSERT_OK(kvc_attach(h, 3, b, 8 * T, false, &m));
  ASSERT_U64_EQ(m.pages, 8);
  check_bytes(h, 3, 8 * T, 2);
  ASSERT(stat_get(c, "tier_disk_bytes", NULL) <= 256 * 1024);
  kvc_client_close(c);
  daemon_stop(&d);
  ASSERT_EQ(umount(dir), 0);
  rm_rf(dir);
  free(a), free(b);
}

TEST(tier_warm_restart_first_match_hits) {
  char dir[64];
  tier_mkdir(dir, sizeof dir);
  daemon_t d;
  uint32_t *p = prompt(12 * T, 7);
  start_tier(&d, dir, "64MiB");
  kvc_client_t *c = client_open(&d);
  kvc_cache_t *h = open_cache(c, "chat", KVC_DTYPE_F32);
  put_bytes(h, 1, 12 * T, p, 3); /* resident, held by seq 1: nothing spilled */
  ASSERT_U64_EQ(stat_get(c, "tier_disk_writes_total", NULL), 0);
  kvc_client_close(c);
  daemon_stop(&d); /* the drain persists the index */
  start_tier(&d, dir, "64MiB");
  c = client_open(&d);
  wait_loaded(c);
  ASSERT_U64_EQ(stat_get(c, "tier_disk_loaded", NULL), 12);
  h = open_cache(c, "chat", KVC_DTYPE_F32);
  kvc_match_t m;
  ASSERT_OK(kvc_attach(h, 5, p, 12 * T, false, &m)); /* the first request that looks */
  ASSERT_U64_EQ(m.pages, 12);
  check_bytes(h, 5, 12 * T, 3);
  ASSERT_U64_EQ(stat_get(c, "tier_disk_reads_total", NULL), 12); /* the figures doc/tiers.md gives */
  ASSERT_U64_EQ(stat_get(c, "tier_disk_hits_total", NULL), 12);
  kvc_client_close(c);
  daemon_stop(&d);
  rm_rf(dir);
  free(p);
}

/* Under systemd (Type=notify) a clean stop that writes the tier tells
 * systemd it goes on (EXTEND_TIMEOUT_USEC, with the figures in STATUS=),
 * so TimeoutStopSec bounds a stop that hangs, not one that writes a large
 * pool. A datagram socket stands in for systemd's. */
TEST(tier_clean_stop_extends_systemd_stop_timeout) {
  char dir[64], addr[100], env[200], buf[1024];
  tier_mkdir(dir, sizeof dir);
  snprintf(addr, sizeof addr, "%s-notify", dir);
  int nfd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT(nfd >= 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", addr);
  ASSERT_EQ(bind(nfd, (struct sockaddr *)&sa, sizeof sa), 0);
  struct timeval tv = {20, 0};
  setsockopt(nfd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  snprintf(env, sizeof env, "NOTIFY_SOCKET=%s", addr);
  const char *const envs[] = {env, NULL};
  const char *const args[] = {POOL, "--disk-dir", dir, "--disk-bytes", "64MiB", NULL};
  daemon_t d;
  daemon_start_full(&d, NULL, args, envs);
  uint32_t *p = prompt(12 * T, 9);
  kvc_client_t *c = client_open(&d);
  put_bytes(open_cache(c, "chat", KVC_DTYPE_F32), 1, 12 * T, p, 3); /* 12 pages to write */
  kvc_client_close(c);
  ASSERT_EQ(kill(d.pid, SIGTERM), 0);
  bool stopping = false, extended = false;
  while (!extended) {
    ssize_t n = recv(nfd, buf, sizeof buf - 1, 0);
    if (n < 0) TEST_FAIL_("no EXTEND_TIMEOUT_USEC= from the stop (stopping: %d)", stopping);
    buf[n] = '\0';
    stopping |= strncmp(buf, "STOPPING=1", 10) == 0;
    extended = strncmp(buf, "EXTEND_TIMEOUT_USEC=", 20) == 0;
  }
  ASSERT(stopping); /* the drain first, then the tier */
  ASSERT(strtoull(buf + 20, NULL, 10) >= 10000000u);
  ASSERT(strstr(buf, "\nSTATUS=stopping: writing the disk tier") != NULL);
  int st;
  ASSERT_EQ(waitpid(d.pid, &st, 0), d.pid);
  ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  ASSERT(it_log_has(&d, "tier_persisted") && it_log_has(&d, "pages_written=12"));
  close(nfd);
  unlink(addr);
  rm_rf(d.dir);
  rm_rf(dir);
  free(p);
}

/* ---- files that must never be served ----------------------------------------- */

static void read_file(const char *path, uint8_t **buf, size_t *len) {
  FILE *f = fopen(path, "rb");
  ASSERT(f != NULL);
  ASSERT(fseek(f, 0, SEEK_END) == 0);
  long n = ftell(f);
  ASSERT(n > 0);
  rewind(f);
  *buf = malloc((size_t)n);
  ASSERT(*buf && fread(*buf, 1, (size_t)n, f) == (size_t)n);
  fclose(f);
  *len = (size_t)n;
}

static void write_bytes(const char *path, const uint8_t *buf, size_t len) {
  FILE *f = fopen(path, "wb");
  ASSERT(f != NULL);
  ASSERT(fwrite(buf, 1, len, f) == len);
  ASSERT(fclose(f) == 0);
}

/* The page files of dir's chain whose head holds the ids head_ids, in chain
 * order, by the hashes their headers name. */
static size_t chain_files(const char *dir, const uint32_t *head_ids, char names[][160],
                          size_t cap) {
  char out[65536];
  ASSERT_EQ(it_sh(out, sizeof out, "ls '%s' | grep 'kvp$'", dir), 0);
  size_t n = 0;
  uint8_t hashes[64][32], parents[64][32];
  bool head[64];
  char all[64][160];
  for (char *save = NULL, *l = strtok_r(out, "\n", &save); l && n < 64; l = strtok_r(NULL, "\n", &save)) {
    char path[160];
    snprintf(path, sizeof path, "%s/%s", dir, l);
    uint8_t *buf;
    size_t len;
    read_file(path, &buf, &len);
    diskfmt_info_t info;
    const char *why;
    ASSERT_EQ(diskfmt_decode(buf, len, &info, &why), 0);
    memcpy(hashes[n], info.m.hash, 32);
    memcpy(parents[n], info.m.parent, 32);
    head[n] = info.m.head && memcmp(info.m.tokens, head_ids, T * 4) == 0;
    snprintf(all[n], sizeof all[n], "%s", path);
    free(buf);
    n++;
  }
  size_t k = 0;
  const uint8_t *want = NULL;
  while (k < cap) {
    size_t i = 0;
    while (i < n && !(want ? memcmp(parents[i], want, 32) == 0 : head[i])) i++;
    if (i == n) break;
    snprintf(names[k++], 160, "%s", all[i]);
    want = hashes[i];
  }
  return k;
}

/* Rewrites a file's header through fn, with a valid header checksum: only
 * what fn changed is wrong. */
static void forge(const char *path, void (*fn)(diskfmt_info_t *, char *tenant)) {
  uint8_t *buf;
  size_t len;
  read_file(path, &buf, &len);
  diskfmt_info_t info;
  const char *why;
  ASSERT_EQ(diskfmt_decode(buf, len, &info, &why), 0);
  uint32_t ids[T];
  memcpy(ids, info.m.tokens, sizeof ids);
  info.m.tokens = ids;
  char tenant[DISKFMT_TENANT_MAX];
  memcpy(tenant, info.tenant, sizeof tenant);
  fn(&info, tenant);
  uint8_t *data = buf + info.header_bytes;
  diskfmt_encode(&info.m, tenant, data, buf);
  write_bytes(path, buf, len);
  free(buf);
}

static void other_tenant_name(diskfmt_info_t *i, char *tenant) {
  (void)i;
  snprintf(tenant, DISKFMT_TENANT_MAX, "uid:%u", UID_OTHER);
}

static void other_layout(diskfmt_info_t *i, char *tenant) {
  (void)tenant;
  i->m.layout.head_dim_v = 16; /* a page of another layout, same sizes */
}

TEST(tier_restart_keeps_what_verifies_and_serves_nothing_else) {
  char dir[64], files[24][160], path[160];
  tier_mkdir(dir, sizeof dir);
  daemon_t d;
  uint32_t *p = prompt(16 * T, 8), *q = prompt(8 * T, 9);
  start_tier(&d, dir, "64MiB");
  kvc_client_t *c = client_open(&d);
  kvc_cache_t *h = open_cache(c, "chat", KVC_DTYPE_F32);
  spill(c, h, p, 16 * T, 4);
  /* SIGKILL while q's pages are being written: whatever is on disk after
   * it must verify or go. */
  put_bytes(h, 1, 8 * T, q, 5);
  ASSERT_OK(kvc_seq_remove(h, 1, 0, UINT64_MAX));
  put_bytes(h, 2, 64 * T, NULL, 99);
  ASSERT(kill(d.pid, SIGKILL) == 0);
  int st;
  ASSERT(waitpid(d.pid, &st, 0) == d.pid);
  kvc_client_close(c);
  rm_rf(d.dir);
  ASSERT_EQ(chain_files(dir, p, files, 24), 16);
  /* Damage p's chain at pages 10..15, one way each. */
  ASSERT(truncate(files[15], FILE_BYTES - 100) == 0);  /* torn: cut short */
  uint8_t *buf;
  size_t len;
  read_file(files[14], &buf, &len);
  buf[len - 7] ^= 0x40;                                /* corrupt data */
  write_bytes(files[14], buf, len);
  free(buf);
  read_file(files[13], &buf, &len);
  buf[520] ^= 1;                                       /* corrupt header (an id) */
  write_bytes(files[13], buf, len);
  free(buf);
  read_file(files[12], &buf, &len);
  buf[8] = 2;                                          /* another format version */
  write_bytes(files[12], buf, len);
  free(buf);
  forge(files[11], other_layout);
  forge(files[10], other_tenant_name);
  snprintf(path, sizeof path, "%s/tmp/leftover.kvp", dir); /* a write a crash cut short */
  write_bytes(path, (const uint8_t *)"x", 1);
  start_tier(&d, dir, "64MiB");
  c = client_open(&d);
  wait_loaded(c);
  ASSERT(stat_get(c, "tier_disk_discarded_total", NULL) >= 3); /* torn, header, version */
  ASSERT_EQ(access(path, F_OK), -1);
  h = open_cache(c, "chat", KVC_DTYPE_F32);
  /* Pages 0..9 verify; page 10 names another tenant, 11 another layout,
   * 14 has bad data: none of them, nor anything after them, is served. */
  kvc_match_t m;
  ASSERT_OK(kvc_attach(h, 3, p, 16 * T, false, &m));
  ASSERT_U64_EQ(m.pages, 10);
  check_bytes(h, 3, 10 * T, 4);
  ASSERT_U64_EQ(match(h, p, 16 * T).pages, 10); /* and asking again changes nothing */
  ASSERT(stat_get(c, "tier_disk_discarded_total", NULL) >= 4);
  /* Whatever of q survived the SIGKILL is q's, byte for byte. */
  ASSERT_OK(kvc_attach(h, 4, q, 8 * T, false, &m));
  if (m.pages) check_bytes(h, 4, m.pages * T, 5);
  kvc_client_close(c);
  daemon_stop(&d);
  rm_rf(dir);
  free(p), free(q);
}

/* The registry lost, the next new tenant gets the number another tenant's
 * pages were hashed under (the same chain seed for the same cache name and
 * layout): the pages name their tenant, so they are refused, never served. */
#define UID_OTHER2 64012u

static void as_uid(uid_t uid) {
  if (setgroups(0, NULL) != 0 || setresgid(uid, uid, uid) != 0 || setresuid(uid, uid, uid) != 0)
    _exit(90);
}

/* In a child as uid: writes (seq 1) or attaches (seq 2) prompt p; exits 0
 * when the attach found want pages (writing: always). */
static int tenant_run(const daemon_t *d, uid_t uid, bool write, uint64_t want) {
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    as_uid(uid);
    uint32_t *p = prompt(6 * T, 10);
    kvc_client_t *c = client_open(d);
    kvc_cache_t *h = open_cache(c, "chat", KVC_DTYPE_F32);
    kvc_match_t m = {0, 0, 0};
    if (write) put_bytes(h, 1, 6 * T, p, 6);
    else if (kvc_attach(h, 2, p, 6 * T, false, &m) != 0) _exit(3);
    kvc_client_close(c);
    _exit(write || m.pages == want ? 0 : 4);
  }
  int st;
  ASSERT(waitpid(pid, &st, 0) == pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void start_shared(daemon_t *d, const char *dir) {
  const char *args[] = {POOL, "--disk-dir", dir, "--allow-uids", "self,root,64011,64012",
                        "--socket-mode", "0666", NULL};
  daemon_start_args(d, args);
  ASSERT_EQ(chmod(d->dir, 0755), 0);
}

TEST(tier_page_of_another_tenant_never_served) {
  if (geteuid() != 0) TEST_SKIP("other uids need root");
  char dir[64], path[160];
  tier_mkdir(dir, sizeof dir);
  daemon_t d;
  start_shared(&d, dir); /* root is tenant 1 (the harness connects first) */
  ASSERT_EQ(tenant_run(&d, UID_OTHER, true, 0), 0); /* tenant 2 writes */
  ASSERT_EQ(tenant_run(&d, UID_OTHER, false, 6), 0);
  daemon_stop(&d); /* persisted */
  snprintf(path, sizeof path, "%s/tenants", dir);
  ASSERT_EQ(unlink(path), 0);
  start_shared(&d, dir);
  kvc_client_t *c = client_open(&d);
  wait_loaded(c);
  ASSERT_U64_EQ(stat_get(c, "tier_disk_loaded", NULL), 6);
  ASSERT_EQ(tenant_run(&d, UID_OTHER2, false, 0), 0); /* now tenant 2: nothing */
  /* Its prompts hash under its own identity (its name, doc/prefix.md), not
   * its number: the files of the tenant that had that number are not even
   * read (were one read, its name would not be this tenant's: discarded). */
  ASSERT_U64_EQ(stat_get(c, "tier_disk_reads_total", NULL), 0);
  ASSERT_U64_EQ(stat_get(c, "tier_disk_hits_total", NULL), 0);
  kvc_client_close(c);
  daemon_stop(&d);
  rm_rf(dir);
}

/* Pages of the compact formats go to disk and come back as they were put:
 * fp8 codes and q8_0 / q4_0 blocks as given (any bytes, NaN codes and
 * scales too), each cache's layout (its dtype) part of what a page file
 * must match. */
TEST(tier_fp8_and_block_pages_come_back_bit_exact) {
  static const kvc_dtype_t dts[3] = {KVC_DTYPE_FP8_E4M3, KVC_DTYPE_Q8_0, KVC_DTYPE_Q4_0};
  static const size_t head_bytes[3] = {32, 34, 18}; /* a 32-value head row */
  char dir[64];
  tier_mkdir(dir, sizeof dir);
  daemon_t d;
  start_tier(&d, dir, "64MiB");
  kvc_client_t *c = client_open(&d);
  uint32_t *p = prompt(8 * T, 7);
  for (int i = 0; i < 3; i++) {
    char name[16];
    snprintf(name, sizeof name, "c%d", (int)dts[i]);
    kvc_cache_t *h = open_cache(c, name, dts[i]);
    size_t tok = 2 * 2 * head_bytes[i], n = 8 * T; /* K (= V) bytes of a token */
    uint8_t *k = malloc(tok * 64 * T), *v = malloc(tok * 64 * T), *gk = malloc(tok * n),
            *gv = malloc(tok * n);
    ASSERT(k && v && gk && gv);
    for (size_t j = 0; j < tok * 64 * T; j++) k[j] = (uint8_t)(j * 7 + i), v[j] = (uint8_t)(j * 13);
    uint64_t writes = stat_get(c, "tier_disk_writes_total", NULL);
    ASSERT_OK(kvc_put_tokens(h, 1, 0, n, k, v, p));
    ASSERT_OK(kvc_seq_remove(h, 1, 0, UINT64_MAX));
    ASSERT_OK(kvc_put(h, 2, 0, 64 * T, k, v)); /* the pool's 64 pages: the prompt's out */
    ASSERT_OK(kvc_seq_remove(h, 2, 0, UINT64_MAX));
    wait_stat(c, "tier_disk_writes_total", writes + 8);
    kvc_match_t m;
    uint64_t reads = stat_get(c, "tier_disk_reads_total", NULL);
    ASSERT_OK(kvc_attach(h, 3, p, n, false, &m));
    ASSERT_U64_EQ(m.tokens, n);
    ASSERT_U64_EQ(stat_get(c, "tier_disk_reads_total", NULL), reads + 8); /* from disk */
    ASSERT_OK(kvc_get(h, 3, 0, n, gk, gv));
    ASSERT_MEM_EQ(gk, k, tok * n);
    ASSERT_MEM_EQ(gv, v, tok * n);
    ASSERT_OK(kvc_cache_drop(h));
    kvc_cache_close(h);
    free(k), free(v), free(gk), free(gv);
  }
  kvc_client_close(c);
  daemon_stop(&d);
  rm_rf(dir);
  free(p);
}

/* ---- the tier at its bound: a read-back holds what it reads ------------------ */

/* Issue 30's numbers: a pool of 64 MiB in pages of 256 KiB (256 pages),
 * prompts of 256 tokens of 4 layers f32 in 16-token pages (a page 256 KiB,
 * a prompt 4 MiB, 16 pages): memory holds 16 prompts. */
#define BIG_TOKENS 256u
#define BIG_PAGES (BIG_TOKENS / T)
#define BIG_POOL "--pool-bytes", "64MiB", "--page-bytes", "256KiB"

static kvc_cache_t *open_big(kvc_client_t *c) {
  kvc_layout_t l = {.num_layers = 4, .num_kv_heads = 4, .head_dim_k = 128, .head_dim_v = 128,
                    .dtype = KVC_DTYPE_F32, .page_tokens = T};
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "big", &l, &h));
  return h;
}

/* Puts prompts [0, n) with their ids (prompt i: seed 1000 + i, the bytes
 * of seq i + 1), each left cached; after each, waits until every page it
 * evicted was written or failed (so that no write waits long enough to be
 * dropped: that is another test). */
static void put_prompts(kvc_client_t *c, kvc_cache_t *h, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) {
    uint32_t *p = prompt(BIG_TOKENS, 1000 + i);
    put_bytes(h, i + 1, BIG_TOKENS, p, i + 1);
    ASSERT_OK(kvc_seq_remove(h, i + 1, 0, UINT64_MAX));
    free(p);
    uint64_t spilled = stat_get(c, "cached_reclaimed_total", NULL), end = it_mono_ms() + IT_WAIT_MS;
    while (stat_get(c, "tier_disk_writes_total", NULL) +
           stat_get(c, "tier_disk_write_errors_total", NULL) < spilled) {
      if (it_mono_ms() > end) TEST_FAIL_("the writes of prompt %u did not end", i);
      it_sleep_ms(1);
    }
  }
  ASSERT_U64_EQ(stat_get(c, "tier_disk_spill_dropped_total", NULL), 0);
}

/* Attaches prompt i as seq 10000 + i, checks the pages it got are prompt
 * i's byte for byte, removes the seq; returns the pages. */
static uint64_t attach_prompt(kvc_cache_t *h, uint32_t i) {
  uint32_t *p = prompt(BIG_TOKENS, 1000 + i);
  kvc_match_t m;
  ASSERT_OK(kvc_attach(h, 10000 + i, p, BIG_TOKENS, false, &m));
  ASSERT(m.pages <= BIG_PAGES);
  if (m.pages) check_bytes(h, 10000 + i, m.pages * T, i + 1);
  ASSERT_OK(kvc_seq_remove(h, 10000 + i, 0, UINT64_MAX));
  free(p);
  return m.pages;
}

/* A 128 MiB tier holds 31.5 prompts of 64 put: 16 in memory, prompts 17
 * to 47 on disk and the head half of 16 (the tier takes a chain's tail
 * first: eviction spills it first). Reading 16 back evicts memory pages,
 * whose spill makes room from the least recent files: the ones this read
 * takes (the daemon died of SIGSEGV there). Each read then costs the next
 * prompt its tail half, and 48 to 63, pushed to disk by those reads, come
 * back whole. */
TEST(tier_at_its_bound_reads_back_the_oldest) {
  char dir[64];
  tier_mkdir(dir, sizeof dir);
  daemon_t d;
  const char *args[] = {BIG_POOL, "--disk-dir", dir, "--disk-bytes", "128MiB", NULL};
  daemon_start_args(&d, args);
  kvc_client_t *c = client_open(&d);
  kvc_cache_t *h = open_big(c);
  put_prompts(c, h, 64);
  ASSERT_U64_EQ(stat_get(c, "tier_disk_pages", NULL), 31 * BIG_PAGES + BIG_PAGES / 2);
  for (uint32_t i = 0; i < 16; i++) ASSERT_U64_EQ(attach_prompt(h, i), 0);
  for (uint32_t i = 16; i < 48; i++) ASSERT_U64_EQ(attach_prompt(h, i), BIG_PAGES / 2);
  /* 48 to 63 went to disk during those reads: once written they are read. */
  it_wait_stat(c, "tier_disk_writes_total", 64 * BIG_PAGES, true);
  for (uint32_t i = 48; i < 64; i++) ASSERT_U64_EQ(attach_prompt(h, i), BIG_PAGES);
  ASSERT_U64_EQ(stat_get(c, "tier_disk_hits_total", NULL), 32 * BIG_PAGES / 2 + 16 * BIG_PAGES);
  ASSERT_U64_EQ(stat_get(c, "tier_disk_reads_total", NULL), 32 * BIG_PAGES / 2 + 16 * BIG_PAGES);
  ASSERT_U64_EQ(stat_get(c, "tier_disk_discarded_total", NULL), 0);
  ASSERT(stat_get(c, "tier_disk_bytes", NULL) <= 128u << 20);
  kvc_client_close(c);
  daemon_stop(&d); /* alive, exit 0, no sanitizer report */
  rm_rf(dir);
}

/* The same on a full file system: a 32 MiB tmpfs under a tier told 1 GiB,
 * 512 MiB of prompts. Writes fail (ENOSPC), the tier keeps to what the file
 * system holds, puts never fail, and what is on disk is read back whole
 * (the first read-back killed the daemon). */
TEST(tier_disk_full_reads_back) {
  if (geteuid() != 0) TEST_SKIP("mounting a tmpfs needs root");
  char dir[64];
  tier_mkdir(dir, sizeof dir);
  if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
      mount("tmpfs", dir, "tmpfs", 0, "size=32m,mode=0700") != 0)
    TEST_SKIP("cannot mount a tmpfs here");
  daemon_t d;
  const char *args[] = {BIG_POOL, "--disk-dir", dir, "--disk-bytes", "1GiB", NULL};
  daemon_start_args(&d, args);
  kvc_client_t *c = client_open(&d);
  kvc_cache_t *h = open_big(c);
  put_prompts(c, h, 128);
  ASSERT(stat_get(c, "tier_disk_write_errors_total", NULL) > 0);
  ASSERT(it_log_has(&d, "event=tier_disk_full"));
  uint64_t bound = stat_get(c, "tier_disk_bound_bytes", NULL);
  ASSERT(bound <= 32u << 20 && bound >= 16u << 20); /* what the file system held */
  /* On disk: what the file system held of the last prompts evicted (a
   * write that failed leaves a hole); 112 to 127 in memory. What each
   * attach gets is its own, byte for byte, and the first prompt that gets
   * any is one read back from disk (the read that killed the daemon). */
  uint64_t ondisk = stat_get(c, "tier_disk_pages", NULL);
  ASSERT(ondisk >= 4 * BIG_PAGES && ondisk <= 8 * BIG_PAGES);
  uint32_t first = UINT32_MAX;
  for (uint32_t i = 0; i < 128; i++)
    if (attach_prompt(h, i) && first == UINT32_MAX) first = i;
  ASSERT(first >= 112 - 16 && first < 112); /* 64 MiB spilled after 95 on 32 MiB */
  uint64_t hits = stat_get(c, "tier_disk_hits_total", NULL);
  ASSERT(hits > 0);
  ASSERT_U64_EQ(stat_get(c, "tier_disk_reads_total", NULL), hits);
  ASSERT_U64_EQ(stat_get(c, "tier_disk_discarded_total", NULL), 0);
  ASSERT(stat_get(c, "tier_disk_bytes", NULL) <= bound);
  kvc_client_close(c);
  daemon_stop(&d);
  ASSERT_EQ(umount(dir), 0);
  rm_rf(dir);
}

/* ---- a burst past the spill queue: what is dropped is chains' tails ---------- */

/* A shrink evicts 96 MiB of cached prompts in one call, more than the 64
 * MiB of writes that may wait: some pages are dropped. Eviction spills a
 * chain's tail first; dropping whatever came last dropped the heads, and
 * every page written of those chains was unreachable. The pages written
 * must be a head part of their chains: every one is read back (a disk
 * slower than eviction drops the same way, steadily: doc/tiers.md). */
TEST(tier_spill_burst_drops_chain_tails) {
  char dir[64];
  tier_mkdir(dir, sizeof dir);
  daemon_t d;
  const char *args[] = {BIG_POOL, "--disk-dir", dir, "--disk-bytes", "1GiB", NULL};
  daemon_start_args(&d, args);
  kvc_client_t *c = client_open(&d);
  ASSERT_OK(kvc_pool_resize(c, 192u << 20, NULL)); /* 768 pages */
  kvc_cache_t *h = open_big(c);
  put_prompts(c, h, 40);                           /* 640 pages: nothing evicted */
  ASSERT_U64_EQ(stat_get(c, "cached_reclaimed_total", NULL), 0);
  kvc_pool_resize_t r;
  ASSERT_OK(kvc_pool_resize(c, 64u << 20, &r));     /* 384 pages out at once */
  uint64_t spilled = stat_get(c, "cached_reclaimed_total", NULL);
  ASSERT_U64_EQ(spilled, 24 * BIG_PAGES);
  uint64_t end = it_mono_ms() + IT_WAIT_MS, written, dropped;
  for (;;) {
    written = stat_get(c, "tier_disk_writes_total", NULL);
    dropped = stat_get(c, "tier_disk_spill_dropped_total", NULL);
    if (written + dropped == spilled) break;
    ASSERT(it_mono_ms() < end);
    it_sleep_ms(1);
  }
  ASSERT(dropped > 0 && written > 0);
  /* Prompts 0 to 23 are on disk alone: what they attach was written. */
  uint64_t reached = 0, heads = 0;
  for (uint32_t i = 0; i < 24; i++) {
    uint64_t pages = attach_prompt(h, i);
    reached += pages;
    heads += pages > 0;
  }
  ASSERT_U64_EQ(reached, written);
  ASSERT_U64_EQ(heads, (written + BIG_PAGES - 1) / BIG_PAGES); /* whole prompts, but one */
  kvc_client_close(c);
  daemon_stop(&d);
  rm_rf(dir);
}

/* ---- the names doc/tiers.md gives ------------------------------------------- */

/* Every `tier_...` name doc/tiers.md gives is real: a figure the daemon
 * exports, an option of its configuration (its event=config line) or a log
 * event of daemon/tiers/disk/disk.c (the document named a figure that existed
 * nowhere). */
TEST(tier_doc_names_exist) {
  char path[512], dir[64];
  uint8_t *doc, *src, *log;
  size_t dlen, slen, llen;
  snprintf(path, sizeof path, "%s/doc/tiers.md", it_srcdir());
  read_file(path, &doc, &dlen);
  snprintf(path, sizeof path, "%s/daemon/tiers/disk/disk.c", it_srcdir());
  read_file(path, &src, &slen);
  doc = realloc(doc, dlen + 1), src = realloc(src, slen + 1);
  ASSERT(doc && src);
  doc[dlen] = src[slen] = '\0';
  tier_mkdir(dir, sizeof dir);
  daemon_t d;
  start_tier(&d, dir, "64MiB");
  kvc_client_t *c = client_open(&d);
  kvc_stat_t *st;
  size_t n;
  ASSERT_OK(kvc_stats(c, &st, &n));
  read_file(d.log, &log, &llen);
  log = realloc(log, llen + 1);
  ASSERT(log != NULL);
  log[llen] = '\0';
  const char *config = strstr((char *)log, "event=config ");
  ASSERT(config != NULL);
  const char *config_end = strchr(config, '\n');
  int checked = 0, missing = 0;
  for (char *a = strchr((char *)doc, '`'), *b; a && (b = strchr(a + 1, '`')); a = strchr(b + 1, '`')) {
    char name[128], needle[140];
    size_t len = (size_t)(b - a - 1);
    bool ours = strncmp(a + 1, "tier_", 5) == 0 || strncmp(a + 1, "disk_", 5) == 0;
    if (len >= sizeof name || !ours ||
        strspn(a + 1, "abcdefghijklmnopqrstuvwxyz0123456789_") != len)
      continue;
    snprintf(name, sizeof name, "%.*s", (int)len, a + 1);
    checked++;
    bool found = false;
    for (size_t i = 0; i < n && !found; i++) found = strcmp(st[i].name, name) == 0;
    snprintf(needle, sizeof needle, " %s=", name);
    const char *opt = strstr(config, needle);
    found |= opt && (!config_end || opt < config_end);
    snprintf(needle, sizeof needle, "\"%s\"", name);
    found |= strstr((char *)src, needle) != NULL;
    if (!found) fprintf(stderr, "doc/tiers.md names `%s`: no figure, option or log event\n", name);
    missing += !found;
  }
  ASSERT(checked >= 15); /* the parse found what the document holds */
  ASSERT_EQ(missing, 0);
  kvc_stats_free(st);
  free(doc), free(src), free(log);
  kvc_client_close(c);
  daemon_stop(&d);
  rm_rf(dir);
}
