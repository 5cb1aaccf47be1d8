/* tier.c: the engine's one tier API (engine_tier.h): what leaves memory,
 * what a match asks of the tiers below, and what comes back, verified,
 * into the prefix index. Its users are the daemon's tiers (the disk,
 * doc/tiers.md; the cluster, doc/cluster.md; a test's), all through the
 * same calls. One reclaim hook in prefix.c (eng->reclaim_hook) is its only
 * way in from below.
 *
 *   out:     put indexes page -> hooks.indexed(cache, hash) -> the tier may
 *            ask engine_page_export / engine_page_hold(cache, hash)
 *            evict -> prefix_reclaim -> hooks.reclaimed(page) -> (freed)
 *   probe:   the query's local pages m (the most recent now), hashes of
 *            pages m, m+1, ...: the tier looks them up
 *   back:    begin: page_alloc (evicting as a put would), held by an
 *            internal lease                  refcnt 1 (the lease)
 *            the tier fills the bytes (any thread)
 *            import(query, first = m, pages): each page's hash recomputed
 *            from the query under the one before; indexed
 *                                            refcnt 2 (lease + index)
 *            the lease dropped               refcnt 1: cached, most recent
 *
 *   query  [p0 p1 p2 | p3 p4 p5 ...]    p0..p2 indexed here (held meanwhile)
 *                     ^ first          p3.. imported while each hash recomputed
 *                                      from the query equals the tier's
 *
 * The tier is never trusted with identity: a page enters the index only
 * under the hash this engine computes from the caller's own query, so what
 * a tier returns can be missing or wrong bytes under a right name (the
 * tier verifies bytes: checksums, doc/tiers.md; MACs, doc/cluster.md),
 * never another prompt's page. Holding a page with an internal lease
 * (lease.c) means the audit, the eviction planner and the stats already
 * know what it is: a page held by a reader, never a victim, freed with its
 * last reference.
 */
#include <string.h>

#include "engine_tier.h"
#include "evict.h"
#include "evlog.h"
#include "lease.h"
#include "lru.h"
#include "page.h"
#include "quota.h"
#include "prefix.h"

#define NOPAGE POOL_NOPAGE

struct engine_tier_job {
  uint32_t cache_id;
  uint32_t page;
  lease_t *hold;   /* the page's only reference until the import or the abort */
};

/* ---- out ----------------------------------------------------------------------- */

/* An indexed page as a tier sees it. */
static void page_fill(engine_t *eng, const ipage_t *ip, engine_page_t *out) {
  const cache_t *c = ip->cache;
  uint32_t T = c->g.T;
  memset(out, 0, sizeof *out);
  out->cache_id = c->id;
  out->tenant = c->tenant;
  memcpy(out->cache, c->name, sizeof out->cache);
  out->layout = c->layout;
  out->hash_kind = (uint32_t)eng->hash_kind;
  out->page_tokens = T;
  out->data_bytes = c->g.page_bytes;
  memcpy(out->hash, ip->hash, 32);
  out->head = ip->parent == NOPAGE;
  if (!out->head) memcpy(out->parent, page_meta(eng, ip->parent)->hash, 32);
  out->tokens = ip->tokens;
  out->bytes = pool_page(&eng->pool, ip->page);
  engine_pkey_t k;
  out->portable = prefix_key_get(eng, ip->key, &k);
  const uint32_t *tags = ipage_tags_c(ip, T);
  for (uint32_t t = 0; out->portable && t < T; t++)
    if (tags[t]) out->portable = false;
  if (!out->portable) return;
  out->salt.len = (uint8_t)k.salt_len;
  if (k.salt_len) memcpy(out->salt.bytes, k.salt, k.salt_len);
  out->extra.len = (uint8_t)k.extra_len;
  if (k.extra_len) memcpy(out->extra.bytes, k.extra, k.extra_len);
}

/* The one reclaim hook (eng->reclaim_hook): prefix_reclaim calls it with a
 * cached page about to leave the index, still whole (indexed, its bytes and
 * parent there), under pressure: the tiers' last look. */
