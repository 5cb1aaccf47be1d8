/* testmem.c: a tier for the tests alone, and the proof that a tier is one
 * file and one line in tiers.c: pages the pool reclaims are kept in this
 * process's memory, and a match past the pool takes them back. On only
 * with KVCACHED_TEST_TIER=mem in the daemon's environment (read at open);
 * with KVCACHED_TEST_TIER=mem-silent its lookups never end (a tier that
 * stopped answering: the chain's deadline lets them go, tiers.c).
 *
 *   store:  reclaimed (a cached page leaving memory: its identity and
 *           bytes) -> kept
 *   lookup: engine_tier_probe -> the hashes past the pool that are kept, a
 *           run from the first -> the request waits one loop turn (a timer
 *           of 0 ms: the wait and the resume are the real ones) -> tiers_done
 *   import: the request runs again: engine_tier_import of the run (each
 *           hash recomputed by the engine from the request's own query)
 */
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "server.h"
#include "tier.h"

#define KEPT_MAX 65536u   /* pages kept at most (the tests' are a few) */
#define LOOKUP_MAX 1024u  /* pages one lookup takes back */

typedef struct kept {
  engine_page_t m;        /* m.tokens points at tokens; m.bytes NULL */
  uint32_t *tokens;
  uint8_t *bytes;
} kept_t;

typedef struct fetch {
  struct fetch *prev, *next; /* tm->fetches */
  tier_wait_t *w;         /* the waiting request's walk (w->held[idx] is this) */
  unsigned idx;
  bool fired;             /* the timer ran: its request runs again */
  uint32_t cache_id;
  uint64_t first;         /* the query's pages the pool held */
  size_t n;
  uint32_t at[];          /* indexes into kept: pages first, first + 1, ... */
} fetch_t;

typedef struct testmem {
  server_t *srv;
  kept_t *kept;
  size_t nkept;
  fetch_t *fetches;       /* lookups not imported or forgotten */
  uv_timer_t timer;
  tier_stats_t st;
  bool silent;            /* lookups never end */
} testmem_t;

/* One daemon a process: the tier's state (off: NULL). */
static testmem_t *tm;

static int tm_open(server_t *srv, char *err, size_t errlen) {
  const char *on = getenv("KVCACHED_TEST_TIER");
  if (!on || (strcmp(on, "mem") != 0 && strcmp(on, "mem-silent") != 0)) return 0;
  tm = calloc(1, sizeof *tm);
  if (tm) tm->kept = calloc(KEPT_MAX, sizeof *tm->kept);
  if (!tm || !tm->kept) {
    snprintf(err, errlen, "test tier: out of memory");
    return -1;
  }
  tm->srv = srv;
  tm->silent = strcmp(on, "mem-silent") == 0;
  uv_timer_init(srv->loop, &tm->timer);
  tm->timer.data = tm;
  LOG_INFO("tier_testmem", "op=open");
  return 0;
}

static bool tm_on(const server_t *srv) { return tm && tm->srv == srv; }

static size_t find(const uint8_t hash[32], uint32_t tenant) {
  for (size_t i = 0; i < tm->nkept; i++)
    if (memcmp(tm->kept[i].m.hash, hash, 32) == 0 && tm->kept[i].m.tenant == tenant) return i;
  return SIZE_MAX;
}

static void tm_reclaimed(server_t *srv, const engine_page_t *m) {
  (void)srv;
  if (tm->nkept == KEPT_MAX || find(m->hash, m->tenant) != SIZE_MAX) return;
  kept_t *k = &tm->kept[tm->nkept];
  k->tokens = malloc(m->page_tokens * sizeof *k->tokens);
  k->bytes = malloc(m->data_bytes);
  if (!k->tokens || !k->bytes) {
    free(k->tokens);
    free(k->bytes);
    return;
  }
  k->m = *m;
  memcpy(k->tokens, m->tokens, m->page_tokens * sizeof *k->tokens);
  k->m.tokens = k->tokens;
  k->m.bytes = NULL;
  k->m.more = 0;
  memcpy(k->bytes, m->bytes, m->data_bytes);
  tm->nkept++;
  tm->st.writes++;
  tm->st.written_bytes += m->data_bytes;
}

static void fetch_unlink(testmem_t *s, fetch_t *f) {
  if (f->prev) f->prev->next = f->next;
  else s->fetches = f->next;
  if (f->next) f->next->prev = f->prev;
}

/* The timer: every waiting lookup's request runs again. */
static void on_timer(uv_timer_t *t) {
  testmem_t *s = t->data;
  for (fetch_t *f = s->fetches; f; f = f->next) {
    if (f->fired) continue;
    f->fired = true;
    tiers_done(s->srv, f->w->conn_id, f->idx);
  }
}

