/* operators.c: what an operator who runs Redis and memcached expects.
 * promtool accepts a busy daemon's metrics; the metrics_listen endpoint is
 * scraped by a real HTTP client (curl) and refuses everything but GET
 * /metrics; the alert rules pass promtool check rules and the dashboard and
 * rules name only exported families; every kvcachectl command with good and
 * bad arguments and without a daemon; the admin requests refused for a
 * non-admin uid and doing their work for root; kvcachectl top in a real
 * terminal (tmux); the man pages render without warnings. */
#include <ctype.h>
#include <grp.h>

#include "harness.h"
#include "json.h"

static void put_tokens(kvc_cache_t *h, uint64_t seq, uint64_t n) {
  const kvc_layout_t *l = kvc_cache_layout(h);
  float *k = calloc(it_tok_floats(l, false) * n, 4), *v = calloc(it_tok_floats(l, true) * n, 4);
  it_fill_f32(k, v, l, seq, 0, n, 0);
  ASSERT_OK(kvc_put(h, seq, 0, n, k, v));
  free(k);
  free(v);
}

/* Some of everything: puts, gets, errors, pins, a match, two caches. */
static void busy(kvc_client_t *c, int rounds) {
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h, *h2;
  ASSERT_OK(kvc_cache_open(c, "busy", &l, &h));
  ASSERT_OK(kvc_cache_open(c, "other", &l, &h2));
  float *buf = calloc(it_tok_floats(&l, false) * 64, 4);
  for (int r = 0; r < rounds; r++) {
    put_tokens(h, 1 + (uint64_t)r % 4, 16);
    put_tokens(h2, 7, 4);
    ASSERT_OK(kvc_get(h, 1, 0, 1, buf, buf));
    ASSERT_ERR(kvc_get(h, 999, 0, 1, buf, buf), KVC_E_NOSEQ);
  }
  ASSERT_OK(kvc_seq_pin(h, 1));
  ASSERT_ERR(kvc_seq_unpin(h, 2), KVC_E_NOTPINNED);
  free(buf);
  kvc_cache_close(h);
  kvc_cache_close(h2);
}

static const char *promtool(void) {
  static char path[512];
  snprintf(path, sizeof path, "%s/.tools/promtool", it_srcdir());
  if (access(path, X_OK) != 0) TEST_FAIL_("%s missing: run make deps", path);
  return path;
}

/* The port of the metrics endpoint, from the daemon's log. */
static unsigned metrics_port(const daemon_t *d) {
  ASSERT(it_log_wait(d, "event=metrics_listen address=127.0.0.1 port=", 5000));
  FILE *f = fopen(d->log, "r");
  char line[1024];
  unsigned port = 0;
  while (f && fgets(line, sizeof line, f)) {
    const char *p = strstr(line, "event=metrics_listen address=127.0.0.1 port=");
    if (p) port = (unsigned)atoi(strchr(p, '=') ? strstr(p, "port=") + 5 : p);
  }
  if (f) fclose(f);
  ASSERT(port > 0);
  return port;
}

