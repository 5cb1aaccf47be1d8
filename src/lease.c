/* lease.c: zero-copy read leases: page references held for a reader.
 *
 * A lease takes one reference on every page covering a token range of a
 * sequence, exactly as another block table would:
 *
 *   seq A table: [p3, p7, p1]      lease L1 of A [16, 40): pages [p7, p1]
 *   refcnt:  p3=1  p7=2  p1=2      (A's reference + L1's)
 *
 *   A appends token 40 (page p1):  refcnt p1 > 1, so A copies p1 to p9 and
 *                                  writes p9; L1 still reads p1 unchanged.
 *   A is evicted:                  p3 is freed; p7 and p1 drop to refcnt 1
 *                                  (L1's) and stay until L1 is released.
 *
 * So the existing rules give a lease its guarantees with no new case in the
 * write or eviction paths: copy on write never writes a page whose refcount
 * is above 1, and eviction frees a page only when every holder it counted is
 * a victim (a lease is never one). Releasing the last reference frees the
 * page. A leased page counts as shared (pages_shared) while its sequence
 * also holds it. Leases belong to an owner (the daemon's connection id) and
 * are released one by one or all at once when the owner goes away.
 */
#include "lease.h"

#include "lru.h"
#include "page.h"
#include "quota.h"
#include "seq.h"


/* A lease of at most this many pages keeps its memory, once released, for
 * the next one (one spare): a read loop's lease, one a read, allocates
 * nothing. */
#define SPARE_PAGES 8u

static void lease_mem_free(engine_t *eng, lease_t *l) {
  if (l && l->q && l->cap == SPARE_PAGES && !eng->lease_spare) eng->lease_spare = l;
  else mem_free(&eng->mem, l);
}

/* A lease record for n pages: a connection's (spare) from the spare, if
 * it is small; its id, owner 0, pages referenced, listed. NULL: out of
 * memory, nothing changed (the spare stays). */
static lease_t *lease_new(engine_t *eng, const uint32_t *pages, uint32_t n,
                          uint64_t layout_bytes, bool spare);

static void lease_unlink(engine_t *eng, lease_t *l) {
  if (l->prev) l->prev->next = l->next;
  else eng->lease_list = l->next;
  if (l->next) l->next->prev = l->prev;
  hmap_remove(&eng->leases, l->id);
  /* As a sequence's release does: a page only the prefix index still holds
   * becomes a cached page. */
  for (uint32_t i = 0; l->q && i < l->npages; i++) /* while the page is in use */
    if (--eng->lease_ref[l->pages[i]] == 0) {
      quota_t *q = quota_of_page(eng, l->pages[i]);
      q->use.leased--;
      q->use.leased_bytes -= pool_page_stride(&eng->pool, l->pages[i]);
    }
  for (uint32_t i = 0; i < l->npages; i++)
    page_unref_bytes(eng, l->layout_bytes, l->pages[i], PRIO_DEFAULT);
  eng->st.leases--;
  eng->st.leased_pages -= l->npages;
  lease_mem_free(eng, l);
}

