/* events.c: the KV event stream of a real daemon (doc/events.md), read by a
 * subscriber written to vLLM's schema (events_sub.py, run by Debian's
 * /usr/bin/python3 with python3-zmq and python3-msgpack) while this test
 * drives a scenario through libkvcache: every event, its order and the
 * sequence numbers; replay after a forced gap; the map form and vLLM's own
 * block hashes; tenant scope on the ZeroMQ stream and on Subscribe; slow
 * subscribers that never read; kvcachectl events; bad options. No sleeps: the
 * test waits for the subscriber's lines and for the daemon's figures. */
#include <grp.h>
#include <poll.h>

#include "harness.h"

#define T 16u /* page_tokens of it_layout */
#define LINE 65536
#define PY "/usr/bin/python3"

/* A 1 MiB pool of 16 KiB pages: 64 pages of it_layout. */
#define SMALL_POOL "--pool-bytes", "1MiB", "--page-bytes", "16KiB"

/* ---- the Python subscriber -------------------------------------------------- */

typedef struct pysub {
  pid_t pid;
  int in, out;       /* its stdin, its stdout */
  char buf[LINE];    /* what it printed, not yet read as lines */
  size_t len;
} pysub_t;

/* Runs events_sub.py with the NULL-terminated args; waits for "ready". */
static void sub_start(pysub_t *s, const char *const *args) {
  int to[2], from[2];
  ASSERT(pipe(to) == 0 && pipe(from) == 0);
  char script[512];
  snprintf(script, sizeof script, "%s/tests/integration/events_sub.py", it_srcdir());
  const char *argv[32] = {PY, script};
  int n = 2;
  for (int i = 0; args[i] && n < 31; i++) argv[n++] = args[i];
  argv[n] = NULL;
  fflush(NULL);
  s->pid = fork();
  ASSERT(s->pid >= 0);
  if (s->pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(to[0], 0);
    dup2(from[1], 1);
    close(to[1]), close(from[0]);
    execv(PY, (char *const *)argv);
    _exit(127);
  }
  close(to[0]), close(from[1]);
  s->in = to[1];
  s->out = from[0];
  s->len = 0;
}

/* The next line it printed (10 s at most). */
static void sub_read(pysub_t *s, char *line, size_t cap) {
  for (;;) {
    char *nl = memchr(s->buf, '\n', s->len);
    if (nl) {
      size_t n = (size_t)(nl - s->buf);
      ASSERT(n < cap);
      memcpy(line, s->buf, n);
      line[n] = '\0';
      memmove(s->buf, nl + 1, s->len - n - 1);
      s->len -= n + 1;
      if (line[0] == 'E') TEST_FAIL_("the subscriber says: %s", line);
      return;
    }
    struct pollfd p = {.fd = s->out, .events = POLLIN};
    if (poll(&p, 1, 10000) != 1) TEST_FAIL_("the subscriber printed nothing within 10 s");
    ASSERT(s->len < sizeof s->buf);
    ssize_t got = read(s->out, s->buf + s->len, sizeof s->buf - s->len);
    if (got <= 0) TEST_FAIL_("the subscriber exited (see its stderr above)");
    s->len += (size_t)got;
  }
}

static void sub_expect(pysub_t *s, const char *want) {
  char line[LINE];
  sub_read(s, line, sizeof line);
  ASSERT_STR_EQ(line, want);
}

static void sub_cmd(pysub_t *s, const char *cmd) {
  char line[128];
  int n = snprintf(line, sizeof line, "%s\n", cmd);
  ASSERT(write(s->in, line, (size_t)n) == n);
}

static void sub_stop(pysub_t *s) {
  sub_cmd(s, "quit");
  int st;
  ASSERT(waitpid(s->pid, &st, 0) == s->pid);
  ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  close(s->in), close(s->out);
}

/* One batch as the subscriber printed it: its kind ('B' live, 'P'
 * replayed), its sequence number and its event lines. */
#define MAXEV 16
typedef struct batch {
  char kind;
  uint64_t seq;
  int n;
  char ev[MAXEV][LINE / 4];
} batch_t;

