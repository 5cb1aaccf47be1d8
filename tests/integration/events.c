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
#define LINE (1 << 20) /* a clear's BlockRemoved of 1024 hashes is 66 KB */
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

/* The next line it printed (60 s at most: a first start of Python with
 * zmq beside ThreadSanitizer builds on 2 CPUs took more than 10 s). */
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
    if (poll(&p, 1, 60000) != 1) TEST_FAIL_("the subscriber printed nothing within 60 s");
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
#define MAXEV 512 /* a turn that spills 50 pages: a removal and a store each */
typedef struct batch {
  char kind;
  uint64_t seq;
  int n;
  char *ev[MAXEV]; /* its lines, until the next batch_read */
} batch_t;

/* The next batch, or NULL for the end of a replay ("P end"). */
static batch_t *batch_read_or_end(pysub_t *s) {
  static batch_t b;
  static char line[LINE];
  for (int i = 0; i < b.n; i++) free(b.ev[i]);
  b.n = 0;
  sub_read(s, line, sizeof line);
  if (strcmp(line, "P end") == 0) return NULL;
  unsigned long long seq;
  int n;
  if (sscanf(line, "%c %llu %d", &b.kind, &seq, &n) != 3 || (b.kind != 'B' && b.kind != 'P'))
    TEST_FAIL_("expected a batch, the subscriber said: %s", line);
  ASSERT(n <= MAXEV);
  b.seq = seq;
  for (; b.n < n; b.n++) {
    sub_read(s, line, sizeof line);
    ASSERT((b.ev[b.n] = strdup(line)) != NULL);
  }
  return &b;
}

static batch_t *batch_read(pysub_t *s) {
  batch_t *b = batch_read_or_end(s);
  if (!b) TEST_FAIL_("expected a batch, the subscriber said: P end");
  return b;
}

/* What a subscriber gets as it joins a stream of a daemon that has not
 * published a change since it started: AllBlocksCleared alone (a router
 * drops what it held of this node before a restart). */
static void expect_joined(pysub_t *s, uint64_t seq) {
  batch_t *b = batch_read(s);
  ASSERT_EQ(b->kind, 'B');
  ASSERT_U64_EQ(b->seq, seq);
  ASSERT_EQ(b->n, 1);
  ASSERT_STR_EQ(b->ev[0], "C");
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
  char hs[64][80];
  int nh;
  char tokens[LINE / 4];
} stored_t;

/* A BlockStored line of medium want. */
static stored_t stored_parse_in(const char *line, const char *want) {
  stored_t st;
  char hashes[LINE / 4], medium[32];
  unsigned bs;
  memset(&st, 0, sizeof st);
  if (sscanf(line, "S %79s %16383s %u %31s %16383s", st.parent, hashes, &bs, medium, st.tokens) != 5)
    TEST_FAIL_("not a BlockStored line: %s", line);
  ASSERT_EQ(bs, T);
  ASSERT_STR_EQ(medium, want);
  for (char *save = NULL, *h = strtok_r(hashes, ",", &save); h; h = strtok_r(NULL, ",", &save)) {
    ASSERT(st.nh < 64);
    snprintf(st.hs[st.nh++], sizeof st.hs[0], "%s", h);
  }
  return st;
}