TEST(ops_metrics_promtool_clean_and_scraped_by_http) {
  static const char *const http[] = {"--metrics-listen", "127.0.0.1:0", NULL};
  daemon_t d;
  daemon_start_args(&d, http);
  kvc_client_t *c = client_open(&d);
  busy(c, 20);
  unsigned port = metrics_port(&d);
  static char out[1 << 18], ref[1 << 18];
  char file[256];
  snprintf(file, sizeof file, "%s/metrics.prom", d.dir);
  /* kvcachectl's text, through promtool: no problem at all (exit 0, silent). */
  ASSERT_EQ(it_sh(out, sizeof out, "%s/kvcachectl --socket '%s' stats --prometheus > '%s' && "
                  "%s check metrics < '%s' 2>&1", it_build(), d.sock, file, promtool(), file), 0);
  ASSERT_STR_EQ(out, "");
  /* The endpoint, scraped by curl: the same families, promtool-clean too. */
  ASSERT_EQ(it_sh(out, sizeof out, "curl -sS -D '%s/headers' -o '%s/scrape' "
                  "http://127.0.0.1:%u/metrics && %s check metrics < '%s/scrape' 2>&1 && "
                  "cat '%s/headers'", d.dir, d.dir, port, promtool(), d.dir, d.dir), 0);
  ASSERT(strstr(out, "HTTP/1.1 200 OK") != NULL);
  ASSERT(strstr(out, "Content-Type: text/plain; version=0.0.4") != NULL);
  ASSERT(strstr(out, "Connection: close") != NULL);
  ASSERT_EQ(it_sh(ref, sizeof ref, "cat '%s/scrape'", d.dir), 0);
  ASSERT(strstr(ref, "# TYPE kvcached_request_duration_seconds histogram\n") != NULL);
  ASSERT(strstr(ref, "# TYPE kvcached_build_info gauge\n") != NULL);
  ASSERT(strstr(ref, "\nkvcached_request_errors_total{op=\"get\",status=\"NOSEQ\"} 20\n"));
  ASSERT(strstr(ref, "\nkvcached_request_errors_total{op=\"unpin\",status=\"NOTPINNED\"} 1\n"));
  ASSERT(strstr(ref, "\nkvcached_cache_puts_total{cache=\"busy\",tenant=\"uid:0\"} 20\n") != NULL);
  /* The get histogram: cumulative buckets, +Inf equal to _count, a sum. */
  uint64_t last = 0, inf = 0, count = 0;
  int nb = 0;
  for (char *p = ref; (p = strstr(p, "kvcached_request_duration_seconds_bucket{op=\"get\",le=\""));
       p++) {
    char *q = strstr(p, "} ");
    ASSERT(q != NULL);
    uint64_t v = strtoull(q + 2, NULL, 10);
    ASSERT(v >= last);
    last = v;
    if (strncmp(strstr(p, "le=\"") + 4, "+Inf", 4) == 0) inf = v;
    nb++;
  }
  char *cp = strstr(ref, "kvcached_request_duration_seconds_count{op=\"get\"} ");
  ASSERT(cp != NULL);
  count = strtoull(strchr(cp, ' ') + 1, NULL, 10);
  ASSERT_EQ(nb, 27);
  ASSERT_U64_EQ(inf, 40);
  ASSERT_U64_EQ(count, 40);
  ASSERT(strstr(ref, "kvcached_request_duration_seconds_sum{op=\"get\"} ") != NULL);
  /* Only GET /metrics: 404 elsewhere, 405 for another method, 431 for a
   * request too large; each counted. */
  ASSERT_EQ(it_sh(out, sizeof out, "curl -s -o /dev/null -w '%%{http_code}' "
                  "http://127.0.0.1:%u/", port), 0);
  ASSERT_STR_EQ(out, "404");
  ASSERT_EQ(it_sh(out, sizeof out, "curl -s -o /dev/null -w '%%{http_code}' -X POST "
                  "http://127.0.0.1:%u/metrics", port), 0);
  ASSERT_STR_EQ(out, "405");
  ASSERT_EQ(it_sh(out, sizeof out, "curl -s -o /dev/null -w '%%{http_code}' -H \"X-Big: "
                  "$(printf '%%06000d' 0)\" http://127.0.0.1:%u/metrics", port), 0);
  ASSERT_STR_EQ(out, "431");
  ASSERT_U64_EQ(stat_get(c, "metrics_scrapes_total", NULL), 1);
  ASSERT_U64_EQ(stat_get(c, "metrics_http_errors_total", NULL), 3);
  /* Still serving the socket's clients. */
  ASSERT_OK(kvc_ping(c));
  kvc_client_close(c);
  daemon_stop(&d);
}

