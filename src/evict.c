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
 */
#include <stddef.h>

#include "evict.h"
#include "lru.h"
#include "page.h"
#include "prefix.h"
#include "quota.h"
#include "seq.h"

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
  uint64_t need;    /* pages still needed from eviction, shrinking as copies lapse */
  uint64_t freed;   /* pages the plan frees */
  uint64_t reclaims; /* of them, cached pages it reclaims */
  uint32_t *stack;  /* cached pages to reclaim next (deepest on top) */
  uint32_t top;
  uint32_t *touched; /* ipages whose plan fields were set */
  uint32_t ntouched;
  uint32_t last_prio; /* the walk's last node, to clear what it marked */
  lru_node_t *last;
  quota_t *only;     /* the first walk: this tenant's victims alone */
  const quota_t *by; /* whose call it is: others' floors apply (min_pages) */
  bool over_only;    /* the first walk: victims of tenants over their share */
  bool two_walks;    /* clear every list up to last_prio, not to last */
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
  return eng->pool.nfree + pl->freed >= pl->need;
}

/* Whether taking the victim at n (its table's pages, or one cached page)
 * could take its tenant below its floor, counting what the plan frees of
 * that tenant already (planning) or what it holds now (evicting: nothing
 * planned). A tenant's own call is not held by its own floor. */
static bool under_floor(const engine_t *eng, const plan_t *pl, const lru_node_t *n,
                        const quota_t *q) {
  if (q == pl->by) return false;
  uint64_t floor = quota_lim(eng, q)->min_pages;
  if (!floor) return false;
  uint64_t victim = n->kind == LRU_SEQ ? SEQ_OF(n)->npages : 1;
  return q->use.pages < floor + q->plan_freed + victim;
}

/* Whether the walk takes the victim at node n. */
static bool walk_takes(const engine_t *eng, const plan_t *pl, const lru_node_t *n) {
  const cache_t *c = n->kind == LRU_SEQ ? SEQ_OF(n)->cache : IPAGE_OF(n)->cache;
  if (under_floor(eng, pl, n, c->q)) return false;
  if (pl->over_only) return c->q->over;
  return !pl->only || c->q == pl->only;
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
      if (held == p->refcnt[page] - writers_of(nd, page)) pl->need--; /* copy lapses */
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
      if (!pl->two_walks || prio > pl->last_prio) pl->last_prio = prio;
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
      if (n == pl->last && !pl->two_walks) break; /* two walks: each list whole */
    }
  }
  for (uint32_t i = 0; i < pl->ntouched; i++) {
    ipage_t *ip = page_meta(eng, pl->touched[i]);
    ip->planned = ip->stacked = false;
    ip->plan_gone = 0;
  }
}

/* ---- evicting ---------------------------------------------------------------- */

/* Reclaims the least recent victim the filter takes (only, over_only);
 * false if there is none. */
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

static void plan_freed_reset(engine_t *eng) {
  for (uint32_t i = 0; i < eng->nquotas; i++) eng->quotas[i]->plan_freed = 0;
}

/* Marks the tenants holding more than their page share; true if any. */
static bool mark_over(engine_t *eng) {
  bool any = false;
  for (uint32_t i = 0; i < eng->nquotas; i++) {
    quota_t *q = eng->quotas[i];
    uint64_t max = quota_lim(eng, q)->max_pages;
    q->over = max && q->use.pages > max;
    any |= q->over;
  }
  return any;
}

int evict_make_room(engine_t *eng, const evict_need_t *nd) {
  pool_t *p = &eng->pool;
  uint64_t need = need_now(eng, nd);
  if (need <= p->nfree) return 0; /* no pressure: shares do not apply */
  bool over = nd->q && quota_pages_over(eng, nd->q, need);
  /* The stack is used only for pages with token metadata. */
  plan_t pl = {.need = need, .stack = eng->scratch,
               .touched = eng->scratch ? eng->scratch + p->npages : NULL, .by = nd->q};
  plan_freed_reset(eng);
  /* First walk: a tenant past its share makes room from its own victims
   * alone (if they are not enough, QUOTA_PAGES when others' would be, FULL
   * when the pool has no room at all); one within its share takes from
   * tenants over theirs first. */
  bool first = over || mark_over(eng);
  pl.only = over ? nd->q : NULL;
  pl.over_only = first && !over;
  if (first) {
    plan_walk(eng, &pl, nd);
    pl.only = NULL;
    pl.over_only = false;
    pl.two_walks = true;
  }
  bool mine = !over || plan_done(eng, &pl);
  uint64_t own_freed = pl.freed;
  plan_walk(eng, &pl, nd); /* past its share and its own not enough: could others? */
  bool enough = plan_done(eng, &pl);
  plan_clear(eng, &pl);
  /* Room that exists but is others': the share refuses it. */
  if (enough && !mine) return quota_fail_pages(eng, nd->q, pl.need, p->nfree + own_freed);
  if (!enough) {
    eng->st.full_errors++;
    int rc = engine_fail(eng, KVC_E_FULL,
                         "pool full: need %llu pages, %u free, %llu reclaimable",
                         (unsigned long long)pl.need, p->nfree,
                         (unsigned long long)pl.freed);
    eng->err.needed = pl.need;
    eng->err.freeable = p->nfree + pl.freed;
    return rc;
  }
  plan_freed_reset(eng); /* evicting counts what tenants hold now */
  eng->reclaims_left = pl.reclaims; /* what a spill is told is still to come */
  plan_t own = {.only = nd->q, .by = nd->q}, over_share = {.over_only = true, .by = nd->q},
         any = {.by = nd->q};
  if (first) {
    while (p->nfree < need_now(eng, nd) && evict_one(eng, over ? &own : &over_share)) continue;
  }
  while (p->nfree < need_now(eng, nd))
    if (!evict_one(eng, &any)) {
      eng->reclaims_left = 0;
      return engine_fail(eng, KVC_E_INTERNAL, "eviction plan and eviction disagree");
    }
  eng->reclaims_left = 0;
  return 0;
}