static stored_t stored_parse(const char *line) { return stored_parse_in(line, "CPU"); }

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
  (void)it_wait_stat(c, name, want, false);
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

  /* 1. The subscriber joined: the daemon says it started empty. A prompt
   * of 3 pages and 5 tokens: the first batch of changes says it again
   * (for a subscriber that joined as it went out), then stores the three
   * whole pages as one chain. */
  expect_joined(&s, 0);
  put(h, 1, 0, 3 * T + 5, 1);
  batch_t *b = batch_read(&s);
  ASSERT_EQ(b->kind, 'B');
  ASSERT_U64_EQ(b->seq, 1);
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
  ASSERT_U64_EQ(b->seq, 2);
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
  ASSERT_U64_EQ(b->seq, 3);
  ASSERT_EQ(b->n, 1);
  removed_expect(b->ev[0], (const char *[]){a3.hs[0], a.hs[2], a.hs[1], a.hs[0]}, 4);
  ASSERT_OK(kvc_seq_remove(h, 3, 0, UINT64_MAX));

  /* 4. Two pages of another prompt, then the cache cleared. */
  put(h, 4, 0, 2 * T, 2);
  b = batch_read(&s);
  ASSERT_U64_EQ(b->seq, 4);
  stored_t q = stored_parse(b->ev[0]);
  ASSERT_EQ(q.nh, 2);
  ASSERT_OK(kvc_cache_clear(h));
  b = batch_read(&s);
  ASSERT_U64_EQ(b->seq, 5);
  ASSERT_EQ(b->n, 1);
  removed_expect(b->ev[0], (const char *[]){q.hs[1], q.hs[0]}, 2); /* leaf first */

  /* 5. A forced gap: the subscriber leaves, two batches go by, it comes
   * back; the next live batch shows the gap and the replay returns exactly
   * the two it missed, before the live one (a subscription after the
   * first change gets no AllBlocksCleared: its view is this daemon's). */
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
    ASSERT_U64_EQ(b->seq, p + 1);
    tokens_text(p, 0, 1, toks, sizeof toks);
    ASSERT_STR_EQ(stored_parse(b->ev[0]).tokens, toks);
  }
  sub_expect(&s, "P end");
  b = batch_read(&s);
  ASSERT_EQ(b->kind, 'B');
  ASSERT_U64_EQ(b->seq, 8);
  tokens_text(7, 0, 1, toks, sizeof toks);
  ASSERT_STR_EQ(stored_parse(b->ev[0]).tokens, toks);
  /* Asked from 6, the replay socket returns 6, 7 and 8, and its end. */
  sub_cmd(&s, "replay 6");
  for (uint64_t p = 6; p <= 8; p++) ASSERT_U64_EQ(batch_read(&s)->seq, p);
  sub_expect(&s, "P end");
  ASSERT_U64_EQ(stat_get(c, "events_batches_total", NULL), 9);
  ASSERT(stat_get(c, "events_replays_total", NULL) == 2);
  ASSERT_U64_EQ(stat_get(c, "events_replayed_batches_total", NULL), 6); /* 6-8, twice */
  ASSERT_U64_EQ(stat_get(c, "events_log_dropped_total", NULL), 0);
  kvc_client_close(c);

  /* 6. A restart: the subscriber reconnects by itself; the new daemon's
   * stream starts again at 0 with AllBlocksCleared (nothing survives) as
   * soon as it is back, before any change: a router forgets its stale view
   * of the node at once. The first change says it again. */
  daemon_stop(&d);
  daemon_start_args(&d, args);
  expect_joined(&s, 0);
  c = client_open(&d);
  ASSERT_U64_EQ(stat_get(c, "events_subscriptions", NULL), 1);
  ASSERT_OK(kvc_cache_open(c, "m", &l, &h));
  put(h, 1, 0, T, 1);
  b = batch_read(&s);
  ASSERT_EQ(b->kind, 'B');
  ASSERT_U64_EQ(b->seq, 1);
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

/* ---- the map form and vLLM's block hashes ---------------------------------------- */

/* events_format = map, events_hash = vllm: the subscriber decodes tagged maps
 * and recomputes every stored hash from the token ids with cbor2, as a
 * router does; a branch off a shared prefix names its parent by vLLM's
 * hash; removals name the hashes that were stored. */
