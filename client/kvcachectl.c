/* kvcachectl.c: the operator's command line for kvcached, built only on the
 * public client API (ping, stats as a table, JSON or Prometheus text, caches,
 * seqs, info, the prefix cache's figures). */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvcache/kvcache.h"

static const char usage[] =
    "usage: kvcachectl [--socket PATH] COMMAND [ARGS]\n"
    "\n"
    "commands:\n"
    "  ping                      one round trip; prints the daemon's version\n"
    "  stats [--json|--prometheus]  every figure: a table, JSON or Prometheus text\n"
    "  caches                    the caches and their layouts\n"
    "  seqs [--cache NAME]       the sequences of one cache or of all\n"
    "  info CACHE SEQ            one sequence\n"
    "  tenants                   connected clients and usage per tenant (an admin\n"
    "                            sees every tenant, others their own)\n"
    "  prefix [--cache NAME] [--json] [--top N]\n"
    "                            the prefix cache of one cache or of all: tokens\n"
    "                            queried, hit and ineligible, hit rate, pages indexed\n"
    "                            and cached, and the N (10) chain heads with most hits\n"
    "\n"
    "options:\n"
    "  --socket PATH             the daemon's socket (default: $KVCACHED_SOCKET,\n"
    "                            else /run/kvcached/kvcached.sock as root,\n"
    "                            else $XDG_RUNTIME_DIR/kvcached.sock)\n"
    "  --help                    this text\n"
    "\n"
    "Exit status 0 on success, 1 with a one-line error otherwise.\n";

typedef struct args {
  const char *socket;
  const char *cmd;
  const char *cache;
  const char *pos[2]; /* positional arguments after the command */
  int npos;
  bool json, prometheus;
  unsigned top;       /* prefix: chain heads to show */
} args_t;

static int die(const char *fmt, const char *what) {
  fprintf(stderr, "kvcachectl: ");
  fprintf(stderr, fmt, what);
  fputc('\n', stderr);
  return 1;
}

static int fail(kvc_client_t *c, int rc, const char *what) {
  const char *msg = c ? kvc_client_last_error(c) : kvc_client_open_error();
  fprintf(stderr, "kvcachectl: %s: %s (%s)\n", what, msg && *msg ? msg : kvc_strerror(rc),
          kvc_err_name(rc));
  return 1;
}

static int parse(int argc, char **argv, args_t *a) {
  for (int i = 1; i < argc; i++) {
    const char *s = argv[i];
    if (strcmp(s, "--help") == 0 || strcmp(s, "-h") == 0) {
      fputs(usage, stdout);
      exit(0);
    } else if (strcmp(s, "--socket") == 0 || strcmp(s, "--cache") == 0) {
      if (i + 1 == argc) return die("%s needs a value", s);
      if (s[2] == 's') a->socket = argv[++i];
      else a->cache = argv[++i];
    } else if (strncmp(s, "--socket=", 9) == 0) {
      a->socket = s + 9;
    } else if (strncmp(s, "--cache=", 8) == 0) {
      a->cache = s + 8;
    } else if (strcmp(s, "--top") == 0 || strncmp(s, "--top=", 6) == 0) {
      const char *v = s[5] == '=' ? s + 6 : i + 1 < argc ? argv[++i] : NULL;
      char *end;
      unsigned long n = v ? strtoul(v, &end, 10) : 0;
      if (!v || !*v || *end || n == 0 || n > 1000)
        return die("--top takes 1..1000, got %s", v ? v : "nothing");
      a->top = (unsigned)n;
    } else if (strcmp(s, "--json") == 0) {
      a->json = true;
    } else if (strcmp(s, "--prometheus") == 0) {
      a->prometheus = true;
    } else if (s[0] == '-') {
      return die("unknown option %s (see --help)", s);
    } else if (!a->cmd) {
      a->cmd = s;
    } else if (a->npos < 2) {
      a->pos[a->npos++] = s;
    } else {
      return die("unexpected argument %s (see --help)", s);
    }
  }
  if (!a->cmd) return die("%s", "no command (see --help)");
  return 0;
}

/* ---- stats ------------------------------------------------------------------ */

static void json_string(const char *s) {
  putchar('"');
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') printf("\\%c", ch);
    else if (ch < 0x20) printf("\\u%04x", ch);
    else putchar(ch);
  }
  putchar('"');
}

