/* bench_cluster.h: the rows of the cluster tier (doc/cluster.md), included
 * by kvc_bench.c (group "cluster"). A Redis Cluster of 3 masters on
 * loopback ports (on the clients' CPU), two kvcached nodes sharing it:
 *
 *   attach from the cluster: node 2 attaches a 4096-token prompt that node
 *     1 prefilled (256 pages of 512 KiB: 128 MiB), its cache dropped before
 *     each trial so that every page comes from the cluster, verified and
 *     imported; against the same values fetched by a plain hiredis client
 *     in the same run: every GET sent to every master first (one pipeline a
 *     node: MGET cannot span slots), then every reply read. Goal >= 0.8x.
 *   local puts with ids (each page indexed, and written behind to the
 *     cluster) and gets, tier on vs a node without it, alternating trials:
 *     within noise (goal >= 0.9x).
 */
#ifndef KVC_BENCH_CLUSTER_H
#define KVC_BENCH_CLUSTER_H

#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <sys/stat.h>

#define CL_NODES 3
#define CL_TOKENS 4096
#define CL_PAGE (512 * KiB)
#define CL_TOKEN_BYTES (32 * KiB) /* 8 layers x 4 KiB */
static const kvc_layout_t cl_layout = {8, 8, 128, 128, KVC_DTYPE_BF16, 16};

typedef struct cl {
  int port[CL_NODES];
  pid_t pid[CL_NODES];
  char seeds[64];
} cl_t;

static redisContext *cl_conn(const cl_t *c, int i) {
  struct timeval tv = {10, 0};
  redisContext *r = redisConnectWithTimeout("127.0.0.1", c->port[i], tv);
  if (!r || r->err) die("redis :%d: %s", c->port[i], r ? r->errstr : "?");
  redisSetTimeout(r, tv);
  return r;
}

/* Whether node i's reply to the two-word command a b holds needle. */
static bool cl_says(const cl_t *c, int i, const char *needle, const char *a, const char *b) {
  struct timeval tv = {2, 0};
  redisContext *r = redisConnectWithTimeout("127.0.0.1", c->port[i], tv);
  const char *argv[2] = {a, b};
  redisReply *rep = r && !r->err ? redisCommandArgv(r, 2, argv, NULL) : NULL;
  bool yes = rep && rep->type == REDIS_REPLY_STRING && strstr(rep->str, needle);
  freeReplyObject(rep);
  redisFree(r);
  return yes;
}

static void cl_start(cl_t *c) {
  int fds[2 * CL_NODES], ports[2 * CL_NODES];
  for (int i = 0; i < 2 * CL_NODES; i++) { /* free loopback ports, all bound at once */
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fds[i] < 0 || bind(fds[i], (struct sockaddr *)&a, sizeof a) ||
        getsockname(fds[i], (struct sockaddr *)&a, &len))
      die("a free port: %s", strerror(errno));
    ports[i] = ntohs(a.sin_port);
  }
  for (int i = 0; i < 2 * CL_NODES; i++) close(fds[i]);
  char nodes[256] = "";
  for (int i = 0; i < CL_NODES; i++) {
    char port[16], bus[16], dir[128], log[160];
    c->port[i] = ports[i];
    snprintf(port, sizeof port, "%d", ports[i]);
    snprintf(bus, sizeof bus, "%d", ports[CL_NODES + i]);
    snprintf(dir, sizeof dir, "%s/redis-%d", tmpdir, i);
    snprintf(log, sizeof log, "%s/redis-%d.log", tmpdir, i);
    if (mkdir(dir, 0700) != 0) die("mkdir %s: %s", dir, strerror(errno));
    const char *argv[] = {"/usr/bin/redis-server", "--port", port, "--bind", "127.0.0.1",
                          "--cluster-enabled", "yes", "--cluster-port", bus,
                          "--cluster-config-file", "nodes.conf", "--dir", dir, "--save", "",
                          "--appendonly", "no", "--daemonize", "no", NULL};
    /* On the clients' CPU: here node 2 and the plain client are Redis's
     * clients, and each gets the other CPU to itself while it runs. */
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) die("fork: %s", strerror(errno));
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      place_on(false);
      int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
      execv(argv[0], (char *const *)argv);
      _exit(127);
    }
    c->pid[i] = pid;
    snprintf(nodes + strlen(nodes), sizeof nodes - strlen(nodes), " 127.0.0.1:%d", ports[i]);
  }
  for (int i = 0; i < CL_NODES; i++)
    for (int t = 0; !cl_says(c, i, "redis_version", "INFO", "server"); t++) {
      if (t > 1000) die("redis-server :%d did not start", c->port[i]);
      struct timespec ts = {0, 10 * 1000000L};
      nanosleep(&ts, NULL);
    }
  char cmd[512];
  snprintf(cmd, sizeof cmd, "redis-cli --cluster create%s --cluster-replicas 0 --cluster-yes "
           ">%s/cluster-create.log 2>&1", nodes, tmpdir);
  if (system(cmd) != 0) die("redis-cli --cluster create failed (see %s)", tmpdir);
  for (int i = 0; i < CL_NODES; i++)
    for (int t = 0; !cl_says(c, i, "cluster_state:ok", "CLUSTER", "INFO"); t++) {
      if (t > 3000) die("the cluster did not reach cluster_state:ok");
      struct timespec ts = {0, 10 * 1000000L};
      nanosleep(&ts, NULL);
    }
  snprintf(c->seeds, sizeof c->seeds, "127.0.0.1:%d", c->port[0]);
}