int engine_lease(engine_t *eng, uint32_t cache_id, uint64_t seq_id, uint64_t begin,
                 uint64_t end, uint64_t owner, engine_lease_t *out) {
  if (!eng) return KVC_E_INVAL;
  if (!out) return engine_fail(eng, KVC_E_INVAL, "NULL argument");
  seq_t *s;
  int rc = engine_use_seq(eng, cache_id, seq_id, &s);
  if (rc) return rc;
  if (begin >= end || begin < s->start || end > s->len)
    return engine_fail(eng, KVC_E_RANGE,
                       "lease of [%llu, %llu) outside [start %llu, length %llu), or empty",
                       (unsigned long long)begin, (unsigned long long)end,
                       (unsigned long long)s->start, (unsigned long long)s->len);
  /* A hole's slots hold whatever the page held before: a get zeroes them,
   * a reader in place could not tell, so a lease never covers one. */
  const hole_t *holes = s->x->holes;
  for (uint32_t h = 0; h < s->x->nholes; h++)
    if (holes[h].b < end && holes[h].e > begin)
      return engine_fail(eng, KVC_E_RANGE,
                         "lease of [%llu, %llu) covers unwritten slots [%llu, %llu)",
                         (unsigned long long)begin, (unsigned long long)end,
                         (unsigned long long)holes[h].b, (unsigned long long)holes[h].e);
  const geom_t *g = &s->cache->g;
  uint64_t first = begin >> g->tshift, last = (end - 1) >> g->tshift;
  uint32_t n = (uint32_t)(last - first + 1);
  const uint32_t *pages = s->table + (first - s->base);
  /* So each page of the range holds a token: none is an entry without a
   * page (all holes, seq.h); checked all the same, before anything changes. */
  for (uint32_t i = 0; i < n; i++)
    if (pages[i] == POOL_NOPAGE)
      return engine_fail(eng, KVC_E_RANGE, "lease of [%llu, %llu): page %llu holds no token",
                         (unsigned long long)begin, (unsigned long long)end,
                         (unsigned long long)(first + i));
  bool fresh = !eng->lease_ref; /* made by this call: a failed one keeps nothing */
  if (fresh && !(eng->lease_ref = mem_calloc(&eng->mem, eng->pool.npages, sizeof *eng->lease_ref)))
    return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  uint64_t more = 0; /* pages no lease held yet: a page counts once */
  for (uint32_t i = 0; i < n; i++) more += eng->lease_ref[pages[i]] == 0;
  lease_t *l = NULL;
  if ((rc = quota_check_pins(eng, s->cache->q, more, pool_arena(&eng->pool, s->cache->arena)->stride, false)) ||
      !(l = lease_new(eng, s->table + (first - s->base), n, g->page_bytes, true))) {
    if (fresh) {
      mem_free(&eng->mem, eng->lease_ref);
      eng->lease_ref = NULL;
    }
    return rc ? rc : engine_fail(eng, KVC_E_NOMEM, "out of memory");
  }
  l->owner = owner;
  l->q = s->cache->q;
  for (uint32_t i = 0; i < n; i++)
    if (eng->lease_ref[pages[i]]++ == 0) {
      quota_t *q = quota_of_page(eng, pages[i]);
      q->use.leased++;
      q->use.leased_bytes += pool_page_stride(&eng->pool, pages[i]);
    }
  eng->st.leases_taken++;
  lru_touch(eng, s);
  *out = (engine_lease_t){.id = l->id, .first_pos = first << g->tshift, .npages = n,
                          .pages = l->pages, .page_tokens = g->T,
                          .layer_bytes = g->layer_bytes, .v_offset = g->k_off_v,
                          .k_row_bytes = g->k_row, .v_row_bytes = g->v_row,
                          .k_scale_offset = g->int8 ? g->ks_off : 0,
                          .v_scale_offset = g->int8 ? g->vs_off : 0};
  return 0;
}

lease_t *lease_pages(engine_t *eng, const uint32_t *pages, uint32_t n, uint64_t layout_bytes) {
  return lease_new(eng, pages, n, layout_bytes, false);
}

static lease_t *lease_new(engine_t *eng, const uint32_t *pages, uint32_t n,
                          uint64_t layout_bytes, bool spare) {
  uint32_t cap = spare && n <= SPARE_PAGES ? SPARE_PAGES : n;
  lease_t *l = cap == SPARE_PAGES && spare ? eng->lease_spare : NULL;
  bool from_spare = l != NULL;
  if (l) eng->lease_spare = NULL;
  else if ((l = mem_alloc(&eng->mem, sizeof *l + (size_t)cap * sizeof l->pages[0]))) l->cap = cap;
  if (!l || hmap_reserve(&eng->leases, &eng->mem, 1) != 0) {
    if (from_spare) eng->lease_spare = l; /* a failed call keeps what was */
    else mem_free(&eng->mem, l);
    return NULL;
  }
  l->id = ++eng->next_lease_id;
  l->owner = 0; /* no connection: engine_lease_release_all never matches it */
  l->layout_bytes = layout_bytes;
  l->q = NULL;
  l->npages = n;
  for (uint32_t i = 0; i < n; i++) {
    l->pages[i] = pages[i];
    page_ref(eng, pages[i]);
  }
  l->prev = NULL;
  l->next = eng->lease_list;
  if (l->next) l->next->prev = l;
  eng->lease_list = l;
  hmap_insert(&eng->leases, l->id, l);
  eng->st.leases++;
  eng->st.leased_pages += n;
  return l;
}

void lease_drop(engine_t *eng, lease_t *l) { lease_unlink(eng, l); }

int engine_lease_release(engine_t *eng, uint64_t owner, uint64_t lease_id) {
  if (!eng) return KVC_E_INVAL;
  lease_t *l = hmap_get(&eng->leases, lease_id);
  if (!l || l->owner != owner)
    return engine_fail(eng, KVC_E_NOLEASE, "no lease %llu held by this owner",
                       (unsigned long long)lease_id);
  lease_unlink(eng, l);
  return 0;
}

size_t engine_lease_release_all(engine_t *eng, uint64_t owner) {
  size_t n = 0;
  for (lease_t *l = eng->lease_list, *next; l; l = next) {
    next = l->next;
    if (l->owner != owner) continue;
    lease_unlink(eng, l);
    n++;
  }
  return n;
}

void lease_free_all(engine_t *eng) {
  for (lease_t *l = eng->lease_list, *next; l; l = next) {
    next = l->next;
    mem_free(&eng->mem, l);
  }
  eng->lease_list = NULL;
  mem_free(&eng->mem, eng->lease_spare);
  eng->lease_spare = NULL;
  hmap_deinit(&eng->leases, &eng->mem);
}


