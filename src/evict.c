/* evict.c: all-or-nothing eviction: reclaiming unpinned sequences and cached
 * pages from the LRU lists (lru.c), least recent first, planned in full first.
 *
 *   lru[0]   (sentinel) <-> most recent <-> ... <-> least recent <-> (sentinel)
 *   lru[1]   ...
 *   lru[100] ...            a list per retention priority; 0 goes first
 *
 * A node is a sequence (unpinned) or a cached page (an indexed page that only
 * the prefix index holds). Pinned sequences are not on any list, so eviction
 * never skips them. A cached page goes only once no indexed page continues its
 * chain (a "leaf"): a prefix never loses a page in its middle. When a sequence
 * is evicted, its pages that become cached join the tail of its list, deepest
 * page last, so they go next, chain tails before chain heads.
 *
 * Making room is planned before anything changes: walking victims in order,
 * pool.plan counts each page's victim holders; a page is freed by the plan
 * once every holder is a victim, and an indexed page that keeps only the
 * index's reference becomes a cached page the plan reclaims right after its
 * sequence (if it is a leaf by then). If free + planned cannot reach the need
 * the call fails with KVC_E_FULL and nothing changed. Otherwise victims are
 * evicted in the same order until the need is met. Each step is O(1) per page.
 *
 * Pages come from arenas (pool.h): a call needs pages of its cache's arena.
 * Free pages of the arena first; then a free segment (or an empty one of
 * another arena), without pressure; then, in LRU order over the whole
 * node, either the arena's own least recent victim or a segment of the
 * arena whose least recent victim is older (arena.c: it evicts its own least
 * recent data until a segment's live pages fit its other segments, moves
 * them there and gives the segment up). Planned first, all or nothing: the
 * arena's own victims plus what other arenas can give must cover the need.
 * Shares: a tenant past its share takes segments only from its own arenas
 * (KVC_E_QUOTA_PAGES when others' would be enough); one within its share
 * takes from arenas of tenants over theirs first; a tenant's floor stops
 * eviction of its data for others.
 */
#include <stddef.h>

#include "evict.h"
#include "arena.h"
#include "lru.h"
#include "page.h"
#include "prefix.h"
#include "quota.h"
#include "seq.h"
#include "units.h"

#define SEQ_OF(n) ((seq_t *)(void *)((char *)(n) - offsetof(seq_t, node)))
#define IPAGE_OF(n) ((ipage_t *)(void *)((char *)(n) - offsetof(ipage_t, node)))

/* ---- the pages a call needs ------------------------------------------------ */

/* Writers of a noted page (a shared page this call writes). */
static uint32_t writers_of(const evict_need_t *nd, uint32_t page) {
  for (size_t i = 0; i < nd->nnoted; i++)
    if (nd->noted[i].page == page) return nd->noted[i].writers;
  return 0;
}

/* Pages the call needs now: new ones plus a copy per writer of each shared
 * page, less one where the writers are its only holders. */
static uint64_t need_now(const engine_t *eng, const evict_need_t *nd) {
  uint64_t need = nd->new_pages;
  for (size_t i = 0; i < nd->nnoted; i++) {
    uint32_t w = nd->noted[i].writers;
    need += eng->pool.refcnt[nd->noted[i].page] > w ? w : w - 1;
  }
  return need;
}

/* ---- planning --------------------------------------------------------------- */

typedef struct plan {
  uint64_t need;    /* free pages the arena must reach, shrinking as copies lapse */
  uint64_t freed;   /* pages the plan frees */
  uint64_t reclaims; /* of them, cached pages it reclaims */
  uint32_t *stack;  /* cached pages to reclaim next (deepest on top) */
  uint32_t top;
  uint32_t *touched; /* ipages whose plan fields were set */
  uint32_t ntouched;
  uint32_t last_prio; /* the walk's last node, to clear what it marked */
  lru_node_t *last;
  uint16_t arena;    /* victims of this arena alone */
  const quota_t *by; /* whose call it is: others' floors apply (min_bytes) */
} plan_t;

static void touch_ip(plan_t *pl, ipage_t *ip) {
  if (ip->plan_gone == 0 && !ip->planned && !ip->stacked) pl->touched[pl->ntouched++] = ip->page;
}