/* Every kvcached_ family named in text, without its histogram suffix. */
static void names_in(const char *text, char names[][96], int *n, int cap) {
  for (const char *p = text; (p = strstr(p, "kvcached_")); p++) {
    if (p > text && (isalnum((unsigned char)p[-1]) || p[-1] == '_')) continue;
    size_t len = 0;
    while (isalnum((unsigned char)p[len]) || p[len] == '_') len++;
    char name[96];
    snprintf(name, sizeof name, "%.*s", (int)len, p);
    static const char *const sfx[] = {"_bucket", "_sum", "_count"};
    for (int s = 0; s < 3; s++) {
      size_t sl = strlen(sfx[s]), nl = strlen(name);
      if (nl > sl && strcmp(name + nl - sl, sfx[s]) == 0 && strstr(name, "duration_seconds"))
        name[nl - sl] = '\0';
    }
    bool seen = false;
    for (int i = 0; i < *n && !seen; i++) seen = strcmp(names[i], name) == 0;
    if (!seen && *n < cap) snprintf(names[(*n)++], 96, "%s", name);
  }
}

TEST(ops_alert_rules_and_dashboard_check) {
  static char out[1 << 18], text[1 << 17];
  ASSERT_EQ(it_sh(out, sizeof out, "%s check rules '%s/doc/kvcached-alerts.yml' 2>&1",
                  promtool(), it_srcdir()), 0);
  ASSERT(strstr(out, "SUCCESS") != NULL);
  /* The families both files use are exported by a busy daemon. */
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  busy(c, 2);
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "stats --prometheus"), 0);
  static char names[256][96];
  int n = 0;
  ASSERT_EQ(it_sh(text, sizeof text, "cat '%s/doc/kvcached-dashboard.json'", it_srcdir()), 0);
  json_t *j = json_parse_or_fail(text);
  ASSERT(json_len(json_get(j, "panels", NULL)) >= 10);
  json_free(j);
  names_in(text, names, &n, 256);
  ASSERT_EQ(it_sh(text, sizeof text, "cat '%s/doc/kvcached-alerts.yml'", it_srcdir()), 0);
  names_in(text, names, &n, 256);
  ASSERT(n >= 15);
  for (int i = 0; i < n; i++) {
    char want[128];
    snprintf(want, sizeof want, "# TYPE %.95s ", names[i]);
    if (!strstr(out, want)) TEST_FAIL_("the dashboard or rules use %s, not exported", names[i]);
  }
  kvc_client_close(c);
  daemon_stop(&d);
}

/* ---- kvcachectl's command line ------------------------------------------------- */

static int lines(const char *s) {
  int n = 0;
  for (; *s; s++) n += *s == '\n';
  return n;
}

