/* engine.c: the engine's lifecycle and its caches (open, clear, drop, list,
 * stats). The map of the other modules is in doc/design.md. */
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "arena.h"
#include "dtype.h"
#include "evlog.h"
#include "lease.h"
#include "page.h"
#include "prefix.h"
#include "quota.h"
#include "rank.h"
#include "seq.h"
#include "units.h"


const engine_err_t *engine_last_error(const engine_t *eng) { return &eng->err; }

void engine_set_now(engine_t *eng, uint64_t now_ms) { eng->now_ms = now_ms; }

void engine_fail_alloc_after(engine_t *eng, int64_t k) { eng->mem.fail_after = k; }

int engine_new(const engine_config_t *cfg, engine_t **out) {
  if (!cfg || !out || !cfg->base || cfg->page_bytes == 0 || cfg->page_bytes % 64 ||
      cfg->page_bytes > cfg->pool_bytes || cfg->segment_bytes % cfg->page_bytes ||
      cfg->segment_bytes > cfg->pool_bytes || ((uintptr_t)cfg->base % 64) ||
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
  /* An arena per cache, and as many again lingering on leased pages. */
  int rc = pool_init(&eng->pool, &eng->mem, cfg->base, cfg->pool_bytes, cfg->page_bytes,
                     cfg->segment_bytes, cfg->page_align, 2 * eng->max_caches + 2);
  if (rc == 0) {
    engine_pin_limit_follow(eng, cfg->pin_limit_pct);
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
      rank_remove(eng->caches[i]); /* the others' pages still move in the ranking */
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

int engine_cache_layout(engine_t *eng, uint32_t cache_id, const kvc_layout_t **layout) {
  if (!eng || !layout) return KVC_E_INVAL;
  cache_t *c;
  int rc = engine_find_cache(eng, cache_id, &c);
  if (rc) return rc;
  *layout = &c->layout;
  return 0;
}

int engine_cache_open_in(engine_t *eng, uint32_t tenant, const char *name,
                         const kvc_layout_t *layout, uint32_t *cache_id) {
  return engine_cache_open_group(eng, tenant, 0, name, layout, cache_id);
}

int engine_cache_open_group(engine_t *eng, uint32_t tenant, uint32_t group, const char *name,
                            const kvc_layout_t *layout, uint32_t *cache_id) {
  if (!eng) return KVC_E_INVAL;
  if (!name || !layout || !cache_id) return engine_fail(eng, KVC_E_INVAL, "NULL argument");
  if (name_check(name))
    return engine_fail(eng, KVC_E_NAME, "cache name must be 1-%u printable bytes, no spaces",
                       KVC_MAX_NAME);
  geom_t g;
  int rc = layout_geom(layout, &g);
  if (rc == KVC_E_HEADDIM && dtype_is_block(layout->dtype))
    return engine_fail(eng, rc,
                       "invalid layout: q8_0 and q4_0 pages hold whole blocks of 32 values "
                       "along the head dimension: head_dim_k %u and head_dim_v %u must be "
                       "multiples of 32", layout->head_dim_k, layout->head_dim_v);
  if (rc) return engine_fail(eng, rc, "invalid layout: %s", kvc_strerror(rc));
  for (uint32_t i = 0; i < eng->ncaches; i++) {
    cache_t *c = eng->caches[i];
    if (!c || c->tenant != tenant || strcmp(c->name, name) != 0) continue;
    if (!layout_equal(&c->layout, layout)) {
      char diff[512];
      layout_diff(&c->layout, layout, diff, sizeof diff);
      return engine_fail(eng, KVC_E_LAYOUT, "cache '%s' exists with another layout: %s", name,
                         diff);
    }
    *cache_id = c->id;
    return 0;
  }
  char a[UNITS_LEN], b[UNITS_LEN];
  if (pool_stride(&eng->pool, g.page_bytes) > eng->pool.seg_bytes)
    return engine_fail(eng, KVC_E_PAGESIZE,
                       "a page of this layout needs %s, a pool segment holds %s: lower "
                       "page_tokens or raise the pool's segment_bytes",
                       units_bytes(g.page_bytes, a, sizeof a),
                       units_bytes(eng->pool.seg_bytes, b, sizeof b));
  uint32_t slot = 0; /* the first free slot: dropped caches' slots are reused */
  while (slot < eng->ncaches && eng->caches[slot]) slot++;
  if (slot == eng->max_caches)
    return engine_fail(eng, KVC_E_TOOMANY, "at most %u caches", eng->max_caches);
  quota_t *q = quota_find(eng, tenant);
  if (q && (rc = quota_check_caches(eng, q))) return rc;
  int code = 0;
  uint16_t arena = pool_arena_open(&eng->pool, tenant, group, g.page_bytes, &code);
  if (arena == POOL_NOARENA) {
    return engine_fail(eng, KVC_E_TOOMANY, "at most %u arenas (tenant and page size) at once, "
                       "those of caches dropped while leases hold their pages included",
                       eng->pool.arenas_cap);
  }
  cache_t *c = mem_calloc(&eng->mem, 1, sizeof *c);
  /* A new tenant's record comes with room in its ranking (rank.h). */
  if (!c || (q ? rank_reserve(eng, q) : quota_open(eng, tenant, &q))) {
    mem_free(&eng->mem, c);
    pool_arena_close(&eng->pool, arena);
    return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  }
  /* A new arena starts with a segment if one is free (evict.c takes one
   * back from another arena when none is). */
  if (!eng->pool.arenas[arena].nseg) (void)arena_take_free(eng, arena, false);
  c->arena = arena;
  c->q = q;
  q->use.caches++;
  memcpy(c->name, name, strlen(name) + 1);
  c->id = slot | (uint32_t)eng->cache_gen[slot] << CACHE_GEN_SHIFT;
  c->tenant = tenant;
  c->layout = layout_normalize(layout);
  c->g = g;
  hmap_init(&c->seqs);
  prefix_cache_init(eng, c);
  rank_add(c);
  eng->caches[slot] = c;
  if (slot == eng->ncaches) eng->ncaches++;
  eng->ncaches_open++;
  *cache_id = c->id;
  return 0;
}

void engine_set_segment_hook(engine_t *eng,
                             void (*fn)(void *ctx, uint32_t seg, uint64_t from_owner,
                                        uint64_t to_owner),
                             void *ctx) {
  eng->seg_hook = fn;
  eng->seg_ctx = ctx;
}

static void arena_info_fill(const pool_t *p, uint16_t a, engine_arena_info_t *o) {
  const pool_arena_t *ar = &p->arenas[a];
  uint64_t used = 0;
  for (uint32_t s = 0; s < p->nseg; s++)
    if (p->seg_arena[s] == a) used += p->seg_used[s];
  *o = (engine_arena_info_t){.id = a, .uid = ar->uid, .tenant = ar->tenant, .group = ar->group,
                             .page_bytes = ar->page_bytes, .stride = ar->stride,
                             .per_seg = ar->per_seg, .segments = ar->nseg,
                             .caches = ar->ncaches, .pages_used = used,
                             .pages_free = ar->nfree,
                             .padding_bytes = (uint64_t)ar->nseg *
                                              (p->seg_bytes - ar->per_seg * ar->page_bytes),
                             .segs_taken = ar->segs_taken, .segs_given = ar->segs_given};
}

void engine_arenas(const engine_t *eng, engine_arena_info_t *out, size_t cap, size_t *n) {
  const pool_t *p = &eng->pool;
  size_t k = 0;
  for (uint32_t a = 0; a < p->narenas; a++) {
    if (!p->arenas[a].live) continue;
    if (k < cap) arena_info_fill(p, (uint16_t)a, &out[k]);
    k++;
  }
  *n = k;
}

int engine_arena_by_id(const engine_t *eng, uint16_t a, engine_arena_info_t *out) {
  if (a >= eng->pool.narenas || !eng->pool.arenas[a].live) return KVC_E_INVAL;
  const pool_arena_t *ar = &eng->pool.arenas[a];
  /* The cheap fields: no walk of the segments for pages in use. */
  *out = (engine_arena_info_t){.id = a, .uid = ar->uid, .tenant = ar->tenant, .group = ar->group,
                               .page_bytes = ar->page_bytes, .stride = ar->stride,
                               .per_seg = ar->per_seg, .segments = ar->nseg,
                               .caches = ar->ncaches, .pages_free = ar->nfree};
  return 0;
}

uint16_t engine_segment_arena(const engine_t *eng, uint32_t seg) {
  return seg < eng->pool.nseg ? eng->pool.seg_arena[seg] : ENGINE_NOARENA;
}

void engine_set_pin_share(engine_t *eng, bool on) { eng->pin_share = on; }

void engine_pin_limit_follow(engine_t *eng, uint32_t pct) {
  pct = pct && pct < 100 ? pct : 100;
  eng->pin_limit_pct = pct;
  eng->pin_limit = (uint64_t)eng->pool.nseg * eng->pool.seg_bytes * pct / 100;
}

int engine_set_pin_limit(engine_t *eng, uint32_t pct) {
  if (!eng) return KVC_E_INVAL;
  if (pct > 100) return engine_fail(eng, KVC_E_INVAL, "pin limit of %u%%", pct);
  engine_pin_limit_follow(eng, pct);
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
  rank_remove(c);
  eng->ncaches_open--;
  pool_arena_close(&eng->pool, c->arena);
  uint32_t slot = cache_id & CACHE_SLOT_MASK;
  eng->caches[slot] = NULL;
  eng->cache_gen[slot]++; /* the old id names nothing now */
  mem_free(&eng->mem, c);
  return 0;
}

uint64_t engine_page_pool_offset(const engine_t *eng, uint32_t page) {
  return pool_page_offset(&eng->pool, page);
}

uint64_t engine_cache_stride(engine_t *eng, uint32_t cache_id) {
  cache_t *c = eng ? engine_cache(eng, cache_id) : NULL;
  return c ? eng->pool.arenas[c->arena].stride : 0;
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

int engine_cache_ranked(const engine_t *eng, uint32_t tenant, size_t pos, uint32_t *cache_id,
                        uint64_t *pages) {
  const quota_t *q = eng ? quota_find(eng, tenant) : NULL;
  if (!q || pos >= q->nrank) return KVC_E_RANGE;
  if (cache_id) *cache_id = q->rank[pos]->id;
  if (pages) *pages = q->rank[pos]->st.pages;
  return 0;
}

size_t engine_tenants(const engine_t *eng, uint32_t *out, size_t cap) {
  for (uint32_t i = 0; i < eng->nquotas && i < cap; i++) out[i] = eng->quotas[i]->tenant;
  return eng->nquotas;
}

size_t engine_caches_named(const engine_t *eng, const char *name, uint32_t *ids, size_t cap) {
  size_t k = 0;
  for (uint32_t i = 0; i < eng->ncaches; i++) {
    const cache_t *c = eng->caches[i];
    if (!c || strcmp(c->name, name) != 0) continue;
    if (k < cap) ids[k] = c->id;
    k++;
  }
  return k;
}

void engine_stats(const engine_t *eng, engine_stats_t *out) {
  *out = eng->st;
  const pool_t *p = &eng->pool;
  out->pool_bytes = (uint64_t)p->nseg * p->seg_bytes;
  out->page_bytes = p->grain;
  out->segment_bytes = p->seg_bytes;
  out->segments = p->nseg;
  out->segments_free = p->nseg_free;
  /* A free segment counts as pages of the grain: with one page size
   * (segment = grain = page) the figures are the pool's pages. */
  out->pages_free = p->nfree + (uint64_t)p->nseg_free * p->ids_per_seg;
  out->pool_pages = p->nused + out->pages_free;
  out->pages_used = p->nused;
  out->pages_shared = p->nshared - eng->index_sole; /* the index's reference is no sharer */
  out->pages_pinned = p->npinned;
  out->bytes_used = eng->bytes_used;
  /* What the segments of arenas cannot hold: each page's stride past its
   * layout's bytes, each segment's tail past its last page. */
  uint64_t carved = 0, layout = 0;
  out->arenas = 0;
  for (uint32_t a = 0; a < p->narenas; a++) {
    const pool_arena_t *ar = &p->arenas[a];
    if (!ar->live) continue;
    out->arenas++;
    carved += (uint64_t)ar->nseg * p->seg_bytes;
    layout += (uint64_t)ar->nseg * ar->per_seg * ar->page_bytes;
  }
  out->bytes_padding = carved - layout;
  out->bytes_free = out->pool_bytes - p->used_bytes;
  out->metadata_bytes = eng->mem.live_bytes;
  out->caches = eng->ncaches_open;
  out->sequences = eng->nseqs;
  out->sequences_pinned = eng->nseqs_pinned;
  out->tokens = eng->ntokens;
}
