/* pool.c: segments carved into arenas' pages; O(1) page allocation from an
 * arena's free list, with refcounts and pins (pool.h). */
#include "pool.h"

#include <string.h>

#include "kvcache/errors.h"

static bool grow_arrays(pool_t *p, mem_t *m, uint32_t nseg) {
  uint64_t n = (uint64_t)nseg * p->ids_per_seg, old = p->npages;
  uint32_t *r = mem_realloc(m, p->refcnt, n * sizeof *r);
  if (r) p->refcnt = r;
  uint32_t *pr = r ? mem_realloc(m, p->pinref, n * sizeof *pr) : NULL;
  if (pr) p->pinref = pr;
  uint32_t *pl = pr ? mem_realloc(m, p->plan, n * sizeof *pl) : NULL;
  if (pl) p->plan = pl;
  uint16_t *sa = pl ? mem_realloc(m, p->seg_arena, nseg * sizeof *sa) : NULL;
  if (sa) p->seg_arena = sa;
  uint32_t *su = sa ? mem_realloc(m, p->seg_used, nseg * sizeof *su) : NULL;
  if (su) p->seg_used = su;
  uint32_t *sl = su ? mem_realloc(m, p->seg_link, nseg * sizeof *sl) : NULL;
  if (sl) p->seg_link = sl;
  if (!sl) return false; /* the arrays that grew are larger than needed: harmless */
  if (n > old) {
    memset(p->refcnt + old, 0, (n - old) * sizeof *p->refcnt);
    memset(p->pinref + old, 0, (n - old) * sizeof *p->pinref);
    memset(p->plan + old, 0, (n - old) * sizeof *p->plan);
  }
  for (uint32_t s = p->nseg; s < nseg; s++) {
    p->seg_arena[s] = POOL_NOARENA;
    p->seg_used[s] = 0;
  }
  return true;
}

int pool_init(pool_t *p, mem_t *m, void *base, uint64_t pool_bytes, uint64_t grain,
              uint64_t seg_bytes, uint64_t align, uint32_t max_arenas) {
  memset(p, 0, sizeof *p);
  if (!align) align = POOL_ALIGN;
  if (!base || grain == 0 || grain % POOL_ALIGN || align % POOL_ALIGN || grain % align)
    return KVC_E_INVAL;
  p->align = align;
  if (seg_bytes == 0) seg_bytes = grain; /* one page size, one page a segment */
  if (seg_bytes == 0 || seg_bytes % grain || seg_bytes > pool_bytes) return KVC_E_INVAL;
  uint64_t nseg = pool_bytes / seg_bytes, ids = seg_bytes / grain;
  if (ids >= POOL_NOPAGE || nseg * ids >= POOL_NOPAGE) return KVC_E_INVAL;
  p->base = base;
  p->grain = grain;
  p->seg_bytes = seg_bytes;
  p->ids_per_seg = (uint32_t)ids;
  if (!grow_arrays(p, m, (uint32_t)nseg)) {
    pool_deinit(p, m);
    return KVC_E_NOMEM;
  }
  p->nseg = (uint32_t)nseg;
  p->npages = (uint32_t)(nseg * ids);
  pool_seg_free_rebuild(p);
  /* Allocated once: opening a cache never grows it (a failed open keeps nothing). */
  p->arenas_cap = max_arenas < POOL_ARENAS_MAX ? max_arenas : POOL_ARENAS_MAX;
  if (!(p->arenas = mem_calloc(m, p->arenas_cap, sizeof *p->arenas))) {
    pool_deinit(p, m);
    return KVC_E_NOMEM;
  }
  return 0;
}

void pool_seg_free_rebuild(pool_t *p) {
  p->seg_free_head = UINT32_MAX;
  p->nseg_free = 0;
  for (uint32_t s = p->nseg; s-- > 0;) {
    if (p->seg_arena[s] != POOL_NOARENA) continue;
    p->seg_link[s] = p->seg_free_head;
    p->seg_free_head = s;
    p->nseg_free++;
  }
}

