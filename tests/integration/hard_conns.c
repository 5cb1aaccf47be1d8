/* hard_conns.c: connections at their limits. Thousands of connects and
 * disconnects (half of them mid-frame or right after the handshake) leave
 * the daemon's descriptors exactly and its memory nearly as they were; past
 * max_connections every extra client gets CONNLIMIT while the admitted ones
 * are served; a daemon out of descriptors (a low RLIMIT_NOFILE) refuses or
 * drops what it cannot hold, does not spin, and serves again once
 * connections close. */
#include <sys/resource.h>

#include "hard.h"

/* A framed Ping request (id). */
static size_t ping_frame(uint8_t *out, uint64_t id) {
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__Ping ping = KVCACHE__V1__PING__INIT;
  req.body_case = KVCACHE__V1__REQUEST__BODY_PING;
  req.ping = &ping;
  req.id = id;
  size_t n = kvcache__v1__request__pack(&req, out + 4);
  hard_hdr(out, (uint32_t)n);
  return 4 + n;
}

/* CPU time (user + system) the process has used, in ms. */
static double cpu_ms(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  ASSERT(f != NULL);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char *p = strrchr(buf, ')'); /* the name may hold spaces */
  ASSERT(p != NULL);
  unsigned long long ut = 0, st = 0;
  /* After ")": state ppid pgrp session tty tpgid flags minflt cminflt majflt
   * cmajflt utime stime (fields 3..15). */
  ASSERT(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) == 2);
  return (double)(ut + st) * 1000.0 / (double)sysconf(_SC_CLK_TCK);
}

/* One connection's life of the given kind (0..5). */
static void churn_one(const daemon_t *d, int kind, uint64_t i) {
  uint8_t f[64];
  if (kind == 5) { /* a whole client: a put, a pin, gone */
    kvc_client_t *c = client_open(d);
    kvc_layout_t l = it_layout(KVC_DTYPE_F32);
    kvc_cache_t *h;
    ASSERT_OK(kvc_cache_open(c, "churn", &l, &h));
    static float k[256], v[256];
    it_fill_f32(k, v, &l, i, 0, 1, 0);
    ASSERT_OK(kvc_put(h, i % 64, 0, 1, k, v));
    ASSERT_OK(kvc_seq_pin(h, i % 64));
    kvc_client_close(c);
    return;
  }
  int fd = it_connect_raw(d->sock);
  ASSERT(fd >= 0);
  switch (kind) {
  case 0: /* connect and go */
    break;
  case 1: /* mid-header */
    hard_hdr(f, 40);
    raw_send(fd, f, 2);
    break;
  case 2: { /* right after the handshake */
    raw_hello(fd, KVC_PROTOCOL_VERSION);
    Kvcache__V1__Response *r = raw_reply(fd);
    ASSERT(r && r->status == KVCACHE__V1__STATUS__OK);
    kvcache__v1__response__free_unpacked(r, NULL);
    break;
  }
  case 3: { /* greeted, then half a frame */
    raw_hello(fd, KVC_PROTOCOL_VERSION);
    Kvcache__V1__Response *r = raw_reply(fd);
    ASSERT(r && r->status == KVCACHE__V1__STATUS__OK);
    kvcache__v1__response__free_unpacked(r, NULL);
    size_t n = ping_frame(f, i);
    raw_send(fd, f, n / 2);
    break;
  }
  case 4: /* Hello and a ping sent, no reply read: the daemon writes to a closed peer */
    raw_hello(fd, KVC_PROTOCOL_VERSION);
    raw_send(fd, f, ping_frame(f, i));
    break;
  }
  close(fd);
}

/* kinds 1, 2, 3 (half of the six) end mid-frame or right after the handshake. */
static void churn(const daemon_t *d, uint64_t n, uint64_t first) {
  for (uint64_t i = first; i < first + n; i++) churn_one(d, (int)(i % 6), i);
}

