/* core.h: the engine's data model: the engine, its caches, sequences, pins
 * and page metadata, and the one lookup every operation starts with. Each
 * module's functions are in its own header; this one holds only what they
 * all share.
 *
 *   engine
 *    +- pool            segments carved into arenas' pages,  (pool.h)
 *                       refcnt/pinref/plan arrays, free lists through pinref
 *    +- caches[id]      name, layout, geometry, seqs map    (u64 seq_id -> seq)
 *    +- lru[prio]       unpinned sequences and cached pages, most recent first,
 *                       one list per retention priority     (lru.h)
 *    +- ip[page]        token ids and content hash of pages that have them
 *                                                           (page.h, prefix.h)
 *    +- owners          map owner id -> pins of that owner  (pin.h)
 *    +- leases          map lease id -> pages held for a reader (lease.h)
 *    +- quotas[i]       per tenant: limits, usage, refusals   (quota.h)
 *                       page_quota[page] = i of the tenant it counts against
 *
 *   seq: start, len, extent, table[0..ntable) = pages of logical pages
 *        base .. base+ntable-1 (base = start / T after trim_front); an
 *        entry is POOL_NOPAGE where every slot of its page is a hole
 *     +- x              lengths and chains per layer, holes, positions:
 *                       &seq_ext_none (empty, read-only) until used
 */
#ifndef KVC_CORE_H
#define KVC_CORE_H

#include "engine.h"
#include "engine_tier.h"
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


/* What the engine knows of a page's tokens (page.c keeps them, prefix.c
 * hashes and indexes them). A page gets one when
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
  uint32_t tokens[];    /* page_tokens ids, then page_tokens span tags: the
                           interned span key of each position, 0 for none
                           (ipage_tags) */
} ipage_t;

static inline uint32_t *ipage_tags(ipage_t *ip, uint32_t T) { return ip->tokens + T; }
static inline const uint32_t *ipage_tags_c(const ipage_t *ip, uint32_t T) {
  return ip->tokens + T;
}

typedef struct lease lease_t; /* lease.h */

/* A span key resolved for a call (put.c, a match): positions [begin, end)
 * of the sequence carry the interned key id (SPAN_UNKNOWN: a query's key
 * never interned, which no page holds); created: interned by this call. */
typedef struct span_tag {
  uint64_t begin, end;
  uint32_t id;
  uint32_t src;  /* index in the caller's list */
  bool created;
} span_tag_t;

/* A put in flight (begun, not ended) as the rest of the engine sees it: put.c's
 * job begins with one, on eng->put_jobs. The sequences it writes (busy), and
 * the chain key (0: none) and span keys it interned at its begin, which stay
 * in use until its end. Data, not calls: arena.c and prefix.c read it without
 * calling up into put.c. */
typedef struct put_flight {
  struct put_flight *prev, *next;
  struct seq **seqs;           /* per entry */
  size_t n;                    /* entries */
  uint32_t key_id;
  struct span_tag *tags;       /* the entries' span keys, resolved, in a row */
  size_t ntags;
} put_flight_t;
#define SPAN_UNKNOWN UINT32_MAX

/* One tenant's limits, usage and refusals (quota.c). */
typedef struct quota {
  uint32_t tenant;             /* the engine's tenant number */
  uint32_t idx;                /* in eng->quotas, as page_quota names it */
  uint8_t ident[32];           /* stands for the tenant in chain seeds and key
                                  digests: the same on every node that names it
                                  alike (engine_tenant_identity), else its number */
  bool own;                    /* lim is this tenant's; else the default applies */
  bool over;                   /* eviction: over its page share when the call began */
  uint64_t plan_freed;         /* eviction planning: its pages the plan frees */
  engine_tenant_limits_t lim;
  engine_tenant_usage_t use;   /* gauges kept current, refusal counters */
  cache_t **rank;              /* its caches by pages held, most first (rank.h) */
  uint32_t nrank, rank_cap;    /* caches in rank, room */
} quota_t;

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
  uint32_t tenant;     /* whose it is: names resolve inside a tenant */
  quota_t *q;          /* that tenant's quota record */
  uint16_t arena;      /* the pool arena its pages come from: (tenant, page bytes) */
  kvc_layout_t layout; /* normalized */
  geom_t g;
  hmap_t seqs;         /* seq_id -> seq_t */
  hmap_t index;        /* first 8 bytes of a page hash -> indexed ipage_t */
  uint8_t seed[32];    /* hash chain seed: the cache's tenant, name and layout */
  cache_stats_t st;    /* counters; gauges kept current */
  uint32_t rank_pos;   /* its place in q->rank (rank.h) */
  uint32_t nbusy;      /* its sequences with a put in flight: not dropped meanwhile */
  uint64_t index_pending; /* index entries the puts in flight will insert */
};

