/* arena.c: segments moving between arenas (arena.h; doc/design.md, "The
 * pool").
 *
 *   arena a needs room, none is free:
 *     a free segment, or an empty one of another arena     -> a (no loss)
 *     else, in LRU order over the node (evict.c):
 *       a's own least recent victim                          -> evicted
 *       or the arena b whose least recent victim is older:
 *         evict b's victims until b has a segment's worth of free pages,
 *         move the live pages of b's emptiest movable segment into them,
 *         the segment                                        -> a
 *
 * A page moves as the pool's shrink moves it (resize.c): its bytes, its
 * counts and its token metadata go to a free page of the same arena, and
 * every reference to it (block tables, index parents) is rewritten. A page
 * a reader holds in place (a lease) or a copy in flight writes (a busy
 * sequence's) never moves: a segment that holds one is not given up.
 */
#include "arena.h"

#include <string.h>

#include "lease.h"
#include "page.h"

#define NOPAGE POOL_NOPAGE

static uint64_t owner_of(const pool_arena_t *ar) {
  return (uint64_t)ar->tenant << 32 | ar->group;
}

/* Carves segment s (free) into arena a: from_owner's before. */
static void take(engine_t *eng, uint32_t s, uint16_t a, uint64_t from) {
  pool_seg_carve(&eng->pool, s, a);
  if (eng->seg_hook) eng->seg_hook(eng->seg_ctx, s, from, owner_of(&eng->pool.arenas[a]));
}

bool arena_take_free(engine_t *eng, uint16_t a, bool empty_too) {
  pool_t *p = &eng->pool;
  uint32_t s = pool_seg_free(p, UINT32_MAX);
  if (s != UINT32_MAX) {
    take(eng, s, a, ENGINE_OWNER_NONE);
    return true;
  }
  /* An empty segment of another arena: none is the common case of a full
   * pool (while a evicts, the segments it empties are its own), known
   * without a walk over every segment. */
  for (s = 0; empty_too && p->nseg_empty > p->arenas[a].nempty && s < p->nseg; s++) {
    uint16_t b = p->seg_arena[s];
    if (b == POOL_NOARENA || b == a || p->seg_used[s]) continue;
    uint64_t from = owner_of(&p->arenas[b]);
    pool_seg_uncarve(p, s);
    eng->st.segment_moves++;
    take(eng, s, a, from);
    return true;
  }
  return false;
}

void arena_movable(const engine_t *eng, uint8_t *movable) {
  const pool_t *p = &eng->pool;
  memset(movable, 1, p->nseg);
  for (const lease_t *l = eng->lease_list; l; l = l->next)
    for (uint32_t i = 0; i < l->npages; i++) movable[pool_seg_of(p, l->pages[i])] = 0;
  for (const put_flight_t *j = eng->put_jobs; j; j = j->next) {
    seq_t *const *seqs = j->seqs;
    for (size_t i = 0; i < j->n; i++)
      for (uint32_t k = 0; k < seqs[i]->ntable; k++)
        if (seqs[i]->table[k] != NOPAGE) movable[pool_seg_of(p, seqs[i]->table[k])] = 0;
  }
}

/* b's movable segment with the fewest pages in use, or UINT32_MAX. */
static uint32_t emptiest(const engine_t *eng, uint16_t b, const uint8_t *movable) {
  const pool_t *p = &eng->pool;
  uint32_t best = UINT32_MAX;
  for (uint32_t s = 0; s < p->nseg; s++)
    if (p->seg_arena[s] == b && movable[s] &&
        (best == UINT32_MAX || p->seg_used[s] < p->seg_used[best]))
      best = s;
  return best;
}

static uint8_t *movable_map(engine_t *eng) {
  uint8_t *m = mem_alloc(&eng->mem, eng->pool.nseg ? eng->pool.nseg : 1);
  if (m) arena_movable(eng, m);
  return m;
}

uint64_t arena_room(engine_t *eng, uint16_t a) {
  pool_t *p = &eng->pool;
  uint64_t k = p->nseg_free;
  uint8_t *mov = movable_map(eng);
  if (!mov) return k; /* out of memory: free segments only */
  for (uint32_t b = 0; b < p->narenas; b++) {
    const pool_arena_t *ab = &p->arenas[b];
    if (b == a || !ab->live || !ab->nseg) continue;
    uint64_t empty = 0, nmov = 0;
    for (uint32_t s = 0; s < p->nseg; s++) {
      if (p->seg_arena[s] != b) continue;
      if (!p->seg_used[s]) empty++;
      else nmov += mov[s];
    }
    uint64_t spare = (ab->nfree - empty * ab->per_seg) / ab->per_seg;
    k += empty + (spare < nmov ? spare : nmov);
  }
  mem_free(&eng->mem, mov);
  return k;
}

