/* pool.h: the page pool: segments over a caller's region, each carved into
 * the pages of one arena, refcounted (doc/design.md, "The pool").
 *
 * The region is nseg segments of seg_bytes. An arena is (tenant, page
 * size): its pages are exactly its caches' page bytes (rounded up to 64 B,
 * at least the grain), carved from segments it alone owns. A free segment
 * belongs to no arena; an arena takes one when it has no free page, and
 * gives one back when it empties it (resize.c, evict.c).
 *
 *   base
 *   | segment 0: arena 1 (2 MiB)  | segment 1: free | segment 2: arena 0 (256 KiB)  |
 *   | p0      | p1      | ...     |                 | q0 | q1 | q2 | ... | q127    |
 *
 * Page ids are dense per segment: page id = segment * ids_per_seg + slot,
 * ids_per_seg = seg_bytes / grain (the grain is the smallest page stride),
 * so every per-page array has npages = nseg * ids_per_seg entries and a
 * page's bytes are at base + segment * seg_bytes + slot * stride. The ids of
 * a segment past its arena's pages (and of a free segment) are never handed
 * out. All metadata lives in arrays beside the pages, never in them:
 *
 *   refcnt[i]  holders of page i: block tables, leases, the prefix index
 *              (page.h; 0: free)
 *   pinref[i]  page in use: of the block tables, those of pinned sequences
 *              (page pinned); free page: the next free page of its arena
 *              (POOL_NOPAGE: the last). A free page has no pins.
 *   plan[i]    scratch for eviction planning, 0 outside of it
 *
 * Allocation and release are O(1) (an arena's free list, through pinref).
 * 12 bytes of metadata per page id: 0.3% of a 4 KiB grain.
 */
#ifndef KVC_POOL_H
#define KVC_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "mem.h"

#define POOL_NOPAGE UINT32_MAX
#define POOL_NOARENA UINT16_MAX
#define POOL_ALIGN 64u        /* an arena's page stride is a multiple of this, at least */
#define POOL_ARENAS_MAX 4096u /* arenas alive at once */

typedef struct pool_arena {
  bool live;              /* the slot is in use */
  uint32_t tenant;        /* whose caches */
  uint32_t group;         /* and which of them may share it (0: all; the
                             daemon gives each shared cache a group: its
                             readers differ) */
  uint64_t uid;           /* never reused: a client tells a new arena in an old slot */
  uint64_t page_bytes;    /* its caches' page bytes */
  uint64_t stride;        /* bytes between its pages (page_bytes rounded up) */
  uint32_t per_seg;       /* pages a segment holds */
  uint32_t nseg;          /* segments it owns */
  uint32_t nempty;        /* of them, with no page in use */
  uint32_t nfree;         /* of its pages, free */
  uint32_t free_head;     /* first free page; POOL_NOPAGE: none */
  uint32_t free_tail;     /* last (a carved segment's pages join here) */
  uint32_t ncaches;       /* caches open in it */
  uint64_t segs_taken;    /* segments it took: free ones, or from another arena */
  uint64_t segs_given;    /* segments it gave back or up */
  uint32_t plan_segs;     /* eviction planning: segments the plan may take from it */
} pool_arena_t;

typedef struct pool {
  unsigned char *base;   /* borrowed region */
  uint64_t grain;        /* the smallest page stride */
  uint64_t align;        /* a page stride is a multiple of this (POOL_ALIGN or more) */
  uint64_t seg_bytes;    /* bytes of one segment, a multiple of the grain */
  uint32_t ids_per_seg;  /* seg_bytes / grain */
  uint32_t nseg;         /* segments in the region */
  uint32_t npages;       /* page ids: nseg * ids_per_seg */
  uint32_t nseg_free;    /* segments of no arena */
  uint32_t nseg_empty;   /* segments of an arena with no page in use (every arena's nempty) */
  uint32_t seg_free_head; /* the free segments, linked through seg_link */
  uint32_t *seg_link;
  uint64_t next_uid;
  uint32_t nfree;        /* free pages of every arena */
  uint32_t nused;        /* pages in use */
  uint32_t nshared;      /* pages with refcnt > 1 */
  uint32_t npinned;      /* pages in use with pinref > 0 */
  uint64_t pinned_bytes; /* their strides */
  uint64_t used_bytes;   /* strides of the pages in use */
  uint16_t *seg_arena;   /* per segment: its arena or POOL_NOARENA */
  uint32_t *seg_used;    /* per segment: its pages in use */
  pool_arena_t *arenas;  /* by arena id */
  uint32_t narenas;      /* slots ever used */
  uint32_t arenas_cap;   /* slots allocated */
  uint32_t *refcnt;
  uint32_t *pinref;      /* in use: pinned holders; free: the next free page */
  uint32_t *plan;
} pool_t;