void pool_deinit(pool_t *p, mem_t *m) {
  mem_free(m, p->refcnt);
  mem_free(m, p->pinref);
  mem_free(m, p->plan);
  mem_free(m, p->seg_arena);
  mem_free(m, p->seg_used);
  mem_free(m, p->seg_link);
  mem_free(m, p->arenas);
  memset(p, 0, sizeof *p);
}

uint64_t pool_stride(const pool_t *p, uint64_t page_bytes) {
  uint64_t st = (page_bytes + p->align - 1) / p->align * p->align;
  return st < p->grain ? p->grain : st;
}

uint16_t pool_arena_open(pool_t *p, uint32_t tenant, uint32_t group, uint64_t page_bytes,
                         int *code) {
  uint32_t free_slot = POOL_NOARENA;
  for (uint32_t a = 0; a < p->narenas; a++) {
    pool_arena_t *ar = &p->arenas[a];
    if (!ar->live) {
      if (free_slot == POOL_NOARENA) free_slot = a;
      continue;
    }
    if (ar->tenant == tenant && ar->group == group && ar->page_bytes == page_bytes) {
      ar->ncaches++;
      return (uint16_t)a;
    }
  }
  uint64_t stride = pool_stride(p, page_bytes);
  if (stride > p->seg_bytes) {
    *code = KVC_E_PAGESIZE;
    return POOL_NOARENA;
  }
  if (free_slot == POOL_NOARENA) {
    if (p->narenas >= p->arenas_cap) {
      *code = KVC_E_TOOMANY;
      return POOL_NOARENA;
    }
    free_slot = p->narenas++;
  }
  p->arenas[free_slot] = (pool_arena_t){.live = true, .tenant = tenant, .group = group,
                                        .uid = ++p->next_uid, .page_bytes = page_bytes,
                                        .stride = stride,
                                        .per_seg = (uint32_t)(p->seg_bytes / stride),
                                        .free_head = POOL_NOPAGE, .free_tail = POOL_NOPAGE,
                                        .ncaches = 1};
  return (uint16_t)free_slot;
}

void pool_arena_close(pool_t *p, uint16_t a) {
  pool_arena_t *ar = &p->arenas[a];
  if (--ar->ncaches) return;
  /* Segments still holding pages (of leases that outlive the cache) go
   * when their last page does (pool_unref). */
  for (uint32_t s = 0; s < p->nseg; s++)
    if (p->seg_arena[s] == a && p->seg_used[s] == 0) pool_seg_uncarve(p, s);
  if (!ar->nseg) ar->live = false;
}

uint32_t pool_seg_free(const pool_t *p, uint32_t below) {
  for (uint32_t s = p->seg_free_head; s != UINT32_MAX; s = p->seg_link[s])
    if (s < below) return s;
  return UINT32_MAX;
}

/* Appends page q to arena ar's free list. */
static void free_append(pool_t *p, pool_arena_t *ar, uint32_t q) {
  p->pinref[q] = POOL_NOPAGE;
  if (ar->free_tail == POOL_NOPAGE) ar->free_head = q;
  else p->pinref[ar->free_tail] = q;
  ar->free_tail = q;
}

void pool_seg_carve(pool_t *p, uint32_t s, uint16_t a) {
  pool_arena_t *ar = &p->arenas[a];
  uint32_t first = s * p->ids_per_seg;
  /* Off the free list (its head, but for a shrink's lower one). */
  uint32_t *link = &p->seg_free_head;
  while (*link != s) link = &p->seg_link[*link];
  *link = p->seg_link[s];
  p->seg_arena[s] = a;
  p->seg_used[s] = 0;
  p->nseg_free--;
  pool_seg_emptied(p, s);
  ar->nseg++;
  ar->segs_taken++;
  /* After the free pages it has, lowest first: pages in use stay low. */
  for (uint32_t i = 0; i < ar->per_seg; i++) {
    p->refcnt[first + i] = 0;
    free_append(p, ar, first + i);
  }
  ar->nfree += ar->per_seg;
  p->nfree += ar->per_seg;
}