static void plan_push(plan_t *pl, ipage_t *ip) {
  if (ip->stacked) return;
  touch_ip(pl, ip);
  ip->stacked = true;
  pl->stack[pl->top++] = ip->page;
}

static bool plan_cached(const engine_t *eng, uint32_t page) {
  return eng->pool.refcnt[page] - (eng->pool.plan[page] & PLAN_MASK) == 1;
}

/* The plan reclaims cached page ip; its parent may become a reclaimable leaf. */
static void plan_reclaim(engine_t *eng, plan_t *pl, ipage_t *ip) {
  touch_ip(pl, ip);
  ip->planned = true;
  pl->freed++;
  pl->reclaims++;
  ip->cache->q->plan_freed++;
  if (ip->parent == POOL_NOPAGE) return;
  ipage_t *par = page_meta(eng, ip->parent);
  touch_ip(pl, par);
  par->plan_gone++;
  if (!par->planned && par->plan_gone == par->nchildren && plan_cached(eng, par->page))
    plan_push(pl, par);
}

static bool plan_done(const engine_t *eng, const plan_t *pl) {
  return eng->pool.arenas[pl->arena].nfree + pl->freed >= pl->need;
}

/* Whether taking the victim at n (its table's pages, or one cached page)
 * could take its tenant below its floor, counting what the plan frees of
 * that tenant already (planning) or what it holds now (evicting: nothing
 * planned). A tenant's own call is not held by its own floor. */
static bool under_floor(const engine_t *eng, const plan_t *pl, const lru_node_t *n,
                        const quota_t *q) {
  if (q == pl->by) return false;
  uint64_t floor = quota_lim(eng, q)->min_bytes;
  if (!floor) return false;
  uint64_t stride = eng->pool.arenas[pl->arena].stride;
  uint64_t victim = n->kind == LRU_SEQ ? SEQ_OF(n)->npages : 1;
  return q->use.bytes < floor + (q->plan_freed + victim) * stride;
}

static const cache_t *node_cache(const lru_node_t *n) {
  return n->kind == LRU_SEQ ? SEQ_OF(n)->cache : IPAGE_OF(n)->cache;
}

/* Whether the walk takes the victim at node n. */
static bool walk_takes(const engine_t *eng, const plan_t *pl, const lru_node_t *n) {
  const cache_t *c = node_cache(n);
  return c->arena == pl->arena && !under_floor(eng, pl, n, c->q);
}

static void plan_drain(engine_t *eng, plan_t *pl) {
  while (pl->top && !plan_done(eng, pl)) {
    ipage_t *ip = page_meta(eng, pl->stack[--pl->top]);
    if (!ip->planned && ip->plan_gone == ip->nchildren) plan_reclaim(eng, pl, ip);
  }
}

static void plan_seq(engine_t *eng, plan_t *pl, const evict_need_t *nd, seq_t *s) {
  pool_t *p = &eng->pool;
  s->planned = true;
  for (uint32_t i = 0; i < s->ntable; i++) {
    if (s->table[i] == POOL_NOPAGE) continue; /* all holes: nothing to free */
    uint32_t page = s->table[i], v = ++p->plan[page], held = v & PLAN_MASK;
    if (v & PLAN_COW) {
      if (held == p->refcnt[page] - writers_of(nd, page) && pl->need)
        pl->need--; /* copy lapses */
    } else if (held == p->refcnt[page]) {
      pl->freed++;
      s->cache->q->plan_freed++;
    } else if (held == p->refcnt[page] - 1 && page_meta(eng, page) && page_meta(eng, page)->indexed) {
      plan_push(pl, page_meta(eng, page)); /* becomes a cached page, reclaimed next */
    }
  }
}

/* Walks the victims in eviction order until the plan meets its need. */
static void plan_walk(engine_t *eng, plan_t *pl, const evict_need_t *nd) {
  for (uint32_t prio = 0; prio < PRIO_LEVELS && !plan_done(eng, pl); prio++) {
    lru_node_t *head = &eng->lru[prio];
    for (lru_node_t *n = head->prev; n != head && !plan_done(eng, pl); n = n->prev) {
      if (!walk_takes(eng, pl, n)) continue;
      pl->last_prio = prio;
      pl->last = n;
      if (n->kind == LRU_SEQ) {
        seq_t *s = SEQ_OF(n);
        if (s->mark == eng->epoch || s->planned || s->busy) continue;
        plan_seq(eng, pl, nd, s);
      } else {
        ipage_t *ip = IPAGE_OF(n);
        if (!ip->planned && ip->plan_gone == ip->nchildren) plan_reclaim(eng, pl, ip);
      }
      plan_drain(eng, pl);
    }
  }
}

