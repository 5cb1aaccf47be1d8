/* seq.c: a sequence, its block table, its lengths and its page references. */
#include <string.h>

#include "seq.h"
#include "holes.h"
#include "lru.h"
#include "page.h"
#include "pin.h"
#include "rank.h"

seq_t *seq_new(engine_t *eng, cache_t *c, uint64_t id) {
  seq_t *s = mem_calloc(&eng->mem, 1, sizeof *s);
  if (!s) return NULL;
  s->id = id;
  s->cache = c;
  s->node.kind = LRU_SEQ;
  s->node.prio = PRIO_DEFAULT;
  s->x = (seq_ext_t *)&seq_ext_none; /* never written: seq_ext_own first */
  return s;
}

/* 100,000 sequences are the largest part of the metadata of a pool of 4 KiB
 * pages (doc/design.md, "Metadata"): a field more moves seq_t to jemalloc's
 * next class, 192 bytes. */
_Static_assert(sizeof(seq_t) <= 160, "seq_t outgrows its 160-byte size class");

void seq_free(engine_t *eng, seq_t *s) {
  if (!s) return;
  mem_free(&eng->mem, s->table);
  if (s->x != &seq_ext_none) {
    mem_free(&eng->mem, s->x->layer_len);
    mem_free(&eng->mem, s->x->layer_chain);
    mem_free(&eng->mem, s->x->holes);
    mem_free(&eng->mem, s->x->pos);
    mem_free(&eng->mem, s->x);
  }
  mem_free(&eng->mem, s);
}

int seq_reserve(engine_t *eng, seq_t *s, uint64_t n) {
  if (n <= s->cap) return 0;
  /* A new table gets exactly what the first write needs (most sequences are
   * written once, whole); a growing one doubles, for appends. */
  uint64_t cap = s->cap ? s->cap * 2 : n;
  if (cap < n) cap = n;
  /* positions of its own grow first: a table grown alone keeps cap (and
   * pcap >= cap * T) as they were */
  uint64_t pcap = s->x->pcap;
  if (s->x->pos && seq_pos_reserve(eng, s, cap << s->cache->g.tshift)) return KVC_E_NOMEM;
  uint32_t *t = mem_realloc(&eng->mem, s->table, cap * sizeof *t);
  if (!t) {
    seq_pos_shrink(eng, s, pcap);
    return KVC_E_NOMEM;
  }
  s->table = t;
  s->cap = (uint32_t)cap;
  return 0;
}

int seq_pos_reserve(engine_t *eng, seq_t *s, uint64_t n) {
  if (n <= s->x->pcap) return 0;
  if (seq_ext_own(eng, s)) return KVC_E_NOMEM;
  uint32_t *p = mem_realloc(&eng->mem, s->x->pos, n * sizeof *p);
  if (!p) {
    seq_ext_release(eng, s); /* made for nothing */
    return KVC_E_NOMEM;
  }
  s->x->pos = p;
  s->x->pcap = n;
  return 0;
}

void seq_pos_shrink(engine_t *eng, seq_t *s, uint64_t n) {
  if (!s->x->pos || n >= s->x->pcap || n == 0) return;
  uint32_t *p = mem_realloc(&eng->mem, s->x->pos, n * sizeof *p);
  if (!p) return; /* keeps the larger array: still right, only larger */
  s->x->pos = p;
  s->x->pcap = n;
}

int seq_pos_own(engine_t *eng, seq_t *s) {
  if (s->x->pos) return 0;
  uint64_t T = s->cache->g.T, n = (uint64_t)(s->cap ? s->cap : 1) * T, b = (uint64_t)s->base * T;
  if (seq_pos_reserve(eng, s, n)) return KVC_E_NOMEM;
  for (uint64_t i = 0; i < n; i++) s->x->pos[i] = (uint32_t)(b + i);
  return 0;
}

