/* prefix_trace.c: a synthetic multi-turn chat trace through the real daemon's
 * prefix cache, timed against a bare Unix-socket round trip of the same run.
 *
 *   200 conversations, each on one of 8 system prompts of 1k-4k tokens, 2-6
 *   turns (user 20-120 tokens, reply 40-200), spread over 4 client processes
 *   (conversation c on process c % 4, its turns interleaved with the
 *   process's other conversations). Each turn, as a serving worker does it:
 *
 *     attach(new seq, history + user turn, pin)    one request: match + attach
 *     put the tokens not found (with ids)          prefill
 *     put the reply (with ids)                     decode, written back at once
 *     unpin; remove the previous turn's sequence   its full pages stay cached
 *
 * Layout: 4 layers, 2 KV heads, head_dim 64, bf16, 16-token pages (32 KiB),
 * a 512 MiB pool, SHA-256 (KVC_BENCH_HASH=xxh3 to compare). Prints the hit
 * rate in tokens, the pool bytes held with sharing against the bytes the same
 * sequences would hold without it (their block-table entries), and the
 * match+attach latency against a bare 64-byte round trip of the same run:
 * for one client alone (whole histories of 3-6k tokens) and inside the trace
 * (queued behind the other clients' puts). Asserts nothing about time; it
 * exits non-zero only if a call that must work fails.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvcache/kvcache.h"

#define NCONV 200
#define NPROMPTS 8
#define NPROCS 4
#define MAX_TURNS 6
#define PAGE_TOKENS 16u
#define RTT_ROUNDS 20000
#define QUIET_ROUNDS 400
#define MAX_TOKENS (4096 + MAX_TURNS * (120 + 200))

static const kvc_layout_t lay = {4, 2, 64, 64, KVC_DTYPE_BF16, PAGE_TOKENS};

typedef struct conv {
  uint32_t prompt;               /* system prompt index */
  uint32_t turns;
  uint32_t user[MAX_TURNS], reply[MAX_TURNS]; /* tokens of each message */
} conv_t;

typedef struct trace {
  uint32_t prompt_len[NPROMPTS];
  conv_t conv[NCONV];
} trace_t;

/* Per process results, in shared memory. */
typedef struct result {
  double attach_ns[NCONV / NPROCS * MAX_TURNS + MAX_TURNS];
  uint32_t nattach;
  int failed;
} result_t;

static void die(const char *what, const char *why) {
  fprintf(stderr, "prefix_trace: %s: %s\n", what, why);
  exit(1);
}

static void must(kvc_client_t *c, int rc, const char *what) {
  if (rc) die(what, c ? kvc_client_last_error(c) : kvc_client_open_error());
}

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static uint64_t rng_next(uint64_t *x) {
  *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
  return *x;
}

static uint32_t rng_range(uint64_t *x, uint32_t lo, uint32_t hi) {
  return lo + (uint32_t)(rng_next(x) % (hi - lo + 1));
}

/* Token ids of one message, a function of (a, b, c) only, so every process
 * derives the same history. */
static void gen_ids(uint32_t *t, uint32_t n, uint32_t a, uint32_t b, uint32_t c) {
  uint64_t x = 0x9e3779b97f4a7c15ull ^ ((uint64_t)a << 40) ^ ((uint64_t)b << 20) ^ c;
  for (int i = 0; i < 4; i++) rng_next(&x);
  for (uint32_t i = 0; i < n; i++) t[i] = (uint32_t)(rng_next(&x) % 128256u);
}

static void trace_make(trace_t *tr) {
  uint64_t x = 42;
  for (int p = 0; p < NPROMPTS; p++) tr->prompt_len[p] = rng_range(&x, 1024, 4096);
  for (int c = 0; c < NCONV; c++) {
    conv_t *cv = &tr->conv[c];
    cv->prompt = (uint32_t)(rng_next(&x) % NPROMPTS);
    cv->turns = rng_range(&x, 2, MAX_TURNS);
    for (uint32_t t = 0; t < cv->turns; t++) {
      cv->user[t] = rng_range(&x, 20, 120);
      cv->reply[t] = rng_range(&x, 40, 200);
    }
  }
}

/* The history of conversation c up to and including the user message of
 * turn t (and, with reply, its reply): ids into out; returns the length. */
static uint32_t history(const trace_t *tr, int c, uint32_t t, int with_reply, uint32_t *out) {
  const conv_t *cv = &tr->conv[c];
  uint32_t n = tr->prompt_len[cv->prompt];
  gen_ids(out, n, 1, cv->prompt, 0);
  for (uint32_t k = 0; k <= t; k++) {
    gen_ids(out + n, cv->user[k], 2, (uint32_t)c, k);
    n += cv->user[k];
    if (k < t || with_reply) {
      gen_ids(out + n, cv->reply[k], 3, (uint32_t)c, k);
      n += cv->reply[k];
    }
  }
  return n;
}

