/* resize.c: the pool resized online on a real daemon (doc/tiers.md): up and
 * down while a worker that maps the pool puts, gets and leases with every
 * byte it reads verified; a shrink refused while pinned data would be lost,
 * and done once it would not, the pinned bytes moved intact; a resize by
 * reload; the huge-page figure saying what backs the pool. */
#include <poll.h>

#include "harness.h"

#define T 16u                 /* page_tokens of it_layout: a 16 KiB page */
#define SEQ_TOKENS (16u * T)  /* 16 pages a sequence */
#define MAX_SEQS 64u

static kvc_cache_t *open_cache(kvc_client_t *c) {
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "resize", &l, &h));
  return h;
}

static void put_seq(kvc_cache_t *h, uint64_t seq, uint64_t n, uint32_t salt) {
  const kvc_layout_t *l = kvc_cache_layout(h);
  float *k = calloc(it_tok_floats(l, false) * n, 4), *v = calloc(it_tok_floats(l, true) * n, 4);
  ASSERT(k && v);
  it_fill_f32(k, v, l, seq, 0, n, salt);
  ASSERT_OK(kvc_put(h, seq, 0, n, k, v));
  free(k), free(v);
}

/* Reads [0, n) of seq: 1 when it holds exactly salt's bytes, 0 when it is
 * gone (evicted); anything else fails the test. */
static int get_seq(kvc_cache_t *h, uint64_t seq, uint64_t n, uint32_t salt) {
  const kvc_layout_t *l = kvc_cache_layout(h);
  size_t kn = it_tok_floats(l, false) * n, vn = it_tok_floats(l, true) * n;
  float *k = calloc(kn, 4), *v = calloc(vn, 4), *gk = calloc(kn, 4), *gv = calloc(vn, 4);
  ASSERT(k && v && gk && gv);
  it_fill_f32(k, v, l, seq, 0, n, salt);
  int rc = kvc_get(h, seq, 0, n, gk, gv);
  if (rc == 0) {
    ASSERT_MEM_EQ(gk, k, kn * 4);
    ASSERT_MEM_EQ(gv, v, vn * 4);
  } else if (rc != KVC_E_NOSEQ) {
    TEST_FAIL_("get seq %llu: %s", (unsigned long long)seq, kvc_err_name(rc));
  }
  free(k), free(v), free(gk), free(gv);
  return rc == 0;
}

/* Leases token 0..T of seq and checks layer 0's K row of each token in
 * place, in the pool mapping; returns the page's address (or NULL: gone). */
static const void *lease_check(kvc_cache_t *h, uint64_t seq, uint32_t salt) {
  const kvc_layout_t *l = kvc_cache_layout(h);
  kvc_lease_t *ls;
  int rc = kvc_lease(h, seq, SEQ_TOKENS - T, SEQ_TOKENS, &ls);
  if (rc == KVC_E_NOSEQ) return NULL;
  ASSERT_OK(rc);
  size_t kn = it_tok_floats(l, false) * SEQ_TOKENS, vn = it_tok_floats(l, true) * SEQ_TOKENS;
  float *k = calloc(kn, 4), *v = calloc(vn, 4);
  ASSERT(k && v);
  it_fill_f32(k, v, l, seq, 0, SEQ_TOKENS, salt);
  size_t row = (size_t)l->num_kv_heads * l->head_dim_k;
  for (uint64_t p = SEQ_TOKENS - T; p < SEQ_TOKENS; p++)
    ASSERT_MEM_EQ(kvc_lease_k(ls, 0, p), k + p * row, row * 4); /* layer 0 comes first */
  const void *page = kvc_lease_k(ls, 0, SEQ_TOKENS - T);
  ASSERT_OK(kvc_lease_release(ls));
  free(k), free(v);
  return page;
}

/* ---- under load ------------------------------------------------------------- */

typedef struct worker {
  const daemon_t *d;
  int progress[2]; /* a byte a round, to the test */
  int stop[2];     /* closed by the test: verify everything and exit */
} worker_t;

static bool told_to_stop(int fd) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  return poll(&p, 1, 0) == 1;
}

