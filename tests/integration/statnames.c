/* statnames.c: the figures a real daemon exports (kvc_stats, global and per
 * cache) are exactly the ones doc/stats.md lists, both ways, each with the
 * kind and unit the document gives it; the op label takes exactly the
 * operations the document lists.
 *
 * doc/stats.md's tables are `| name | kind | unit | labels | meaning |`; a
 * section's heading says whose figures they are: "Daemon identity",
 * "Engine", "Daemon" and "Per operation" global, "Per cache" per cache,
 * "Prefix cache" both (per cache as cache_ + name). The "Per operation"
 * section's first paragraph lists the operations. */
#include "harness.h"

#define MAX_NAMES 1024

typedef struct names {
  char *v[MAX_NAMES];
  char *kind[MAX_NAMES], *unit[MAX_NAMES];
  size_t n;
} names_t;

static void names_add3(names_t *s, const char *name, size_t len, const char *kind,
                       const char *unit) {
  for (size_t i = 0; i < s->n; i++)
    if (strlen(s->v[i]) == len && strncmp(s->v[i], name, len) == 0) return;
  ASSERT(s->n < MAX_NAMES);
  s->kind[s->n] = kind ? strdup(kind) : NULL;
  s->unit[s->n] = unit ? strdup(unit) : NULL;
  s->v[s->n++] = strndup(name, len);
}

static void names_add(names_t *s, const char *name, size_t len) {
  names_add3(s, name, len, NULL, NULL);
}

static int names_find(const names_t *s, const char *name) {
  for (size_t i = 0; i < s->n; i++)
    if (strcmp(s->v[i], name) == 0) return (int)i;
  return -1;
}

static bool names_has(const names_t *s, const char *name) { return names_find(s, name) >= 0; }

static void names_free(names_t *s) {
  for (size_t i = 0; i < s->n; i++) free(s->v[i]), free(s->kind[i]), free(s->unit[i]);
  s->n = 0;
}

/* The cells of a table row "| a | b | c | ..." (trimmed), up to max. */
static int cells(const char *line, const char *end, char out[][128], int max) {
  int n = 0;
  const char *p = line + 1;
  while (p < end && n < max) {
    const char *bar = memchr(p, '|', (size_t)(end - p));
    if (!bar) break;
    const char *a = p, *b = bar;
    while (a < b && *a == ' ') a++;
    while (b > a && b[-1] == ' ') b--;
    snprintf(out[n++], 128, "%.*s", (int)(b - a), a);
    p = bar + 1;
  }
  return n;
}

typedef struct doc {
  names_t global, cache, ops;
} doc_t;

static char *read_doc(void) {
  char path[512];
  snprintf(path, sizeof path, "%s/doc/stats.md", it_srcdir());
  FILE *f = fopen(path, "r");
  ASSERT(f != NULL);
  static char buf[1 << 17];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  ASSERT(n > 0 && n < sizeof buf - 1);
  buf[n] = '\0';
  return buf;
}

static void parse_doc(doc_t *d) {
  char *text = read_doc();
  enum { NONE, GLOBAL, CACHE, BOTH, OPS } scope = NONE;
  for (char *line = text; line && *line;) {
    char *nl = strchr(line, '\n');
    char *end = nl ? nl : line + strlen(line);
    if (strncmp(line, "## ", 3) == 0) {
      scope = strncmp(line, "## Engine", 9) == 0       ? GLOBAL
              : strncmp(line, "## Daemon", 9) == 0     ? GLOBAL
              : strncmp(line, "## Per cache", 12) == 0 ? CACHE
              : strncmp(line, "## Prefix cache", 15) == 0 ? BOTH
              : strncmp(line, "## Per operation", 16) == 0 ? OPS
                                                          : NONE;
    } else if (scope != NONE && strncmp(line, "| `", 3) == 0) {
      char c[6][128];
      int nc = cells(line, end, c, 6);
      ASSERT(nc >= 5);
      /* A row naming a range of another table ("a … b") is a cross-reference. */
      bool range = strstr(c[0], "\xe2\x80\xa6") != NULL;
      size_t len = strlen(c[0]);
      ASSERT(c[0][0] == '`' && c[0][len - 1] == '`');
      if (!range) {
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)(len - 2), c[0] + 1);
        if (scope == GLOBAL || scope == BOTH || scope == OPS)
          names_add3(&d->global, name, strlen(name), c[1], c[2]);
        if (scope == CACHE) names_add3(&d->cache, name, strlen(name), c[1], c[2]);
        if (scope == BOTH) {
          char cn[160];
          snprintf(cn, sizeof cn, "cache_%s", name);
          names_add3(&d->cache, cn, strlen(cn), c[1], c[2]);
        }
      }
    } else if (scope == OPS && d->ops.n == 0) {
      /* "For each operation `OP` of the protocol (`hello`, `ping`, ...):",
       * over several lines. */
      const char *intro = "For each operation `OP` of the protocol (";
      char *p = strstr(line, intro);
      if (p) {
        char *close = strstr(p, "):");
        ASSERT(close != NULL);
        for (char *q = p + strlen(intro); q < close;) {
          char *a = memchr(q, '`', (size_t)(close - q));
          if (!a) break;
          char *b = memchr(a + 1, '`', (size_t)(close - a - 1));
          ASSERT(b != NULL);
          names_add(&d->ops, a + 1, (size_t)(b - a - 1));
          q = b + 1;
        }
        nl = strchr(close, '\n');
      }
    }
    line = nl ? nl + 1 : NULL;
  }
}