static batch_t *batch_read(pysub_t *s) {
  static batch_t b;
  char line[LINE];
  sub_read(s, line, sizeof line);
  unsigned long long seq;
  if (sscanf(line, "%c %llu %d", &b.kind, &seq, &b.n) != 3 || (b.kind != 'B' && b.kind != 'P'))
    TEST_FAIL_("expected a batch, the subscriber said: %s", line);
  ASSERT(b.n <= MAXEV);
  b.seq = seq;
  for (int i = 0; i < b.n; i++) sub_read(s, b.ev[i], sizeof b.ev[i]);
  return &b;
}

/* ---- the scenario's helpers -------------------------------------------------- */

static uint32_t tok(uint32_t prompt, uint64_t i) { return prompt * 100000u + (uint32_t)i; }

/* Tokens [pos, pos + n) of seq, with the ids of prompt (0: none). */
static void put(kvc_cache_t *h, uint64_t seq, uint64_t pos, uint64_t n, uint32_t prompt) {
  const kvc_layout_t *l = kvc_cache_layout(h);
  float *k = calloc(it_tok_floats(l, false) * n, 4), *v = calloc(it_tok_floats(l, true) * n, 4);
  uint32_t *ids = calloc(n, 4);
  ASSERT(k && v && ids);
  it_fill_f32(k, v, l, seq, pos, n, 0);
  for (uint64_t i = 0; i < n; i++) ids[i] = tok(prompt, pos + i);
  if (prompt) ASSERT_OK(kvc_put_tokens(h, seq, pos, n, k, v, ids));
  else ASSERT_OK(kvc_put(h, seq, pos, n, k, v));
  free(k), free(v), free(ids);
}

/* The token list events_sub.py prints for pages [p0, p1) of prompt. */
static void tokens_text(uint32_t prompt, uint64_t p0, uint64_t p1, char *out, size_t cap) {
  size_t used = 0;
  out[0] = '\0';
  for (uint64_t i = p0 * T; i < p1 * T; i++)
    used += (size_t)snprintf(out + used, cap - used, "%s%u", i > p0 * T ? "," : "", tok(prompt, i));
}

/* A BlockStored line: parent, hashes (split into hs, nh of them), checked
 * block size, medium and tokens. */
typedef struct stored {
  char parent[80];
  char hs[8][80];
  int nh;
  char tokens[LINE / 4];
} stored_t;

static stored_t stored_parse(const char *line) {
  stored_t st;
  char hashes[LINE / 4], medium[32];
  unsigned bs;
  memset(&st, 0, sizeof st);
  if (sscanf(line, "S %79s %16383s %u %31s %16383s", st.parent, hashes, &bs, medium, st.tokens) != 5)
    TEST_FAIL_("not a BlockStored line: %s", line);
  ASSERT_EQ(bs, T);
  ASSERT_STR_EQ(medium, "CPU");
  for (char *save = NULL, *h = strtok_r(hashes, ",", &save); h; h = strtok_r(NULL, ",", &save)) {
    ASSERT(st.nh < 8);
    snprintf(st.hs[st.nh++], sizeof st.hs[0], "%s", h);
  }
  return st;
}

/* A BlockRemoved line of exactly these hashes, in any order. */
static void removed_set_expect(const char *line, const char *const *hashes, int n) {
  char copy[LINE / 4];
  snprintf(copy, sizeof copy, "%s", line);
  ASSERT(strncmp(copy, "R CPU ", 6) == 0);
  int seen = 0;
  for (char *save = NULL, *h = strtok_r(copy + 6, ",", &save); h; h = strtok_r(NULL, ",", &save)) {
    bool known = false;
    for (int i = 0; i < n; i++) known |= strcmp(h, hashes[i]) == 0;
    if (!known) TEST_FAIL_("removed %s, which was not stored: %s", h, line);
    seen++;
  }
  ASSERT_EQ(seen, n);
}