TEST_TIMEOUT(events_map_form_and_vllm_hashes, 120) {
  char dir[64], ep[128], rp[128];
  endpoints(dir, ep, rp);
  const char *args[] = {SMALL_POOL, "--events-endpoint", ep, "--events-tenant", "*",
                        "--events-format", "map", "--events-hash", "vllm",
                        "--events-hash-seed", "42", NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  pysub_t s;
  sub_start(&s, (const char *[]){"--endpoint", ep, "--format", "map", "--vllm-seed", "42", NULL});
  sub_expect(&s, "ready");
  kvc_client_t *c = client_open(&d);
  stat_wait(c, "events_subscriptions", 1);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "m", &l, &h));
  expect_joined(&s, 0);
  put(h, 1, 0, 3 * T, 1);
  batch_t *b = batch_read(&s);
  ASSERT_EQ(b->n, 2);
  ASSERT_STR_EQ(b->ev[0], "C");
  stored_t a = stored_parse(b->ev[1]);
  ASSERT_EQ(a.nh, 3);
  /* Prompt 1's first two pages, then a third of its own: attached, extended. */
  uint32_t ids[3 * T];
  for (uint32_t i = 0; i < 3 * T; i++) ids[i] = i < 2 * T ? tok(1, i) : tok(9, i);
  kvc_match_t m;
  ASSERT_OK(kvc_attach(h, 2, ids, 2 * T, false, &m));
  ASSERT_U64_EQ(m.tokens, 2 * T);
  const kvc_layout_t *lp = kvc_cache_layout(h);
  float *k = calloc(it_tok_floats(lp, false) * T, 4), *v = calloc(it_tok_floats(lp, true) * T, 4);
  ASSERT(k && v);
  ASSERT_OK(kvc_put_tokens(h, 2, 2 * T, T, k, v, ids + 2 * T));
  free(k), free(v);
  b = batch_read(&s);
  stored_t br = stored_parse(b->ev[0]);
  ASSERT_STR_EQ(br.parent, a.hs[1]);
  ASSERT(strcmp(br.hs[0], a.hs[2]) != 0);
  ASSERT_OK(kvc_cache_clear(h));
  b = batch_read(&s);
  ASSERT_EQ(b->n, 1);
  removed_set_expect(b->ev[0], (const char *[]){a.hs[0], a.hs[1], a.hs[2], br.hs[0]}, 4);
  kvc_client_close(c);
  sub_stop(&s);
  daemon_stop(&d);

  /* Chain hashes as 64-bit ints: each is the last 8 bytes, big-endian, of
   * the hash a Subscribe on the daemon's socket shows for the same page. */
  const char *args2[] = {SMALL_POOL, "--events-endpoint", ep, "--events-tenant", "*",
                         "--events-hash-int", "true", NULL};
  daemon_start_args(&d, args2);
  sub_start(&s, (const char *[]){"--endpoint", ep, NULL});
  sub_expect(&s, "ready");
  c = client_open(&d);
  kvc_client_t *w = client_open(&d);
  ASSERT_OK(kvc_events_subscribe(w, NULL, false));
  stat_wait(c, "events_subscriptions", 1);
  expect_joined(&s, 0);
  ASSERT_OK(kvc_cache_open(c, "m", &l, &h));
  put(h, 1, 0, 2 * T, 1);
  b = batch_read(&s);
  stored_t st = stored_parse(b->ev[1]);
  ASSERT_EQ(st.nh, 2);
  for (int i = 0; i < 2; i++) {
    kvc_event_t ev;
    ASSERT_OK(kvc_events_next(w, 10000, &ev));
    ASSERT_EQ(ev.kind, KVC_EVENT_STORED);
    ASSERT_EQ(ev.hash_len, 32);
    uint64_t want = 0;
    for (int j = 24; j < 32; j++) want = want << 8 | ev.hash[j];
    char text[32];
    snprintf(text, sizeof text, "%llu", (unsigned long long)want);
    ASSERT_STR_EQ(st.hs[i], text);
    if (i == 1) {
      char ptext[32];
      uint64_t p = 0;
      for (int j = 24; j < 32; j++) p = p << 8 | ev.parent[j];
      snprintf(ptext, sizeof ptext, "%llu", (unsigned long long)p);
      ASSERT_STR_EQ(st.hs[0], ptext);
    }
  }
  kvc_client_close(w);
  kvc_client_close(c);
  sub_stop(&s);
  daemon_stop(&d);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ASSERT(system(cmd) == 0);
}

/* ---- tenants ------------------------------------------------------------------------- */

#define UID_A 64011u /* the tenant the ZeroMQ stream is for */
#define UID_B 64012u /* another tenant, subscribed on the daemon's socket */

static void drop_to(uid_t uid) {
  if (setgroups(0, NULL) != 0 || setresgid(uid, uid, uid) != 0 || setresuid(uid, uid, uid) != 0)
    _exit(90);
}

/* As uid, one page of prompt into its own cache "m". */
static void put_as(const daemon_t *d, uid_t uid, uint32_t prompt) {
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    drop_to(uid);
    kvc_client_t *c = client_open(d);
    kvc_layout_t l = it_layout(KVC_DTYPE_F32);
    kvc_cache_t *h;
    ASSERT_OK(kvc_cache_open(c, "m", &l, &h));
    put(h, 1, 0, T, prompt);
    kvc_client_close(c);
    _exit(0);
  }
  int st;
  ASSERT(waitpid(pid, &st, 0) == pid);
  ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* The stored event of one page of prompt, of tenant, within 10 s. */
static void expect_stored(kvc_client_t *w, const char *tenant, uint32_t prompt) {
  kvc_event_t ev;
  ASSERT_OK(kvc_events_next(w, 10000, &ev));
  ASSERT_EQ(ev.kind, KVC_EVENT_STORED);
  ASSERT_STR_EQ(ev.tenant, tenant);
  ASSERT_STR_EQ(ev.cache, "m");
  ASSERT_EQ(ev.ntokens, T);
  ASSERT_EQ(ev.token_ids[0], tok(prompt, 0));
  ASSERT_EQ(ev.token_ids[T - 1], tok(prompt, T - 1));
}

/* The ZeroMQ stream for tenant A carries A's pages only; a Subscribe of
 * tenant B sees B's only; an admin's Subscribe sees every tenant's. */