static void cl_stop(cl_t *c) {
  for (int i = 0; i < CL_NODES; i++) {
    kill(c->pid[i], SIGTERM);
    waitpid(c->pid[i], NULL, 0);
  }
}

/* The keys of the pages in the cluster, by node. */
typedef struct cl_keys {
  char *key[CL_NODES][CL_TOKENS / 16];
  int n[CL_NODES];
  uint64_t total;
} cl_keys_t;

static void cl_find_keys(const cl_t *c, cl_keys_t *k) {
  memset(k, 0, sizeof *k);
  for (int i = 0; i < CL_NODES; i++) {
    redisContext *r = cl_conn(c, i);
    redisReply *rep = redisCommand(r, "KEYS kvc1:*");
    if (!rep || rep->type != REDIS_REPLY_ARRAY) die("KEYS on :%d", c->port[i]);
    for (size_t j = 0; j < rep->elements && k->n[i] < CL_TOKENS / 16; j++)
      k->key[i][k->n[i]++] = strdup(rep->element[j]->str);
    k->total += rep->elements;
    freeReplyObject(rep);
    redisFree(r);
  }
}

/* The reference: every GET sent to every node, then every reply read. */
typedef struct cl_ref {
  const cl_keys_t *k;
  redisContext *r[CL_NODES];
  uint64_t bytes; /* of the last fetch */
} cl_ref_t;

static int op_cl_fetch(void *p) {
  cl_ref_t *f = p;
  f->bytes = 0;
  for (int i = 0; i < CL_NODES; i++) {
    for (int j = 0; j < f->k->n[i]; j++) redisAppendCommand(f->r[i], "GET %s", f->k->key[i][j]);
    int done = 0;
    while (!done)
      if (redisBufferWrite(f->r[i], &done) != REDIS_OK) return -1;
  }
  for (int i = 0; i < CL_NODES; i++)
    for (int j = 0; j < f->k->n[i]; j++) {
      redisReply *rep;
      if (redisGetReply(f->r[i], (void **)&rep) != REDIS_OK || rep->type != REDIS_REPLY_STRING)
        return -1;
      f->bytes += rep->len;
      freeReplyObject(rep);
    }
  return 0;
}

/* The figure: node 2 attaches the prompt. */
typedef struct cl_att {
  kvc_client_t *c;
  kvc_cache_t *h;
  uint32_t *ids;
  uint64_t got;
} cl_att_t;

/* One trial of one attach alone, timed inside (the drop is not). */
static double cl_attach_once(cl_att_t *a, double *wait) {
  if (kvc_cache_drop(a->h) != 0 || kvc_cache_open(a->c, "prompts", &cl_layout, &a->h) != 0)
    die("drop and reopen on node 2");
  kvc_match_t m;
  double w0 = run_delay_ns(), t0 = now_ns();
  must(a->c, kvc_attach(a->h, 1, a->ids, CL_TOKENS, false, &m), "attach from the cluster");
  double t = now_ns() - t0;
  *wait = (run_delay_ns() - w0) / t;
  a->got = m.tokens;
  return t;
}

/* Puts with token ids of 32 tokens (1 MiB) along fresh prompts. */
typedef struct cl_put {
  kvc_client_t *c;
  kvc_cache_t *h;
  uint64_t seq, pos;
  uint32_t prompt;
} cl_put_t;

