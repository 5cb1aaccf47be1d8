/* pin.c: pins (hard, and soft with a TTL), the pin limit and retention
 * priorities: what keeps a sequence out of eviction's reach.
 *
 *   seq s  --pins-->  pin(owner A) <-> pin(owner B)      s_next / s_prev
 *   owner A --pins--> pin(seq s) <-> pin(seq t)          o_next / o_prev
 *   eng->soft:        the pins with a TTL                t_next / t_prev
 *
 * A sequence with any pin is off the LRU and its pages count as pinned.
 */
#include "pin.h"

#include "lru.h"
#include "page.h"
#include "quota.h"

/* The owner's pin of s, or NULL. */
pin_t *pin_find(const seq_t *s, uint64_t owner) {
  for (pin_t *p = s->pins; p; p = p->s_next)
    if (p->owner->id == owner) return p;
  return NULL;
}

void pin_unlink(engine_t *eng, pin_t *p) {
  seq_t *s = p->seq;
  owner_t *o = p->owner;
  pin_soft_unlink(eng, p);
  if (p->s_prev) p->s_prev->s_next = p->s_next;
  else s->pins = p->s_next;
  if (p->s_next) p->s_next->s_prev = p->s_prev;
  if (p->o_prev) p->o_prev->o_next = p->o_next;
  else o->pins = p->o_next;
  if (p->o_next) p->o_next->o_prev = p->o_prev;
  mem_free(&eng->mem, p);
  if (!o->pins) {
    hmap_remove(&eng->owners, o->id);
    mem_free(&eng->mem, o);
  }
  eng->st.unpins++;
}

void pin_release(engine_t *eng, pin_t *p) {
  seq_t *s = p->seq;
  pin_unlink(eng, p);
  if (--s->npins == 0) {
    for (uint32_t i = 0; i < s->ntable; i++)
      if (s->table[i] != POOL_NOPAGE) page_unpin(eng, s->table[i]);
    eng->nseqs_pinned--;
    lru_insert(eng, s); /* unpinned: the most recently used */
  }
  s->last_use_ms = eng->now_ms;
}

/* Pages of s not yet pinned by anyone: what pinning s adds to the pool's
 * (an entry with no page adds none). */
static uint64_t unpinned_pages(const engine_t *eng, const uint32_t *pages, uint64_t n) {
  uint64_t k = 0;
  for (uint64_t i = 0; i < n; i++) k += pages[i] != POOL_NOPAGE && eng->pool.pinref[pages[i]] == 0;
  return k;
}

int pin_prepare(engine_t *eng, uint64_t owner, pin_prep_t *pp) {
  pp->o = hmap_get(&eng->owners, owner);
  pp->map_cap = eng->owners.cap;
  pp->new_owner = !pp->o;
  pp->p = mem_calloc(&eng->mem, 1, sizeof *pp->p);
  if (pp->p && pp->new_owner && hmap_reserve(&eng->owners, &eng->mem, 1) == 0)
    pp->o = mem_calloc(&eng->mem, 1, sizeof *pp->o);
  if (!pp->p || !pp->o) {
    /* Nothing stays prepared: a caller's failure path frees only pp->p. */
    mem_free(&eng->mem, pp->p);
    pp->p = NULL;
    pp->o = NULL;
    (void)hmap_resize(&eng->owners, &eng->mem, pp->map_cap);
    return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  }
  if (pp->new_owner) pp->o->id = owner;
  return 0;
}

/* now + ttl, saturating: a TTL too long to add never lapses. */
static uint64_t deadline(const engine_t *eng, uint64_t ttl_ms) {
  uint64_t d;
  return __builtin_add_overflow(eng->now_ms, ttl_ms, &d) ? UINT64_MAX : d;
}

void pin_commit(engine_t *eng, seq_t *s, pin_prep_t *pp, uint64_t ttl_ms) {
  pin_t *p = pp->p;
  owner_t *o = pp->o;
  if (pp->new_owner) hmap_insert(&eng->owners, o->id, o);
  p->seq = s;
  p->owner = o;
  p->s_next = s->pins;
  if (s->pins) s->pins->s_prev = p;
  s->pins = p;
  p->o_next = o->pins;
  if (o->pins) o->pins->o_prev = p;
  o->pins = p;
  if (ttl_ms) {
    p->ttl_ms = ttl_ms;
    p->deadline_ms = deadline(eng, ttl_ms);
    p->t_next = eng->soft;
    if (eng->soft) eng->soft->t_prev = p;
    eng->soft = p;
  }
  if (s->npins++ == 0) {
    lru_remove(s);
    eng->nseqs_pinned++;
    for (uint32_t i = 0; i < s->ntable; i++)
      if (s->table[i] != POOL_NOPAGE) page_pin(eng, s->table[i]);
  }
  s->last_use_ms = eng->now_ms;
  eng->st.pins++;
}