TEST_TIMEOUT(events_stream_never_shows_another_tenants_prompts, 120) {
  if (geteuid() != 0) TEST_SKIP("needs root to run workers as other uids");
  char dir[64], ep[128], rp[128];
  endpoints(dir, ep, rp);
  char uids[64], tenant_a[32];
  snprintf(uids, sizeof uids, "self,root,%u,%u", UID_A, UID_B);
  snprintf(tenant_a, sizeof tenant_a, "uid:%u", UID_A);
  const char *args[] = {SMALL_POOL, "--allow-uids", uids, "--socket-mode", "0666",
                        "--events-endpoint", ep, "--events-tenant", tenant_a, NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  ASSERT_EQ(chmod(d.dir, 0755), 0);
  pysub_t s;
  sub_start(&s, (const char *[]){"--endpoint", ep, NULL});
  sub_expect(&s, "ready");
  kvc_client_t *c = client_open(&d);
  stat_wait(c, "events_subscriptions", 1);
  kvc_client_t *admin = client_open(&d);
  ASSERT_OK(kvc_events_subscribe(admin, NULL, true));

  /* Tenant B subscribes, then (told to) writes its own page and reads. */
  int ready[2], go[2];
  ASSERT(pipe(ready) == 0 && pipe(go) == 0);
  fflush(NULL);
  pid_t bpid = fork();
  ASSERT(bpid >= 0);
  if (bpid == 0) {
    drop_to(UID_B);
    kvc_client_t *bc = client_open(&d), *bw = client_open(&d);
    ASSERT_OK(kvc_events_subscribe(bw, NULL, true));
    ASSERT(write(ready[1], "r", 1) == 1);
    char x;
    ASSERT(read(go[0], &x, 1) == 1);
    kvc_layout_t l = it_layout(KVC_DTYPE_F32);
    kvc_cache_t *h;
    ASSERT_OK(kvc_cache_open(bc, "m", &l, &h));
    put(h, 1, 0, T, 3);
    char tb[32];
    snprintf(tb, sizeof tb, "uid:%u", UID_B);
    expect_stored(bw, tb, 3); /* its own page first: nothing of root's or A's came before */
    kvc_event_t ev;
    ASSERT_EQ(kvc_events_next(bw, 0, &ev), KVC_E_TIMEOUT);
    _exit(0);
  }
  char x;
  ASSERT(read(ready[0], &x, 1) == 1);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "m", &l, &h));
  put(h, 1, 0, T, 1);           /* root */
  put_as(&d, UID_A, 2);         /* tenant A */
  ASSERT(write(go[1], "g", 1) == 1);
  int st;
  ASSERT(waitpid(bpid, &st, 0) == bpid);
  ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  put_as(&d, UID_A, 4);         /* tenant A again: the stream's next batch */

  /* The ZeroMQ stream: A's two pages, in two batches, and nothing else. */
  char toks[LINE / 4];
  expect_joined(&s, 0);
  batch_t *b = batch_read(&s);
  ASSERT_U64_EQ(b->seq, 1);
  ASSERT_EQ(b->n, 2);
  ASSERT_STR_EQ(b->ev[0], "C");
  tokens_text(2, 0, 1, toks, sizeof toks);
  ASSERT_STR_EQ(stored_parse(b->ev[1]).tokens, toks);
  b = batch_read(&s);
  ASSERT_U64_EQ(b->seq, 2);
  ASSERT_EQ(b->n, 1);
  tokens_text(4, 0, 1, toks, sizeof toks);
  ASSERT_STR_EQ(stored_parse(b->ev[0]).tokens, toks);
  ASSERT_U64_EQ(stat_get(c, "events_batches_total", NULL), 3);

  /* The admin's Subscribe: every tenant's pages, in order. */
  char ta[32], tb[32];
  snprintf(ta, sizeof ta, "uid:%u", UID_A);
  snprintf(tb, sizeof tb, "uid:%u", UID_B);
  expect_stored(admin, "uid:0", 1);
  expect_stored(admin, ta, 2);
  expect_stored(admin, tb, 3);
  expect_stored(admin, ta, 4);
  kvc_client_close(admin);
  kvc_client_close(c);
  sub_stop(&s);
  daemon_stop(&d);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ASSERT(system(cmd) == 0);
}

/* ---- slow subscribers ------------------------------------------------------------------ */

/* A ZeroMQ subscriber and a Subscribe connection that never read: every put
 * still succeeds, and the batches they miss are counted (the ZeroMQ one
 * past events_hwm, the connection past write_queue_bytes). */
