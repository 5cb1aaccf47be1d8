/* topcaches.h: which caches a Stats reply shows when it asks for the top N
 * (doc/protocol.md, "Stats"): the N holding the most pages among those a
 * viewer may see, merged from the engine's ranking of each tenant's caches
 * (src/rank.h). The cost is N and the tenants merged, never the caches. */
#ifndef KVCD_TOPCACHES_H
#define KVCD_TOPCACHES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server.h" /* arena_t (daemon/arena.h; src/ has an arena.h of its own), engine.h */

/* Whether the viewer may see cache_id of tenant. */
typedef bool (*topcaches_sees_fn)(void *ctx, uint32_t tenant, uint32_t cache_id);

/* Fills ids with up to n cache ids of the tenants ts[0..nt), most pages
 * first (ties in no set order), those sees (NULL: every one) lets through.
 * Borrows ts; scratch comes from a. Returns how many, or 0 when a is out of
 * memory (*nomem set). */
size_t topcaches_pick(engine_t *eng, const uint32_t *ts, size_t nt, topcaches_sees_fn sees,
                      void *ctx, size_t n, uint32_t *ids, arena_t *a, bool *nomem);

#endif
