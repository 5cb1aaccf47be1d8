/* fair.c (integration): one client's flood (a huge Match or Attach, big
 * puts, big gets, pipelines it never reads) does not stop another client's
 * work, whose every byte is verified meanwhile. Nothing here is timed: each
 * test asserts progress and correctness on both sides. */
#include "hard.h"

#define NTOK 64 /* 4 pages of it_layout: 64 KiB of K and V in f32 */

/* A flooder: a child that runs its op in a loop until killed. It writes one
 * byte on ready after its first op succeeded; a failure exits with a code. */
typedef void (*flood_fn)(const daemon_t *d, int ready);

static pid_t flood_start(const daemon_t *d, flood_fn fn) {
  int p[2];
  ASSERT(pipe(p) == 0);
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    close(p[0]);
    fn(d, p[1]);
    _exit(9); /* fn never returns */
  }
  close(p[1]);
  char b;
  ASSERT_EQ(read(p[0], &b, 1), 1); /* it runs, and its first op was right */
  close(p[0]);
  return pid;
}

/* The flooder is still running (it failed nothing), then stops. */
static void flood_stop(pid_t pid) {
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, WNOHANG), 0);
  kill(pid, SIGKILL);
  ASSERT(waitpid(pid, &st, 0) == pid);
  ASSERT(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
}

static void ready_once(int *ready) {
  if (*ready < 0) return;
  if (write(*ready, "r", 1) != 1) _exit(8);
  close(*ready);
  *ready = -1;
}

/* The victim: rounds of put then get of its own sequence, each round's bytes
 * different, every byte compared. */
static void victim_rounds(const daemon_t *d, int rounds) {
  kvc_client_t *c = client_open(d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "victim", &l, &h));
  size_t nk = it_tok_floats(&l, false) * NTOK, nv = it_tok_floats(&l, true) * NTOK;
  float *k = malloc(nk * 4), *v = malloc(nv * 4), *gk = malloc(nk * 4), *gv = malloc(nv * 4);
  for (int r = 0; r < rounds; r++) {
    it_fill_f32(k, v, &l, 7, 0, NTOK, (uint32_t)r);
    ASSERT_OK(kvc_put(h, 7, 0, NTOK, k, v));
    ASSERT_OK(kvc_get(h, 7, 0, NTOK, gk, gv));
    ASSERT_MEM_EQ(gk, k, nk * 4);
    ASSERT_MEM_EQ(gv, v, nv * 4);
    uint64_t t = (uint64_t)r % NTOK, per = nk / NTOK / l.num_layers; /* floats of a token-layer */
    ASSERT_OK(kvc_get(h, 7, t, t + 1, gk, gv)); /* one token: (layer, token, head, dim) */
    for (uint32_t L = 0; L < l.num_layers; L++)
      ASSERT_MEM_EQ(gk + L * per, k + (L * NTOK + t) * per, per * 4);
    ASSERT_OK(kvc_ping(c));
  }
  free(k), free(v), free(gk), free(gv);
  kvc_client_close(c);
}

/* ---- a huge Match ------------------------------------------------------------ */

#define MATCH_SHM (32ull << 20)
#define MATCH_IDS (MATCH_SHM / 4) /* the largest id count the buffer holds */

static uint32_t *match_ids(void) {
  uint32_t *ids = malloc(MATCH_IDS * 4);
  for (uint64_t i = 0; i < MATCH_IDS; i++) ids[i] = (uint32_t)(i * 2654435761u) ^ 0x5bd1e995u;
  return ids;
}

/* Puts NTOK tokens with ids[0..NTOK) (4 indexed pages), then matches (or
 * attaches) every id the buffer holds: 4 pages each time, forever. */