/* Undoes the plan's marks on the nodes it walked; PLAN_COW notes stay. */
static void plan_clear(engine_t *eng, plan_t *pl) {
  for (uint32_t prio = 0; pl->last && prio <= pl->last_prio; prio++) {
    lru_node_t *head = &eng->lru[prio];
    for (lru_node_t *n = head->prev; n != head; n = n->prev) {
      if (n->kind == LRU_SEQ && SEQ_OF(n)->planned) {
        seq_t *s = SEQ_OF(n);
        s->planned = false;
        for (uint32_t i = 0; i < s->ntable; i++)
          if (s->table[i] != POOL_NOPAGE) eng->pool.plan[s->table[i]] &= PLAN_COW;
      }
      if (n == pl->last) break;
    }
  }
  for (uint32_t i = 0; i < pl->ntouched; i++) {
    ipage_t *ip = page_meta(eng, pl->touched[i]);
    ip->planned = ip->stacked = false;
    ip->plan_gone = 0;
  }
}

static void plan_freed_reset(engine_t *eng) {
  for (uint32_t i = 0; i < eng->nquotas; i++) eng->quotas[i]->plan_freed = 0;
}

uint64_t evict_plan(engine_t *eng, uint16_t arena, uint64_t need, const quota_t *by,
                    const evict_need_t *nd, uint64_t *missing) {
  evict_need_t none = {0};
  plan_t pl = {.need = need, .stack = eng->scratch,
               .touched = eng->scratch ? eng->scratch + eng->pool.npages : NULL,
               .arena = arena, .by = by};
  plan_freed_reset(eng);
  plan_walk(eng, &pl, nd ? nd : &none);
  plan_clear(eng, &pl);
  plan_freed_reset(eng);
  eng->plan_reclaims = pl.reclaims;
  uint64_t have = eng->pool.arenas[arena].nfree + pl.freed;
  if (missing) *missing = have >= pl.need ? 0 : pl.need - have;
  return pl.freed;
}

/* ---- evicting ---------------------------------------------------------------- */

/* Reclaims the least recent victim of the filter's arena; false if there
 * is none. */
static bool evict_one(engine_t *eng, const plan_t *filter) {
  for (uint32_t prio = 0; prio < PRIO_LEVELS; prio++) {
    lru_node_t *head = &eng->lru[prio];
    for (lru_node_t *n = head->prev; n != head; n = n->prev) {
      if (!walk_takes(eng, filter, n)) continue;
      if (n->kind == LRU_SEQ) {
        seq_t *s = SEQ_OF(n);
        if (s->mark == eng->epoch || s->busy) continue;
        uint32_t before = eng->pool.nfree;
        s->cache->st.evicted_sequences++;
        eng->evicting = true;
        seq_drop(eng, s);
        eng->evicting = false;
        eng->st.evicted_sequences++;
        eng->st.evicted_pages += eng->pool.nfree - before;
        return true;
      }
      ipage_t *ip = IPAGE_OF(n);
      if (ip->nchildren == 0) {
        if (eng->reclaims_left) eng->reclaims_left--;
        prefix_reclaim(eng, ip);
        return true;
      }
    }
  }
  return false;
}

bool evict_arena_to(engine_t *eng, uint16_t arena, uint64_t need, const quota_t *by) {
  plan_t f = {.arena = arena, .by = by};
  while (eng->pool.arenas[arena].nfree < need)
    if (!evict_one(eng, &f)) return false;
  return true;
}

/* How many segments (at most k) arena b could give up now, planned without
 * changing anything: its free pages plus what evicting its victims frees
 * must hold the live pages of the segments it gives in its other segments,
 * and those segments must hold no page a reader or a copy in flight uses.
 * Its empty segments are counted as free room already (arena_room). */
