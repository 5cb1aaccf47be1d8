/* lru.c: the LRU lists of unpinned sequences and cached pages, one list per
 * retention priority (the order evict.c reclaims in).
 *
 *   lru[0]   (sentinel) <-> most recent <-> ... <-> least recent <-> (sentinel)
 *   lru[1]   ...
 *   lru[100] ...            a list per retention priority; 0 goes first
 */
#include "lru.h"

#include "core.h"

void lru_link(engine_t *eng, lru_node_t *n, bool at_tail) {
  lru_node_t *head = &eng->lru[n->prio];
  if (at_tail) {
    n->next = head;
    n->prev = head->prev;
    head->prev->next = n;
    head->prev = n;
  } else {
    n->prev = head;
    n->next = head->next;
    head->next->prev = n;
    head->next = n;
  }
}

void lru_unlink(lru_node_t *n) {
  n->prev->next = n->next;
  n->next->prev = n->prev;
  n->prev = n->next = NULL;
}

void lru_insert(engine_t *eng, seq_t *s) { lru_link(eng, &s->node, false); }

void lru_remove(seq_t *s) { lru_unlink(&s->node); }

void lru_touch(engine_t *eng, seq_t *s) {
  s->last_use_ms = eng->now_ms;
  if (s->npins) {
    for (pin_t *p = s->pins; p; p = p->s_next)
      if (p->ttl_ms)
        p->deadline_ms = __builtin_add_overflow(eng->now_ms, p->ttl_ms, &p->deadline_ms)
                             ? UINT64_MAX : p->deadline_ms;
    return;
  }
  /* Already the most recent (a client's one busy sequence): moving it would
   * write the same pointers, and its neighbour's line. */
  if (eng->lru[s->node.prio].next == &s->node) return;
  lru_unlink(&s->node);
  lru_link(eng, &s->node, false);
}
