/* rank.h: each tenant's caches in order of the pages they hold, most first,
 * kept as the pages change, so that the top N caches of a tenant are the
 * first N of its array (a Stats reply's caches: doc/protocol.md) and no
 * request walks every cache.
 *
 * The array of a tenant (quota_t.rank) is sorted by cache_stats_t.pages,
 * descending; each cache knows its place (cache_t.rank_pos). A page count
 * moves by one at a time (seq.c), so a cache changes places only with the
 * first (or last) cache of its own count, found by binary search:
 *
 *   pages:   [ 9 ][ 5 ][ 5 ][ 5 ][ 2 ]      cache C at pos 3 gains a page:
 *                  ^first 5  ^C                swap C with the first 5,
 *   pages:   [ 9 ][ 6 ][ 5 ][ 5 ][ 2 ]      then count it: still sorted.
 *                  ^C
 *
 * Ties have no set order. A new cache (no page) goes last; a dropped one
 * (no page left) swaps with the last and leaves.
 */
#ifndef KVC_RANK_H
#define KVC_RANK_H

#include "core.h"

/* Gives q an empty array with room for a few caches: 0 or KVC_E_NOMEM
 * (nothing kept). */
int rank_init(engine_t *eng, quota_t *q);
/* Frees q's array. */
void rank_deinit(engine_t *eng, quota_t *q);
/* Makes room for one more cache in q's array: 0 or KVC_E_NOMEM (no change).
 * rank_add cannot fail after it. */
int rank_reserve(engine_t *eng, quota_t *q);
/* Places c (no page yet) last in its tenant's array (room reserved). */
void rank_add(cache_t *c);
/* Takes c out of its tenant's array. */
void rank_remove(cache_t *c);
/* c holds one page more / one less: moves it, then counts the page in
 * c->st.pages. */
void rank_page_add(cache_t *c);
void rank_page_release(cache_t *c);

#endif
