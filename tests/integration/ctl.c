/* ctl.c: kvcachectl against a real daemon: ping, stats as JSON (figures
 * matching what the test did) and as Prometheus text (validated), caches,
 * seqs, info, and its one-line failures. */
#include <ctype.h>

#include "harness.h"
#include "json.h"
#include "raw.h"

static void put_tokens(kvc_cache_t *h, uint64_t seq, uint64_t n) {
  const kvc_layout_t *l = kvc_cache_layout(h);
  float *k = calloc(it_tok_floats(l, false) * n, 4), *v = calloc(it_tok_floats(l, true) * n, 4);
  it_fill_f32(k, v, l, seq, 0, n, 0);
  ASSERT_OK(kvc_put(h, seq, 0, n, k, v));
  free(k);
  free(v);
}

TEST(ctl_stats_json_matches_what_happened) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h, *h2;
  ASSERT_OK(kvc_cache_open(c, "ctl", &l, &h));
  ASSERT_OK(kvc_cache_open(c, "other\"quoted", &l, &h2));
  put_tokens(h, 1, 20);
  put_tokens(h, 2, 5);
  put_tokens(h2, 3, 1);
  ASSERT_OK(kvc_seq_pin(h, 2));
  float buf[4096];
  ASSERT_ERR(kvc_get(h, 99, 0, 1, buf, buf), KVC_E_NOSEQ);

  static char out[1 << 18];
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "stats --json"), 0);
  json_t *j = json_parse_or_fail(out);
  const json_t *g = json_get(j, "global", NULL), *cc = json_get(j, "caches", "ctl", NULL);
  ASSERT_U64_EQ(json_u64(json_get(g, "sequences", "value", NULL)), 3);
  ASSERT_U64_EQ(json_u64(json_get(g, "tokens", "value", NULL)), 26);
  ASSERT_U64_EQ(json_u64(json_get(g, "caches", "value", NULL)), 2);
  ASSERT_U64_EQ(json_u64(json_get(g, "sequences_pinned", "value", NULL)), 1);
  /* Every family carries its kind, unit and help. */
  ASSERT_STR_EQ(json_get(g, "pool_bytes", "unit", NULL)->str, "bytes");
  ASSERT_STR_EQ(json_get(g, "pool_bytes", "kind", NULL)->str, "gauge");
  ASSERT_STR_EQ(json_get(g, "puts_total", "kind", NULL)->str, "counter");
  ASSERT(strlen(json_get(g, "puts_total", "help", NULL)->str) > 5);
  /* The kvcachectl connection itself is the second. */
  ASSERT_U64_EQ(json_u64(json_get(g, "connections_current", "value", NULL)), 2);
  ASSERT_U64_EQ(json_u64(json_get(cc, "cache_sequences", "value", NULL)), 2);
  ASSERT_U64_EQ(json_u64(json_get(cc, "cache_tokens", "value", NULL)), 25);
  /* Labelled families are samples: requests by op, errors by op and status,
   * the latency histogram with its buckets in seconds. */
  const json_t *req = json_get(g, "requests_total", "samples", NULL);
  bool put_seen = false;
  for (size_t i = 0; i < json_len(req); i++) {
    const json_t *smp = json_at(req, i);
    if (strcmp(json_get(smp, "labels", "op", NULL)->str, "put") != 0) continue;
    ASSERT_U64_EQ(json_u64(json_get(smp, "value", NULL)), 3);
    put_seen = true;
  }
  ASSERT(put_seen);
  const json_t *errs = json_at(json_get(g, "request_errors_total", "samples", NULL), 0);
  ASSERT_STR_EQ(json_get(errs, "labels", "op", NULL)->str, "get");
  ASSERT_STR_EQ(json_get(errs, "labels", "status", NULL)->str, "NOSEQ");
  ASSERT_U64_EQ(json_u64(json_get(errs, "value", NULL)), 1);
  ASSERT_STR_EQ(json_get(g, "request_duration_seconds", "kind", NULL)->str, "histogram");
  ASSERT_STR_EQ(json_get(g, "request_duration_seconds", "unit", NULL)->str, "seconds");
  const json_t *hist = json_at(json_get(g, "request_duration_seconds", "samples", NULL), 0);
  const json_t *bk = json_get(hist, "buckets", NULL);
  ASSERT(json_len(bk) > 20);
  ASSERT(json_num(json_get(hist, "sum", NULL)) > 0);
  ASSERT_EQ(json_len(json_get(j, "caches", NULL)), 2);
  /* The quoted name is escaped in the output and found by its own spelling. */
  ASSERT_U64_EQ(json_u64(json_get(j, "caches", "other\"quoted", "cache_sequences", "value", NULL)), 1);
  json_free(j);

  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "ping"), 0);
  ASSERT(strncmp(out, "pong from kvcached " KVC_VERSION_STRING, 23) == 0);
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "caches"), 0);
  ASSERT(strstr(out, "ctl ") != NULL && strstr(out, "f32") != NULL);
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "seqs --cache ctl"), 0);
  ASSERT(strstr(out, "IDLE") != NULL && strstr(out, "LAST_USE") == NULL);
  int lines = 0;
  for (char *p = out; *p; p++) lines += *p == '\n';
  ASSERT_EQ(lines, 3); /* header + 2 sequences */
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "seqs"), 0);
  lines = 0;
  for (char *p = out; *p; p++) lines += *p == '\n';
  ASSERT_EQ(lines, 4);
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "info ctl 1"), 0);
  ASSERT(strstr(out, "length        20\n") != NULL);
  ASSERT(strstr(out, "pins          0\n") != NULL);
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "info ctl 2"), 0);
  ASSERT(strstr(out, "pins          1\n") != NULL);
  ASSERT_EQ(ctl_run(&d, out, sizeof out, true, "info ctl 99"), 1);
  ASSERT(strstr(out, "NOSEQ") != NULL);
  ASSERT_EQ(ctl_run(&d, out, sizeof out, true, "info nope 1"), 1);
  ASSERT(strstr(out, "NOCACHE") != NULL);
  ASSERT_EQ(ctl_run(&d, out, sizeof out, true, "frobnicate"), 2);
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "--help"), 0);
  ASSERT(strstr(out, "usage: kvcachectl") != NULL);
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "stats"), 0);
  ASSERT(strstr(out, "pool_pages") != NULL && strstr(out, "\nRequests") != NULL);
  /* Counted by the daemon: every kvcachectl run above that reached it is one
   * connection (frobnicate and --help do not connect). */
  ASSERT_U64_EQ(stat_get(c, "connections_total", NULL), 1 + 1 + 10);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* Validates Prometheus text exposition: comment lines are HELP or TYPE,
 * every sample is `name{labels} value` with a TYPE line for its name seen
 * before it, each TYPE once. Returns the number of samples. */
