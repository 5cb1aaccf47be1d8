/* seq.h: a sequence's block table, lengths and page references (seq.c),
 * and the walks over its pages every transfer shares.
 *
 * An entry of the table is POOL_NOPAGE when every slot of its page is a
 * hole (doc/attention.md): a gap of whole pages costs no pool page.
 *
 *   T = 4, len 14, holes {[2, 11)}       slots 0..3  4..7  8..11 12..15
 *   table [p3, NOPAGE, p5, p8]                 t t . . . . . .  . . . t  t t
 *
 * A walker of the table skips such entries: they hold no reference, no
 * pin, and nothing to read (a hole reads as zeros). */
#ifndef KVC_SEQ_H
#define KVC_SEQ_H

#include "core.h"

static inline uint64_t seq_pages_for(const seq_t *s, uint64_t extent) {
  uint64_t T = s->cache->g.T, lo = (uint64_t)s->base * T;
  return extent > lo ? ((extent + T - 1) >> s->cache->g.tshift) - s->base : 0;
}
/* Last slot the table must cover: the extent or the end of a reservation. */
static inline uint64_t seq_table_end(const seq_t *s) {
  return s->rsv_end > s->extent ? s->rsv_end : s->extent;
}
static inline uint32_t seq_layer_len(const seq_t *s, uint32_t l) {
  return s->x->layer_len ? s->x->layer_len[l] : (uint32_t)s->len;
}
/* The smallest written length over layers [l0, l1). */
static inline uint64_t seq_range_len(const seq_t *s, uint32_t l0, uint32_t l1) {
  if (!s->x->layer_len) return s->len;
  uint64_t m = UINT64_MAX;
  for (uint32_t l = l0; l < l1; l++)
    if (s->x->layer_len[l] < m) m = s->x->layer_len[l];
  return m;
}
/* KVC_E_BUSY for a sequence whose put is still copying (put.c): every
 * operation that reads its bytes or changes it refuses it meanwhile. */
static inline int seq_busy(engine_t *eng, const seq_t *s) {
  return engine_fail(eng, KVC_E_BUSY, "sequence %llu is busy: a put to it is still copying",
                     (unsigned long long)s->id);
}

static inline int cache_busy(engine_t *eng, const cache_t *c) {
  return engine_fail(eng, KVC_E_BUSY, "cache '%s' is busy: %u puts to it are still copying",
                     c->name, c->nbusy);
}

/* Whatever s holds from pos on no longer follows its prefix chain
 * (doc/prefix.md): the chain ends at pos. */
static inline void seq_chain_cut(seq_t *s, uint64_t pos) {
  if (s->x->layer_chain)
    for (uint32_t l = 0; l < s->cache->g.L; l++)
      if (s->x->layer_chain[l] > pos) s->x->layer_chain[l] = (uint32_t)pos;
  if (s->chain_tok <= pos) return;
  s->chain_tok = pos;
  uint64_t whole = pos >> s->cache->g.tshift;
  if (s->chain_pages > whole) s->chain_pages = (uint32_t)whole;
}

/* llama.cpp-style open ends: a negative p0 is 0, a negative p1 the end. */
static inline void seq_open_range(int64_t p0, int64_t p1, uint64_t *b, uint64_t *e) {
  *b = p0 < 0 ? 0 : (uint64_t)p0;
  *e = p1 < 0 ? UINT64_MAX : (uint64_t)p1;
}

/* One page's part of a token range: the walk every transfer makes.
 *
 *   tokens [pos, end) of T-token pages:   | idx | idx+1 | ... |
 *   a step: page idx, tokens [off, off + n) of it, at done of the range
 *
 *   for (seq_run_t r = seq_run(T, pos, end); seq_run_next(&r);) use(r.idx, r.off, r.n, r.done);
 */
typedef struct seq_run {
  uint64_t pos, end; /* what is left of the range */
  uint64_t first;    /* the range's first token */
  uint64_t idx;      /* logical page of this step */
  uint64_t off;      /* first token of the step inside its page */
  uint64_t n;        /* tokens of the step */
  uint64_t done;     /* tokens of the range before this step */
  uint32_t tshift;
} seq_run_t;

