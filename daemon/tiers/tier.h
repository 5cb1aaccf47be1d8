/* tier.h: the daemon's tiers below memory, one kind with members (the disk,
 * doc/tiers.md; the Redis Cluster, doc/cluster.md; a test's), and the one
 * way a request waits on them.
 *
 * A tier is a table of operations (tier_ops_t) and one line in tiers.c's
 * list. The list's order is the chain: a match or attach that misses in
 * memory walks the tiers in that order, each asked for the pages past what
 * the pool holds by then (what the one before it brought back is in the pool
 * when the next is asked), each page verified by the engine before it joins
 * the pool (engine_tier.h: a tier can withhold pages, never plant them).
 *
 *   request -> tiers_lookup(w, q): tier i not tried yet -> lookup, with
 *              q->deadline_ms (tier_lookup_timeout_ms from now)
 *                 TIER_RUN:  nothing to wait for, ask the next tier
 *                 TIER_WAIT: the request parks (conn: one flag, parked);
 *                            the tier's lookup ends -> tiers_done(srv,
 *                            conn_id, i), the one call: the request runs
 *                            again, whole; then tier i's import takes in
 *                            what it holds, and the walk goes on with
 *                            tier i + 1
 *                 deadline:  the lookup has not ended: tiers.c lets it go
 *                            (forget, counted as the tier's timeout) and
 *                            the request runs again without it
 *           -> answered: tiers_end(w), the walk is over
 *
 * What leaves memory goes to each tier that asks for it through the
 * engine's two hooks, which tiers.c alone sets and shares out: indexed (a
 * page entered the index) and reclaimed (a cached page is about to leave
 * memory: its identity and bytes). No tier calls the connection layer, and
 * the connection layer calls only tiers.c.
 */
#ifndef KVCD_TIER_H
#define KVCD_TIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "arena.h"
#include "engine_tier.h"
#include "metrics.h"

typedef struct server server_t;

#define TIERS_MAX 4

/* A lookup's answers. */
#define TIER_RUN 0  /* nothing to wait for */
#define TIER_WAIT 1 /* the request waits: tiers_done comes, at the latest at a deadline */

/* One request's walk of the tiers, kept by its connection (conn_t.tw). */
typedef struct tier_wait {
  uint64_t conn_id;      /* whose request (tiers_done names it) */
  uint32_t tried;        /* tiers asked for this request (bit i: tier i) */
  uint32_t pending;      /* tiers it waits on now */
  void *held[TIERS_MAX]; /* what tier i keeps for the request's run again */
  uint64_t deadline_ms;  /* while pending: when tiers.c lets the lookup go */
  struct tier_wait *prev, *next; /* tiers.c's list of the walks that wait */
  bool listed;
} tier_wait_t;

/* What a match or attach asks of the tiers: pages of tokens[0..n) under key
 * in cache_id past what the pool holds. Borrowed for the call. */
typedef struct tier_query {
  uint32_t cache_id;
  const uint32_t *tokens;
  uint64_t n;
  const engine_pkey_t *key;
  uint64_t *turn_bytes;  /* the request's bytes moved on the loop (its budget) */
  uint64_t deadline_ms;  /* the loop's time (uv_now) by which the lookup ends: a tier
                            that waits ends it by then with what it has, or tiers.c
                            lets it go (forget) and the request runs without it */
} tier_query_t;

typedef struct tier_ops {
  const char *name; /* its label: tier="disk" */
  /* From the configuration: 0 (also when the tier is off), or -1 with a
   * reason in err. */
  int (*open)(server_t *srv, char *err, size_t errlen);
  /* Whether it is on (opened and not closed). */
  bool (*on)(const server_t *srv);
  /* The daemon drains (its lookups end now with what they have), stops
   * (the loop still runs: its handles close), closes (the loop ended; with
   * clean, a drain came first: it may persist what it keeps). */
  void (*drain)(server_t *srv);
  void (*stop)(server_t *srv);
  void (*close)(server_t *srv, bool clean);
  /* A reload, and the once-a-second tick. */
  void (*reload)(server_t *srv);
  void (*tick)(server_t *srv);
  /* Store: pages entering the index or leaving memory (the engine's
   * hooks, engine_tier.h, on the loop; neither may call the engine). */
  void (*indexed)(server_t *srv, uint32_t cache_id, const uint8_t hash[32]);
  void (*reclaimed)(server_t *srv, const engine_page_t *page);
  /* Lookup, asynchronous with a deadline (q->deadline_ms): TIER_RUN, or
   * TIER_WAIT with tiers_done(srv, w->conn_id, idx) to come, by the
   * deadline (else forget comes). What it keeps for the run again goes in
   * w->held[idx]. */
  int (*lookup)(server_t *srv, tier_wait_t *w, unsigned idx, const tier_query_t *q);
  /* The request runs again after its wait: takes in what w->held[idx]
   * holds, frees it (NULL for a tier whose reads import as they land). */
  void (*import)(server_t *srv, tier_wait_t *w, unsigned idx, const tier_query_t *q);
  /* The request is answered, its connection closes, or its lookup's
   * deadline passed: w->held[idx] and any lookup of w in flight are let go
   * (tiers_done is not called). */
  void (*forget)(server_t *srv, tier_wait_t *w, unsigned idx);
  /* Stats: its figures for metrics_render (strings in a), NULL when off. */
  const tier_view_t *(*view)(server_t *srv, arena_t *a);
} tier_ops_t;

/* The members (tiers.c's list; each tier's own file defines its table). */
extern const tier_ops_t tier_disk, tier_cluster, tier_testmem;

/* ---- tiers.c: what the rest of the daemon calls ------------------------------ */

/* Opens every tier in the chain's order and hooks the engine once for all
 * of them. 0, or -1 with a reason in err. */
int tiers_open(server_t *srv, char *err, size_t errlen);
void tiers_drain(server_t *srv);
void tiers_stop(server_t *srv);
void tiers_close(server_t *srv, bool clean);
void tiers_reload(server_t *srv);
void tiers_tick(server_t *srv);

/* A match or attach: walks the tiers not yet asked for this request (and
 * imports what the one it waited on holds). TIER_RUN: run the engine call;
 * TIER_WAIT: park the request, it runs again after tiers_done. */
int tiers_lookup(server_t *srv, tier_wait_t *w, const tier_query_t *q);
/* The request is answered (or its connection closes): the walk is over. */
void tiers_end(server_t *srv, tier_wait_t *w);

/* A tier's lookup for conn_id's request ended: the one call back. It
 * reaches the connection layer through srv->up.resume, which main.c sets. */
void tiers_done(server_t *srv, uint64_t conn_id, unsigned idx);

/* The tiers' figures, the chain's order, those on (at most cap): each
 * tier's own, with the lookups tiers.c let go at their deadline counted in
 * its errors[TIER_ERR_timeout]. */
size_t tiers_views(server_t *srv, arena_t *a, const tier_view_t **out, size_t cap);

#endif