TEST_TIMEOUT(hard_connection_churn_returns_fds_and_memory, 300) {
  uint64_t n = test_long() ? 20000 : 2000;
  static const char *const args[] = {"--log-level", "info", "--pin-limit-pct", "100", NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  /* Warm up (the allocator's caches, the cache "churn" and its sequences),
   * then take the baseline with no client connected. */
  churn(&d, 300, 0);
  kvc_client_t *m = client_open(&d);
  (void)it_wait_stat(m, "connections_current", 1, false);
  uint64_t shm0 = stat_get(m, "shm_bytes", NULL), seqs0 = stat_get(m, "sequences", NULL);
  kvc_client_close(m);
  int fds0 = hard_stable_fds(d.pid);
  uint64_t rss0 = hard_rss_kb(d.pid);
  double t0 = hard_now_ms();
  churn(&d, n, 300);
  double ms = hard_now_ms() - t0;
  int fds1 = hard_wait_fds(d.pid, fds0, 5000);
  m = client_open(&d);
  /* Every connection but this one is gone, with its pins and buffer. */
  uint64_t cur = 0;
  for (int i = 0; i < 500 && (cur = stat_get(m, "connections_current", NULL)) != 1; i++)
    it_sleep_ms(10);
  ASSERT_U64_EQ(cur, 1);
  ASSERT_U64_EQ(stat_get(m, "pages_pinned", NULL), 0);
  ASSERT_U64_EQ(stat_get(m, "sequences_pinned", NULL), 0);
  ASSERT_U64_EQ(stat_get(m, "sequences", NULL), seqs0);
  uint64_t shm1 = stat_get(m, "shm_bytes", NULL);
  ASSERT(stat_get(m, "connections_total", NULL) >= n + 300);
  kvc_client_close(m);
  fds1 = hard_wait_fds(d.pid, fds0, 2000);
  uint64_t rss1 = hard_rss_kb(d.pid);
  fprintf(stderr, "churn: %llu connections in %.0f ms (%.0f/s); daemon fds %d -> %d, "
          "RSS %llu kB -> %llu kB, shm_bytes %llu -> %llu\n", (unsigned long long)n, ms,
          (double)n * 1000 / ms, fds0, fds1, (unsigned long long)rss0, (unsigned long long)rss1,
          (unsigned long long)shm0, (unsigned long long)shm1);
  ASSERT_EQ(fds1, fds0);
  ASSERT_U64_EQ(shm1, shm0); /* both with the monitor's own buffer */
  if (!hard_sanitized()) ASSERT(rss1 <= rss0 + 2048);
  daemon_stop(&d);
}

/* Opens a client; returns it, or NULL with *rc the code. */
static kvc_client_t *try_open(const daemon_t *d, int *rc) {
  kvc_client_opts_t o = {.socket_path = d->sock, .shm_bytes = 1u << 20, .timeout_ms = 5000,
                         .client_name = "limit"};
  kvc_client_t *c = NULL;
  *rc = kvc_client_open(&o, &c);
  return *rc ? NULL : c;
}

/* A put and a get of one token on c's own sequence: served. */
static void serve_check(kvc_client_t *c, uint64_t seq) {
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "lim", &l, &h));
  static float k[256], v[256], gk[256], gv[256];
  it_fill_f32(k, v, &l, seq, 0, 1, 3);
  ASSERT_OK(kvc_put(h, seq, 0, 1, k, v));
  ASSERT_OK(kvc_get(h, seq, 0, 1, gk, gv));
  ASSERT_MEM_EQ(gk, k, it_tok_floats(&l, false) * 4);
  kvc_cache_close(h);
}