TEST_TIMEOUT(events_slow_subscribers_never_block_puts, 120) {
  char dir[64], ep[128], rp[128];
  endpoints(dir, ep, rp);
  const char *args[] = {SMALL_POOL, "--events-endpoint", ep, "--events-tenant", "*",
                        "--events-hwm", "2", "--write-queue-bytes", "64KiB",
                        "--max-frame-bytes", "16KiB", NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  pysub_t s;
  sub_start(&s, (const char *[]){"--endpoint", ep, "--slow", NULL});
  sub_expect(&s, "ready");
  kvc_client_t *c = client_open(&d), *idle = client_open(&d);
  ASSERT_OK(kvc_events_subscribe(idle, NULL, true)); /* and never read */
  stat_wait(c, "events_subscriptions", 1);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "m", &l, &h));
  /* Each put stores a page of a new prompt (and, the pool full of cached
   * pages, reclaims one): a batch a put. */
  uint32_t i = 0;
  for (; i < 100000; i++) {
    put(h, i % 8, 0, T, 1000 + i);
    if (i % 256 == 255 && stat_get(c, "events_slow_drops_total", NULL) > 0 &&
        stat_get(c, "events_local_drops_total", NULL) > 0)
      break;
  }
  ASSERT(i < 100000);
  ASSERT(stat_get(c, "events_batches_total", NULL) >= i);
  ASSERT(stat_get(c, "events_local_batches_total", NULL) > 0);
  ASSERT_OK(kvc_ping(c));
  kvc_client_close(idle);
  kvc_client_close(c);
  sub_stop(&s);
  daemon_stop(&d);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ASSERT(system(cmd) == 0);
}

/* ---- kvcachectl events and Subscribe ----------------------------------------------------- */

