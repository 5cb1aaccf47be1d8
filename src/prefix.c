/* prefix.c: the content-hash prefix index: token ids per page, chained page
 * hashes, verified matches, attach, and the cached state of indexed pages.
 *
 *   chain of one prompt (T tokens a page), key = (salt, extra):
 *
 *   H(-1) = hash(seed || salt)
 *   page 0 [t0 .. tT-1]      H0 = hash(H(-1) || ids || extra)   parent NOPAGE
 *   page 1 [tT .. t2T-1]     H1 = hash(H0 || ids || extra)      parent page 0
 *   ...
 *   index: first 8 bytes of Hi -> ipage of page i  (one entry per hash)
 *
 * A match recomputes the chain from the query and, at every step, compares
 * the indexed page's full hash, token ids, parent page and key: a hash
 * collision is counted (hash_verify_failed) and ends the match; it never
 * serves another prompt's pages. An indexed page holds a pool reference of
 * the index's own: it never changes in place (writes copy it) and stays,
 * "cached", after its last sequence goes, until eviction reclaims it.
 */
#include "prefix.h"

#include <openssl/evp.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "evlog.h"
#include "lru.h"
#include "page.h"
#include "quota.h"
#include "seq.h"

#define NOPAGE POOL_NOPAGE
#define KEY_MAX 64u

typedef struct pkey {
  uint8_t digest[32]; /* SHA-256 of (tenant, salt_len, salt, extra_len, extra) */
  uint32_t id;
  bool used;          /* collection: some page or sequence names it */
  quota_t *q;         /* the tenant that interned it (keys are per tenant) */
  uint8_t salt_len, extra_len;
  uint8_t salt[KEY_MAX], extra[KEY_MAX]; /* kept for the audit's recomputation */
} pkey_t;

/* ---- hashing ---------------------------------------------------------------- */

/* One hash computation with the engine's hash and width. */
typedef struct hasher {
  engine_t *eng;
  XXH3_state_t x;
} hasher_t;

static void h_init(hasher_t *h, engine_t *eng) {
  h->eng = eng;
  if (eng->hash_kind == KVC_HASH_XXH3) XXH3_128bits_reset(&h->x);
  else EVP_DigestInit_ex(eng->md_ctx, EVP_sha256(), NULL);
}

static void h_update(hasher_t *h, const void *p, size_t n) {
  if (h->eng->hash_kind == KVC_HASH_XXH3) XXH3_128bits_update(&h->x, p, n);
  else EVP_DigestUpdate(h->eng->md_ctx, p, n);
}

static void h_final(hasher_t *h, uint8_t out[32]) {
  engine_t *eng = h->eng;
  memset(out, 0, 32);
  if (eng->hash_kind == KVC_HASH_XXH3) {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&h->x));
    memcpy(out, c.digest, 16);
  } else {
    unsigned len = 32;
    EVP_DigestFinal_ex(eng->md_ctx, out, &len);
  }
  if (eng->hash_bits && eng->hash_bits < 256) { /* test hook: force collisions */
    uint32_t keep = eng->hash_bits;
    for (uint32_t b = 0; b < 32; b++) {
      if (keep >= 8) keep -= 8;
      else {
        out[b] &= (uint8_t)(0xffu << (8 - keep));
        keep = 0;
      }
    }
  }
}

static uint64_t hash_key64(const uint8_t h[32]) {
  uint64_t k;
  memcpy(&k, h, 8);
  return k;
}

/* H(-1): the chain's root for a cache and salt. */
static void chain_root(engine_t *eng, const cache_t *c, const engine_pkey_t *key,
                       uint8_t out[32]) {
  hasher_t h;
  h_init(&h, eng);
  h_update(&h, c->seed, 32);
  if (key) h_update(&h, key->salt, key->salt_len);
  h_final(&h, out);
}

static const pkey_t *key_by_id(const engine_t *eng, uint32_t id) {
  return id ? hmap_get(&eng->key_ids, id) : NULL;
}

/* H(parent || ids || extra), and when some position has a span key, each
 * run of positions under one key as (first, count, the key's digest), then
 * the number of runs: a page without span keys hashes as it always did.
 * false if a tag names no key (it cannot be hashed). */
static bool page_hash(engine_t *eng, const uint8_t parent[32], const uint32_t *tokens,
                      const uint32_t *tags, uint32_t T, const engine_pkey_t *key,
                      uint8_t out[32]) {
  hasher_t h;
  h_init(&h, eng);
  h_update(&h, parent, 32);
  h_update(&h, tokens, (size_t)T * sizeof *tokens);
  if (key) h_update(&h, key->extra, key->extra_len);
  uint32_t runs = 0;
  for (uint32_t i = 0; tags && i < T;) {
    uint32_t j = i + 1;
    while (j < T && tags[j] == tags[i]) j++;
    if (tags[i]) {
      const pkey_t *k = key_by_id(eng, tags[i]);
      if (!k) {
        h_final(&h, out);
        return false;
      }
      uint32_t run[2] = {i, j - i};
      h_update(&h, run, sizeof run);
      h_update(&h, k->digest, 32);
      runs++;
    }
    i = j;
  }
  if (runs) {
    uint32_t tail[2] = {runs, 0xffffffffu};
    h_update(&h, tail, sizeof tail);
  }
  h_final(&h, out);
  return true;
}