static int op_cl_put_ids(void *p) {
  cl_put_t *t = p;
  if (t->pos + 32 > CL_TOKENS) {
    if (kvc_seq_remove(t->h, t->seq, 0, UINT64_MAX) != 0) return -1;
    t->pos = 0;
    t->prompt++;
  }
  uint32_t *ids = NULL;
  void *base;
  kvc_client_shm(t->c, &base, NULL);
  ids = (uint32_t *)((uint8_t *)base + 2 * MiB);
  for (int i = 0; i < 32; i++) ids[i] = t->prompt * 100003u + (uint32_t)(t->pos + (uint64_t)i);
  kvc_shm_io_t e = {.seq_id = t->seq, .pos = t->pos, .ntokens = 32, .k_off = 0,
                    .v_off = 512 * KiB, .tok_off = 2 * MiB, .tok_len = 128};
  t->pos += 32;
  return kvc_put_shm(t->h, NULL, &e, 1);
}

static int op_cl_get(void *p) {
  cl_put_t *t = p;
  kvc_shm_io_t e = {.seq_id = 7, .pos = t->pos, .ntokens = 32, .k_off = 0, .v_off = 512 * KiB};
  t->pos = (t->pos + 32) % CL_TOKENS;
  return kvc_get_shm(t->h, NULL, &e, 1);
}