TEST(events_kvcachectl_tails_the_stream) {
  daemon_t d;
  daemon_start_args(&d, (const char *[]){SMALL_POOL, NULL});
  kvc_client_t *c = client_open(&d);
  char cmd[512];
  snprintf(cmd, sizeof cmd, "%s/kvcachectl --socket '%s' events --cache m --count 6 --raw",
           it_build(), d.sock);
  FILE *p = popen(cmd, "r");
  ASSERT(p != NULL);
  char line[4096];
  ASSERT(fgets(line, sizeof line, p) != NULL);
  ASSERT_STR_EQ(line, "# subscribed to cache m; Ctrl-C stops\n");
  ASSERT_U64_EQ(stat_get(c, "events_local_subscribers", NULL), 1);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h, *other;
  ASSERT_OK(kvc_cache_open(c, "other", &l, &other));
  put(other, 1, 0, T, 7); /* another cache: not shown */
  ASSERT_OK(kvc_cache_open(c, "m", &l, &h));
  put(h, 1, 0, 2 * T + 3, 1);
  ASSERT_OK(kvc_cache_clear(h));
  ASSERT_OK(kvc_cache_drop(h));
  char toks[LINE / 4], hash0[80], hash1[80];
  ASSERT(fgets(line, sizeof line, p) != NULL);
  tokens_text(1, 0, 1, toks, sizeof toks);
  ASSERT(sscanf(line, "stored  cache=m tenant=uid:%*u hash=%64s parent=- block=16 medium=CPU "
                      "seq=1 tokens=%*s", hash0) == 1);
  ASSERT(strstr(line, toks) != NULL);
  ASSERT(fgets(line, sizeof line, p) != NULL);
  ASSERT(sscanf(line, "stored  cache=m tenant=uid:%*u hash=%64s", hash1) == 1);
  char want[256];
  snprintf(want, sizeof want, "parent=%s block=16 medium=CPU seq=1 tokens=", hash0);
  ASSERT(strstr(line, want) != NULL);
  /* The clear: both pages removed, leaf first as eviction goes, then the
   * cache. */
  for (int i = 0; i < 2; i++) {
    ASSERT(fgets(line, sizeof line, p) != NULL);
    char got[80];
    ASSERT(sscanf(line, "removed cache=m tenant=uid:%*u hash=%64s medium=CPU seq=2", got) == 1);
    ASSERT_STR_EQ(got, i == 0 ? hash1 : hash0);
  }
  ASSERT(fgets(line, sizeof line, p) != NULL);
  ASSERT(strncmp(line, "cleared cache=m tenant=uid:", 27) == 0 && strstr(line, " seq=2\n"));
  ASSERT(fgets(line, sizeof line, p) != NULL);
  ASSERT(strncmp(line, "dropped cache=m tenant=uid:", 27) == 0 && strstr(line, " seq=3\n"));
  int st = pclose(p);
  ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  /* A subscribed client runs no other request. */
  kvc_client_t *w = client_open(&d);
  ASSERT_OK(kvc_events_subscribe(w, NULL, false));
  ASSERT_EQ(kvc_ping(w), KVC_E_INVAL);
  ASSERT_EQ(kvc_events_subscribe(w, NULL, false), KVC_E_INVAL);
  kvc_event_t ev;
  ASSERT_EQ(kvc_events_next(w, 0, &ev), KVC_E_TIMEOUT);
  ASSERT_EQ(kvc_events_next(c, 0, &ev), KVC_E_INVAL); /* not subscribed */
  kvc_client_close(w);
  stat_wait(c, "events_local_subscribers", 0);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* ---- options --------------------------------------------------------------------------- */

TEST(events_options_refused_when_unsafe_or_malformed) {
  char out[4096];
  const char *bin = it_build();
  struct { const char *flags, *says; } bad[] = {
      {"--events-endpoint ipc:///tmp/kvc-ev", "events_tenant"},
      {"--events-replay-endpoint ipc:///tmp/kvc-rp", "needs events_endpoint"},
      {"--events-endpoint udp://1.2.3.4:5 --events-tenant '*'", "tcp://HOST:PORT or ipc://PATH"},
      {"--events-endpoint ipc:///tmp/a --events-replay-endpoint ipc:///tmp/a --events-tenant '*'",
       "must differ"},
      {"--events-format json", "expected array or map"},
      {"--events-hash md5", "expected chain or vllm"},
      {"--events-tenant 'no spaces'", "not a tenant name"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = it_sh(out, sizeof out, "%s/kvcached --check-config --config /dev/null %s", bin,
                   bad[i].flags);
    if (rc != 2 || !strstr(out, bad[i].says))
      TEST_FAIL_("%s: exit %d, output: %s (wanted '%s')", bad[i].flags, rc, out, bad[i].says);
  }
  ASSERT_EQ(it_sh(out, sizeof out, "%s/kvcached --check-config --config /dev/null "
                  "--events-endpoint tcp://127.0.0.1:5557 --events-replay-endpoint "
                  "tcp://127.0.0.1:5558 --events-tenant uid:1000 --events-format map "
                  "--events-hash vllm --events-hash-seed 0", bin), 0);
}

/* ---- churn and loss -------------------------------------------------------------------- */

/* vLLM hashes under churn: prompts enough to fill the pool several times
 * over (its 1024 pages are more than the daemon's first table of vLLM
 * hashes holds, so the table grows and shrinks by removals): every stored
 * hash is vLLM's (the subscriber recomputes it), every removal names a
 * hash stored before and not removed since, and the clear at the end
 * removes exactly what is left. */
TEST_TIMEOUT(events_vllm_hashes_follow_churn_exactly, 120) {
  char dir[64], ep[128], rp[128];
  endpoints(dir, ep, rp);
  const char *args[] = {"--pool-bytes", "16MiB", "--page-bytes", "16KiB", "--events-endpoint", ep,
                        "--events-tenant", "*", "--events-hash", "vllm", "--events-hash-seed",
                        "7", "--tenant-max-pages-pct", "100", NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  pysub_t s;
  sub_start(&s, (const char *[]){"--endpoint", ep, "--vllm-seed", "7", NULL});
  sub_expect(&s, "ready");
  kvc_client_t *c = client_open(&d);
  stat_wait(c, "events_subscriptions", 1);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "m", &l, &h));
  static char held[2048][80];
  int nheld = 0;
  uint64_t stored = 0, removed = 0;
  expect_joined(&s, 0);
  for (uint32_t p = 1; p <= 25; p++) {
    put(h, p, 0, 64 * T, p);
    ASSERT_OK(kvc_seq_remove(h, p, 0, UINT64_MAX)); /* cached: reclaimed as the pool fills */
    if (p == 25) ASSERT_OK(kvc_cache_clear(h));
    for (int left = p == 25 ? 2 : 1; left > 0; left--) {
      batch_t *b = batch_read(&s);
      for (int i = 0; i < b->n; i++) {
        char *line = b->ev[i];
        if (line[0] == 'S') {
          stored_t st = stored_parse(line);
          for (int k = 0; k < st.nh; k++) snprintf(held[nheld++], sizeof held[0], "%s", st.hs[k]);
          stored += (uint64_t)st.nh;
        } else if (line[0] == 'R') {
          for (char *save = NULL, *hh = strtok_r(line + 6, ",", &save); hh;
               hh = strtok_r(NULL, ",", &save)) {
            int at = -1;
            for (int k = 0; k < nheld && at < 0; k++)
              if (strcmp(held[k], hh) == 0) at = k;
            if (at < 0) TEST_FAIL_("removed %s, not stored or removed twice", hh);
            memcpy(held[at], held[--nheld], sizeof held[0]);
            removed++;
          }
        }
      }
    }
  }
  ASSERT_EQ(nheld, 0);
  ASSERT_U64_EQ(stored, 25 * 64);
  ASSERT_U64_EQ(removed, 25 * 64);
  kvc_client_close(c);
  sub_stop(&s);
  daemon_stop(&d);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ASSERT(system(cmd) == 0);
}

/* A turn's changes past events_log_bytes are lost: the stream publishes
 * those that fit, in order, then AllBlocksCleared; a Subscribe sees RESET;
 * both are counted; the next changes flow again. */
TEST(events_lost_changes_end_with_all_blocks_cleared) {
  char dir[64], ep[128], rp[128];
  endpoints(dir, ep, rp);
  const char *args[] = {SMALL_POOL, "--events-endpoint", ep, "--events-tenant", "*",
                        "--events-log-bytes", "4KiB", NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  pysub_t s;
  sub_start(&s, (const char *[]){"--endpoint", ep, NULL});
  sub_expect(&s, "ready");
  kvc_client_t *c = client_open(&d), *w = client_open(&d);
  ASSERT_OK(kvc_events_subscribe(w, NULL, false));
  stat_wait(c, "events_subscriptions", 1);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "m", &l, &h));
  expect_joined(&s, 0);
  /* 48 pages: a stored page of 16 ids takes 152 bytes, 26 fit in 4 KiB. */
  put(h, 1, 0, 48 * T, 1);
  batch_t *b = batch_read(&s);
  ASSERT_U64_EQ(b->seq, 1);
  ASSERT_EQ(b->n, 3);
  ASSERT_STR_EQ(b->ev[0], "C");
  ASSERT_EQ(stored_parse(b->ev[1]).nh, 26);
  ASSERT_STR_EQ(b->ev[2], "C");
  ASSERT_U64_EQ(stat_get(c, "events_log_dropped_total", NULL), 22);
  kvc_event_t ev;
  for (int i = 0; i < 26; i++) {
    ASSERT_OK(kvc_events_next(w, 10000, &ev));
    ASSERT_EQ(ev.kind, KVC_EVENT_STORED);
  }
  ASSERT_OK(kvc_events_next(w, 10000, &ev));
  ASSERT_EQ(ev.kind, KVC_EVENT_RESET);
  put(h, 2, 0, T, 2);
  b = batch_read(&s);
  ASSERT_U64_EQ(b->seq, 2);
  ASSERT_EQ(b->n, 1);
  ASSERT_OK(kvc_events_next(w, 10000, &ev));
  ASSERT_EQ(ev.kind, KVC_EVENT_STORED);
  kvc_client_close(w);
  kvc_client_close(c);
  sub_stop(&s);
  daemon_stop(&d);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ASSERT(system(cmd) == 0);
}

