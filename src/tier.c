/* tier.c: what the engine does for the disk tier (engine_tier.h): hands
 * reclaimed cached pages to a callback, probes a query's chain past what is
 * resident, and takes pages back into the prefix index once they verify.
 *
 *   spill:   evict -> prefix_reclaim -> tier_spill(meta, bytes) -> (freed)
 *   import:  begin: page_alloc (evicting as a put would), held by an
 *            internal lease                  refcnt 1 (the lease)
 *            caller fills the bytes (any thread)
 *            end:   verify, index            refcnt 2 (lease + index)
 *                   drop the lease           refcnt 1: cached, most recent
 *
 * Holding the page with an internal lease (lease.c) means the audit, the
 * eviction planner and the stats already know what it is: a page held by a
 * reader, never a victim, freed with its last reference.
 */
#include <string.h>

#include "engine_tier.h"
#include "evict.h"
#include "evlog.h"
#include "lease.h"
#include "lru.h"
#include "page.h"
#include "pageio.h"
#include "prefix.h"

#define NOPAGE POOL_NOPAGE

struct engine_tier_job {
  uint32_t cache_id;
  uint32_t page;
  lease_t *hold;   /* the page's only reference until the end */
};

static uint64_t key64(const uint8_t h[32]) {
  uint64_t k;
  memcpy(&k, h, 8);
  return k;
}

static void spill_hook(engine_t *eng, const ipage_t *ip);

void engine_set_spill(engine_t *eng, engine_spill_fn fn, void *ctx) {
  if (!eng) return;
  eng->spill = fn;
  eng->spill_ctx = fn ? ctx : NULL;
  eng->reclaim_hook = fn ? spill_hook : NULL;
}

/* The metadata of an indexed page; false if it cannot go to the tier (a
 * position with a span key, an unknown key). */
static bool meta_of(engine_t *eng, const ipage_t *ip, engine_tier_meta_t *m) {
  const cache_t *c = ip->cache;
  uint32_t T = c->g.T;
  const uint32_t *tags = ipage_tags_c(ip, T);
  for (uint32_t t = 0; t < T; t++)
    if (tags[t]) return false;
  engine_pkey_t k;
  if (!prefix_key_get(eng, ip->key, &k)) return false;
  memset(m, 0, sizeof *m);
  m->tenant = c->tenant;
  memcpy(m->cache, c->name, sizeof m->cache);
  m->layout = c->layout;
  m->hash_kind = (uint32_t)eng->hash_kind;
  m->page_tokens = T;
  m->data_bytes = c->g.page_bytes;
  memcpy(m->hash, ip->hash, 32);
  m->head = ip->parent == NOPAGE;
  if (!m->head) memcpy(m->parent, page_meta(eng, ip->parent)->hash, 32);
  m->salt.len = (uint8_t)k.salt_len;
  if (k.salt_len) memcpy(m->salt.bytes, k.salt, k.salt_len);
  m->extra.len = (uint8_t)k.extra_len;
  if (k.extra_len) memcpy(m->extra.bytes, k.extra, k.extra_len);
  m->tokens = ip->tokens;
  return true;
}

/* A cached page is being reclaimed (prefix_reclaim, before the page is
 * freed): the callback may keep it. */
static void spill_hook(engine_t *eng, const ipage_t *ip) {
  engine_tier_meta_t m;
  if (eng->spill && meta_of(eng, ip, &m)) {
    m.more = eng->reclaims_left;
    eng->spill(eng->spill_ctx, &m, pool_page(&eng->pool, ip->page));
  }
}

size_t engine_tier_each(engine_t *eng, engine_spill_fn fn, void *ctx) {
  size_t n = 0;
  engine_tier_meta_t m;
  for (uint32_t page = 0; eng && fn && eng->ip && page < eng->pool.npages; page++) {
    const ipage_t *ip = eng->ip[page];
    if (!ip || !ip->indexed || !meta_of(eng, ip, &m)) continue;
    fn(ctx, &m, pool_page(&eng->pool, page));
    n++;
  }
  return n;
}