int pin_limit_check(engine_t *eng, const cache_t *c, const uint32_t *pages, uint64_t n) {
  return quota_check_pins(eng, c->q, unpinned_pages(eng, pages, n),
                          pool_arena(&eng->pool, c->arena)->stride, true);
}

int engine_pin_ttl(engine_t *eng, uint32_t cache_id, uint64_t seq_id, uint64_t owner,
                   uint64_t ttl_ms) {
  if (!eng) return KVC_E_INVAL;
  seq_t *s;
  int rc = engine_find_seq(eng, cache_id, seq_id, &s);
  if (rc) return rc;
  pin_t *have = pin_find(s, owner);
  if (have) { /* pinning again sets the kind: ttl 0 makes it hard */
    if (have->ttl_ms && !ttl_ms) pin_soft_unlink(eng, have);
    if (ttl_ms) {
      if (!have->ttl_ms) {
        have->t_next = eng->soft;
        if (eng->soft) eng->soft->t_prev = have;
        eng->soft = have;
      }
      have->deadline_ms = deadline(eng, ttl_ms);
    }
    have->ttl_ms = ttl_ms;
    return 0;
  }
  if ((rc = pin_limit_check(eng, s->cache, s->table, s->ntable))) return rc;
  pin_prep_t pp;
  if ((rc = pin_prepare(eng, owner, &pp))) return rc;
  pin_commit(eng, s, &pp, ttl_ms);
  return 0;
}

int engine_pin(engine_t *eng, uint32_t cache_id, uint64_t seq_id, uint64_t owner) {
  return engine_pin_ttl(eng, cache_id, seq_id, owner, 0);
}

void pin_soft_unlink(engine_t *eng, pin_t *p) {
  if (!p->ttl_ms) return;
  if (p->t_prev) p->t_prev->t_next = p->t_next;
  else eng->soft = p->t_next;
  if (p->t_next) p->t_next->t_prev = p->t_prev;
  p->t_next = p->t_prev = NULL;
  p->ttl_ms = 0;
}

size_t engine_expire(engine_t *eng) {
  if (!eng) return 0;
  size_t n = 0;
  for (pin_t *p = eng->soft, *next; p; p = next) {
    next = p->t_next;
    if (p->deadline_ms > eng->now_ms) continue;
    pin_release(eng, p);
    eng->st.pins_lapsed++;
    n++;
  }
  return n;
}

int engine_set_priority(engine_t *eng, uint32_t cache_id, uint64_t seq_id, uint32_t prio) {
  if (!eng) return KVC_E_INVAL;
  seq_t *s;
  int rc = engine_find_seq(eng, cache_id, seq_id, &s);
  if (rc) return rc;
  if (prio >= PRIO_LEVELS)
    return engine_fail(eng, KVC_E_INVAL, "priority %u outside 0..100", prio);
  if (s->npins == 0) lru_remove(s);
  s->node.prio = (uint8_t)prio;
  if (s->npins == 0) lru_insert(eng, s);
  return 0;
}

int engine_unpin(engine_t *eng, uint32_t cache_id, uint64_t seq_id, uint64_t owner) {
  if (!eng) return KVC_E_INVAL;
  seq_t *s;
  int rc = engine_find_seq(eng, cache_id, seq_id, &s);
  if (rc) return rc;
  pin_t *p = pin_find(s, owner);
  if (!p)
    return engine_fail(eng, KVC_E_NOTPINNED, "sequence %llu is not pinned by owner %llu",
                       (unsigned long long)seq_id, (unsigned long long)owner);
  pin_release(eng, p);
  return 0;
}

size_t engine_owner_pins(const engine_t *eng, uint64_t owner) {
  if (!eng) return 0;
  const owner_t *o = hmap_get(&eng->owners, owner);
  size_t n = 0;
  for (const pin_t *p = o ? o->pins : NULL; p; p = p->o_next) n++;
  return n;
}

size_t engine_unpin_all(engine_t *eng, uint64_t owner) {
  if (!eng) return 0;
  owner_t *o = hmap_get(&eng->owners, owner);
  size_t n = 0;
  while (o) { /* pin_release frees the owner with its last pin */
    bool last = o->pins->o_next == NULL;
    pin_release(eng, o->pins);
    n++;
    if (last) break;
  }
  return n;
}
