/* prefix.h: the content-hash prefix index: token ids, chained page hashes,
 * verified matches, and reclaiming cached pages (prefix.c; doc/prefix.md). */
#ifndef KVC_PREFIX_H
#define KVC_PREFIX_H

#include "core.h"

/* Seeds a new cache's chain root and makes its index. */
int prefix_cache_init(engine_t *eng, cache_t *c);
/* Drops every index entry of a cache (its sequences are gone already). */
void prefix_cache_clear(engine_t *eng, cache_t *c);
/* Drops a cached page from the index and frees it. */
void prefix_reclaim(engine_t *eng, ipage_t *ip);
/* Records token ids of a put of layers [l0, l1) into s's pages (blocks
 * reserved by the put), continues or cuts the chain of those layers (and
 * of any layer whose chain held other ids there), and hashes and indexes
 * the pages every layer's chain now covers. A layer-range put needs
 * s->x->layer_chain (put_target makes it). */
void prefix_put_tokens(engine_t *eng, seq_t *s, const engine_io_t *e, uint32_t l0, uint32_t l1,
                       const engine_pkey_t *key, uint32_t key_id, const span_tag_t *tags,
                       size_t ntags);
/* Positions [pos, end) of s were rewritten without ids (or moved): the
 * chain ends at pos and those pages' hashes are stale. */
void prefix_put_untokened(engine_t *eng, seq_t *s, uint64_t pos, uint64_t end);
/* Interns a key of tenant q (keys are per tenant); 0 or NOMEM (key_id 0 is
 * never used), *created (may be NULL) says whether it is new. With create
 * false an unknown key gives key_id 0. INVAL for a key too long;
 * QUOTA_KEYS when the tenant holds max_keys keys in use (unused ones are
 * collected first). Each code recorded. */
int prefix_key(engine_t *eng, quota_t *q, const engine_pkey_t *key, bool create,
               uint32_t *key_id, bool *created);
/* The key maps' sizes before a call interns keys, to shrink them back. */
typedef struct prefix_keys_cap {
  size_t keys, ids;
} prefix_keys_cap_t;
prefix_keys_cap_t prefix_keys_cap(const engine_t *eng);
/* Undoes the interning of a key by the call that just did it (nothing uses
 * it yet), shrinking the key maps back to cap. */
void prefix_key_forget(engine_t *eng, quota_t *q, const engine_pkey_t *key,
                       prefix_keys_cap_t cap);

/* Checks a list of span keys (what names it in the message): 0 or
 * KVC_E_INVAL recorded. */
int prefix_spans_check(engine_t *eng, const kvc_span_key_t *sp, size_t n, const char *what);
/* Resolves the span keys of sp[0..n) that overlap [lo, hi), clipped to it,
 * into out[] (room for n) in order: interned for tenant q when create (0,
 * or QUOTA_KEYS / NOMEM, having undone its own interning), else looked up
 * (SPAN_UNKNOWN when not interned). *nout gets how many. */
int prefix_spans_resolve(engine_t *eng, quota_t *q, const kvc_span_key_t *sp, size_t n,
                         uint64_t lo, uint64_t hi, bool create, span_tag_t *out, size_t *nout);
/* Forgets the keys out[0..n) interned (created), as prefix_key_forget. */
void prefix_spans_forget(engine_t *eng, quota_t *q, const kvc_span_key_t *sp,
                         const span_tag_t *out, size_t n, prefix_keys_cap_t cap);
/* Keys interned by q's tenant, counted (for the audit). */
uint32_t prefix_keys_of(const engine_t *eng, const quota_t *q);
/* Checks a match's arguments: 0 and the cache and key id, or an error;
 * the query's span keys are resolved until prefix_match_end. */
int prefix_match_args(engine_t *eng, uint32_t cache_id, const uint32_t *tokens, uint64_t n,
                      const engine_pkey_t *key, cache_t **c, uint32_t *key_id);
void prefix_match_end(engine_t *eng);
/* Matches tokens against c's index (pages into pages[], the engine's
 * scratch if NULL): whole pages, verified; returns how many. */
uint64_t prefix_match_pages(engine_t *eng, cache_t *c, const uint32_t *tokens, uint64_t n,
                            const engine_pkey_t *key, uint32_t key_id, uint32_t *pages);
/* Counts a match of n tokens that hit m pages and touches those pages. */
void prefix_match_done(engine_t *eng, cache_t *c, const uint32_t *pages, uint64_t m,
                       uint64_t n, engine_match_t *out);
/* The chain root of c under key (H(-1) of doc/prefix.md). */
void prefix_root(engine_t *eng, const cache_t *c, const engine_pkey_t *key, uint8_t out[32]);
/* The hash of page m of a query (tokens, and the span keys prefix_match_args
 * resolved) under prev into out, its ids and tags left in eng->page_ids and
 * eng->page_tags; false when the page holds a span key never interned here
 * (no indexed page can have it). */
bool prefix_query_hash(engine_t *eng, const cache_t *c, const uint32_t *tokens, uint64_t m,
                       const engine_pkey_t *key, const uint8_t prev[32], uint8_t out[32]);
/* What a match checks of an index hit ip for the page prefix_query_hash just
 * hashed to h: full hash, parent page, key, ids and tags. */
bool prefix_verify(const engine_t *eng, const ipage_t *ip, const uint8_t h[32], uint32_t parent,
                   uint32_t key_id);
/* The index entry of c under h's first 8 bytes, or NULL: its full hash may
 * differ (a collision), compare it. */
ipage_t *prefix_find(const cache_t *c, const uint8_t h[32]);
/* Enters ip (hash, parent, key, ids and tags set; its reference held by
 * the caller for the index) into c's index, whose room is reserved. */
void prefix_insert(engine_t *eng, cache_t *c, ipage_t *ip);
/* The hash ip must have under parent hash ph (NULL: a chain head) with its
 * ids and its key: for the audit. KVC_E_INTERNAL if its key is unknown. */
int prefix_expect(engine_t *eng, const ipage_t *ip, const uint8_t *ph, uint8_t out[32]);

/* For the tiers (tier.c): the bytes of an interned key (borrowed from the
 * engine; false for an unknown id). */
bool prefix_key_get(const engine_t *eng, uint32_t id, engine_pkey_t *out);

#endif