void seq_pos_drop(engine_t *eng, seq_t *s) {
  if (!s->x->pos) return;
  mem_free(&eng->mem, s->x->pos);
  s->x->pos = NULL;
  s->x->pcap = 0;
  seq_ext_release(eng, s);
}

/* Slots [from, to) just became part of the sequence: their positions follow
 * the last slot's, one a slot (where llama.cpp decodes next: n_past). */
static void pos_extend(seq_t *s, uint64_t from, uint64_t to) {
  if (!s->x->pos || to <= from) return;
  uint64_t b = (uint64_t)s->base << s->cache->g.tshift;
  uint64_t next = from > b ? (uint64_t)s->x->pos[from - 1 - b] + 1 : from;
  for (uint64_t i = from; i < to; i++) s->x->pos[i - b] = (uint32_t)(next + (i - from));
}

void seq_enlist(engine_t *eng, seq_t *s) {
  s->cache->st.sequences++;
  s->cache->q->use.seqs++;
  eng->nseqs++;
  lru_insert(eng, s);
  s->last_use_ms = eng->now_ms;
}

void seq_page_add(engine_t *eng, seq_t *s, uint32_t page) {
  if (page == POOL_NOPAGE) return;
  if (s->npins) page_pin(eng, page);
  s->npages++;
  rank_page_add(s->cache);
}

void seq_page_release(engine_t *eng, seq_t *s, uint32_t page) {
  if (page == POOL_NOPAGE) return;
  if (s->npins) page_unpin(eng, page);
  s->npages--;
  rank_page_release(s->cache);
  page_unref(eng, s->cache, page, s->node.prio);
}

bool seq_page_is_hole(const seq_t *s, uint64_t idx) {
  uint64_t T = s->cache->g.T, b = idx * T, e = b + T, end = seq_table_end(s);
  return holes_cover(s->x->holes, s->x->nholes, b > s->start ? b : s->start, e < end ? e : end);
}

void seq_release_holes(engine_t *eng, seq_t *s, uint64_t b, uint64_t e) {
  if (!s->x->nholes || b >= e) return;
  uint32_t sh = s->cache->g.tshift;
  uint64_t idx = b >> sh, last = (e - 1) >> sh;
  if (idx < s->base) idx = s->base;
  for (; idx <= last && idx - s->base < s->ntable; idx++) {
    uint32_t *t = &s->table[idx - s->base];
    if (*t == POOL_NOPAGE || !seq_page_is_hole(s, idx)) continue;
    seq_page_release(eng, s, *t);
    *t = POOL_NOPAGE;
  }
}

/* Recomputes len and extent from layer_len; frees it once all are equal. */
static void lengths_settle(engine_t *eng, seq_t *s) {
  uint64_t lo = UINT64_MAX, hi = 0, old = s->extent;
  for (uint32_t l = 0; l < s->cache->g.L; l++) {
    if (s->x->layer_len[l] < lo) lo = s->x->layer_len[l];
    if (s->x->layer_len[l] > hi) hi = s->x->layer_len[l];
  }
  eng->ntokens = eng->ntokens - s->len + lo;
  s->cache->st.tokens = s->cache->st.tokens - s->len + lo;
  s->len = lo;
  s->extent = hi;
  pos_extend(s, old, hi);
  if (lo == hi) {
    mem_free(&eng->mem, s->x->layer_len);
    s->x->layer_len = NULL;
    seq_ext_release(eng, s);
  }
}

void seq_set_lengths(engine_t *eng, seq_t *s, uint32_t l0, uint32_t l1, uint64_t end) {
  if (!s->x->layer_len) { /* every layer, all at len: the common case */
    if (end > s->len) {
      eng->ntokens += end - s->len;
      s->cache->st.tokens += end - s->len;
      pos_extend(s, s->extent, end);
      s->len = s->extent = end;
    }
    return;
  }
  for (uint32_t l = l0; l < l1; l++)
    if (s->x->layer_len[l] < end) s->x->layer_len[l] = (uint32_t)end;
  lengths_settle(eng, s);
}