static uint64_t can_give(engine_t *eng, uint16_t b, uint64_t k, const quota_t *by) {
  const pool_arena_t *ab = &eng->pool.arenas[b];
  uint64_t empty, nmov = arena_movable_segments(eng, b, &empty);
  /* What arena_room counted of b already: its empty segments, and those its
   * free pages let it empty by moving alone. */
  uint64_t spare = (ab->nfree - empty * ab->per_seg) / ab->per_seg;
  if (spare > nmov) spare = nmov;
  if (k > nmov - spare) k = nmov - spare;
  if (!k) return 0;
  uint64_t base = (empty + spare) * ab->per_seg, want = base + k * ab->per_seg, free = ab->nfree;
  if (free < want) free += evict_plan(eng, b, want, by, NULL, NULL);
  uint64_t can = free >= base ? (free - base) / ab->per_seg : 0;
  return can < k ? can : k;
}

/* Whether tenant q holds more than its share. */
static bool over_share(const engine_t *eng, const quota_t *q) {
  uint64_t max = quota_lim(eng, q)->max_bytes;
  return max && q->use.bytes > max;
}

/* Whether arena b may give a segment to a call of tenant by (in arena a):
 * a tenant past its share (own) takes only from its own arenas. */
static bool may_take_from(const engine_t *eng, uint16_t a, uint16_t b, bool own) {
  const pool_arena_t *ab = &eng->pool.arenas[b];
  if (b == a || !ab->live || !ab->nseg) return false;
  return !own || ab->tenant == eng->pool.arenas[a].tenant;
}

/* The arena of the least recent victim a call in arena a may take: a itself
 * (a victim of its own), another arena that may give a segment and is not
 * worn out (plan_segs 1), or POOL_NOARENA. over_first: only arenas of
 * tenants over their share (and none of a's own victims). */
static uint16_t oldest_source(const engine_t *eng, uint16_t a, const quota_t *by, bool own,
                              bool over_first) {
  for (uint32_t prio = 0; prio < PRIO_LEVELS; prio++) {
    const lru_node_t *head = &eng->lru[prio];
    for (const lru_node_t *n = head->prev; n != head; n = n->prev) {
      const cache_t *c = node_cache(n);
      if (n->kind == LRU_SEQ && (SEQ_OF(n)->mark == eng->epoch || SEQ_OF(n)->busy)) continue;
      if (n->kind == LRU_PAGE && IPAGE_OF(n)->nchildren) continue; /* not a leaf yet */
      if (c->arena == a) {
        if (!over_first) return a;
        continue;
      }
      if (!may_take_from(eng, a, c->arena, own) || eng->pool.arenas[c->arena].plan_segs == 1)
        continue;
      if (over_first && !(c->q != by && over_share(eng, c->q))) continue;
      return c->arena;
    }
  }
  return POOL_NOARENA;
}

/* A segment from another arena that has a segment's worth of free pages:
 * its live pages move, nothing is evicted. false: none could. */
static bool give_free_room(engine_t *eng, uint16_t a, bool own) {
  pool_t *p = &eng->pool;
  for (uint32_t b = 0; b < p->narenas; b++) {
    pool_arena_t *ab = &p->arenas[b];
    if (!may_take_from(eng, a, (uint16_t)b, own) || ab->plan_segs == 1 ||
        ab->nfree < ab->per_seg)
      continue;
    if (arena_hand_over(eng, (uint16_t)b, a)) return true;
    ab->plan_segs = 1; /* no movable segment: worn out for this call */
  }
  return false;
}

