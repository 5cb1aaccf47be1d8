/* engine_tier.h: the engine's one tier API (tier.c; doc/tiers.md,
 * doc/cluster.md): what leaves memory, what a match asks of the tiers
 * below, what comes back and how it is verified and imported. The daemon's
 * tiers (the disk, the cluster, a test's) are its users, all in the same
 * way.
 *
 * The engine does no I/O. What it offers a tier below memory, all on the
 * engine's thread:
 *
 *   out     hooks: a page entered the index (indexed), a cached page is
 *           about to leave memory under pressure (reclaimed: its identity
 *           and bytes, its last look); engine_tier_each walks every
 *           indexed page (a clean stop keeps them); export/hold give an
 *           indexed page by its chain hash (a write behind the put)
 *   probe   the query's pages a match finds here (made the most recent,
 *           as a hit makes them) and the chain hashes of the pages after
 *           them: what the tier looks for
 *   import  a page read back goes into a pool page taken for it (begin;
 *           any thread fills it), then into the index only under the hash
 *           this engine recomputes from the caller's own query (import):
 *           a tier can withhold pages, never plant them
 *
 *   memory: [A0 A1 A2] (indexed)       tier: [A3 A4] (by chain hash)
 *   probe(A0..A4)   -> local 3, hashes of pages 3, 4
 *   begin x2, fill  -> two pool pages held by their jobs
 *   import(A0..A4, first 3, [A3 job, A4 job]) -> each hash recomputed from
 *                      the query under the one before: match hits 5
 */
#ifndef KVC_ENGINE_TIER_H
#define KVC_ENGINE_TIER_H

#include "engine.h"

/* One key as a tier stores it: its bytes. */
typedef struct engine_tier_key {
  uint8_t len;                   /* 0..KVC_MAX_KEY_BYTES */
  uint8_t bytes[KVC_MAX_KEY_BYTES];
} engine_tier_key_t;

/* An indexed page as a tier sees it: its identity and its bytes. Borrowed
 * from the engine (its pool page and metadata) for the hook's call, or
 * until the next call that may change the index (export). A tier that
 * reads one back from its own store fills the same struct (bytes and
 * cache_id aside). */
typedef struct engine_page {
  uint32_t cache_id;             /* this engine's number of the cache */
  uint32_t tenant;               /* the cache's tenant number */
  char cache[KVC_MAX_NAME + 1];  /* the cache's name */
  kvc_layout_t layout;           /* the cache's layout (normalized) */
  uint32_t hash_kind;            /* kvc_hash_t of the chain */
  uint32_t page_tokens;
  uint64_t data_bytes;           /* bytes of the page (the layout's, not the pool's) */
  uint8_t hash[32];              /* its chain hash (xxh3: 16 bytes, then zeros) */
  uint8_t parent[32];            /* its parent's chain hash (zeros for a head) */
  bool head;                     /* first page of its chain */
  bool portable;                 /* its identity holds outside this engine's life: no span
                                    key on its positions (an interned id means nothing
                                    after a restart) and its key known. Only such a page
                                    may outlive the process (the disk keeps no other) */
  engine_tier_key_t salt, extra; /* the chain's key */
  const uint32_t *tokens;        /* page_tokens ids */
  const void *bytes;             /* data_bytes: K, V and scales of every layer */
  uint64_t more;                 /* reclaimed: cached pages the eviction reclaiming this
                                    one plans to reclaim after it (a bound: some may not
                                    be kept); 0 elsewhere */
} engine_page_t;

/* ---- out ------------------------------------------------------------------------ */

typedef void (*engine_page_fn)(void *ctx, const engine_page_t *page);

/* Called back from inside the engine: neither may call the engine. */
typedef struct engine_tier_hooks {
  void *ctx;
  /* A page of cache_id entered the index under hash (a put, not an import). */
  void (*indexed)(void *ctx, uint32_t cache_id, const uint8_t hash[32]);
  /* A cached page is being reclaimed under pressure (before its pool page
   * is freed): page is valid only during the call, copy what is kept. */
  engine_page_fn reclaimed;
} engine_tier_hooks_t;

/* Sets the hooks (NULL or NULL members: none); borrows h->ctx. */
void engine_set_tier_hooks(engine_t *eng, const engine_tier_hooks_t *h);

/* Calls fn for every indexed page, those held by sequences too (a clean
 * stop keeps them). Returns how many. */
size_t engine_tier_each(engine_t *eng, engine_page_fn fn, void *ctx);

/* The indexed page of cache_id with chain hash `hash` into *out (borrowed,
 * see engine_page_t). KVC_E_NOCACHE; KVC_E_NOSEQ when no such page is
 * indexed (reclaimed meanwhile). */