/* ---- the daemon --------------------------------------------------------------- */

static char dir[64], sock_path[108];

static pid_t daemon_start(const char *build) {
  snprintf(dir, sizeof dir, "/tmp/kvcbench-XXXXXX");
  if (!mkdtemp(dir)) die("mkdtemp", strerror(errno));
  snprintf(sock_path, sizeof sock_path, "%s/kvcached.sock", dir);
  char bin[256], log[128];
  snprintf(bin, sizeof bin, "%s/kvcached", build);
  snprintf(log, sizeof log, "%s/kvcached.log", dir);
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) die("fork", strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    FILE *f = freopen(log, "w", stderr);
    (void)f;
    if (!freopen("/dev/null", "w", stdout)) _exit(126);
    const char *hash = getenv("KVC_BENCH_HASH"); /* xxh3 to compare */
    hash = hash && *hash ? hash : "sha256";
    execl(bin, bin, "--socket", sock_path, "--pool-bytes", "512MiB", "--page-bytes", "32KiB",
          "--shm-default-bytes", "16MiB", "--log-level", "warn", "--prefix-hash", hash,
          "--prefix-single-tenant", strcmp(hash, "sha256") ? "true" : "false", (char *)NULL);
    _exit(127);
  }
  for (int i = 0; i < 1000; i++) {
    kvc_client_opts_t o = {.socket_path = sock_path, .shm_bytes = 1u << 20};
    kvc_client_t *c;
    if (kvc_client_open(&o, &c) == 0) {
      kvc_client_close(c);
      return pid;
    }
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
  }
  die("kvcached", "did not start within 10 s");
  return -1;
}

static void daemon_stop(pid_t pid) {
  int st;
  kill(pid, SIGTERM);
  waitpid(pid, &st, 0);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "prefix_trace: could not remove %s\n", dir);
}

/* ---- the bare round trip ------------------------------------------------------ */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double pct(double *v, uint32_t n, double q) {
  qsort(v, n, sizeof *v, cmp_double);
  uint32_t i = (uint32_t)(q * (n - 1) + 0.5);
  return v[i];
}

/* 64 bytes there and back over a Unix stream socket between two processes. */
static void bare_rtt(double *p50, double *p99) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) die("socketpair", strerror(errno));
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    char b[64];
    close(sv[0]);
    for (;;) {
      size_t got = 0;
      while (got < sizeof b) {
        ssize_t n = read(sv[1], b + got, sizeof b - got);
        if (n <= 0) _exit(0);
        got += (size_t)n;
      }
      if (write(sv[1], b, sizeof b) != (ssize_t)sizeof b) _exit(1);
    }
  }
  close(sv[1]);
  static double s[RTT_ROUNDS];
  char b[64] = {0};
  for (int i = 0; i < RTT_ROUNDS; i++) {
    double t0 = now_ns();
    if (write(sv[0], b, sizeof b) != (ssize_t)sizeof b) die("rtt", "write");
    size_t got = 0;
    while (got < sizeof b) {
      ssize_t n = read(sv[0], b + got, sizeof b - got);
      if (n <= 0) die("rtt", "read");
      got += (size_t)n;
    }
    s[i] = now_ns() - t0;
  }
  close(sv[0]);
  waitpid(pid, NULL, 0);
  *p50 = pct(s, RTT_ROUNDS, 0.50);
  *p99 = pct(s, RTT_ROUNDS, 0.99);
}

/* ---- one worker --------------------------------------------------------------- */

static void worker(const trace_t *tr, int proc, result_t *res) {
  kvc_client_opts_t o = {.socket_path = sock_path, .client_name = "prefix_trace"};
  kvc_client_t *c;
  must(NULL, kvc_client_open(&o, &c), "open");
  kvc_cache_t *h;
  must(c, kvc_cache_open_salted(c, "chat", &lay, "tenant", 6, &h), "cache open");
  uint64_t kb;
  must(c, kvc_xfer_bytes(h, NULL, true, MAX_TOKENS, &kb, NULL, NULL), "sizes");
  uint8_t *k = malloc(kb), *v = malloc(kb);
  uint32_t *ids = malloc(MAX_TOKENS * sizeof *ids);
  if (!k || !v || !ids) die("worker", "out of memory");
  for (uint64_t i = 0; i < kb; i++) k[i] = v[i] = (uint8_t)(i * 131u >> 3); /* any bytes */
  for (uint32_t t = 0; t < MAX_TURNS; t++) {
    for (int ci = proc; ci < NCONV; ci += NPROCS) {
      const conv_t *cv = &tr->conv[ci];
      if (t >= cv->turns) continue;
      uint64_t seq = (uint64_t)ci * 16 + t;
      uint32_t q = history(tr, ci, t, 0, ids);
      kvc_match_t m;
      double t0 = now_ns();
      must(c, kvc_attach(h, seq, ids, q, true, &m), "attach");
      res->attach_ns[res->nattach++] = now_ns() - t0;
      /* prefill what was not found, then the reply, both with their ids */
      kvc_io_t e = {.seq_id = seq, .pos = m.tokens, .ntokens = q - m.tokens, .k = k, .v = v,
                    .tokens = ids + m.tokens};
      if (e.ntokens) must(c, kvc_put_batch(h, NULL, &e, 1), "prefill");
      uint32_t full = history(tr, ci, t, 1, ids);
      e = (kvc_io_t){.seq_id = seq, .pos = q, .ntokens = full - q, .k = k, .v = v,
                     .tokens = ids + q};
      must(c, kvc_put_batch(h, NULL, &e, 1), "reply");
      must(c, kvc_seq_unpin(h, seq), "unpin");
      if (t > 0) must(c, kvc_seq_remove(h, seq - 1, 0, UINT64_MAX), "remove");
    }
  }
  free(k), free(v), free(ids);
  kvc_client_close(c);
}