TEST_TIMEOUT(hard_connection_limit_plus_50_get_connlimit, 120) {
  enum { LIMIT = 64, EXTRA = 50 };
  hard_raise_nofile(1024);
  static const char *const args[] = {"--max-connections", "64", "--shm-default-bytes", "1MiB",
                                     "--log-level", "info", NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  int fds0 = hard_stable_fds(d.pid);
  static kvc_client_t *in[LIMIT];
  int rc;
  /* The harness's probe connection may still be counted for a moment. */
  for (int i = 0; i < 200 && !(in[0] = try_open(&d, &rc)); i++) {
    ASSERT_ERR(rc, KVC_E_CONNLIMIT);
    it_sleep_ms(10);
  }
  ASSERT(in[0] != NULL);
  uint64_t rejected0 = stat_get(in[0], "connections_rejected_total", NULL);
  for (int i = 1; i < LIMIT; i++) {
    in[i] = try_open(&d, &rc);
    if (!in[i]) TEST_FAIL_("client %d of %d: %s", i, LIMIT, kvc_err_name(rc));
  }
  /* 50 more: each an explicit CONNLIMIT, with the reason. */
  for (int i = 0; i < EXTRA; i++) {
    ASSERT(try_open(&d, &rc) == NULL);
    ASSERT_ERR(rc, KVC_E_CONNLIMIT);
    ASSERT(strstr(kvc_client_open_error(), "max_connections=64") != NULL);
  }
  /* A raw connection hears it too, before sending anything. */
  int fd = it_connect_raw(d.sock);
  ASSERT(fd >= 0);
  Kvcache__V1__Response *r = raw_reply(fd);
  ASSERT(r != NULL);
  ASSERT_EQ(r->status, KVCACHE__V1__STATUS__CONNLIMIT);
  kvcache__v1__response__free_unpacked(r, NULL);
  ASSERT(raw_closed(fd));
  close(fd);
  /* Every admitted client is served. */
  for (int i = 0; i < LIMIT; i++) serve_check(in[i], (uint64_t)i);
  ASSERT_U64_EQ(stat_get(in[0], "connections_current", NULL), LIMIT);
  ASSERT_U64_EQ(stat_get(in[0], "connections_rejected_total", NULL) - rejected0, EXTRA + 1);
  /* One leaves: the next one in is served. */
  kvc_client_close(in[LIMIT - 1]);
  for (int i = 0; i < 200 && !(in[LIMIT - 1] = try_open(&d, &rc)); i++) {
    ASSERT_ERR(rc, KVC_E_CONNLIMIT);
    it_sleep_ms(10);
  }
  ASSERT(in[LIMIT - 1] != NULL);
  serve_check(in[LIMIT - 1], 1000);
  for (int i = 0; i < LIMIT; i++) kvc_client_close(in[i]);
  ASSERT_EQ(hard_wait_fds(d.pid, fds0, 3000), fds0);
  daemon_stop(&d);
}

/* The daemon's soft RLIMIT_NOFILE, from /proc/PID/limits. */
static uint64_t nofile_soft(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/limits", (int)pid);
  FILE *f = fopen(path, "r");
  ASSERT(f != NULL);
  unsigned long long soft = 0;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, "Max open files", 14) == 0) soft = strtoull(line + 14, NULL, 10);
  fclose(f);
  return soft;
}

/* What the kvcached log says, so a failed expectation can be read. */
static bool log_says(const daemon_t *d, const char *needle) {
  if (it_log_wait(d, needle, 2000)) return true;
  it_dump_log(d);
  return false;
}

TEST(hard_daemon_raises_its_fd_limit_for_max_connections) {
  if (hard_valgrind()) TEST_SKIP("valgrind holds the daemon's limit where it started");
  struct rlimit old, low;
  ASSERT(getrlimit(RLIMIT_NOFILE, &old) == 0);
  if (old.rlim_max != RLIM_INFINITY && old.rlim_max < 2100) TEST_SKIP("hard RLIMIT_NOFILE < 2100");
  low = old;
  low.rlim_cur = 64; /* the hard limit stays: the daemon may raise its soft one */
  ASSERT(setrlimit(RLIMIT_NOFILE, &low) == 0);
  static const char *const args[] = {"--max-connections", "2000", "--log-level", "info", NULL};
  daemon_t d;
  daemon_spawn(&d, NULL, args, NULL);
  ASSERT(setrlimit(RLIMIT_NOFILE, &old) == 0);
  daemon_wait_accepting(&d);
  /* The socket accepts before the daemon raises its limit (the last step of
   * its start): wait for it to say it did. */
  ASSERT(log_says(&d, "event=fd_limit rlimit_nofile="));
  uint64_t soft = nofile_soft(d.pid);
  int fds = hard_stable_fds(d.pid);
  ASSERT(soft >= 2000u + (uint64_t)fds);
  ASSERT(!it_log_has(&d, "connections_possible="));
  daemon_stop(&d);
}

