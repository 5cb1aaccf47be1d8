/* topcaches.c: the N caches holding the most pages among those a viewer may
 * see. Each tenant's caches come ranked from the engine (engine_cache_ranked,
 * O(1) a look); a max-heap holds each merged tenant's next cache, so N
 * caches of T tenants cost O(T + N log T). A tenant whose caches the viewer
 * mostly may not see (the shared namespace, for a tenant with a right on a
 * few of its caches) costs the ones skipped too: at most the shared caches
 * the configuration declares. */
#include "topcaches.h"

typedef struct head {
  uint64_t pages;  /* of the tenant's cache at pos */
  uint32_t tenant; /* whose ranking */
  uint32_t id;     /* the cache at pos */
  size_t pos;      /* its place in the tenant's ranking */
} head_t;

static void sift_down(head_t *h, size_t n, size_t i) {
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < n && h[l].pages > h[m].pages) m = l;
    if (r < n && h[r].pages > h[m].pages) m = r;
    if (m == i) return;
    head_t t = h[i];
    h[i] = h[m];
    h[m] = t;
    i = m;
  }
}

/* Sets h to the first cache of tenant t from pos on that the viewer sees;
 * false when there is none. */
static bool next_seen(engine_t *eng, topcaches_sees_fn sees, void *ctx, uint32_t t, size_t pos,
                      head_t *h) {
  uint32_t id;
  uint64_t pages;
  for (; engine_cache_ranked(eng, t, pos, &id, &pages) == 0; pos++) {
    if (sees && !sees(ctx, t, id)) continue;
    *h = (head_t){pages, t, id, pos};
    return true;
  }
  return false;
}

size_t topcaches_pick(engine_t *eng, const uint32_t *ts, size_t nt, topcaches_sees_fn sees,
                      void *ctx, size_t n, uint32_t *ids, arena_t *a, bool *nomem) {
  *nomem = false;
  if (!n || !nt) return 0;
  head_t *h = arena_alloc(a, nt * sizeof *h);
  if (!h) {
    *nomem = true;
    return 0;
  }
  size_t nh = 0, k = 0;
  for (size_t i = 0; i < nt; i++)
    if (next_seen(eng, sees, ctx, ts[i], 0, &h[nh])) nh++;
  for (size_t i = nh / 2; i-- > 0;) sift_down(h, nh, i);
  while (nh && k < n) {
    ids[k++] = h[0].id;
    if (!next_seen(eng, sees, ctx, h[0].tenant, h[0].pos + 1, &h[0])) h[0] = h[--nh];
    sift_down(h, nh, 0);
  }
  return k;
}