static int key_check(engine_t *eng, const engine_pkey_t *key) {
  if (key && (key->salt_len > KVC_MAX_KEY_BYTES || key->extra_len > KVC_MAX_KEY_BYTES ||
              (key->salt_len && !key->salt) || (key->extra_len && !key->extra)))
    return engine_fail(eng, KVC_E_INVAL, "salt and extra key are at most %u bytes",
                       KVC_MAX_KEY_BYTES);
  return 0;
}

/* Whether a span key of the query covers a position of [b, e). */
static bool spanned(const engine_pkey_t *key, uint64_t b, uint64_t e) {
  for (size_t i = 0; key && i < key->nspans; i++)
    if (key->spans[i].begin < e && key->spans[i].end > b) return true;
  return false;
}

int engine_tier_probe(engine_t *eng, uint32_t cache_id, const uint32_t *tokens, uint64_t n,
                      const engine_pkey_t *key, uint8_t (*hashes)[32], size_t cap,
                      uint64_t *resident, size_t *nout) {
  if (!eng) return KVC_E_INVAL;
  if (!resident || !nout || (cap && !hashes) || (n && !tokens))
    return engine_fail(eng, KVC_E_INVAL, "NULL argument");
  cache_t *c;
  int rc = engine_find_cache(eng, cache_id, &c);
  if (rc || (rc = key_check(eng, key))) return rc;
  if (n > KVC_MAX_SEQ_TOKENS)
    return engine_fail(eng, KVC_E_RANGE, "%llu tokens: more than a sequence holds",
                       (unsigned long long)n);
  uint32_t T = c->g.T;
  uint8_t prev[32], h[32];
  bool in_memory = true;
  *resident = 0;
  *nout = 0;
  prefix_root_hash(eng, c, key, prev);
  /* Advisory: the ids are hashed in place (they may change meanwhile); the
   * match that follows copies and verifies them. */
  for (uint64_t m = 0; (m + 1) * T <= n && *nout < cap; m++) {
    if (spanned(key, m * T, (m + 1) * T)) break;
    prefix_page_hash(eng, prev, tokens + m * T, T, key, h);
    memcpy(prev, h, 32);
    if (in_memory) {
      ipage_t *ip = hmap_get(&c->index, key64(h));
      if (ip && memcmp(ip->hash, h, 32) == 0) {
        /* Most recent, as a hit makes it: the pages read after it must not
         * push out the parent they are imported under. */
        if (ip->node.prev) {
          lru_unlink(&ip->node);
          lru_link(eng, &ip->node, false);
        }
        (*resident)++;
        continue;
      }
      in_memory = false;
    }
    memcpy(hashes[(*nout)++], h, 32);
  }
  return 0;
}

int engine_tier_import_begin(engine_t *eng, uint32_t cache_id, engine_tier_job_t **job,
                             void **bytes) {
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
  return 0;
}

void engine_tier_import_abort(engine_t *eng, engine_tier_job_t *job) {
  if (!eng || !job) return;
  lease_t *hold = job->hold;
  mem_free(&eng->mem, job);
  lease_drop(eng, hold); /* frees the page */
}

uint32_t tier_job_page(const engine_tier_job_t *job, uint32_t *cache_id) {
  *cache_id = job->cache_id;
  return job->page;
}

void tier_job_indexed(engine_t *eng, engine_tier_job_t *job) {
  uint32_t page = job->page;
  lease_t *hold = job->hold;
  mem_free(&eng->mem, job);
  pool_ref(&eng->pool, page); /* the index's */
  page_index_sole(eng, page, 0, eng->pool.refcnt[page]);
  lease_drop(eng, hold); /* only the index holds it now: cached, most recent */
}

/* Whether m describes a page of c as this engine would write it. */
static int meta_check(engine_t *eng, const cache_t *c, const engine_tier_meta_t *m) {
  if (m->tenant != c->tenant || strncmp(m->cache, c->name, sizeof m->cache) != 0)
    return engine_fail(eng, KVC_E_INVAL, "a page of another cache or tenant");
  if (!layout_equal(&m->layout, &c->layout) || m->page_tokens != c->g.T ||
      m->data_bytes != c->g.page_bytes || !m->tokens)
    return engine_fail(eng, KVC_E_INVAL, "a page of another layout");
  if (m->hash_kind != (uint32_t)eng->hash_kind)
    return engine_fail(eng, KVC_E_INVAL, "a page hashed with another prefix_hash");
  if (m->salt.len > KVC_MAX_KEY_BYTES || m->extra.len > KVC_MAX_KEY_BYTES)
    return engine_fail(eng, KVC_E_INVAL, "a key longer than %u bytes", KVC_MAX_KEY_BYTES);
  return 0;
}

