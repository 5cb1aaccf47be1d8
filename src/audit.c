/* audit.c: recomputes every derived fact of the engine and compares. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "engine_impl.h"

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

/* One sequence's own invariants; adds its references into refs/pins. */
static int audit_seq(const engine_t *eng, const seq_t *s, uint32_t *refs, uint32_t *pins,
                     char *why, size_t len) {
  const geom_t *g = &s->cache->g;
  unsigned long long id = (unsigned long long)s->id;
  if (s->start > s->len || s->len > s->extent || s->extent > KVC_MAX_SEQ_TOKENS)
    return bad(why, len, "seq %llu: start %llu len %llu extent %llu", id,
               (unsigned long long)s->start, (unsigned long long)s->len,
               (unsigned long long)s->extent);
  if (s->base != (s->start >> g->tshift))
    return bad(why, len, "seq %llu: base %u for start %llu", id, s->base,
               (unsigned long long)s->start);
  if (s->ntable != seq_pages_for(s, s->extent) || s->ntable > s->cap)
    return bad(why, len, "seq %llu: %u table entries (cap %u) for extent %llu", id,
               s->ntable, s->cap, (unsigned long long)s->extent);
  if (s->layer_len) {
    uint64_t lo = UINT64_MAX, hi = 0;
    for (uint32_t l = 0; l < g->L; l++) {
      lo = s->layer_len[l] < lo ? s->layer_len[l] : lo;
      hi = s->layer_len[l] > hi ? s->layer_len[l] : hi;
    }
    if (lo != s->len || hi != s->extent)
      return bad(why, len, "seq %llu: layer lengths %llu..%llu vs len %llu extent %llu", id,
                 (unsigned long long)lo, (unsigned long long)hi,
                 (unsigned long long)s->len, (unsigned long long)s->extent);
  }
  uint32_t npins = 0;
  for (const pin_t *p = s->pins; p; p = p->s_next) {
    if (p->seq != s || hmap_get(&eng->owners, p->owner->id) != p->owner)
      return bad(why, len, "seq %llu: pin record points elsewhere", id);
    npins++;
  }
  if (npins != s->npins) return bad(why, len, "seq %llu: %u pins, %u recorded", id, npins, s->npins);
  if (!s->npins && (!s->lru_next || !s->lru_prev))
    return bad(why, len, "seq %llu: unpinned but not on the LRU", id);
  for (uint32_t i = 0; i < s->ntable; i++) {
    uint32_t page = s->table[i];
    if (page >= eng->pool.npages) return bad(why, len, "seq %llu: page %u out of pool", id, page);
    refs[page]++;
    if (s->npins) pins[page]++;
  }
  return 0;
}

static int audit_pages(const engine_t *eng, const uint32_t *refs, const uint32_t *pins,
                       char *why, size_t len) {
  const pool_t *p = &eng->pool;
  uint32_t used = 0, shared = 0, pinned = 0;
  for (uint32_t i = 0; i < p->npages; i++) {
    if (refs[i] != p->refcnt[i])
      return bad(why, len, "page %u: refcnt %u, %u table references", i, p->refcnt[i], refs[i]);
    if (pins[i] != p->pinref[i])
      return bad(why, len, "page %u: pinref %u, %u pinned holders", i, p->pinref[i], pins[i]);
    if (p->sim[i]) return bad(why, len, "page %u: eviction scratch left at %u", i, p->sim[i]);
    used += refs[i] > 0;
    shared += refs[i] > 1;
    pinned += pins[i] > 0;
  }
  for (uint32_t i = 0; i < p->nfree; i++)
    if (p->refcnt[p->free_stack[i]] != 0)
      return bad(why, len, "free page %u has refcnt %u", p->free_stack[i],
                 p->refcnt[p->free_stack[i]]);
  if (used + p->nfree != p->npages || shared != p->nshared || pinned != p->npinned)
    return bad(why, len, "pages: used %u free %u total %u shared %u/%u pinned %u/%u", used,
               p->nfree, p->npages, shared, p->nshared, pinned, p->npinned);
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
  for (uint32_t ci = 0; rc == 0 && ci < eng->ncaches; ci++) {
    const cache_t *c = eng->caches[ci];
    if (!c) continue;
    uint64_t cseqs = 0, ctokens = 0, cpages = 0;
    size_t pos = 0;
    uint64_t key;
    seq_t *s;
    while (rc == 0 && (s = hmap_next(&c->seqs, &pos, &key))) {
      if (key != s->id || s->cache != c) rc = bad(why, why_len, "cache %u: misfiled seq", ci);
      else rc = audit_seq(eng, s, refs, pins, why, why_len);
      cseqs++;
      ctokens += s->len;
      cpages += s->ntable;
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
  if (rc == 0) rc = lease_audit(eng, refs, why, why_len);
  if (rc == 0) rc = audit_pages(eng, refs, pins, why, why_len);
  for (const seq_t *s = eng->lru.lru_next; rc == 0 && s != &eng->lru; s = s->lru_next) {
    if (s->npins || s->lru_next->lru_prev != s) rc = bad(why, why_len, "LRU list broken");
    if (++lru > nseqs) rc = bad(why, why_len, "LRU list longer than the sequences");
  }
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