static int tm_lookup(server_t *srv, tier_wait_t *w, unsigned idx, const tier_query_t *q) {
  uint32_t tenant;
  if (!tm->nkept || engine_cache_tenant(srv->eng, q->cache_id, &tenant) != 0) return TIER_RUN;
  uint8_t(*h)[32] = malloc(LOOKUP_MAX * 32);
  fetch_t *f = malloc(sizeof *f + LOOKUP_MAX * sizeof f->at[0]);
  uint64_t local = 0;
  size_t nh = 0;
  if (!h || !f ||
      engine_tier_probe(srv->eng, q->cache_id, q->tokens, q->n, q->key, &local, NULL, h,
                        LOOKUP_MAX, &nh) != 0)
    nh = 0;
  tm->st.lookups++;
  size_t k = 0;
  for (size_t at; k < nh && (at = find(h[k], tenant)) != SIZE_MAX; k++) f->at[k] = (uint32_t)at;
  free(h);
  if (!k) {
    free(f);
    return TIER_RUN;
  }
  *f = (fetch_t){.next = tm->fetches, .w = w, .idx = idx, .cache_id = q->cache_id,
                 .first = local, .n = k};
  if (tm->fetches) tm->fetches->prev = f;
  tm->fetches = f;
  w->held[idx] = f;
  if (!tm->silent) uv_timer_start(&tm->timer, on_timer, 0, 0);
  return TIER_WAIT;
}

/* The request runs again: the run goes in, each page's hash recomputed by
 * the engine from the request's own query. */
static void tm_import(server_t *srv, tier_wait_t *w, unsigned idx, const tier_query_t *q) {
  fetch_t *f = w->held[idx];
  w->held[idx] = NULL;
  if (!f) return;
  fetch_unlink(tm, f);
  engine_page_in_t in[64];
  size_t done = 0, got = 0;
  while (f->cache_id == q->cache_id && done < f->n) {
    size_t b = f->n - done < 64 ? f->n - done : 64;
    for (size_t i = 0; i < b; i++) {
      const kept_t *k = &tm->kept[f->at[done + i]];
      in[i] = (engine_page_in_t){.hash = k->m.hash, .bytes = k->bytes};
    }
    int rc = engine_tier_import(srv->eng, q->cache_id, q->tokens, q->n, q->key, f->first + done,
                                in, b, &got);
    for (size_t i = 0; i < got; i++) {
      const kept_t *k = &tm->kept[f->at[done + i]];
      tm->st.hit_pages++;
      tm->st.hit_tokens += k->m.page_tokens;
      tm->st.read_bytes += k->m.data_bytes;
    }
    if (rc || got < b) {
      tm->st.errors[TIER_ERR_import] += rc != 0;
      break; /* the chain stops at a page that does not go in */
    }
    done += b;
  }
  free(f);
}

static void tm_forget(server_t *srv, tier_wait_t *w, unsigned idx) {
  (void)srv;
  fetch_t *f = w->held[idx];
  w->held[idx] = NULL;
  if (!f) return;
  fetch_unlink(tm, f);
  free(f);
}

static void on_closed(uv_handle_t *h) {
  testmem_t *s = h->data;
  for (size_t i = 0; i < s->nkept; i++) {
    free(s->kept[i].tokens);
    free(s->kept[i].bytes);
  }
  free(s->kept);
  free(s);
}

static void tm_stop(server_t *srv) {
  (void)srv;
  testmem_t *s = tm;
  tm = NULL;
  uv_timer_stop(&s->timer);
  for (fetch_t *f = s->fetches, *next; f; f = next) { /* their requests run without them */
    next = f->next;
    f->w->held[f->idx] = NULL;
    if (!f->fired) tiers_done(s->srv, f->w->conn_id, f->idx);
    free(f);
  }
  s->fetches = NULL;
  uv_close((uv_handle_t *)&s->timer, on_closed);
}

static const tier_view_t *tm_view(server_t *srv, arena_t *a) {
  (void)srv;
  tier_view_t *v = arena_alloc(a, sizeof *v);
  if (!v) return NULL;
  tm->st.up = 1;
  *v = (tier_view_t){"testmem", &tm->st, NULL, 0, NULL, 0};
  return v;
}

const tier_ops_t tier_testmem = {
    .name = "testmem",
    .open = tm_open,
    .on = tm_on,
    .stop = tm_stop,
    .reclaimed = tm_reclaimed,
    .lookup = tm_lookup,
    .import = tm_import,
    .forget = tm_forget,
    .view = tm_view,
};
