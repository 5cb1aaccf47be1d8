/* promtext.c: figures to Prometheus text exposition format 0.0.4. */
#include "promtext.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct buf {
  char *p;
  size_t len, cap;
  bool oom;
} buf_t;

static void put(buf_t *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (b->len + n + 1 > cap) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
      b->oom = true;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

static void puts_(buf_t *b, const char *s) { put(b, s, strlen(s)); }

static void printf_(buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void printf_(buf_t *b, const char *fmt, ...) {
  char tmp[128];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n > 0) put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* HELP text escapes \ and newline; a label value also ". */
static void escaped(buf_t *b, const char *s, bool label) {
  for (; *s; s++) {
    if (*s == '\\') puts_(b, "\\\\");
    else if (*s == '\n') puts_(b, "\\n");
    else if (label && *s == '"') puts_(b, "\\\"");
    else put(b, s, 1);
  }
}

static const char *type_name(kvc_stat_kind_t k) {
  switch (k) {
  case KVC_STAT_COUNTER: return "counter";
  case KVC_STAT_HISTOGRAM: return "histogram";
  case KVC_STAT_GAUGE:
  case KVC_STAT_INFO: break;
  }
  return "gauge";
}

/* {cache="..",k="v",..[,le="..."]}, or nothing without labels. */
static void label_set(buf_t *b, const kvc_stat_t *st, const char *le) {
  bool any = false;
  if (st->cache && st->cache[0]) {
    puts_(b, "{cache=\"");
    escaped(b, st->cache, true);
    puts_(b, "\"");
    any = true;
  }
  for (size_t i = 0; i < st->nlabels; i++) {
    puts_(b, any ? ",": "{");
    puts_(b, st->labels[i].key);
    puts_(b, "=\"");
    escaped(b, st->labels[i].value, true);
    puts_(b, "\"");
    any = true;
  }
  if (le) {
    puts_(b, any ? ",le=\"" : "{le=\"");
    puts_(b, le);
    puts_(b, "\"");
    any = true;
  }
  if (any) puts_(b, "}");
}

/* The standard process_* figures keep their well-known names; every other
 * family is kvcached_'s. */
static const char *prefix(const char *name) {
  return strncmp(name, "process_", 8) == 0 ? "" : "kvcached_";
}

static void sample(buf_t *b, const kvc_stat_t *st) {
  const char *pre = prefix(st->name);
  if (st->kind != KVC_STAT_HISTOGRAM) {
    printf_(b, "%s%s", pre, st->name);
    label_set(b, st, NULL);
    printf_(b, " %llu\n", (unsigned long long)st->value);
    return;
  }
  for (size_t i = 0; i < st->nbuckets; i++) {
    char le[40];
    snprintf(le, sizeof le, "%.9g", st->bucket_le[i]);
    printf_(b, "%s%s_bucket", pre, st->name);
    label_set(b, st, le);
    printf_(b, " %llu\n", (unsigned long long)st->bucket_count[i]);
  }
  printf_(b, "%s%s_bucket", pre, st->name);
  label_set(b, st, "+Inf");
  printf_(b, " %llu\n", (unsigned long long)st->value);
  printf_(b, "%s%s_sum", pre, st->name);
  label_set(b, st, NULL);
  printf_(b, " %.9g\n", st->sum);
  printf_(b, "%s%s_count", pre, st->name);
  label_set(b, st, NULL);
  printf_(b, " %llu\n", (unsigned long long)st->value);
}

int promtext_render(const kvc_stat_t *st, size_t n, char **out, size_t *len) {
  buf_t b = {0};
  bool *done = calloc(n ? n : 1, sizeof *done);
  if (!done) return KVC_E_NOMEM;
  for (size_t i = 0; i < n; i++) {
    if (done[i]) continue;
    printf_(&b, "# HELP %s%s ", prefix(st[i].name), st[i].name);
    escaped(&b, st[i].help ? st[i].help : "", false);
    printf_(&b, "\n# TYPE %s%s %s\n", prefix(st[i].name), st[i].name, type_name(st[i].kind));
    for (size_t j = i; j < n; j++) {
      if (done[j] || strcmp(st[j].name, st[i].name) != 0) continue;
      done[j] = true;
      sample(&b, &st[j]);
    }
  }
  free(done);
  if (!b.p && !b.oom) puts_(&b, "");
  if (b.oom) {
    free(b.p);
    return KVC_E_NOMEM;
  }
  *out = b.p;
  if (len) *len = b.len;
  return 0;
}