static void bench_cluster(void) {
  section("cluster tier");
  cl_t c;
  cl_start(&c);
  char secret[160];
  snprintf(secret, sizeof secret, "%s/secret", tmpdir);
  int fd = open(secret, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || write(fd, "a-bench-fleet-secret-of-32-bytes", 32) != 32) die("secret");
  close(fd);
  const char *on[] = {"--pool-bytes", "1GiB", "--page-bytes", "512KiB", "--cluster-nodes",
                      c.seeds, "--cluster-secret-file", secret, "--cluster-lookup-timeout-ms",
                      "10000", "--cluster-queue-pages", "65536", NULL};
  const char *off[] = {"--pool-bytes", "1GiB", "--page-bytes", "512KiB", NULL};
  kd_t n1, n2, n0;
  kd_start(&n1, "node1", on);
  kd_start(&n2, "node2", on);
  /* Node 1 prefills the prompt; its 256 pages are written behind. */
  kvc_client_t *c1 = kc_open(&n1, 16 * MiB), *c2 = kc_open(&n2, 16 * MiB);
  kvc_cache_t *h1 = kc_cache(c1, "prompts", &cl_layout);
  uint32_t *ids = malloc(CL_TOKENS * sizeof *ids);
  for (int i = 0; i < CL_TOKENS; i++) ids[i] = 7u * 1000003u + (uint32_t)i;
  void *base;
  kvc_client_shm(c1, &base, NULL);
  fill_bytes(base, 8 * MiB, 3);
  for (uint64_t pos = 0; pos < CL_TOKENS; pos += 128) { /* 4 MiB a put */
    memcpy((uint8_t *)base + 12 * MiB, ids + pos, 128 * 4);
    kvc_shm_io_t e = {.seq_id = 1, .pos = pos, .ntokens = 128, .k_off = 0, .v_off = 2 * MiB,
                      .tok_off = 12 * MiB, .tok_len = 512};
    must(c1, kvc_put_shm(h1, NULL, &e, 1), "prefill");
  }
  for (int t = 0; stat_of(c1, "tier_writes_total") < CL_TOKENS / 16; t++) {
    if (t > 6000) die("node 1 wrote %llu of %d pages to the cluster",
                      (unsigned long long)stat_of(c1, "tier_writes_total"), CL_TOKENS / 16);
    struct timespec ts = {0, 10 * 1000000L};
    nanosleep(&ts, NULL);
  }
  cl_keys_t keys;
  cl_find_keys(&c, &keys);
  if (keys.total != CL_TOKENS / 16) die("%llu values in the cluster", (unsigned long long)keys.total);
  cl_ref_t ref = {&keys, {0}, 0};
  /* The three Redis nodes share the clients' CPU by design and wait for one
   * another while they serve a pipeline: their run_delay is the placement,
   * not other load, and would call every trial busy. Not watched: what the
   * busy-machine rule sees is this thread and the daemons, on the other CPU. */
  for (int i = 0; i < CL_NODES; i++) ref.r[i] = cl_conn(&c, i);
  cl_att_t att = {c2, kc_cache(c2, "prompts", &cl_layout), ids, 0};
  meas_t fig = {.ok = true}, rm = {.ok = true};
  double w;
  (void)cl_attach_once(&att, &w); /* warm: connections, buffers */
  place_on(true);
  if (op_cl_fetch(&ref)) die("reference fetch");
  place_on(false);
  for (int t = 0; t < TRIALS; t++) {
    fig.tr[t] = cl_attach_once(&att, &fig.wait[t]);
    if (att.got != CL_TOKENS) die("attach from the cluster got %llu tokens",
                                  (unsigned long long)att.got);
    /* The plain client runs where node 2 does, beside Redis, as node 2 is
     * Redis's client here. */
    place_on(true);
    double w0 = run_delay_ns(), t0 = now_ns();
    if (op_cl_fetch(&ref)) die("reference fetch");
    rm.tr[t] = now_ns() - t0;
    rm.wait[t] = (run_delay_ns() - w0) / rm.tr[t];
    place_on(false);
  }
  row_t *r = row_add("attach 4096 tokens (128 MiB) from the cluster, node 2", BV_GOAL_MIN, 0.8);
  row_fig(r, &fig, FMT_GBS, (double)ref.bytes);
  row_part(r, &rm, 1, 0, NULL);
  snprintf(r->ref, sizeof r->ref, "pipelined GETs, same CPU");
  snprintf(r->note, sizeof r->note, "%.0f MiB of values", (double)ref.bytes / MiB);
  for (int i = 0; i < CL_NODES; i++) redisFree(ref.r[i]);

  /* Local puts (with ids: indexed and written behind) and gets, tier on
   * (node 2) vs off (node 0), alternating. */
  kd_start(&n0, "node0", off);
  kvc_client_t *c0 = kc_open(&n0, 16 * MiB);
  cl_put_t pon = {c2, kc_cache(c2, "local", &cl_layout), 1, 0, 1000};
  cl_put_t poff = {c0, kc_cache(c0, "local", &cl_layout), 1, 0, 1000};
  void *b0, *b2;
  kvc_client_shm(c0, &b0, NULL);
  kvc_client_shm(c2, &b2, NULL);
  fill_bytes(b0, 1 * MiB, 5);
  fill_bytes(b2, 1 * MiB, 5);
  const op_fn puts[2] = {op_cl_put_ids, op_cl_put_ids};
  void *const put_ctx[2] = {&pon, &poff};
  meas_t pm[2];
  measure_side(puts, put_ctx, 2, TRIAL_MS, 10, pm);
  r = row_add("1 MiB put with ids: tier on vs off", BV_GOAL_MIN, 0.9);
  row_fig(r, &pm[0], FMT_GBS, 1.0 * MiB);
  row_part(r, &pm[1], 1, 0, NULL);
  snprintf(r->ref, sizeof r->ref, "tier off");
  snprintf(r->note, sizeof r->note, "%llu pages written behind",
           (unsigned long long)stat_of(c2, "tier_writes_total"));
  for (uint64_t pos = 0; pos < CL_TOKENS; pos += 32) { /* the sequence the gets walk */
    kvc_shm_io_t e = {.seq_id = 7, .pos = pos, .ntokens = 32, .k_off = 0, .v_off = 512 * KiB};
    must(c2, kvc_put_shm(pon.h, NULL, &e, 1), "fill");
    must(c0, kvc_put_shm(poff.h, NULL, &e, 1), "fill");
  }
  pon.pos = poff.pos = 0;
  /* The put row's pages still written behind would have Redis (on the
   * clients' CPU) compete with the gets' client: the queue drains first. */
  for (int t = 0; stat_of(c2, "tier_queue_pages") > 0; t++) {
    if (t > 6000) die("node 2's write-behind queue did not drain");
    struct timespec ts = {0, 10 * 1000000L};
    nanosleep(&ts, NULL);
  }
  const op_fn gets[2] = {op_cl_get, op_cl_get};
  meas_t gm[2];
  measure_side(gets, put_ctx, 2, TRIAL_MS, 10, gm);
  r = row_add("1 MiB get: tier on vs off", BV_GOAL_MIN, 0.9);
  row_fig(r, &gm[0], FMT_GBS, 1.0 * MiB);
  row_part(r, &gm[1], 1, 0, NULL);
  snprintf(r->ref, sizeof r->ref, "tier off");
  kvc_client_close(c0);
  kvc_client_close(c1);
  kvc_client_close(c2);
  stop(n0.pid);
  stop(n1.pid);
  stop(n2.pid);
  cl_stop(&c);
  for (int i = 0; i < CL_NODES; i++)
    for (int j = 0; j < keys.n[i]; j++) free(keys.key[i][j]);
  free(ids);
}

#endif
