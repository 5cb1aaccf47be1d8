/* engine_impl.h: the engine's internal structures, shared by its modules.
 *
 * engine.c holds the operations, seq.c sequences and their block tables,
 * evict.c the LRU and the planning of evictions, audit.c the invariants.
 *
 *   engine
 *    +- pool            pages + refcnt/pinref arrays        (pool.h)
 *    +- caches[id]      name, layout, geometry, seqs map    (u64 seq_id -> seq)
 *    +- lru[prio]       unpinned sequences and cached pages, most recent first,
 *                       one list per retention priority (evict.c)
 *    +- ip[page]        token ids and content hash of pages that have them
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
/* Slots [b, e) of a sequence that hold no token (doc/attention.md, gaps). */
typedef struct hole {
  uint64_t b, e;
} hole_t;
typedef struct owner owner_t;
typedef struct cache cache_t;

#define PRIO_LEVELS 101u /* retention priorities 0..100; lower goes first */
#define PRIO_DEFAULT 35u

enum lru_kind { LRU_SENTINEL = 0, LRU_SEQ = 1, LRU_PAGE = 2 };

/* A link of an LRU list: embedded in a sequence or in a cached page. */
typedef struct lru_node {
  struct lru_node *prev, *next; /* NULL while not on a list */
  uint8_t kind;                 /* enum lru_kind */
  uint8_t prio;                 /* the list it is (or goes) on */
} lru_node_t;

/* What the engine knows of a page's tokens (prefix.c). A page gets one when
 * a put carries token ids; once full, with its chain hashed up to it, it is
 * hashed and indexed; the index then holds a reference of its own, so an
 * indexed page never changes (a write copies it) and outlives its sequences
 * as a "cached" page on the LRU. */
typedef struct ipage {
  lru_node_t node;      /* first member; on an LRU while cached */
  cache_t *cache;
  uint32_t page;
  uint32_t parent;      /* previous page of the chain; POOL_NOPAGE for a head */
  uint32_t key;         /* interned (salt, extra) of the chain it was hashed in */
  uint32_t nchildren;   /* indexed pages whose parent this is */
  uint32_t plan_gone;   /* eviction planning: children the plan reclaims */
  uint64_t hits;        /* matches that reached this page */
  bool hashed;          /* hash is the page's chain hash, as its writer held it */
  bool indexed;         /* in cache->index, holding a page reference */
  bool planned;         /* eviction planning: the plan reclaims it */
  bool stacked;         /* eviction planning: on the plan's stack */
  uint8_t hash[32];
  uint32_t tokens[];    /* page_tokens ids */
} ipage_t;

typedef struct lease lease_t; /* lease.c */

/* One pin: owner pins seq. Linked into both the owner's and the seq's list. */
typedef struct pin {
  seq_t *seq;
  owner_t *owner;
  struct pin *s_next, *s_prev; /* the sequence's pins */
  struct pin *o_next, *o_prev; /* the owner's pins */
  uint64_t ttl_ms;             /* soft pin: lapses ttl_ms after the last use; 0: hard */
  uint64_t deadline_ms;        /* soft pin: when it lapses */
  struct pin *t_next, *t_prev; /* soft pins: eng->soft list */
} pin_t;

struct owner {
  uint64_t id;
  pin_t *pins; /* list head */
};

struct cache {
  char name[KVC_MAX_NAME + 1];
  uint32_t id;
  kvc_layout_t layout; /* normalized */
  geom_t g;
  hmap_t seqs;         /* seq_id -> seq_t */
  hmap_t index;        /* first 8 bytes of a page hash -> indexed ipage_t */
  uint8_t seed[32];    /* hash chain seed: the cache's name and layout */
  cache_stats_t st;    /* counters; gauges kept current */
};