static void flood_match(const daemon_t *d, int ready, bool attach) {
  kvc_client_t *c = client_open_shm(d, MATCH_SHM);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  if (kvc_cache_open(c, "flood", &l, &h)) _exit(2);
  uint32_t *ids = match_ids();
  size_t nk = it_tok_floats(&l, false) * NTOK, nv = it_tok_floats(&l, true) * NTOK;
  float *k = calloc(nk, 4), *v = calloc(nv, 4);
  if (kvc_put_tokens(h, 1, 0, NTOK, k, v, ids)) _exit(3);
  for (uint64_t n = 0;; n++) {
    kvc_match_t m;
    int rc = attach ? kvc_attach(h, 100 + n % 4, ids, MATCH_IDS, false, &m)
                    : kvc_match(h, ids, MATCH_IDS, &m);
    if (rc || m.pages != NTOK / l.page_tokens || m.tokens != NTOK) _exit(4);
    ready_once(&ready);
  }
}

static void flood_match_fn(const daemon_t *d, int ready) { flood_match(d, ready, false); }
static void flood_attach_fn(const daemon_t *d, int ready) { flood_match(d, ready, true); }

static const char *const match_args[] = {"--shm-max-bytes", "64MiB", NULL};

TEST(fair_huge_match_beside_verified_work) {
  daemon_t d;
  daemon_start_args(&d, match_args);
  pid_t f = flood_start(&d, flood_match_fn);
  victim_rounds(&d, 200);
  flood_stop(f);
  kvc_client_t *c = client_open(&d);
  ASSERT(stat_get(c, "prefix_matches_total", NULL) >= 2);
  kvc_client_close(c);
  daemon_stop(&d);
}

TEST(fair_huge_attach_beside_verified_work) {
  daemon_t d;
  daemon_start_args(&d, match_args);
  pid_t f = flood_start(&d, flood_attach_fn);
  victim_rounds(&d, 200);
  flood_stop(f);
  daemon_stop(&d);
}

/* The ids are read in place: a Match whose ids change under it (another
 * thread of the client rewrites them) answers some whole-page prefix and
 * leaves the daemon sound. Here: the ids equal to the cached prefix, then a
 * match after the buffer's ids changed finds nothing. */
TEST(fair_match_reads_ids_in_place) {
  daemon_t d;
  daemon_start_args(&d, match_args);
  kvc_client_t *c = client_open_shm(&d, MATCH_SHM);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "m", &l, &h));
  uint32_t *ids = match_ids();
  size_t nk = it_tok_floats(&l, false) * NTOK, nv = it_tok_floats(&l, true) * NTOK;
  float *k = calloc(nk, 4), *v = calloc(nv, 4);
  ASSERT_OK(kvc_put_tokens(h, 1, 0, NTOK, k, v, ids));
  kvc_match_t m;
  ASSERT_OK(kvc_match(h, ids, MATCH_IDS, &m));
  ASSERT_U64_EQ(m.tokens, NTOK);
  ASSERT_U64_EQ(m.ineligible, MATCH_IDS % l.page_tokens);
  ids[l.page_tokens + 3] ^= 1; /* the second page differs */
  ASSERT_OK(kvc_match(h, ids, MATCH_IDS, &m));
  ASSERT_U64_EQ(m.tokens, l.page_tokens);
  ASSERT_U64_EQ(stat_get(c, "prefix_tokens_queried_total", NULL), 2 * MATCH_IDS);
  free(ids), free(k), free(v);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* ---- the turn's budget ---------------------------------------------------- */

/* A put of NTOK tokens of it_layout (f32) from the start of a raw client's
 * buffer (its zeros): 64 KiB of K and V. */
static void raw_put(int fd, uint64_t id, uint32_t cache, uint64_t seq) {
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__Io io = KVCACHE__V1__IO__INIT;
  Kvcache__V1__IoEntry e = KVCACHE__V1__IO_ENTRY__INIT, *ep = &e;
  uint64_t half = NTOK * 2 * 2 * 32 * 4;
  e.seq_id = seq;
  e.ntokens = NTOK;
  e.k_len = half;
  e.v_off = half;
  e.v_len = half;
  io.cache_id = cache;
  io.n_entries = 1;
  io.entries = &ep;
  req.id = id;
  req.body_case = KVCACHE__V1__REQUEST__BODY_PUT;
  req.put = &io;
  raw_send_request(fd, &req);
}

