/* room.c: the pages a write needs, made available all or nothing: new
 * pages, copies on write of shared ones (with their token metadata), and the
 * evictions that make room for them (evict.c plans those). */
#include "room.h"

#include <string.h>

#include "evict.h"
#include "page.h"
#include "quota.h"
#include "seq.h"

/* Calls fn(eng, page, arg) for every page of s's table that slots
 * [pos, end) of the span fall in; returns how many new pages they need: past
 * the table, or at an entry with no page (all holes until now). */
uint64_t room_pages(engine_t *eng, const span_t *sp, void (*fn)(engine_t *, uint32_t, void *),
                    void *arg) {
  if (sp->end <= sp->pos) return 0;
  const seq_t *s = sp->s;
  uint32_t sh = s->cache->g.tshift;
  uint64_t fresh = 0;
  for (uint64_t idx = sp->pos >> sh; idx <= (sp->end - 1) >> sh; idx++) {
    uint64_t rel = idx - s->base;
    uint32_t page = rel < s->ntable ? s->table[rel] : POOL_NOPAGE;
    if (page != POOL_NOPAGE) fn(eng, page, arg);
    else if (!sp->held_only) fresh++;
  }
  return fresh;
}

/* Notes a shared page the call writes (one more writer). */
static void note_write(engine_t *eng, uint32_t page, void *arg) {
  evict_need_t *nd = arg;
  if (eng->pool.refcnt[page] < 2) return;
  if (eng->pool.plan[page] & PLAN_COW) {
    for (size_t i = 0; i < nd->nnoted; i++)
      if (nd->noted[i].page == page) nd->noted[i].writers++;
    return;
  }
  eng->pool.plan[page] = PLAN_COW;
  nd->noted[nd->nnoted].page = page;
  nd->noted[nd->nnoted++].writers = 1;
}

static void count_cow_meta(engine_t *eng, uint32_t page, void *arg) {
  if (page_meta(eng, page) && eng->pool.refcnt[page] > 1) (*(uint64_t *)arg)++;
}

static void clear_note(engine_t *eng, uint32_t page, void *arg) {
  (void)arg;
  eng->pool.plan[page] = 0;
}

/* The page for logical page idx of s, allocated or copied so s owns it. A
 * page allocated for an entry that had none holds stale bytes in its other
 * slots: those are holes (or past the length), which nothing reads. */
uint32_t room_page_for_write(engine_t *eng, seq_t *s, uint64_t idx) {
  pool_t *p = &eng->pool;
  uint64_t rel = idx - s->base;
  const geom_t *g = &s->cache->g;
  /* Past the table: the pages in between hold only holes (a gap). */
  while (s->ntable <= rel) s->table[s->ntable++] = POOL_NOPAGE;
  uint32_t page = s->table[rel];
  if (page == POOL_NOPAGE) {
    page = page_alloc(eng, s->cache);
    s->table[rel] = page;
    seq_page_add(eng, s, page);
    return page;
  }
  if (p->refcnt[page] == 1) return page;
  uint32_t copy = page_alloc(eng, s->cache); /* copy on write: the other holders keep page */
  memcpy(pool_page(p, copy), pool_page(p, page), g->page_bytes);
  page_meta_copied(eng, page, copy);
  seq_page_release(eng, s, page);
  s->table[rel] = copy;
  seq_page_add(eng, s, copy);
  eng->st.cow_copies++;
  s->cache->st.cow_copies++;
  return copy;
}

void room_table_to(seq_t *s, uint64_t end) {
  uint32_t sh = s->cache->g.tshift;
  if (end == 0 || ((end - 1) >> sh) < s->base) return;
  uint64_t rel = ((end - 1) >> sh) - s->base;
  while (s->ntable <= rel) s->table[s->ntable++] = POOL_NOPAGE;
}

void room_writable(engine_t *eng, seq_t *s, uint64_t pos, uint64_t end) {
  uint32_t sh = s->cache->g.tshift;
  if (pos >= end) return;
  for (uint64_t idx = pos >> sh; idx <= (end - 1) >> sh; idx++) (void)room_page_for_write(eng, s, idx);
}

void room_writable_held(engine_t *eng, seq_t *s, uint64_t pos, uint64_t end) {
  uint32_t sh = s->cache->g.tshift;
  if (pos >= end) return;
  for (uint64_t idx = pos >> sh; idx <= (end - 1) >> sh; idx++) {
    uint64_t rel = idx - s->base;
    if (rel < s->ntable && s->table[rel] != POOL_NOPAGE) (void)room_page_for_write(eng, s, idx);
  }
}

static void count_shared(engine_t *eng, uint32_t page, void *arg) {
  if (eng->pool.refcnt[page] > 1) (*(uint64_t *)arg)++;
}

/* Pages a write adds to pinned sequences (new ones and copies on write; a
 * copy of a page pinned by another stays pinned too, so this may count a
 * page more than needed, never fewer): checked against the pool's pin limit
 * and the tenant's quota, as pinning does. */
static int pinned_growth(engine_t *eng, const span_t *sp, size_t n) {
  uint64_t more = 0;
  for (size_t i = 0; i < n; i++)
    if (sp[i].s->npins) more += room_pages(eng, &sp[i], count_shared, &more);
  /* At a pin limit of the whole pool a pinned write that cannot fit is FULL. */
  const cache_t *c = sp[0].s->cache;
  bool pool = eng->pin_limit < (uint64_t)eng->pool.nseg * eng->pool.seg_bytes;
  return more ? quota_check_pins(eng, c->q, more, pool_arena(&eng->pool, c->arena)->stride, pool)
              : 0;
}

int room_make(engine_t *eng, const span_t *sp, size_t n) {
  if (n == 0) return 0;
  int rc = pinned_growth(eng, sp, n);
  if (rc) return rc;
  uint64_t written = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t sh = sp[i].s->cache->g.tshift;
    if (sp[i].end > sp[i].pos) written += 1 + ((sp[i].end - 1) >> sh) - (sp[i].pos >> sh);
  }
  evict_note_t local[64];
  evict_need_t nd = {0, local, 0, sp[0].s->cache->q, sp[0].s->cache->arena};
  if (written > 64 && !(nd.noted = mem_alloc(&eng->mem, written * sizeof *nd.noted)))
    return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  /* A page copied on write takes its token metadata along: reserve the
   * blocks now (room_writable consumes them; room_done frees what is left). */
  uint64_t meta = 0;
  for (size_t i = 0; i < n; i++) room_pages(eng, &sp[i], count_cow_meta, &meta);
  if (meta && page_meta_reserve(eng, sp[0].s->cache->g.T, meta)) {
    if (nd.noted != local) mem_free(&eng->mem, nd.noted);
    return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  }
  for (size_t i = 0; i < n; i++) nd.new_pages += room_pages(eng, &sp[i], note_write, &nd);
  rc = evict_make_room(eng, &nd);
  for (size_t i = 0; i < n; i++) room_pages(eng, &sp[i], clear_note, NULL);
  if (nd.noted != local) mem_free(&eng->mem, nd.noted);
  if (rc) page_meta_unreserve(eng);
  return rc;
}

void room_done(engine_t *eng) { page_meta_unreserve(eng); }
