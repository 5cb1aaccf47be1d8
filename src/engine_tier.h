/* engine_tier.h: the engine's side of the disk tier (tier.c; doc/tiers.md).
 *
 * The engine does no I/O. What it offers a tier below memory is three
 * things, all on the engine's thread:
 *
 *   spill    a cached page of the prefix index that eviction reclaims is
 *            handed to a callback (metadata + bytes) just before its pool
 *            page is freed; the callback copies what it keeps
 *   probe    the chain hashes of a query's pages past those resident, so
 *            the caller can look them up in its own (disk) index
 *   import   a page read back: begin takes a pool page for it (evicting if
 *            it must), the caller fills the bytes (any thread), end verifies
 *            the metadata against the cache (layout, tenant-seeded chain
 *            hash under a resident parent) and indexes it as a cached page
 *
 *   memory:  [A0 A1 A2] (resident, indexed)   disk: [A3 A4] (by chain hash)
 *   match(A0..A4):  probe -> resident 3, hashes of pages 3, 4
 *                   import A3 (parent A2), then A4 (parent A3) -> match hits 5
 *
 * Only pages whose positions carry no span keys go to the tier (a span
 * key's interned id means nothing after a restart); they stay memory-only.
 */
#ifndef KVC_ENGINE_TIER_H
#define KVC_ENGINE_TIER_H

#include "engine.h"

/* One key as the tier stores it: its bytes. */
typedef struct engine_tier_key {
  uint8_t len;                   /* 0..KVC_MAX_KEY_BYTES */
  uint8_t bytes[KVC_MAX_KEY_BYTES];
} engine_tier_key_t;

/* What identifies an indexed page, beside its bytes. tokens has
 * page_tokens entries (borrowed: for spill, valid during the callback; for
 * import, the caller's). */
typedef struct engine_tier_meta {
  uint32_t tenant;               /* the cache's tenant number */
  char cache[KVC_MAX_NAME + 1];  /* the cache's name */
  kvc_layout_t layout;           /* the cache's layout (normalized) */
  uint32_t hash_kind;            /* kvc_hash_t of the chain */
  uint32_t page_tokens;
  uint64_t data_bytes;           /* bytes of the page (the layout's, not the pool's) */
  uint8_t hash[32];              /* the page's chain hash */
  uint8_t parent[32];            /* its parent's chain hash (zeros for a head) */
  bool head;                     /* first page of its chain */
  engine_tier_key_t salt, extra; /* the chain's key */
  const uint32_t *tokens;        /* page_tokens ids */
  uint64_t more;                 /* spill: cached pages the eviction reclaiming this one
                                    plans to reclaim after it (a bound: some may not be
                                    spilled, or be kept already); 0 elsewhere */
} engine_tier_meta_t;

/* Called with a page about to leave memory (bytes: data_bytes of them). */
typedef void (*engine_spill_fn)(void *ctx, const engine_tier_meta_t *m, const void *bytes);

/* Sets (fn NULL: clears) the spill callback. Borrows ctx. */
void engine_set_spill(engine_t *eng, engine_spill_fn fn, void *ctx);

/* Calls fn for every indexed page that could go to the tier (no span
 * keys), resident ones held by sequences too: a clean stop persists them.
 * Returns how many. */
size_t engine_tier_each(engine_t *eng, engine_spill_fn fn, void *ctx);

/* The query's whole pages (at most cap past the resident ones): *resident
 * = the leading pages whose chain hash is in the cache's index now, and
 * hashes[0..*nout) the chain hashes of the pages after them, in order.
 * Counts nothing (the match that follows does); the resident pages become
 * the most recent, as a hit makes them, so that importing the pages after
 * them does not evict them. Stops at a page whose positions carry a span
 * key. NOCACHE, INVAL (key too long, NULL), RANGE. */
int engine_tier_probe(engine_t *eng, uint32_t cache_id, const uint32_t *tokens, uint64_t n,
                      const engine_pkey_t *key, uint8_t (*hashes)[32], size_t cap,
                      uint64_t *resident, size_t *nout);

/* A page coming back: takes a pool page for cache_id (free, or made free by
 * eviction as a put would: FULL or QUOTA_PAGES when it cannot, nothing
 * changed), held by the job alone until engine_tier_import_end. *bytes is
 * where the page's data_bytes go; another thread may fill them. Returns new
 * *job; NOCACHE, NOMEM. */
typedef struct engine_tier_job engine_tier_job_t;
int engine_tier_import_begin(engine_t *eng, uint32_t cache_id, engine_tier_job_t **job,
                             void **bytes);

/* Gives the job's page back unused (freed, unless something took it
 * meanwhile), the job freed; no error. NULL is a no-op. */
void engine_tier_import_abort(engine_t *eng, engine_tier_job_t *job);

/* Ends the job (frees it). With ok (the bytes were read and checked), m is
 * verified against the cache: its tenant, name, layout, hash kind, page
 * geometry; its parent is an indexed page of the cache with hash m->parent
 * (or m->head); and m->hash is the chain hash of the parent's hash, the ids
 * and the key. Then the page is indexed as a cached page, the most recent.
 * Anything else frees the page: NOCACHE (dropped meanwhile), EXISTS (the
 * hash is indexed already), INVAL (does not verify; message says what),
 * QUOTA_KEYS, NOMEM. */
int engine_tier_import_end(engine_t *eng, engine_tier_job_t *job, const engine_tier_meta_t *m,
                           bool ok);

#endif
