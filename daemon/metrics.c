/* metrics.c: counting requests and latencies, and rendering every figure into
 * one Stats reply: one Stat per sample, each carrying its family's kind, unit
 * and help, its labels, and for a histogram its buckets. The Prometheus text
 * (proto/promtext.c) and kvcachectl's table and JSON are drawn from it. */
#include "metrics.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codec.h"

static const char *const op_names[OP_COUNT_] = {
#define OP_NAME_(name, CASE, RIGHT) #name,
    DAEMON_OPS(OP_NAME_)
#undef OP_NAME_
};

void metrics_init(daemon_stats_t *s, uint64_t now_ns) {
  memset(s, 0, sizeof *s);
  s->start_ns = now_ns;
  s->start_unix = (uint64_t)time(NULL);
}

/* 0..3 exact, then 4 buckets per power of two. */
unsigned metrics_bucket(uint64_t v) {
  if (v < 4) return (unsigned)v;
  unsigned msb = 63u - (unsigned)__builtin_clzll(v);
  return (msb - 1u) * 4u + (unsigned)((v >> (msb - 2u)) & 3u);
}

void metrics_record(daemon_stats_t *s, enum op op, uint64_t elapsed_ns, int code) {
  op_stats_t *o = &s->ops[op];
  o->requests++;
  o->sum_ns += elapsed_ns;
  if (code != 0) {
    o->errors++;
    unsigned k = code < 0 && -code < STATS_STATUS_CODES ? (unsigned)-code : 0u;
    o->by_status[k]++; /* 0: a code outside the table (never, in practice) */
  }
  o->hist[metrics_bucket(elapsed_ns)]++;
}

void metrics_observe(op_stats_t *o, uint64_t ns) {
  o->requests++;
  o->sum_ns += ns;
  o->hist[metrics_bucket(ns)]++;
}

/* ---- building the reply ------------------------------------------------------ */

typedef struct builder {
  arena_t *a;
  Kvcache__V1__Stat **items;
  size_t n, cap;
  int rc;
} builder_t;

static Kvcache__V1__Stat *grow(builder_t *b) {
  if (b->rc) return NULL;
  if (b->n == b->cap) {
    size_t cap = b->cap ? 2 * b->cap : 256;
    Kvcache__V1__Stat **items = arena_alloc(b->a, cap * sizeof *items);
    if (!items) {
      b->rc = KVC_E_NOMEM;
      return NULL;
    }
    if (b->n) memcpy(items, b->items, b->n * sizeof *items);
    b->items = items;
    b->cap = cap;
  }
  Kvcache__V1__Stat *st = arena_alloc(b->a, sizeof *st);
  if (!st) {
    b->rc = KVC_E_NOMEM;
    return NULL;
  }
  kvcache__v1__stat__init(st);
  b->items[b->n++] = st;
  return st;
}

/* A counter exports as name_total (unless it already says so). */
static const char *export_name(builder_t *b, const char *prefix, const char *name, int kind) {
  size_t len = strlen(name);
  bool total = kind == STAT_COUNTER && !(len > 6 && strcmp(name + len - 6, "_total") == 0);
  char *s = arena_printf(b->a, "%s%s%s", prefix, name, total ? "_total" : "");
  if (!s) b->rc = KVC_E_NOMEM;
  return s;
}

/* export_name of a figure of the lists (ENGINE_STATS, DAEMON_STATS,
 * CACHE_STATS), made once into *slot: a reply of hundreds of figures prints
 * none of their names (the daemon's one loop is the only caller). */
static const char *list_name(builder_t *b, const char **slot, const char *prefix,
                             const char *name, int kind) {
  if (*slot) return *slot;
  const char *s = export_name(b, prefix, name, kind);
  char *keep = s ? strdup(s) : NULL;
  if (s && !keep) b->rc = KVC_E_NOMEM;
  return keep ? (*slot = keep) : NULL;
}