struct seq {
  lru_node_t node;     /* first member; on eng->lru while npins == 0 */
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
  uint32_t npins;      /* owners pinning it (hard and soft) */
  pin_t *pins;
  uint64_t last_use_ms;
  uint64_t mark;       /* == eng->epoch: taking part in the current call */
  uint64_t rsv_end;    /* slots reserved up to here (table covers them), or 0 */
  hole_t *holes;       /* sorted, disjoint slots in [start, extent) never written */
  uint32_t nholes, hcap;
  uint32_t slot;       /* per-call scratch: index of its record in the call */
  /* The prefix chain (doc/prefix.md): tokens [0, chain_tok) have known ids
   * and were written in order, each under the ids before it, with key
   * chain_key; the first chain_pages pages of them are hashed. Any write
   * before chain_tok cuts it there (prefix_chain_cut). */
  uint64_t chain_tok;
  uint32_t chain_pages;
  uint32_t chain_key;
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
  lru_node_t lru[PRIO_LEVELS]; /* sentinels: lru[p].next is the most recent */
  ipage_t **ip;        /* per page: token metadata or NULL */
  uint32_t *scratch;   /* per page: eviction planning stack */
  hmap_t keys;         /* digest of (salt, extra) -> key_t */
  uint32_t nkeys;
  uint32_t hash_bits;  /* test hook: keep only this many hash bits (0: all) */
  uint32_t pin_limit;  /* pages that may be pinned */
  bool evicting;       /* pages a dropped sequence leaves cached go to the tail */
  pin_t *soft;         /* soft (TTL) pins */
  uint32_t idx_pairs;  /* indexed pages held by exactly one sequence */
  void *reserve;       /* ipage blocks reserved for the current call */
  void *md_ctx;        /* EVP_MD_CTX for SHA-256 */
  kvc_hash_t hash_kind;
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
/* Last slot the table must cover: the extent or the end of a reservation. */
static inline uint64_t seq_table_end(const seq_t *s) {
  return s->rsv_end > s->extent ? s->rsv_end : s->extent;
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
/* Drops positions before n (n <= len): start moves, whole pages go. */
void seq_trim(engine_t *eng, seq_t *s, uint64_t n);
/* holes.c: the hole set of a sequence. reserve makes room for k more ranges
 * (0 or KVC_E_NOMEM); add and cut then never allocate as long as the room
 * reserved covers them (a cut inside one range splits it: one more). */
int holes_reserve(engine_t *eng, seq_t *s, uint32_t k);
void holes_add(seq_t *s, uint64_t b, uint64_t e);
void holes_cut(seq_t *s, uint64_t b, uint64_t e);
bool holes_has(const seq_t *s, uint64_t pos);
/* Slots [b, e) move by delta: the target range's holes are replaced by the
 * moved ones (tmp: room for nholes ranges; reserve nholes + 2 first). */
void holes_move(seq_t *s, uint64_t b, uint64_t e, int64_t delta, hole_t *tmp);
/* shift.c: removes a middle range [b, e) (e < extent), moving later tokens
 * down with their keys re-rotated; all or nothing. */
int shift_remove(engine_t *eng, seq_t *s, uint64_t b, uint64_t e);
/* attn.c: frees what no future token of s can attend to, given that the
 * lowest position still to be computed is h (window, chunked). */
void attn_trim(engine_t *eng, seq_t *s, uint64_t h);
/* Whether a token at p may attend to position q of its own sequence. */
bool attn_allows(const cache_t *c, uint64_t p, uint64_t q);
/* seqops.c: frees a pin record out of its sequence's and owner's lists (and
 * the owner with its last pin); the sequence's pin count is the caller's. */
void pin_unlink(engine_t *eng, pin_t *p);
/* seqops.c: takes a pin off the soft-pin list if it is on it. */
void pin_soft_unlink(engine_t *eng, pin_t *p);
/* seqops.c: makes dst (created or replaced) exactly pages[0..m) from
 * position 0, holding their chain under key_id, and pins it for owner (0: no
 * pin); all or nothing. */
int seq_attach_pages(engine_t *eng, cache_t *c, uint64_t dst_id, const uint32_t *pages,
                     uint64_t m, uint64_t owner, uint32_t key_id);

/* ops.c: makes the pages of slots [pos, end) of s writable (allocated or
 * copied on write) after ops_room planned them. */
typedef struct span {
  seq_t *s;
  uint64_t pos, end;
} span_t;
/* A transfer's ranges after defaults and checks. */
typedef layout_xfer_t xr_t; /* the transfer geometry (layout.h) */
int ops_resolve(engine_t *eng, const cache_t *c, const engine_xfer_t *x, bool is_put, xr_t *r);
/* Buffer bytes of ntokens: K, V, each scale buffer (raw int8); OVERFLOW. */
int ops_sizes(const cache_t *c, const xr_t *r, uint64_t ntokens, uint64_t *kb, uint64_t *vb,
              uint64_t *sb);
/* The smallest written length over layers [l0, l1). */
uint64_t ops_range_len(const seq_t *s, uint32_t l0, uint32_t l1);
/* Plans and evicts for spans of one cache (FULL, NOMEM: nothing changed);
 * then ops_writable on each span, then ops_done. */
int ops_room(engine_t *eng, const span_t *sp, size_t n);
void ops_writable(engine_t *eng, seq_t *s, uint64_t pos, uint64_t end);
void ops_done(engine_t *eng);

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
void lru_link(engine_t *eng, lru_node_t *n, bool at_tail);
void lru_unlink(lru_node_t *n);
void lru_insert(engine_t *eng, seq_t *s);
void lru_remove(seq_t *s);
/* Moves s to the most recent end (unless pinned), stamps last_use and
 * refreshes a soft pin. */
void lru_touch(engine_t *eng, seq_t *s);

/* The pages a call needs: new pages, and the shared pages it writes. A shared
 * page needs a copy per writer, or one fewer if its writers are its only
 * holders (eviction of the other holders can make it so). Noted pages carry
 * SIM_COW in pool.sim while the call plans. */
#define SIM_COW 0x80000000u
#define SIM_MASK 0x7fffffffu
typedef struct evict_note {
  uint32_t page;
  uint32_t writers;
} evict_note_t;
typedef struct evict_need {
  uint64_t new_pages;
  evict_note_t *noted;
  size_t nnoted;
} evict_need_t;
/* Frees pages by evicting unpinned, unmarked sequences and cached pages in
 * order, all or nothing: KVC_E_FULL (with figures) changes nothing. */
int evict_make_room(engine_t *eng, const evict_need_t *need);

/* prefix.c */
/* The token metadata of page, or NULL (also before any put carried ids: the
 * per-page arrays of the prefix index are allocated on first use). */
static inline ipage_t *ip_at(const engine_t *eng, uint32_t page) {
  return eng->ip ? eng->ip[page] : NULL;
}
/* Allocates the prefix index's per-page arrays if not yet; 0 or NOMEM. */
int prefix_arrays(engine_t *eng);
/* Frees them again: only for the put that allocated them and then failed
 * (no page is indexed, the scratch holds nothing). */
void prefix_arrays_drop(engine_t *eng);
/* The engine's part of page references: cached-state transitions of indexed
 * pages and the release of token metadata with the page. */
void page_ref(engine_t *eng, uint32_t page);
void page_unref(engine_t *eng, const cache_t *c, uint32_t page, uint8_t prio);
/* page_unref for a holder that knows only the layout's page bytes (a lease,
 * whose cache may be gone). */
void page_unref_bytes(engine_t *eng, uint64_t layout_bytes, uint32_t page, uint8_t prio);
/* Drops a cached page from the index and frees it. */
void prefix_reclaim(engine_t *eng, ipage_t *ip);
/* Drops every index entry of a cache (its sequences are gone already). */
void prefix_cache_clear(engine_t *eng, cache_t *c);
int prefix_cache_init(engine_t *eng, cache_t *c);
/* Gives the copy made on write the token metadata of the original. */
void prefix_page_copied(engine_t *eng, uint32_t from, uint32_t to);
/* Records token ids of a put into s's pages (allocated by prefix_reserve)
 * and hashes and indexes pages that became full. */
void prefix_put_tokens(engine_t *eng, seq_t *s, const engine_io_t *e,
                       const engine_pkey_t *key, uint32_t key_id);
/* Positions [pos, end) of s were rewritten without ids (or moved, or
 * punched): the chain ends at pos and those pages' hashes are stale. */
void prefix_put_untokened(engine_t *eng, seq_t *s, uint64_t pos, uint64_t end);
/* Whatever s holds from pos on no longer follows its chain: cut it there. */
void prefix_chain_cut(seq_t *s, uint64_t pos);
/* Checks the chain hashes of every indexed page and of every sequence's
 * chain against their token ids and keys; 0 or KVC_E_INTERNAL / NOMEM. */
int prefix_audit(engine_t *eng, char *why, size_t len);
/* Preallocates the ipages a put will need (before anything changes). */
int prefix_reserve(engine_t *eng, uint32_t page_tokens, uint64_t n);
void prefix_unreserve(engine_t *eng);
/* Interns a key; 0 or NOMEM (key_id 0 is never used). */
int prefix_key(engine_t *eng, const engine_pkey_t *key, bool create, uint32_t *key_id);
/* Undoes the interning of a key by the call that just did it (nothing uses
 * it yet), shrinking the key map back to keys_cap slots. */
void prefix_key_forget(engine_t *eng, const engine_pkey_t *key, size_t keys_cap);

#endif
