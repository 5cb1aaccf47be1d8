/* audit.c: recomputes every derived fact of the engine and compares. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "lease.h"
#include "page.h"
#include "prefix.h"
#include "quota.h"
#include "seq.h"

__attribute__((format(printf, 3, 4))) static int bad(char *why, size_t len,
                                                     const char *fmt, ...) {
  if (why && len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, len, fmt, ap);
    va_end(ap);
  }
  return KVC_E_INTERNAL;
}

/* Every lease: in the map, pages in the pool (added into refs), counted. */
static int audit_leases(const engine_t *eng, uint32_t *refs, char *why, size_t len) {
  uint64_t n = 0, pages = 0;
  mem_t scratch;
  mem_init(&scratch);
  uint32_t *lref = mem_calloc(&scratch, eng->pool.npages, sizeof *lref);
  if (!lref) return KVC_E_NOMEM;
  for (const lease_t *l = eng->lease_list; l; l = l->next) {
    if (hmap_get(&eng->leases, l->id) != l) {
      mem_free(&scratch, lref);
      return bad(why, len, "lease %llu not in the map", (unsigned long long)l->id);
    }
    for (uint32_t i = 0; i < l->npages; i++) {
      if (l->pages[i] >= eng->pool.npages) {
        mem_free(&scratch, lref);
        return bad(why, len, "lease %llu: page %u out of pool", (unsigned long long)l->id,
                   l->pages[i]);
      }
      refs[l->pages[i]]++;
      if (l->q) lref[l->pages[i]]++;
    }
    n++;
    pages += l->npages;
  }
  for (uint32_t page = 0; page < eng->pool.npages; page++) {
    if (lref[page] == (eng->lease_ref ? eng->lease_ref[page] : 0)) continue;
    uint32_t want = lref[page];
    mem_free(&scratch, lref);
    return bad(why, len, "page %u: %u leases of connections, %u recorded", page, want,
               eng->lease_ref ? eng->lease_ref[page] : 0);
  }
  mem_free(&scratch, lref);
  if (n != eng->st.leases || n != eng->leases.count || pages != eng->st.leased_pages)
    return bad(why, len, "leases: %llu listed, %llu counted, %zu mapped; pages %llu/%llu",
                     (unsigned long long)n, (unsigned long long)eng->st.leases,
                     eng->leases.count, (unsigned long long)pages,
                     (unsigned long long)eng->st.leased_pages);
  return 0;
}

/* A sequence's prefix chain (doc/prefix.md): within its pages, no hole in
 * it, every chain page hashed under its key from the one before it in this
 * sequence. */
static int audit_chain(engine_t *eng, const seq_t *s, char *why, size_t len) {
  const geom_t *g = &s->cache->g;
  unsigned long long id = (unsigned long long)s->id;
  if (s->chain_tok > s->len || s->chain_pages > (s->chain_tok >> g->tshift))
    return bad(why, len, "seq %llu: chain of %llu tokens, %u pages, length %llu", id,
               (unsigned long long)s->chain_tok, s->chain_pages, (unsigned long long)s->len);
  if (s->x->layer_chain) { /* per layer: within its length; the least is chain_tok */
    uint32_t lo = UINT32_MAX, hi = 0;
    for (uint32_t l = 0; l < g->L; l++) {
      if (s->x->layer_chain[l] > seq_layer_len(s, l))
        return bad(why, len, "seq %llu: layer %u chain %u past its length %u", id, l,
                   s->x->layer_chain[l], seq_layer_len(s, l));
      lo = s->x->layer_chain[l] < lo ? s->x->layer_chain[l] : lo;
      hi = s->x->layer_chain[l] > hi ? s->x->layer_chain[l] : hi;
    }
    if (lo != s->chain_tok)
      return bad(why, len, "seq %llu: layer chains %u..%u, chain %llu", id, lo, hi,
                 (unsigned long long)s->chain_tok);
  }
  if (s->x->nholes && s->x->holes[0].b < s->chain_tok)
    return bad(why, len, "seq %llu: a hole at %llu inside its chain", id,
               (unsigned long long)s->x->holes[0].b);
  for (uint64_t idx = s->base; idx < s->chain_pages; idx++) {
    const ipage_t *ip = page_meta(eng, s->table[idx - s->base]);
    /* (its parent field may name a page the sequence has since copied on
     * write: the hash, recomputed from the table's predecessor, decides) */
    if (!ip || !ip->hashed || ip->key != s->chain_key || (idx == 0 && ip->parent != POOL_NOPAGE))
      return bad(why, len, "seq %llu: page %llu of its chain is not hashed in it", id,
                 (unsigned long long)idx);
    if (idx > 0 && idx == s->base) continue; /* its parent was trimmed away */
    uint8_t h[32];
    const ipage_t *par = idx ? page_meta(eng, s->table[idx - 1 - s->base]) : NULL;
    if (prefix_expect(eng, ip, par ? par->hash : NULL, h) || memcmp(h, ip->hash, 32) != 0)
      return bad(why, len, "seq %llu: page %llu hash is not its chain's", id,
                 (unsigned long long)idx);
  }
  return 0;
}