static int check_exposition(char *text) {
  char types[512][96];
  int ntypes = 0, samples = 0;
  for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
    char name[96];
    if (strncmp(line, "# HELP ", 7) == 0) continue;
    if (strncmp(line, "# TYPE ", 7) == 0) {
      char kind[32];
      ASSERT_EQ(sscanf(line + 7, "%95s %31s", name, kind), 2);
      ASSERT(strcmp(kind, "counter") == 0 || strcmp(kind, "gauge") == 0 ||
             strcmp(kind, "histogram") == 0);
      for (int i = 0; i < ntypes; i++)
        if (strcmp(types[i], name) == 0) TEST_FAIL_("TYPE twice for %s", name);
      ASSERT(ntypes < 512);
      strcpy(types[ntypes++], name);
      continue;
    }
    ASSERT(line[0] != '#');
    size_t i = 0;
    ASSERT(isalpha((unsigned char)line[0]) || line[0] == '_' || line[0] == ':');
    while (isalnum((unsigned char)line[i]) || line[i] == '_' || line[i] == ':') i++;
    ASSERT(i < sizeof name);
    memcpy(name, line, i);
    name[i] = '\0';
    if (line[i] == '{') { /* label="value"[,label="value"]} */
      i++;
      for (;;) {
        ASSERT(isalpha((unsigned char)line[i]) || line[i] == '_');
        while (isalnum((unsigned char)line[i]) || line[i] == '_') i++;
        ASSERT(line[i] == '=' && line[i + 1] == '"');
        i += 2;
        while (line[i] != '"') {
          ASSERT(line[i] != '\0');
          if (line[i] == '\\') {
            ASSERT(line[i + 1] == '\\' || line[i + 1] == '"' || line[i + 1] == 'n');
            i++;
          }
          i++;
        }
        i++;
        if (line[i] == ',') { i++; continue; }
        ASSERT(line[i] == '}');
        i++;
        break;
      }
    }
    ASSERT(line[i] == ' ');
    char *end;
    strtod(line + i + 1, &end);
    ASSERT(end != line + i + 1 && *end == '\0');
    bool typed = false;
    for (int t = 0; t < ntypes && !typed; t++) {
      size_t tl = strlen(types[t]);
      typed = strcmp(types[t], name) == 0 ||
              (strncmp(types[t], name, tl) == 0 &&
               (strcmp(name + tl, "_bucket") == 0 || strcmp(name + tl, "_sum") == 0 ||
                strcmp(name + tl, "_count") == 0));
    }
    if (!typed) TEST_FAIL_("sample %s has no TYPE line before it", name);
    ASSERT(strncmp(name, "kvcached_", 9) == 0 || strncmp(name, "process_", 8) == 0);
    samples++;
  }
  return samples;
}

