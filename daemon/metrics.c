/* metrics.c: counting requests and latencies, and rendering every figure into
 * one Stats reply. */
#include "metrics.h"

#include <stdlib.h>
#include <string.h>

#include "codec.h"

static const char *const op_names[OP_COUNT_] = {
#define OP_NAME_(name, CASE) #name,
    DAEMON_OPS(OP_NAME_)
#undef OP_NAME_
};

void metrics_init(daemon_stats_t *s, uint64_t now_ns) {
  memset(s, 0, sizeof *s);
  s->start_ns = now_ns;
}

/* 0..3 exact, then 4 buckets per power of two. */
unsigned metrics_bucket(uint64_t v) {
  if (v < 4) return (unsigned)v;
  unsigned msb = 63u - (unsigned)__builtin_clzll(v);
  return (msb - 1u) * 4u + (unsigned)((v >> (msb - 2u)) & 3u);
}

uint64_t metrics_bucket_max(unsigned idx) {
  if (idx < 4) return idx;
  unsigned msb = idx / 4u + 1u, sub = idx % 4u;
  uint64_t lo = (uint64_t)(4u + sub) << (msb - 2u);
  return lo + (((uint64_t)1 << (msb - 2u)) - 1u);
}

void metrics_record(daemon_stats_t *s, enum op op, uint64_t elapsed_ns, int ok) {
  op_stats_t *o = &s->ops[op];
  o->requests++;
  if (!ok) o->errors++;
  o->hist[metrics_bucket(elapsed_ns)]++;
}

uint64_t metrics_percentile(const daemon_stats_t *s, enum op op, double q) {
  const op_stats_t *o = &s->ops[op];
  uint64_t total = 0;
  for (unsigned i = 0; i < STATS_HIST_BUCKETS; i++) total += o->hist[i];
  if (total == 0) return 0;
  /* The smallest bucket whose cumulative count reaches ceil(q * total). */
  uint64_t rank = (uint64_t)(q * (double)total);
  if ((double)rank < q * (double)total) rank++;
  if (rank == 0) rank = 1;
  uint64_t seen = 0;
  for (unsigned i = 0; i < STATS_HIST_BUCKETS; i++) {
    seen += o->hist[i];
    if (seen >= rank) return metrics_bucket_max(i);
  }
  return metrics_bucket_max(STATS_HIST_BUCKETS - 1);
}

typedef struct builder {
  arena_t *a;
  Kvcache__V1__Stat **items;
  size_t n, cap;
} builder_t;

static int add_row(builder_t *b, const char *name, uint64_t value, int gauge,
                   const char *help, const char *cache, const char *tenant) {
  if (b->n == b->cap) return KVC_E_INTERNAL; /* cap is computed exactly */
  Kvcache__V1__Stat *st = arena_alloc(b->a, sizeof *st);
  if (!st) return KVC_E_NOMEM;
  codec_stat_to_wire(&(kvc_stat_t){.name = name, .value = value, .gauge = gauge != 0,
                                    .help = help, .cache = cache, .tenant = tenant}, st);
  b->items[b->n++] = st;
  return 0;
}

static int add(builder_t *b, const char *name, uint64_t value, int gauge, const char *help,
               const char *cache) {
  return add_row(b, name, value, gauge, help, cache, "");
}

#define COUNT_(name, kind, help) +1
#define ENGINE_COUNT_ (0 ENGINE_STATS(COUNT_))
#define CACHE_COUNT_ (0 CACHE_STATS(COUNT_))
#define DAEMON_COUNT_ (0 DAEMON_STATS(COUNT_))