int engine_page_export(engine_t *eng, uint32_t cache_id, const uint8_t hash[32],
                       engine_page_t *out);

/* engine_page_export, and the page held until engine_page_release: its
 * bytes stay as they are (whatever the index and the sequences do
 * meanwhile) while a thread outside the engine reads them, as a lease
 * keeps a page. The codes of export, and KVC_E_NOMEM. */
typedef struct engine_hold engine_hold_t;
int engine_page_hold(engine_t *eng, uint32_t cache_id, const uint8_t hash[32],
                     engine_page_t *out, engine_hold_t **hold);
/* Lets a held page go (freed if nothing else holds it). NULL is a no-op. */
void engine_page_release(engine_t *eng, engine_hold_t *hold);

/* ---- probe ---------------------------------------------------------------------- */

/* The pages of a query past what the cache holds: *local gets the pages a
 * match would find (verified as a match verifies, nothing counted), and
 * they become the most recent, as a hit makes them, so that importing the
 * pages after them does not evict them; out[0..*nout) the chain hashes of
 * pages local, local + 1, ... (at most cap), stopping at a page with a span
 * key never interned here; before (may be NULL) the hash of page local - 1
 * when local > 0. NOCACHE, INVAL (key too long, NULL), RANGE. */
int engine_tier_probe(engine_t *eng, uint32_t cache_id, const uint32_t *tokens, uint64_t n,
                      const engine_pkey_t *key, uint64_t *local, uint8_t before[32],
                      uint8_t (*out)[32], size_t cap, size_t *nout);

/* ---- import --------------------------------------------------------------------- */

/* A page coming back: takes a pool page for cache_id (free, or made free by
 * eviction as a put would: FULL or QUOTA_PAGES when it cannot, nothing
 * changed), held by the job alone until engine_tier_import takes it or
 * engine_tier_import_abort lets it go. *bytes is where the page's
 * *nbytes (may be NULL) go; another thread may fill them. Returns a new
 * *job; NOCACHE, NOMEM. */
typedef struct engine_tier_job engine_tier_job_t;
int engine_tier_import_begin(engine_t *eng, uint32_t cache_id, engine_tier_job_t **job,
                             void **bytes, uint64_t *nbytes);

/* Gives the job's page back unused (freed, unless something took it
 * meanwhile), the job freed; no error. NULL is a no-op. */
void engine_tier_import_abort(engine_t *eng, engine_tier_job_t *job);

/* One page a tier gives back: the chain hash it was stored under and the
 * page's bytes, in one of three ways. Borrowed. */
typedef struct engine_page_in {
  const uint8_t *hash;
  /* bytes: exactly the cache's page of bytes, copied in. */
  const void *bytes;
  /* Or, fill set: called (on the engine's thread, inside the import) with
   * the pool page the page goes to; writes its n bytes there and returns
   * true, or false to refuse it (a check of the bytes failed): the import
   * stops at that page, which is freed. It may not call the engine. */
  bool (*fill)(void *arg, void *dst, uint64_t n);
  void *arg;
  /* Or, job set: the page is in the pool already, taken for this cache by
   * engine_tier_import_begin and filled: the import indexes that very
   * page, with no copy and no room to make. Every page of one import has a
   * job, or none. */
  engine_tier_job_t *job;
} engine_page_in_t;

/* Takes pages [first, first + n) of a query back into the index as cached
 * pages (matchable, held by the index alone, the most recent of the default
 * priority). Pages [0, first) must be indexed; each page's chain hash is
 * recomputed from the query (tokens, key, span keys) under the one before
 * it and must equal in[i].hash, else the import stops there (counted in
 * hash_verify_failed). A page indexed meanwhile is kept, not replaced. Of
 * pages given as jobs, those imported (the first *imported) are taken:
 * their jobs end; the others stay the caller's (engine_tier_import_abort).
 * Room for the others is made by eviction as for a put (the query's
 * indexed pages are held meanwhile); when all of them do not fit, as many
 * leading pages as do. *imported gets how many pages were taken (0 is no
 * error). The key is interned (QUOTA_KEYS). NOCACHE, INVAL, RANGE, NOMEM,
 * QUOTA_KEYS; FULL or QUOTA_PAGES when not even one page fits. */
int engine_tier_import(engine_t *eng, uint32_t cache_id, const uint32_t *tokens, uint64_t n,
                       const engine_pkey_t *key, uint64_t first, const engine_page_in_t *in,
                       size_t nin, size_t *imported);

#endif
