/* engine.c: the engine's lifecycle and its caches (open, clear, drop, list,
 * stats). The map of the other modules is in doc/design.md. */
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "evlog.h"
#include "lease.h"
#include "page.h"
#include "prefix.h"
#include "quota.h"
#include "seq.h"


const engine_err_t *engine_last_error(const engine_t *eng) { return &eng->err; }

void engine_set_now(engine_t *eng, uint64_t now_ms) { eng->now_ms = now_ms; }

void engine_fail_alloc_after(engine_t *eng, int64_t k) { eng->mem.fail_after = k; }

int engine_new(const engine_config_t *cfg, engine_t **out) {
  if (!cfg || !out || !cfg->base || cfg->page_bytes == 0 || cfg->page_bytes % 64 ||
      cfg->page_bytes > cfg->pool_bytes || ((uintptr_t)cfg->base % 64) ||
      cfg->hash > KVC_HASH_XXH3 || cfg->pin_limit_pct > 100)
    return KVC_E_INVAL;
  mem_t m;
  mem_init(&m);
  engine_t *eng = mem_calloc(&m, 1, sizeof *eng);
  if (!eng) return KVC_E_NOMEM;
  eng->mem = m;
  eng->max_caches = cfg->max_caches ? cfg->max_caches : 64;
  if (eng->max_caches > CACHE_SLOTS_MAX) eng->max_caches = CACHE_SLOTS_MAX;
  eng->max_seqs = cfg->max_seqs;
  for (uint32_t p = 0; p < PRIO_LEVELS; p++) {
    eng->lru[p].next = eng->lru[p].prev = &eng->lru[p];
    eng->lru[p].prio = (uint8_t)p;
  }
  hmap_init(&eng->owners);
  hmap_init(&eng->keys);
  hmap_init(&eng->key_ids);
  eng->hash_kind = cfg->hash;
  eng->hash_bits = cfg->hash_bits;
  hmap_init(&eng->leases);
  hmap_init(&eng->quota_map);
  int rc = pool_init(&eng->pool, &eng->mem, cfg->base, cfg->pool_bytes, cfg->page_bytes);
  if (rc == 0) {
    uint32_t pct = cfg->pin_limit_pct && cfg->pin_limit_pct < 100 ? cfg->pin_limit_pct : 100;
    eng->pin_limit = (uint32_t)((uint64_t)eng->pool.npages * pct / 100);
    eng->caches = mem_calloc(&eng->mem, eng->max_caches, sizeof *eng->caches);
    eng->cache_gen = mem_calloc(&eng->mem, eng->max_caches, sizeof *eng->cache_gen);
    eng->page_quota = mem_calloc(&eng->mem, eng->pool.npages, sizeof *eng->page_quota);
    eng->md_ctx = EVP_MD_CTX_new(); /* lease_ref: at the first client lease */
    if (!eng->caches || !eng->cache_gen || !eng->page_quota || !eng->md_ctx) rc = KVC_E_NOMEM;
  }
  if (rc) {
    engine_free(eng);
    return rc;
  }
  *out = eng;
  return 0;
}

/* Drops every sequence and index entry of c; keep_seqs keeps its map. */
static void cache_free(engine_t *eng, cache_t *c, bool keep_seqs) {
  size_t pos = 0;
  seq_t *s;
  /* Dropping shifts map entries back; rescan until the map is empty. */
  while (c->seqs.count) {
    pos = 0;
    while ((s = hmap_next(&c->seqs, &pos, NULL))) {
      seq_drop(eng, s);
      if (pos > 0) pos--; /* the slot may have been refilled by a shift */
    }
  }
  prefix_cache_clear(eng, c);
  if (!keep_seqs) hmap_deinit(&c->seqs, &eng->mem);
}