static int render_ops(builder_t *b, const daemon_stats_t *s) {
  int rc = 0;
  for (int op = 0; op < OP_COUNT_ && rc == 0; op++) {
    const char *n = op_names[op];
    char *req = arena_printf(b->a, "requests_%s", n);
    char *err = arena_printf(b->a, "errors_%s", n);
    char *p50 = arena_printf(b->a, "latency_%s_p50_ns", n);
    char *p99 = arena_printf(b->a, "latency_%s_p99_ns", n);
    char *help_req = arena_printf(b->a, "%s requests received", n);
    char *help_err = arena_printf(b->a, "%s requests answered with an error", n);
    char *help_p50 = arena_printf(b->a, "median service time of %s requests (ns)", n);
    char *help_p99 = arena_printf(b->a, "99th percentile service time of %s requests (ns)", n);
    if (!req || !err || !p50 || !p99 || !help_req || !help_err || !help_p50 || !help_p99)
      return KVC_E_NOMEM;
    rc = add(b, req, s->ops[op].requests, 0, help_req, "");
    if (!rc) rc = add(b, err, s->ops[op].errors, 0, help_err, "");
    if (!rc) rc = add(b, p50, metrics_percentile(s, (enum op)op, 0.50), 1, help_p50, "");
    if (!rc) rc = add(b, p99, metrics_percentile(s, (enum op)op, 0.99), 1, help_p99, "");
  }
  return rc;
}

static int render_caches(builder_t *b, engine_t *eng, const kvc_cache_info_t *infos,
                         size_t ncaches, metrics_cache_view_fn view, void *view_ctx) {
  int rc = 0;
  for (size_t i = 0; i < ncaches && rc == 0; i++) {
    const char *tenant = view(view_ctx, &infos[i]);
    if (!tenant) continue;
    cache_stats_t cs;
    if (engine_cache_stats(eng, infos[i].cache_id, &cs) != 0) memset(&cs, 0, sizeof cs);
    char *cname = arena_printf(b->a, "%s", infos[i].name);
    if (!cname) return KVC_E_NOMEM;
#define CACHE_ADD_(name, kind, help)                                           \
  if (!rc) rc = add_row(b, #name, cs.name, (kind) == STAT_GAUGE, help, cname, tenant);
    CACHE_STATS(CACHE_ADD_)
#undef CACHE_ADD_
  }
  return rc;
}

int metrics_render(const daemon_stats_t *s, engine_t *eng, uint64_t now_ns, arena_t *a,
                   metrics_cache_view_fn view, void *view_ctx, Kvcache__V1__StatsReply *out) {
  size_t ncaches = 0;
  engine_cache_list(eng, NULL, 0, &ncaches);
  kvc_cache_info_t *infos = NULL;
  if (ncaches) {
    infos = arena_alloc(a, ncaches * sizeof *infos);
    if (!infos) return KVC_E_NOMEM;
    size_t got = 0;
    engine_cache_list(eng, infos, ncaches, &got);
    if (got < ncaches) ncaches = got;
  }
  builder_t b = {.a = a, .n = 0};
  b.cap = (size_t)ENGINE_COUNT_ + ncaches * (size_t)CACHE_COUNT_ + (size_t)DAEMON_COUNT_ +
          1u + 4u * (size_t)OP_COUNT_;
  b.items = arena_alloc(a, b.cap * sizeof *b.items);
  if (!b.items) return KVC_E_NOMEM;

  int rc = 0;
  engine_stats_t es;
  engine_stats(eng, &es);
#define ENGINE_ADD_(name, kind, help)                                          \
  if (!rc) rc = add(&b, #name, es.name, (kind) == STAT_GAUGE, help, "");
  ENGINE_STATS(ENGINE_ADD_)
#undef ENGINE_ADD_
#define DAEMON_ADD_(name, kind, help)                                          \
  if (!rc) rc = add(&b, #name, s->name, (kind) == STAT_GAUGE, help, "");
  DAEMON_STATS(DAEMON_ADD_)
#undef DAEMON_ADD_
  if (!rc)
    rc = add(&b, "uptime_seconds", (now_ns - s->start_ns) / 1000000000u, 0,
             "seconds since the daemon started", "");
  if (!rc) rc = render_ops(&b, s);
  if (!rc) rc = render_caches(&b, eng, infos, ncaches, view, view_ctx);
  if (rc) return rc;
  out->n_stats = b.n;
  out->stats = b.items;
  return 0;
}