TEST(ops_ctl_commands_good_and_bad_arguments) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  busy(c, 2);
  static char out[1 << 18];
  /* --version and help. */
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "--version"), 0);
  ASSERT_STR_EQ(out, "kvcachectl " KVC_VERSION_STRING " (protocol 1)\n");
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "help"), 0);
  ASSERT(strstr(out, "commands:") && strstr(out, "  top ") && strstr(out, "disconnect"));
  /* Each summary whole, in lines of a terminal (they were cut mid-sentence,
   * and ran to 111 columns). */
  for (const char *p = out, *nl; *p; p = nl + 1) {
    nl = strchr(p, '\n');
    if (!nl) break;
    if (nl - p > 79) TEST_FAIL_("kvcachectl help: a line of %d columns: %.*s", (int)(nl - p),
                                (int)(nl - p), p);
  }
  ASSERT(strstr(out, "every connection, like Redis CLIENT LIST\n") &&
         strstr(out, "(admins only)\n  config"));
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "help seqs"), 0);
  ASSERT(strncmp(out, "usage: kvcachectl [--socket PATH] seqs [--cache NAME] [--json]\n", 62) == 0);
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "stats --help"), 0);
  ASSERT(strstr(out, "--prometheus") != NULL);
  ASSERT_EQ(ctl_run(&d, out, sizeof out, true, "help nope"), 2);
  /* Good arguments: every command, --json where it is accepted. */
  static const char *const json_cmds[] = {"stats --json", "caches --json", "seqs --json",
                                          "seqs --cache busy --json", "info --json busy 1",
                                          "prefix --json", "clients --json", "config --json"};
  for (size_t i = 0; i < sizeof json_cmds / sizeof json_cmds[0]; i++) {
    ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "%s", json_cmds[i]), 0);
    json_t *j = json_parse_or_fail(out);
    json_free(j);
  }
  /* config --json: numbers as numbers (sizes in bytes), booleans, the id
   * lists as arrays, the rest as text (it gave every value as a string). */
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "config --json"), 0);
  json_t *j = json_parse_or_fail(out);
  ASSERT_U64_EQ(json_u64(json_get(j, "pool_bytes", NULL)), 8u << 20);
  ASSERT_U64_EQ(json_u64(json_get(j, "max_caches", NULL)), 64);
  ASSERT(strstr(out, "\"pool_huge_pages\": true") || strstr(out, "\"pool_huge_pages\": false"));
  ASSERT(strstr(out, "\"allow_uids\": [0]") && strstr(out, "\"allow_gids\": []"));
  ASSERT_STR_EQ(json_get(j, "socket_mode", NULL)->str, "0660");
  ASSERT_STR_EQ(json_get(j, "log_level", NULL)->str, "debug");
  json_free(j);
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "config"), 0);
  ASSERT(strstr(out, "\npage_bytes = 16KiB\n") && strstr(out, "\nmetrics_listen = \"\"\n"));
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "stats"), 0);
  ASSERT(strstr(out, "\nPool\n") && strstr(out, "\nConnections\n") && strstr(out, " MiB") &&
         strstr(out, "\nRequests (operations that ran") && strstr(out, "RATE/S"));
  ASSERT(strstr(out, "\n  get ") && strstr(out, "\nErrors by status\n"));
  /* One name a figure: the table's is --raw's and --json's (puts_total, not
   * puts); every figure in a section (no "Other" of about 50); the
   * quantiles said to be estimates. */
  ASSERT(strstr(out, "\n  puts_total ") && strstr(out, "\n  connections_total ") &&
         !strstr(out, "\n  puts "));
  ASSERT(!strstr(out, "\nOther\n") && strstr(out, "\n  tier_disk_bytes ") &&
         strstr(out, "\n  events_batches_total ") && strstr(out, "\n  ring_requests_total "));
  ASSERT(strstr(out, "histogram_quantile") != NULL);
  /* tenants: the shared buffers in units, as every other size (they were
   * raw byte counts). */
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "tenants"), 0);
  ASSERT(strstr(out, "MiB/1.0GiB") != NULL);
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "stats --raw"), 0);
  ASSERT(strstr(out, "\nrequests_total{op=\"put\"} 4\n") != NULL);
  ASSERT(strstr(out, "\ncache_sequences{cache=\"busy\",tenant=\"uid:0\"} 2\n") != NULL);
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "stats --cache other --raw"), 0);
  ASSERT(strstr(out, "busy") == NULL && strstr(out, "cache_tokens{cache=\"other\",tenant=\"uid:0\"} 4\n"));
  ASSERT(strstr(out, "\npages_used ") == NULL); /* that cache's figures only */
  /* --top 1: the cache holding the most pages, and the node's figures. */
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "stats --top 1 --raw"), 0);
  ASSERT(strstr(out, "\npages_used ") != NULL);
  ASSERT((strstr(out, "cache_pages{cache=\"busy\"") != NULL) !=
         (strstr(out, "cache_pages{cache=\"other\"") != NULL));
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "seqs --cache busy"), 0);
  ASSERT_EQ(lines(out), 3);
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "top --count 1"), 0); /* not a tty: a frame */
  ASSERT(strstr(out, "REQ/S") && strstr(out, "busy"));
  /* Bad arguments: refused with the command's usage, exit 2, nothing on
   * stdout. */
  static const struct { const char *args, *says; } bad[] = {
      {"stats --json --prometheus", "exclude each other"},
      {"stats --cache", "--cache needs a value"},
      {"stats --top 3 --cache busy", "--cache and --top exclude each other"},
      {"stats --top 1001", "--top takes 1..1000"},
      {"ping --top 3 a b", "ping does not take this option"},
      {"ping extra", "unexpected argument 'extra'"},
      {"caches --raw", "caches does not take this option"},
      {"caches --bogus", "--bogus: unknown option"},
      {"seqs --prometheus", "seqs does not take this option"},
      {"info busy", "info: missing arguments"},
      {"info busy x", "SEQ must be a number"},
      {"top --interval 0", "--interval takes"},
      {"top --json", "top does not take this option"},
      {"prefix --top 0", "--top takes 1..1000"},
      {"drop", "drop: missing arguments"},
      {"remove busy", "remove: missing arguments"},
      {"unpin busy 1 2", "unexpected argument '2'"},
      {"disconnect x", "CONN_ID must be a number"},
      {"frobnicate", "unknown command 'frobnicate'"},
      {"--bogus ping", "unknown option before the command"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = ctl_run(&d, out, sizeof out, false, "%s 2>/dev/null", bad[i].args);
    if (rc != 2 || out[0]) TEST_FAIL_("kvcachectl %s: exit %d, stdout '%s'", bad[i].args, rc, out);
    ASSERT_EQ(ctl_run(&d, out, sizeof out, true, "%s", bad[i].args), 2);
    if (!strstr(out, bad[i].says)) TEST_FAIL_("kvcachectl %s said '%s'", bad[i].args, out);
    if (!strstr(out, "usage: kvcachectl")) TEST_FAIL_("kvcachectl %s: no usage", bad[i].args);
  }
  /* Unknown names: exit 1, one line, and nothing printed before it. */
  static const char *const unknown[] = {"stats --cache nope", "seqs --cache nope",
                                        "prefix --cache nope", "info nope 1", "drop nope"};
  for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
    ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "%s 2>/dev/null", unknown[i]), 1);
    if (out[0]) TEST_FAIL_("kvcachectl %s printed '%s' before failing", unknown[i], out);
    ASSERT_EQ(ctl_run(&d, out, sizeof out, true, "%s", unknown[i]), 1);
    ASSERT_EQ(lines(out), 1);
  }
  kvc_client_close(c);
  daemon_stop(&d);
  /* No daemon: every command fails in one line, exit 1. */
  for (size_t i = 0; i < sizeof json_cmds / sizeof json_cmds[0]; i++) {
    ASSERT_EQ(ctl_run(&d, out, sizeof out, true, "%s", json_cmds[i]), 1);
    ASSERT(strstr(out, "cannot connect") && lines(out) == 1);
  }
  static const char *const others[] = {"ping", "stats", "top --count 1", "drop busy",
                                       "remove busy 1", "unpin busy 1", "disconnect 3"};
  for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
    ASSERT_EQ(ctl_run(&d, out, sizeof out, true, "%s", others[i]), 1);
    ASSERT(strstr(out, "cannot connect") && lines(out) == 1);
  }
}