void engine_free(engine_t *eng) {
  if (!eng) return;
  if (eng->caches) {
    for (uint32_t i = 0; i < eng->ncaches; i++) {
      if (!eng->caches[i]) continue;
      cache_free(eng, eng->caches[i], false);
      mem_free(&eng->mem, eng->caches[i]);
    }
    mem_free(&eng->mem, eng->caches);
  }
  mem_free(&eng->mem, eng->cache_gen);
  size_t pos = 0;
  void *k;
  while ((k = hmap_next(&eng->keys, &pos, NULL))) mem_free(&eng->mem, k);
  hmap_deinit(&eng->keys, &eng->mem);
  hmap_deinit(&eng->key_ids, &eng->mem);
  hmap_deinit(&eng->owners, &eng->mem);
  lease_free_all(eng);
  quota_free_all(eng);
  mem_free(&eng->mem, eng->page_quota);
  mem_free(&eng->mem, eng->lease_ref);
  mem_free(&eng->mem, eng->ip);
  mem_free(&eng->mem, eng->scratch);
  mem_free(&eng->mem, eng->page_ids);
  mem_free(&eng->mem, eng->qtags);
  page_meta_unreserve(eng);
  evlog_free(eng);
  EVP_MD_CTX_free(eng->md_ctx);
  pool_deinit(&eng->pool, &eng->mem);
  mem_t m = eng->mem;
  mem_free(&m, eng);
}


int64_t engine_layout_page_bytes(const kvc_layout_t *layout) {
  geom_t g;
  if (!layout) return KVC_E_INVAL;
  int rc = layout_geom(layout, &g);
  return rc ? rc : (int64_t)g.page_bytes;
}

static int name_check(const char *name) {
  size_t n = strnlen(name, KVC_MAX_NAME + 1);
  if (n == 0 || n > KVC_MAX_NAME) return KVC_E_NAME;
  for (size_t i = 0; i < n; i++)
    if (name[i] <= ' ' || name[i] > '~') return KVC_E_NAME;
  return 0;
}

int engine_cache_open(engine_t *eng, const char *name, const kvc_layout_t *layout,
                      uint32_t *cache_id) {
  return engine_cache_open_in(eng, 0, name, layout, cache_id);
}

int engine_cache_tenant(engine_t *eng, uint32_t cache_id, uint32_t *tenant) {
  if (!eng || !tenant) return KVC_E_INVAL;
  cache_t *c;
  int rc = engine_find_cache(eng, cache_id, &c);
  if (rc) return rc;
  *tenant = c->tenant;
  return 0;
}

int engine_cache_open_in(engine_t *eng, uint32_t tenant, const char *name,
                         const kvc_layout_t *layout, uint32_t *cache_id) {
  if (!eng) return KVC_E_INVAL;
  if (!name || !layout || !cache_id) return engine_fail(eng, KVC_E_INVAL, "NULL argument");
  if (name_check(name))
    return engine_fail(eng, KVC_E_NAME, "cache name must be 1-%u printable bytes, no spaces",
                       KVC_MAX_NAME);
  geom_t g;
  int rc = layout_geom(layout, &g);
  if (rc) return engine_fail(eng, rc, "invalid layout: %s", kvc_strerror(rc));
  for (uint32_t i = 0; i < eng->ncaches; i++) {
    cache_t *c = eng->caches[i];
    if (!c || c->tenant != tenant || strcmp(c->name, name) != 0) continue;
    if (!layout_equal(&c->layout, layout))
      return engine_fail(eng, KVC_E_LAYOUT, "cache '%s' exists with another layout", name);
    *cache_id = c->id;
    return 0;
  }
  if (g.page_bytes > eng->pool.page_bytes)
    return engine_fail(eng, KVC_E_PAGESIZE,
                       "a page of this layout needs %llu bytes, a pool page has %llu: "
                       "lower page_tokens or raise the pool's page size",
                       (unsigned long long)g.page_bytes,
                       (unsigned long long)eng->pool.page_bytes);
  uint32_t slot = 0; /* the first free slot: dropped caches' slots are reused */
  while (slot < eng->ncaches && eng->caches[slot]) slot++;
  if (slot == eng->max_caches)
    return engine_fail(eng, KVC_E_TOOMANY, "at most %u caches", eng->max_caches);
  quota_t *q = quota_find(eng, tenant);
  if (q && (rc = quota_check_caches(eng, q))) return rc;
  cache_t *c = mem_calloc(&eng->mem, 1, sizeof *c);
  if (!c || (!q && quota_open(eng, tenant, &q))) {
    mem_free(&eng->mem, c);
    return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  }
  c->q = q;
  q->use.caches++;
  memcpy(c->name, name, strlen(name) + 1);
  c->id = slot | (uint32_t)eng->cache_gen[slot] << CACHE_GEN_SHIFT;
  c->tenant = tenant;
  c->layout = layout_normalize(layout);
  c->g = g;
  hmap_init(&c->seqs);
  prefix_cache_init(eng, c);
  eng->caches[slot] = c;
  if (slot == eng->ncaches) eng->ncaches++;
  *cache_id = c->id;
  return 0;
}

