/* evict.c: the LRU of unpinned sequences and all-or-nothing eviction.
 *
 *   eng->lru (sentinel) <-> most recent <-> ... <-> least recent <-> (sentinel)
 *
 * Pinned sequences are not on the list at all, so eviction never has to skip
 * them. Making room is planned before anything is freed: walking from the
 * least recent end, each candidate's pages get a count in pool.sim; a page is
 * freed by the plan once sim reaches its refcnt (every holder is a victim).
 * If the plan cannot reach the need, the call fails with KVC_E_FULL and the
 * counts are cleared: nothing changed. Otherwise exactly the planned victims
 * are evicted. Each step is O(1) per page of a visited sequence.
 */
#include "engine_impl.h"

void lru_insert(engine_t *eng, seq_t *s) {
  seq_t *head = &eng->lru;
  s->lru_prev = head;
  s->lru_next = head->lru_next;
  head->lru_next->lru_prev = s;
  head->lru_next = s;
}

void lru_remove(seq_t *s) {
  s->lru_prev->lru_next = s->lru_next;
  s->lru_next->lru_prev = s->lru_prev;
  s->lru_prev = s->lru_next = NULL;
}

void lru_touch(engine_t *eng, seq_t *s) {
  s->last_use_ms = eng->now_ms;
  if (s->npins) return;
  lru_remove(s);
  lru_insert(eng, s);
}

/* Walks victims from the least recent end, counting their pages in sim,
 * until free + planned reaches *need. A page whose every holder is a victim
 * is freed by the plan; a page written by this call (SIM_COW) whose other
 * holders are all victims no longer needs its copy, so *need drops. */
static uint64_t plan(engine_t *eng, uint64_t *need, seq_t **last) {
  pool_t *p = &eng->pool;
  uint64_t freed = 0;
  *last = &eng->lru;
  for (seq_t *s = eng->lru.lru_prev; s != &eng->lru && p->nfree + freed < *need;
       s = s->lru_prev) {
    *last = s;
    if (s->mark == eng->epoch) continue;
    for (uint32_t i = 0; i < s->ntable; i++) {
      uint32_t page = s->table[i], v = ++p->sim[page];
      if ((v & SIM_MASK) != p->refcnt[page]) continue;
      if (v & SIM_COW) (*need)--;
      else freed++;
    }
  }
  return freed;
}

static void plan_clear(engine_t *eng, seq_t *last) {
  if (last == &eng->lru) return;
  for (seq_t *s = eng->lru.lru_prev;; s = s->lru_prev) {
    if (s->mark != eng->epoch)
      for (uint32_t i = 0; i < s->ntable; i++) eng->pool.sim[s->table[i]] = 0;
    if (s == last) break;
  }
}

uint64_t evict_note_write(engine_t *eng, uint32_t page) {
  pool_t *p = &eng->pool;
  if (p->refcnt[page] < 2) return 0;
  p->sim[page] = (p->sim[page] | SIM_COW) + 1;
  return 1;
}

uint64_t evict_settle_writes(engine_t *eng, uint32_t page) {
  pool_t *p = &eng->pool;
  uint32_t v = p->sim[page];
  if (!(v & SIM_COW) || (v & SIM_SEEN) || (v & SIM_MASK) != p->refcnt[page]) return 0;
  p->sim[page] = v | SIM_SEEN; /* every holder writes it: one may write in place */
  return 1;
}

int evict_make_room(engine_t *eng, uint64_t need) {
  pool_t *p = &eng->pool;
  if (need <= p->nfree) return 0;
  seq_t *last;
  uint64_t freeable = plan(eng, &need, &last);
  plan_clear(eng, last);
  if (p->nfree + freeable < need) {
    eng->st.full_errors++;
    int rc = engine_fail(eng, KVC_E_FULL,
                         "pool full: need %llu pages, %u free, %llu reclaimable",
                         (unsigned long long)need, p->nfree,
                         (unsigned long long)freeable);
    eng->err.needed = need;
    eng->err.freeable = p->nfree + freeable;
    return rc;
  }
  /* Evict exactly the planned victims: the least recent through `last`. */
  for (seq_t *s = eng->lru.lru_prev, *stop = last->lru_prev; s != stop;) {
    seq_t *prev = s->lru_prev;
    if (s->mark != eng->epoch) {
      uint32_t before = p->nfree;
      s->cache->st.evicted_sequences++;
      seq_drop(eng, s);
      eng->st.evicted_sequences++;
      eng->st.evicted_pages += p->nfree - before;
    }
    s = prev;
  }
  return 0;
}
