/* cluster.c: the cluster tier (doc/cluster.md) on a real Redis Cluster of
 * 3 masters and 3 replicas (redis.h) shared by two kvcached daemons, two
 * "nodes" with their own sockets and pools: a prompt prefilled through node
 * 1 is attached on node 2 byte for byte with no put there; tenants stay
 * apart; a corrupted, truncated, stale or planted value is never served; a
 * slot migrated and a master killed while clients run cost no wrong byte
 * and no failed request; with the whole cluster stopped local service goes
 * on. Every wait polls a figure of the daemon or of Redis. */
#include <arpa/inet.h>
#include <grp.h>
#include <netinet/in.h>
#include <pthread.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>

#include "../../daemon/tiers/cluster/rvalue.h"
#include "json.h"
#include "redis.h"

#define T 16u         /* page_tokens of it_layout */
#define UID_B 64002u  /* another tenant: a real other uid */
#define HDR 168       /* a value's header (rvalue.c) */

typedef struct fleet {
  rcl_t rc;
  char secret[128];   /* the shared secret's file */
  char auth[128];     /* the ACL user's (RCL_ACL_AUTH) */
  daemon_t d1, d2;
} fleet_t;

static void write_secret(const char *path, const char *text) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ASSERT(fd >= 0);
  ASSERT_EQ(write(fd, text, strlen(text)), (long long)strlen(text));
  close(fd);
}

/* A daemon of the fleet: the cluster, the secret, other uids admitted. */
static void node_start(fleet_t *f, daemon_t *d, const char *const *more) {
  const char *args[32] = {"--cluster-nodes", f->rc.seeds, "--cluster-secret-file", f->secret,
                          "--cluster-auth-file", f->auth, "--cluster-lookup-timeout-ms", "5000",
                          "--allow-uids", "self,root,64002", "--socket-mode", "0666"};
  int n = 12;
  for (int i = 0; more && more[i] && n < 30; i++) args[n++] = more[i];
  args[n] = NULL;
  daemon_start_args(d, args);
  ASSERT_EQ(chmod(d->dir, 0755), 0);
}

static void fleet_start(fleet_t *f, const char *const *more) {
  memset(f, 0, sizeof *f);
  rcl_start(&f->rc);
  snprintf(f->secret, sizeof f->secret, "%s/secret", f->rc.dir);
  write_secret(f->secret, "an-example-fleet-secret-of-32-by\n");
  snprintf(f->auth, sizeof f->auth, "%s/auth", f->rc.dir);
  write_secret(f->auth, RCL_ACL_AUTH);
  ASSERT_EQ(chmod(f->rc.dir, 0711), 0); /* workers of another uid see their stop file */
  node_start(f, &f->d1, more);
  node_start(f, &f->d2, more);
}

static void fleet_stop(fleet_t *f) {
  daemon_stop(&f->d1);
  daemon_stop(&f->d2);
  rcl_stop(&f->rc);
}

/* The ids of prompt p: distinct per prompt and position. */
static uint32_t *prompt(uint32_t p, uint64_t n) {
  uint32_t *t = malloc(n * sizeof *t);
  for (uint64_t i = 0; i < n; i++) t[i] = p * 1000003u + (uint32_t)i;
  return t;
}

static kvc_cache_t *open_cache(kvc_client_t *c, const char *name) {
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open_salted(c, name, &l, "s", 1, &h));
  return h;
}

/* Prefills prompt p (n tokens) as seq with p's bytes. */
static void prefill(kvc_cache_t *h, uint64_t seq, uint32_t p, uint64_t n) {
  const kvc_layout_t *l = kvc_cache_layout(h);
  float *k = calloc(it_tok_floats(l, false) * n, 4), *v = calloc(it_tok_floats(l, true) * n, 4);
  uint32_t *ids = prompt(p, n);
  it_fill_f32(k, v, l, p, 0, n, 0);
  ASSERT_OK(kvc_put_tokens(h, seq, 0, n, k, v, ids));
  free(k), free(v), free(ids);
}

/* Whether seq's [0, n) holds prompt p's bytes, byte for byte. */
static bool holds(kvc_cache_t *h, uint64_t seq, uint32_t p, uint64_t n) {
  const kvc_layout_t *l = kvc_cache_layout(h);
  size_t kn = it_tok_floats(l, false) * n, vn = it_tok_floats(l, true) * n;
  float *k = calloc(kn, 4), *v = calloc(vn, 4), *gk = calloc(kn, 4), *gv = calloc(vn, 4);
  it_fill_f32(k, v, l, p, 0, n, 0);
  bool same = kvc_get(h, seq, 0, n, gk, gv) == 0 && memcmp(gk, k, kn * 4) == 0 &&
              memcmp(gv, v, vn * 4) == 0;
  free(k), free(v), free(gk), free(gv);
  return same;
}

/* Attaches prompt p's n tokens as seq: the tokens attached. */
static uint64_t attach(kvc_cache_t *h, uint64_t seq, uint32_t p, uint64_t n) {
  uint32_t *ids = prompt(p, n);
  kvc_match_t m = {0};
  int rc = kvc_attach(h, seq, ids, n, false, &m);
  free(ids);
  if (rc) TEST_FAIL_("attach: %s", kvc_err_name(rc)); /* (a daemon gone: its log is kept) */
  return m.tokens;
}

/* Waits until the daemon's figure reaches at least want (20 s). */
static uint64_t wait_stat(const daemon_t *d, const char *name, uint64_t want) {
  kvc_client_t *c = client_open(d);
  uint64_t v = it_wait_stat(c, name, want, true);
  kvc_client_close(c);
  return v;
}

IT_UNUSED static uint64_t stat_of(const daemon_t *d, const char *name) {
  kvc_client_t *c = client_open(d);
  uint64_t v = stat_get(c, name, NULL);
  kvc_client_close(c);
  return v;
}

/* ---- the figures ----------------------------------------------------------------- */

/* Every family with a tier label a daemon with the tier exports is in
 * doc/stats.md's "The tiers" table with its kind and unit, and every row of it
 * is exported. */
static void tier_figures_match_the_doc(kvc_client_t *c) {
  char path[512], line[1024];
  snprintf(path, sizeof path, "%s/doc/stats.md", it_srcdir());
  FILE *f = fopen(path, "r");
  ASSERT(f != NULL);
  char names[64][64], kinds[64][16], units[64][16];
  int n = 0;
  bool in = false;
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "## ", 3) == 0) in = strncmp(line, "## The tiers", 12) == 0;
    if (!in || strncmp(line, "| `", 3) != 0) continue;
    ASSERT(n < 64);
    char *cell[4] = {NULL}, *save = NULL; /* | `name` | kind | unit | ... */
    cell[0] = strtok_r(line, "|", &save);
    for (int k = 1; k < 4; k++) cell[k] = strtok_r(NULL, "|", &save);
    ASSERT(cell[3] != NULL);
    ASSERT_EQ(sscanf(cell[0], " `%63[a-z_]`", names[n]), 1);
    ASSERT_EQ(sscanf(cell[1], " %15[a-z]", kinds[n]), 1);
    if (sscanf(cell[2], " %15[a-z]", units[n]) != 1) units[n][0] = '\0';
    n++;
  }
  fclose(f);
  ASSERT(n >= 15);
  kvc_stat_t *st;
  size_t ns;
  ASSERT_OK(kvc_stats(c, &st, &ns));
  static const char *const kind[] = {"counter", "gauge", "histogram", "info"};
  bool seen[64] = {false};
  for (size_t i = 0; i < ns; i++) { /* the tiers' families: those with a tier label */
    if (strncmp(st[i].name, "tier_", 5) != 0 || !kvc_stat_label(&st[i], "tier")) continue;
    int k = 0;
    while (k < n && strcmp(names[k], st[i].name) != 0) k++;
    if (k == n) TEST_FAIL_("exported, not in doc/stats.md's Tiers: %s", st[i].name);
    ASSERT_STR_EQ(kind[st[i].kind], kinds[k]);
    ASSERT_STR_EQ(st[i].unit, units[k]);
    ASSERT(kvc_stat_label(&st[i], "tier") && st[i].help[0]);
    seen[k] = true;
  }
  for (int k = 0; k < n; k++)
    if (!seen[k]) TEST_FAIL_("in doc/stats.md's Tiers, not exported: %s", names[k]);
  kvc_stats_free(st);
}

/* ---- across nodes ------------------------------------------------------------ */