/* The parts of a sequence few sequences use: lengths and chains per layer,
 * holes, positions of its own. A sequence that uses none of them points at
 * seq_ext_none (empty and read-only: a write to it faults); seq_ext_own
 * gives it one of its own before the first write, seq_ext_release takes it
 * back once it holds nothing again (seq.h). */
typedef struct seq_ext {
  uint32_t *layer_len; /* per-layer written length, NULL: all equal len */
  /* Layer-by-layer saves (a put of a layer range with ids): layer l's
   * chain is [0, layer_chain[l]); chain_tok is their minimum, so a page
   * enters the index once every layer of it is in the chain. NULL while
   * every layer's chain is chain_tok (the common case). */
  uint32_t *layer_chain;
  hole_t *holes;       /* sorted, disjoint slots in [start, extent) never written */
  uint32_t nholes, hcap;
  /* Positions of its own (doc/attention.md, "Positions are labels"): the
   * position of slot base * T + i is pos[i], for the cap * T slots the
   * table can cover (pcap >= cap * T); NULL (the common case): every
   * slot's position is the slot. A seq_div gives a sequence one. */
  uint32_t *pos;
  uint64_t pcap;       /* entries of pos */
} seq_ext_t;

extern const seq_ext_t seq_ext_none;
/* core.c: */
/* Gives s parts of its own (s->x) if it points at seq_ext_none: 0 or
 * KVC_E_NOMEM (no change). Every write to s->x comes after it. */
int seq_ext_own(engine_t *eng, seq_t *s);
/* Frees s's own parts once they hold nothing (no array allocated): s
 * points at seq_ext_none again. Called wherever one of them is freed. */
void seq_ext_release(engine_t *eng, seq_t *s);

/* 160 bytes (jemalloc's class of that size): at 100,000 sequences over a
 * pool of 4 KiB pages the largest part of the engine's metadata (doc/design.md,
 * "Metadata"). What few sequences use is in x. */
struct seq {
  lru_node_t node;     /* first member; on eng->lru while npins == 0 */
  uint64_t id;
  cache_t *cache;
  uint64_t start;      /* first position held */
  uint64_t len;        /* tokens written for every layer */
  uint64_t extent;     /* largest written length of any layer */
  uint32_t *table;     /* block table: pages of logical pages base..; POOL_NOPAGE
                          for a page every slot of which is a hole (seq.h) */
  seq_ext_t *x;        /* rarely used parts; &seq_ext_none while it has none */
  pin_t *pins;
  uint64_t last_use_ms;
  uint64_t mark;       /* == eng->epoch: taking part in the current call */
  uint64_t rsv_end;    /* slots reserved up to here (table covers them), or 0 */
  /* The prefix chain (doc/prefix.md): tokens [0, chain_tok) have known ids
   * and were written in order, each under the ids before it, with key
   * chain_key; the first chain_pages pages of them are hashed. Any write
   * before chain_tok cuts it there (seq_chain_cut). */
  uint64_t chain_tok;
  uint32_t chain_pages;
  uint32_t chain_key;
  uint32_t base;       /* logical page of table[0] */
  uint32_t ntable;     /* entries used */
  uint32_t npages;     /* entries that hold a page (not POOL_NOPAGE) */
  uint32_t cap;        /* entries allocated */
  uint32_t npins;      /* owners pinning it (hard and soft) */
  uint32_t slot;       /* per-call scratch: index of its record in the call */
  bool planned;        /* eviction planning: the plan counted its pages */
  bool busy;           /* a put's copy into its pages is in flight (put.c) */
};