static void removed_expect(const char *line, const char *const *hashes, int n) {
  char want[LINE / 4] = "R CPU ";
  for (int i = 0; i < n; i++) {
    strcat(want, hashes[i]);
    if (i + 1 < n) strcat(want, ",");
  }
  ASSERT_STR_EQ(line, want);
}

/* Waits until the daemon's figure name is want (10 s at most). */
static void stat_wait(kvc_client_t *c, const char *name, uint64_t want) {
  uint64_t v = 0;
  for (int i = 0; i < 1000; i++) {
    if ((v = stat_get(c, name, NULL)) == want) return;
    it_sleep_ms(10);
  }
  TEST_FAIL_("%s stayed %llu, expected %llu", name, (unsigned long long)v, (unsigned long long)want);
}

/* A directory for the ZeroMQ endpoints that outlives one daemon (restart). */
static void endpoints(char dir[64], char ep[128], char rp[128]) {
  snprintf(dir, 64, "/tmp/kvcev-XXXXXX");
  ASSERT(mkdtemp(dir) != NULL);
  snprintf(ep, 128, "ipc://%s/events", dir);
  snprintf(rp, 128, "ipc://%s/replay", dir);
}

/* ---- the scenario -------------------------------------------------------------- */

TEST_TIMEOUT(events_stream_follows_a_scenario_in_vllm_schema, 120) {
  char dir[64], ep[128], rp[128];
  endpoints(dir, ep, rp);
  const char *args[] = {SMALL_POOL, "--events-endpoint", ep, "--events-replay-endpoint", rp,
                        "--events-tenant", "*", "--events-topic", "kv-events",
                        "--events-buffer", "64", "--tenant-max-pages-pct", "100", NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  pysub_t s;
  sub_start(&s, (const char *[]){"--endpoint", ep, "--replay", rp, "--topic", "kv-events", NULL});
  sub_expect(&s, "ready");
  kvc_client_t *c = client_open(&d);
  stat_wait(c, "events_subscriptions", 1);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "m", &l, &h));
  char toks[LINE / 4];

  /* 1. A prompt of 3 pages and 5 tokens: the daemon's first batch says it
   * started empty, then stores the three whole pages as one chain. */
  put(h, 1, 0, 3 * T + 5, 1);
  batch_t *b = batch_read(&s);
  ASSERT_EQ(b->kind, 'B');
  ASSERT_U64_EQ(b->seq, 0);
  ASSERT_EQ(b->n, 2);
  ASSERT_STR_EQ(b->ev[0], "C");
  stored_t a = stored_parse(b->ev[1]);
  ASSERT_STR_EQ(a.parent, "-");
  ASSERT_EQ(a.nh, 3);
  tokens_text(1, 0, 3, toks, sizeof toks);
  ASSERT_STR_EQ(a.tokens, toks);
  ASSERT_EQ((int)strlen(a.hs[0]), 64); /* SHA-256 chain hashes, as bytes */

  /* 2. An attach publishes nothing (the index does not change); extending
   * the attached sequence stores its fourth page under the third. */
  uint32_t ids[4 * T];
  for (uint32_t i = 0; i < 4 * T; i++) ids[i] = tok(1, i);
  kvc_match_t m;
  ASSERT_OK(kvc_attach(h, 2, ids, 3 * T + 5, false, &m));
  ASSERT_U64_EQ(m.tokens, 3 * T);
  put(h, 2, 3 * T, T, 1);
  b = batch_read(&s);
  ASSERT_U64_EQ(b->seq, 1);
  ASSERT_EQ(b->n, 1);
  stored_t a3 = stored_parse(b->ev[0]);
  ASSERT_STR_EQ(a3.parent, a.hs[2]);
  ASSERT_EQ(a3.nh, 1);
  tokens_text(1, 3, 4, toks, sizeof toks);
  ASSERT_STR_EQ(a3.tokens, toks);

  /* 3. Removed sequences leave their pages cached (no event); a put that
   * needs the whole pool reclaims them, leaf first, as one removal. */
  ASSERT_OK(kvc_seq_remove(h, 1, 0, UINT64_MAX));
  ASSERT_OK(kvc_seq_remove(h, 2, 0, UINT64_MAX));
  put(h, 3, 0, 64 * T, 0);
  b = batch_read(&s);
  ASSERT_U64_EQ(b->seq, 2);
  ASSERT_EQ(b->n, 1);
  removed_expect(b->ev[0], (const char *[]){a3.hs[0], a.hs[2], a.hs[1], a.hs[0]}, 4);
  ASSERT_OK(kvc_seq_remove(h, 3, 0, UINT64_MAX));

  /* 4. Two pages of another prompt, then the cache cleared. */
  put(h, 4, 0, 2 * T, 2);
  b = batch_read(&s);
  ASSERT_U64_EQ(b->seq, 3);
  stored_t q = stored_parse(b->ev[0]);
  ASSERT_EQ(q.nh, 2);
  ASSERT_OK(kvc_cache_clear(h));
  b = batch_read(&s);
  ASSERT_U64_EQ(b->seq, 4);
  ASSERT_EQ(b->n, 1);
  removed_set_expect(b->ev[0], (const char *[]){q.hs[0], q.hs[1]}, 2);

  /* 5. A forced gap: the subscriber leaves, two batches go by, it comes
   * back; the next live batch shows the gap and the replay returns exactly
   * the two it missed, before the live one. */
  sub_cmd(&s, "pause");
  sub_expect(&s, "paused");
  stat_wait(c, "events_subscriptions", 0);
  put(h, 5, 0, T, 5);
  put(h, 6, 0, T, 6);
  sub_cmd(&s, "resume");
  sub_expect(&s, "resumed");
  stat_wait(c, "events_subscriptions", 1);
  put(h, 7, 0, T, 7);
  for (uint32_t p = 5; p <= 6; p++) {
    b = batch_read(&s);
    ASSERT_EQ(b->kind, 'P');
    ASSERT_U64_EQ(b->seq, p);
    tokens_text(p, 0, 1, toks, sizeof toks);
    ASSERT_STR_EQ(stored_parse(b->ev[0]).tokens, toks);
  }
  sub_expect(&s, "P end");
  b = batch_read(&s);
  ASSERT_EQ(b->kind, 'B');
  ASSERT_U64_EQ(b->seq, 7);
  tokens_text(7, 0, 1, toks, sizeof toks);
  ASSERT_STR_EQ(stored_parse(b->ev[0]).tokens, toks);
  /* Asked from 5, the replay socket returns 5, 6 and 7, and its end. */
  sub_cmd(&s, "replay 5");
  for (uint64_t p = 5; p <= 7; p++) ASSERT_U64_EQ(batch_read(&s)->seq, p);
  sub_expect(&s, "P end");
  ASSERT_U64_EQ(stat_get(c, "events_batches_total", NULL), 8);
  ASSERT(stat_get(c, "events_replays_total", NULL) == 2);
  ASSERT_U64_EQ(stat_get(c, "events_replayed_batches_total", NULL), 6); /* 5-7, twice */
  ASSERT_U64_EQ(stat_get(c, "events_log_dropped_total", NULL), 0);
  kvc_client_close(c);

  /* 6. A restart: the subscriber reconnects by itself; the new daemon's
   * stream starts again at 0, with AllBlocksCleared (nothing survives). */
  daemon_stop(&d);
  daemon_start_args(&d, args);
  c = client_open(&d);
  stat_wait(c, "events_subscriptions", 1);
  ASSERT_OK(kvc_cache_open(c, "m", &l, &h));
  put(h, 1, 0, T, 1);
  b = batch_read(&s);
  ASSERT_EQ(b->kind, 'B');
  ASSERT_U64_EQ(b->seq, 0);
  ASSERT_EQ(b->n, 2);
  ASSERT_STR_EQ(b->ev[0], "C");
  tokens_text(1, 0, 1, toks, sizeof toks);
  ASSERT_STR_EQ(stored_parse(b->ev[1]).tokens, toks);
  kvc_client_close(c);
  sub_stop(&s);
  daemon_stop(&d);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ASSERT(system(cmd) == 0);
}