static void stats_json(const kvc_stat_t *st, size_t n) {
  printf("{\"global\": {");
  int first = 1;
  for (size_t i = 0; i < n; i++) {
    if (st[i].cache[0]) continue;
    printf("%s\n  ", first ? "" : ",");
    json_string(st[i].name);
    printf(": %" PRIu64, st[i].value);
    first = 0;
  }
  printf("\n}, \"caches\": {");
  int first_cache = 1;
  for (size_t i = 0; i < n; i++) {
    if (!st[i].cache[0]) continue;
    bool seen = false; /* each cache once, at its first figure */
    for (size_t j = 0; j < i && !seen; j++) seen = strcmp(st[j].cache, st[i].cache) == 0;
    if (seen) continue;
    printf("%s\n  ", first_cache ? "" : ",");
    json_string(st[i].cache);
    printf(": {");
    first = 1;
    for (size_t j = i; j < n; j++) {
      if (strcmp(st[j].cache, st[i].cache) != 0) continue;
      printf("%s", first ? "" : ", ");
      json_string(st[j].name);
      printf(": %" PRIu64, st[j].value);
      first = 0;
    }
    printf("}");
    first_cache = 0;
  }
  printf("\n}}\n");
}

static void prom_escape(const char *s, bool label) {
  for (; *s; s++) {
    if (*s == '\\') fputs("\\\\", stdout);
    else if (*s == '\n') fputs("\\n", stdout);
    else if (label && *s == '"') fputs("\\\"", stdout);
    else putchar(*s);
  }
}

/* One family per name: HELP and TYPE once, then every sample of it. Per-cache
 * figures are the kvcached_cache_* families, labelled by cache. */
static void stats_prometheus(const kvc_stat_t *st, size_t n) {
  for (size_t i = 0; i < n; i++) {
    bool per_cache = st[i].cache[0] != 0, seen = false;
    for (size_t j = 0; j < i && !seen; j++)
      seen = (st[j].cache[0] != 0) == per_cache && strcmp(st[j].name, st[i].name) == 0;
    if (seen) continue;
    const char *prefix = per_cache ? "kvcached_cache_" : "kvcached_";
    printf("# HELP %s%s ", prefix, st[i].name);
    prom_escape(st[i].help, false);
    printf("\n# TYPE %s%s %s\n", prefix, st[i].name, st[i].gauge ? "gauge" : "counter");
    for (size_t j = i; j < n; j++) {
      if ((st[j].cache[0] != 0) != per_cache || strcmp(st[j].name, st[i].name) != 0) continue;
      printf("%s%s", prefix, st[j].name);
      if (per_cache) {
        printf("{cache=\"");
        prom_escape(st[j].cache, true);
        printf("\"}");
      }
      printf(" %" PRIu64 "\n", st[j].value);
    }
  }
}

static void stats_table(const kvc_stat_t *st, size_t n) {
  printf("%-34s %20s  %s\n", "NAME", "VALUE", "CACHE");
  for (int pass = 0; pass < 2; pass++)
    for (size_t i = 0; i < n; i++)
      if ((st[i].cache[0] != 0) == (pass == 1))
        printf("%-34s %20" PRIu64 "  %s\n", st[i].name, st[i].value, st[i].cache);
}

static int cmd_stats(kvc_client_t *c, const args_t *a) {
  kvc_stat_t *st;
  size_t n;
  int rc = kvc_stats(c, &st, &n);
  if (rc) return fail(c, rc, "stats");
  if (a->json) stats_json(st, n);
  else if (a->prometheus) stats_prometheus(st, n);
  else stats_table(st, n);
  kvc_stats_free(st);
  return 0;
}

/* ---- caches and sequences -------------------------------------------------- */

static const char *dtype_name(kvc_dtype_t d) {
  switch (d) {
  case KVC_DTYPE_F32: return "f32";
  case KVC_DTYPE_F64: return "f64";
  case KVC_DTYPE_F16: return "f16";
  case KVC_DTYPE_BF16: return "bf16";
  case KVC_DTYPE_INT8: return "int8";
  }
  return "?";
}

static int list_caches(kvc_client_t *c, kvc_cache_info_t **out, size_t *n) {
  size_t count = 0;
  int rc = kvc_cache_list(c, NULL, 0, &count);
  if (rc) return rc;
  *out = calloc(count ? count : 1, sizeof **out);
  if (!*out) return KVC_E_NOMEM;
  rc = kvc_cache_list(c, *out, count, n);
  if (*n > count) *n = count;
  return rc;
}