int evict_make_room(engine_t *eng, const evict_need_t *nd) {
  pool_t *p = &eng->pool;
  uint16_t a = nd->arena;
  pool_arena_t *ar = &p->arenas[a];
  uint64_t need = need_now(eng, nd);
  if (need <= ar->nfree) return 0;
  /* No pressure while segments are free (or empty in another arena), or
   * another arena has a segment's worth of free pages to move into. */
  uint64_t room = arena_room(eng, a) * ar->per_seg;
  if (need <= ar->nfree + room) {
    for (uint32_t b = 0; b < p->narenas; b++) p->arenas[b].plan_segs = 0;
    while (need > ar->nfree &&
           (arena_take_free(eng, a, true) || give_free_room(eng, a, false)))
      continue;
    for (uint32_t b = 0; b < p->narenas; b++) p->arenas[b].plan_segs = 0;
    if (need <= ar->nfree) return 0;
    return engine_fail(eng, KVC_E_INTERNAL, "free room and its taking disagree");
  }
  /* Pressure: what the arena's own victims free (past those segments), then
   * segments of others; nothing changes before the plan says it fits. */
  bool own = nd->q && quota_bytes_over(eng, nd->q, (need - ar->nfree) * ar->stride);
  uint64_t missing, freed = evict_plan(eng, a, need - room, nd->q, nd, &missing);
  uint64_t segs = (missing + ar->per_seg - 1) / ar->per_seg, got = 0, got_own = 0;
  for (uint32_t b = 0; b < p->narenas; b++) p->arenas[b].plan_segs = 0;
  for (uint32_t b = 0; b < p->narenas && got < segs; b++) {
    if (!may_take_from(eng, a, (uint16_t)b, false)) continue;
    uint64_t k = can_give(eng, (uint16_t)b, segs - got, nd->q);
    got += k;
    if (p->arenas[b].tenant == ar->tenant) got_own += k;
  }
  if (own ? got_own < segs : got < segs) {
    if (own && got >= segs) /* room that exists but is others': the share refuses it */
      return quota_fail_pages(eng, nd->q, need - ar->nfree, freed + got_own * ar->per_seg,
                              ar->stride);
    eng->st.full_errors++;
    uint64_t freeable = ar->nfree + room + freed + got * ar->per_seg;
    char pb[UNITS_LEN];
    int rc = engine_fail(eng, KVC_E_FULL,
                         "pool full: need %llu pages of %s, %u free, %llu reclaimable",
                         (unsigned long long)need, units_bytes(ar->page_bytes, pb, sizeof pb),
                         ar->nfree, (unsigned long long)(freeable - ar->nfree));
    eng->err.needed = need;
    eng->err.freeable = freeable;
    return rc;
  }
  /* In LRU order over the node: the arena's own victim, or a segment of the
   * arena whose victim is older (tenants over their share first). */
  /* One victim at a time, so the node's LRU order holds across arenas: an
   * arena whose victim is the oldest evicts it, and gives a segment once it
   * has a segment's worth of free pages (arena.c moves what is left). */
  plan_t mine = {.arena = a, .by = nd->q};
  eng->reclaims_left = eng->plan_reclaims; /* what a reclaimed page says is still to come */
  enum { UNKNOWN = 0, WORN = 1, GIVES = 2 }; /* plan_segs, per other arena */
  for (uint32_t b = 0; b < p->narenas; b++) p->arenas[b].plan_segs = UNKNOWN;
  while (ar->nfree < need_now(eng, nd)) {
    if (arena_take_free(eng, a, true)) continue;
    if (give_free_room(eng, a, false)) continue; /* room without evicting: no share applies */
    uint16_t b = own ? POOL_NOARENA : oldest_source(eng, a, nd->q, own, true);
    if (b == POOL_NOARENA) b = oldest_source(eng, a, nd->q, own, false);
    if (b == a) {
      if (!evict_one(eng, &mine)) break;
      continue;
    }
    if (b == POOL_NOARENA) break;
    pool_arena_t *ab = &p->arenas[b];
    if (ab->plan_segs == UNKNOWN)
      ab->plan_segs = can_give(eng, b, 1, nd->q) ? GIVES : WORN;
    if (ab->plan_segs == WORN) continue;
    if (ab->nfree >= ab->per_seg) {
      if (!arena_hand_over(eng, b, a)) ab->plan_segs = WORN;
      continue;
    }
    plan_t theirs = {.arena = b, .by = nd->q};
    if (!evict_one(eng, &theirs)) ab->plan_segs = WORN;
  }
  for (uint32_t b = 0; b < p->narenas; b++) p->arenas[b].plan_segs = 0;
  eng->reclaims_left = 0;
  if (ar->nfree < need_now(eng, nd)) {
    return engine_fail(eng, KVC_E_INTERNAL, "eviction plan and eviction disagree");
  }
  return 0;
}
