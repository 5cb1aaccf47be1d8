/* statnames.c: the figures a real daemon exports (kvc_stats, global and per
 * cache) are exactly the ones doc/stats.md lists, both ways.
 *
 * doc/stats.md's tables name each figure in their first column; a section's
 * heading says whose they are: "Engine" and "Daemon" global, "Per cache" per
 * cache, "Prefix cache" both, and "Per operation" global, its OP rows
 * expanded over the operations its first paragraph lists. */
#include "harness.h"

#define MAX_NAMES 1024

typedef struct names {
  char *v[MAX_NAMES];
  size_t n;
} names_t;

static void names_add(names_t *s, const char *name, size_t len) {
  for (size_t i = 0; i < s->n; i++)
    if (strlen(s->v[i]) == len && strncmp(s->v[i], name, len) == 0) return;
  ASSERT(s->n < MAX_NAMES);
  s->v[s->n++] = strndup(name, len);
}

static bool names_has(const names_t *s, const char *name) {
  for (size_t i = 0; i < s->n; i++)
    if (strcmp(s->v[i], name) == 0) return true;
  return false;
}

static void names_free(names_t *s) {
  for (size_t i = 0; i < s->n; i++) free(s->v[i]);
  s->n = 0;
}

/* Calls fn on each `quoted` token of [p, end). */
static void each_quoted(const char *p, const char *end, names_t *out,
                        void (*fn)(names_t *, const char *, size_t)) {
  for (;;) {
    const char *a = memchr(p, '`', (size_t)(end - p));
    if (!a) return;
    const char *b = memchr(a + 1, '`', (size_t)(end - a - 1));
    if (!b) return;
    fn(out, a + 1, (size_t)(b - a - 1));
    p = b + 1;
  }
}

typedef struct doc {
  names_t global, cache, ops, op_rows;
} doc_t;

static char *read_doc(void) {
  char path[512];
  snprintf(path, sizeof path, "%s/doc/stats.md", it_srcdir());
  FILE *f = fopen(path, "r");
  ASSERT(f != NULL);
  static char buf[1 << 16];
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
      /* The first cell; a row naming a range of another table ("a … b") is
       * a cross-reference, not a figure. */
      char *cell_end = strstr(line + 2, " |");
      if (!cell_end || cell_end > end) cell_end = end;
      bool range = false;
      for (char *p = line; p < cell_end; p++) range |= (unsigned char)*p == 0xe2;
      if (!range) {
        if (scope == GLOBAL || scope == BOTH) each_quoted(line, cell_end, &d->global, names_add);
        if (scope == CACHE || scope == BOTH) each_quoted(line, cell_end, &d->cache, names_add);
        if (scope == OPS) each_quoted(line, cell_end, &d->op_rows, names_add);
      }
    } else if (scope == OPS && d->ops.n == 0) {
      /* "For each operation `OP` of the protocol (`hello`, `ping`, ...):" */
      const char *intro = "For each operation `OP` of the protocol (";
      char *p = strstr(line, intro);
      if (p) {
        char *close = strstr(p, "):");
        ASSERT(close != NULL);
        each_quoted(p + strlen(intro), close, &d->ops, names_add);
        nl = strchr(close, '\n');
      }
    }
    line = nl ? nl + 1 : NULL;
  }
  /* Each OP row, with OP replaced by every operation, is a global figure. */
  for (size_t r = 0; r < d->op_rows.n; r++) {
    const char *row = d->op_rows.v[r];
    const char *op = strstr(row, "OP");
    ASSERT(op != NULL);
    for (size_t i = 0; i < d->ops.n; i++) {
      char name[128];
      snprintf(name, sizeof name, "%.*s%s%s", (int)(op - row), row, d->ops.v[i], op + 2);
      names_add(&d->global, name, strlen(name));
    }
  }
}

TEST(stat_names_match_doc_stats_md) {
  doc_t doc = {0};
  parse_doc(&doc);
  /* The parse found what the document holds (a broken parse proves nothing). */
  ASSERT(names_has(&doc.global, "pages_free"));
  ASSERT(names_has(&doc.global, "connections_current"));
  ASSERT(names_has(&doc.global, "requests_put"));
  ASSERT(names_has(&doc.cache, "sequences"));
  ASSERT(names_has(&doc.cache, "prefix_matches"));
  ASSERT(doc.ops.n >= 20);

  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "names", &l, &h));
  kvc_stat_t *st;
  size_t n;
  ASSERT_OK(kvc_stats(c, &st, &n));
  names_t global = {0}, cache = {0};
  for (size_t i = 0; i < n; i++) {
    bool per_cache = st[i].cache[0] != '\0';
    if (per_cache) ASSERT_STR_EQ(st[i].cache, "names");
    names_add(per_cache ? &cache : &global, st[i].name, strlen(st[i].name));
  }
  kvc_stats_free(st);
  int missing = 0;
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
  ASSERT_EQ(missing, 0);
  ASSERT(global.n > 100 && cache.n > 10);
  names_free(&global);
  names_free(&cache);
  names_free(&doc.global);
  names_free(&doc.cache);
  names_free(&doc.ops);
  names_free(&doc.op_rows);
  kvc_cache_close(h);
  kvc_client_close(c);
  daemon_stop(&d);
}