static int cmd_caches(kvc_client_t *c) {
  kvc_cache_info_t *infos;
  size_t n = 0;
  int rc = list_caches(c, &infos, &n);
  if (rc) return fail(c, rc, "caches");
  printf("%-20s %-16s %4s %6s %5s %5s %5s %5s %4s %10s %8s %10s %8s\n", "NAME", "TENANT",
         "ID", "LAYERS", "HEADS", "DK", "DV", "DTYPE", "PT", "PAGE_BYTES", "SEQS", "TOKENS",
         "PAGES");
  for (size_t i = 0; i < n; i++) {
    const kvc_cache_info_t *ci = &infos[i];
    printf("%-20s %-16s %4u %6u %5u %5u %5u %5s %4u %10" PRIu64 " %8" PRIu64 " %10" PRIu64
           " %8" PRIu64 "\n",
           ci->name, ci->tenant, ci->cache_id, ci->layout.num_layers, ci->layout.num_kv_heads,
           ci->layout.head_dim_k, ci->layout.head_dim_v, dtype_name(ci->layout.dtype),
           ci->layout.page_tokens, ci->page_bytes, ci->sequences, ci->tokens, ci->pages);
  }
  free(infos);
  return 0;
}

static int print_seqs(kvc_client_t *c, const char *name) {
  kvc_cache_t *h;
  int rc = kvc_cache_find(c, name, &h);
  if (rc) return fail(c, rc, name);
  kvc_seq_info_t buf[256];
  uint64_t cursor = 0;
  do {
    size_t n = 0;
    rc = kvc_seq_list(h, &cursor, buf, 256, &n);
    if (rc) return fail(c, rc, "seqs");
    for (size_t i = 0; i < n; i++)
      printf("%-20s %20" PRIu64 " %10" PRIu64 " %10" PRIu64 " %6u %6u %4u %14" PRIu64 "\n",
             name, buf[i].seq_id, buf[i].start, buf[i].length, buf[i].pages,
             buf[i].shared_pages, buf[i].pins, buf[i].last_use_ms);
  } while (cursor != 0);
  kvc_cache_close(h);
  return 0;
}

static int cmd_seqs(kvc_client_t *c, const args_t *a) {
  printf("%-20s %20s %10s %10s %6s %6s %4s %14s\n", "CACHE", "SEQ", "START", "LENGTH",
         "PAGES", "SHARED", "PINS", "LAST_USE_MS");
  if (a->cache) return print_seqs(c, a->cache);
  kvc_cache_info_t *infos;
  size_t n = 0;
  int rc = list_caches(c, &infos, &n);
  if (rc) return fail(c, rc, "caches");
  for (size_t i = 0; i < n && rc == 0; i++) rc = print_seqs(c, infos[i].name);
  free(infos);
  return rc;
}

static int cmd_info(kvc_client_t *c, const args_t *a) {
  if (a->npos != 2) return die("%s", "usage: kvcachectl info CACHE SEQ");
  char *end;
  uint64_t seq = strtoull(a->pos[1], &end, 10);
  if (*end || !*a->pos[1]) return die("SEQ must be a number, got %s", a->pos[1]);
  kvc_cache_t *h;
  int rc = kvc_cache_find(c, a->pos[0], &h);
  if (rc) return fail(c, rc, a->pos[0]);
  kvc_seq_info_t si;
  rc = kvc_seq_info(h, seq, &si);
  if (rc) return fail(c, rc, "info");
  printf("cache         %s\nseq_id        %" PRIu64 "\nstart         %" PRIu64
         "\nlength        %" PRIu64 "\nextent        %" PRIu64 "\npages         %u\n"
         "shared_pages  %u\npins          %u\nlast_use_ms   %" PRIu64 "\n",
         a->pos[0], si.seq_id, si.start, si.length, si.extent, si.pages, si.shared_pages,
         si.pins, si.last_use_ms);
  return 0;
}

/* ---- prefix ------------------------------------------------------------------ */

/* The prefix figures of a cache, as `kvcachectl stats` names them. */
static const struct {
  const char *name, *label;
} prefix_figures[] = {
    {"prefix_matches", "match requests"},
    {"prefix_tokens_queried", "tokens queried"},
    {"prefix_tokens_hit", "tokens hit"},
    {"prefix_tokens_ineligible", "tokens ineligible"},
    {"pages_indexed", "pages indexed"},
    {"pages_cached", "pages cached"},
    {"cached_reclaimed", "cached pages reclaimed"},
    {"hash_verify_failed", "verify failures"},
    {"hash_collisions", "hash collisions"},
};
#define NPREFIX_FIGURES (sizeof prefix_figures / sizeof prefix_figures[0])

