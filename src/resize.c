/* resize.c: the pool grows and shrinks under a live engine
 * (engine_resize.h).
 *
 *   shrink to n pages:
 *     1. refuse if a lease (a reader in place, or a copy in flight) holds a
 *        page >= n, or a put is copying
 *     2. evict until at most n pages are in use (all or nothing: FULL)
 *     3. move each page in use >= n to a free page < n:
 *          bytes, refcnt, pinref, tenant, token metadata
 *          block tables and index parents: old -> new by one map
 *     4. the per-page arrays end at n; the free list is rebuilt
 *
 * Every page reference in the engine is a page number in a block table, in
 * a lease, in an ipage (its own and its parent's), or an index of the
 * per-page arrays; leases are excluded by step 1, so a move rewrites the
 * rest. The audit checks every one of them afterwards.
 */
#include <string.h>

#include "engine_resize.h"
#include "evict.h"
#include "lease.h"
#include "page.h"

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

/* Every per-page array at m entries (scratch: 2 m). Growing, a failure
 * leaves some arrays larger than needed, which is harmless. */
static bool arrays_to(engine_t *eng, uint64_t n, uint64_t m) {
  pool_t *p = &eng->pool;
  return resize_array(eng, (void **)&p->refcnt, sizeof *p->refcnt, n, m) &&
         resize_array(eng, (void **)&p->pinref, sizeof *p->pinref, n, m) &&
         resize_array(eng, (void **)&p->plan, sizeof *p->plan, n, m) &&
         resize_array(eng, (void **)&eng->ip, sizeof *eng->ip, n, m) &&
         resize_array(eng, (void **)&eng->scratch, 2 * sizeof *eng->scratch, n, m) &&
         resize_array(eng, (void **)&eng->page_quota, sizeof *eng->page_quota, n, m) &&
         resize_array(eng, (void **)&eng->lease_ref, sizeof *eng->lease_ref, n, m);
}

int engine_pool_grow(engine_t *eng, uint64_t pool_bytes) {
  if (!eng) return KVC_E_INVAL;
  pool_t *p = &eng->pool;
  uint64_t n = p->npages, m = pool_bytes / p->page_bytes;
  if (m <= n || m >= NOPAGE)
    return engine_fail(eng, KVC_E_INVAL, "grow to %llu pages: not more than %llu, or too many",
                       (unsigned long long)m, (unsigned long long)n);
  if (!arrays_to(eng, n, m)) return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  /* Lowest first, so the new pages go after the old free ones: pages in
   * use stay low, and a later shrink back has less to move. */
  p->npages = (uint32_t)m;
  pool_free_rebuild(p);
  return 0;
}

/* Pages >= n a lease holds, and whether a put is copying. */
static uint64_t leased_above(const engine_t *eng, uint32_t n) {
  uint64_t k = 0;
  for (const lease_t *l = eng->lease_list; l; l = l->next)
    for (uint32_t i = 0; i < l->npages; i++) k += l->pages[i] >= n;
  return k;
}

int engine_pool_shrink(engine_t *eng, uint64_t pool_bytes, engine_shrink_t *out) {
  if (!eng) return KVC_E_INVAL;
  pool_t *p = &eng->pool;
  uint64_t n = p->npages, m = pool_bytes / p->page_bytes;
  if (m >= n || m == 0)
    return engine_fail(eng, KVC_E_INVAL, "shrink to %llu pages: not fewer than %llu, or none",
                       (unsigned long long)m, (unsigned long long)n);
  if (eng->put_jobs)
    return engine_fail(eng, KVC_E_BUSY, "a put is copying into the pool: retry when it ends");
  uint64_t held = leased_above(eng, (uint32_t)m);
  if (held)
    return engine_fail(eng, KVC_E_BUSY, "%llu page%s of the part to release %s leased (read in "
                       "place, or a copy in flight): retry once released",
                       (unsigned long long)held, held == 1 ? "" : "s", held == 1 ? "is" : "are");
  uint64_t used0 = n - p->nfree;
  uint32_t *map = mem_alloc(&eng->mem, (size_t)(n - m) * sizeof *map);
  if (!map) return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  eng->epoch++; /* no sequence of this call to spare */
  evict_need_t nd = {.new_pages = n - m};
  int rc = evict_make_room(eng, &nd);
  if (rc == KVC_E_FULL || rc == KVC_E_QUOTA_PAGES) {
    mem_free(&eng->mem, map);
    return engine_fail(eng, KVC_E_FULL,
                       "the pool cannot shrink to %llu pages: %llu are in use and only %llu of "
                       "them can be evicted; the rest are pinned, leased, busy or under a "
                       "tenant's floor and would be lost",
                       (unsigned long long)m, (unsigned long long)used0,
                       (unsigned long long)(eng->err.freeable - p->nfree));
  }
  if (rc) {
    mem_free(&eng->mem, map);
    return rc;
  }
  uint64_t evicted = used0 - (n - p->nfree);
  /* Move every page in use >= m to a free page < m (there are enough now). */
  uint64_t moved = 0;
  uint32_t dst = 0;
  for (uint64_t old = m; old < n; old++) {
    map[old - m] = NOPAGE;
    if (!p->refcnt[old]) continue;
    while (p->refcnt[dst]) dst++;
    memcpy(pool_page(p, dst), pool_page(p, (uint32_t)old), p->page_bytes);
    p->refcnt[dst] = p->refcnt[old];
    p->pinref[dst] = p->pinref[old]; /* dst's link goes: the list is rebuilt below */
    p->refcnt[old] = p->pinref[old] = 0;
    eng->page_quota[dst] = eng->page_quota[old];
    if (eng->ip) {
      eng->ip[dst] = eng->ip[old];
      eng->ip[old] = NULL;
      if (eng->ip[dst]) eng->ip[dst]->page = dst;
    }
    map[old - m] = dst++;
    moved++;
  }
  /* Every reference to a moved page: block tables, index parents. */
  for (uint32_t ci = 0; ci < eng->ncaches; ci++) {
    cache_t *c = eng->caches[ci];
    size_t pos = 0;
    seq_t *s;
    while (c && (s = hmap_next(&c->seqs, &pos, NULL)))
      for (uint32_t i = 0; i < s->ntable; i++)
        if (s->table[i] >= m && s->table[i] != NOPAGE) s->table[i] = map[s->table[i] - m];
  }
  for (uint64_t q = 0; eng->ip && q < m; q++)
    if (eng->ip[q] && eng->ip[q]->parent != NOPAGE && eng->ip[q]->parent >= m)
      eng->ip[q]->parent = map[eng->ip[q]->parent - m];
  mem_free(&eng->mem, map);
  /* The free list holds the free pages below m, lowest first. */
  p->npages = (uint32_t)m;
  pool_free_rebuild(p);
  (void)arrays_to(eng, n, m); /* smaller: only returns memory; a failure keeps more */
  if (out) *out = (engine_shrink_t){evicted, moved};
  return 0;
}
