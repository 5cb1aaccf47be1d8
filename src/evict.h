/* evict.h: all-or-nothing eviction: planning what a call needs and
 * reclaiming unpinned sequences and cached pages in LRU order (evict.c). */
#ifndef KVC_EVICT_H
#define KVC_EVICT_H

#include "core.h"

/* The pages a call needs: new pages, and the shared pages it writes. A shared
 * page needs a copy per writer, or one fewer if its writers are its only
 * holders (eviction of the other holders can make it so). Noted pages carry
 * PLAN_COW in pool.plan while the call plans. */
#define PLAN_COW 0x80000000u
#define PLAN_MASK 0x7fffffffu
typedef struct evict_note {
  uint32_t page;
  uint32_t writers;
} evict_note_t;
typedef struct evict_need {
  uint64_t new_pages;
  evict_note_t *noted;
  size_t nnoted;
  quota_t *q;        /* the tenant the new pages count against */
} evict_need_t;
/* Frees pages by evicting unpinned, unmarked sequences and cached pages in
 * order, all or nothing: KVC_E_FULL (with figures) changes nothing. Page
 * shares apply under pressure only (the call needs more than is free): a
 * tenant the new pages would put past its share makes room from its own
 * victims alone (KVC_E_QUOTA_PAGES, nothing changed, if they are not
 * enough); a tenant within its share takes first from tenants over theirs. */
int evict_make_room(engine_t *eng, const evict_need_t *need);

#endif