static void reclaim_hook(engine_t *eng, const ipage_t *ip) {
  engine_page_t p;
  page_fill(eng, ip, &p);
  p.more = eng->reclaims_left;
  eng->tier.reclaimed(eng->tier.ctx, &p);
}

void engine_set_tier_hooks(engine_t *eng, const engine_tier_hooks_t *h) {
  if (!eng) return;
  if (h) eng->tier = *h;
  else memset(&eng->tier, 0, sizeof eng->tier);
  eng->reclaim_hook = eng->tier.reclaimed ? reclaim_hook : NULL;
}

size_t engine_tier_each(engine_t *eng, engine_page_fn fn, void *ctx) {
  size_t n = 0;
  engine_page_t p;
  for (uint32_t page = 0; eng && fn && eng->ip && page < eng->pool.npages; page++) {
    const ipage_t *ip = eng->ip[page];
    if (!ip || !ip->indexed) continue;
    page_fill(eng, ip, &p);
    fn(ctx, &p);
    n++;
  }
  return n;
}

int engine_page_export(engine_t *eng, uint32_t cache_id, const uint8_t hash[32],
                       engine_page_t *out) {
  if (!eng) return KVC_E_INVAL;
  if (!hash || !out) return engine_fail(eng, KVC_E_INVAL, "NULL argument");
  cache_t *c;
  int rc = engine_find_cache(eng, cache_id, &c);
  if (rc) return rc;
  const ipage_t *ip = prefix_find(c, hash);
  if (!ip || memcmp(ip->hash, hash, 32) != 0)
    return engine_fail(eng, KVC_E_NOSEQ, "no indexed page of that hash");
  page_fill(eng, ip, out);
  return 0;
}

int engine_page_hold(engine_t *eng, uint32_t cache_id, const uint8_t hash[32],
                     engine_page_t *out, engine_hold_t **hold) {
  if (!hold) return eng ? engine_fail(eng, KVC_E_INVAL, "NULL argument") : KVC_E_INVAL;
  int rc = engine_page_export(eng, cache_id, hash, out);
  if (rc) return rc;
  const ipage_t *ip = prefix_find(engine_cache(eng, cache_id), hash);
  lease_t *l = lease_pages(eng, &ip->page, 1, ip->cache->g.page_bytes);
  if (!l) return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  *hold = (engine_hold_t *)l;
  return 0;
}

void engine_page_release(engine_t *eng, engine_hold_t *hold) {
  if (eng && hold) lease_drop(eng, (lease_t *)hold);
}

/* ---- probe -------------------------------------------------------------------- */

int engine_tier_probe(engine_t *eng, uint32_t cache_id, const uint32_t *tokens, uint64_t n,
                      const engine_pkey_t *key, uint64_t *local, uint8_t before[32],
                      uint8_t (*out)[32], size_t cap, size_t *nout) {
  if (!eng) return KVC_E_INVAL;
  if (!local || !nout || (cap && !out)) return engine_fail(eng, KVC_E_INVAL, "NULL argument");
  cache_t *c;
  uint32_t key_id;
  int rc = prefix_match_args(eng, cache_id, tokens, n, key, &c, &key_id);
  if (rc) return rc;
  uint32_t T = c->g.T;
  uint64_t m = prefix_match_pages(eng, c, tokens, n, key, key_id, NULL);
  /* The most recent, as a hit makes them, in chain order: the pages read
   * after them must not push out the parents they are imported under. */
  for (uint64_t i = 0; i < m; i++) {
    ipage_t *ip = page_meta(eng, eng->scratch[i]);
    if (ip->node.prev) {
      lru_unlink(&ip->node);
      lru_link(eng, &ip->node, false);
    }
  }
  uint8_t prev[32];
  if (m) memcpy(prev, page_meta(eng, eng->scratch[m - 1])->hash, 32);
  else prefix_root(eng, c, key, prev);
  if (m && before) memcpy(before, prev, 32);
  size_t k = 0;
  for (; k < cap && (m + k + 1) * T <= n; k++) {
    if (!prefix_query_hash(eng, c, tokens, m + k, key, prev, out[k])) break;
    memcpy(prev, out[k], 32);
  }
  prefix_match_end(eng);
  *local = m;
  *nout = k;
  return 0;
}