void seq_truncate(engine_t *eng, seq_t *s, uint64_t n) {
  s->rsv_end = 0; /* a reservation ends with the slots it reserved */
  seq_chain_cut(s, n);
  holes_cut(s, n, UINT64_MAX);
  if (s->x->layer_len) {
    for (uint32_t l = 0; l < s->cache->g.L; l++)
      if (s->x->layer_len[l] > n) s->x->layer_len[l] = (uint32_t)n;
    lengths_settle(eng, s);
  } else if (s->len > n) {
    eng->ntokens -= s->len - n;
    s->cache->st.tokens -= s->len - n;
    s->len = s->extent = n;
  }
  uint64_t keep = seq_pages_for(s, s->extent);
  while (s->ntable > keep) seq_page_release(eng, s, s->table[--s->ntable]);
  if (s->ntable) { /* the last page may hold only holes below the new end */
    uint64_t last = (uint64_t)(s->base + s->ntable - 1) << s->cache->g.tshift;
    seq_release_holes(eng, s, last, last + 1);
  }
  if (s->extent <= s->start) seq_pos_drop(eng, s); /* empty: slots are positions again */
}

void seq_trim(engine_t *eng, seq_t *s, uint64_t n) {
  uint32_t nbase = (uint32_t)(n >> s->cache->g.tshift), drop = nbase - s->base;
  for (uint32_t i = 0; i < drop; i++) seq_page_release(eng, s, s->table[i]);
  memmove(s->table, s->table + drop, (s->ntable - drop) * sizeof *s->table);
  if (s->x->pos) { /* pos mirrors the table, T entries a page */
    uint32_t sh = s->cache->g.tshift;
    memmove(s->x->pos, s->x->pos + ((uint64_t)drop << sh),
            ((uint64_t)(s->ntable - drop) << sh) * sizeof *s->x->pos);
  }
  s->ntable -= drop;
  s->base = nbase;
  s->start = n;
  holes_cut(s, 0, n);
  seq_release_holes(eng, s, n, n + 1); /* its first page may hold only holes from n */
}

void seq_drop(engine_t *eng, seq_t *s) {
  while (s->pins) pin_unlink(eng, s->pins); /* s is going away: no LRU moves */
  /* Pages left cached go deepest nearest the least recent end, so chain tails
   * go before chain heads: evicted ones join the tail (front page first),
   * removed ones the head (last page first). */
  for (uint32_t i = 0; i < s->ntable; i++)
    seq_page_release(eng, s, s->table[eng->evicting ? i : s->ntable - 1 - i]);
  s->ntable = 0;
  if (s->npins) {
    s->npins = 0;
    eng->nseqs_pinned--;
  } else {
    lru_remove(s);
  }
  eng->ntokens -= s->len;
  s->cache->st.tokens -= s->len;
  s->cache->st.sequences--;
  s->cache->q->use.seqs--;
  eng->nseqs--;
  hmap_remove(&s->cache->seqs, s->id);
  seq_free(eng, s);
}

void seq_info_fill(const engine_t *eng, const seq_t *s, kvc_seq_info_t *out) {
  memset(out, 0, sizeof *out);
  out->seq_id = s->id;
  out->start = s->start;
  out->length = s->len;
  out->extent = s->extent;
  out->pages = s->npages;
  for (uint32_t i = 0; i < s->ntable; i++) {
    uint32_t page = s->table[i];
    if (page == POOL_NOPAGE) continue;
    uint32_t holders = eng->pool.refcnt[page];
    if (page_meta(eng, page) && page_meta(eng, page)->indexed) holders--; /* the index is no sharer */
    if (holders > 1) out->shared_pages++;
  }
  out->pins = s->npins;
  out->last_use_ms = s->last_use_ms;
}
