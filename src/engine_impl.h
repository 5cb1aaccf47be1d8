/* engine_impl.h: the engine's internal structures, shared by its modules.
 *
 * engine.c holds the operations, seq.c sequences and their block tables,
 * evict.c the LRU and the planning of evictions, audit.c the invariants.
 *
 *   engine
 *    +- pool            pages + refcnt/pinref arrays        (pool.h)
 *    +- caches[id]      name, layout, geometry, seqs map    (u64 seq_id -> seq)
 *    +- lru             unpinned sequences of every cache, most recent first
 *    +- owners          map owner id -> pins of that owner
 *
 *   seq: start, len, extent, table[0..ntable) = pages of logical pages
 *        base .. base+ntable-1 (base = start / T after trim_front)
 */
#ifndef KVC_ENGINE_IMPL_H
#define KVC_ENGINE_IMPL_H

#include "engine.h"
#include "hmap.h"
#include "layout.h"
#include "mem.h"
#include "pool.h"

typedef struct seq seq_t;
typedef struct owner owner_t;
typedef struct lease lease_t; /* lease.c */

/* One pin: owner pins seq. Linked into both the owner's and the seq's list. */
typedef struct pin {
  seq_t *seq;
  owner_t *owner;
  struct pin *s_next, *s_prev; /* the sequence's pins */
  struct pin *o_next, *o_prev; /* the owner's pins */
} pin_t;

struct owner {
  uint64_t id;
  pin_t *pins; /* list head */
};

typedef struct cache {
  char name[KVC_MAX_NAME + 1];
  uint32_t id;
  kvc_layout_t layout; /* normalized */
  geom_t g;
  hmap_t seqs;         /* seq_id -> seq_t */
  cache_stats_t st;    /* counters; gauges kept current */
} cache_t;

struct seq {
  uint64_t id;
  cache_t *cache;
  uint64_t start;      /* first position held */
  uint64_t len;        /* tokens written for every layer */
  uint64_t extent;     /* largest written length of any layer */
  uint32_t *layer_len; /* per-layer written length, NULL: all equal len */
  uint32_t *table;     /* block table: pages of logical pages base.. */
  uint32_t base;       /* logical page of table[0] */
  uint32_t ntable;     /* entries used */
  uint32_t cap;        /* entries allocated */
  uint32_t npins;      /* owners pinning it */
  pin_t *pins;
  seq_t *lru_prev, *lru_next; /* in eng->lru while npins == 0 */
  uint64_t last_use_ms;
  uint64_t mark;       /* == eng->epoch: taking part in the current call */
};

struct engine {
  mem_t mem;
  pool_t pool;
  cache_t **caches;    /* by id; NULL once dropped */
  uint32_t ncaches;    /* ids handed out */
  uint32_t max_caches;
  uint64_t max_seqs;   /* 0: unlimited */
  uint64_t nseqs;
  uint64_t nseqs_pinned;
  uint64_t ntokens;
  uint64_t bytes_used; /* layout bytes of used pages */
  seq_t lru;           /* sentinel: lru.lru_next is the most recent */
  hmap_t owners;       /* owner id -> owner_t */
  uint64_t now_ms;
  uint64_t epoch;      /* bumped by every call that marks sequences */
  hmap_t leases;       /* lease id -> lease_t */
  lease_t *lease_list; /* every lease, newest first */
  uint64_t next_lease_id;
  engine_stats_t st;   /* counters (gauges are computed by engine_stats) */
  engine_err_t err;
};

/* Records why the call fails and returns code. */
int engine_fail(engine_t *eng, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
cache_t *engine_cache(engine_t *eng, uint32_t cache_id);

/* seq.c */
static inline uint64_t seq_pages_for(const seq_t *s, uint64_t extent) {
  uint64_t T = s->cache->g.T, lo = (uint64_t)s->base * T;
  return extent > lo ? ((extent + T - 1) >> s->cache->g.tshift) - s->base : 0;
}
static inline uint32_t seq_layer_len(const seq_t *s, uint32_t l) {
  return s->layer_len ? s->layer_len[l] : (uint32_t)s->len;
}
seq_t *seq_new(engine_t *eng, cache_t *c, uint64_t id);
void seq_free(engine_t *eng, seq_t *s);
/* Makes the table hold at least n entries; 0 or KVC_E_NOMEM (no change). */
int seq_reserve(engine_t *eng, seq_t *s, uint64_t n);
/* Counts a new sequence (already in its cache's map) and puts it on the LRU. */
void seq_attach(engine_t *eng, seq_t *s);
/* Unlinks and frees a sequence: pages unreferenced, pins released. */
void seq_drop(engine_t *eng, seq_t *s);
/* Adds / removes a page reference of s, keeping pins and gauges right. */
void seq_page_add(engine_t *eng, seq_t *s, uint32_t page);
void seq_page_release(engine_t *eng, seq_t *s, uint32_t page);
/* Sets per-layer lengths for layers [l0, l1) to at least end; layer_len must
 * already exist when the range is not every layer or lengths differ. */
void seq_set_lengths(engine_t *eng, seq_t *s, uint32_t l0, uint32_t l1, uint64_t end);
/* Shortens every layer to at most n tokens and frees pages past it. */
void seq_truncate(engine_t *eng, seq_t *s, uint64_t n);
void seq_info_fill(const engine_t *eng, const seq_t *s, kvc_seq_info_t *out);

/* lease.c */
/* An internal lease (owner 0) on n pages (listed in any order, repeats
 * allowed), for a copy that runs outside the engine's thread. NULL: out of
 * memory (nothing changed). */
lease_t *lease_pages(engine_t *eng, const uint32_t *pages, uint32_t n, uint64_t layout_bytes);
/* Releases a lease (pages no one else holds are freed). */
void lease_drop(engine_t *eng, lease_t *l);
/* Frees every lease without touching page counts (the engine is going away). */
void lease_free_all(engine_t *eng);
/* Adds every lease's page references into refs; checks the lease counters.
 * 0 or KVC_E_INTERNAL with the reason in why. */
int lease_audit(const engine_t *eng, uint32_t *refs, char *why, size_t len);

/* evict.c */
void lru_insert(engine_t *eng, seq_t *s);
void lru_remove(seq_t *s);
/* Moves s to the most recent end (unless pinned) and stamps last_use. */
void lru_touch(engine_t *eng, seq_t *s);
/* Eviction planning marks in pool.sim: pages written by the current call
 * while shared (they need a copy unless their other holders are evicted). */
#define SIM_COW 0x80000000u
#define SIM_SEEN 0x40000000u
#define SIM_MASK 0x3fffffffu
/* Notes a write of page by the current call; returns 1 if it needs a copy. */
uint64_t evict_note_write(engine_t *eng, uint32_t page);
/* After all notes: returns 1 (once per page) if every holder of page writes
 * it, so one of them may write in place. */
uint64_t evict_settle_writes(engine_t *eng, uint32_t page);
/* Ensures `need` free pages by evicting unpinned, unmarked sequences in LRU
 * order, all or nothing: KVC_E_FULL (with figures) changes nothing. */
int evict_make_room(engine_t *eng, uint64_t need);

#endif