int prefix_cache_init(engine_t *eng, cache_t *c) {
  /* The tenant first: no tenant can compute, let alone plant, a chain of
   * another's (a client's salt only narrows inside its tenant). */
  EVP_MD_CTX *ctx = eng->md_ctx;
  unsigned len = 32;
  EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
  EVP_DigestUpdate(ctx, "kvcached-prefix-v3", 18);
  EVP_DigestUpdate(ctx, c->q->ident, sizeof c->q->ident);
  EVP_DigestUpdate(ctx, c->name, strlen(c->name));
  EVP_DigestUpdate(ctx, &c->layout, offsetof(kvc_layout_t, attn));
  EVP_DigestFinal_ex(ctx, c->seed, &len);
  hmap_init(&c->index);
  return 0;
}

/* ---- keys -------------------------------------------------------------------- */

/* The key's SHA-256 digest (in tenant q's namespace) into d; KVC_E_INVAL
 * for a bad key. */
static int key_digest(engine_t *eng, const quota_t *q, const engine_pkey_t *key, uint8_t d[32]) {
  static const engine_pkey_t empty = {NULL, 0, NULL, 0};
  if (!key) key = &empty;
  if (key->salt_len > KEY_MAX || key->extra_len > KEY_MAX ||
      (key->salt_len && !key->salt) || (key->extra_len && !key->extra))
    return KVC_E_INVAL;
  uint64_t sl = key->salt_len, xl = key->extra_len;
  unsigned len = 32;
  EVP_MD_CTX *ctx = eng->md_ctx;
  EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
  EVP_DigestUpdate(ctx, q->ident, sizeof q->ident);
  EVP_DigestUpdate(ctx, &sl, sizeof sl);
  EVP_DigestUpdate(ctx, key->salt, key->salt_len);
  EVP_DigestUpdate(ctx, &xl, sizeof xl);
  EVP_DigestUpdate(ctx, key->extra, key->extra_len);
  EVP_DigestFinal_ex(ctx, d, &len);
  return 0;
}

static int key_cmp(const void *a, const void *b) {
  uint32_t x = (*(const pkey_t *const *)a)->id, y = (*(const pkey_t *const *)b)->id;
  return (x > y) - (x < y);
}

static void key_mark(pkey_t **by_id, uint32_t n, uint32_t id) {
  if (!id) return;
  uint32_t lo = 0, hi = n;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (by_id[mid]->id < id) lo = mid + 1;
    else hi = mid;
  }
  if (lo < n && by_id[lo]->id == id) by_id[lo]->used = true;
}

/* Frees the keys no page and no sequence names: O((pages + sequences) log
 * keys). Best effort: out of memory it frees nothing. Returns how many. */
static uint32_t keys_collect(engine_t *eng) {
  uint32_t n = 0;
  pkey_t **by_id = mem_alloc(&eng->mem, (size_t)(eng->nkeys ? eng->nkeys : 1) * sizeof *by_id);
  if (!by_id) return 0;
  size_t pos = 0;
  pkey_t *k;
  while ((k = hmap_next(&eng->keys, &pos, NULL))) {
    k->used = false;
    by_id[n++] = k;
  }
  qsort(by_id, n, sizeof *by_id, key_cmp);
  for (uint32_t page = 0; eng->ip && page < eng->pool.npages; page++) {
    const ipage_t *ip = eng->ip[page];
    if (!ip) continue;
    key_mark(by_id, n, ip->key);
    const uint32_t *tags = ipage_tags_c(ip, ip->cache->g.T), *last = NULL;
    for (uint32_t t = 0; t < ip->cache->g.T; t++)
      if (tags[t] && (!last || *last != tags[t])) key_mark(by_id, n, *(last = &tags[t]));
  }
  for (uint32_t ci = 0; ci < eng->ncaches; ci++) {
    const cache_t *c = eng->caches[ci];
    size_t sp = 0;
    const seq_t *s;
    while (c && (s = hmap_next(&c->seqs, &sp, NULL))) key_mark(by_id, n, s->chain_key);
  }
  for (const put_flight_t *j = eng->put_jobs; j; j = j->next) {
    key_mark(by_id, n, j->key_id); /* interned at its begin, used at its end */
    for (size_t i = 0; i < j->ntags; i++) key_mark(by_id, n, j->tags[i].id);
  }
  uint32_t freed = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (by_id[i]->used) continue;
    hmap_remove(&eng->keys, hash_key64(by_id[i]->digest));
    hmap_remove(&eng->key_ids, by_id[i]->id);
    by_id[i]->q->use.keys--;
    mem_free(&eng->mem, by_id[i]);
    freed++;
  }
  mem_free(&eng->mem, by_id);
  eng->nkeys -= freed;
  eng->keys_kept = eng->nkeys;
  return freed;
}

size_t engine_keys_collect(engine_t *eng) {
  /* Amortized: only once the keys have doubled since the last collection. */
  if (!eng || eng->nkeys < 2 * eng->keys_kept + 64) return 0;
  return keys_collect(eng);
}