/* One client alone, after the trace: match+attach of whole conversation
 * histories (3-6k tokens) into a scratch sequence, and match alone. */
static void quiet(const trace_t *tr, double *att, double *mat, uint32_t n) {
  kvc_client_opts_t o = {.socket_path = sock_path, .client_name = "prefix_trace"};
  kvc_client_t *c;
  must(NULL, kvc_client_open(&o, &c), "open");
  kvc_cache_t *h;
  must(c, kvc_cache_open_salted(c, "chat", &lay, "tenant", 6, &h), "cache open");
  static uint32_t ids[MAX_TOKENS];
  uint64_t x = 7;
  for (uint32_t i = 0; i < n; i++) {
    int ci = (int)(rng_next(&x) % NCONV);
    uint32_t q = history(tr, ci, tr->conv[ci].turns - 1, 1, ids);
    kvc_match_t m;
    double t0 = now_ns();
    must(c, kvc_match(h, ids, q, &m), "match");
    double t1 = now_ns();
    must(c, kvc_attach(h, 1u << 30, ids, q, true, &m), "attach");
    double t2 = now_ns();
    mat[i] = t1 - t0;
    att[i] = t2 - t1;
    must(c, kvc_seq_remove(h, 1u << 30, 0, UINT64_MAX), "remove");
  }
  kvc_client_close(c);
}

/* ---- report ------------------------------------------------------------------- */

static uint64_t figure(const kvc_stat_t *st, size_t n, const char *name, const char *cache) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(st[i].name, name) == 0 && strcmp(st[i].cache, cache) == 0) return st[i].value;
  die("stats", name);
  return 0;
}

/* Tokens a perfect whole-page cache could serve if only the first
 * conversation of each system prompt missed it. */
static uint64_t attainable(const trace_t *tr, uint32_t *ids) {
  uint64_t hit = 0;
  int seen[NPROMPTS] = {0};
  for (int c = 0; c < NCONV; c++) {
    const conv_t *cv = &tr->conv[c];
    if (seen[cv->prompt]++) hit += tr->prompt_len[cv->prompt] / PAGE_TOKENS * PAGE_TOKENS;
    for (uint32_t t = 1; t < cv->turns; t++)
      hit += history(tr, c, t - 1, 1, ids) / PAGE_TOKENS * PAGE_TOKENS;
  }
  return hit;
}