struct engine {
  mem_t mem;
  pool_t pool;
  cache_t **caches;    /* by slot; NULL once dropped (a slot is reused) */
  uint16_t *cache_gen; /* per slot: generation, bumped at each drop */
  uint32_t ncaches;    /* slots ever used */
  uint32_t ncaches_open; /* caches open (slots not NULL) */
  uint32_t max_caches;
  uint64_t max_seqs;   /* 0: unlimited */
  uint64_t nseqs;
  uint64_t nseqs_pinned;
  uint64_t ntokens;
  uint64_t bytes_used; /* layout bytes of used pages */
  lru_node_t lru[PRIO_LEVELS]; /* sentinels: lru[p].next is the most recent */
  ipage_t **ip;        /* per page: token metadata or NULL */
  uint32_t *scratch;   /* per page: eviction planning stack */
  uint32_t *page_ids;  /* one page of a match's token ids, copied from the
                          caller (whose memory may change meanwhile) */
  uint32_t page_ids_cap; /* token ids page_ids holds */
  hmap_t keys;         /* digest of (salt, extra) -> key_t */
  hmap_t key_ids;      /* key id -> key_t (span tags name keys by id) */
  uint32_t *page_tags; /* a match: one page of the query's span tags (in page_ids' block) */
  span_tag_t *qtags;   /* a match: the query's span keys, resolved */
  size_t nqtags;
  uint32_t nkeys;      /* keys interned */
  uint32_t next_key_id; /* the last key id handed out (ids are never 0) */
  uint64_t next_seq_id; /* engine_seq_create: the next id to try (>= 2^63) */
  uint32_t keys_kept;  /* keys left by the last collection of unused ones */
  uint32_t hash_bits;  /* test hook: keep only this many hash bits (0: all) */
  uint64_t pin_limit;  /* bytes of pages that may be pinned */
  uint32_t pin_limit_pct; /* as set: the limit follows the pool's size */
  bool pin_share;      /* tenants without a pin limit of their own share the pool's */
  bool evicting;       /* pages a dropped sequence leaves cached go to the tail */
  pin_t *soft;         /* soft (TTL) pins */
  uint32_t index_sole;  /* indexed pages held by exactly one sequence */
  void *reserve;       /* ipage blocks reserved for the current call */
  struct put_flight *put_jobs; /* puts in flight (begun, not ended) */
  void *md_ctx;        /* EVP_MD_CTX for SHA-256 */
  struct engine_events *ev; /* the prefix-index event log; NULL: off (evlog.c) */
  kvc_hash_t hash_kind;
  hmap_t owners;       /* owner id -> owner_t */
  uint64_t now_ms;
  uint64_t epoch;      /* bumped by every call that marks sequences */
  hmap_t leases;       /* lease id -> lease_t */
  lease_t *lease_list; /* every lease, newest first */
  lease_t *lease_spare; /* a released small lease's memory, for the next (lease.c) */
  uint64_t next_lease_id;
  quota_t **quotas;    /* per tenant seen, by idx; kept for the engine's life */
  uint32_t nquotas, quotas_cap;
  hmap_t quota_map;    /* tenant -> quota_t */
  engine_tenant_limits_t quota_default; /* limits of tenants without their own */
  uint16_t *page_quota; /* per page in use: idx of the tenant it counts against */
  uint32_t *lease_ref; /* per page: leases of connections holding it (not internal ones);
                          NULL until the first (most pools never lease: 4 B a page less) */
  engine_stats_t st;   /* counters (gauges are computed by engine_stats) */
  engine_tier_hooks_t tier; /* pages a tier may want: indexed, reclaimed (tier.c) */
  engine_err_t err;
  /* The one reclaim hook (tier.c sets it when a tier wants reclaimed pages):
   * prefix_reclaim calls it with a cached page about to leave the index. */
  void (*reclaim_hook)(struct engine *eng, const ipage_t *ip);
  /* A segment changed owner (engine_set_segment_hook). */
  void (*seg_hook)(void *ctx, uint32_t seg, uint64_t from_owner, uint64_t to_owner);
  void *seg_ctx;
  uint64_t reclaims_left; /* cached pages the eviction running plans to reclaim still
                             (evict.c; a reclaimed page says it: engine_page_t.more) */
  uint64_t plan_reclaims; /* of the last evict_plan: the cached pages it reclaims */
};

/* A cache id is its slot in eng->caches and the slot's generation, bumped
 * at each drop: a slot is reused, a stale id names no cache (NOCACHE). A
 * slot's generation wraps after 65536 drops. */
#define CACHE_GEN_SHIFT 16
#define CACHE_SLOT_MASK 0xffffu
#define CACHE_SLOTS_MAX 65536u

/* Records why the call fails and returns code. */
int engine_fail(engine_t *eng, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The cache with id cache_id, or NULL. */
cache_t *engine_cache(engine_t *eng, uint32_t cache_id);
/* The one lookup of a call's cache (or sequence in it): 0, or KVC_E_NOCACHE /
 * KVC_E_NOSEQ recorded with the id. */
int engine_find_cache(engine_t *eng, uint32_t cache_id, cache_t **out);
int engine_find_seq(engine_t *eng, uint32_t cache_id, uint64_t seq_id, seq_t **out);
/* find_seq for an operation that reads a sequence's bytes or changes it:
 * KVC_E_BUSY while a put to it is copying (put.c). */
int engine_use_seq(engine_t *eng, uint32_t cache_id, uint64_t seq_id, seq_t **out);


#endif
