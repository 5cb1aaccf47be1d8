/* engine_resize.h: growing and shrinking the pool under a live engine
 * (resize.c; doc/tiers.md, online resize).
 *
 * The region at engine_config_t.base is the caller's. The caller keeps it
 * mapped for the largest size it will ever grow to (the daemon reserves the
 * address range once and maps segments into it), so base never moves and
 * no pointer or offset the engine handed out changes meaning:
 *
 *   base                                    npages       new npages
 *   | page 0 | page 1 | ... | page n-1 |    | grown pages ... |
 *
 * Growing adds free pages at the end. Shrinking releases the end: the
 * pages there that are in use are first made fewer by eviction (LRU order,
 * as for a put), then the rest move below the new end (their bytes copied,
 * every reference rewritten: block tables, the prefix index); nothing a
 * client leased may lie there, since a lease is read in place.
 */
#ifndef KVC_ENGINE_RESIZE_H
#define KVC_ENGINE_RESIZE_H

#include "engine.h"

/* What a shrink did. */
typedef struct engine_shrink {
  uint64_t evicted_pages; /* freed by eviction (sequences and cached pages) */
  uint64_t moved_pages;   /* copied below the new end */
} engine_shrink_t;

/* The pool becomes pool_bytes (a larger multiple of page_bytes; the region
 * must hold it): the new pages are free. The pin limit and tenant limits
 * stay as they were set (in pages): set them again. INVAL (not larger,
 * more than 2^32-2 pages), NOMEM (nothing changed). */
int engine_pool_grow(engine_t *eng, uint64_t pool_bytes);

/* The pool becomes pool_bytes (smaller, at least one page), all or
 * nothing: KVC_E_FULL when what cannot be evicted (pinned sequences, leased
 * pages, tenant floors, puts and gets in flight) would not fit, KVC_E_BUSY
 * when a lease or a copy in flight holds a page of the released part (a
 * zero-copy reader reads it in place; retry once released), KVC_E_NOMEM;
 * the message says which and how many pages. Evictions made before a NOMEM
 * stay (they are what any put could have done). Fills *out (may be NULL). */
int engine_pool_shrink(engine_t *eng, uint64_t pool_bytes, engine_shrink_t *out);

#endif