/* ---- back in ------------------------------------------------------------------ */

int engine_tier_import_begin(engine_t *eng, uint32_t cache_id, engine_tier_job_t **job,
                             void **bytes, uint64_t *nbytes) {
  if (!eng) return KVC_E_INVAL;
  if (!job || !bytes) return engine_fail(eng, KVC_E_INVAL, "NULL argument");
  cache_t *c;
  int rc = engine_find_cache(eng, cache_id, &c);
  if (rc) return rc;
  engine_tier_job_t *j = mem_alloc(&eng->mem, sizeof *j);
  if (!j) return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  eng->epoch++; /* no sequence of this call to spare */
  evict_need_t nd = {.new_pages = 1, .q = c->q, .arena = c->arena};
  if ((rc = evict_make_room(eng, &nd))) {
    mem_free(&eng->mem, j);
    return rc;
  }
  /* Out of memory after eviction keeps the evictions: they are what any
   * later call would have done, and the engine stays consistent. */
  uint32_t page = page_alloc(eng, c);
  lease_t *l = lease_pages(eng, &page, 1, c->g.page_bytes);
  page_unref(eng, c, page, PRIO_DEFAULT); /* the lease's reference alone, or freed */
  if (!l) {
    mem_free(&eng->mem, j);
    return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  }
  *j = (engine_tier_job_t){cache_id, page, l};
  *job = j;
  *bytes = pool_page(&eng->pool, page);
  if (nbytes) *nbytes = c->g.page_bytes;
  return 0;
}

void engine_tier_import_abort(engine_t *eng, engine_tier_job_t *job) {
  if (!eng || !job) return;
  lease_t *hold = job->hold;
  mem_free(&eng->mem, job);
  lease_drop(eng, hold); /* frees the page */
}

static uint32_t tier_job_page(const engine_tier_job_t *job, uint32_t *cache_id) {
  *cache_id = job->cache_id;
  return job->page;
}

static void tier_job_indexed(engine_t *eng, engine_tier_job_t *job) {
  uint32_t page = job->page;
  lease_t *hold = job->hold;
  mem_free(&eng->mem, job);
  pool_ref(&eng->pool, page); /* the index's */
  page_index_sole(eng, page, 0, eng->pool.refcnt[page]);
  lease_drop(eng, hold); /* only the index holds it now: cached, most recent */
}

/* An import's walk of the query: the indexed pages it holds, and the run of
 * pages it may import after them. */
typedef struct walk {
  uint32_t *held;   /* indexed pages of the query, in chain order */
  size_t nheld;
  uint64_t start;   /* the first page to import */
  size_t k;         /* pages to import from start (their hashes verified) */
  uint32_t parent;  /* the last held page (NOPAGE: none) */
} walk_t;

/* Walks the query from its root: pages indexed here (verified as a match
 * verifies) are held, up to `first` at least; then the pages whose tier
 * hash equals the hash recomputed here, while their index slot is free. */
static void import_walk(engine_t *eng, cache_t *c, const uint32_t *tokens,
                        const engine_pkey_t *key, uint32_t key_id, uint64_t first,
                        const engine_page_in_t *in, size_t nin, walk_t *w) {
  uint8_t prev[32], h[32];
  bool importing = false;
  w->parent = NOPAGE;
  prefix_root(eng, c, key, prev);
  for (uint64_t m = 0; m < first + nin; m++) {
    if (!prefix_query_hash(eng, c, tokens, m, key, prev, h)) return;
    const ipage_t *slot = prefix_find(c, h);
    bool same = slot && memcmp(slot->hash, h, 32) == 0;
    if (!importing && same) {
      if (!key_id || !prefix_verify(eng, slot, h, w->parent, key_id)) {
        eng->st.hash_verify_failed++;
        c->st.hash_verify_failed++;
        return;
      }
      w->held[w->nheld++] = w->parent = slot->page;
      memcpy(prev, h, 32);
      continue;
    }
    if (m < first) return; /* a page below first is gone: nothing hangs under it */
    if (!importing) {
      importing = true;
      w->start = m;
    }
    if (slot) { /* taken: by this very page (a put indexed it), or a clash */
      if (!same) {
        eng->st.hash_collisions++;
        c->st.hash_collisions++;
      }
      return;
    }
    if (memcmp(in[m - first].hash, h, 32) != 0) {
      eng->st.hash_verify_failed++;
      c->st.hash_verify_failed++;
      return;
    }
    w->k++;
    memcpy(prev, h, 32);
  }
}