TEST_TIMEOUT(hard_out_of_fds_refuses_without_spinning_then_serves, 120) {
  enum { TRIES = 120, RAW = 60 };
  hard_raise_nofile(1024);
  static const char *const args[] = {"--max-connections", "1000", "--shm-default-bytes", "1MiB",
                                     "--log-level", "info", NULL};
  daemon_t d;
  it_daemon_nofile = 64; /* soft and hard: the daemon cannot raise it */
  daemon_start_args(&d, args);
  it_daemon_nofile = 0;
  ASSERT_U64_EQ(nofile_soft(d.pid), 64);
  /* It says so at start, with what it can hold (valgrind keeps 12 of them). */
  ASSERT(log_says(&d, hard_valgrind() ? "max_connections=1000 rlimit_nofile=52 connections_possible="
                                       : "max_connections=1000 rlimit_nofile=64 connections_possible="));
  int fds0 = hard_stable_fds(d.pid), limit = hard_valgrind() ? 52 : 64;
  static kvc_client_t *cl[TRIES];
  int served = 0, by_code[64] = {0};
  for (int i = 0; i < TRIES; i++) {
    int rc;
    cl[i] = try_open(&d, &rc);
    if (cl[i]) served++;
    else by_code[-rc < 64 ? -rc : 0]++;
    if (!cl[i] && rc == KVC_E_CONNLIMIT)
      ASSERT(strstr(kvc_client_open_error(), "out of file descriptors") != NULL);
  }
  /* Every client past the budget got an explicit CONNLIMIT. */
  ASSERT_EQ(by_code[-KVC_E_CONNLIMIT], TRIES - served);
  ASSERT(served >= limit - fds0 - 4 && served < limit - fds0);
  /* Raw connections on top, all at once, half of them sending a Hello: the
   * daemon refuses what it can accept and drops (accept and close) the rest. */
  static int raw[RAW];
  for (int i = 0; i < RAW; i++) {
    raw[i] = it_connect_raw(d.sock);
    /* The daemon may have closed it already: then the reply below is NULL. */
    if (raw[i] >= 0 && i % 2) (void)raw_try_hello(raw[i], KVC_PROTOCOL_VERSION);
  }
  int refused = 0, dropped = 0;
  for (int i = 0; i < RAW; i++) {
    if (raw[i] < 0) continue;
    Kvcache__V1__Response *r = raw_reply(raw[i]);
    if (r) refused += r->status == KVCACHE__V1__STATUS__CONNLIMIT;
    else dropped++;
    if (r) kvcache__v1__response__free_unpacked(r, NULL);
  }
  ASSERT_EQ(refused + dropped, RAW);
  (void)hard_stable_fds(d.pid); /* the flood is handled: its descriptors are settled */
  double cpu0 = cpu_ms(d.pid);
  it_sleep_ms(1000);
  double cpu1 = cpu_ms(d.pid);
  fprintf(stderr, "out of fds (RLIMIT_NOFILE 64, %d at start): %d of %d clients served, "
          "the rest CONNLIMIT; %d raw connections at once: %d CONNLIMIT, %d dropped; "
          "daemon CPU while saturated %.0f ms in 1 s\n", fds0, served, TRIES, RAW, refused,
          dropped, cpu1 - cpu0);
  ASSERT_EQ(kill(d.pid, 0), 0);
  ASSERT(cpu1 - cpu0 < 200); /* not spinning on accept */
  for (int i = 0; i < TRIES; i++)
    if (cl[i]) serve_check(cl[i], (uint64_t)i);
  /* Everything closes: the daemon serves again, with the fds it started with. */
  for (int i = 0; i < RAW; i++)
    if (raw[i] >= 0) close(raw[i]);
  for (int i = 0; i < TRIES; i++) kvc_client_close(cl[i]);
  ASSERT_EQ(hard_wait_fds(d.pid, fds0, 3000), fds0);
  for (int i = 0; i < served; i++) {
    int rc;
    cl[i] = try_open(&d, &rc);
    if (!cl[i]) TEST_FAIL_("after the flood, client %d: %s (%s)", i, kvc_err_name(rc),
                           kvc_client_open_error());
    serve_check(cl[i], 5000 + (uint64_t)i);
  }
  for (int i = 0; i < served; i++) kvc_client_close(cl[i]);
  daemon_stop(&d);
}