TEST(ctl_stats_prometheus_is_valid_exposition) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h, *h2;
  ASSERT_OK(kvc_cache_open(c, "prom", &l, &h));
  ASSERT_OK(kvc_cache_open(c, "we\"ird\\name", &l, &h2));
  put_tokens(h, 1, 3);
  static char out[1 << 18];
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "stats --prometheus"), 0);
  ASSERT(strstr(out, "# TYPE kvcached_pages_free gauge\n") != NULL);
  ASSERT(strstr(out, "# TYPE kvcached_puts_total counter\n") != NULL);
  ASSERT(strstr(out, "kvcached_cache_tokens{cache=\"prom\",tenant=\"uid:0\"} 3\n") != NULL);
  ASSERT(strstr(out, "kvcached_cache_tokens{cache=\"we\\\"ird\\\\name\",tenant=\"uid:0\"} 0\n") != NULL);
  ASSERT(strstr(out, "kvcached_requests_total{op=\"put\"} 1\n") != NULL);
  ASSERT(strstr(out, "kvcached_request_duration_seconds_count{op=\"put\"} 1\n") != NULL);
  ASSERT(strstr(out, "kvcached_request_duration_seconds_bucket{op=\"put\",le=\"+Inf\"} 1\n") != NULL);
  ASSERT(strstr(out, "kvcached_build_info{version=\"" KVC_VERSION_STRING "\",protocol=\"1\"} 1\n") != NULL);
  ASSERT(strstr(out, "\nprocess_start_time_seconds ") != NULL);
  kvc_stat_t *st;
  size_t n;
  ASSERT_OK(kvc_stats(c, &st, &n));
  long long samples = 0;
  for (size_t i = 0; i < n; i++)
    samples += st[i].kind == KVC_STAT_HISTOGRAM ? (long long)st[i].nbuckets + 3 : 1;
  kvc_stats_free(st);
  /* The scrape runs before kvc_stats: its own stats request adds a histogram then. */
  long long got = check_exposition(out);
  ASSERT(got > 150 && got <= samples);
  kvc_client_close(c);
  daemon_stop(&d);
}

TEST(ctl_fails_with_one_line_when_not_running) {
  daemon_t d;
  memset(&d, 0, sizeof d);
  snprintf(d.sock, sizeof d.sock, "/tmp/kvcit-no-such-dir/kvcached.sock");
  char out[1024];
  ASSERT_EQ(ctl_run(&d, out, sizeof out, true, "stats"), 1);
  ASSERT(strstr(out, "not running") != NULL);
  ASSERT(strchr(out, '\n') == out + strlen(out) - 1);
}

/* A fake daemon of another protocol version: it answers the Hello with
 * VERSION, as kvcached does, and kvcachectl reports it in one line. */
TEST(ctl_fails_with_one_line_on_version_mismatch) {
  daemon_t d;
  memset(&d, 0, sizeof d);
  snprintf(d.dir, sizeof d.dir, "/tmp/kvcit-XXXXXX");
  ASSERT(mkdtemp(d.dir) != NULL);
  snprintf(d.sock, sizeof d.sock, "%s/fake.sock", d.dir);
  int ls = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", d.sock);
  ASSERT(bind(ls, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(ls, 4) == 0);
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    int fd = accept(ls, NULL, NULL);
    uint8_t buf[512];
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n < 4) _exit(3);
    Kvcache__V1__Request *req = kvcache__v1__request__unpack(NULL, (size_t)n - 4, buf + 4);
    if (!req || req->body_case != KVCACHE__V1__REQUEST__BODY_HELLO) _exit(4);
    Kvcache__V1__Response resp = KVCACHE__V1__RESPONSE__INIT;
    resp.id = req->id;
    resp.status = KVCACHE__V1__STATUS__VERSION;
    resp.error = (char *)"client speaks protocol 1, kvcached 9.0 speaks 9";
    size_t len = kvcache__v1__response__get_packed_size(&resp);
    buf[0] = (uint8_t)len, buf[1] = buf[2] = buf[3] = 0;
    kvcache__v1__response__pack(&resp, buf + 4);
    if (send(fd, buf, 4 + len, 0) != (ssize_t)(4 + len)) _exit(5);
    close(fd);
    _exit(0);
  }
  close(ls);
  char out[1024];
  ASSERT_EQ(ctl_run(&d, out, sizeof out, true, "ping"), 1);
  ASSERT(strstr(out, "speaks 9") != NULL && strstr(out, "VERSION") != NULL);
  ASSERT(strchr(out, '\n') == out + strlen(out) - 1);
  int st;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT_EQ(WEXITSTATUS(st), 0);
  char rm[160];
  snprintf(rm, sizeof rm, "rm -rf '%s'", d.dir);
  ASSERT_EQ(system(rm), 0);
}