/* Evicts for up to *k new pages of c's tenant, fewer if that is all there
 * is room for: 0 and *k pages free, or the code of the refusal of one. An
 * import that fits fewer pages is not a write refused: the counters of the
 * refusals it met are taken back. */
static int import_room(engine_t *eng, cache_t *c, size_t *k) {
  int rc = 0;
  while (*k) {
    evict_need_t nd = {*k, NULL, 0, c->q, c->arena};
    if (!(rc = evict_make_room(eng, &nd))) return 0;
    if (rc == KVC_E_FULL) eng->st.full_errors--;
    else if (rc == KVC_E_QUOTA_PAGES) c->q->use.refused_pages--;
    else return rc;
    uint64_t f = eng->err.freeable;
    *k = f < *k ? (size_t)f : *k - 1;
  }
  return rc;
}

/* Stores k pages from w->start under w->parent: cached, the most recent of
 * the default priority. Room and metadata are reserved. Returns how many:
 * fewer when a page's fill refused it. */
static size_t import_pages(engine_t *eng, cache_t *c, const uint32_t *tokens,
                           const engine_pkey_t *key, uint32_t key_id, uint64_t first,
                           const engine_page_in_t *in, const walk_t *w, size_t k) {
  uint32_t T = c->g.T, parent = w->parent;
  uint8_t prev[32];
  if (parent == NOPAGE) prefix_root(eng, c, key, prev);
  else memcpy(prev, page_meta(eng, parent)->hash, 32);
  for (size_t i = 0; i < k; i++) {
    uint64_t m = w->start + i;
    ipage_t *ip;
    const engine_page_in_t *pin = &in[m - first];
    uint32_t cache_id, page = pin->job ? tier_job_page(pin->job, &cache_id) : page_alloc(eng, c);
    if (pin->job) {
      /* filled already */
    } else if (!pin->fill) {
      memcpy(pool_page(&eng->pool, page), pin->bytes, c->g.page_bytes);
    } else if (!pin->fill(pin->arg, pool_page(&eng->pool, page), c->g.page_bytes)) {
      page_unref(eng, c, page, 0); /* refused: freed, nothing points at it */
      return i;
    }
    ip = page_meta_take(eng, c, page);
    (void)prefix_query_hash(eng, c, tokens, m, key, prev, ip->hash); /* as walked */
    memcpy(ip->tokens, eng->page_ids, (size_t)T * sizeof *ip->tokens);
    memcpy(ipage_tags(ip, T), eng->page_tags, (size_t)T * sizeof *ip->tokens);
    ip->hashed = true;
    ip->key = key_id;
    ip->parent = parent;
    if (pin->job) {
      prefix_insert(eng, c, ip);
      tier_job_indexed(eng, pin->job); /* the index's reference, then the job's dropped */
    } else {
      prefix_insert(eng, c, ip); /* the page's one reference is the index's */
      ip->node.prio = PRIO_DEFAULT;
      lru_link(eng, &ip->node, false);
      page_cached_count(eng, c, +1);
    }
    parent = page;
    memcpy(prev, ip->hash, 32);
  }
  return k;
}

