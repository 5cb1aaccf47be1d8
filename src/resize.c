/* resize.c: the pool grows and shrinks under a live engine
 * (engine_resize.h), a segment at a time.
 *
 *   shrink to m segments:
 *     1. refuse if a lease (a reader in place, or a copy in flight) holds a
 *        page of a segment >= m, or a put is copying
 *     2. per arena with pages in segments >= m: what its free pages below m
 *        cannot hold is planned from its victims, the rest from free
 *        segments below m (all or nothing: FULL)
 *     3. carve those segments, evict, then move each page in use of a
 *        segment >= m to a free page of its arena below m (arena.c):
 *          bytes, refcnt, pinref, tenant, token metadata
 *          block tables and index parents: old -> new by one map
 *     4. the segments >= m are released; the per-page arrays end at m
 *
 * Every page reference in the engine is a page number in a block table, in
 * a lease, in an ipage (its own and its parent's), or an index of the
 * per-page arrays; leases are excluded by step 1, so a move rewrites the
 * rest. The audit checks every one of them afterwards.
 */
#include <string.h>

#include "engine_resize.h"
#include "arena.h"
#include "evict.h"
#include "lease.h"
#include "page.h"
#include "units.h"

#define NOPAGE POOL_NOPAGE

/* Grows (or shrinks) a per-page array from n to m entries, zeroing new
 * ones. false: out of memory (the array is as it was). */
static bool resize_array(engine_t *eng, void **p, size_t elem, uint64_t n, uint64_t m) {
  if (!*p) return true; /* allocated on first use, at the size of the day */
  void *q = mem_realloc(&eng->mem, *p, (size_t)m * elem);
  if (!q) return false;
  if (m > n) memset((char *)q + n * elem, 0, (size_t)(m - n) * elem);
  *p = q;
  return true;
}

/* Every per-page array of the engine at m entries (scratch: 2 m). Growing,
 * a failure leaves some arrays larger than needed, which is harmless. */
static bool arrays_to(engine_t *eng, uint64_t n, uint64_t m) {
  return resize_array(eng, (void **)&eng->ip, sizeof *eng->ip, n, m) &&
         resize_array(eng, (void **)&eng->scratch, 2 * sizeof *eng->scratch, n, m) &&
         resize_array(eng, (void **)&eng->page_quota, sizeof *eng->page_quota, n, m) &&
         resize_array(eng, (void **)&eng->lease_ref, sizeof *eng->lease_ref, n, m);
}

int engine_pool_grow(engine_t *eng, uint64_t pool_bytes) {
  if (!eng) return KVC_E_INVAL;
  pool_t *p = &eng->pool;
  uint64_t n = p->nseg, m = pool_bytes / p->seg_bytes;
  char u[UNITS_LEN];
  if (m <= n || m * p->ids_per_seg >= NOPAGE)
    return engine_fail(eng, KVC_E_INVAL,
                       "grow to %llu segments of %s: not more than %llu, or too many",
                       (unsigned long long)m, units_bytes(p->seg_bytes, u, sizeof u),
                       (unsigned long long)n);
  if (!arrays_to(eng, p->npages, m * p->ids_per_seg) ||
      !pool_set_segments(p, &eng->mem, (uint32_t)m))
    return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  return 0;
}

/* Pages of segments >= m a lease holds. */
static uint64_t leased_above(const engine_t *eng, uint32_t m) {
  uint64_t k = 0;
  for (const lease_t *l = eng->lease_list; l; l = l->next)
    for (uint32_t i = 0; i < l->npages; i++) k += pool_seg_of(&eng->pool, l->pages[i]) >= m;
  return k;
}

/* Per arena: pages in use in segments >= m, and its free pages below m. */
static void arena_split(const pool_t *p, uint16_t b, uint32_t m, uint64_t *high_used,
                        uint64_t *low_free) {
  *high_used = 0;
  uint64_t high_free = 0;
  for (uint32_t s = m; s < p->nseg; s++)
    if (p->seg_arena[s] == b) {
      *high_used += p->seg_used[s];
      high_free += p->arenas[b].per_seg - p->seg_used[s];
    }
  *low_free = p->arenas[b].nfree - high_free;
}