/* Every indexed page is the chain of its parent, its ids and its key. */
static int audit_index_hashes(engine_t *eng, char *why, size_t len) {
  for (uint32_t page = 0; page < eng->pool.npages; page++) {
    const ipage_t *ip = page_meta(eng, page);
    if (!ip || !ip->indexed) continue;
    const ipage_t *par = ip->parent == POOL_NOPAGE ? NULL : page_meta(eng, ip->parent);
    if (!ip->hashed || ip->key == 0 ||
        (ip->parent != POOL_NOPAGE && (!par || !par->indexed || par->key != ip->key)))
      return bad(why, len, "page %u: indexed outside a whole chain of its key", page);
    uint8_t h[32];
    if (prefix_expect(eng, ip, par ? par->hash : NULL, h) || memcmp(h, ip->hash, 32) != 0)
      return bad(why, len, "page %u: indexed under a hash that is not its chain's", page);
  }
  return 0;
}

/* One sequence's own invariants; adds its references into refs/pins. */
static int audit_seq(const engine_t *eng, const seq_t *s, uint32_t *refs, uint32_t *pins,
                     char *why, size_t len) {
  const geom_t *g = &s->cache->g;
  unsigned long long id = (unsigned long long)s->id;
  if (s->planned) return bad(why, len, "seq %llu: left planned by an eviction plan", id);
  if (s->start > s->len || s->len > s->extent || s->extent > KVC_MAX_SEQ_TOKENS)
    return bad(why, len, "seq %llu: start %llu len %llu extent %llu", id,
               (unsigned long long)s->start, (unsigned long long)s->len,
               (unsigned long long)s->extent);
  if (s->base != (s->start >> g->tshift))
    return bad(why, len, "seq %llu: base %u for start %llu", id, s->base,
               (unsigned long long)s->start);
  /* A busy sequence's table already holds the pages its put in flight
   * writes; its lengths move at the put's end. */
  uint64_t want = seq_pages_for(s, seq_table_end(s));
  if ((s->busy ? s->ntable < want : s->ntable != want) || s->ntable > s->cap)
    return bad(why, len, "seq %llu: %u table entries (cap %u) for extent %llu", id,
               s->ntable, s->cap, (unsigned long long)seq_table_end(s));
  for (uint32_t i = 0; i < s->x->nholes; i++) { /* sorted, disjoint, apart, held */
    const hole_t *h = &s->x->holes[i];
    if (h->b >= h->e || h->b < s->start || h->e > s->extent ||
        (i && h->b <= s->x->holes[i - 1].e) || s->x->nholes > s->x->hcap)
      return bad(why, len, "seq %llu: hole %u [%llu, %llu) bad for [%llu, %llu)", id, i,
                 (unsigned long long)h->b, (unsigned long long)h->e,
                 (unsigned long long)s->start, (unsigned long long)s->extent);
  }
  if (s->x->pos) { /* positions of its own (doc/attention.md) */
    if (s->cache->layout.attn != KVC_ATTN_CAUSAL || s->x->pcap < ((uint64_t)s->cap << g->tshift) ||
        s->extent <= s->start)
      return bad(why, len, "seq %llu: positions of its own (%llu) in a kind-%u cache, cap %u, "
                 "[%llu, %llu) held", id, (unsigned long long)s->x->pcap, s->cache->layout.attn,
                 s->cap, (unsigned long long)s->start, (unsigned long long)s->extent);
    /* what relabels a token cuts the chain there: a chain's positions are its slots */
    for (uint64_t q = s->start; q < s->chain_tok; q++)
      if (seq_pos(s, q) != q)
        return bad(why, len, "seq %llu: slot %llu of its chain at position %llu", id,
                   (unsigned long long)q, (unsigned long long)seq_pos(s, q));
  }
  if (s->x->layer_len) {
    uint64_t lo = UINT64_MAX, hi = 0;
    for (uint32_t l = 0; l < g->L; l++) {
      lo = s->x->layer_len[l] < lo ? s->x->layer_len[l] : lo;
      hi = s->x->layer_len[l] > hi ? s->x->layer_len[l] : hi;
    }
    if (lo != s->len || hi != s->extent)
      return bad(why, len, "seq %llu: layer lengths %llu..%llu vs len %llu extent %llu", id,
                 (unsigned long long)lo, (unsigned long long)hi,
                 (unsigned long long)s->len, (unsigned long long)s->extent);
  }
  if (seq_ext_owned(s) && !s->x->layer_len && !s->x->layer_chain && !s->x->holes && !s->x->pos)
    return bad(why, len, "seq %llu: rare parts of its own that hold nothing", id);
  uint32_t npins = 0;
  for (const pin_t *p = s->pins; p; p = p->s_next) {
    if (p->seq != s || hmap_get(&eng->owners, p->owner->id) != p->owner)
      return bad(why, len, "seq %llu: pin record points elsewhere", id);
    npins++;
  }
  if (npins != s->npins) return bad(why, len, "seq %llu: %u pins, %u recorded", id, npins, s->npins);
  if (!s->npins && (!s->node.next || !s->node.prev))
    return bad(why, len, "seq %llu: unpinned but not on the LRU", id);
  if (s->npins && s->node.next) return bad(why, len, "seq %llu: pinned but on the LRU", id);
  uint32_t held = 0;
  for (uint32_t i = 0; i < s->ntable; i++) {
    uint32_t page = s->table[i];
    if (page == POOL_NOPAGE) { /* no page: only where every slot is a hole */
      if (!seq_page_is_hole(s, s->base + i))
        return bad(why, len, "seq %llu: page %llu has no page but holds tokens", id,
                   (unsigned long long)(s->base + i));
      continue;
    }
    if (page >= eng->pool.npages) return bad(why, len, "seq %llu: page %u out of pool", id, page);
    refs[page]++;
    held++;
    if (s->npins) pins[page]++;
  }
  if (held != s->npages)
    return bad(why, len, "seq %llu: %u pages in its table, %u counted", id, held, s->npages);
  return 0;
}