/* Keeps about half the pool in sequences of 16 pages (the half grows and
 * shrinks with the pool), rewriting one a round, reading and leasing the
 * others: every byte read is the bytes last written, or the sequence is
 * gone (evicted to make room, as a shrink may). */
static void worker_main(worker_t *w) {
  close(w->progress[0]);
  close(w->stop[1]);
  kvc_client_t *c = client_open_shm(w->d, 8u << 20);
  kvc_cache_t *h = open_cache(c);
  uint32_t salt[MAX_SEQS] = {0};
  bool held[MAX_SEQS] = {false};
  const volatile uint8_t *far = NULL; /* a page seen in a grown segment */
  for (uint32_t round = 1; !told_to_stop(w->stop[0]); round++) {
    uint64_t pages = stat_get(c, "pool_pages", NULL);
    uint32_t nseq = (uint32_t)(pages / 2 / 16);
    if (nseq > MAX_SEQS) nseq = MAX_SEQS;
    uint32_t s = round % nseq;
    put_seq(h, s + 1, SEQ_TOKENS, salt[s] = round);
    held[s] = true;
    for (uint32_t k = 1; k <= 4; k++) { /* four others a round, in turn */
      uint32_t i = (s + k * 7) % nseq;
      if (!held[i]) continue;
      if (!get_seq(h, i + 1, SEQ_TOKENS, salt[i]) ) {
        held[i] = false;
        continue;
      }
      const uint8_t *page = lease_check(h, i + 1, salt[i]);
      const void *base;
      uint64_t mapped;
      kvc_client_pool(c, &base, &mapped);
      if (page && (uint64_t)(page - (const uint8_t *)base) >= (4u << 20) && !far)
        far = page; /* past the first segment (4 MiB): a grown one, read in place */
    }
    if (write(w->progress[1], "r", 1) != 1) _exit(5);
  }
  /* Everything still held is what was last written. */
  for (uint32_t i = 0; i < MAX_SEQS; i++)
    if (held[i]) (void)get_seq(h, i + 1, SEQ_TOKENS, salt[i]);
  /* Leases reached the grown segments, and a pointer into one the pool
   * released since reads without a fault (the old bytes, or zeros once this
   * client mapped the pool again at its next lease). */
  if (!far) _exit(6);
  (void)lease_check(h, 1, salt[0]);
  volatile uint8_t sink = far[0];
  (void)sink;
  kvc_client_close(c);
  _exit(0);
}

static void wait_rounds(int fd, int n) {
  for (int i = 0; i < n; i++) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 30000) != 1) TEST_FAIL_("the worker stopped making progress");
    char ch;
    if (read(fd, &ch, 1) != 1) TEST_FAIL_("the worker is gone");
  }
}

static void resize(const daemon_t *d, const char *size) {
  char out[1024];
  int st = ctl_run(d, out, sizeof out, true, "pool resize %s", size);
  if (st != 0) TEST_FAIL_("kvcachectl pool resize %s: exit %d: %s", size, st, out);
  /* "pool: 48.0 MiB in 3 segments (...)": the size in units, not bytes */
  if (strncmp(out, "pool: ", 6) != 0 || !strstr(out, "iB in "))
    TEST_FAIL_("kvcachectl pool resize %s said: %s", size, out);
}