int prefix_key(engine_t *eng, quota_t *q, const engine_pkey_t *key, bool create,
               uint32_t *key_id, bool *created) {
  uint8_t d[32];
  if (created) *created = false;
  if (key_digest(eng, q, key, d))
    return engine_fail(eng, KVC_E_INVAL, "salt and extra key are at most %u bytes", KEY_MAX);
  uint64_t k64 = hash_key64(d);
  pkey_t *k = hmap_get(&eng->keys, k64);
  if (k && memcmp(k->digest, d, 32) == 0) {
    *key_id = k->id;
    return 0;
  }
  *key_id = 0;
  if (!create || k) return 0; /* unknown, or a 64-bit digest clash: never matches */
  uint32_t max = quota_lim(eng, q)->max_keys;
  if (max && q->use.keys >= max && (keys_collect(eng), q->use.keys >= max)) {
    q->use.refused_keys++;
    return engine_fail(eng, KVC_E_QUOTA_KEYS,
                       "tenant_max_keys: the tenant has %u salt and extra keys in use, "
                       "the quota is %u", q->use.keys, max);
  }
  size_t cap = eng->keys.cap, icap = eng->key_ids.cap;
  if (hmap_reserve(&eng->keys, &eng->mem, 1) || hmap_reserve(&eng->key_ids, &eng->mem, 1) ||
      !(k = mem_alloc(&eng->mem, sizeof *k))) {
    (void)hmap_resize(&eng->keys, &eng->mem, cap); /* a failed call keeps nothing */
    (void)hmap_resize(&eng->key_ids, &eng->mem, icap);
    return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  }
  memcpy(k->digest, d, 32);
  k->q = q;
  k->used = false;
  k->salt_len = (uint8_t)(key ? key->salt_len : 0);
  k->extra_len = (uint8_t)(key ? key->extra_len : 0);
  if (k->salt_len) memcpy(k->salt, key->salt, k->salt_len);
  if (k->extra_len) memcpy(k->extra, key->extra, k->extra_len);
  do /* wrapped: 0 means none, and an id still in use is skipped */
    if (++eng->next_key_id == 0) eng->next_key_id = 1;
  while (hmap_get(&eng->key_ids, eng->next_key_id));
  k->id = eng->next_key_id;
  eng->nkeys++;
  q->use.keys++;
  hmap_insert(&eng->keys, k64, k);
  hmap_insert(&eng->key_ids, k->id, k);
  *key_id = k->id;
  if (created) *created = true;
  return 0;
}

prefix_keys_cap_t prefix_keys_cap(const engine_t *eng) {
  return (prefix_keys_cap_t){eng->keys.cap, eng->key_ids.cap};
}

void prefix_key_forget(engine_t *eng, quota_t *q, const engine_pkey_t *key,
                       prefix_keys_cap_t cap) {
  uint8_t d[32];
  if (key_digest(eng, q, key, d)) return;
  pkey_t *k = hmap_remove(&eng->keys, hash_key64(d));
  if (!k) return;
  hmap_remove(&eng->key_ids, k->id);
  eng->nkeys--;
  q->use.keys--;
  mem_free(&eng->mem, k);
  (void)hmap_resize(&eng->keys, &eng->mem, cap.keys);
  (void)hmap_resize(&eng->key_ids, &eng->mem, cap.ids);
}

uint32_t prefix_keys_of(const engine_t *eng, const quota_t *q) {
  uint32_t n = 0;
  size_t pos = 0;
  const pkey_t *k;
  while ((k = hmap_next(&eng->keys, &pos, NULL))) n += k->q == q;
  return n;
}

/* ---- span keys ---------------------------------------------------------------- */

int prefix_spans_check(engine_t *eng, const kvc_span_key_t *sp, size_t n, const char *what) {
  if (n && !sp) return engine_fail(eng, KVC_E_INVAL, "%s: NULL span keys", what);
  if (n > KVC_MAX_SPAN_KEYS)
    return engine_fail(eng, KVC_E_INVAL, "%s: %zu span keys, at most %u", what, n,
                       KVC_MAX_SPAN_KEYS);
  for (size_t i = 0; i < n; i++) {
    if (sp[i].key_len == 0 || sp[i].key_len > KEY_MAX || !sp[i].key)
      return engine_fail(eng, KVC_E_INVAL, "%s: span key %zu has %zu bytes, 1 to %u", what, i,
                         sp[i].key_len, KEY_MAX);
    if (sp[i].begin >= sp[i].end || sp[i].end > KVC_MAX_SEQ_TOKENS)
      return engine_fail(eng, KVC_E_INVAL, "%s: span key %zu covers [%llu, %llu)", what, i,
                         (unsigned long long)sp[i].begin, (unsigned long long)sp[i].end);
    if (i && sp[i].begin < sp[i - 1].end)
      return engine_fail(eng, KVC_E_INVAL,
                         "%s: span key %zu begins at %llu, inside or before span key %zu",
                         what, i, (unsigned long long)sp[i].begin, i - 1);
  }
  return 0;
}

static engine_pkey_t span_pkey(const kvc_span_key_t *sp) {
  return (engine_pkey_t){NULL, 0, sp->key, sp->key_len, NULL, 0};
}

void prefix_spans_forget(engine_t *eng, quota_t *q, const kvc_span_key_t *sp,
                         const span_tag_t *out, size_t n, prefix_keys_cap_t cap) {
  for (size_t i = n; i-- > 0;) {
    if (!out[i].created) continue;
    engine_pkey_t k = span_pkey(&sp[out[i].src]);
    prefix_key_forget(eng, q, &k, cap);
  }
}

