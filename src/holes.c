/* holes.c: the slots of a sequence that hold no token, as a sorted set of
 * disjoint ranges.
 *
 * A reservation at a position past the length leaves the slots in between
 * unwritten (ollama's "copy a prefix, continue the copy at a later
 * position"); a shift leaves the slots it vacates. Such slots are holes: a
 * get returns zeros for them, a history view masks them, and nothing reads
 * their page bytes. Most sequences have none.
 *
 *   slots   0 1 2 3 4 5 6 7 8
 *           t t t . . t t . t      holes {[3, 5), [7, 8)}
 */
#include <string.h>

#include "holes.h"
#include "pool.h"
#include "seq.h"

int holes_reserve(engine_t *eng, seq_t *s, uint32_t k) {
  if (s->x->nholes + k <= s->x->hcap) return 0;
  if (seq_ext_own(eng, s)) return KVC_E_NOMEM;
  uint32_t cap = s->x->nholes + k < 4 ? 4 : (s->x->nholes + k) * 2;
  hole_t *h = mem_realloc(&eng->mem, s->x->holes, cap * sizeof *h);
  if (!h) {
    seq_ext_release(eng, s); /* made for nothing */
    return KVC_E_NOMEM;
  }
  s->x->holes = h;
  s->x->hcap = cap;
  return 0;
}

bool holes_has(const seq_t *s, uint64_t pos) {
  for (uint32_t i = 0; i < s->x->nholes; i++)
    if (pos < s->x->holes[i].e) return pos >= s->x->holes[i].b;
  return false;
}

bool holes_cover(const hole_t *h, uint32_t n, uint64_t b, uint64_t e) {
  for (uint32_t i = 0; i < n && b < e; i++) { /* apart: one range covers [b, e) or none */
    if (h[i].e <= b) continue;
    if (h[i].b > b) return false;
    b = h[i].e;
  }
  return b >= e;
}

void holes_cut(seq_t *s, uint64_t b, uint64_t e) {
  if (b >= e) return;
  for (uint32_t i = 0; i < s->x->nholes; i++) {
    hole_t *h = &s->x->holes[i];
    if (h->e <= b || h->b >= e) continue;
    if (h->b < b && h->e > e) { /* split: [h->b, b) and [e, h->e) */
      memmove(h + 2, h + 1, (s->x->nholes - i - 1) * sizeof *h);
      h[1].b = e;
      h[1].e = h->e;
      h->e = b;
      s->x->nholes++;
      return;
    }
    if (h->b < b) {
      h->e = b;
    } else if (h->e > e) {
      h->b = e;
    } else { /* inside: goes */
      memmove(h, h + 1, (s->x->nholes - i - 1) * sizeof *h);
      s->x->nholes--;
      i--;
    }
  }
}

void holes_add(seq_t *s, uint64_t b, uint64_t e) {
  if (b >= e) return;
  uint32_t i = 0;
  while (i < s->x->nholes && s->x->holes[i].e < b) i++;
  /* merge every range touching [b, e) into one at i */
  uint32_t j = i;
  while (j < s->x->nholes && s->x->holes[j].b <= e) {
    if (s->x->holes[j].b < b) b = s->x->holes[j].b;
    if (s->x->holes[j].e > e) e = s->x->holes[j].e;
    j++;
  }
  if (j == i) { /* nothing merged: insert */
    memmove(&s->x->holes[i + 1], &s->x->holes[i], (s->x->nholes - i) * sizeof *s->x->holes);
    s->x->nholes++;
  } else if (j > i + 1) {
    memmove(&s->x->holes[i + 1], &s->x->holes[j], (s->x->nholes - j) * sizeof *s->x->holes);
    s->x->nholes -= j - i - 1;
  }
  s->x->holes[i].b = b;
  s->x->holes[i].e = e;
}

void holes_move(seq_t *s, uint64_t b, uint64_t e, int64_t delta, hole_t *tmp) {
  uint32_t k = 0;
  for (uint32_t i = 0; i < s->x->nholes; i++) {
    hole_t h = s->x->holes[i];
    if (h.e <= b || h.b >= e) continue;
    tmp[k].b = (h.b > b ? h.b : b) + (uint64_t)delta;
    tmp[k++].e = (h.e < e ? h.e : e) + (uint64_t)delta;
  }
  holes_cut(s, b, e);
  holes_cut(s, b + (uint64_t)delta, e + (uint64_t)delta); /* the target's own holes go */
  for (uint32_t i = 0; i < k; i++) holes_add(s, tmp[i].b, tmp[i].e);
}

void holes_within(const seq_t *s, uint64_t b, uint64_t e,
                  void (*fn)(uint64_t off, uint64_t n, void *arg), void *arg) {
  for (uint32_t i = 0; i < s->x->nholes; i++) {
    uint64_t lo = s->x->holes[i].b > b ? s->x->holes[i].b : b;
    uint64_t hi = s->x->holes[i].e < e ? s->x->holes[i].e : e;
    if (lo < hi) fn(lo - b, hi - lo, arg);
  }
}

/* Zeroes every layer's rows of slots [b, e), in pages the sequence holds. */
static void zero_slots(engine_t *eng, const seq_t *s, uint64_t b, uint64_t e) {
  const geom_t *g = &s->cache->g;
  uint64_t T1 = g->T - 1, sr = (uint64_t)g->H * 4;
  for (uint64_t q = b; q < e; q++) {
    uint32_t page = s->table[(q >> g->tshift) - s->base];
    if (page == POOL_NOPAGE) continue;
    unsigned char *p = pool_page(&eng->pool, page);
    uint64_t t = q & T1;
    for (uint32_t l = 0; l < g->L; l++, p += g->layer_bytes) {
      memset(p + t * g->k_row, 0, g->k_row);
      memset(p + g->k_off_v + t * g->v_row, 0, g->v_row);
      if (g->int8) {
        memset(p + g->ks_off + t * sr, 0, sr);
        memset(p + g->vs_off + t * sr, 0, sr);
      }
    }
  }
}

void holes_zero(engine_t *eng, const seq_t *s, uint64_t b, uint64_t e) {
  for (uint32_t i = 0; i < s->x->nholes; i++) {
    uint64_t lo = s->x->holes[i].b > b ? s->x->holes[i].b : b;
    uint64_t hi = s->x->holes[i].e < e ? s->x->holes[i].e : e;
    if (lo < hi) zero_slots(eng, s, lo, hi);
  }
}
