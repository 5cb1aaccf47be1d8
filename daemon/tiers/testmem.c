/* testmem.c: a tier for the tests alone, and the proof that a tier is one
 * file and one line in tiers.c: pages the pool reclaims are kept in this
 * process's memory, and a match past the pool takes them back. On only
 * with KVCACHED_TEST_TIER=mem in the daemon's environment (read at open).
 *
 *   store:  spill (a reclaimed cached page: its identity and bytes) -> kept
 *   lookup: engine_tier_probe -> the hashes past the pool that are kept, a
 *           run from the first -> the request waits one loop turn (a timer
 *           of 0 ms: the wait and the resume are the real ones) -> each
 *           page imported (engine_tier_import_begin/_end: verified by the
 *           engine) -> tiers_done
 */
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "server.h"
#include "tier.h"

#define KEPT_MAX 65536u   /* pages kept at most (the tests' are a few) */
#define LOOKUP_MAX 1024u  /* pages one lookup takes back */

typedef struct kept {
  engine_tier_meta_t m;   /* m.tokens points at tokens */
  uint32_t *tokens;
  uint8_t *bytes;
} kept_t;

typedef struct fetch {
  struct fetch *next;
  uint64_t conn_id;
  unsigned idx;
  uint32_t cache_id;
  size_t n;
  uint32_t at[];          /* indexes into kept */
} fetch_t;

typedef struct testmem {
  server_t *srv;
  kept_t *kept;
  size_t nkept;
  fetch_t *fetches;       /* waiting for the timer */
  uv_timer_t timer;
  tier_stats_t st;
} testmem_t;

/* One daemon a process: the tier's state (off: NULL). */
static testmem_t *tm;

static int tm_open(server_t *srv, char *err, size_t errlen) {
  const char *on = getenv("KVCACHED_TEST_TIER");
  if (!on || strcmp(on, "mem") != 0) return 0;
  tm = calloc(1, sizeof *tm);
  if (tm) tm->kept = calloc(KEPT_MAX, sizeof *tm->kept);
  if (!tm || !tm->kept) {
    snprintf(err, errlen, "test tier: out of memory");
    return -1;
  }
  tm->srv = srv;
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

static void tm_spill(server_t *srv, const engine_tier_meta_t *m, const void *bytes) {
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
  k->m.more = 0;
  memcpy(k->bytes, bytes, m->data_bytes);
  tm->nkept++;
  tm->st.writes++;
  tm->st.written_bytes += m->data_bytes;
}

/* The timer: every waiting lookup's pages go in, then its request runs. */
static void on_timer(uv_timer_t *t) {
  testmem_t *s = t->data;
  server_t *srv = s->srv;
  fetch_t *f = s->fetches;
  s->fetches = NULL;
  while (f) {
    fetch_t *next = f->next;
    for (size_t i = 0; i < f->n; i++) {
      const kept_t *k = &s->kept[f->at[i]];
      engine_tier_job_t *job;
      void *dst;
      if (engine_tier_import_begin(srv->eng, f->cache_id, &job, &dst) != 0) {
        s->st.errors[TIER_ERR_import]++;
        break;
      }
      memcpy(dst, k->bytes, k->m.data_bytes);
      int rc = engine_tier_import_end(srv->eng, job, &k->m, true);
      if (rc == 0) {
        s->st.hit_pages++;
        s->st.hit_tokens += k->m.page_tokens;
        s->st.read_bytes += k->m.data_bytes;
      } else if (rc != KVC_E_EXISTS) {
        break; /* the chain stops at a page that does not go in */
      }
    }
    tiers_done(srv, f->conn_id, f->idx);
    free(f);
    f = next;
  }
}

static int tm_lookup(server_t *srv, tier_wait_t *w, unsigned idx, const tier_query_t *q) {
  uint32_t tenant;
  if (!tm->nkept || engine_cache_tenant(srv->eng, q->cache_id, &tenant) != 0) return TIER_RUN;
  uint8_t(*h)[32] = malloc(LOOKUP_MAX * 32);
  fetch_t *f = malloc(sizeof *f + LOOKUP_MAX * sizeof f->at[0]);
  uint64_t resident;
  size_t nh = 0;
  if (!h || !f ||
      engine_tier_probe(srv->eng, q->cache_id, q->tokens, q->n, q->key, h, LOOKUP_MAX, &resident,
                        &nh) != 0)
    nh = 0;
  tm->st.lookups++;
  size_t k = 0;
  for (size_t at; k < nh && (at = find(h[k], tenant)) != SIZE_MAX; k++) f->at[k] = (uint32_t)at;
  free(h);
  if (!k) {
    free(f);
    return TIER_RUN;
  }
  *f = (fetch_t){.next = tm->fetches, .conn_id = w->conn_id, .idx = idx, .cache_id = q->cache_id,
                 .n = k};
  tm->fetches = f;
  uv_timer_start(&tm->timer, on_timer, 0, 0);
  return TIER_WAIT;
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
    tiers_done(s->srv, f->conn_id, f->idx);
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
    .spill = tm_spill,
    .lookup = tm_lookup,
    .view = tm_view,
};