static uint64_t cache_figure(const kvc_stat_t *st, size_t n, const char *cache,
                             const char *name) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(st[i].cache, cache) == 0 && strcmp(st[i].name, name) == 0) return st[i].value;
  return 0;
}

static void hex(const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++) printf("%02x", p[i]);
}

static void prefix_text(const char *cache, const uint64_t *v, double rate,
                        const kvc_prefix_head_t *heads, size_t nheads) {
  printf("cache %s\n", cache);
  for (size_t i = 0; i < NPREFIX_FIGURES; i++) {
    printf("  %-24s %14" PRIu64, prefix_figures[i].label, v[i]);
    if (strcmp(prefix_figures[i].name, "prefix_tokens_hit") == 0)
      printf("   hit rate %.2f%%", 100.0 * rate);
    putchar('\n');
  }
  printf("  top prefixes by hits:\n    %-16s %14s %8s\n", "HASH", "HITS", "DEPTH");
  for (size_t i = 0; i < nheads; i++) {
    printf("    ");
    hex(heads[i].hash, 8);
    printf(" %14" PRIu64 " %8u\n", heads[i].hits, heads[i].depth);
  }
}

static void prefix_json(const char *cache, const uint64_t *v, double rate,
                        const kvc_prefix_head_t *heads, size_t nheads) {
  json_string(cache);
  printf(": {");
  for (size_t i = 0; i < NPREFIX_FIGURES; i++)
    printf("\"%s\": %" PRIu64 ", ", prefix_figures[i].name, v[i]);
  printf("\"hit_rate\": %.6f, \"top\": [", rate);
  for (size_t i = 0; i < nheads; i++) {
    printf("%s{\"hash\": \"", i ? ", " : "");
    hex(heads[i].hash, heads[i].hash_len);
    printf("\", \"hits\": %" PRIu64 ", \"depth\": %u}", heads[i].hits, heads[i].depth);
  }
  printf("]}");
}

static int print_prefix(kvc_client_t *c, const args_t *a, const kvc_stat_t *st, size_t nst,
                        const char *name, bool first) {
  kvc_cache_t *h;
  int rc = kvc_cache_find(c, name, &h);
  if (rc) return fail(c, rc, name);
  size_t cap = a->top ? a->top : 10, nheads = 0;
  kvc_prefix_head_t *heads = calloc(cap, sizeof *heads);
  if (!heads) return die("%s", "out of memory");
  rc = kvc_prefix_top(h, heads, cap, &nheads);
  kvc_cache_close(h);
  if (rc) {
    free(heads);
    return fail(c, rc, "prefix");
  }
  uint64_t v[NPREFIX_FIGURES];
  for (size_t i = 0; i < NPREFIX_FIGURES; i++)
    v[i] = cache_figure(st, nst, name, prefix_figures[i].name);
  /* Hit rate in tokens: hit over queried (ineligible tokens count as missed). */
  double rate = v[1] ? (double)v[2] / (double)v[1] : 0.0;
  if (a->json) {
    printf("%s\n  ", first ? "" : ",");
    prefix_json(name, v, rate, heads, nheads);
  } else {
    if (!first) putchar('\n');
    prefix_text(name, v, rate, heads, nheads);
  }
  free(heads);
  return 0;
}

static int cmd_prefix(kvc_client_t *c, const args_t *a) {
  kvc_stat_t *st;
  size_t nst;
  int rc = kvc_stats(c, &st, &nst);
  if (rc) return fail(c, rc, "stats");
  kvc_cache_info_t *infos = NULL;
  size_t n = 0;
  if (!a->cache && (rc = list_caches(c, &infos, &n)) != 0) {
    free(infos);
    kvc_stats_free(st);
    return fail(c, rc, "caches");
  }
  if (a->json) printf("{\"caches\": {");
  else if (!a->cache && n == 0) printf("no caches\n");
  if (a->cache) rc = print_prefix(c, a, st, nst, a->cache, true);
  for (size_t i = 0; i < n && rc == 0; i++)
    rc = print_prefix(c, a, st, nst, infos[i].name, i == 0);
  if (a->json && rc == 0) printf("\n}}\n");
  free(infos);
  kvc_stats_free(st);
  return rc;
}

/* "used/limit", or "used/-" for no limit. */
static void quota_cell(char *out, size_t len, uint64_t used, uint64_t limit) {
  if (limit) snprintf(out, len, "%" PRIu64 "/%" PRIu64, used, limit);
  else snprintf(out, len, "%" PRIu64 "/-", used);
}