/* ---- admins ---------------------------------------------------------------------- */

#define OTHER_UID 64123

TEST(ops_admin_requests_refused_for_non_admins_done_for_root) {
  static const char *const args[] = {"--allow-uids", "self,root,64123", "--socket-mode", "0666",
                                     NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  ASSERT(chmod(d.dir, 0711) == 0);
  kvc_client_t *c = client_open(&d);
  busy(c, 4);
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    if (setgroups(0, NULL) != 0 || setresgid(OTHER_UID, OTHER_UID, OTHER_UID) != 0 ||
        setresuid(OTHER_UID, OTHER_UID, OTHER_UID) != 0)
      _exit(20);
    kvc_client_opts_t o = {.socket_path = d.sock, .shm_bytes = 1 << 20};
    kvc_client_t *x = NULL;
    if (kvc_client_open(&o, &x) != 0) _exit(21);
    if (kvc_ping(x) != 0) _exit(22); /* admitted: an ordinary client */
    kvc_client_entry_t *cl;
    kvc_label_t *cfg;
    size_t n;
    if (kvc_clients(x, &cl, &n) != KVC_E_PERM) _exit(23);
    if (!strstr(kvc_client_last_error(x), "admins only")) _exit(24);
    if (kvc_config(x, &cfg, &n) != KVC_E_PERM) _exit(25);
    if (kvc_admin(x, KVC_ADMIN_DROP_CACHE, "busy", 0, 0, NULL) != KVC_E_PERM) _exit(26);
    if (kvc_admin(x, KVC_ADMIN_REMOVE_SEQ, "busy", 1, 0, NULL) != KVC_E_PERM) _exit(27);
    if (kvc_admin(x, KVC_ADMIN_UNPIN_SEQ, "busy", 1, 0, NULL) != KVC_E_PERM) _exit(28);
    if (kvc_admin(x, KVC_ADMIN_DISCONNECT, NULL, 0, 1, NULL) != KVC_E_PERM) _exit(29);
    if (kvc_ping(x) != 0) _exit(30); /* the connection stays usable */
    kvc_client_close(x);
    /* kvcachectl says the refused command once. */
    char out[1024];
    if (ctl_run(&d, out, sizeof out, true, "clients") != 1) _exit(31);
    if (!strstr(out, "kvcachectl: clients: for admins only") || strstr(out, "clients: clients"))
      _exit(32);
    _exit(0);
  }
  int st;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT(WIFEXITED(st));
  ASSERT_EQ(WEXITSTATUS(st), 0);
  /* Nothing changed for the refusals. */
  ASSERT_U64_EQ(stat_get(c, "sequences", "busy"), 4);
  ASSERT_U64_EQ(stat_get(c, "request_errors_total{op=admin,status=PERM}", NULL), 4);
  ASSERT_U64_EQ(stat_get(c, "request_errors_total{op=clients,status=PERM}", NULL), 2);

  /* Root: the listing, then each write. */
  static char out[1 << 16];
  kvc_client_info_t info;
  kvc_client_info(c, &info);
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "clients"), 0);
  ASSERT(strstr(out, "kvcachectl") && strstr(out, " it ") && strstr(out, "(this)"));
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "clients --json"), 0);
  json_t *j = json_parse_or_fail(out);
  const json_t *arr = json_get(j, "clients", NULL);
  ASSERT_EQ(json_len(arr), 2);
  bool found = false;
  for (size_t i = 0; i < json_len(arr); i++) {
    const json_t *e = json_at(arr, i);
    if (json_u64(json_get(e, "id", NULL)) != info.conn_id) continue;
    found = true;
    ASSERT_U64_EQ(json_u64(json_get(e, "pins", NULL)), 1);
    ASSERT_U64_EQ(json_u64(json_get(e, "pid", NULL)), (uint64_t)getpid());
    ASSERT(json_u64(json_get(e, "requests", NULL)) > 10);
  }
  ASSERT(found);
  json_free(j);
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "unpin busy 1"), 0);
  ASSERT_STR_EQ(out, "released 1 pin of sequence 1 of busy\n");
  ASSERT_U64_EQ(stat_get(c, "sequences_pinned", NULL), 0);
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "remove busy 2"), 0);
  ASSERT_U64_EQ(stat_get(c, "sequences", "busy"), 3);
  ASSERT_EQ(ctl_run(&d, out, sizeof out, true, "remove busy 2"), 1);
  ASSERT(strstr(out, "NOSEQ") != NULL);
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "drop other"), 0);
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "caches"), 0);
  ASSERT(strstr(out, "other") == NULL && strstr(out, "busy") != NULL);
  ASSERT_EQ(ctl_run(&d, out, sizeof out, true, "disconnect 999999"), 1);
  ASSERT(strstr(out, "no client with conn_id 999999") != NULL);
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "disconnect %llu",
                    (unsigned long long)info.conn_id), 0);
  ASSERT(it_log_wait(&d, "reason=\"disconnected by an admin\"", 5000));
  ASSERT(kvc_ping(c) != 0); /* closed under it */
  ASSERT(it_log_has(&d, "level=info event=admin_drop"));
  kvc_client_close(c);
  daemon_stop(&d);
}