int main(void) {
  const char *build = getenv("KVC_BUILD");
  if (!build || !*build) build = "build";
  static trace_t tr;
  trace_make(&tr);
  uint32_t turns = 0;
  for (int c = 0; c < NCONV; c++) turns += tr.conv[c].turns;

  double rtt50, rtt99;
  bare_rtt(&rtt50, &rtt99);
  pid_t dpid = daemon_start(build);
  result_t *res = mmap(NULL, NPROCS * sizeof *res, PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (res == MAP_FAILED) die("mmap", strerror(errno));
  memset(res, 0, NPROCS * sizeof *res);
  double t0 = now_ns();
  pid_t pids[NPROCS];
  fflush(NULL);
  for (int p = 0; p < NPROCS; p++) {
    if ((pids[p] = fork()) == 0) {
      worker(&tr, p, &res[p]);
      _exit(0);
    }
  }
  int failed = 0;
  for (int p = 0; p < NPROCS; p++) {
    int st;
    waitpid(pids[p], &st, 0);
    failed |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  }
  double wall_s = (now_ns() - t0) / 1e9;
  if (failed) {
    daemon_stop(dpid);
    die("workers", "a worker failed");
  }

  kvc_client_opts_t o = {.socket_path = sock_path, .shm_bytes = 1u << 20};
  kvc_client_t *c;
  must(NULL, kvc_client_open(&o, &c), "open");
  kvc_stat_t *st;
  size_t n;
  must(c, kvc_stats(c, &st, &n), "stats");
  uint64_t svc50 = figure(st, n, "latency_attach_p50_ns", "");
  uint64_t svc99 = figure(st, n, "latency_attach_p99_ns", "");
  uint64_t queried = figure(st, n, "prefix_tokens_queried", "chat");
  uint64_t hit = figure(st, n, "prefix_tokens_hit", "chat");
  uint64_t inel = figure(st, n, "prefix_tokens_ineligible", "chat");
  uint64_t page_bytes = figure(st, n, "page_bytes", "");
  uint64_t used = figure(st, n, "pages_used", ""), cached = figure(st, n, "pages_cached", "chat");
  uint64_t held = figure(st, n, "pages", "chat"); /* block-table entries: no sharing */
  uint64_t evicted = figure(st, n, "evicted_sequences", "");
  uint64_t reclaimed = figure(st, n, "cached_reclaimed", "chat");
  uint64_t put_tokens = figure(st, n, "put_tokens", "");
  uint64_t verify = figure(st, n, "hash_verify_failed", "chat");
  kvc_stats_free(st);
  kvc_client_close(c);
  static double qa[QUIET_ROUNDS], qm[QUIET_ROUNDS];
  quiet(&tr, qa, qm, QUIET_ROUNDS);
  daemon_stop(dpid);

  static double lat[NCONV * MAX_TURNS];
  uint32_t nl = 0;
  for (int p = 0; p < NPROCS; p++)
    for (uint32_t i = 0; i < res[p].nattach; i++) lat[nl++] = res[p].attach_ns[i];
  double a50 = pct(lat, nl, 0.50), a99 = pct(lat, nl, 0.99);
  static uint32_t ids[MAX_TOKENS];
  uint64_t best = attainable(&tr, ids);

  const char *hash = getenv("KVC_BENCH_HASH");
  printf("prefix trace: %d conversations, %d system prompts (1024..4096 tokens), %u turns, "
         "%d client processes, %s, %.1f s\n", NCONV, NPROMPTS, turns, NPROCS,
         hash && *hash ? hash : "sha256", wall_s);
  printf("  layout 4 layers x 2 KV heads x 64 dims bf16, 16-token pages of %" PRIu64
         " KiB; tokens written %" PRIu64 "\n", page_bytes / 1024, put_tokens);
  printf("  hit rate (tokens)      %6.2f%%  (%" PRIu64 " of %" PRIu64 " queried; %" PRIu64
         " ineligible; whole-page bound %.2f%%; verify failures %" PRIu64 ")\n",
         100.0 * (double)hit / (double)queried, hit, queried, inel,
         100.0 * (double)best / (double)queried, verify);
  printf("  pool bytes, sharing    %8.1f MiB  (%" PRIu64 " pages, %" PRIu64 " of them cached)\n",
         (double)(used * page_bytes) / 1048576.0, used, cached);
  printf("  pool bytes, no sharing %8.1f MiB  (%" PRIu64 " pages in the block tables)\n",
         (double)(held * page_bytes) / 1048576.0, held);
  printf("  memory saved           %6.2f%%  (%.2fx less); evictions %" PRIu64
         ", cached pages reclaimed %" PRIu64 "\n",
         100.0 * (1.0 - (double)used / (double)held), (double)held / (double)used, evicted,
         reclaimed);
  double qa50 = pct(qa, QUIET_ROUNDS, 0.50), qa99 = pct(qa, QUIET_ROUNDS, 0.99);
  double qm50 = pct(qm, QUIET_ROUNDS, 0.50), qm99 = pct(qm, QUIET_ROUNDS, 0.99);
  printf("  bare 64 B round trip       p50 %7.1f us  p99 %7.1f us\n", rtt50 / 1e3,
         rtt99 / 1e3);
  printf("  match+attach, one client   p50 %7.1f us  p99 %7.1f us  (%d requests, whole "
         "histories of 3-6k tokens)\n", qa50 / 1e3, qa99 / 1e3, QUIET_ROUNDS);
  printf("  match alone, one client    p50 %7.1f us  p99 %7.1f us\n", qm50 / 1e3, qm99 / 1e3);
  printf("  match+attach in the trace  p50 %7.1f us  p99 %7.1f us  (%u requests, 4 busy "
         "clients; daemon service time p50 %.1f us p99 %.1f us)\n",
         a50 / 1e3, a99 / 1e3, nl, (double)svc50 / 1e3, (double)svc99 / 1e3);
  printf("  ratio to the round trip    one client p50 %.2fx p99 %.2fx; in the trace p50 %.2fx "
         "p99 %.2fx\n", qa50 / rtt50, qa99 / rtt99, a50 / rtt50, a99 / rtt99);
  return 0;
}