static int audit_pages(const engine_t *eng, const uint32_t *refs, const uint32_t *pins,
                       char *why, size_t len) {
  const pool_t *p = &eng->pool;
  uint32_t used = 0, shared = 0, pinned = 0, nfree = 0, seg_free = 0, seg_empty = 0;
  uint64_t used_bytes = 0, pinned_bytes = 0;
  for (uint32_t i = 0; i < p->npages; i++) {
    if (refs[i] != p->refcnt[i])
      return bad(why, len, "page %u: refcnt %u, %u table references", i, p->refcnt[i], refs[i]);
    if (refs[i] && !pool_page_valid(p, i))
      return bad(why, len, "page %u: in use but no page of its segment's arena", i);
    if (refs[i] && pins[i] != p->pinref[i]) /* a free page's pinref is its link */
      return bad(why, len, "page %u: pinref %u, %u pinned holders", i, p->pinref[i], pins[i]);
    if (p->plan[i]) return bad(why, len, "page %u: eviction scratch left at %u", i, p->plan[i]);
    used += refs[i] > 0;
    shared += refs[i] > 1;
    pinned += pins[i] > 0;
    if (refs[i]) used_bytes += pool_page_stride(p, i);
    if (pins[i]) pinned_bytes += pool_page_stride(p, i);
  }
  /* Segments: each of one live arena or free; the pages in use of each. */
  mem_t scratch;
  mem_init(&scratch);
  /* segs[a]: arena a's segments; segs[narenas + a]: its empty ones */
  uint32_t *segs = mem_calloc(&scratch, 2 * (p->narenas ? p->narenas : 1), sizeof *segs);
  if (!segs) return KVC_E_NOMEM;
  int rc = 0;
  for (uint32_t s = 0; rc == 0 && s < p->nseg; s++) {
    uint16_t a = p->seg_arena[s];
    if (a == POOL_NOARENA) {
      seg_free++;
      continue;
    }
    if (a >= p->narenas || !p->arenas[a].live) {
      rc = bad(why, len, "segment %u: of arena %u, not a live one", s, a);
      break;
    }
    segs[a]++;
    uint32_t u = 0;
    for (uint32_t q = s * p->ids_per_seg, e = q + p->arenas[a].per_seg; q < e; q++) u += refs[q] > 0;
    if (u != p->seg_used[s]) rc = bad(why, len, "segment %u: %u pages in use, %u recorded", s, u, p->seg_used[s]);
    seg_empty += u == 0;
    segs[p->narenas + a] += u == 0;
  }
  if (rc == 0 && seg_empty != p->nseg_empty)
    rc = bad(why, len, "%u empty segments, %u recorded", seg_empty, p->nseg_empty);
  /* Each arena's free list: nfree pages of its own segments, each with
   * refcnt 0, then its end. A walk that ends where it should visits no
   * page twice (a repeat would loop), so with the counts below it holds
   * exactly the free pages. */
  for (uint32_t a = 0; rc == 0 && a < p->narenas; a++) {
    const pool_arena_t *ar = &p->arenas[a];
    if (!ar->live) continue;
    if (segs[a] != ar->nseg) {
      rc = bad(why, len, "arena %u: %u segments, %u recorded", a, segs[a], ar->nseg);
      break;
    }
    if (segs[p->narenas + a] != ar->nempty) {
      rc = bad(why, len, "arena %u: %u empty segments, %u recorded", a, segs[p->narenas + a],
               ar->nempty);
      break;
    }
    if (ar->stride % p->align || ar->stride < ar->page_bytes || ar->stride < p->grain ||
        ar->per_seg != p->seg_bytes / ar->stride) {
      rc = bad(why, len, "arena %u: stride %llu for pages of %llu, %u a segment", a,
               (unsigned long long)ar->stride, (unsigned long long)ar->page_bytes, ar->per_seg);
      break;
    }
    uint32_t q = ar->free_head, last = POOL_NOPAGE;
    for (uint32_t i = 0; i < ar->nfree; i++) {
      last = q;
      if (!pool_page_valid(p, q) || pool_arena_of(p, q) != a) {
        rc = bad(why, len, "arena %u free list: entry %u of %u is page %u, not its own", a, i,
                 ar->nfree, q);
        break;
      }
      if (p->refcnt[q] != 0) {
        rc = bad(why, len, "free page %u has refcnt %u", q, p->refcnt[q]);
        break;
      }
      q = p->pinref[q];
    }
    if (rc == 0 && q != POOL_NOPAGE)
      rc = bad(why, len, "arena %u free list: goes on past its %u pages (to page %u)", a,
               ar->nfree, q);
    if (rc == 0 && last != ar->free_tail)
      rc = bad(why, len, "arena %u free list: ends at page %u, its tail is %u", a, last,
               ar->free_tail);
    nfree += ar->nfree;
    if (rc == 0 && !ar->ncaches && !ar->nseg)
      rc = bad(why, len, "arena %u: live with no cache and no segment", a);
  }
  mem_free(&scratch, segs);
  if (rc) return rc;
  uint64_t carved = 0;
  for (uint32_t a = 0; a < p->narenas; a++)
    if (p->arenas[a].live) carved += (uint64_t)p->arenas[a].nseg * p->arenas[a].per_seg;
  if (nfree != p->nfree || seg_free != p->nseg_free || used + p->nfree != carved ||
      used != p->nused || used_bytes != p->used_bytes || pinned_bytes != p->pinned_bytes ||
      shared != p->nshared || pinned != p->npinned)
    return bad(why, len, "pages: used %u/%u free %u/%u carved %llu free segments %u/%u shared "
               "%u/%u pinned %u/%u bytes used %llu/%llu pinned %llu/%llu", used, p->nused,
               nfree, p->nfree, (unsigned long long)carved, seg_free, p->nseg_free, shared,
               p->nshared, pinned, p->npinned, (unsigned long long)used_bytes,
               (unsigned long long)p->used_bytes, (unsigned long long)pinned_bytes,
               (unsigned long long)p->pinned_bytes);
  return 0;
}