static void drop_to(uid_t uid) {
  if (setgroups(0, NULL) != 0 || setresgid(uid, uid, uid) != 0 || setresuid(uid, uid, uid) != 0)
    _exit(90);
}

/* Another tenant on node 2 asks for the same prompt of the same cache name:
 * it gets nothing, from the pool or the cluster. Exit status 0: held. */
static int other_tenant(const daemon_t *d2) {
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    drop_to(UID_B);
    kvc_client_t *c = client_open(d2);
    kvc_cache_t *h = open_cache(c, "llama");
    uint32_t *ids = prompt(1, 64);
    kvc_match_t m = {99, 99, 99};
    int rc = kvc_attach(h, 1, ids, 64, false, &m);
    _exit(rc != 0 ? 91 : m.tokens != 0 ? 92 : 0);
  }
  int st;
  ASSERT(waitpid(pid, &st, 0) == pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

TEST_TIMEOUT(cluster_prompt_prefilled_on_one_node_attaches_on_another, 120) {
  fleet_t f;
  fleet_start(&f, NULL);
  kvc_client_t *c1 = client_open(&f.d1), *c2 = client_open(&f.d2), *ev1 = client_open(&f.d1);
  ASSERT_OK(kvc_events_subscribe(ev1, "llama", true));
  kvc_cache_t *h1 = open_cache(c1, "llama"), *h2 = open_cache(c2, "llama");
  prefill(h1, 1, 1, 64 + 5); /* 4 whole pages and a partial one */
  wait_stat(&f.d1, "tier_writes_total", 4);
  /* The event stream: each page stored on CPU, then on REMOTE once written
   * to the cluster, with the same hash, parent and ids. */
  uint8_t cpu[4][32], remote[4][32];
  int ncpu = 0, nremote = 0;
  while (ncpu < 4 || nremote < 4) {
    kvc_event_t e;
    ASSERT_OK(kvc_events_next(ev1, 10000, &e));
    if (e.kind != KVC_EVENT_STORED) continue;
    ASSERT_EQ(e.ntokens, 16);
    if (strcmp(e.medium, "CPU") == 0 && ncpu < 4) memcpy(cpu[ncpu++], e.hash, 32);
    else if (strcmp(e.medium, "REMOTE") == 0 && nremote < 4) memcpy(remote[nremote++], e.hash, 32);
    else TEST_FAIL_("a stored event on %s", e.medium);
  }
  for (int i = 0; i < 4; i++) {
    bool seen = false;
    for (int j = 0; j < 4; j++) seen |= memcmp(cpu[i], remote[j], 32) == 0;
    ASSERT(seen);
  }
  kvc_client_close(ev1);
  ASSERT_EQ(attach(h2, 7, 1, 64 + 5), 64);
  ASSERT(holds(h2, 7, 1, 64));
  ASSERT_EQ(stat_get(c2, "puts_total", NULL), 0); /* nothing was put on node 2 */
  ASSERT_EQ(stat_get(c2, "tier_hit_pages_total", NULL), 4);
  ASSERT_EQ(stat_get(c2, "tier_hit_tokens_total", NULL), 64);
  ASSERT_EQ(stat_get(c2, "tier_discarded_total", NULL), 0);
  ASSERT_EQ(stat_get(c2, "tier_writes_total", NULL), 0); /* imported pages are not written back */
  tier_figures_match_the_doc(c2);
  /* held locally now: the next attach asks the cluster nothing */
  uint64_t asked = stat_get(c2, "tier_lookups_total", NULL);
  ASSERT_EQ(attach(h2, 8, 1, 64), 64);
  ASSERT_EQ(stat_get(c2, "tier_lookups_total", NULL), asked);
  /* a longer prompt: the pool's four pages, then the cluster's next ones,
   * found by a match (which brings them into the pool), then attached */
  prefill(h1, 2, 1, 128);
  wait_stat(&f.d1, "tier_writes_total", 8);
  uint32_t *ids = prompt(1, 128);
  kvc_match_t m = {0};
  ASSERT_OK(kvc_match(h2, ids, 128, &m));
  free(ids);
  ASSERT_EQ(m.tokens, 128);
  asked = stat_get(c2, "tier_lookups_total", NULL);
  ASSERT_EQ(attach(h2, 9, 1, 128), 128);
  ASSERT_EQ(stat_get(c2, "tier_lookups_total", NULL), asked); /* from the pool */
  ASSERT(holds(h2, 9, 1, 128));
  ASSERT_EQ(stat_get(c2, "tier_lookup_pages_total", NULL), 4 + 4);
  /* a tenant of another uid shares nothing, though it names the cache alike */
  ASSERT_EQ(other_tenant(&f.d2), 0);
  /* the daemons speak to the cluster as the ACL user of cluster_auth_file */
  redisReply *cl = rcl_cmd(&f.rc, 0, "CLIENT LIST");
  ASSERT(cl && cl->type == REDIS_REPLY_STRING && strstr(cl->str, " user=kvc "));
  freeReplyObject(cl);
  /* cluster_write = evicted: a page goes to the cluster when the pool
   * reclaims it, not before */
  daemon_t d3;
  const char *evicted[] = {"--cluster-write", "evicted", NULL};
  node_start(&f, &d3, evicted);
  kvc_client_t *c3 = client_open(&d3);
  kvc_cache_t *h3 = open_cache(c3, "llama");
  prefill(h3, 1, 3, 64);
  ASSERT_OK(kvc_seq_remove(h3, 1, 0, UINT64_MAX)); /* its 4 pages cached */
  ASSERT_EQ(stat_get(c3, "tier_writes_total", NULL), 0);
  for (uint64_t s = 100; stat_get(c3, "tier_writes_total", NULL) < 4; s++) {
    ASSERT(s < 2000); /* the 8 MiB pool holds 512 pages: plain puts reclaim them */
    const kvc_layout_t *l3 = kvc_cache_layout(h3);
    float *k = calloc(it_tok_floats(l3, false) * 64, 4), *v = calloc(it_tok_floats(l3, true) * 64, 4);
    ASSERT_OK(kvc_put(h3, s, 0, 64, k, v));
    free(k), free(v);
  }
  ASSERT_EQ(attach(h2, 30, 3, 64), 64); /* node 2 attaches what node 3 let go of */
  ASSERT(holds(h2, 30, 3, 64));
  kvc_cache_close(h3);
  kvc_client_close(c3);
  daemon_stop(&d3);
  /* cluster_read_replicas: lookups read from the replicas (READONLY), once
   * CLUSTER SLOTS lists them */
  for (int i = 0;; i++) {
    redisReply *sl = rcl_cmd(&f.rc, 0, "CLUSTER SLOTS");
    bool all = sl && sl->type == REDIS_REPLY_ARRAY && sl->elements >= 3;
    for (size_t e = 0; all && e < sl->elements; e++) all = sl->element[e]->elements >= 4;
    freeReplyObject(sl);
    if (all) break;
    ASSERT(i < 3000);
    it_sleep_ms(10);
  }
  daemon_t d4;
  const char *replicas[] = {"--cluster-read-replicas", "true", NULL};
  node_start(&f, &d4, replicas);
  kvc_client_t *c4 = client_open(&d4);
  kvc_cache_t *h4 = open_cache(c4, "llama");
  ASSERT_EQ(attach(h4, 1, 1, 128), 128);
  ASSERT(holds(h4, 1, 1, 128));
  int readers = 0;
  for (int i = 0; i < RCL_NODES; i++) {
    if (!rcl_says(&f.rc, i, "role:slave", "INFO replication")) continue;
    redisReply *cl4 = rcl_cmd(&f.rc, i, "CLIENT LIST");
    readers += cl4 && cl4->type == REDIS_REPLY_STRING && strstr(cl4->str, " flags=r ");
    freeReplyObject(cl4);
  }
  ASSERT(readers > 0);
  kvc_cache_close(h4);
  kvc_client_close(c4);
  daemon_stop(&d4);
  /* the other direction, and kvcachectl's view of the tier */
  prefill(h2, 20, 2, 32);
  wait_stat(&f.d2, "tier_writes_total", 2);
  ASSERT_EQ(attach(h1, 21, 2, 32), 32);
  ASSERT(holds(h1, 21, 2, 32));
  char out[16384];
  ASSERT_EQ(ctl_run(&f.d2, out, sizeof out, true, "tier"), 0);
  ASSERT(strstr(out, "tier cluster: up, 16384 of 16384 slots mapped") && strstr(out, " master "));
  ASSERT_EQ(ctl_run(&f.d2, out, sizeof out, false, "tier --json"), 0);
  json_t *j = json_parse_or_fail(out);
  json_t *t = json_get(j, "tiers", "cluster", NULL);
  ASSERT_EQ(json_u64(json_get(t, "up", NULL)), 1);
  ASSERT_EQ(json_u64(json_get(t, "hit_pages", NULL)), 12);
  ASSERT(json_len(json_get(t, "nodes", NULL)) >= 3); /* replicas: once CLUSTER SLOTS lists them */
  json_free(j);
  kvc_cache_close(h1), kvc_cache_close(h2);
  kvc_client_close(c1), kvc_client_close(c2);
  fleet_stop(&f);
}

/* ---- values that must not be served ------------------------------------------ */

/* A page's value as the cluster holds it, and where. */
typedef struct stored {
  char key[RVALUE_KEY_MAX];
  int node;            /* the master holding it */
  char *val;
  size_t len;
} stored_t;

/* The values of the pages in the cluster, ordered along their chain by
 * their headers (flags at 12, hash at 88, parent at 120): n of them. */
static void find_pages(const rcl_t *rc, stored_t *out, size_t n) {
  stored_t all[64];
  size_t k = 0;
  for (int i = 0; i < RCL_NODES; i++) {
    if (!rc->pid[i] || !rcl_says(rc, i, "role:master", "INFO replication")) continue;
    redisReply *keys = rcl_cmd(rc, i, "KEYS kvc1:*");
    ASSERT(keys && keys->type == REDIS_REPLY_ARRAY);
    for (size_t j = 0; j < keys->elements && k < 64; j++, k++) {
      snprintf(all[k].key, sizeof all[k].key, "%s", keys->element[j]->str);
      all[k].node = i;
      redisReply *v = rcl_cmd(rc, i, "GET %s", all[k].key);
      ASSERT(v && v->type == REDIS_REPLY_STRING && v->len > HDR);
      all[k].val = malloc(v->len);
      memcpy(all[k].val, v->str, v->len);
      all[k].len = v->len;
      freeReplyObject(v);
    }
    freeReplyObject(keys);
  }
  ASSERT_EQ(k, n);
  const char *prev = NULL;
  for (size_t i = 0; i < n; i++) {
    size_t j = 0;
    for (; j < k; j++) {
      uint32_t flags;
      memcpy(&flags, all[j].val + 12, 4);
      if (prev ? (flags & 1) && memcmp(all[j].val + 120, prev + 88, 32) == 0 : !(flags & 1)) break;
    }
    ASSERT(j < k);
    out[i] = all[j];
    prev = out[i].val;
  }
}

static void put_value(const rcl_t *rc, const stored_t *s, const void *val, size_t len) {
  redisReply *r = rcl_cmd(rc, s->node, "SET %s %b", s->key, val, len);
  ASSERT(r && r->type == REDIS_REPLY_STATUS);
  freeReplyObject(r);
}

/* A value of page s written with secret, as another fleet (or tenant) would:
 * the same chain hash and ids, its own bytes. */
static char *forge(const stored_t *s, const char *secret, const char *tenant, uint32_t p,
                   size_t *len) {
  rvalue_secret_t *sec = rvalue_secret_new(secret, strlen(secret));
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  uint8_t ident[32];
  rvalue_tenant_identity(tenant, ident);
  rvalue_cache_t rcache;
  rvalue_cache_init(&rcache, sec, ident, &l, 16384);
  uint32_t *ids = prompt(p, 64);
  static uint8_t bytes[16384];
  memset(bytes, 0x5a, sizeof bytes);
  engine_page_t pg = {.head = false, .page_tokens = T, .tokens = ids + 2 * T,
                      .bytes = bytes, .data_bytes = sizeof bytes};
  memcpy(pg.hash, s->val + 88, 32);
  memcpy(pg.parent, s->val + 120, 32);
  *len = rvalue_size(&rcache);
  char *v = malloc(*len);
  ASSERT_EQ(rvalue_encode(&rcache, sec, &pg, (uint8_t *)v), 0);
  rvalue_secret_free(sec);
  free(ids);
  return v;
}

TEST_TIMEOUT(cluster_corrupted_truncated_stale_or_planted_values_are_never_served, 120) {
  fleet_t f;
  fleet_start(&f, NULL);
  kvc_client_t *c1 = client_open(&f.d1), *c2 = client_open(&f.d2);
  kvc_cache_t *h1 = open_cache(c1, "llama"), *h2 = open_cache(c2, "llama");
  prefill(h1, 1, 3, 64);
  wait_stat(&f.d1, "tier_writes_total", 4);
  stored_t pg[4];
  find_pages(&f.rc, pg, 4);
  char *bad = malloc(pg[2].len);
  size_t flen;
  struct {
    const char *reason;
    char *val;
    size_t len;
  } cases[7];
  int n = 0;
  memcpy(bad, pg[2].val, pg[2].len);
  bad[HDR + 4 * T + 100] ^= 1; /* one bit of the page's bytes */
  cases[n++] = (__typeof__(cases[0])){"mac", bad, pg[2].len};
  cases[n++] = (__typeof__(cases[0])){"truncated", pg[2].val, pg[2].len - 100};
  char *stale = malloc(pg[2].len);
  memcpy(stale, pg[2].val, pg[2].len);
  stale[4] = 2; /* another format version */
  cases[n++] = (__typeof__(cases[0])){"stale", stale, pg[2].len};
  char *planted = forge(&pg[2], "not-the-fleet-secret-at-all-1234", "uid:0", 3, &flen);
  cases[n++] = (__typeof__(cases[0])){"mac", planted, flen};
  char *other = forge(&pg[2], "an-example-fleet-secret-of-32-by", "uid:64002", 3, &flen);
  cases[n++] = (__typeof__(cases[0])){"tenant", other, flen};
  cases[n++] = (__typeof__(cases[0])){"chain", pg[3].val, pg[3].len}; /* another page's */
  cases[n++] = (__typeof__(cases[0])){"format", "not a page at all", 17};
  uint64_t seq = 10;
  for (int i = 0; i < n; i++) {
    char name[64];
    snprintf(name, sizeof name, "tier_discarded_total{reason=%s}", cases[i].reason);
    uint64_t before = stat_get(c2, name, NULL);
    put_value(&f.rc, &pg[2], cases[i].val, cases[i].len);
    ASSERT_EQ(attach(h2, seq, 3, 64), 32); /* pages 0 and 1, never page 2 */
    ASSERT(holds(h2, seq++, 3, 32));
    ASSERT_EQ(stat_get(c2, name, NULL), before + 1);
  }
  put_value(&f.rc, &pg[2], pg[2].val, pg[2].len); /* the genuine value again */
  ASSERT_EQ(attach(h2, seq, 3, 64), 64);
  ASSERT(holds(h2, seq, 3, 64));
  ASSERT_EQ(stat_get(c2, "tier_discarded_total", NULL), (uint64_t)n);
  ASSERT_EQ(stat_get(c2, "puts_total", NULL), 0);
  free(bad), free(stale), free(planted), free(other);
  for (int i = 0; i < 4; i++) free(pg[i].val);
  kvc_cache_close(h1), kvc_cache_close(h2);
  kvc_client_close(c1), kvc_client_close(c2);
  fleet_stop(&f);
}

/* ---- a slot migrated and a master killed while clients run --------------------- */

/* A worker that runs until the stop file exists; every request must succeed
 * and every byte it reads be right (exit status 0). */
typedef struct worker {
  pid_t pid;
  char stop[128];
} worker_t;

static bool stopped(const worker_t *w) { return access(w->stop, F_OK) == 0; }

/* Node 1's clients: new prompts 100, 101, ..., each read back. */
static void prefiller(const daemon_t *d, const worker_t *w) {
  kvc_client_t *c = client_open(d);
  kvc_cache_t *h = open_cache(c, "llama");
  for (uint32_t i = 0; !stopped(w); i++) {
    prefill(h, 1000 + i % 64, 100 + i, 64);
    if (!holds(h, 1000 + i % 64, 100 + i, 64)) _exit(93);
  }
  _exit(0);
}

/* Node 2's clients: attaches of whatever prompts exist (the prefiller's,
 * racing it), every byte attached checked; a local sequence written and
 * read beside; the cache dropped now and then so that lookups go on. */
static void attacher(const daemon_t *d, const worker_t *w) {
  kvc_client_t *c = client_open(d);
  kvc_cache_t *h = open_cache(c, "llama");
  for (uint32_t i = 0; !stopped(w); i++) {
    uint32_t p = 100 + (i * 7) % 64;
    uint64_t got = attach(h, 1, p, 64);
    if (got % T || got > 64 || (got && !holds(h, 1, p, got))) _exit(94);
    prefill(h, 2, 7, 40); /* local service: a put and a get */
    if (!holds(h, 2, 7, 40)) _exit(95);
    if (i % 16 == 15) {
      if (kvc_cache_drop(h) != 0) _exit(96);
      h = open_cache(c, "llama");
    }
  }
  _exit(0);
}

/* A worker runs as another tenant: its caches and prompts are its own, so
 * that the test's own drops and attaches of tenant root's cache do not
 * race it. */
static void worker_start(worker_t *w, const char *dir, int i, const daemon_t *d,
                         void (*fn)(const daemon_t *, const worker_t *)) {
  snprintf(w->stop, sizeof w->stop, "%s/stop-%d", dir, i);
  fflush(NULL);
  w->pid = fork();
  ASSERT(w->pid >= 0);
  if (w->pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    drop_to(UID_B);
    fn(d, w);
  }
}

static void worker_stop(worker_t *w) {
  it_write_file(w->stop, "stop");
  int st;
  ASSERT(waitpid(w->pid, &st, 0) == w->pid);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
    TEST_FAIL_("a worker failed: exited=%d status=%d signal=%d", WIFEXITED(st),
               WIFEXITED(st) ? WEXITSTATUS(st) : -1, WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

static void node_id(const rcl_t *rc, int i, char *out, size_t len) {
  redisReply *r = rcl_cmd(rc, i, "CLUSTER MYID");
  ASSERT(r && r->type == REDIS_REPLY_STRING);
  snprintf(out, len, "%s", r->str);
  freeReplyObject(r);
}

static void ok_reply(redisReply *r) {
  if (!r || r->type == REDIS_REPLY_ERROR) TEST_FAIL_("redis: %s", r ? r->str : "no reply");
  freeReplyObject(r);
}

/* Drops node 2's cache and attaches prompt p anew (from the cluster). */
static kvc_cache_t *reattach(kvc_client_t *c, kvc_cache_t *h, uint32_t p, uint64_t want) {
  ASSERT_OK(kvc_cache_drop(h));
  h = open_cache(c, "llama");
  ASSERT_EQ(attach(h, 1, p, 64), want);
  ASSERT(holds(h, 1, p, want));
  return h;
}

TEST_TIMEOUT(cluster_slot_migrated_and_master_killed_while_clients_run, 240) {
  fleet_t f;
  const char *more[] = {"--cluster-refresh-ms", "3600000", NULL};
  fleet_start(&f, more); /* the map is read again only when the cluster says so */
  kvc_client_t *c1 = client_open(&f.d1), *c2 = client_open(&f.d2);
  kvc_cache_t *h1 = open_cache(c1, "llama"), *h2 = open_cache(c2, "llama");
  prefill(h1, 1, 5, 64);
  wait_stat(&f.d1, "tier_writes_total", 4);
  stored_t pg[4];
  find_pages(&f.rc, pg, 4);
  worker_t w1, w2;
  worker_start(&w1, f.rc.dir, 1, &f.d1, prefiller);
  worker_start(&w2, f.rc.dir, 2, &f.d2, attacher);
  wait_stat(&f.d2, "tier_hit_pages_total", 5); /* they run */

  /* Migrate the slot of prompt 5's page 1 to another master, step by step
   * (the Redis Cluster specification's resharding): while its key is
   * moved and the slot not yet handed over, node 2 follows ASK. */
  redisReply *ks = rcl_cmd(&f.rc, pg[1].node, "CLUSTER KEYSLOT %s", pg[1].key);
  ASSERT(ks && ks->type == REDIS_REPLY_INTEGER);
  long long slot = ks->integer;
  freeReplyObject(ks);
  int src = rcl_master_of(&f.rc, pg[1].node, slot), dst = -1;
  ASSERT(src >= 0);
  for (int i = 0; i < RCL_NODES && dst < 0; i++)
    if (i != src && rcl_says(&f.rc, i, "role:master", "INFO replication")) dst = i;
  char src_id[64], dst_id[64];
  node_id(&f.rc, src, src_id, sizeof src_id);
  node_id(&f.rc, dst, dst_id, sizeof dst_id);
  ok_reply(rcl_cmd(&f.rc, dst, "CLUSTER SETSLOT %lld IMPORTING %s", slot, src_id));
  ok_reply(rcl_cmd(&f.rc, src, "CLUSTER SETSLOT %lld MIGRATING %s", slot, dst_id));
  ok_reply(rcl_cmd(&f.rc, src, "MIGRATE 127.0.0.1 %d %b 0 5000 KEYS %s", f.rc.port[dst], "",
                   (size_t)0, pg[1].key));
  uint64_t ask = stat_get(c2, "tier_redirects_total{kind=ask}", NULL);
  h2 = reattach(c2, h2, 5, 64);
  ASSERT(stat_get(c2, "tier_redirects_total{kind=ask}", NULL) > ask);
  /* The slot handed over: node 2's map is stale until a MOVED tells it. */
  uint64_t moved = stat_get(c2, "tier_redirects_total{kind=moved}", NULL);
  for (int i = 0; i < RCL_NODES; i++)
    if (rcl_says(&f.rc, i, "role:master", "INFO replication"))
      ok_reply(rcl_cmd(&f.rc, i, "CLUSTER SETSLOT %lld NODE %s", slot, dst_id));
  h2 = reattach(c2, h2, 5, 64);
  ASSERT(stat_get(c2, "tier_redirects_total{kind=moved}", NULL) > moved);

  /* Kill the master of prompt 5's page 0: its replica takes over; node 2
   * finds every page again once it has read the new map. */
  rcl_wait_ok(&f.rc);
  rcl_wait_synced(&f.rc);
  ks = rcl_cmd(&f.rc, src, "CLUSTER KEYSLOT %s", pg[0].key);
  int victim;
  victim = rcl_master_of(&f.rc, src, ks->integer);
  freeReplyObject(ks);
  int heir = -1;
  for (int i = 0; i < RCL_NODES; i++) {
    char needle[32];
    snprintf(needle, sizeof needle, "master_port:%d", f.rc.port[victim]);
    if (i != victim && rcl_says(&f.rc, i, needle, "INFO replication")) heir = i;
  }
  ASSERT(victim >= 0 && heir >= 0);
  rcl_kill(&f.rc, victim);
  for (int i = 0; !rcl_says(&f.rc, heir, "role:master", "INFO replication"); i++) {
    ASSERT(i < 3000);
    it_sleep_ms(10);
  }
  rcl_wait_ok(&f.rc);
  uint64_t got = 0;
  for (int i = 0; i < 300 && got < 64; i++) { /* until node 2 has read the new map */
    ASSERT_OK(kvc_cache_drop(h2));
    h2 = open_cache(c2, "llama");
    got = attach(h2, 1, 5, 64);
    ASSERT(holds(h2, 1, 5, got));
    if (got < 64) it_sleep_ms(100);
  }
  ASSERT_EQ(got, 64);
  worker_stop(&w1);
  worker_stop(&w2);
  for (int i = 0; i < 4; i++) free(pg[i].val);
  kvc_cache_close(h1), kvc_cache_close(h2);
  kvc_client_close(c1), kvc_client_close(c2);
  fleet_stop(&f);
}

/* ---- the whole cluster stopped ------------------------------------------------- */

/* ---- both tiers on, chained ------------------------------------------------------ */

/* Pushes what a node's pool caches out of it: sequences without ids are put
 * (kept: they are the pressure) until the disk tier has written `want`
 * pages in all. */
static void push_out(const daemon_t *d, kvc_cache_t *h, uint64_t *seq, uint64_t want) {
  kvc_client_t *c = client_open(d);
  const kvc_layout_t *l = kvc_cache_layout(h);
  float *k = calloc(it_tok_floats(l, false) * 64, 4), *v = calloc(it_tok_floats(l, true) * 64, 4);
  while (stat_get(c, "tier_disk_writes_total", NULL) < want) {
    ASSERT(*seq < 100000); /* the 8 MiB pool holds 512 pages: a few hundred puts reclaim them */
    ASSERT_OK(kvc_put(h, (*seq)++, 0, 64, k, v));
  }
  free(k), free(v);
  kvc_client_close(c);
}

/* The disk and the cluster on at once, one chain: a match walks memory,
 * then the disk, then the cluster, each asked only for the pages past what
 * the one before it brought back. A node with a disk_dir that reads the
 * cluster (cluster_write off: what it spills stays on its own disk) reads
 * one prompt from the cluster alone, one from its disk alone, and one whose
 * head is on its disk and whose tail only the cluster has; then a page it
 * read from the cluster and let go of is kept on its disk. */
TEST_TIMEOUT(cluster_and_disk_tiers_chained_read_a_prompt_from_each, 180) {
  fleet_t f;
  fleet_start(&f, NULL);
  char tdir[64];
  snprintf(tdir, sizeof tdir, "/tmp/kvctier-XXXXXX");
  ASSERT(mkdtemp(tdir) != NULL);
  daemon_t dx;
  const char *more[] = {"--disk-dir", tdir, "--cluster-write", "off", NULL};
  node_start(&f, &dx, more);
  kvc_client_t *c1 = client_open(&f.d1), *cx = client_open(&dx);
  it_wait_stat(cx, "tier_disk_loading", 0, false);
  kvc_cache_t *h1 = open_cache(c1, "llama"), *hx = open_cache(cx, "llama");
  /* prompt 41 on the cluster alone; 43's 8 pages there too */
  prefill(h1, 1, 41, 64);
  prefill(h1, 2, 43, 128);
  wait_stat(&f.d1, "tier_writes_total", 4 + 8);
  /* prompt 42, and 43's first 4 pages, on dx's disk alone */
  prefill(hx, 1, 42, 64);
  prefill(hx, 2, 43, 64);
  ASSERT_OK(kvc_seq_remove(hx, 1, 0, UINT64_MAX));
  ASSERT_OK(kvc_seq_remove(hx, 2, 0, UINT64_MAX));
  uint64_t seq = 1000;
  push_out(&dx, hx, &seq, 8);
  ASSERT_EQ(stat_get(cx, "tier_writes_total{tier=cluster}", NULL), 0); /* read only */
  /* from the cluster: the disk has none of it */
  ASSERT_EQ(attach(hx, 10, 41, 64), 64);
  ASSERT(holds(hx, 10, 41, 64));
  ASSERT_EQ(stat_get(cx, "tier_hit_pages_total{tier=cluster}", NULL), 4);
  ASSERT_EQ(stat_get(cx, "tier_disk_hits_total", NULL), 0);
  /* from the disk: the cluster is not asked for pages the disk brought */
  uint64_t asked = stat_get(cx, "tier_lookup_pages_total{tier=cluster}", NULL);
  ASSERT_EQ(attach(hx, 11, 42, 64), 64);
  ASSERT(holds(hx, 11, 42, 64));
  ASSERT_EQ(stat_get(cx, "tier_disk_hits_total", NULL), 4);
  ASSERT_EQ(stat_get(cx, "tier_hit_pages_total{tier=cluster}", NULL), 4);
  ASSERT_EQ(stat_get(cx, "tier_lookup_pages_total{tier=cluster}", NULL), asked);
  /* from both, in the chain's order: the head from the disk, then only the
   * 4 pages past it from the cluster */
  ASSERT_EQ(attach(hx, 12, 43, 128), 128);
  ASSERT(holds(hx, 12, 43, 128));
  ASSERT_EQ(stat_get(cx, "tier_disk_hits_total", NULL), 8);
  ASSERT_EQ(stat_get(cx, "tier_hit_pages_total{tier=cluster}", NULL), 8);
  ASSERT_EQ(stat_get(cx, "tier_lookup_pages_total{tier=cluster}", NULL), asked + 4);
  /* one family for every tier, and kvcachectl shows each the same way */
  ASSERT_EQ(stat_get(cx, "tier_hit_pages_total{tier=disk}", NULL), 8);
  ASSERT_EQ(stat_get(cx, "tier_hit_tokens_total{tier=disk}", NULL), 8 * T);
  ASSERT_EQ(stat_get(cx, "tier_lookup_pages_total{tier=disk}", NULL), 8);
  ASSERT_EQ(stat_get(cx, "tier_writes_total{tier=disk}", NULL),
            stat_get(cx, "tier_disk_writes_total", NULL));
  char out[16384];
  ASSERT_EQ(ctl_run(&dx, out, sizeof out, true, "tier"), 0);
  char *disk = strstr(out, "tier disk: up"), *cl = strstr(out, "tier cluster: up, 16384 of 16384");
  ASSERT(disk && cl && disk < cl); /* the chain's order */
  ASSERT(strstr(disk, "8 hit") != NULL);
  ASSERT_EQ(ctl_run(&dx, out, sizeof out, false, "tier --json"), 0);
  json_t *j = json_parse_or_fail(out);
  ASSERT_EQ(json_u64(json_get(j, "tiers", "disk", "hit_pages", NULL)), 8);
  ASSERT_EQ(json_u64(json_get(j, "tiers", "cluster", "hit_pages", NULL)), 8);
  json_free(j);
  /* what came from the cluster is kept on the disk once the pool lets go
   * of it: prompt 41 comes back from the disk, the cluster not asked */
  for (uint64_t s = 10; s <= 12; s++) ASSERT_OK(kvc_seq_remove(hx, s, 0, UINT64_MAX));
  push_out(&dx, hx, &seq, 8 + 4 + 4);
  uint64_t hits = stat_get(cx, "tier_disk_hits_total", NULL);
  asked = stat_get(cx, "tier_lookup_pages_total{tier=cluster}", NULL);
  ASSERT_EQ(attach(hx, 13, 41, 64), 64);
  ASSERT(holds(hx, 13, 41, 64));
  ASSERT_EQ(stat_get(cx, "tier_disk_hits_total", NULL), hits + 4);
  ASSERT_EQ(stat_get(cx, "tier_lookup_pages_total{tier=cluster}", NULL), asked);
  kvc_cache_close(hx);
  kvc_cache_close(h1);
  kvc_client_close(cx);
  kvc_client_close(c1);
  daemon_stop(&dx);
  fleet_stop(&f);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tdir);
  ASSERT(system(cmd) == 0);
}

TEST_TIMEOUT(cluster_stopped_local_service_goes_on, 120) {
  fleet_t f;
  fleet_start(&f, NULL);
  kvc_client_t *c1 = client_open(&f.d1), *c2 = client_open(&f.d2);
  kvc_cache_t *h1 = open_cache(c1, "llama"), *h2 = open_cache(c2, "llama");
  prefill(h1, 1, 1, 64);
  wait_stat(&f.d1, "tier_writes_total", 4);
  for (int i = 0; i < RCL_NODES; i++) rcl_kill(&f.rc, i);
  /* Node 2 asks a dead cluster: nothing comes, nothing fails. */
  ASSERT_EQ(attach(h2, 1, 1, 64), 0);
  /* Its own prompts and node 1's keep working, written or not. */
  for (uint32_t p = 2; p < 40; p++) {
    prefill(h1, p, p, 64);
    ASSERT_EQ(attach(h1, 100 + p, p, 64), 64);
    ASSERT(holds(h1, 100 + p, p, 64));
    prefill(h2, p, 1000 + p, 48);
    ASSERT_EQ(attach(h2, 100 + p, 1000 + p, 48), 48);
    ASSERT(holds(h2, 100 + p, 1000 + p, 48));
    ASSERT_EQ(attach(h2, 200 + p, 1, 64), 0); /* not in the pool; the cluster is gone */
  }
  /* The breakers have opened: the cluster is no longer even tried. */
  wait_stat(&f.d2, "tier_breakers_open", 1);
  for (int i = 0; stat_get(c2, "tier_up", NULL) != 0; i++) { /* every master found failing */
    ASSERT(i < 3000);
    it_sleep_ms(10);
  }
  char out[8192];
  ASSERT_EQ(ctl_run(&f.d2, out, sizeof out, true, "tier"), 0);
  ASSERT(strstr(out, "tier cluster: DOWN") != NULL);
  uint64_t tries = stat_get(c2, "tier_lookup_pages_total", NULL);
  ASSERT_EQ(attach(h2, 300, 1, 64), 0);
  ASSERT_EQ(stat_get(c2, "tier_lookup_pages_total", NULL), tries);
  ASSERT(stat_get(c2, "tier_errors_total{kind=breaker}", NULL) > 0);
  /* Node 1's writes: tried, then dropped and counted (never blocking). */
  wait_stat(&f.d1, "tier_queue_drops_total", 1);
  ASSERT_EQ(stat_get(c1, "request_errors_total", NULL), 0);
  ASSERT_EQ(stat_get(c2, "request_errors_total", NULL), 0);
  kvc_cache_close(h1), kvc_cache_close(h2);
  kvc_client_close(c1), kvc_client_close(c2);
  fleet_stop(&f);
}

/* ---- the whole cluster down: the loop keeps answering ----------------------------- */

#define OUTAGE_MS 12000u   /* each outage */
#define ANSWER_MS 3000u    /* a request of the outage is answered within this */
#define LOOKUP_MS 200u     /* cluster_lookup_timeout_ms: the default */

/* One daemon watched through an outage: every 500 ms an attach of a prompt
 * no node holds (a lookup, a miss) on one connection and a ping on
 * another, each answered within ANSWER_MS (the clients give up then). */
typedef struct watch {
  const char *name;
  bool busy;             /* another client puts and gets meanwhile */
  const daemon_t *d;
  kvc_client_t *a, *p;
  kvc_cache_t *h;
  uint64_t cpu0_ms, loop0_ms, wall0_ms, timeouts0;
  uint32_t rounds, slow; /* attaches that took a lookup timeout or more */
} watch_t;

/* The CPU time the process has used, ms (utime + stime of /proc/PID/stat),
 * or with loop, its main thread's, which runs the event loop
 * (/proc/PID/task/PID/stat). */
static uint64_t cpu_ms(pid_t pid, bool loop) {
  char path[64], buf[1024];
  if (loop) snprintf(path, sizeof path, "/proc/%d/task/%d/stat", (int)pid, (int)pid);
  else snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  ASSERT(f != NULL);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char *s = strrchr(buf, ')'); /* fields after the command's name, from the 3rd */
  unsigned long long ut = 0, st = 0;
  ASSERT(s && sscanf(s + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut,
                     &st) == 2);
  return (ut + st) * 1000u / (uint64_t)sysconf(_SC_CLK_TCK);
}

static void watch_open(watch_t *w, const char *name, const daemon_t *d) {
  kvc_client_opts_t o = {.socket_path = d->sock, .timeout_ms = ANSWER_MS, .client_name = "it"};
  memset(w, 0, sizeof *w);
  w->name = name;
  w->d = d;
  ASSERT_OK(kvc_client_open(&o, &w->a));
  ASSERT_OK(kvc_client_open(&o, &w->p));
  w->h = open_cache(w->a, "llama");
}

static void watch_close(watch_t *w) {
  kvc_cache_close(w->h);
  kvc_client_close(w->a);
  kvc_client_close(w->p);
}

static void watch_begin(watch_t *w) {
  w->cpu0_ms = cpu_ms(w->d->pid, false);
  w->loop0_ms = cpu_ms(w->d->pid, true);
  w->wall0_ms = it_mono_ms();
  w->timeouts0 = stat_get(w->p, "tier_errors_total{kind=timeout}", NULL);
  w->rounds = w->slow = 0;
}

static void watch_round(watch_t *w, const char *what) {
  uint32_t *ids = prompt(900 + w->rounds % 7, 64);
  kvc_match_t m = {99, 99, 99};
  uint64_t t0 = it_mono_ms();
  int rc = kvc_attach(w->h, 7, ids, 64, false, &m);
  uint64_t t1 = it_mono_ms();
  free(ids);
  if (rc != 0 || t1 - t0 >= ANSWER_MS)
    TEST_FAIL_("%s, %s, %.1f s in: an attach was not answered (%s after %llu ms)", what, w->name,
               (double)(t0 - w->wall0_ms) / 1000, kvc_err_name(rc), (unsigned long long)(t1 - t0));
  ASSERT_EQ(m.tokens, 0);
  w->slow += t1 - t0 >= LOOKUP_MS;
  rc = kvc_ping(w->p);
  uint64_t t2 = it_mono_ms();
  if (rc != 0 || t2 - t1 >= ANSWER_MS)
    TEST_FAIL_("%s, %s, %.1f s in: a ping was not answered (%s after %llu ms)", what, w->name,
               (double)(t1 - w->wall0_ms) / 1000, kvc_err_name(rc), (unsigned long long)(t2 - t1));
  w->rounds++;
}

/* The outage is over for this daemon: it never spun (its CPU time grew by
 * less than a tenth of the wall time on a quiet node, half on the busy
 * one, whose client keeps it busy a third of the time at most: a loop
 * taken by a timer spins at a whole CPU). The loop's own thread's share is
 * printed beside. */
static void watch_end(watch_t *w, const char *what) {
  uint64_t cpu = cpu_ms(w->d->pid, false) - w->cpu0_ms;
  uint64_t loop = cpu_ms(w->d->pid, true) - w->loop0_ms, wall = it_mono_ms() - w->wall0_ms;
  fprintf(stderr, "%s, %s: %u rounds, %u attaches of %u ms or more, %llu ms of CPU (the loop's "
          "thread %llu) in %llu ms, lookups timed out %llu\n", what, w->name, w->rounds, w->slow,
          LOOKUP_MS, (unsigned long long)cpu, (unsigned long long)loop, (unsigned long long)wall,
          (unsigned long long)(stat_get(w->p, "tier_errors_total{kind=timeout}", NULL) -
                               w->timeouts0));
  if (cpu * (w->busy ? 2 : 10) >= wall)
    TEST_FAIL_("%s, %s: the daemon used %llu ms of CPU (the loop's thread %llu) in %llu ms",
               what, w->name, (unsigned long long)cpu, (unsigned long long)loop,
               (unsigned long long)wall);
}

/* Every 500 ms for OUTAGE_MS: a round on each daemon. */
static void ride_out(watch_t *w, size_t n, const char *what) {
  for (size_t i = 0; i < n; i++) watch_begin(&w[i]);
  uint64_t t0 = it_mono_ms();
  for (uint64_t k = 1; it_mono_ms() - t0 < OUTAGE_MS; k++) {
    for (size_t i = 0; i < n; i++) watch_round(&w[i], what);
    while (it_mono_ms() - t0 < k * 500) it_sleep_ms(10); /* the pace of the rounds */
  }
  for (size_t i = 0; i < n; i++) watch_end(&w[i], what);
}

/* Node 1's busy client (another tenant): prompts put with ids (each
 * written behind) and read back, one every few ms, until stopped. */
static void busy_client(const daemon_t *d, const worker_t *w) {
  kvc_client_t *c = client_open(d);
  kvc_cache_t *h = open_cache(c, "busy");
  for (uint32_t i = 0; !stopped(w); i++) {
    uint64_t t0 = it_mono_ms();
    prefill(h, 1 + i % 16, 5000 + i, 64);
    if (!holds(h, 1 + i % 16, 5000 + i, 64)) _exit(93);
    /* Steady, not flat out: the daemon's CPU stays a figure of its own.
     * Idle twice as long as the work took, 20 ms at least: the daemon is
     * busy a third of the time at most, in any build (its loop took 47-52%
     * of a CPU under ThreadSanitizer with a fixed 20 ms). */
    uint64_t took = it_mono_ms() - t0;
    it_sleep_ms(took * 2 > 20 ? (long)(took * 2) : 20);
  }
  _exit(0);
}

/* The cluster is used again: a prompt put on `from` after the outage is
 * attached on `to` from the cluster, whole, byte for byte (30 s at most:
 * the breakers that opened close once the nodes answer again). */
static void used_again(const daemon_t *from, const daemon_t *to, uint32_t *next, const char *what) {
  kvc_client_t *cf = client_open(from), *ct = client_open(to);
  kvc_cache_t *hf = open_cache(cf, "llama"), *ht = open_cache(ct, "llama");
  uint64_t t0 = it_mono_ms();
  for (;;) {
    uint32_t p = (*next)++;
    uint64_t w = stat_get(cf, "tier_writes_total", NULL);
    prefill(hf, 1, p, 64);
    for (uint64_t e = it_mono_ms() + 2000;
         stat_get(cf, "tier_writes_total", NULL) < w + 4 && it_mono_ms() < e;)
      it_sleep_ms(10);
    if (attach(ht, 1, p, 64) == 64) {
      ASSERT(holds(ht, 1, p, 64));
      break;
    }
    if (it_mono_ms() - t0 > 30000) TEST_FAIL_("%s: the cluster was not used again in 30 s", what);
    it_sleep_ms(100);
  }
  fprintf(stderr, "%s: used again %.1f s after\n", what, (double)(it_mono_ms() - t0) / 1000);
  kvc_cache_close(hf), kvc_cache_close(ht);
  kvc_client_close(cf), kvc_client_close(ct);
}

/* Node i's lookups that timed out since the outage began. */
static uint64_t timeouts_of(const watch_t *w) {
  return stat_get(w->p, "tier_errors_total{kind=timeout}", NULL) - w->timeouts0;
}

/* The whole cluster stopped (SIGSTOP: connections made, nothing answered),
 * then killed (SIGKILL: connections refused), with four daemons: node 1
 * busy (a client putting and getting), nodes 3 and 4 quiet (4 reading from
 * the replicas), all three reading the map every 100 ms and opening a
 * breaker at the first failure (so that every breaker is open at a read of
 * the map within seconds; under the defaults that took 16-37 s), and node 2
 * quiet under the defaults. On each an attach and a ping every 500 ms are
 * answered and the daemon does not spin; a silent cluster costs a quiet
 * node at most one lookup timeout a node it reads from; once the cluster
 * is back every node uses it again. (A read of the map with every breaker
 * open re-armed its timer at 0 ms from its own callback: libuv 1.44 runs it
 * again in the same pass, and the loop never came back.) */
TEST_TIMEOUT(cluster_down_loop_keeps_answering_quiet_and_busy, 240) {
  fleet_t f;
  const char *defaults[] = {"--cluster-lookup-timeout-ms", "200", NULL};
  const char *eager[] = {"--cluster-lookup-timeout-ms", "200", "--cluster-refresh-ms", "100",
                         "--cluster-breaker-failures", "1", NULL};
  fleet_start(&f, defaults);
  daemon_stop(&f.d1); /* node 1 again, eager */
  node_start(&f, &f.d1, eager);
  const char *replicas[] = {"--cluster-lookup-timeout-ms", "200", "--cluster-refresh-ms", "100",
                            "--cluster-breaker-failures", "1", "--cluster-read-replicas", "true",
                            NULL};
  daemon_t d3, d4;
  node_start(&f, &d3, eager);
  node_start(&f, &d4, replicas);
  uint32_t next = 10;
  used_again(&f.d1, &f.d2, &next, "before");
  used_again(&f.d2, &f.d1, &next, "before");
  used_again(&f.d1, &d3, &next, "before");
  used_again(&f.d1, &d4, &next, "before");
  worker_t busy;
  worker_start(&busy, f.rc.dir, 0, &f.d1, busy_client);
  wait_stat(&f.d1, "tier_writes_total", stat_of(&f.d1, "tier_writes_total") + 16);
  watch_t w[4];
  watch_open(&w[0], "node 1 (busy, eager)", &f.d1);
  w[0].busy = true;
  watch_open(&w[1], "node 2 (quiet)", &f.d2);
  watch_open(&w[2], "node 3 (quiet, eager)", &d3);
  watch_open(&w[3], "node 4 (quiet, eager, replicas)", &d4);

  rcl_signal_all(&f.rc, SIGSTOP);
  ride_out(w, 4, "stopped");
  /* The quiet nodes: only the lookups of their rounds reach the cluster,
   * and once one has waited on a silent node, none waits there again (3
   * masters; node 4 reads from 6 nodes). */
  for (int i = 1; i < 4; i++)
    if (timeouts_of(&w[i]) > (i == 3 ? 6u : 3u))
      TEST_FAIL_("stopped, %s: %llu lookups timed out", w[i].name,
                 (unsigned long long)timeouts_of(&w[i]));
  rcl_signal_all(&f.rc, SIGCONT);
  rcl_wait_ok(&f.rc);
  used_again(&f.d1, &f.d2, &next, "stopped, then continued");
  used_again(&f.d2, &f.d1, &next, "stopped, then continued");
  used_again(&f.d1, &d3, &next, "stopped, then continued");
  used_again(&f.d1, &d4, &next, "stopped, then continued");

  for (int i = 0; i < RCL_NODES; i++) rcl_kill(&f.rc, i);
  ride_out(w, 4, "killed");
  for (int i = 0; i < RCL_NODES; i++) rcl_restart(&f.rc, i);
  rcl_wait_ok(&f.rc);
  used_again(&f.d1, &f.d2, &next, "killed, then restarted");
  used_again(&f.d2, &f.d1, &next, "killed, then restarted");
  used_again(&f.d1, &d3, &next, "killed, then restarted");
  used_again(&f.d1, &d4, &next, "killed, then restarted");

  worker_stop(&busy);
  for (int i = 0; i < 4; i++) {
    ASSERT_EQ(stat_get(w[i].p, "request_errors_total", NULL), 0);
    watch_close(&w[i]);
  }
  daemon_stop(&d3);
  daemon_stop(&d4);
  fleet_stop(&f);
}

/* ---- a node that does not speak RESP well ----------------------------------------- */

/* A fake Redis node on a loopback port (a thread): it serves the whole slot
 * map itself, answers +OK to anything but CLUSTER SLOTS and GET, and every
 * GET with the bytes of `reply` (then closes the connection when `hangup`).
 * The daemon reads these replies itself (daemon/tiers/cluster/rnode.c): a malformed,
 * short, cut or oversized one must fail its lookup alone. */
typedef struct fake {
  int lfd, port;
  pthread_t th;
  pthread_mutex_t mu;
  char *reply;          /* under mu */
  size_t len;
  bool hangup;
  uint64_t gets;        /* answered */
} fake_t;

static void fake_send(int fd, const char *b, size_t n) {
  while (n) {
    ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
    if (w <= 0) return;
    b += w, n -= (size_t)w;
  }
}

/* One command (an array of bulk strings) at the front of b[0, n): its
 * length, 0 when not all here; argv[0..1] point into b. */
static size_t fake_command(const char *b, size_t n, const char **argv, size_t *alen, int *argc) {
  const char *p = b, *end = b + n, *eol;
  if (!(eol = memchr(p, '\n', (size_t)(end - p))) || *p != '*') return 0;
  int k = atoi(p + 1);
  p = eol + 1;
  *argc = k;
  for (int i = 0; i < k; i++) {
    if (p >= end || !(eol = memchr(p, '\n', (size_t)(end - p)))) return 0;
    size_t l = (size_t)atol(p + 1);
    p = eol + 1;
    if ((size_t)(end - p) < l + 2) return 0;
    if (i < 2) argv[i] = p, alen[i] = l;
    p += l + 2;
  }
  return (size_t)(p - b);
}

static void *fake_main(void *arg) {
  fake_t *f = arg;
  for (;;) {
    int fd = accept(f->lfd, NULL, NULL);
    if (fd < 0) return NULL;
    static char buf[1 << 16];
    size_t have = 0;
    bool open = true;
    while (open) {
      ssize_t r = recv(fd, buf + have, sizeof buf - have, 0);
      if (r <= 0) break;
      have += (size_t)r;
      const char *argv[2];
      size_t alen[2], used;
      int argc;
      while (open && (used = fake_command(buf, have, argv, alen, &argc))) {
        if (argc >= 2 && alen[0] == 7 && strncasecmp(argv[0], "CLUSTER", 7) == 0) {
          char m[160];
          int ml = snprintf(m, sizeof m, "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n",
                            f->port);
          fake_send(fd, m, (size_t)ml);
        } else if (argc == 2 && alen[0] == 3 && strncasecmp(argv[0], "GET", 3) == 0) {
          pthread_mutex_lock(&f->mu);
          fake_send(fd, f->reply, f->len);
          f->gets++;
          if (f->hangup) open = false;
          pthread_mutex_unlock(&f->mu);
        } else {
          fake_send(fd, "+OK\r\n", 5);
        }
        memmove(buf, buf + used, have - used);
        have -= used;
      }
    }
    close(fd);
  }
}

static void fake_start(fake_t *f) {
  memset(f, 0, sizeof *f);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t alen = sizeof a;
  f->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT(f->lfd >= 0);
  ASSERT_EQ(bind(f->lfd, (struct sockaddr *)&a, sizeof a), 0);
  ASSERT_EQ(listen(f->lfd, 16), 0);
  ASSERT_EQ(getsockname(f->lfd, (struct sockaddr *)&a, &alen), 0);
  f->port = ntohs(a.sin_port);
  pthread_mutex_init(&f->mu, NULL);
  ASSERT_EQ(pthread_create(&f->th, NULL, fake_main, f), 0);
}

/* What every GET gets from now on (copied). */
static void fake_reply(fake_t *f, const char *head, size_t body, const char *tail, bool hangup) {
  size_t hl = strlen(head), tl = strlen(tail);
  char *b = malloc(hl + body + tl);
  memcpy(b, head, hl);
  memset(b + hl, 'x', body);
  memcpy(b + hl + body, tail, tl);
  pthread_mutex_lock(&f->mu);
  free(f->reply);
  f->reply = b;
  f->len = hl + body + tl;
  f->hangup = hangup;
  pthread_mutex_unlock(&f->mu);
}

TEST_TIMEOUT(cluster_malformed_short_or_oversized_replies_fail_their_lookup_alone, 120) {
  fake_t f;
  fake_start(&f);
  char seeds[32], big[32], huge[32];
  snprintf(seeds, sizeof seeds, "127.0.0.1:%d", f.port);
  const char *args[] = {"--cluster-nodes", seeds, "--cluster-write", "off",
                        "--cluster-lookup-timeout-ms", "30000", "--cluster-command-timeout-ms",
                        "30000", "--cluster-breaker-failures", "1000", NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  kvc_client_t *c = client_open(&d);
  kvc_cache_t *h = open_cache(c, "llama");
  /* A value is 168 + 64 + 16 KiB + 16 bytes here: 8 MiB is more than one. */
  snprintf(big, sizeof big, "$%d\r\n", 8 << 20);
  snprintf(huge, sizeof huge, "$%llu\r\n", 1ull << 40);
  static const struct {
    const char *what, *head;
    size_t body;
    const char *tail;
    bool hangup;
    const char *counted; /* the figure it adds to (NULL: a plain miss) */
  } cases[] = {
      {"nil", "$-1\r\n", 0, "", false, NULL},
      {"oversized", NULL, 8 << 20, "\r\n", false, "tier_discarded_total{reason=truncated}"},
      {"short", "$10\r\n", 10, "\r\n", false, "tier_discarded_total{reason=format}"},
      {"empty", "$0\r\n", 0, "\r\n", false, "tier_discarded_total{reason=format}"},
      {"a length past any bulk", NULL, 0, "", false, "tier_errors_total{kind=connection}"},
      {"a length not a number", "$12x4\r\n", 12, "\r\n", false, "tier_errors_total{kind=connection}"},
      {"a value not ended by CRLF", "$5\r\n", 5, "XY", false, "tier_errors_total{kind=connection}"},
      {"cut short", "$9000\r\n", 100, "", true, "tier_errors_total{kind=connection}"},
      {"not RESP", "hello\r\n", 0, "", false, "tier_errors_total{kind=connection}"},
      {"an unknown type", "%2\r\n", 0, "", false, "tier_errors_total{kind=connection}"},
      {"nil again", "$-1\r\n", 0, "", false, NULL},
  };
  uint64_t seq = 1;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *head = cases[i].head ? cases[i].head : cases[i].body ? big : huge;
    fake_reply(&f, head, cases[i].body, cases[i].tail, cases[i].hangup);
    uint64_t before = cases[i].counted ? stat_get(c, cases[i].counted, NULL) : 0;
    uint64_t discarded = stat_get(c, "tier_discarded_total", NULL);
    uint64_t errors = stat_get(c, "tier_errors_total{kind=connection}", NULL);
    pthread_mutex_lock(&f.mu); /* the fake node's thread counts them */
    uint64_t gets = f.gets;
    pthread_mutex_unlock(&f.mu);
    /* 4 pages past the pool: a lookup, and a miss whatever came back.
     * After a lost connection the node is not sound: the first lookup is
     * not sent (kind breaker) and the node gets a PING; once it answers,
     * the next lookup goes (1 s at most). */
    bool asked = false;
    uint64_t give_up = it_mono_ms() + IT_WAIT_MS; /* a bound for a loaded machine, not a pace */
    for (int tries = 0; !asked; tries++) {
      if (it_mono_ms() > give_up) TEST_FAIL_("%s: no GET reached the node", cases[i].what);
      if (tries) it_sleep_ms(10);
      if (attach(h, seq++, 7, 64) != 0) TEST_FAIL_("%s: a page attached", cases[i].what);
      pthread_mutex_lock(&f.mu);
      asked = f.gets > gets;
      pthread_mutex_unlock(&f.mu);
    }
    if (cases[i].counted) {
      uint64_t now = stat_get(c, cases[i].counted, NULL);
      if (now <= before) TEST_FAIL_("%s: %s stayed at %llu", cases[i].what, cases[i].counted,
                                    (unsigned long long)now);
    } else { /* a plain miss: nothing discarded, the connection kept */
      ASSERT_EQ(stat_get(c, "tier_discarded_total", NULL), discarded);
      ASSERT_EQ(stat_get(c, "tier_errors_total{kind=connection}", NULL), errors);
    }
    /* The node goes on serving: a put, a get, an attach of its own. */
    prefill(h, 1000 + i, 100 + (uint32_t)i, 32);
    ASSERT_EQ(attach(h, 2000 + i, 100 + (uint32_t)i, 32), 32);
    ASSERT(holds(h, 2000 + i, 100 + (uint32_t)i, 32));
  }
  ASSERT_EQ(stat_get(c, "tier_errors_total{kind=timeout}", NULL), 0);
  ASSERT_EQ(stat_get(c, "tier_hit_pages_total", NULL), 0);
  ASSERT_EQ(stat_get(c, "request_errors_total", NULL), 0);
  kvc_cache_close(h);
  kvc_client_close(c);
  daemon_stop(&d);
  shutdown(f.lfd, SHUT_RDWR);
  close(f.lfd);
  pthread_join(f.th, NULL);
  free(f.reply);
}

/* ---- the options ------------------------------------------------------------------ */

TEST(cluster_secret_and_auth_files_must_be_private) {
  char dir[64], out[4096], sec[128], auth[128];
  snprintf(dir, sizeof dir, "/tmp/kvcit-XXXXXX");
  ASSERT(mkdtemp(dir) != NULL);
  snprintf(sec, sizeof sec, "%s/secret", dir);
  snprintf(auth, sizeof auth, "%s/auth", dir);
  write_secret(sec, "an-example-fleet-secret-of-32-by\n");
  write_secret(auth, "kvcached hunter2\n");
  ASSERT_EQ(chmod(sec, 0644), 0);
  ASSERT_EQ(it_sh(out, sizeof out, "%s/kvcached --socket %s/s --pool-bytes 8MiB --page-bytes 16KiB "
                  "--cluster-nodes 127.0.0.1:1 --cluster-secret-file %s", it_build(), dir, sec), 1);
  ASSERT(strstr(out, "cluster_secret_file: ") && strstr(out, "readable by it alone"));
  ASSERT_EQ(chmod(sec, 0600), 0);
  ASSERT_EQ(chmod(auth, 0640), 0);
  ASSERT_EQ(it_sh(out, sizeof out, "%s/kvcached --socket %s/s --pool-bytes 8MiB --page-bytes 16KiB "
                  "--cluster-nodes 127.0.0.1:1 --cluster-secret-file %s --cluster-auth-file %s",
                  it_build(), dir, sec, auth), 1);
  ASSERT(strstr(out, "cluster_auth_file: ") && strstr(out, "readable by it alone"));
  write_secret(sec, "short\n");
  ASSERT_EQ(it_sh(out, sizeof out, "%s/kvcached --socket %s/s --pool-bytes 8MiB --page-bytes 16KiB "
                  "--cluster-nodes 127.0.0.1:1 --cluster-secret-file %s", it_build(), dir, sec), 1);
  ASSERT(strstr(out, "at least 16") != NULL);
  /* No cluster_nodes nor disk_dir: no tier, and kvcachectl says so. */
  daemon_t d;
  daemon_start(&d);
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "tier"), 0);
  ASSERT(strstr(out, "no tier below memory") != NULL);
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "tier --json"), 0);
  json_t *j = json_parse_or_fail(out);
  ASSERT_EQ(json_len(json_get(j, "tiers", NULL)), 0);
  json_free(j);
  daemon_stop(&d);
  ASSERT_EQ(it_sh(out, sizeof out, "rm -rf '%s'", dir), 0);
}
