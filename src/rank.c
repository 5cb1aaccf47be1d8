/* rank.c: each tenant's caches in order of the pages they hold (rank.h has
 * the picture). A page added or released costs a binary search over the
 * tenant's caches and one swap: a Stats reply's top caches are then the
 * first of the array, at no cost that grows with the caches. */
#include "rank.h"

#define RANK_CAP_MIN 4u

int rank_init(engine_t *eng, quota_t *q) {
  q->rank = mem_alloc(&eng->mem, RANK_CAP_MIN * sizeof *q->rank);
  if (!q->rank) return KVC_E_NOMEM;
  q->nrank = 0;
  q->rank_cap = RANK_CAP_MIN;
  return 0;
}

void rank_deinit(engine_t *eng, quota_t *q) {
  mem_free(&eng->mem, q->rank);
  q->rank = NULL;
  q->nrank = q->rank_cap = 0;
}

int rank_reserve(engine_t *eng, quota_t *q) {
  if (q->nrank < q->rank_cap) return 0;
  uint32_t cap = q->rank_cap ? 2 * q->rank_cap : RANK_CAP_MIN;
  cache_t **v = mem_realloc(&eng->mem, q->rank, (size_t)cap * sizeof *v);
  if (!v) return KVC_E_NOMEM;
  q->rank = v;
  q->rank_cap = cap;
  return 0;
}

void rank_add(cache_t *c) {
  quota_t *q = c->q;
  c->rank_pos = q->nrank;
  q->rank[q->nrank++] = c;
}

static void place(quota_t *q, uint32_t pos, cache_t *c) {
  q->rank[pos] = c;
  c->rank_pos = pos;
}

static void swap(quota_t *q, uint32_t a, uint32_t b) {
  if (a == b) return;
  cache_t *x = q->rank[a];
  place(q, a, q->rank[b]);
  place(q, b, x);
}

void rank_remove(cache_t *c) {
  quota_t *q = c->q;
  uint32_t last = q->nrank - 1;
  if (c->st.pages == 0) { /* the last cache holds no page either */
    swap(q, c->rank_pos, last);
  } else { /* never in practice: a cache is emptied before it goes */
    for (uint32_t i = c->rank_pos; i < last; i++) place(q, i, q->rank[i + 1]);
  }
  q->nrank--;
}

void rank_page_add(cache_t *c) {
  quota_t *q = c->q;
  uint64_t k = c->st.pages;
  uint32_t pos = c->rank_pos;
  if (pos > 0 && q->rank[pos - 1]->st.pages == k) {
    /* The first cache of count k, in [0, pos): those before hold more. */
    uint32_t lo = 0, hi = pos - 1;
    while (lo < hi) {
      uint32_t mid = lo + (hi - lo) / 2;
      if (q->rank[mid]->st.pages > k) lo = mid + 1;
      else hi = mid;
    }
    swap(q, lo, pos);
  }
  c->st.pages = k + 1;
}

void rank_page_release(cache_t *c) {
  quota_t *q = c->q;
  uint64_t k = c->st.pages;
  uint32_t pos = c->rank_pos, last = q->nrank - 1;
  if (pos < last && q->rank[pos + 1]->st.pages == k) {
    /* The last cache of count k, in (pos, last]: those after hold fewer. */
    uint32_t lo = pos + 1, hi = last;
    while (lo < hi) {
      uint32_t mid = lo + (hi - lo + 1) / 2;
      if (q->rank[mid]->st.pages < k) hi = mid - 1;
      else lo = mid;
    }
    swap(q, lo, pos);
  }
  c->st.pages = k - 1;
}