/* n puts pipelined in one write (the daemon reads them at once), then every
 * reply in order; returns how many turns the daemon deferred meanwhile. */
static uint64_t pipelined_puts(const daemon_t *d, int n) {
  kvc_client_t *c = client_open(d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "turn", &l, &h));
  int fd = it_connect_raw(d->sock);
  raw_hello(fd, KVC_PROTOCOL_VERSION);
  Kvcache__V1__Response *r = raw_reply(fd);
  ASSERT(r && r->status == KVCACHE__V1__STATUS__OK);
  kvcache__v1__response__free_unpacked(r, NULL);
  uint64_t before = stat_get(c, "deferred_turns_total", NULL);
  int sp[2];
  ASSERT(socketpair(AF_UNIX, SOCK_STREAM, 0, sp) == 0); /* to gather the frames */
  for (int i = 0; i < n; i++) raw_put(sp[0], 10 + (uint64_t)i, kvc_cache_id(h), 1);
  uint8_t buf[8192];
  ssize_t len = recv(sp[1], buf, sizeof buf, MSG_DONTWAIT);
  ASSERT(len > 0 && (size_t)len < sizeof buf);
  raw_send(fd, buf, (size_t)len);
  close(sp[0]), close(sp[1]);
  for (int i = 0; i < n; i++) {
    r = raw_reply(fd);
    ASSERT(r != NULL);
    ASSERT_U64_EQ(r->id, 10 + (uint64_t)i);
    ASSERT_EQ(r->status, KVCACHE__V1__STATUS__OK);
    kvcache__v1__response__free_unpacked(r, NULL);
  }
  close(fd);
  uint64_t deferred = stat_get(c, "deferred_turns_total", NULL) - before;
  kvc_client_close(c);
  return deferred;
}