/* A segment of an arena lost its last page in use, or got its first. */
static inline void pool_seg_emptied(pool_t *p, uint32_t s) {
  p->nseg_empty++;
  p->arenas[p->seg_arena[s]].nempty++;
}
static inline void pool_seg_filled(pool_t *p, uint32_t s) {
  p->nseg_empty--;
  p->arenas[p->seg_arena[s]].nempty--;
}

/* 0, KVC_E_INVAL (a grain not a multiple of 64, a segment not a multiple of
 * the grain or larger than the pool, more than 2^32-2 page ids),
 * KVC_E_NOMEM. seg_bytes 0: the grain (a segment of one page). max_arenas:
 * arenas alive at once (at most POOL_ARENAS_MAX). */
int pool_init(pool_t *p, mem_t *m, void *base, uint64_t pool_bytes, uint64_t grain,
              uint64_t seg_bytes, uint64_t align, uint32_t max_arenas);
void pool_deinit(pool_t *p, mem_t *m);

/* The stride of pages of page_bytes, and how many fit a segment (0: none). */
uint64_t pool_stride(const pool_t *p, uint64_t page_bytes);
/* The arena of (tenant, page_bytes), made if new (one more cache in it):
 * its id, or POOL_NOARENA when it cannot be (a page larger than a segment:
 * PAGESIZE; too many arenas: TOOMANY, in *code). */
uint16_t pool_arena_open(pool_t *p, uint32_t tenant, uint32_t group, uint64_t page_bytes,
                         int *code);
/* One cache fewer in arena a; the last gives its segments back (its pages
 * must all be free by then) and frees the slot. */
void pool_arena_close(pool_t *p, uint16_t a);
static inline pool_arena_t *pool_arena(const pool_t *p, uint16_t a) { return &p->arenas[a]; }

/* Gives free segment s to arena a: its pages join the arena's free list. */
void pool_seg_carve(pool_t *p, uint32_t s, uint16_t a);
/* Takes segment s (every page of it free) from its arena: free again. */
void pool_seg_uncarve(pool_t *p, uint32_t s);
/* The two halves of uncarving: s's free pages leave its arena's free list
 * (how many), and s (every page free and detached) becomes free. */
uint32_t pool_seg_detach_free(pool_t *p, uint32_t s);
void pool_seg_release(pool_t *p, uint32_t s);
/* Makes the free segments' list every segment of no arena, lowest first. */
void pool_seg_free_rebuild(pool_t *p);
/* A free segment below `below` (the list's first such), or UINT32_MAX. */
uint32_t pool_seg_free(const pool_t *p, uint32_t below);

/* Takes a free page of arena a (its nfree must be > 0); refcnt becomes 1. */
uint32_t pool_alloc(pool_t *p, uint16_t a);
void pool_ref(pool_t *p, uint32_t page);
/* Drops one reference; returns true if the page went back to its arena's
 * free list (it must be unpinned by then). */
bool pool_unref(pool_t *p, uint32_t page);
void pool_pin(pool_t *p, uint32_t page);
void pool_unpin(pool_t *p, uint32_t page);
/* Grows the per-page arrays and segment arrays for nseg segments (the new
 * ones free); false: out of memory (nothing changed). Shrinking: every
 * segment past nseg must be free. */
bool pool_set_segments(pool_t *p, mem_t *m, uint32_t nseg);

static inline uint32_t pool_seg_of(const pool_t *p, uint32_t page) {
  return page / p->ids_per_seg;
}
static inline uint16_t pool_arena_of(const pool_t *p, uint32_t page) {
  return p->seg_arena[page / p->ids_per_seg];
}
static inline uint64_t pool_page_stride(const pool_t *p, uint32_t page) {
  return p->arenas[pool_arena_of(p, page)].stride;
}
/* Bytes from base of page. */
static inline uint64_t pool_page_offset(const pool_t *p, uint32_t page) {
  uint32_t s = page / p->ids_per_seg, slot = page % p->ids_per_seg;
  return (uint64_t)s * p->seg_bytes + (uint64_t)slot * p->arenas[p->seg_arena[s]].stride;
}
static inline unsigned char *pool_page(const pool_t *p, uint32_t page) {
  return p->base + pool_page_offset(p, page);
}
/* A page's index in its arena's array: its segment times the pages a
 * segment of the arena holds, plus its slot. A client that maps each
 * segment s of the arena at s * per_seg * stride of a range of its own
 * (per_seg * stride bytes of it: a multiple of the system page when the
 * alignment is) sees the page at index * stride: one array, one stride,
 * with holes where other arenas' segments are. */
static inline uint64_t pool_page_index(const pool_t *p, uint32_t page) {
  uint32_t s = page / p->ids_per_seg;
  return (uint64_t)s * p->arenas[p->seg_arena[s]].per_seg + page % p->ids_per_seg;
}
/* Whether page names a carved page (of a segment's arena, within its pages). */
static inline bool pool_page_valid(const pool_t *p, uint32_t page) {
  if (page >= p->npages) return false;
  uint16_t a = pool_arena_of(p, page);
  return a != POOL_NOARENA && page % p->ids_per_seg < p->arenas[a].per_seg;
}

#endif