int engine_set_pin_limit(engine_t *eng, uint32_t pct) {
  if (!eng) return KVC_E_INVAL;
  if (pct > 100) return engine_fail(eng, KVC_E_INVAL, "pin limit of %u%%", pct);
  eng->pin_limit = (uint32_t)((uint64_t)eng->pool.npages * (pct ? pct : 100) / 100);
  return 0;
}

int engine_cache_clear(engine_t *eng, uint32_t cache_id) {
  if (!eng) return KVC_E_INVAL;
  cache_t *c;
  int rc = engine_find_cache(eng, cache_id, &c);
  if (rc) return rc;
  if (c->nbusy) return cache_busy(eng, c);
  cache_free(eng, c, true);
  if (eng->ev) evlog_cache(eng, c, ENGINE_EV_CLEARED);
  return 0;
}

int engine_cache_drop(engine_t *eng, uint32_t cache_id) {
  if (!eng) return KVC_E_INVAL;
  cache_t *c;
  int rc = engine_find_cache(eng, cache_id, &c);
  if (rc) return rc;
  if (c->nbusy) return cache_busy(eng, c);
  cache_free(eng, c, false);
  if (eng->ev) evlog_cache(eng, c, ENGINE_EV_DROPPED);
  c->q->use.caches--;
  uint32_t slot = cache_id & CACHE_SLOT_MASK;
  eng->caches[slot] = NULL;
  eng->cache_gen[slot]++; /* the old id names nothing now */
  mem_free(&eng->mem, c);
  return 0;
}

static void cache_info_fill(const cache_t *c, kvc_cache_info_t *out) {
  memset(out, 0, sizeof *out);
  memcpy(out->name, c->name, sizeof out->name);
  out->cache_id = c->id;
  out->layout = c->layout;
  out->page_bytes = c->g.page_bytes;
  out->sequences = c->st.sequences;
  out->tokens = c->st.tokens;
  out->pages = c->st.pages;
}

int engine_cache_list(engine_t *eng, kvc_cache_info_t *out, size_t cap, size_t *n) {
  if (!eng || !n || (cap && !out)) return KVC_E_INVAL;
  size_t k = 0;
  for (uint32_t i = 0; i < eng->ncaches; i++) {
    if (!eng->caches[i]) continue;
    if (k < cap) cache_info_fill(eng->caches[i], &out[k]);
    k++;
  }
  *n = k;
  return 0;
}

int engine_cache_info(engine_t *eng, uint32_t cache_id, kvc_cache_info_t *out) {
  if (!eng || !out) return KVC_E_INVAL;
  cache_t *c;
  int rc = engine_find_cache(eng, cache_id, &c);
  if (rc) return rc;
  cache_info_fill(c, out);
  return 0;
}

int engine_cache_stats(engine_t *eng, uint32_t cache_id, cache_stats_t *out) {
  if (!eng || !out) return KVC_E_INVAL;
  cache_t *c;
  int rc = engine_find_cache(eng, cache_id, &c);
  if (rc) return rc;
  *out = c->st;
  return 0;
}

void engine_stats(const engine_t *eng, engine_stats_t *out) {
  *out = eng->st;
  const pool_t *p = &eng->pool;
  out->pool_bytes = (uint64_t)p->npages * p->page_bytes;
  out->page_bytes = p->page_bytes;
  out->pool_pages = p->npages;
  out->pages_free = p->nfree;
  out->pages_used = p->npages - p->nfree;
  out->pages_shared = p->nshared - eng->index_sole; /* the index's reference is no sharer */
  out->pages_pinned = p->npinned;
  out->bytes_used = eng->bytes_used;
  out->bytes_padding = out->pages_used * p->page_bytes - eng->bytes_used;
  out->metadata_bytes = eng->mem.live_bytes;
  out->caches = 0;
  for (uint32_t i = 0; i < eng->ncaches; i++) out->caches += eng->caches[i] != NULL;
  out->sequences = eng->nseqs;
  out->sequences_pinned = eng->nseqs_pinned;
  out->tokens = eng->ntokens;
}