/* ---- the disk tier's moves ---------------------------------------------------------- */

/* The events of batches read until the pages hs[0..n) each have both a line
 * starting with `a` and one starting with `b` naming them (the batch
 * boundaries are the daemon's turns); returns the lines, in order. */
typedef struct evlines {
  char line[1024][8192];
  int n;
} evlines_t;

static bool names(const char *line, const char *prefix, const char *h) {
  return strncmp(line, prefix, strlen(prefix)) == 0 && strstr(line, h) != NULL;
}

static void read_until(pysub_t *s, evlines_t *out, const char *a, const char *b,
                       char (*hs)[80], int n) {
  out->n = 0;
  for (;;) {
    bool all = true;
    for (int i = 0; i < n; i++) {
      bool sa = false, sb = false;
      for (int j = 0; j < out->n; j++) {
        sa |= names(out->line[j], a, hs[i]);
        sb |= names(out->line[j], b, hs[i]);
      }
      all &= sa && sb;
    }
    if (all) return;
    batch_t *bt = batch_read(s);
    for (int i = 0; i < bt->n; i++) {
      ASSERT(out->n < 1024);
      snprintf(out->line[out->n++], sizeof out->line[0], "%s", bt->ev[i]);
    }
  }
}

/* The disk tier on the stream, as vLLM's medium field says it: a page
 * pushed out of memory is removed from "CPU" and stored on "DISK" (under
 * its parent); read back, it is stored on "CPU" again; a warm restart says
 * AllBlocksCleared, then stores on "DISK" what it kept, parents first; a
 * page the disk tier's bound pushes out is removed from "DISK". */