/* Token metadata and the index: every ipage belongs to its page, indexed
 * pages are in their cache's index with the right child counts, and the
 * cached ones (refcnt 1) are exactly those on the LRU (*cached). */
static int audit_index(const engine_t *eng, const uint64_t *cached, char *why, size_t len) {
  uint64_t indexed = 0, nc = 0, pairs = 0;
  for (uint32_t page = 0; page < eng->pool.npages; page++) {
    const ipage_t *ip = page_meta(eng, page);
    if (!ip) continue;
    if (ip->page != page || eng->pool.refcnt[page] == 0)
      return bad(why, len, "page %u: token metadata of a free or other page", page);
    if (ip->planned || ip->stacked || ip->plan_gone)
      return bad(why, len, "page %u: eviction plan marks left", page);
    if (!ip->indexed) continue;
    indexed++;
    pairs += eng->pool.refcnt[page] == 2;
    uint64_t k;
    memcpy(&k, ip->hash, 8);
    if (hmap_get(&ip->cache->index, k) != ip)
      return bad(why, len, "page %u: indexed but not in the index", page);
    if (eng->pool.refcnt[page] == 1) nc++;
    if (eng->pool.refcnt[page] == 1 && !ip->node.next)
      return bad(why, len, "page %u: cached but not on the LRU", page);
    uint32_t kids = 0;
    for (uint32_t q = 0; q < eng->pool.npages; q++)
      kids += page_meta(eng, q) && page_meta(eng, q)->indexed && page_meta(eng, q)->parent == page;
    if (kids != ip->nchildren)
      return bad(why, len, "page %u: %u indexed children, %u recorded", page, kids, ip->nchildren);
  }
  if (pairs != eng->index_sole)
    return bad(why, len, "index: %llu pages held by the index and one sequence, %u recorded",
               (unsigned long long)pairs, eng->index_sole);
  if (indexed != eng->st.pages_indexed || nc != *cached || nc != eng->st.pages_cached)
    return bad(why, len, "index: %llu indexed (%llu recorded), %llu cached (%llu on LRU, %llu recorded)",
               (unsigned long long)indexed, (unsigned long long)eng->st.pages_indexed,
               (unsigned long long)nc, (unsigned long long)*cached,
               (unsigned long long)eng->st.pages_cached);
  return 0;
}