TEST_TIMEOUT(resize_up_and_down_under_load_every_byte_verified, 120) {
  daemon_t d;
  const char *args[] = {"--pool-bytes", "4MiB", "--page-bytes", "16KiB", NULL};
  daemon_start_args(&d, args);
  worker_t w = {.d = &d};
  ASSERT(pipe(w.progress) == 0 && pipe(w.stop) == 0);
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) worker_main(&w);
  close(w.progress[1]);
  close(w.stop[0]);
  kvc_client_t *c = client_open(&d);
  wait_rounds(w.progress[0], 20);
  static const char *const steps[] = {"8MiB", "16MiB", "8MiB", "4MiB", "16MiB", "4MiB"};
  static const uint64_t want[] = {8, 16, 8, 4, 16, 4};
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
    resize(&d, steps[i]);
    ASSERT_U64_EQ(stat_get(c, "pool_bytes", NULL), want[i] << 20);
    wait_rounds(w.progress[0], 25); /* the worker goes on, over the new size */
  }
  close(w.stop[1]);
  int st;
  ASSERT(waitpid(pid, &st, 0) == pid);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
    TEST_FAIL_("the worker failed: %s %d", WIFEXITED(st) ? "exit" : "signal",
               WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
  ASSERT_U64_EQ(stat_get(c, "pool_resizes_total", NULL), 6);
  ASSERT_U64_EQ(stat_get(c, "pool_segments", NULL), 1);
  ASSERT(stat_get(c, "pool_resize_moved_pages_total", NULL) > 0);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* ---- pinned data ------------------------------------------------------------- */

TEST(resize_shrink_refused_when_pinned_data_would_be_lost) {
  daemon_t d;
  const char *args[] = {"--pool-bytes", "4MiB", "--page-bytes", "16KiB", "--pin-limit-pct",
                        "100", "--tenant-max-pinned-pct", "100", NULL};
  daemon_start_args(&d, args);
  kvc_client_t *c = client_open_shm(&d, 16u << 20);
  kvc_cache_t *h = open_cache(c);
  resize(&d, "8MiB");
  /* Sizes in every refusal in units, as the options take them. */
  char msg[1024];
  ASSERT_EQ(ctl_run(&d, msg, sizeof msg, true, "pool resize 6MiB"), 1);
  if (!strstr(msg, "each grow added one: it can shrink to 4MiB (")) TEST_FAIL_("said: %s", msg);
  ASSERT_EQ(ctl_run(&d, msg, sizeof msg, true, "pool resize 64TiB"), 1);
  if (!strstr(msg, "the pool may grow to ") || !strstr(msg, "iB at most"))
    TEST_FAIL_("said: %s", msg);
  put_seq(h, 1, 300 * T, 1); /* 300 pages: more than the 256 of 4 MiB */
  ASSERT_OK(kvc_seq_pin(h, 1));
  char out[1024];
  ASSERT_EQ(ctl_run(&d, out, sizeof out, true, "pool resize 4MiB"), 1);
  if (!strstr(out, "pinned") || !strstr(out, "FULL")) TEST_FAIL_("refusal: %s", out);
  ASSERT_U64_EQ(stat_get(c, "pool_bytes", NULL), 8u << 20);
  ASSERT_U64_EQ(stat_get(c, "pool_resize_failures_total", NULL), 1);
  ASSERT_EQ(get_seq(h, 1, 300 * T, 1), 1); /* nothing lost, nothing moved */
  /* 200 pinned pages fit: the shrink moves them, byte for byte. */
  ASSERT_OK(kvc_seq_remove(h, 1, 200 * T, UINT64_MAX));
  put_seq(h, 2, 40 * T, 2); /* unpinned: may go */
  resize(&d, "4MiB");
  ASSERT_U64_EQ(stat_get(c, "pool_bytes", NULL), 4u << 20);
  ASSERT_EQ(get_seq(h, 1, 200 * T, 1), 1);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* ---- reload and huge pages ------------------------------------------------------ */

static void wait_pool(kvc_client_t *c, uint64_t bytes) {
  (void)it_wait_stat(c, "pool_bytes", bytes, false);
}

/* kvcached with only a config file and a socket: the harness's own size
 * flags would win over the file at every reload. */
static void start_with_config(daemon_t *d, const char *conf) {
  memset(d, 0, sizeof *d);
  snprintf(d->dir, sizeof d->dir, "/tmp/kvcit-XXXXXX");
  ASSERT(mkdtemp(d->dir) != NULL);
  snprintf(d->sock, sizeof d->sock, "%s/kvcached.sock", d->dir);
  snprintf(d->log, sizeof d->log, "%s/kvcached.log", d->dir);
  char bin[256];
  snprintf(bin, sizeof bin, "%s/kvcached", it_build());
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    setenv("KVCACHED_TEST_AUDIT", "1", 0);
    int log = open(d->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int null = open("/dev/null", O_WRONLY);
    dup2(log, 2);
    dup2(null, 1);
    execl(bin, bin, "--socket", d->sock, "--config", conf, "--log-level", "debug", (char *)NULL);
    _exit(127);
  }
  d->pid = pid;
  daemon_wait_accepting(d);
}

TEST(resize_by_reload) {
  char dir[64], conf[128];
  snprintf(dir, sizeof dir, "/tmp/kvcit-XXXXXX");
  ASSERT(mkdtemp(dir) != NULL);
  snprintf(conf, sizeof conf, "%s/kvcached.conf", dir);
  it_write_file(conf, "pool_bytes = 4MiB\npage_bytes = 16KiB\nshm_default_bytes = 4MiB\n");
  daemon_t d;
  start_with_config(&d, conf);
  kvc_client_t *c = client_open(&d);
  ASSERT_U64_EQ(stat_get(c, "pool_bytes", NULL), 4u << 20);
  it_write_file(conf, "pool_bytes = 12MiB\npage_bytes = 16KiB\nshm_default_bytes = 4MiB\n");
  ASSERT(kill(d.pid, SIGHUP) == 0);
  wait_pool(c, 12u << 20);
  /* 6 MiB is no boundary of the segments (4, 12): refused, logged, kept. */
  it_write_file(conf, "pool_bytes = 6MiB\npage_bytes = 16KiB\nshm_default_bytes = 4MiB\n");
  ASSERT(kill(d.pid, SIGHUP) == 0);
  ASSERT(it_log_wait(&d, "event=reload_pool", 10000));
  ASSERT_U64_EQ(stat_get(c, "pool_bytes", NULL), 12u << 20);
  it_write_file(conf, "pool_bytes = 4MiB\npage_bytes = 16KiB\nshm_default_bytes = 4MiB\n");
  ASSERT(kill(d.pid, SIGHUP) == 0);
  wait_pool(c, 4u << 20);
  kvc_client_close(c);
  daemon_stop(&d);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ASSERT(system(cmd) == 0);
}

/* What this host offers: hugetlbfs pages reserved, or shmem taking
 * transparent huge pages when advised. */
static int host_huge(uint64_t pool_bytes) {
  FILE *f = fopen("/proc/sys/vm/nr_hugepages", "r");
  unsigned long n = 0;
  if (f && fscanf(f, "%lu", &n) != 1) n = 0;
  if (f) fclose(f);
  f = fopen("/proc/meminfo", "r");
  unsigned long free_huge = 0, size_kb = 0;
  char line[256];
  while (f && fgets(line, sizeof line, f)) {
    sscanf(line, "HugePages_Free: %lu", &free_huge);
    sscanf(line, "Hugepagesize: %lu kB", &size_kb);
  }
  if (f) fclose(f);
  if (size_kb == 2048 && free_huge * 2048 * 1024 >= pool_bytes) return 2;
  f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "r");
  if (f && fgets(line, sizeof line, f) &&
      (strstr(line, "[always]") || strstr(line, "[within_size]") || strstr(line, "[advise]") ||
       strstr(line, "[force]"))) {
    fclose(f);
    return 1;
  }
  if (f) fclose(f);
  return 0;
}

TEST(pool_huge_pages_fall_back_and_say_which) {
  daemon_t d;
  const char *args[] = {"--pool-bytes", "8MiB", "--page-bytes", "2MiB", NULL};
  daemon_start_args(&d, args);
  kvc_client_t *c = client_open(&d);
  int want = host_huge(8u << 20);
  ASSERT_U64_EQ(stat_get(c, "pool_huge_pages", NULL), (uint64_t)want);
  static const char *const kind[] = {"huge_pages=none", "huge_pages=transparent",
                                     "huge_pages=hugetlb"};
  ASSERT(it_log_has(&d, kind[want]));
  resize(&d, "16MiB"); /* a grown segment too */
  ASSERT_U64_EQ(stat_get(c, "pool_huge_pages", NULL), (uint64_t)want);
  kvc_client_close(c);
  daemon_stop(&d);
  const char *off[] = {"--pool-bytes", "8MiB", "--page-bytes", "2MiB", "--pool-huge-pages",
                       "false", NULL};
  daemon_start_args(&d, off);
  c = client_open(&d);
  ASSERT_U64_EQ(stat_get(c, "pool_huge_pages", NULL), 0);
  ASSERT(it_log_has(&d, "huge_pages=none"));
  kvc_client_close(c);
  daemon_stop(&d);
}
