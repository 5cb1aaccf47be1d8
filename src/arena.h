/* arena.h: segments moving between arenas (arena.c): taking a free or
 * empty segment, and emptying a segment of one arena for another by moving
 * its live pages (evict.c decides when, and evicts first). */
#ifndef KVC_ARENA_H
#define KVC_ARENA_H

#include "core.h"

/* Gives arena a a free segment, or (empty_too) an empty one of another
 * arena (nothing lost): false if there is none. Calls the segment hook
 * (engine.h). */
bool arena_take_free(engine_t *eng, uint16_t a, bool empty_too);

/* Segments arena a could take without evicting anything: free ones, empty
 * ones of other arenas, and those other arenas could empty by moving their
 * live pages into their own free pages. */
uint64_t arena_room(engine_t *eng, uint16_t a);

/* Marks in movable[s] (for every segment, 1: movable) whether segment s
 * holds no page a lease or a put in flight uses. */
void arena_movable(const engine_t *eng, uint8_t *movable);

/* Moves every page in use of segment s to free pages on its arena's free
 * list (s's own leave it first), which must be enough; no page of s may be
 * leased or busy. s's pages end free and off every list; the caller
 * releases s (pool_seg_release). map: scratch of the arena's per_seg
 * entries. Returns the pages moved. */
uint64_t arena_vacate(engine_t *eng, uint32_t s, uint32_t *map);

/* b's movable segment with the fewest pages in use, or UINT32_MAX (also
 * out of memory). */
uint32_t arena_emptiest(engine_t *eng, uint16_t b);
/* b's segments in use that could move (no leased or busy page), and in
 * *empty its segments with no page in use. */
uint64_t arena_movable_segments(engine_t *eng, uint16_t b, uint64_t *empty);
/* Arena b, holding a segment's worth of free pages, moves the live pages
 * of its emptiest movable segment into them and hands the segment to a.
 * false: it cannot (nothing changed). */
bool arena_hand_over(engine_t *eng, uint16_t b, uint16_t a);

#endif
