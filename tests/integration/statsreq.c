/* statsreq.c: the Stats request (doc/protocol.md, "Stats"): the node's
 * figures in a reply whose size does not grow with the caches, the caches
 * holding the most pages (10 unless asked; at most 1000), one cache by name,
 * or none; an empty request, as older clients send, gets the default; bad
 * fields are refused on the wire with the connection left usable. (What a
 * tenant sees of other tenants' caches: tenants.c.) */
#include "raw.h"

/* Opens "s%03d" of i and puts pages * 16 tokens as sequence 1. */
static void cache_pages(kvc_client_t *c, int i, uint64_t pages) {
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  char name[16];
  snprintf(name, sizeof name, "s%03d", i);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, name, &l, &h));
  uint64_t n = pages * 16;
  if (n) {
    float *k = calloc(n * it_tok_floats(&l, false), sizeof *k);
    float *v = calloc(n * it_tok_floats(&l, true), sizeof *v);
    ASSERT(k && v);
    ASSERT_OK(kvc_put(h, 1, 0, n, k, v));
    free(k);
    free(v);
  }
  kvc_cache_close(h);
}

/* The caches of a reply in its order, "name:pages ...", its node figures'
 * count in *node (samples without a cache). */
static void reply_caches(const kvc_stat_t *st, size_t n, char *out, size_t len, size_t *node) {
  size_t used = 0;
  *node = 0;
  out[0] = '\0';
  for (size_t i = 0; i < n; i++) {
    *node += !st[i].cache[0];
    if (strcmp(st[i].name, "cache_pages") != 0) continue;
    int w = snprintf(out + used, len - used, "%s%s:%" PRIu64, used ? " " : "", st[i].cache,
                     st[i].value);
    ASSERT(w > 0 && (size_t)w < len - used);
    used += (size_t)w;
  }
}

static void query(kvc_client_t *c, const kvc_stats_opts_t *q, char *out, size_t len,
                  size_t *node) {
  kvc_stat_t *st;
  size_t n;
  ASSERT_OK(kvc_stats_query(c, q, &st, &n));
  reply_caches(st, n, out, len, node);
  kvc_stats_free(st);
}

static const char *const DAEMON_ARGS[] = {"--max-caches", "2000", "--tenant-max-caches", "0",
                                          "--pool-bytes", "256MiB", NULL};

TEST(stats_top_caches_by_pages_held_default_ten) {
  daemon_t d;
  daemon_start_args(&d, DAEMON_ARGS);
  kvc_client_t *c = client_open(&d);
  /* 12 caches of 1..12 pages, opened in a shuffled order. */
  for (int i = 0; i < 12; i++) cache_pages(c, i, (uint64_t)(i * 5 % 12) + 1);
  char got[1024];
  size_t node, node_default;
  query(c, NULL, got, sizeof got, &node); /* the first: its own op's histogram is not there yet */
  query(c, NULL, got, sizeof got, &node_default); /* kvc_stats's request */
  /* Ten, most pages first: 12 down to 3. */
  static const char *const want = "s007:12 s002:11 s009:10 s004:9 s011:8 s006:7 s001:6 "
                                  "s008:5 s003:4 s010:3";
  ASSERT_STR_EQ(got, want);
  query(c, &(kvc_stats_opts_t){.top = 3}, got, sizeof got, &node);
  ASSERT_STR_EQ(got, "s007:12 s002:11 s009:10");
  ASSERT_EQ(node, node_default); /* the node's figures whatever is asked */
  query(c, &(kvc_stats_opts_t){.top = 1000}, got, sizeof got, &node);
  ASSERT(strstr(got, "s010:3 s005:2 s000:1") != NULL);
  query(c, &(kvc_stats_opts_t){.top = 5000}, got, sizeof got, &node); /* capped, not refused */
  ASSERT(strstr(got, "s010:3 s005:2 s000:1") != NULL);
  query(c, &(kvc_stats_opts_t){.cache = "s005"}, got, sizeof got, &node);
  ASSERT_STR_EQ(got, "s005:2");
  query(c, &(kvc_stats_opts_t){.node_only = true}, got, sizeof got, &node);
  ASSERT_STR_EQ(got, "");
  ASSERT_EQ(node, node_default);
  /* Pages move a cache: s000 grows past every other, s007 empties. */
  kvc_cache_t *h;
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  ASSERT_OK(kvc_cache_open(c, "s007", &l, &h));
  ASSERT_OK(kvc_seq_remove(h, 1, 0, UINT64_MAX));
  kvc_cache_close(h);
  cache_pages(c, 0, 0); /* opens it again: no new page */
  ASSERT_OK(kvc_cache_open(c, "s000", &l, &h));
  size_t nk = 13 * 16 * it_tok_floats(&l, false);
  float *k = calloc(nk, sizeof *k);
  ASSERT_OK(kvc_put(h, 2, 0, 13 * 16, k, k));
  free(k);
  kvc_cache_close(h);
  query(c, &(kvc_stats_opts_t){.top = 2}, got, sizeof got, &node);
  ASSERT_STR_EQ(got, "s000:14 s002:11");
  kvc_client_close(c);
  daemon_stop(&d);
}

/* The reply to the default request holds as many figures with 300 caches
 * as with 12: its size does not grow with the caches. */