/* ---- top in a real terminal --------------------------------------------------- */

/* Polls the pane until it shows every needle (or the deadline). */
static bool pane_shows(const char *tmux, const char *const *needles, char *out, size_t cap,
                       long ms) {
  for (long waited = 0; waited <= ms; waited += 50) {
    if (it_sh(out, cap, "%s capture-pane -p -t top", tmux) == 0) {
      bool all = true;
      for (int i = 0; needles[i] && all; i++) all = strstr(out, needles[i]) != NULL;
      if (all) return true;
    }
    it_sleep_ms(50);
  }
  return false;
}

TEST(ops_top_refreshes_in_tmux_and_quits_on_q) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  char tmux[128], done[256];
  static char out[1 << 16];
  snprintf(tmux, sizeof tmux, "tmux -L kvcit-%d -f /dev/null", (int)getpid());
  snprintf(done, sizeof done, "%s/top.exit", d.dir);
  ASSERT_EQ(it_sh(out, sizeof out, "%s new-session -d -s top -x 120 -y 40 "
                  "\"%s/kvcachectl --socket '%s' top --interval 0.2; echo \\$? > '%s'\"",
                  tmux, it_build(), d.sock, done), 0);
  static const char *const first[] = {"kvcached " KVC_VERSION_STRING, "REQ/S", "(q quits)", NULL};
  if (!pane_shows(tmux, first, out, sizeof out, 5000)) TEST_FAIL_("top showed:\n%s", out);
  /* Load: the frame shows it, in place (one header, the cache, a rate). */
  busy(c, 30);
  static const char *const loaded[] = {"busy", "other", "\nput ", "\nget ", NULL};
  if (!pane_shows(tmux, loaded, out, sizeof out, 5000)) TEST_FAIL_("top under load:\n%s", out);
  int headers = 0;
  for (const char *p = out; (p = strstr(p, "kvcached " KVC_VERSION_STRING)); p++) headers++;
  ASSERT_EQ(headers, 1);
  ASSERT(strstr(out, "prefix hit rate") && strstr(out, "free (") && strstr(out, "evictions"));
  /* root is an admin: the clients section lists this test's client. */
  ASSERT(strstr(out, " it ") != NULL);
  ASSERT_EQ(it_sh(out, sizeof out, "%s send-keys -t top q", tmux), 0);
  bool exited = false;
  for (int i = 0; i < 100 && !exited; i++) {
    exited = access(done, F_OK) == 0;
    if (!exited) it_sleep_ms(50);
  }
  ASSERT(exited);
  ASSERT_EQ(it_sh(out, sizeof out, "cat '%s'", done), 0);
  ASSERT_STR_EQ(out, "0\n");
  (void)it_sh(out, sizeof out, "%s kill-server 2>/dev/null", tmux);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* ---- man pages -------------------------------------------------------------------- */