int prefix_spans_resolve(engine_t *eng, quota_t *q, const kvc_span_key_t *sp, size_t n,
                         uint64_t lo, uint64_t hi, bool create, span_tag_t *out, size_t *nout) {
  prefix_keys_cap_t cap = prefix_keys_cap(eng);
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (sp[i].end <= lo || sp[i].begin >= hi) continue;
    engine_pkey_t key = span_pkey(&sp[i]);
    span_tag_t *t = &out[k];
    *t = (span_tag_t){sp[i].begin > lo ? sp[i].begin : lo, sp[i].end < hi ? sp[i].end : hi, 0,
                      (uint32_t)i, false};
    int rc = prefix_key(eng, q, &key, create, &t->id, &t->created);
    if (rc) {
      prefix_spans_forget(eng, q, sp, out, k, cap);
      return rc;
    }
    if (!t->id) t->id = SPAN_UNKNOWN;
    k++;
  }
  *nout = k;
  return 0;
}

/* The span tags of positions [from, from + T) into out (0: none). */
static void tags_fill(const span_tag_t *t, size_t n, uint64_t from, uint32_t T, uint32_t *out) {
  memset(out, 0, (size_t)T * sizeof *out);
  for (size_t i = 0; i < n; i++) {
    if (t[i].end <= from || t[i].begin >= from + T) continue;
    uint64_t b = t[i].begin > from ? t[i].begin : from;
    uint64_t e = t[i].end < from + T ? t[i].end : from + T;
    for (uint64_t p = b; p < e; p++) out[p - from] = t[i].id;
  }
}

/* A walk of positions in increasing order over sorted span tags. */
typedef struct tag_walk {
  const span_tag_t *t;
  size_t n, i;
} tag_walk_t;

/* The tag of position p (0: none); p never decreases along a walk. */
static uint32_t tag_at(tag_walk_t *w, uint64_t p) {
  while (w->i < w->n && w->t[w->i].end <= p) w->i++;
  return w->i < w->n && w->t[w->i].begin <= p ? w->t[w->i].id : 0;
}

/* ---- ipage blocks: reserved before a call changes anything ------------------- */

/* ---- references and the cached state ----------------------------------------- */

static void unindex(engine_t *eng, ipage_t *ip) {
  cache_t *c = ip->cache;
  hmap_remove(&c->index, hash_key64(ip->hash));
  if (ip->parent != NOPAGE && page_meta(eng, ip->parent) && page_meta(eng, ip->parent)->indexed)
    page_meta(eng, ip->parent)->nchildren--;
  ip->indexed = false;
  eng->st.pages_indexed--;
  c->st.pages_indexed--;
  if (eng->ev) evlog_removed(eng, c, ip->hash);
}

void prefix_reclaim(engine_t *eng, ipage_t *ip) {
  cache_t *c = ip->cache;
  if (eng->reclaim_hook) eng->reclaim_hook(eng, ip); /* its last chance to be kept (tier.c) */
  lru_unlink(&ip->node);
  page_cached_count(eng, c, -1);
  unindex(eng, ip);
  eng->st.cached_reclaimed++;
  c->st.cached_reclaimed++;
  page_unref(eng, c, ip->page, 0); /* the index's reference was the last */
}