uint64_t arena_vacate(engine_t *eng, uint32_t s, uint32_t *mp) {
  pool_t *p = &eng->pool;
  uint16_t b = p->seg_arena[s];
  pool_arena_t *ab = &p->arenas[b];
  uint32_t first = s * p->ids_per_seg, n = ab->per_seg;
  (void)pool_seg_detach_free(p, s);
  uint64_t moved = 0;
  for (uint32_t i = 0; i < n; i++) {
    uint32_t old = first + i;
    mp[i] = NOPAGE;
    if (!p->refcnt[old]) continue;
    uint32_t dst = pool_alloc(p, b); /* refcnt 1, counted in use: set below */
    memcpy(pool_page(p, dst), pool_page(p, old), ab->page_bytes);
    p->refcnt[dst] = p->refcnt[old];
    p->pinref[dst] = p->pinref[old];
    p->plan[dst] = p->plan[old];
    p->refcnt[old] = p->pinref[old] = p->plan[old] = 0;
    p->nused--; /* old leaves use: pool_alloc counted dst */
    p->used_bytes -= ab->stride;
    if (--p->seg_used[s] == 0) pool_seg_emptied(p, s);
    eng->page_quota[dst] = eng->page_quota[old];
    if (eng->lease_ref) eng->lease_ref[dst] = 0;
    if (eng->ip) {
      eng->ip[dst] = eng->ip[old];
      eng->ip[old] = NULL;
      if (eng->ip[dst]) eng->ip[dst]->page = dst;
    }
    mp[i] = dst;
    moved++;
  }
  if (moved) {
    uint32_t end = first + n;
    for (uint32_t ci = 0; ci < eng->ncaches; ci++) {
      cache_t *c = eng->caches[ci];
      if (!c || c->arena != b) continue;
      size_t pos = 0;
      seq_t *sq;
      while ((sq = hmap_next(&c->seqs, &pos, NULL)))
        for (uint32_t i = 0; i < sq->ntable; i++)
          if (sq->table[i] >= first && sq->table[i] < end) sq->table[i] = mp[sq->table[i] - first];
    }
    for (uint32_t t = 0; eng->ip && t < p->nseg; t++) {
      if (p->seg_arena[t] != b) continue;
      for (uint32_t q = t * p->ids_per_seg, e = q + ab->per_seg; q < e; q++) {
        ipage_t *ip = eng->ip[q];
        if (ip && ip->parent != NOPAGE && ip->parent >= first && ip->parent < end)
          ip->parent = mp[ip->parent - first];
      }
    }
  }
  return moved;
}

uint32_t arena_emptiest(engine_t *eng, uint16_t b) {
  uint8_t *mov = movable_map(eng);
  if (!mov) return UINT32_MAX;
  uint32_t s = emptiest(eng, b, mov);
  mem_free(&eng->mem, mov);
  return s;
}

uint64_t arena_movable_segments(engine_t *eng, uint16_t b, uint64_t *empty) {
  pool_t *p = &eng->pool;
  uint8_t *mov = movable_map(eng);
  uint64_t nmov = 0;
  *empty = 0;
  for (uint32_t s = 0; s < p->nseg; s++) {
    if (p->seg_arena[s] != b) continue;
    if (!p->seg_used[s]) (*empty)++;
    else nmov += mov ? mov[s] : 0;
  }
  mem_free(&eng->mem, mov);
  return nmov;
}

bool arena_hand_over(engine_t *eng, uint16_t b, uint16_t a) {
  pool_t *p = &eng->pool;
  pool_arena_t *ab = &p->arenas[b];
  uint32_t *map = mem_alloc(&eng->mem, (size_t)ab->per_seg * sizeof *map);
  uint32_t s = map && ab->nfree >= ab->per_seg ? arena_emptiest(eng, b) : UINT32_MAX;
  if (s == UINT32_MAX) {
    mem_free(&eng->mem, map);
    return false;
  }
  uint64_t from = owner_of(ab);
  uint64_t moved = arena_vacate(eng, s, map);
  mem_free(&eng->mem, map);
  pool_seg_release(p, s);
  if (!ab->nseg && !ab->ncaches) ab->live = false;
  eng->st.segment_moves++;
  eng->st.segment_moved_pages += moved;
  take(eng, s, a, from);
  return true;
}