static Kvcache__V1__Stat *add(builder_t *b, const char *name, uint64_t value,
                              Kvcache__V1__StatKind kind, const char *unit, const char *help,
                              const char *cache) {
  Kvcache__V1__Stat *st = name ? grow(b) : NULL;
  if (!st) return NULL;
  st->name = (char *)name;
  st->value = value;
  st->kind = kind;
  st->gauge = kind != KVCACHE__V1__STAT_KIND__STAT_COUNTER;
  st->unit = (char *)unit;
  st->help = (char *)help;
  st->cache = (char *)(cache ? cache : "");
  return st;
}

/* Sets the labels of st: pairs of key, value (a value of "" is left out). */
static void labels(builder_t *b, Kvcache__V1__Stat *st, size_t npairs, const char *const *kv) {
  if (!st) return;
  Kvcache__V1__Label **ls = arena_alloc(b->a, npairs * sizeof *ls);
  if (!ls) {
    b->rc = KVC_E_NOMEM;
    return;
  }
  size_t n = 0;
  for (size_t i = 0; i < npairs; i++) {
    if (!kv[2 * i + 1] || !kv[2 * i + 1][0]) continue;
    Kvcache__V1__Label *l = arena_alloc(b->a, sizeof *l);
    if (!l) {
      b->rc = KVC_E_NOMEM;
      return;
    }
    kvcache__v1__label__init(l);
    l->key = (char *)kv[2 * i];
    l->value = (char *)kv[2 * i + 1];
    ls[n++] = l;
  }
  st->n_labels = n;
  st->labels = ls;
}

static Kvcache__V1__StatKind wire_kind(int kind) {
  return kind == STAT_GAUGE ? KVCACHE__V1__STAT_KIND__STAT_GAUGE
                            : KVCACHE__V1__STAT_KIND__STAT_COUNTER;
}

/* A latency histogram of count samples over the log buckets hist, summing
 * sum_ns, labelled key=value. */
static void render_histogram(builder_t *b, const char *name, const char *help,
                             const uint64_t *hist, uint64_t count, uint64_t sum_ns,
                             const char *key, const char *value) {
  Kvcache__V1__Stat *st =
      add(b, name, count, KVCACHE__V1__STAT_KIND__STAT_HISTOGRAM, "seconds", help, "");
  labels(b, st, 1, (const char *const[]){key, value});
  if (!st) return;
  double *le = arena_alloc(b->a, METRICS_EXPORT_BUCKETS * sizeof *le);
  uint64_t *cnt = arena_alloc(b->a, METRICS_EXPORT_BUCKETS * sizeof *cnt);
  if (!le || !cnt) {
    b->rc = KVC_E_NOMEM;
    return;
  }
  uint64_t seen = 0;
  unsigned next = 0;
  for (unsigned k = METRICS_EXPORT_MIN_POW; k <= METRICS_EXPORT_MAX_POW; k++) {
    /* Internal bucket (k - 2) * 4 + 3 ends at 2^k - 1 ns. */
    unsigned last = (k - 2u) * 4u + 3u;
    for (; next <= last && next < STATS_HIST_BUCKETS; next++) seen += hist[next];
    unsigned i = k - METRICS_EXPORT_MIN_POW;
    le[i] = (double)(((uint64_t)1 << k) - 1u) / 1e9;
    cnt[i] = seen;
  }
  st->n_bucket_le = st->n_bucket_count = METRICS_EXPORT_BUCKETS;
  st->bucket_le = le;
  st->bucket_count = cnt;
  st->sum = (double)sum_ns / 1e9;
}

