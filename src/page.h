/* page.h: references to pool pages and the token metadata beside them
 * (page.c), beneath sequences, leases and the prefix index. */
#ifndef KVC_PAGE_H
#define KVC_PAGE_H

#include "core.h"

/* The token metadata of page, or NULL (also before any put carried ids: the
 * per-page arrays are allocated on first use, and for POOL_NOPAGE, a table
 * entry with no page). */
static inline ipage_t *page_meta(const engine_t *eng, uint32_t page) {
  return eng->ip && page != POOL_NOPAGE ? eng->ip[page] : NULL;
}
/* Allocates the per-page metadata arrays if not yet; 0 or NOMEM. */
int page_meta_arrays(engine_t *eng);
/* Frees them again: only for the put that allocated them and then failed
 * (no page is indexed, the scratch holds nothing). */
void page_meta_arrays_drop(engine_t *eng);
/* Preallocates n metadata blocks a call will take (before anything changes);
 * 0 or NOMEM (none kept). unreserve frees what the call did not take. */
int page_meta_reserve(engine_t *eng, uint32_t page_tokens, uint64_t n);
void page_meta_unreserve(engine_t *eng);
/* Gives page a fresh metadata block from the reserve. */
ipage_t *page_meta_take(engine_t *eng, const cache_t *c, uint32_t page);
/* Gives the copy made on write the metadata of the original (same bytes,
 * same place in the writer's chain). */
void page_meta_copied(engine_t *eng, uint32_t from, uint32_t to);

/* Takes a free page (one must be free) for a sequence of c: refcnt 1,
 * counted in bytes_used and against c's tenant. */
uint32_t page_alloc(engine_t *eng, const cache_t *c);
/* One pinned holder more / less; the first and last count the page as
 * pinned for its tenant. */
void page_pin(engine_t *eng, uint32_t page);
void page_unpin(engine_t *eng, uint32_t page);
/* A reference more: an indexed page leaves the cached state. */
void page_ref(engine_t *eng, uint32_t page);
/* A reference less: the last frees the page (and its metadata); an indexed
 * page left to the index alone becomes cached, on list prio. */
void page_unref(engine_t *eng, const cache_t *c, uint32_t page, uint8_t prio);
/* page_unref for a holder that knows only the layout's page bytes (a lease,
 * whose cache may be gone). */
void page_unref_bytes(engine_t *eng, uint64_t layout_bytes, uint32_t page, uint8_t prio);
/* Moves the cached-page gauges of c and the engine by delta. */
void page_cached_count(engine_t *eng, cache_t *c, int delta);
/* The pool counts a page with two references as shared; for an indexed page
 * one is the index's: index_sole counts those, for the gauges. */
void page_index_sole(engine_t *eng, uint32_t page, uint32_t before, uint32_t after);

#endif