TEST(stats_reply_does_not_grow_with_the_caches) {
  daemon_t d;
  daemon_start_args(&d, DAEMON_ARGS);
  kvc_client_t *c = client_open(&d);
  for (int i = 0; i < 12; i++) cache_pages(c, i, 1);
  kvc_stat_t *st;
  size_t n12, n300, node;
  ASSERT_OK(kvc_stats(c, &st, &n12)); /* the first: its own op's histogram is not there yet */
  kvc_stats_free(st);
  ASSERT_OK(kvc_stats(c, &st, &n12));
  kvc_stats_free(st);
  for (int i = 12; i < 300; i++) cache_pages(c, i, i % 3 == 0 ? 2 : 0);
  /* The same requests were made since (cache_open, put): the same families. */
  ASSERT_OK(kvc_stats(c, &st, &n300));
  char got[2048];
  reply_caches(st, n300, got, sizeof got, &node);
  kvc_stats_free(st);
  ASSERT_EQ(n300, n12);
  ASSERT_EQ(strlen(got) > 0, 1);
  size_t ten = 0;
  for (const char *p = got; (p = strstr(p, ":2")) != NULL; p++) ten++;
  ASSERT_EQ(ten, 10); /* ten of the 96 caches of 2 pages */
  kvc_client_close(c);
  daemon_stop(&d);
}

/* What the library refuses before sending, the daemon refuses on the wire
 * too, each with its code and a reason, and the connection stays usable. */
TEST(stats_request_bad_fields_refused_connection_usable) {
  daemon_t d;
  daemon_start_args(&d, DAEMON_ARGS);
  kvc_client_t *c = client_open(&d);
  cache_pages(c, 1, 1);
  kvc_stat_t *st = (kvc_stat_t *)&d;
  size_t n = 7;
  ASSERT_ERR(kvc_stats_query(c, &(kvc_stats_opts_t){.cache = "s001", .top = 2}, &st, &n),
             KVC_E_INVAL);
  ASSERT(st == NULL && n == 0);
  ASSERT_ERR(kvc_stats_query(c, &(kvc_stats_opts_t){.node_only = true, .top = 2}, &st, &n),
             KVC_E_INVAL);
  ASSERT_ERR(kvc_stats_query(c, &(kvc_stats_opts_t){.cache = "nope"}, &st, &n), KVC_E_NOCACHE);
  ASSERT(strstr(kvc_client_last_error(c), "nope") != NULL);
  kvc_client_close(c);

  int fd = it_connect_raw(d.sock);
  raw_hello(fd, KVC_PROTOCOL_VERSION);
  Kvcache__V1__Response *r = raw_reply(fd);
  ASSERT(r && r->status == KVCACHE__V1__STATUS__OK);
  kvcache__v1__response__free_unpacked(r, NULL);
  char longname[KVC_MAX_NAME + 2];
  memset(longname, 'x', sizeof longname - 1);
  longname[sizeof longname - 1] = '\0';
  static const struct {
    const char *cache;
    uint32_t top;
    bool node_only;
    Kvcache__V1__Status status;
    const char *says;
  } bad[] = {
      {"s001", 2, false, KVCACHE__V1__STATUS__INVAL, "not both"},
      {"", 2, true, KVCACHE__V1__STATUS__INVAL, "node_only"},
      {"s001", 0, true, KVCACHE__V1__STATUS__INVAL, "node_only"},
      {NULL, 0, false, KVCACHE__V1__STATUS__NAME, "at most"},
      {"nope", 0, false, KVCACHE__V1__STATUS__NOCACHE, "no cache named 'nope'"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
    Kvcache__V1__StatsRequest sr = KVCACHE__V1__STATS_REQUEST__INIT;
    sr.cache = (char *)(bad[i].cache ? bad[i].cache : longname);
    sr.top = bad[i].top;
    sr.node_only = bad[i].node_only;
    req.body_case = KVCACHE__V1__REQUEST__BODY_STATS;
    req.stats = &sr;
    req.id = 10 + i;
    raw_send_request(fd, &req);
    r = raw_reply(fd);
    ASSERT(r != NULL);
    ASSERT_EQ(r->id, 10 + i);
    ASSERT_EQ(r->status, bad[i].status);
    if (!strstr(r->error, bad[i].says))
      TEST_FAIL_("case %zu: the reason '%s' does not say '%s'", i, r->error, bad[i].says);
    ASSERT(r->body_case != KVCACHE__V1__RESPONSE__BODY_STATS);
    kvcache__v1__response__free_unpacked(r, NULL);
  }
  /* The same connection: an empty request, as an older client sends it. */
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__StatsRequest sr = KVCACHE__V1__STATS_REQUEST__INIT;
  req.body_case = KVCACHE__V1__REQUEST__BODY_STATS;
  req.stats = &sr;
  req.id = 99;
  raw_send_request(fd, &req);
  r = raw_reply(fd);
  ASSERT(r && r->status == KVCACHE__V1__STATUS__OK && r->body_case == KVCACHE__V1__RESPONSE__BODY_STATS);
  size_t rows = 0;
  for (size_t i = 0; i < r->stats->n_stats; i++)
    rows += strcmp(r->stats->stats[i]->name, "cache_pages") == 0 &&
            strcmp(r->stats->stats[i]->cache, "s001") == 0;
  ASSERT_EQ(rows, 1);
  kvcache__v1__response__free_unpacked(r, NULL);
  close(fd);
  daemon_stop(&d);
}