int engine_pool_shrink(engine_t *eng, uint64_t pool_bytes, engine_shrink_t *out) {
  if (!eng) return KVC_E_INVAL;
  pool_t *p = &eng->pool;
  uint64_t n = p->nseg, m = pool_bytes / p->seg_bytes;
  char u[UNITS_LEN];
  if (m >= n || m == 0)
    return engine_fail(eng, KVC_E_INVAL,
                       "shrink to %llu segments of %s: not fewer than %llu, or none",
                       (unsigned long long)m, units_bytes(p->seg_bytes, u, sizeof u),
                       (unsigned long long)n);
  if (eng->put_jobs)
    return engine_fail(eng, KVC_E_BUSY, "a put is copying into the pool: retry when it ends");
  uint64_t held = leased_above(eng, (uint32_t)m);
  if (held)
    return engine_fail(eng, KVC_E_BUSY, "%llu page%s of the part to release %s leased (read in "
                       "place, or a copy in flight): retry once released",
                       (unsigned long long)held, held == 1 ? "" : "s", held == 1 ? "is" : "are");
  /* The plan: per arena, what its free pages below m cannot hold comes
   * from its victims, the rest from free segments below m. */
  uint64_t free_low = 0, segs = 0, used0 = p->nused, map_len = 1;
  for (uint32_t s = 0; s < m; s++) free_low += p->seg_arena[s] == POOL_NOARENA;
  for (uint32_t b = 0; b < p->narenas; b++) {
    pool_arena_t *ab = &p->arenas[b];
    ab->plan_segs = 0;
    if (!ab->live) continue;
    if (ab->per_seg > map_len) map_len = ab->per_seg;
    uint64_t hu, lf;
    arena_split(p, (uint16_t)b, (uint32_t)m, &hu, &lf);
    if (hu <= lf) continue;
    uint64_t want = hu - lf, freed = evict_plan(eng, (uint16_t)b, ab->nfree + want, NULL, NULL, NULL);
    if (freed < want) {
      ab->plan_segs = (uint32_t)((want - freed + ab->per_seg - 1) / ab->per_seg);
      segs += ab->plan_segs;
    }
  }
  uint32_t *map = mem_alloc(&eng->mem, map_len * sizeof *map);
  if (!map) return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  if (segs > free_low) {
    for (uint32_t b = 0; b < p->narenas; b++) p->arenas[b].plan_segs = 0;
    mem_free(&eng->mem, map);
    return engine_fail(eng, KVC_E_FULL,
                       "the pool cannot shrink to %llu segments: %u pages are in use and "
                       "the rest cannot hold them after eviction; the others are pinned, "
                       "leased, busy or under a tenant's floor and would be lost",
                       (unsigned long long)m, p->nused);
  }
  eng->epoch++; /* no sequence of this call to spare */
  /* Free segments below m first, then eviction, arena by arena. */
  for (uint32_t b = 0; b < p->narenas; b++) {
    pool_arena_t *ab = &p->arenas[b];
    for (; ab->plan_segs; ab->plan_segs--) {
      uint32_t s = pool_seg_free(p, (uint32_t)m);
      pool_seg_carve(p, s, (uint16_t)b);
      if (eng->seg_hook)
        eng->seg_hook(eng->seg_ctx, s, ENGINE_OWNER_NONE, (uint64_t)ab->tenant << 32 | ab->group);
    }
    if (!ab->live) continue;
    uint64_t hu, lf;
    arena_split(p, (uint16_t)b, (uint32_t)m, &hu, &lf);
    if (hu > lf && !evict_arena_to(eng, (uint16_t)b, ab->nfree + (hu - lf), NULL)) {
      mem_free(&eng->mem, map);
      return engine_fail(eng, KVC_E_INTERNAL, "shrink: the plan and eviction disagree");
    }
  }
  uint64_t evicted = used0 - p->nused, moved = 0;
  /* Every page in use of a segment >= m moves to a free page below m. */
  for (uint32_t s = (uint32_t)m; s < n; s++)
    if (p->seg_arena[s] != POOL_NOARENA) (void)pool_seg_detach_free(p, s);
  for (uint32_t s = (uint32_t)m; s < n; s++) {
    uint16_t b = p->seg_arena[s];
    if (b == POOL_NOARENA) continue;
    moved += arena_vacate(eng, s, map);
    pool_seg_release(p, s);
    if (!p->arenas[b].nseg && !p->arenas[b].ncaches) p->arenas[b].live = false;
  }
  mem_free(&eng->mem, map);
  uint32_t ids = p->npages;
  (void)pool_set_segments(p, &eng->mem, (uint32_t)m);
  (void)arrays_to(eng, ids, p->npages); /* smaller: only returns memory; a failure keeps more */
  if (out) *out = (engine_shrink_t){evicted, moved};
  return 0;
}