static int cmd_tenants(kvc_client_t *c) {
  kvc_tenant_info_t *t;
  size_t n = 0;
  int rc = kvc_tenants(c, &t, &n);
  if (rc) return fail(c, rc, "tenants");
  printf("%-24s %6s %6s %10s %12s %10s\n", "TENANT", "CONNS", "CACHES", "SEQS", "TOKENS",
         "PAGES");
  for (size_t i = 0; i < n; i++)
    printf("%-24s %6u %6u %10" PRIu64 " %12" PRIu64 " %10" PRIu64 "\n", t[i].name,
           t[i].connections, t[i].caches, t[i].sequences, t[i].tokens, t[i].pages);
  /* Usage against each quota (used/limit, "-" for unlimited) and the
   * refusals of each. */
  printf("\n%-24s %-6s %-13s %-15s %-13s %-13s %-11s %-9s %s\n", "TENANT", "LIMIT", "POOL_PAGES",
         "PINNED+LEASED", "SEQS", "CACHES", "KEYS", "CONNS/UID", "SHM_BYTES");
  for (size_t i = 0; i < n; i++) {
    char a[40], b[40], s[40], cc[40], k[40], sh[48];
    quota_cell(a, sizeof a, t[i].pool_pages, t[i].max_pages);
    quota_cell(b, sizeof b, t[i].pinned_pages + t[i].leased_pages, t[i].max_pinned);
    quota_cell(s, sizeof s, t[i].sequences, t[i].max_sequences);
    quota_cell(cc, sizeof cc, t[i].caches, t[i].max_caches);
    quota_cell(k, sizeof k, t[i].keys, t[i].max_keys);
    quota_cell(sh, sizeof sh, t[i].shm_bytes, t[i].shm_bytes_per_uid);
    printf("%-24s %-6s %-13s %-15s %-13s %-13s %-11s %-9u %s\n", t[i].name, "used", a, b, s,
           cc, k, t[i].max_connections_per_uid, sh);
    printf("%-24s %-6s %-13" PRIu64 " %-15" PRIu64 " %-13" PRIu64 " %-13" PRIu64 " %-11" PRIu64
           " %-9" PRIu64 " %" PRIu64 "\n", "", "refuse", t[i].refused_pages, t[i].refused_pins,
           t[i].refused_sequences, t[i].refused_caches, t[i].refused_keys,
           t[i].refused_connections, t[i].refused_shm);
  }
  kvc_tenants_free(t);
  return 0;
}

static int cmd_ping(kvc_client_t *c) {
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int rc = kvc_ping(c);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (rc) return fail(c, rc, "ping");
  kvc_client_info_t info;
  kvc_client_info(c, &info);
  long us = (t1.tv_sec - t0.tv_sec) * 1000000L + (t1.tv_nsec - t0.tv_nsec) / 1000L;
  printf("pong from kvcached %s (protocol %u, conn %" PRIu64 ") in %ld us\n",
         info.server_version, info.protocol_version, info.conn_id, us);
  return 0;
}

int main(int argc, char **argv) {
  args_t a = {0};
  if (parse(argc, argv, &a) != 0) return 1;
  static const char *const known[] = {"ping", "stats", "caches", "seqs", "info", "prefix",
                                      "tenants"};
  bool ok = false;
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) ok |= strcmp(a.cmd, known[i]) == 0;
  if (!ok) return die("unknown command %s (see --help)", a.cmd);
  /* A small buffer: kvcachectl moves no tensor bytes. */
  kvc_client_opts_t opts = {.socket_path = a.socket, .shm_bytes = 1u << 20,
                            .timeout_ms = 10000, .client_name = "kvcachectl"};
  kvc_client_t *c;
  int rc = kvc_client_open(&opts, &c);
  if (rc) return fail(NULL, rc, "cannot connect");
  if (strcmp(a.cmd, "ping") == 0) rc = cmd_ping(c);
  else if (strcmp(a.cmd, "stats") == 0) rc = cmd_stats(c, &a);
  else if (strcmp(a.cmd, "caches") == 0) rc = cmd_caches(c);
  else if (strcmp(a.cmd, "seqs") == 0) rc = cmd_seqs(c, &a);
  else if (strcmp(a.cmd, "prefix") == 0) rc = cmd_prefix(c, &a);
  else if (strcmp(a.cmd, "tenants") == 0) rc = cmd_tenants(c);
  else rc = cmd_info(c, &a);
  kvc_client_close(c);
  return rc;
}
