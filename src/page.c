/* page.c: the lifecycle of a pool page beneath everything that holds it
 * (sequences, leases, the prefix index): references, the token metadata
 * beside a page, and the "cached" state of an indexed page only the index
 * holds.
 *
 *   holders of page p:  seq tables + leases + (index, if indexed)  = refcnt
 *   indexed, refcnt 1   only the index holds it: cached, on an LRU list
 *   refcnt 0            free: the metadata goes with it
 */
#include "page.h"

#include <string.h>

#include "lru.h"
#include "quota.h"

#define NOPAGE POOL_NOPAGE

int page_meta_arrays(engine_t *eng) {
  if (eng->ip) return 0;
  uint32_t n = eng->pool.npages;
  ipage_t **ip = mem_calloc(&eng->mem, n, sizeof *ip);
  uint32_t *scratch = mem_calloc(&eng->mem, (size_t)n * 2, sizeof *scratch);
  if (!ip || !scratch) {
    mem_free(&eng->mem, ip);
    mem_free(&eng->mem, scratch);
    return KVC_E_NOMEM;
  }
  eng->ip = ip;
  eng->scratch = scratch;
  return 0;
}

void page_meta_arrays_drop(engine_t *eng) {
  mem_free(&eng->mem, eng->ip);
  mem_free(&eng->mem, eng->scratch);
  eng->ip = NULL;
  eng->scratch = NULL;
}

static size_t ipage_size(uint32_t T) { return sizeof(ipage_t) + (size_t)T * 2 * sizeof(uint32_t); }

int page_meta_reserve(engine_t *eng, uint32_t page_tokens, uint64_t n) {
  for (uint64_t i = 0; i < n; i++) {
    void **b = mem_alloc(&eng->mem, ipage_size(page_tokens));
    if (!b) {
      page_meta_unreserve(eng);
      return KVC_E_NOMEM;
    }
    *b = eng->reserve;
    eng->reserve = b;
  }
  return 0;
}

void page_meta_unreserve(engine_t *eng) {
  while (eng->reserve) {
    void **b = eng->reserve;
    eng->reserve = *b;
    mem_free(&eng->mem, b);
  }
}

ipage_t *page_meta_take(engine_t *eng, const cache_t *c, uint32_t page) {
  void **b = eng->reserve;
  eng->reserve = *b;
  ipage_t *ip = (ipage_t *)(void *)b;
  memset(ip, 0, ipage_size(c->g.T));
  ip->node.kind = LRU_PAGE;
  ip->cache = (cache_t *)c;
  ip->page = page;
  ip->parent = NOPAGE;
  eng->ip[page] = ip;
  return ip;
}

void page_cached_count(engine_t *eng, cache_t *c, int delta) {
  eng->st.pages_cached = (uint64_t)((int64_t)eng->st.pages_cached + delta);
  c->st.pages_cached = (uint64_t)((int64_t)c->st.pages_cached + delta);
}

/* The pool counts a page with two references as shared; for an indexed page
 * one of them is the index's. index_sole counts those, to subtract. */
void page_index_sole(engine_t *eng, uint32_t page, uint32_t before, uint32_t after) {
  const ipage_t *ip = page_meta(eng, page);
  if (!ip || !ip->indexed) return;
  eng->index_sole += (after == 2) - (before == 2);
}

void page_ref(engine_t *eng, uint32_t page) {
  ipage_t *ip = page_meta(eng, page);
  uint32_t r = eng->pool.refcnt[page];
  if (ip && ip->indexed && r == 1) { /* leaves the cached state */
    lru_unlink(&ip->node);
    page_cached_count(eng, ip->cache, -1);
  }
  pool_ref(&eng->pool, page);
  page_index_sole(eng, page, r, r + 1);
}

void page_unref(engine_t *eng, const cache_t *c, uint32_t page, uint8_t prio) {
  page_unref_bytes(eng, c->g.page_bytes, page, prio);
}

void page_unref_bytes(engine_t *eng, uint64_t layout_bytes, uint32_t page, uint8_t prio) {
  uint32_t r = eng->pool.refcnt[page];
  page_index_sole(eng, page, r, r - 1);
  if (r == 1) quota_page_free(eng, page); /* before its segment may leave its arena */
  if (pool_unref(&eng->pool, page)) {
    eng->bytes_used -= layout_bytes;
    if (eng->ip) {
      mem_free(&eng->mem, eng->ip[page]);
      eng->ip[page] = NULL;
    }
    return;
  }
  ipage_t *ip = page_meta(eng, page);
  if (ip && ip->indexed && eng->pool.refcnt[page] == 1) { /* only the index holds it */
    ip->node.prio = prio;
    lru_link(eng, &ip->node, eng->evicting);
    page_cached_count(eng, ip->cache, +1);
  }
}

uint32_t page_alloc(engine_t *eng, const cache_t *c) {
  uint32_t page = pool_alloc(&eng->pool, c->arena);
  eng->bytes_used += c->g.page_bytes;
  quota_page_alloc(eng, page, c->q);
  return page;
}

void page_pin(engine_t *eng, uint32_t page) {
  pool_pin(&eng->pool, page);
  if (eng->pool.pinref[page] == 1) {
    quota_t *q = quota_of_page(eng, page);
    q->use.pinned++;
    q->use.pinned_bytes += pool_page_stride(&eng->pool, page);
  }
}

void page_unpin(engine_t *eng, uint32_t page) {
  pool_unpin(&eng->pool, page);
  if (eng->pool.pinref[page] == 0) {
    quota_t *q = quota_of_page(eng, page);
    q->use.pinned--;
    q->use.pinned_bytes -= pool_page_stride(&eng->pool, page);
  }
}

void page_meta_copied(engine_t *eng, uint32_t from, uint32_t to) {
  ipage_t *src = page_meta(eng, from);
  if (!src) return;
  ipage_t *ip = page_meta_take(eng, src->cache, to);
  /* Same bytes, same place in the writer's chain: the same hash (a write
   * that follows marks it stale); never indexed, the original keeps that. */
  ip->key = src->key;
  ip->parent = src->parent;
  ip->hashed = src->hashed;
  memcpy(ip->hash, src->hash, 32);
  memcpy(ip->tokens, src->tokens, (size_t)src->cache->g.T * 2 * sizeof *ip->tokens); /* + tags */
}