static void render_ops(builder_t *b, const daemon_stats_t *s) {
  for (int op = 0; op < OP_COUNT_; op++) {
    Kvcache__V1__Stat *st = add(b, "requests_total", s->ops[op].requests,
                                KVCACHE__V1__STAT_KIND__STAT_COUNTER, "requests",
                                "requests received (decoded and dispatched), by operation", "");
    labels(b, st, 1, (const char *const[]){"op", op_names[op]});
  }
  for (int op = 0; op < OP_COUNT_; op++) {
    const op_stats_t *o = &s->ops[op];
    for (unsigned k = 0; k < STATS_STATUS_CODES; k++) {
      if (!o->by_status[k]) continue;
      Kvcache__V1__Stat *st =
          add(b, "request_errors_total", o->by_status[k], KVCACHE__V1__STAT_KIND__STAT_COUNTER,
              "requests", "requests answered with an error, by operation and status", "");
      const char *status = k ? kvc_err_name(-(int)k) : "UNKNOWN";
      if (strncmp(status, "KVC_E_", 6) == 0) status += 6;
      labels(b, st, 2, (const char *const[]){"op", op_names[op], "status", status});
    }
  }
  /* Histograms of the operations that ran: 28 series each. */
  for (int op = 0; op < OP_COUNT_; op++)
    if (s->ops[op].requests)
      render_histogram(b, "request_duration_seconds",
                       "service time of requests, from decoding to the reply queued",
                       s->ops[op].hist, s->ops[op].requests, s->ops[op].sum_ns, "op",
                       op_names[op]);
}

