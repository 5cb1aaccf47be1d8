/* lru.h: the LRU lists of unpinned sequences and cached pages (lru.c). */
#ifndef KVC_LRU_H
#define KVC_LRU_H

#include "core.h"

void lru_link(engine_t *eng, lru_node_t *n, bool at_tail);
void lru_unlink(lru_node_t *n);
void lru_insert(engine_t *eng, seq_t *s);
void lru_remove(seq_t *s);
/* Moves s to the most recent end (unless pinned), stamps last_use and
 * refreshes a soft pin. */
void lru_touch(engine_t *eng, seq_t *s);

#endif