/* One indexed page of a cache being cleared leaves the index. */
static void clear_one(engine_t *eng, cache_t *c, ipage_t *ip, uint32_t page) {
    if (ip->node.prev) { /* cached; a page a lease still holds is not */
      lru_unlink(&ip->node);
      page_cached_count(eng, c, -1);
    }
    eng->index_sole -= eng->pool.refcnt[page] == 2;
    hmap_remove(&c->index, hash_key64(ip->hash));
    ip->indexed = false;
    eng->st.pages_indexed--;
    c->st.pages_indexed--;
    if (eng->ev) evlog_removed(eng, c, ip->hash);
    page_unref(eng, c, page, 0);
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* Depth of an indexed page in its chain (a head is 0). */
static uint32_t chain_depth(const engine_t *eng, const ipage_t *ip) {
  uint32_t d = 0;
  for (uint32_t p = ip->parent; p != POOL_NOPAGE && d < UINT32_MAX; d++) {
    const ipage_t *up = page_meta(eng, p);
    if (!up) break;
    p = up->parent;
  }
  return d;
}

void prefix_cache_clear(engine_t *eng, cache_t *c) {
  /* Every sequence is gone: each indexed page of c is cached, or held by a
   * lease. The whole index goes, leaf first as eviction goes (the event
   * stream's BlockRemoved says so, doc/events.md): deepest pages first.
   * Out of memory for the order, it goes in page order. */
  uint64_t n = c->index.count, k = 0;
  uint64_t *order = n ? mem_alloc(&eng->mem, (size_t)n * sizeof *order) : NULL;
  for (uint32_t page = 0; order && page < eng->pool.npages && k < n; page++) {
    ipage_t *ip = page_meta(eng, page);
    if (!ip || ip->cache != c || !ip->indexed) continue;
    /* deepest first, then page order: the key sorts ascending */
    order[k++] = (uint64_t)(UINT32_MAX - chain_depth(eng, ip)) << 32 | page;
  }
  if (order) qsort(order, (size_t)k, sizeof *order, cmp_u64);
  for (uint64_t i = 0; order && i < k; i++) {
    uint32_t page = (uint32_t)order[i];
    clear_one(eng, c, page_meta(eng, page), page);
  }
  mem_free(&eng->mem, order);
  for (uint32_t page = 0; page < eng->pool.npages && c->index.count; page++) {
    ipage_t *ip = page_meta(eng, page);
    if (!ip || ip->cache != c || !ip->indexed) continue;
    clear_one(eng, c, ip, page);
  }
  hmap_deinit(&c->index, &eng->mem);
}

/* ---- puts: the chain of a sequence ---------------------------------------------
 *
 * A page's bytes depend on every token before it. So a sequence's chain is
 * what it wrote in order from position 0: chain_tok tokens, each written with
 * its id while every token before it was already in the chain. A write at a
 * position cuts the chain there (the later tokens were computed under what
 * that position held before); a write with ids that starts inside the chain
 * continues it to the write's end. Only whole pages of the chain are hashed,
 * each under its predecessor in the same sequence, and only those can be
 * indexed:
 *
 *   chain_tok = 12, T = 4       [A0 A1 A2 A3|A4 .. A7|A8 .. A11]  3 pages hashed
 *   put ids B at [0, 4)         [B0 .. B3  |A4 .. A7|A8 .. A11]  chain_tok 4:
 *                               pages 1 and 2 were computed after A0..A3, so
 *                               they and anything appended after them never
 *                               chain again unless rewritten in order.
 */


/* Marks the hashes of s's pages over [pos, end) stale (their bytes change). */
static void pages_dirty(engine_t *eng, seq_t *s, uint64_t pos, uint64_t end) {
  const geom_t *g = &s->cache->g;
  if (pos < (uint64_t)s->base << g->tshift) pos = (uint64_t)s->base << g->tshift;
  for (uint64_t idx = pos >> g->tshift; (idx << g->tshift) < end && idx - s->base < s->ntable;
       idx++) {
    uint32_t page = s->table[idx - s->base];
    ipage_t *ip = page == NOPAGE ? NULL : page_meta(eng, page); /* NOPAGE: all holes */
    if (ip && !ip->indexed) ip->hashed = false; /* an indexed page is never written */
  }
}

void prefix_put_untokened(engine_t *eng, seq_t *s, uint64_t pos, uint64_t end) {
  seq_chain_cut(s, pos);
  pages_dirty(eng, s, pos, end);
}

/* Hashes page idx of s under its predecessor in s (which the chain holds),
 * and indexes it if its hash is free. false: the chain cannot go on here. */
static bool hash_one(engine_t *eng, seq_t *s, uint64_t idx, const engine_pkey_t *key,
                     uint32_t key_id) {
  cache_t *c = s->cache;
  if (idx < s->base || (idx > 0 && idx - 1 < s->base)) return false; /* trimmed */
  uint32_t page = s->table[idx - s->base];
  ipage_t *ip = page == NOPAGE ? NULL : page_meta(eng, page);
  if (!ip) return false;
  uint8_t parent[32], h[32];
  uint32_t parent_page = NOPAGE, iparent = NOPAGE; /* the parent in the index */
  bool reachable = true;
  if (idx == 0) {
    chain_root(eng, c, key, parent);
  } else {
    parent_page = iparent = s->table[idx - 1 - s->base];
    const ipage_t *pip = page_meta(eng, parent_page);
    if (!pip || !pip->hashed) return false;
    memcpy(parent, pip->hash, 32);
    if (!pip->indexed) {
      /* A duplicate of an indexed twin (another sequence wrote the same
       * prefix: the same chain hash, key and ids): a match walks the twin,
       * so this page is indexed under it. Without a twin, the chain is not
       * in the index from its head and this page could never be reached. */
      const ipage_t *twin = hmap_get(&c->index, hash_key64(pip->hash));
      reachable = twin && memcmp(twin->hash, pip->hash, 32) == 0 && twin->key == key_id &&
                  memcmp(twin->tokens, pip->tokens, c->g.T * 2 * sizeof *pip->tokens) == 0;
      if (reachable) iparent = twin->page;
    }
  }
  if (!page_hash(eng, parent, ip->tokens, ipage_tags(ip, c->g.T), c->g.T, key, h))
    return false;
  if (ip->indexed) /* never re-keyed: it goes on only if it is this very chain */
    return memcmp(ip->hash, h, 32) == 0 && ip->parent == iparent && ip->key == key_id;
  memcpy(ip->hash, h, 32);
  ip->hashed = true;
  ip->key = key_id;
  ip->parent = parent_page;
  uint64_t k64 = hash_key64(ip->hash);
  if (!reachable) return true;
  ipage_t *other = hmap_get(&c->index, k64);
  if (other) { /* taken: the same prefix elsewhere, or a clash */
    if (memcmp(other->tokens, ip->tokens, c->g.T * 2 * sizeof *ip->tokens) != 0 ||
        other->key != key_id) {
      eng->st.hash_collisions++;
      c->st.hash_collisions++;
    }
    return true;
  }
  hmap_insert(&c->index, k64, ip); /* room reserved by the caller */
  ip->indexed = true;
  ip->parent = iparent;
  pool_ref(&eng->pool, page);
  page_index_sole(eng, page, 0, eng->pool.refcnt[page]);
  if (iparent != NOPAGE) page_meta(eng, iparent)->nchildren++;
  eng->st.pages_indexed++;
  c->st.pages_indexed++;
  if (eng->tier.indexed) eng->tier.indexed(eng->tier.ctx, c->id, ip->hash);
  if (eng->ev) evlog_stored(eng, c, ip, parent_page != NOPAGE ? parent : NULL);
  return true;
}

/* The first position in [pos, end) where ids differ from the ids s's pages
 * hold for a chain that covers it (the longest layer's), or UINT64_MAX. */
static uint64_t ids_differ(const engine_t *eng, const seq_t *s, const engine_io_t *e,
                           uint64_t end, const span_tag_t *tags, size_t ntags) {
  const geom_t *g = &s->cache->g;
  uint64_t hi = s->chain_tok;
  if (s->x->layer_chain)
    for (uint32_t l = 0; l < g->L; l++) hi = s->x->layer_chain[l] > hi ? s->x->layer_chain[l] : hi;
  if (end > hi) end = hi;
  tag_walk_t w = {tags, ntags, 0};
  for (uint64_t p = e->pos; p < end; p++) {
    const ipage_t *ip = page_meta(eng, s->table[(p >> g->tshift) - s->base]);
    if (!ip || ip->tokens[p & (g->T - 1)] != e->tokens[p - e->pos] ||
        ipage_tags_c(ip, g->T)[p & (g->T - 1)] != tag_at(&w, p))
      return p;
  }
  return UINT64_MAX;
}

/* chain_tok = the least layer chain; layer_chain goes once all are equal. */
static void chain_settle(engine_t *eng, seq_t *s) {
  uint32_t lo = UINT32_MAX, hi = 0;
  for (uint32_t l = 0; l < s->cache->g.L; l++) {
    lo = s->x->layer_chain[l] < lo ? s->x->layer_chain[l] : lo;
    hi = s->x->layer_chain[l] > hi ? s->x->layer_chain[l] : hi;
  }
  if (lo < s->chain_tok) seq_chain_cut(s, lo);
  s->chain_tok = lo;
  if (lo == hi) {
    mem_free(&eng->mem, s->x->layer_chain);
    s->x->layer_chain = NULL;
    seq_ext_release(eng, s);
  }
}

void prefix_put_tokens(engine_t *eng, seq_t *s, const engine_io_t *e, uint32_t l0, uint32_t l1,
                       const engine_pkey_t *key, uint32_t key_id, const span_tag_t *tags,
                       size_t ntags) {
  const geom_t *g = &s->cache->g;
  uint64_t end = e->pos + e->ntokens;
  /* A layer whose chain holds other ids at these positions was computed for
   * another prompt: every chain ends where the ids first differ. */
  uint64_t differ = ids_differ(eng, s, e, end, tags, ntags);
  if (differ != UINT64_MAX) seq_chain_cut(s, differ);
  /* A chain goes on only from inside it, under the same key (a put at 0
   * starts it afresh); anything else cuts it where the bytes changed. A
   * sequence trimmed at the front (start > 0) computes what it writes without
   * the positions it dropped: it never chains again. */
  if (key_id != s->chain_key && e->pos == 0) {
    seq_chain_cut(s, 0);
    s->chain_key = key_id;
  }
  bool all = l0 == 0 && l1 == g->L;
  /* (a layer range without layer_chain: its begin ran out of memory) */
  bool extends = key_id == s->chain_key && s->start == 0 && (all || s->x->layer_chain);
  if (!extends || (!s->x->layer_chain && e->pos <= s->chain_tok)) seq_chain_cut(s, e->pos);
  /* The ids, into the pages; a page of the chain keeps its hash (its ids are
   * the same: any that differ cut the chain above). */
  tag_walk_t w = {tags, ntags, 0};
  for (uint64_t idx = e->pos >> g->tshift; (idx << g->tshift) < end; idx++) {
    uint32_t page = s->table[idx - s->base];
    ipage_t *ip = page_meta(eng, page) ? page_meta(eng, page) : page_meta_take(eng, s->cache, page);
    uint64_t pstart = idx << g->tshift;
    uint64_t from = e->pos > pstart ? e->pos - pstart : 0;
    uint64_t to = (end < pstart + g->T ? end : pstart + g->T) - pstart;
    memcpy(ip->tokens + from, e->tokens + (pstart + from - e->pos),
           (size_t)(to - from) * sizeof *ip->tokens);
    uint32_t *pt = ipage_tags(ip, g->T);
    for (uint64_t t = from; t < to; t++) pt[t] = tag_at(&w, pstart + t);
    if (idx >= s->chain_pages) ip->hashed = false;
  }
  if (!extends) return;
  if (s->x->layer_chain) { /* each written layer's chain, cut at pos, goes on to end */
    for (uint32_t l = l0; l < l1; l++)
      if (s->x->layer_chain[l] >= e->pos) s->x->layer_chain[l] = (uint32_t)end;
    chain_settle(eng, s);
  } else if (e->pos <= s->chain_tok) {
    s->chain_tok = end;
  }
  uint64_t whole = s->chain_tok >> g->tshift;
  while (s->chain_pages < whole && hash_one(eng, s, s->chain_pages, key, key_id))
    s->chain_pages++;
  if (s->chain_pages < whole) /* it could not hash on (trimmed): it ends here */
    seq_chain_cut(s, (uint64_t)s->chain_pages << g->tshift);
}

/* ---- match and attach --------------------------------------------------------- */

/* Walks the chain of tokens; fills pages[] (if not NULL) with matched pages.
 * Each page's ids are read once, into eng->page_ids, before they are hashed
 * and verified: tokens may be another process's memory that changes
 * meanwhile, and a walk costs O(matched pages), not O(n), since it stops at
 * the first page that misses. */
uint64_t prefix_match_pages(engine_t *eng, cache_t *c, const uint32_t *tokens, uint64_t n,
                            const engine_pkey_t *key, uint32_t key_id, uint32_t *pages) {
  if (!pages) pages = eng->scratch;
  if (key_id == 0) return 0;
  uint32_t T = c->g.T, parent = NOPAGE;
  uint8_t h[32], prev[32];
  uint64_t m = 0;
  chain_root(eng, c, key, prev);
  for (; (m + 1) * T <= n; m++) {
    if (!prefix_query_hash(eng, c, tokens, m, key, prev, h)) break;
    ipage_t *ip = hmap_get(&c->index, hash_key64(h));
    if (!ip) break;
    if (!prefix_verify(eng, ip, h, parent, key_id)) {
      eng->st.hash_verify_failed++;
      c->st.hash_verify_failed++;
      break;
    }
    pages[m] = ip->page;
    parent = ip->page;
    memcpy(prev, h, 32);
  }
  return m;
}

void prefix_root(engine_t *eng, const cache_t *c, const engine_pkey_t *key, uint8_t out[32]) {
  chain_root(eng, c, key, out);
}

bool prefix_query_hash(engine_t *eng, const cache_t *c, const uint32_t *tokens, uint64_t m,
                       const engine_pkey_t *key, const uint8_t prev[32], uint8_t out[32]) {
  uint32_t T = c->g.T, *ids = eng->page_ids, *tags = eng->page_tags;
  memcpy(ids, tokens + m * T, (size_t)T * sizeof *ids);
  tags_fill(eng->qtags, eng->nqtags, m * T, T, tags);
  bool unknown = false; /* a span key no page holds: nothing further matches */
  for (uint32_t t = 0; t < T; t++) unknown |= tags[t] == SPAN_UNKNOWN;
  return !unknown && page_hash(eng, prev, ids, tags, T, key, out);
}

bool prefix_verify(const engine_t *eng, const ipage_t *ip, const uint8_t h[32], uint32_t parent,
                   uint32_t key_id) {
  uint32_t T = ip->cache->g.T;
  return memcmp(ip->hash, h, 32) == 0 && ip->parent == parent && ip->key == key_id &&
         memcmp(ip->tokens, eng->page_ids, (size_t)T * sizeof *ip->tokens) == 0 &&
         memcmp(ipage_tags_c(ip, T), eng->page_tags, (size_t)T * sizeof *ip->tokens) == 0;
}

ipage_t *prefix_find(const cache_t *c, const uint8_t h[32]) {
  return hmap_get(&c->index, hash_key64(h));
}

void prefix_insert(engine_t *eng, cache_t *c, ipage_t *ip) {
  hmap_insert(&c->index, hash_key64(ip->hash), ip); /* room reserved by the caller */
  ip->indexed = true;
  const ipage_t *parent = ip->parent != NOPAGE ? page_meta(eng, ip->parent) : NULL;
  if (parent) page_meta(eng, ip->parent)->nchildren++;
  eng->st.pages_indexed++;
  c->st.pages_indexed++;
  if (eng->ev) evlog_stored(eng, c, ip, parent ? parent->hash : NULL); /* a page back from a tier */
}

/* A hit touches its pages, deepest first so the chain head ends most recent. */
static void hit_touch(engine_t *eng, const uint32_t *pages, uint64_t m) {
  for (uint64_t i = m; i-- > 0;) {
    ipage_t *ip = page_meta(eng, pages[i]);
    if (i == 0) ip->hits++;
    if (ip->node.prev) { /* cached: most recent of its list */
      lru_unlink(&ip->node);
      lru_link(eng, &ip->node, false);
    }
  }
}

static void match_count(engine_t *eng, cache_t *c, uint64_t n, uint64_t hit, uint64_t inel) {
  eng->st.prefix_matches++;
  eng->st.prefix_tokens_queried += n;
  eng->st.prefix_tokens_hit += hit;
  eng->st.prefix_tokens_ineligible += inel;
  c->st.prefix_matches++;
  c->st.prefix_tokens_queried += n;
  c->st.prefix_tokens_hit += hit;
  c->st.prefix_tokens_ineligible += inel;
}

void prefix_match_done(engine_t *eng, cache_t *c, const uint32_t *pages, uint64_t m,
                       uint64_t n, engine_match_t *out) {
  hit_touch(eng, pages, m);
  out->pages = m;
  out->tokens = m * c->g.T;
  out->ineligible = n % c->g.T;
  match_count(eng, c, n, out->tokens, out->ineligible);
}

int engine_match(engine_t *eng, uint32_t cache_id, const uint32_t *tokens, uint64_t n,
                 const engine_pkey_t *key, engine_match_t *out) {
  if (!eng) return KVC_E_INVAL;
  if (!out) return engine_fail(eng, KVC_E_INVAL, "NULL argument");
  cache_t *c;
  uint32_t key_id;
  int rc = prefix_match_args(eng, cache_id, tokens, n, key, &c, &key_id);
  if (rc) return rc;
  uint64_t m = prefix_match_pages(eng, c, tokens, n, key, key_id, NULL);
  prefix_match_done(eng, c, eng->scratch, m, n, out);
  prefix_match_end(eng);
  return 0;
}

int prefix_match_args(engine_t *eng, uint32_t cache_id, const uint32_t *tokens, uint64_t n,
                      const engine_pkey_t *key, cache_t **c, uint32_t *key_id) {
  int rc = engine_find_cache(eng, cache_id, c);
  if (rc) return rc;
  if (n && !tokens) return engine_fail(eng, KVC_E_INVAL, "NULL tokens");
  if (n > KVC_MAX_SEQ_TOKENS)
    return engine_fail(eng, KVC_E_RANGE, "%llu tokens: more than a sequence holds",
                       (unsigned long long)n);
  if ((rc = prefix_key(eng, (*c)->q, key, false, key_id, NULL))) return rc;
  const kvc_span_key_t *sp = key ? key->spans : NULL;
  size_t nsp = key ? key->nspans : 0;
  if ((rc = prefix_spans_check(eng, sp, nsp, "the query"))) return rc;
  uint32_t T = (*c)->g.T;
  if (eng->page_ids_cap < T) { /* grows to the largest page of any match */
    uint32_t *ids = mem_realloc(&eng->mem, eng->page_ids, (size_t)T * 2 * sizeof *ids);
    if (!ids) return engine_fail(eng, KVC_E_NOMEM, "out of memory");
    eng->page_ids = ids;
    eng->page_tags = ids + T; /* the same block */
    eng->page_ids_cap = T;
  }
  prefix_match_end(eng);
  if (nsp) {
    if (!(eng->qtags = mem_alloc(&eng->mem, nsp * sizeof *eng->qtags)))
      return engine_fail(eng, KVC_E_NOMEM, "out of memory");
    rc = prefix_spans_resolve(eng, (*c)->q, sp, nsp, 0, n, false, eng->qtags, &eng->nqtags);
  }
  return rc;
}

void prefix_match_end(engine_t *eng) {
  mem_free(&eng->mem, eng->qtags);
  eng->qtags = NULL;
  eng->nqtags = 0;
}



int engine_prefix_top(engine_t *eng, uint32_t cache_id, engine_prefix_top_t *out, size_t cap,
                      size_t *n) {
  if (!eng) return KVC_E_INVAL;
  if (!n || (cap && !out)) return engine_fail(eng, KVC_E_INVAL, "NULL argument");
  cache_t *c;
  int rc = engine_find_cache(eng, cache_id, &c);
  if (rc) return rc;
  size_t k = 0;
  for (uint32_t page = 0; page < eng->pool.npages; page++) {
    ipage_t *ip = page_meta(eng, page);
    if (!ip || ip->cache != c || !ip->indexed || ip->parent != NOPAGE) continue;
    /* Keep the cap heads with the most hits, by insertion into a sorted run. */
    size_t at = k < cap ? k : cap;
    while (at > 0 && out[at - 1].hits < ip->hits) at--;
    if (at >= cap) continue;
    if (k < cap) k++;
    memmove(out + at + 1, out + at, (k - 1 - at) * sizeof *out);
    memcpy(out[at].hash, ip->hash, 32);
    out[at].hits = ip->hits;
    out[at].depth = 0;
  }
  /* Depth: the longest indexed chain below each listed head. */
  for (uint32_t page = 0; page < eng->pool.npages; page++) {
    ipage_t *ip = page_meta(eng, page);
    if (!ip || ip->cache != c || !ip->indexed || ip->nchildren) continue;
    uint32_t d = 1;
    while (ip->parent != NOPAGE) {
      ip = page_meta(eng, ip->parent);
      d++;
    }
    for (size_t i = 0; i < k; i++)
      if (memcmp(out[i].hash, ip->hash, 32) == 0 && d > out[i].depth) out[i].depth = d;
  }
  *n = k;
  return 0;
}

/* ---- audit ----------------------------------------------------------------------- */

int prefix_expect(engine_t *eng, const ipage_t *ip, const uint8_t *ph, uint8_t out[32]) {
  const pkey_t *k = key_by_id(eng, ip->key);
  if (!k) return KVC_E_INTERNAL;
  engine_pkey_t key = {k->salt, k->salt_len, k->extra, k->extra_len, NULL, 0};
  uint8_t root[32];
  if (!ph) {
    chain_root(eng, ip->cache, &key, root);
    ph = root;
  }
  uint32_t T = ip->cache->g.T;
  return page_hash(eng, ph, ip->tokens, ipage_tags_c(ip, T), T, &key, out) ? 0
                                                                          : KVC_E_INTERNAL;
}

/* ---- for the tiers (tier.c) ------------------------------------------------------- */

bool prefix_key_get(const engine_t *eng, uint32_t id, engine_pkey_t *out) {
  const pkey_t *k = key_by_id(eng, id);
  if (!k) return false;
  *out = (engine_pkey_t){k->salt, k->salt_len, k->extra, k->extra_len, NULL, 0};
  return true;
}