/* Every tenant's usage, recounted from pages, leases and caches. */
static int audit_quotas(const engine_t *eng, char *why, size_t len) {
  for (uint32_t i = 0; i < eng->nquotas; i++) {
    const quota_t *q = eng->quotas[i];
    if (q->idx != i || quota_find(eng, q->tenant) != q)
      return bad(why, len, "quota %u: misfiled (tenant %u)", i, q->tenant);
    engine_tenant_usage_t u = {0};
    u.keys = prefix_keys_of(eng, q);
    for (uint32_t page = 0; page < eng->pool.npages; page++) {
      if (!eng->pool.refcnt[page] || eng->page_quota[page] != i) continue;
      uint64_t st = pool_page_stride(&eng->pool, page);
      u.pages++;
      u.bytes += st;
      u.pinned += eng->pool.pinref[page] > 0;
      u.pinned_bytes += eng->pool.pinref[page] > 0 ? st : 0;
    }
    for (uint32_t page = 0; eng->lease_ref && page < eng->pool.npages; page++)
      if (eng->lease_ref[page] && eng->page_quota[page] == i) {
        u.leased++;
        u.leased_bytes += pool_page_stride(&eng->pool, page);
      }
    for (uint32_t ci = 0; ci < eng->ncaches; ci++) {
      const cache_t *c = eng->caches[ci];
      if (!c || c->q != q) continue;
      if (c->tenant != q->tenant) return bad(why, len, "cache '%s': another tenant's quota", c->name);
      const pool_arena_t *ar = &eng->pool.arenas[c->arena];
      if (c->arena >= eng->pool.narenas || !ar->live || ar->tenant != c->tenant ||
          ar->page_bytes != c->g.page_bytes)
        return bad(why, len, "cache '%s': arena %u is not (its tenant, its page size)", c->name,
                   c->arena);
      u.caches++;
      u.seqs += c->st.sequences;
      if (c->rank_pos >= q->nrank || q->rank[c->rank_pos] != c)
        return bad(why, len, "cache '%s': not at its place %u of its tenant's ranking", c->name,
                   c->rank_pos);
    }
    if (q->nrank != u.caches || q->nrank > q->rank_cap)
      return bad(why, len, "tenant %u: %u caches ranked (room %u), %u counted", q->tenant,
                 q->nrank, q->rank_cap, u.caches);
    for (uint32_t r = 1; r < q->nrank; r++)
      if (q->rank[r - 1]->st.pages < q->rank[r]->st.pages)
        return bad(why, len, "tenant %u: ranking out of order at %u (%llu pages before %llu)",
                   q->tenant, r, (unsigned long long)q->rank[r - 1]->st.pages,
                   (unsigned long long)q->rank[r]->st.pages);
    if (u.bytes != q->use.bytes || u.pinned_bytes != q->use.pinned_bytes ||
        u.leased_bytes != q->use.leased_bytes)
      return bad(why, len, "tenant %u: bytes %llu/%llu pinned %llu/%llu leased %llu/%llu "
                 "(counted/recorded)", q->tenant, (unsigned long long)u.bytes,
                 (unsigned long long)q->use.bytes, (unsigned long long)u.pinned_bytes,
                 (unsigned long long)q->use.pinned_bytes, (unsigned long long)u.leased_bytes,
                 (unsigned long long)q->use.leased_bytes);
    if (u.pages != q->use.pages || u.pinned != q->use.pinned || u.leased != q->use.leased ||
        u.seqs != q->use.seqs || u.caches != q->use.caches || u.keys != q->use.keys)
      return bad(why, len,
                 "tenant %u: pages %llu/%llu pinned %llu/%llu leased %llu/%llu seqs %llu/%llu "
                 "caches %u/%u keys %u/%u (counted/recorded)", q->tenant, (unsigned long long)u.pages,
                 (unsigned long long)q->use.pages, (unsigned long long)u.pinned,
                 (unsigned long long)q->use.pinned, (unsigned long long)u.leased,
                 (unsigned long long)q->use.leased, (unsigned long long)u.seqs,
                 (unsigned long long)q->use.seqs, u.caches, q->use.caches, u.keys,
                 q->use.keys);
  }
  return 0;
}