TEST(fair_turn_bytes_defers_a_pipeline) {
  static const char *const args[] = {"--frames-per-turn", "1000", "--turn-bytes", "64KiB",
                                     "--turn-us", "0", NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  ASSERT(pipelined_puts(&d, 20) >= 1); /* each 64 KiB put spends a turn */
  daemon_stop(&d);
}

TEST(fair_turn_us_defers_a_pipeline) {
  static const char *const args[] = {"--frames-per-turn", "1000", "--turn-bytes", "1GiB",
                                     "--turn-us", "1", NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  ASSERT(pipelined_puts(&d, 20) >= 1); /* a 64 KiB put takes more than 1 us */
  daemon_stop(&d);
}

TEST(fair_no_budget_runs_a_pipeline_in_one_turn) {
  static const char *const args[] = {"--frames-per-turn", "1000", "--turn-bytes", "1GiB",
                                     "--turn-us", "0", NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  ASSERT_U64_EQ(pipelined_puts(&d, 20), 0); /* the control */
  daemon_stop(&d);
}

/* ---- pipelines never read ------------------------------------------------- */

#define NEVER_READERS 8

/* A greeted raw connection that sends pings, non-blocking, until the daemon
 * has paused it (write_pauses grew) and the socket takes no more: from then
 * on it holds what the daemon keeps for it. */
static int never_reader(const daemon_t *d, kvc_client_t *c, uint64_t pauses_before) {
  int fd = it_connect_raw(d->sock);
  raw_hello(fd, KVC_PROTOCOL_VERSION);
  Kvcache__V1__Response *r = raw_reply(fd);
  ASSERT(r && r->status == KVCACHE__V1__STATUS__OK);
  kvcache__v1__response__free_unpacked(r, NULL);
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__Ping ping = KVCACHE__V1__PING__INIT;
  req.body_case = KVCACHE__V1__REQUEST__BODY_PING;
  req.ping = &ping;
  req.id = 1u << 20; /* every frame the same size */
  uint8_t frames[64 * 16];
  size_t n = kvcache__v1__request__get_packed_size(&req);
  for (size_t i = 0; i < 64; i++) {
    uint8_t *p = frames + i * (4 + n);
    p[0] = (uint8_t)n, p[1] = p[2] = p[3] = 0;
    kvcache__v1__request__pack(&req, p + 4);
  }
  size_t len = 64 * (4 + n), off = 0;
  double end = hard_now_ms() + 20000;
  for (;;) {
    ASSERT(hard_now_ms() < end);
    ssize_t k = send(fd, frames + off, len - off, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (k > 0) {
      off = (off + (size_t)k) % len;
      continue;
    }
    ASSERT(k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
    if (stat_get(c, "write_pauses_total", NULL) > pauses_before) return fd;
    struct pollfd pf = {.fd = fd, .events = POLLOUT};
    poll(&pf, 1, 50); /* the daemon reads on: send more */
  }
}

TEST(fair_never_read_pipelines_are_bounded) {
  static const char *const args[] = {"--write-queue-bytes", "256KiB", NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  kvc_client_t *c = client_open(&d);
  victim_rounds(&d, 20); /* warm: the daemon's own allocations are made */
  uint64_t rss0 = hard_rss_kb(d.pid);
  int fds[NEVER_READERS];
  for (int i = 0; i < NEVER_READERS; i++) {
    uint64_t pauses = stat_get(c, "write_pauses_total", NULL);
    fds[i] = never_reader(&d, c, pauses);
  }
  victim_rounds(&d, 200); /* every byte verified beside them */
  uint64_t rss1 = hard_rss_kb(d.pid);
  /* Each holds at most its read buffer (2 x 64 KiB frames), 256 KiB of
   * queued replies and one reply more: under 1 MiB however it is counted.
   * Counting frame bytes alone let ~20,000 queued pings hold 5 MiB each. */
  if (!hard_sanitized()) {
    uint64_t per_kb = rss1 > rss0 ? (rss1 - rss0) / NEVER_READERS : 0;
    if (per_kb >= 1024) TEST_FAIL_("daemon RSS grew %llu KiB per never-read connection",
                                   (unsigned long long)per_kb);
  }
  ASSERT(stat_get(c, "write_pauses_total", NULL) >= NEVER_READERS);
  for (int i = 0; i < NEVER_READERS; i++) close(fds[i]);
  (void)it_wait_stat(c, "connections_current", 1, false);
  ASSERT_U64_EQ(stat_get(c, "connections_current", NULL), 1);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* ---- big puts and big gets -------------------------------------------------- */

#define BIG_TOK 2048 /* 2 MiB of K and V: 128 pages of the 512 the pool holds */

/* Puts (and, if get, gets) BIG_TOK tokens of its own sequence in a loop;
 * every get's bytes are compared with what was put. */
static void flood_big(const daemon_t *d, int ready, bool get) {
  kvc_client_t *c = client_open(d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  if (kvc_cache_open(c, "flood", &l, &h)) _exit(2);
  size_t nk = it_tok_floats(&l, false) * BIG_TOK, nv = it_tok_floats(&l, true) * BIG_TOK;
  float *k = malloc(nk * 4), *v = malloc(nv * 4), *gk = malloc(nk * 4), *gv = malloc(nv * 4);
  uint64_t seq = (uint64_t)getpid(); /* its own */
  for (uint32_t n = 0;; n++) {
    if (!get || n == 0) {
      it_fill_f32(k, v, &l, seq, 0, BIG_TOK, n);
      if (kvc_put(h, seq, 0, BIG_TOK, k, v)) _exit(3);
    }
    if (get || n % 8 == 0) {
      if (kvc_get(h, seq, 0, BIG_TOK, gk, gv)) _exit(4);
      if (memcmp(gk, k, nk * 4) || memcmp(gv, v, nv * 4)) _exit(5);
    }
    ready_once(&ready);
  }
}

static void flood_put_fn(const daemon_t *d, int ready) { flood_big(d, ready, false); }
static void flood_get_fn(const daemon_t *d, int ready) { flood_big(d, ready, true); }

TEST(fair_big_puts_beside_verified_work) {
  daemon_t d;
  daemon_start(&d);
  pid_t f[2] = {flood_start(&d, flood_put_fn), 0};
  f[1] = flood_start(&d, flood_put_fn); /* two: 256 of the pool's 512 pages */
  victim_rounds(&d, 200);
  flood_stop(f[0]);
  flood_stop(f[1]);
  daemon_stop(&d);
}

TEST(fair_big_gets_beside_verified_work) {
  daemon_t d;
  daemon_start(&d);
  pid_t f = flood_start(&d, flood_get_fn);
  victim_rounds(&d, 200);
  flood_stop(f);
  kvc_client_t *c = client_open(&d);
  ASSERT(stat_get(c, "offloaded_gets_total", NULL) >= 1);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* ---- a flood of large replies never read (issue 34) ------------------------- */

#define STATS_FLOODERS 4

/* Stats requests the daemon answered: the count of its op="stats" latency
 * histogram, less the Stats requests this client made to read it (each
 * counted after its reply: *calls is how many were made before this one). */
static uint64_t stats_answered(kvc_client_t *c, uint64_t *calls) {
  kvc_stat_t *st;
  size_t n;
  ASSERT_OK(kvc_stats(c, &st, &n));
  uint64_t v = 0;
  for (size_t i = 0; i < n; i++) {
    const char *op = kvc_stat_label(&st[i], "op");
    if (strcmp(st[i].name, "request_duration_seconds") == 0 && op && strcmp(op, "stats") == 0)
      v = st[i].value;
  }
  kvc_stats_free(st);
  ASSERT(v >= *calls);
  return v - (*calls)++;
}

/* A greeted raw connection: one Stats request answered and read (its reply's
 * size in *reply_bytes), then Stats requests sent, never read, until the
 * daemon holds them (write_pauses grew) and the socket takes no more. */
static int stats_never_reader(const daemon_t *d, kvc_client_t *c, uint64_t *calls,
                              size_t *reply_bytes) {
  int fd = it_connect_raw(d->sock);
  raw_hello(fd, KVC_PROTOCOL_VERSION);
  Kvcache__V1__Response *r = raw_reply(fd);
  ASSERT(r && r->status == KVCACHE__V1__STATUS__OK);
  kvcache__v1__response__free_unpacked(r, NULL);
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__StatsRequest sr = KVCACHE__V1__STATS_REQUEST__INIT;
  req.body_case = KVCACHE__V1__REQUEST__BODY_STATS;
  req.stats = &sr;
  req.id = 1u << 20;
  uint8_t frames[64 * 16];
  size_t n = kvcache__v1__request__get_packed_size(&req);
  ASSERT(n < 12);
  for (size_t i = 0; i < 64; i++) {
    uint8_t *p = frames + i * (4 + n);
    p[0] = (uint8_t)n, p[1] = p[2] = p[3] = 0;
    kvcache__v1__request__pack(&req, p + 4);
  }
  ASSERT_EQ(write(fd, frames, 4 + n), (ssize_t)(4 + n));
  r = raw_reply(fd);
  ASSERT(r && r->status == KVCACHE__V1__STATUS__OK && r->body_case == KVCACHE__V1__RESPONSE__BODY_STATS);
  *reply_bytes = kvcache__v1__response__get_packed_size(r);
  kvcache__v1__response__free_unpacked(r, NULL);
  uint64_t pauses = stat_get(c, "write_pauses_total", NULL);
  (*calls)++;
  size_t len = 64 * (4 + n), off = 0;
  double end = hard_now_ms() + 20000;
  for (;;) {
    ASSERT(hard_now_ms() < end);
    ssize_t k = send(fd, frames + off, len - off, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (k > 0) {
      off = (off + (size_t)k) % len;
      continue;
    }
    ASSERT(k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
    (*calls)++;
    if (stat_get(c, "write_pauses_total", NULL) > pauses) return fd;
    struct pollfd pf = {.fd = fd, .events = POLLOUT};
    poll(&pf, 1, 50); /* the daemon reads on: send more */
  }
}

/* Connections pipelining Stats (large replies) they never read: the daemon
 * answers each only until its unsent replies pass a sixteenth of
 * write_queue_bytes (what the socket holds, then 256 KiB), and then runs
 * none of its requests while a reader's work goes on, every byte verified.
 * Counting only: before, each was answered until 4 MiB of replies waited
 * (hundreds of Stats a connection). */
TEST(fair_never_read_stats_cost_a_bounded_count) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  victim_rounds(&d, 5);
  uint64_t calls = 0, a0 = stats_answered(c, &calls);
  int fds[STATS_FLOODERS];
  size_t reply = 0;
  for (int i = 0; i < STATS_FLOODERS; i++) fds[i] = stats_never_reader(&d, c, &calls, &reply);
  uint64_t a1 = stats_answered(c, &calls);
  victim_rounds(&d, 200); /* progress beside them */
  uint64_t a2 = stats_answered(c, &calls);
  ASSERT_U64_EQ(a2, a1); /* held: nothing of theirs ran meanwhile */
  /* What one may be answered: its first (read), what the socket holds
   * (charged to the daemon's send buffer: at most twice wmem_default), the
   * 256 KiB held and the reply that passed it. */
  uint64_t wmem = 212992;
  FILE *f = fopen("/proc/sys/net/core/wmem_default", "r");
  if (f) {
    unsigned long long v;
    if (fscanf(f, "%llu", &v) == 1) wmem = v;
    fclose(f);
  }
  uint64_t bound = 1 + (2 * wmem + (4u << 20) / 16) / reply + 1;
  uint64_t each = (a1 - a0) / STATS_FLOODERS;
  fprintf(stderr, "stats reply %zu bytes; answered %llu a never-read connection (bound %llu)\n",
          reply, (unsigned long long)each, (unsigned long long)bound);
  ASSERT(reply >= 4096);
  ASSERT(each <= bound);
  ASSERT(stat_get(c, "write_pauses_total", NULL) >= STATS_FLOODERS);
  for (int i = 0; i < STATS_FLOODERS; i++) close(fds[i]);
  (void)it_wait_stat(c, "connections_current", 1, false);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* ---- a client behind on its replies waits in the background ------------------- */

/* A reader: pings in a loop, each reply read before the next request. */
static void flood_pings(const daemon_t *d, int ready) {
  kvc_client_t *c = client_open(d);
  for (;;) {
    if (kvc_ping(c)) _exit(3);
    ready_once(&ready);
  }
}

/* A raw connection that says Hello and sends n CacheList requests (ids
 * first_id...) without reading anything, not even the Hello's reply. */
static int behind_conn(const daemon_t *d, int n, uint64_t first_id) {
  int fd = it_connect_raw(d->sock);
  ASSERT(fd >= 0);
  raw_hello(fd, KVC_PROTOCOL_VERSION);
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__Empty e = KVCACHE__V1__EMPTY__INIT;
  req.body_case = KVCACHE__V1__REQUEST__BODY_CACHE_LIST;
  req.cache_list = &e;
  for (int i = 0; i < n; i++) {
    req.id = first_id + (uint64_t)i;
    raw_send_request(fd, &req);
  }
  return fd;
}

#define BEHIND_FRAMES 64
#define BEHIND_TRIES 50

/* A client that has not read its replies waits in the background while a
 * client that reads its own is busy (background_waits), and every one of
 * its requests is answered, in order, once the reader stops. Counting
 * only: whether a given request ran in the reader's gaps is the
 * scheduler's; that the background is entered and left is not. */
TEST(fair_client_behind_on_its_replies_waits_in_the_background) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  pid_t reader = flood_start(&d, flood_pings);
  uint64_t w0 = stat_get(c, "background_waits_total", NULL);
  uint64_t lists0 = stat_get(c, "requests_total{op=cache_list}", NULL);
  int fds[BEHIND_TRIES], n = 0;
  /* Each try a fresh connection: its requests may all run in a gap of the
   * reader (a CPU it lost for a millisecond); the next one waits. */
  while (stat_get(c, "background_waits_total", NULL) == w0) {
    ASSERT(n < BEHIND_TRIES);
    fds[n] = behind_conn(&d, BEHIND_FRAMES, 1000);
    n++;
  }
  ASSERT(stat_get(c, "write_pauses_total", NULL) == 0); /* not held: a few small replies */
  flood_stop(reader);
  /* The reader gone, the background runs: every request is answered. */
  (void)it_wait_stat(c, "requests_total{op=cache_list}", lists0 + (uint64_t)n * BEHIND_FRAMES,
                     false);
  for (int i = 0; i < n; i++) {
    Kvcache__V1__Response *r = raw_reply(fds[i]);
    ASSERT(r && r->status == KVCACHE__V1__STATUS__OK); /* the Hello's */
    kvcache__v1__response__free_unpacked(r, NULL);
    for (int k = 0; k < BEHIND_FRAMES; k++) {
      r = raw_reply(fds[i]);
      ASSERT(r != NULL);
      ASSERT_U64_EQ(r->id, 1000 + (uint64_t)k);
      ASSERT(r->status == KVCACHE__V1__STATUS__OK &&
             r->body_case == KVCACHE__V1__RESPONSE__BODY_CACHE_LIST);
      kvcache__v1__response__free_unpacked(r, NULL);
    }
    close(fds[i]);
  }
  (void)it_wait_stat(c, "connections_current", 1, false);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* A client that fills its read buffer with requests it never reads the
 * replies of, and goes: the daemon, which no longer reads from it, closes
 * it all the same while a reader is busy (a background connection's client
 * gone is swept: POLLHUP), and holds no more than its read buffer for it
 * meanwhile. Each round a new such client: none is left behind. */
TEST(fair_client_gone_while_behind_is_closed) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  pid_t reader = flood_start(&d, flood_pings);
  for (int round = 0; round < 8; round++) {
    int fd = behind_conn(&d, 1, 1);
    uint8_t frames[1024];
    Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
    Kvcache__V1__Empty e = KVCACHE__V1__EMPTY__INIT;
    req.body_case = KVCACHE__V1__REQUEST__BODY_CACHE_LIST;
    req.cache_list = &e;
    req.id = 7;
    size_t len = kvcache__v1__request__get_packed_size(&req), per = 4 + len, nf = sizeof frames / per;
    for (size_t i = 0; i < nf; i++) {
      frames[i * per] = (uint8_t)len, frames[i * per + 1] = frames[i * per + 2] = frames[i * per + 3] = 0;
      kvcache__v1__request__pack(&req, frames + i * per + 4);
    }
    /* Until the socket takes no more: the daemon stopped reading (its read
     * buffer full) or it is a long way behind. */
    for (;;) {
      ssize_t k = send(fd, frames, nf * per, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (k > 0) continue;
      ASSERT(k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
      break;
    }
    close(fd);
    (void)it_wait_stat(c, "connections_current", 2, false); /* c and the reader */
  }
  flood_stop(reader);
  kvc_client_close(c);
  daemon_stop(&d);
}