/* Regression: with RLIMIT_NOFILE lowered below the descriptors the daemon
 * holds (prlimit by an operator), libuv's reserve descriptor could not be
 * reopened and its accept loop retried EMFILE at once, forever: 100% CPU and
 * an "accept" log line per try. Now accepting pauses and resumes. */
TEST(hard_fd_limit_lowered_under_the_daemon_pauses_accepting) {
  enum { N = 8 };
  static const char *const args[] = {"--shm-default-bytes", "1MiB", "--log-level", "info", NULL};
  daemon_t d;
  it_daemon_nofile = 64;
  daemon_start_args(&d, args);
  it_daemon_nofile = 0;
  int fds0 = hard_stable_fds(d.pid);
  static kvc_client_t *cl[N];
  int rc;
  for (int i = 0; i < N; i++)
    if (!(cl[i] = try_open(&d, &rc))) TEST_FAIL_("client %d: %s", i, kvc_err_name(rc));
  struct rlimit low = {8, 64}, back = {64, 64};
  ASSERT_EQ(prlimit(d.pid, RLIMIT_NOFILE, &low, NULL), 0);
  int fd = it_connect_raw(d.sock); /* the backlog takes it */
  ASSERT(fd >= 0);
  raw_hello(fd, KVC_PROTOCOL_VERSION);
  ASSERT(it_log_wait(&d, "event=accept_paused", 2000));
  double cpu0 = cpu_ms(d.pid);
  it_sleep_ms(1000);
  double cpu1 = cpu_ms(d.pid);
  fprintf(stderr, "RLIMIT_NOFILE lowered to 8 under %d descriptors: daemon CPU %.0f ms in 1 s\n",
          fds0 + N, cpu1 - cpu0);
  ASSERT(cpu1 - cpu0 < 200);
  for (int i = 0; i < N; i++) serve_check(cl[i], (uint64_t)i); /* the others go on */
  ASSERT(stat_get(cl[0], "accept_pauses_total", NULL) >= 1);
  /* The limit comes back: the waiting client is answered. */
  ASSERT_EQ(prlimit(d.pid, RLIMIT_NOFILE, &back, NULL), 0);
  struct timeval tv = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  Kvcache__V1__Response *r = raw_reply(fd);
  ASSERT(r != NULL);
  ASSERT_EQ(r->status, KVCACHE__V1__STATUS__OK);
  kvcache__v1__response__free_unpacked(r, NULL);
  close(fd);
  ASSERT(it_log_has(&d, "event=accept_resumed"));
  kvc_client_t *c = try_open(&d, &rc);
  if (!c) TEST_FAIL_("after the pause: %s (%s)", kvc_err_name(rc), kvc_client_open_error());
  serve_check(c, 100);
  kvc_client_close(c);
  for (int i = 0; i < N; i++) kvc_client_close(cl[i]);
  ASSERT_EQ(hard_wait_fds(d.pid, fds0, 3000), fds0);
  daemon_stop(&d);
}