uint32_t pool_seg_detach_free(pool_t *p, uint32_t s) {
  pool_arena_t *ar = &p->arenas[p->seg_arena[s]];
  uint32_t first = s * p->ids_per_seg, end = first + ar->per_seg, k = 0, last = POOL_NOPAGE;
  uint32_t *link = &ar->free_head;
  while (*link != POOL_NOPAGE) {
    if (*link >= first && *link < end) {
      uint32_t q = *link;
      *link = p->pinref[q];
      p->pinref[q] = 0;
      k++;
    } else {
      last = *link;
      link = &p->pinref[*link];
    }
  }
  ar->free_tail = last;
  ar->nfree -= k;
  p->nfree -= k;
  return k;
}

void pool_seg_release(pool_t *p, uint32_t s) {
  pool_arena_t *ar = &p->arenas[p->seg_arena[s]];
  if (!p->seg_used[s]) pool_seg_filled(p, s); /* leaves the arena: no longer its empty one */
  ar->nseg--;
  ar->segs_given++;
  p->seg_arena[s] = POOL_NOARENA;
  p->seg_used[s] = 0;
  p->seg_link[s] = p->seg_free_head;
  p->seg_free_head = s;
  p->nseg_free++;
}

void pool_seg_uncarve(pool_t *p, uint32_t s) {
  (void)pool_seg_detach_free(p, s);
  pool_seg_release(p, s);
}

uint32_t pool_alloc(pool_t *p, uint16_t a) {
  pool_arena_t *ar = &p->arenas[a];
  uint32_t page = ar->free_head;
  ar->free_head = p->pinref[page];
  if (ar->free_head == POOL_NOPAGE) ar->free_tail = POOL_NOPAGE;
  ar->nfree--;
  p->nfree--;
  p->nused++;
  p->used_bytes += ar->stride;
  if (p->seg_used[page / p->ids_per_seg]++ == 0) pool_seg_filled(p, page / p->ids_per_seg);
  p->pinref[page] = 0; /* a link no more: no pins yet */
  p->refcnt[page] = 1;
  return page;
}

void pool_ref(pool_t *p, uint32_t page) {
  if (++p->refcnt[page] == 2) p->nshared++;
}

bool pool_unref(pool_t *p, uint32_t page) {
  uint32_t r = --p->refcnt[page];
  if (r == 1) p->nshared--;
  if (r) return false;
  pool_arena_t *ar = &p->arenas[pool_arena_of(p, page)];
  p->pinref[page] = ar->free_head; /* unpinned: the field is the link now */
  if (ar->free_head == POOL_NOPAGE) ar->free_tail = page;
  ar->free_head = page;
  ar->nfree++;
  p->nfree++;
  p->nused--;
  p->used_bytes -= ar->stride;
  uint32_t s = page / p->ids_per_seg;
  /* An arena no cache uses any more gives back each segment it empties. */
  if (--p->seg_used[s] == 0) {
    pool_seg_emptied(p, s);
    if (ar->ncaches == 0) {
      pool_seg_uncarve(p, s);
      if (!ar->nseg) ar->live = false;
    }
  }
  return true;
}

void pool_pin(pool_t *p, uint32_t page) {
  if (p->pinref[page]++ == 0) {
    p->npinned++;
    p->pinned_bytes += pool_page_stride(p, page);
  }
}

void pool_unpin(pool_t *p, uint32_t page) {
  if (--p->pinref[page] == 0) {
    p->npinned--;
    p->pinned_bytes -= pool_page_stride(p, page);
  }
}

bool pool_set_segments(pool_t *p, mem_t *m, uint32_t nseg) {
  if ((uint64_t)nseg * p->ids_per_seg >= POOL_NOPAGE) return false;
  if (nseg > p->nseg && !grow_arrays(p, m, nseg)) return false;
  uint32_t old = p->nseg;
  p->nseg = nseg;
  p->npages = nseg * p->ids_per_seg;
  if (nseg < old) (void)grow_arrays(p, m, nseg); /* smaller: only returns memory */
  pool_seg_free_rebuild(p); /* lowest first: pages in use stay low */
  return true;
}