static inline seq_run_t seq_run(const geom_t *g, uint64_t pos, uint64_t end) {
  seq_run_t r = {pos, end, pos, 0, 0, 0, 0, g->tshift};
  return r;
}
static inline bool seq_run_next(seq_run_t *r) {
  if (r->pos >= r->end) return false;
  uint64_t T = 1ull << r->tshift;
  r->idx = r->pos >> r->tshift;
  r->off = r->pos & (T - 1);
  r->n = T - r->off < r->end - r->pos ? T - r->off : r->end - r->pos;
  r->done = r->pos - r->first;
  r->pos += r->n;
  return true;
}

/* The position of slot q (doc/attention.md, "Positions are labels"): the
 * slot itself unless the sequence has positions of its own. */
static inline uint64_t seq_pos(const seq_t *s, uint64_t q) {
  return s->x->pos ? s->x->pos[q - ((uint64_t)s->base << s->cache->g.tshift)] : q;
}

/* The first slot of [start, extent) whose position is not the slot, or the
 * extent. */
static inline uint64_t seq_pos_first_moved(const seq_t *s) {
  uint64_t q = s->start;
  while (q < s->extent && seq_pos(s, q) == q) q++;
  return q;
}

seq_t *seq_new(engine_t *eng, cache_t *c, uint64_t id);
/* Whether s has parts of its own. */
static inline bool seq_ext_owned(const seq_t *s) { return s->x != &seq_ext_none; }
/* Makes s->x->pos hold at least n entries: 0 or KVC_E_NOMEM (no change). */
int seq_pos_reserve(engine_t *eng, seq_t *s, uint64_t n);
/* Gives back what seq_pos_reserve grew past n entries (a failed call's
 * undo). */
void seq_pos_shrink(engine_t *eng, seq_t *s, uint64_t n);
/* Gives s positions of its own, each slot's its own number (cap * T of
 * them): 0 or KVC_E_NOMEM (no change). */
int seq_pos_own(engine_t *eng, seq_t *s);
/* Drops s's own positions: slots are positions again. */
void seq_pos_drop(engine_t *eng, seq_t *s);
void seq_free(engine_t *eng, seq_t *s);
/* Makes the table hold at least n entries; 0 or KVC_E_NOMEM (no change). */
int seq_reserve(engine_t *eng, seq_t *s, uint64_t n);
/* Counts a new sequence (already in its cache's map) and puts it on the LRU. */
void seq_enlist(engine_t *eng, seq_t *s);
/* Unlinks and frees a sequence: pages unreferenced, pins released. */
void seq_drop(engine_t *eng, seq_t *s);
/* Adds / removes a page reference of s, keeping pins and gauges right;
 * POOL_NOPAGE (an entry with no page) is no reference: nothing happens. */
void seq_page_add(engine_t *eng, seq_t *s, uint32_t page);
void seq_page_release(engine_t *eng, seq_t *s, uint32_t page);
/* Whether every slot of logical page idx that s spans ([start, table end))
 * is a hole: the only pages whose entry may be POOL_NOPAGE. */
bool seq_page_is_hole(const seq_t *s, uint64_t idx);
/* Releases the pages among those overlapping slots [b, e) that have become
 * all holes (seq_page_is_hole): their entries become POOL_NOPAGE. A write
 * there later allocates the page again, through room.c like any new page. */
void seq_release_holes(engine_t *eng, seq_t *s, uint64_t b, uint64_t e);
/* Sets per-layer lengths for layers [l0, l1) to at least end; layer_len must
 * already exist when the range is not every layer or lengths differ. */
void seq_set_lengths(engine_t *eng, seq_t *s, uint32_t l0, uint32_t l1, uint64_t end);
/* Shortens every layer to at most n tokens and frees pages past it. */
void seq_truncate(engine_t *eng, seq_t *s, uint64_t n);
void seq_info_fill(const engine_t *eng, const seq_t *s, kvc_seq_info_t *out);
/* Drops positions before n (n <= len): start moves, whole pages go. */
void seq_trim(engine_t *eng, seq_t *s, uint64_t n);

#endif