int engine_tier_import(engine_t *eng, uint32_t cache_id, const uint32_t *tokens, uint64_t n,
                       const engine_pkey_t *key, uint64_t first, const engine_page_in_t *in,
                       size_t nin, size_t *imported) {
  if (!eng) return KVC_E_INVAL;
  if (!imported || (nin && !in)) return engine_fail(eng, KVC_E_INVAL, "NULL argument");
  *imported = 0;
  for (size_t i = 0; i < nin; i++) {
    uint32_t job_cache = cache_id;
    if (!in[i].hash || (!in[i].bytes && !in[i].fill && !in[i].job))
      return engine_fail(eng, KVC_E_INVAL, "page %zu: NULL", i);
    if (!in[i].job != !in[0].job || (in[i].job && (tier_job_page(in[i].job, &job_cache),
                                                   job_cache != cache_id)))
      return engine_fail(eng, KVC_E_INVAL, "page %zu: a job of another cache, or mixed", i);
  }
  cache_t *c;
  uint32_t key_id;
  int rc = prefix_match_args(eng, cache_id, tokens, n, key, &c, &key_id);
  if (rc) return rc;
  uint64_t whole = n / c->g.T;
  if (first > whole || nin > whole - first) {
    prefix_match_end(eng);
    return engine_fail(eng, KVC_E_RANGE, "pages [%llu, %llu) of a query of %llu pages",
                       (unsigned long long)first, (unsigned long long)(first + nin),
                       (unsigned long long)whole);
  }
  walk_t w = {mem_alloc(&eng->mem, (first + nin + 1) * sizeof *w.held), 0, 0, 0, NOPAGE};
  if (!w.held) {
    prefix_match_end(eng);
    return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  }
  import_walk(eng, c, tokens, key, key_id, first, in, nin, &w);
  size_t k = w.k;
  prefix_keys_cap_t keys_cap = prefix_keys_cap(eng);
  size_t index_cap = c->index.cap;
  bool had_arrays = eng->ip != NULL, new_key = false;
  if (k == 0) goto out;
  if (!key_id && (rc = prefix_key(eng, c->q, key, true, &key_id, &new_key))) goto out;
  if (page_meta_arrays(eng) || hmap_reserve(&c->index, &eng->mem, k + c->index_pending) ||
      page_meta_reserve(eng, c->g.T, k)) {
    rc = engine_fail(eng, KVC_E_NOMEM, "out of memory");
    goto undo;
  }
  /* The query's pages stay while eviction makes room: a cached one leaves
   * its list (a held page is no victim), and goes back the most recent. */
  for (size_t i = 0; i < w.nheld; i++) page_ref(eng, w.held[i]);
  eng->epoch++;
  rc = nin && in[0].job ? 0 : import_room(eng, c, &k); /* jobs hold their pages */
  if (k) k = import_pages(eng, c, tokens, key, key_id, first, in, &w, k);
  for (size_t i = w.nheld; i-- > 0;)
    page_unref(eng, c, w.held[i], page_meta(eng, w.held[i])->node.prio);
  page_meta_unreserve(eng);
  if (k) {
    *imported = k;
    rc = 0;
    goto out;
  }
undo: /* nothing imported: nothing kept */
  page_meta_unreserve(eng);
  if (c->index.cap != index_cap) (void)hmap_resize(&c->index, &eng->mem, index_cap);
  if (!had_arrays && eng->ip) page_meta_arrays_drop(eng);
  if (new_key) prefix_key_forget(eng, c->q, key, keys_cap);
out:
  mem_free(&eng->mem, w.held);
  prefix_match_end(eng);
  return rc;
}

/* ---- tenants ------------------------------------------------------------------ */

int engine_tenant_identity(engine_t *eng, uint32_t tenant, const uint8_t id[32]) {
  if (!eng) return KVC_E_INVAL;
  if (!id) return engine_fail(eng, KVC_E_INVAL, "NULL identity");
  for (uint32_t i = 0; i < eng->nquotas; i++)
    if (eng->quotas[i]->tenant != tenant && memcmp(eng->quotas[i]->ident, id, 32) == 0)
      return engine_fail(eng, KVC_E_EXISTS, "tenant %u has that identity already",
                         eng->quotas[i]->tenant);
  quota_t *q = quota_find(eng, tenant);
  if (q && memcmp(q->ident, id, 32) == 0) return 0;
  if (q && (q->use.caches || q->use.keys))
    return engine_fail(eng, KVC_E_BUSY, "tenant %u holds caches: its identity is fixed", tenant);
  if (!q && quota_open(eng, tenant, &q)) return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  memcpy(q->ident, id, 32);
  return 0;
}
