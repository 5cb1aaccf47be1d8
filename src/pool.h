/* pool.h: the page pool, fixed-size pages over a caller's region, refcounted.
 *
 * Pages are identified by index; page i's bytes are base + i * page_bytes.
 * All metadata lives in arrays beside the pages, never in them:
 *
 *   refcnt[i]  holders of page i: block tables, leases, the prefix index
 *              (page.h; 0: free)
 *   pinref[i]  page in use: of the block tables, those of pinned sequences
 *              (page pinned); free page: the next free page (POOL_NOPAGE:
 *              the last). A free page has no pins, so the field is spare.
 *   plan[i]    scratch for eviction planning, 0 outside of it
 *
 *   the free list, through pinref, popped and pushed at free_head:
 *
 *     free_head = 5    pinref:  [5] = 2  [2] = 9  [9] = NOPAGE     nfree = 3
 *     pool_alloc -> 5, free_head = 2;   pool_unref(7) frees 7: [7] = 2, head 7
 *
 * Allocation and release are O(1). 12 bytes of metadata per page: 0.6% of
 * a 2 KiB page, 0.3% of a 4 KiB one, 0.0006% of a 2 MiB one.
 */
#ifndef KVC_POOL_H
#define KVC_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "mem.h"

#define POOL_NOPAGE UINT32_MAX

typedef struct pool {
  unsigned char *base;   /* borrowed region */
  uint64_t page_bytes;   /* bytes of one page */
  uint32_t npages;       /* pages in the region */
  uint32_t nfree;        /* pages on the free list */
  uint32_t free_head;    /* first page of the free list; POOL_NOPAGE: none */
  uint32_t nshared;      /* pages with refcnt > 1 */
  uint32_t npinned;      /* pages in use with pinref > 0 */
  uint32_t *refcnt;
  uint32_t *pinref;      /* in use: pinned holders; free: the next free page */
  uint32_t *plan;
} pool_t;

/* 0, KVC_E_INVAL (fewer than 1 or more than 2^32-2 pages), KVC_E_NOMEM. */
int pool_init(pool_t *p, mem_t *m, void *base, uint64_t pool_bytes, uint64_t page_bytes);
void pool_deinit(pool_t *p, mem_t *m);
/* Takes a free page (nfree must be > 0); its refcnt becomes 1. */
uint32_t pool_alloc(pool_t *p);
void pool_ref(pool_t *p, uint32_t page);
/* Drops one reference; returns true if the page went back to the free list
 * (it must be unpinned by then). */
bool pool_unref(pool_t *p, uint32_t page);
void pool_pin(pool_t *p, uint32_t page);
void pool_unpin(pool_t *p, uint32_t page);
/* Makes the free list every page of the npages with refcnt 0, lowest
 * first (after the pool grew or shrank: resize.c). */
void pool_free_rebuild(pool_t *p);
static inline unsigned char *pool_page(const pool_t *p, uint32_t page) {
  return p->base + (uint64_t)page * p->page_bytes;
}

#endif