/* The figures of each cache of ids[0..n) that view shows. */
static void render_caches(builder_t *b, engine_t *eng, const uint32_t *ids, size_t n,
                          metrics_cache_view_fn view, void *view_ctx) {
  for (size_t i = 0; i < n && !b->rc; i++) {
    kvc_cache_info_t ci;
    cache_stats_t cs;
    if (engine_cache_info(eng, ids[i], &ci) != 0 || engine_cache_stats(eng, ids[i], &cs) != 0)
      continue;
    const char *tenant = view(view_ctx, &ci);
    if (!tenant) continue;
    char *cname = arena_printf(b->a, "%s", ci.name);
    if (!cname) {
      b->rc = KVC_E_NOMEM;
      return;
    }
#define CACHE_ADD_(name, kind, unit, help)                                     \
  {                                                                            \
    static const char *nm_;                                                    \
    labels(b, add(b, list_name(b, &nm_, "cache_", #name, kind), cs.name, wire_kind(kind), unit, \
                  help, cname), 1, (const char *const[]){"tenant", tenant});   \
  }
    CACHE_STATS(CACHE_ADD_)
#undef CACHE_ADD_
  }
}

/* Every cache's id, in the engine's order (the scrape's view). */
static int all_caches(engine_t *eng, arena_t *a, uint32_t **ids, size_t *n) {
  size_t count = 0;
  engine_cache_list(eng, NULL, 0, &count);
  *ids = NULL;
  *n = 0;
  if (!count) return 0;
  kvc_cache_info_t *infos = arena_alloc(a, count * sizeof *infos);
  uint32_t *v = arena_alloc(a, count * sizeof *v);
  if (!infos || !v) return KVC_E_NOMEM;
  size_t got = 0;
  engine_cache_list(eng, infos, count, &got);
  for (size_t i = 0; i < got && i < count; i++) v[i] = infos[i].cache_id;
  *ids = v;
  *n = got < count ? got : count;
  return 0;
}

const char *const tier_err_names[TIER_ERR_COUNT_] = {
#define TIER_ERR_NAME_(name) #name,
    TIER_ERRORS(TIER_ERR_NAME_)
#undef TIER_ERR_NAME_
};

/* A tier's figure: tier_NAME (a counter with _total), labelled tier=t and
 * the pairs kv. */
static void tier_add(builder_t *b, const char *t, const char *name, uint64_t v, int kind,
                     const char *unit, const char *help, size_t npairs, const char *const *kv) {
  const char *full = export_name(b, "tier_", name, kind);
  Kvcache__V1__Stat *st = add(b, full, v, wire_kind(kind), unit, help, "");
  const char *pairs[8] = {"tier", t};
  for (size_t i = 0; i < 2 * npairs && i < 6; i++) pairs[2 + i] = kv[i];
  labels(b, st, 1 + npairs, pairs);
}

/* Every tier's figures, one family at a time (the tiers' samples of a family
 * together, as the text format wants them): tier_*{tier="disk"|"cluster"}. */
static void render_tiers(builder_t *b, const tier_view_t *const *v, size_t n) {
#define TIER_ADD_(name, kind, unit, help)                                              \
  for (size_t i = 0; i < n; i++) tier_add(b, v[i]->tier, #name, v[i]->st->name, kind, unit, help, 0, NULL);
  TIER_STATS(TIER_ADD_)
#undef TIER_ADD_
  for (size_t i = 0; i < n; i++)
    for (int k = 0; k < TIER_ERR_COUNT_; k++)
      tier_add(b, v[i]->tier, "errors", v[i]->st->errors[k], STAT_COUNTER, "errors",
               "tier operations that failed, by kind", 1,
               (const char *const[]){"kind", tier_err_names[k]});
  for (size_t i = 0; i < n; i++)
    for (size_t k = 0; k < v[i]->ndiscards && k < TIER_DISCARDS_MAX; k++)
      tier_add(b, v[i]->tier, "discarded", v[i]->st->discarded[k], STAT_COUNTER, "pages",
               "values fetched and refused by verification, by reason", 1,
               (const char *const[]){"reason", v[i]->discard_names[k]});
  for (size_t i = 0; i < n; i++) { /* a tier of nodes (the cluster) */
    if (!v[i]->nnodes) continue;
    tier_add(b, v[i]->tier, "redirects", v[i]->st->moved, STAT_COUNTER, "redirects",
             "redirections followed, by kind (MOVED, ASK)", 1, (const char *const[]){"kind", "moved"});
    tier_add(b, v[i]->tier, "redirects", v[i]->st->ask, STAT_COUNTER, "redirects",
             "redirections followed, by kind (MOVED, ASK)", 1, (const char *const[]){"kind", "ask"});
  }
  for (size_t i = 0; i < n; i++)
    for (size_t k = 0; k < v[i]->nnodes; k++)
      tier_add(b, v[i]->tier, "node_slots", v[i]->nodes[k].slots, STAT_GAUGE, "slots",
               "a node of the tier: the slots it serves as a master, its role and state", 3,
               (const char *const[]){"node", v[i]->nodes[k].addr, "role", v[i]->nodes[k].role,
                                     "state", v[i]->nodes[k].state});
  for (size_t i = 0; i < n; i++) {
    const tier_stats_t *s = v[i]->st;
    uint64_t count = 0;
    for (unsigned k = 0; k < STATS_HIST_BUCKETS; k++) count += s->lookup_hist[k];
    render_histogram(b, "tier_lookup_duration_seconds",
                     "time a request waited for the tier, from the lookup sent to its end",
                     s->lookup_hist, count, s->lookup_ns, "tier", v[i]->tier);
  }
}

const char *const metrics_limit_names[METRICS_LIMITS] = {
    "pages", "pins", "sequences", "caches", "keys", "connections", "shm"};

static void render_refusals(builder_t *b, const metrics_refusals_t *ref, size_t nref) {
  for (size_t i = 0; i < nref && !b->rc; i++)
    for (int k = 0; k < METRICS_LIMITS; k++) {
      Kvcache__V1__Stat *st =
          add(b, "quota_refusals_total", ref[i].n[k], KVCACHE__V1__STAT_KIND__STAT_COUNTER,
              "requests", "requests refused by a tenant quota, by tenant and limit", "");
      labels(b, st, 2, (const char *const[]){"tenant", ref[i].tenant, "limit",
                                             metrics_limit_names[k]});
    }
}

static void render_arenas(builder_t *b, const metrics_arena_t *ar, size_t n) {
  static const struct {
    const char *name, *unit, *help;
    size_t off;
    bool counter;
  } f[] = {
      {"arena_segments", "segments", "segments an arena (tenant, page size) owns",
       offsetof(metrics_arena_t, segments), false},
      {"arena_pages_used", "pages", "an arena's pages in use", offsetof(metrics_arena_t, pages_used),
       false},
      {"arena_pages_free", "pages", "an arena's free pages", offsetof(metrics_arena_t, pages_free),
       false},
      {"arena_padding_bytes", "bytes", "bytes of an arena's segments no page can use (stride "
       "rounding, segment tails)", offsetof(metrics_arena_t, padding_bytes), false},
      {"arena_segments_taken_total", "segments", "segments an arena took (free, empty or given up "
       "by another)", offsetof(metrics_arena_t, segs_taken), true},
      {"arena_segments_given_total", "segments", "segments an arena gave back or up",
       offsetof(metrics_arena_t, segs_given), true},
  };
  for (size_t k = 0; k < sizeof f / sizeof f[0]; k++)
    for (size_t i = 0; i < n && !b->rc; i++) {
      uint64_t v = *(const uint64_t *)(const void *)((const char *)&ar[i] + f[k].off);
      Kvcache__V1__Stat *st =
          add(b, f[k].name, v, f[k].counter ? KVCACHE__V1__STAT_KIND__STAT_COUNTER
                                             : KVCACHE__V1__STAT_KIND__STAT_GAUGE,
              f[k].unit, f[k].help, "");
      labels(b, st, 2, (const char *const[]){"tenant", ar[i].tenant, "page_bytes", ar[i].page_bytes});
    }
}

int metrics_render(const daemon_stats_t *s, engine_t *eng, uint64_t now_ns, arena_t *a,
                   const uint32_t *cache_ids, size_t ncaches, metrics_cache_view_fn view,
                   void *view_ctx, const metrics_refusals_t *ref, size_t nref,
                   const tier_view_t *const *tiers, size_t ntiers, const metrics_arena_t *arenas,
                   size_t narenas, Kvcache__V1__StatsReply *out) {
  uint32_t *every = NULL;
  if (!cache_ids) {
    int rc = all_caches(eng, a, &every, &ncaches);
    if (rc) return rc;
    cache_ids = every;
  }
  builder_t b = {.a = a};
  Kvcache__V1__Stat *info =
      add(&b, "build_info", 1, KVCACHE__V1__STAT_KIND__STAT_INFO, "",
          "the kvcached version and protocol (value 1)", "");
  labels(&b, info, 2, (const char *const[]){"version", KVC_VERSION_STRING, "protocol",
                                            KVC_PROTOCOL_VERSION == 1 ? "1" : "?"});
  add(&b, "process_start_time_seconds", s->start_unix, KVCACHE__V1__STAT_KIND__STAT_GAUGE,
      "seconds", "when the daemon started, seconds since the Unix epoch", "");
  add(&b, "uptime_seconds", (now_ns - s->start_ns) / 1000000000u,
      KVCACHE__V1__STAT_KIND__STAT_GAUGE, "seconds", "seconds since the daemon started", "");

  engine_stats_t es;
  engine_stats(eng, &es);
#define ENGINE_ADD_(name, kind, unit, help)                                    \
  {                                                                            \
    static const char *nm_;                                                    \
    add(&b, list_name(&b, &nm_, "", #name, kind), es.name, wire_kind(kind), unit, help, ""); \
  }
  ENGINE_STATS(ENGINE_ADD_)
#undef ENGINE_ADD_
#define DAEMON_ADD_(name, kind, unit, help)                                    \
  {                                                                            \
    static const char *nm_;                                                    \
    add(&b, list_name(&b, &nm_, "", #name, kind), s->name, wire_kind(kind), unit, help, ""); \
  }
  DAEMON_STATS(DAEMON_ADD_)
#undef DAEMON_ADD_
  render_histogram(&b, "ring_poll_seconds",
                   "stretches the event loop polled shared-memory rings without finding a "
                   "request; the sum is the CPU time polling cost",
                   s->ring_poll.hist, s->ring_poll.requests, s->ring_poll.sum_ns, NULL, NULL);
  render_ops(&b, s);
  render_refusals(&b, ref, nref);
  render_arenas(&b, arenas, narenas);
  render_tiers(&b, tiers, ntiers);
  render_caches(&b, eng, cache_ids, ncaches, view, view_ctx);
  if (b.rc) return b.rc;
  out->n_stats = b.n;
  out->stats = b.items;
  return 0;
}