static const char *kind_word(kvc_stat_kind_t k) {
  switch (k) {
  case KVC_STAT_COUNTER: return "counter";
  case KVC_STAT_GAUGE: return "gauge";
  case KVC_STAT_HISTOGRAM: return "histogram";
  case KVC_STAT_INFO: return "info";
  }
  return "?";
}

TEST(stat_names_match_doc_stats_md) {
  doc_t doc = {0};
  parse_doc(&doc);
  /* The parse found what the document holds (a broken parse proves nothing). */
  ASSERT(names_has(&doc.global, "pages_free"));
  ASSERT(names_has(&doc.global, "connections_current"));
  ASSERT(names_has(&doc.global, "requests_total"));
  ASSERT(names_has(&doc.global, "build_info"));
  ASSERT(names_has(&doc.cache, "cache_sequences"));
  ASSERT(names_has(&doc.cache, "cache_prefix_matches_total"));
  ASSERT(doc.ops.n >= 20);

  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "names", &l, &h));
  float buf[4096];
  /* One error, so that the sparse request_errors_total has a sample. */
  ASSERT_ERR(kvc_get(h, 99, 0, 1, buf, buf), KVC_E_NOSEQ);
  kvc_stat_t *st;
  size_t n;
  ASSERT_OK(kvc_stats(c, &st, &n));
  names_t global = {0}, cache = {0}, ops = {0};
  int missing = 0;
  for (size_t i = 0; i < n; i++) {
    bool per_cache = st[i].cache[0] != '\0';
    if (per_cache) ASSERT_STR_EQ(st[i].cache, "names");
    names_t *mine = per_cache ? &cache : &global;
    names_add(mine, st[i].name, strlen(st[i].name));
    const char *op = kvc_stat_label(&st[i], "op");
    if (op && strcmp(st[i].name, "requests_total") == 0) names_add(&ops, op, strlen(op));
    /* Kind and unit as documented. */
    const names_t *dn = per_cache ? &doc.cache : &doc.global;
    int k = names_find(dn, st[i].name);
    if (k < 0) continue; /* reported below */
    if (strcmp(dn->kind[k], kind_word(st[i].kind)) != 0)
      fprintf(stderr, "%s: doc/stats.md says %s, exported %s\n", st[i].name, dn->kind[k],
              kind_word(st[i].kind)), missing++;
    if (strcmp(dn->unit[k], st[i].unit) != 0)
      fprintf(stderr, "%s: doc/stats.md says unit '%s', exported '%s'\n", st[i].name,
              dn->unit[k], st[i].unit), missing++;
    if (!st[i].help[0]) fprintf(stderr, "%s: no help\n", st[i].name), missing++;
  }
  kvc_stats_free(st);
  for (size_t i = 0; i < global.n; i++)
    if (!names_has(&doc.global, global.v[i]))
      fprintf(stderr, "exported, not in doc/stats.md: %s\n", global.v[i]), missing++;
  for (size_t i = 0; i < cache.n; i++)
    if (!names_has(&doc.cache, cache.v[i]))
      fprintf(stderr, "exported per cache, not in doc/stats.md: %s\n", cache.v[i]), missing++;
  for (size_t i = 0; i < doc.global.n; i++)
    if (!names_has(&global, doc.global.v[i]))
      fprintf(stderr, "in doc/stats.md, not exported: %s\n", doc.global.v[i]), missing++;
  for (size_t i = 0; i < doc.cache.n; i++)
    if (!names_has(&cache, doc.cache.v[i]))
      fprintf(stderr, "in doc/stats.md per cache, not exported: %s\n", doc.cache.v[i]),
          missing++;
  for (size_t i = 0; i < ops.n; i++)
    if (!names_has(&doc.ops, ops.v[i]))
      fprintf(stderr, "op label exported, not listed in doc/stats.md: %s\n", ops.v[i]), missing++;
  for (size_t i = 0; i < doc.ops.n; i++)
    if (!names_has(&ops, doc.ops.v[i]))
      fprintf(stderr, "operation in doc/stats.md, no op label: %s\n", doc.ops.v[i]), missing++;
  ASSERT_EQ(missing, 0);
  ASSERT(global.n > 60 && cache.n > 10);
  names_free(&global);
  names_free(&cache);
  names_free(&ops);
  names_free(&doc.global);
  names_free(&doc.cache);
  names_free(&doc.ops);
  kvc_cache_close(h);
  kvc_client_close(c);
  daemon_stop(&d);
}