int engine_audit(engine_t *eng, char *why, size_t why_len) {
  if (!eng) return KVC_E_INVAL;
  mem_t scratch;
  mem_init(&scratch);
  uint32_t n = eng->pool.npages;
  uint32_t *refs = mem_calloc(&scratch, n, sizeof *refs);
  uint32_t *pins = mem_calloc(&scratch, n, sizeof *pins);
  int rc = (!refs || !pins) ? KVC_E_NOMEM : 0;
  uint64_t nseqs = 0, npinned = 0, tokens = 0, lru = 0;
  uint32_t nopen = 0;
  for (uint32_t ci = 0; rc == 0 && ci < eng->ncaches; ci++) {
    const cache_t *c = eng->caches[ci];
    if (!c) continue;
    nopen++;
    if (c->id != (ci | (uint32_t)eng->cache_gen[ci] << CACHE_GEN_SHIFT))
      rc = bad(why, why_len, "cache '%s' in slot %u: id %#x", c->name, ci, c->id);
    uint64_t cseqs = 0, ctokens = 0, cpages = 0;
    size_t pos = 0;
    uint64_t key;
    seq_t *s;
    while (rc == 0 && (s = hmap_next(&c->seqs, &pos, &key))) {
      if (key != s->id || s->cache != c) rc = bad(why, why_len, "cache %u: misfiled seq", ci);
      else rc = audit_seq(eng, s, refs, pins, why, why_len);
      if (rc == 0) rc = audit_chain(eng, s, why, why_len);
      cseqs++;
      ctokens += s->len;
      cpages += s->npages;
      npinned += s->npins > 0;
    }
    if (rc == 0 && (cseqs != c->st.sequences || ctokens != c->st.tokens || cpages != c->st.pages))
      rc = bad(why, why_len, "cache '%s': gauges %llu/%llu/%llu, counted %llu/%llu/%llu",
               c->name, (unsigned long long)c->st.sequences, (unsigned long long)c->st.tokens,
               (unsigned long long)c->st.pages, (unsigned long long)cseqs,
               (unsigned long long)ctokens, (unsigned long long)cpages);
    nseqs += cseqs;
    tokens += ctokens;
  }
  if (rc == 0 && nopen != eng->ncaches_open)
    rc = bad(why, why_len, "%u caches open, %u counted", eng->ncaches_open, nopen);
  for (uint32_t page = 0; rc == 0 && page < n; page++)
    if (page_meta(eng, page) && page_meta(eng, page)->indexed) refs[page]++; /* the index's own */
  if (rc == 0) rc = audit_leases(eng, refs, why, why_len);
  if (rc == 0) rc = audit_pages(eng, refs, pins, why, why_len);
  uint64_t cached = 0;
  for (uint32_t prio = 0; rc == 0 && prio < PRIO_LEVELS; prio++) {
    const lru_node_t *head = &eng->lru[prio];
    for (const lru_node_t *nd = head->next; rc == 0 && nd != head; nd = nd->next) {
      if (nd->next->prev != nd || nd->prio != prio) rc = bad(why, why_len, "LRU list broken");
      else if (nd->kind == LRU_SEQ && ((const seq_t *)(const void *)nd)->npins)
        rc = bad(why, why_len, "pinned sequence on the LRU");
      else if (nd->kind == LRU_PAGE) {
        const ipage_t *ip = (const ipage_t *)(const void *)nd;
        if (!ip->indexed || eng->pool.refcnt[ip->page] != 1)
          rc = bad(why, why_len, "page %u on the LRU but not cached", ip->page);
        cached++;
      } else if (nd->kind == LRU_SEQ) {
        lru++;
      }
      if (lru + cached > nseqs + n) rc = bad(why, why_len, "LRU list longer than its members");
    }
  }
  if (rc == 0) rc = audit_index(eng, &cached, why, why_len);
  if (rc == 0) rc = audit_quotas(eng, why, why_len);
  if (rc == 0) rc = audit_index_hashes(eng, why, why_len);
  if (rc == 0 && (nseqs != eng->nseqs || npinned != eng->nseqs_pinned ||
                  lru != nseqs - npinned || tokens != eng->ntokens))
    rc = bad(why, why_len, "engine: %llu seqs (%llu counted), %llu pinned (%llu), lru %llu, "
             "tokens %llu (%llu)", (unsigned long long)eng->nseqs, (unsigned long long)nseqs,
             (unsigned long long)eng->nseqs_pinned, (unsigned long long)npinned,
             (unsigned long long)lru, (unsigned long long)eng->ntokens,
             (unsigned long long)tokens);
  mem_free(&scratch, refs);
  mem_free(&scratch, pins);
  return rc;
}