int engine_tier_import_end(engine_t *eng, engine_tier_job_t *job, const engine_tier_meta_t *m,
                           bool ok) {
  if (!eng || !job) return KVC_E_INVAL;
  engine_tier_job_t j = *job;
  mem_free(&eng->mem, job);
  cache_t *c = NULL;
  ipage_t *par = NULL;
  int rc = ok && m ? engine_find_cache(eng, j.cache_id, &c)
                   : engine_fail(eng, KVC_E_INVAL, "the page was not read whole");
  if (rc || (rc = meta_check(eng, c, m))) goto drop;
  uint32_t T = c->g.T;
  if (hmap_get(&c->index, key64(m->hash))) {
    rc = engine_fail(eng, KVC_E_EXISTS, "the page is indexed already");
    goto drop;
  }
  engine_pkey_t key = {m->salt.bytes, m->salt.len, m->extra.bytes, m->extra.len, NULL, 0};
  uint8_t ph[32], h[32];
  if (m->head) {
    prefix_root_hash(eng, c, &key, ph);
  } else {
    /* A chain in the index is whole from its head: the parent must be in. */
    par = hmap_get(&c->index, key64(m->parent));
    if (!par || memcmp(par->hash, m->parent, 32) != 0) {
      rc = engine_fail(eng, KVC_E_INVAL, "its parent page is not in the index");
      goto drop;
    }
    memcpy(ph, par->hash, 32);
  }
  /* The seed is the cache's tenant, name and layout: a page of any other
   * cache, or with other ids or key, cannot give this hash. */
  prefix_page_hash(eng, ph, m->tokens, T, &key, h);
  if (memcmp(h, m->hash, 32) != 0) {
    rc = engine_fail(eng, KVC_E_INVAL, "its chain hash does not verify");
    goto drop;
  }
  size_t icap = c->index.cap;
  if (page_meta_arrays(eng) ||
      hmap_reserve(&c->index, &eng->mem, 1 + c->index_pending) ||
      page_meta_reserve(eng, T, 1)) {
    (void)hmap_resize(&c->index, &eng->mem, icap);
    rc = engine_fail(eng, KVC_E_NOMEM, "out of memory");
    goto drop;
  }
  prefix_keys_cap_t kcap = prefix_keys_cap(eng);
  uint32_t key_id;
  bool created;
  if ((rc = prefix_key(eng, c->q, &key, true, &key_id, &created)) ||
      (par && par->key != key_id)) {
    if (!rc) {
      if (created) prefix_key_forget(eng, c->q, &key, kcap);
      rc = engine_fail(eng, KVC_E_INVAL, "its key differs from its parent's");
    }
    page_meta_unreserve(eng);
    (void)hmap_resize(&c->index, &eng->mem, icap);
    goto drop;
  }
  ipage_t *ip = page_meta_take(eng, c, j.page);
  memcpy(ip->tokens, m->tokens, (size_t)T * sizeof *ip->tokens); /* tags stay 0 */
  memcpy(ip->hash, m->hash, 32);
  ip->hashed = true;
  ip->key = key_id;
  ip->parent = par ? par->page : NOPAGE;
  hmap_insert(&c->index, key64(ip->hash), ip);
  ip->indexed = true;
  pool_ref(&eng->pool, j.page); /* the index's reference */
  page_index_sole(eng, j.page, 0, eng->pool.refcnt[j.page]);
  if (par) par->nchildren++;
  eng->st.pages_indexed++;
  c->st.pages_indexed++;
  if (eng->ev) evlog_stored(eng, c, ip, par ? par->hash : NULL); /* back in the index */
  page_meta_unreserve(eng);
  lease_drop(eng, j.hold); /* only the index holds it now: cached, most recent */
  return 0;
drop:
  lease_drop(eng, j.hold); /* frees the page */
  return rc;
}
