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
  uint16_t arena;    /* the arena the pages come from (the call's cache's) */
} evict_need_t;
/* Makes room for the pages of arena nd->arena a call needs, all or
 * nothing: KVC_E_FULL (with figures) or KVC_E_QUOTA_PAGES changes nothing.
 * Free pages, then free segments, then in LRU order the arena's own victims
 * or segments given up by other arenas (arena.c); shares apply under
 * pressure only: a tenant the new pages would put past its share takes
 * only from its own arenas; one within its share takes from tenants over
 * theirs first. */
int evict_make_room(engine_t *eng, const evict_need_t *need);

/* Plans (changes nothing) eviction of arena's victims until it has need
 * free pages (less a copy on write that evicting its page's other holders
 * makes needless): the pages the plan frees, and in *missing (may be NULL)
 * the pages still short when its victims run out. by: the tenant whose call
 * it is (others' floors hold). nd: a call's noted copies, or NULL. */
uint64_t evict_plan(engine_t *eng, uint16_t arena, uint64_t need, const quota_t *by,
                    const evict_need_t *nd, uint64_t *missing);
/* Evicts arena's victims, least recent first, until it has need free
 * pages; false if they ran out first. */
bool evict_arena_to(engine_t *eng, uint16_t arena, uint64_t need, const quota_t *by);

#endif