TEST_TIMEOUT(events_disk_tier_moves_and_warm_restart, 120) {
  char dir[64], ep[128], rp[128], tier[128];
  endpoints(dir, ep, rp);
  snprintf(tier, sizeof tier, "%s/tier", dir);
  ASSERT(mkdir(tier, 0700) == 0);
  /* disk_bytes: 51 page files (16 KiB and a 4 KiB header each) */
  const char *args[] = {SMALL_POOL, "--events-endpoint", ep, "--events-replay-endpoint", rp,
                        "--events-tenant", "*", "--disk-dir", tier, "--disk-bytes", "1MiB",
                        NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  pysub_t s;
  sub_start(&s, (const char *[]){"--endpoint", ep, "--replay", rp, NULL});
  sub_expect(&s, "ready");
  kvc_client_t *c = client_open(&d);
  stat_wait(c, "events_subscriptions", 1);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "m", &l, &h));
  expect_joined(&s, 0);

  /* 1. Prompt 1's three pages are stored in memory. */
  put(h, 1, 0, 3 * T, 1);
  batch_t *b = batch_read(&s);
  ASSERT_EQ(b->n, 2);
  ASSERT_STR_EQ(b->ev[0], "C");
  stored_t a = stored_parse(b->ev[1]);
  ASSERT_EQ(a.nh, 3);

  /* 2. Pushed out of memory by a put of the whole pool: each page removed
   * from CPU and stored on DISK under its parent (the pages of a chain the
   * same turn spilled in one BlockStored, parent first). */
  ASSERT_OK(kvc_seq_remove(h, 1, 0, UINT64_MAX));
  put(h, 2, 0, 64 * T, 0);
  ASSERT_OK(kvc_seq_remove(h, 2, 0, UINT64_MAX));
  static evlines_t ev;
  read_until(&s, &ev, "R CPU", "S ", a.hs, 3);
  for (int i = 0; i < 3; i++) {
    const char *want_parent = i ? a.hs[i - 1] : "-";
    bool found = false;
    for (int j = 0; j < ev.n; j++) {
      if (ev.line[j][0] != 'S') continue;
      stored_t st = stored_parse_in(ev.line[j], "DISK");
      for (int x = 0; x < st.nh; x++) { /* a chain: each under the one before */
        if (strcmp(st.hs[x], a.hs[i]) != 0) continue;
        ASSERT(x <= i);
        ASSERT_STR_EQ(x ? st.hs[x - 1] : st.parent, want_parent);
        char toks[LINE / 4];
        tokens_text(1, (uint64_t)(i - x), (uint64_t)(i - x + st.nh), toks, sizeof toks);
        ASSERT_STR_EQ(st.tokens, toks);
        found = true;
      }
    }
    ASSERT(found);
  }
  ASSERT_U64_EQ(stat_get(c, "tier_disk_pages", NULL), 3);
  /* The stream tells of the pages as their turn hands them to the I/O
   * threads; a page is read back once its write is done. */
  it_wait_stat(c, "tier_disk_writes_total", 3, true);

  /* 3. Attached back from disk: stored on CPU again, as one chain. */
  uint32_t ids[3 * T];
  for (uint32_t i = 0; i < 3 * T; i++) ids[i] = tok(1, i);
  kvc_match_t m;
  ASSERT_OK(kvc_attach(h, 3, ids, 3 * T, false, &m));
  ASSERT_U64_EQ(m.tokens, 3 * T);
  b = batch_read(&s);
  ASSERT_EQ(b->n, 1);
  stored_t back = stored_parse(b->ev[0]);
  ASSERT_EQ(back.nh, 3);
  for (int i = 0; i < 3; i++) ASSERT_STR_EQ(back.hs[i], a.hs[i]);
  kvc_client_close(c);

  /* 4. A clean stop and a start on the same directory: AllBlocksCleared,
   * then what the disk tier kept, stored on DISK, parents first. The new
   * daemon publishes that as its start-up scan ends, perhaps before the
   * subscriber is back: it asks the replay socket from 0, as a vLLM
   * subscriber that reconnects does. (Back before the scan ended, it got
   * AllBlocksCleared alone as it joined, and the scan's batch live, which
   * starts with it again: those come too, before the replay's.) */
  daemon_stop(&d);
  daemon_start_args(&d, args);
  c = client_open(&d);
  stat_wait(c, "events_subscriptions", 1);
  stat_wait(c, "tier_disk_loading", 0);
  it_wait_stat(c, "events_batches_total", 1, true);
  sub_cmd(&s, "replay 0");
  int kept_seen = 0;
  for (batch_t *bt; (bt = batch_read_or_end(&s)) != NULL;) {
    if (bt->seq == 0) ASSERT_STR_EQ(bt->ev[0], "C"); /* the first word of the new daemon */
    for (int i = 0; i < bt->n; i++) {
      if (strcmp(bt->ev[i], "C") == 0) continue;
      ASSERT(i > 0 && strcmp(bt->ev[i - 1], "C") == 0); /* the scan's batch starts with it too */
      stored_t kept = stored_parse_in(bt->ev[i], "DISK");
      ASSERT_STR_EQ(kept.parent, "-");
      ASSERT_EQ(kept.nh, 3);
      for (int k = 0; k < 3; k++) ASSERT_STR_EQ(kept.hs[k], a.hs[k]);
      kept_seen++;
    }
  }
  ASSERT(kept_seen >= 1);

  /* 5. The bound: prompt 2's 55 pages pushed to disk push prompt 1's out of
   * it, each removed from DISK. */
  ASSERT_OK(kvc_cache_open(c, "m", &l, &h));
  put(h, 4, 0, 55 * T, 2);
  ASSERT_OK(kvc_seq_remove(h, 4, 0, UINT64_MAX));
  put(h, 5, 0, 64 * T, 0);
  read_until(&s, &ev, "R DISK", "R DISK", a.hs, 3);
  kvc_client_close(c);
  sub_stop(&s);
  daemon_stop(&d);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ASSERT(system(cmd) == 0);
}