TEST(ops_man_pages_render_without_warnings_with_examples) {
  static const char *const pages[] = {"kvcachectl.1", "kvcached.8"};
  static char out[1 << 17], ctl[1 << 17];
  for (size_t i = 0; i < 2; i++) {
    ASSERT_EQ(it_sh(out, sizeof out, "MANWIDTH=80 man --warnings -l '%s/doc/%s' 2>&1 >/dev/null",
                    it_srcdir(), pages[i]), 0);
    if (out[0]) TEST_FAIL_("man --warnings %s: %s", pages[i], out);
    ASSERT_EQ(it_sh(i ? out : ctl, sizeof out, "MANWIDTH=80 man -l '%s/doc/%s' 2>/dev/null",
                    it_srcdir(), pages[i]), 0);
    ASSERT(strstr(i ? out : ctl, "\nEXAMPLES\n") != NULL);
  }
  /* kvcachectl(1) names every command of kvcachectl help. */
  static char help[1 << 14];
  ASSERT_EQ(it_sh(help, sizeof help, "%s/kvcachectl help", it_build()), 0);
  char *p = strstr(help, "commands:\n");
  char *end = strstr(help, "\noptions:");
  ASSERT(p && end);
  int n = 0;
  for (; (p = strstr(p, "\n  ")) && p < end; p++) {
    char name[32];
    if (sscanf(p + 3, "%31[a-z]", name) != 1) continue;
    char want[64];
    snprintf(want, sizeof want, "\n       %s", name);
    if (!strstr(ctl, want)) TEST_FAIL_("kvcachectl(1) lacks the command %s", name);
    n++;
  }
  ASSERT(n >= 13);
}
