/* engine_tier.h: the engine's one tier API (tier.c; doc/tiers.md,
 * doc/cluster.md): what leaves memory, what a match asks of the tiers
 * below, what comes back and how it is verified and imported. The daemon's
 * tiers (the disk, the cluster, a test's) are its users.
 *
 * The engine does no I/O. What it offers a tier below memory, all on the
 * engine's thread:
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

/* ---- indexed pages out of and back into the index, by chain hash ----------
 * A tier behind the pool (the cluster of doc/cluster.md, a disk) keeps pages
 * of the prefix index elsewhere and brings them back as indexed pages. The
 * engine says which pages it indexes and which it is about to reclaim
 * (hooks), hands out an indexed page's bytes and identity (export), names
 * the pages of a query past what it holds (hashes), and takes pages back
 * (import) only once it has recomputed each one's chain hash from the query
 * itself: a tier can withhold pages, never plant them. */

/* An indexed page as a tier stores it. Borrowed from the engine (its pool
 * page and metadata) until the next call that may change the index. */
typedef struct engine_page {
  uint32_t cache_id;
  uint32_t tenant;
  uint8_t hash[32];       /* its chain hash (xxh3: 16 bytes, then zeros) */
  uint8_t parent[32];     /* the page before it in its chain (zeros: a head) */
  bool has_parent;
  uint32_t page_tokens;
  const uint32_t *tokens; /* its page_tokens token ids */
  const void *bytes;      /* the layout's page bytes (K, V, scales of every layer) */
  uint64_t nbytes;
} engine_page_t;

/* Called back from inside the engine: neither may call the engine. */
typedef struct engine_tier_hooks {
  void *ctx;
  /* A page of cache_id entered the index under hash (a put, not an import). */
  void (*indexed)(void *ctx, uint32_t cache_id, const uint8_t hash[32]);
  /* A cached page is being reclaimed under pressure: page is valid only
   * during the call (copy what is kept). */
  void (*reclaimed)(void *ctx, const engine_page_t *page);
} engine_tier_hooks_t;

/* Sets the hooks (NULL members: none); borrows h->ctx. */
void engine_set_tier_hooks(engine_t *eng, const engine_tier_hooks_t *h);

/* The pages of a query past what the cache holds: *local gets the pages a
 * match would find (nothing counted or touched), out[0..*nout) the chain
 * hashes of pages local, local + 1, ... (at most cap), stopping at a page
 * with a span key never interned here; before (may be NULL) the hash of
 * page local - 1 when local > 0. NOCACHE, INVAL, RANGE. */
int engine_prefix_hashes(engine_t *eng, uint32_t cache_id, const uint32_t *tokens, uint64_t n,
                         const engine_pkey_t *key, uint64_t *local, uint8_t before[32],
                         uint8_t (*out)[32], size_t cap, size_t *nout);

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

/* One page a tier gives back: the chain hash it was stored under and the
 * layout's page bytes (exactly the cache's page of bytes). Borrowed. */
typedef struct engine_page_in {
  const uint8_t *hash;
  const void *bytes;
  /* Or, fill set: called (on the engine's thread, inside the import) with
   * the pool page the page goes to; writes its n bytes there and returns
   * true, or false to refuse it (a check of the bytes failed): the import
   * stops at that page, which is freed. It may not call the engine. */
  bool (*fill)(void *arg, void *dst, uint64_t n);
  void *arg;
  /* Or, job set: the page is in the pool already, taken for this cache by
   * engine_tier_import_begin (engine_tier.h) and filled: the import indexes
   * that very page, with no copy and no room to make. Every page of one
   * import has a job, or none. */
  struct engine_tier_job *job;
} engine_page_in_t;

/* Takes pages [first, first + n) of a query back into the index as cached
 * pages (matchable, held by the index alone, the most recent of the default
 * priority). Of pages given as jobs, those imported (the first *imported)
 * are taken: their jobs end; the others stay the caller's
 * (engine_tier_import_end with ok false frees them). Pages [0, first) must be indexed; each page's chain hash is
 * recomputed from the query (tokens, key, span keys) under the one before
 * it and must equal in[i].hash, else the import stops there (counted in
 * hash_verify_failed). A page indexed meanwhile is kept, not replaced. Room
 * is made by eviction as for a put (the query's indexed pages are held
 * meanwhile); when all of them do not fit, as many leading pages as do.
 * *imported gets how many pages were taken (0 is no error). The key is
 * interned (QUOTA_KEYS). NOCACHE, INVAL, RANGE, NOMEM, QUOTA_KEYS; FULL or
 * QUOTA_PAGES when not even one page fits. */
int engine_prefix_import(engine_t *eng, uint32_t cache_id, const uint32_t *tokens, uint64_t n,
                         const engine_pkey_t *key, uint64_t first, const engine_page_in_t *in,
                         size_t nin, size_t *imported);

#endif
