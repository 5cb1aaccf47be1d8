/* rtier.h: the state the cluster tier's files share (remote.c: its life
 * and figures; rlookup.c: lookups; rwrite.c: the write-behind queue).
 * Nothing outside them includes it. */
#ifndef KVCD_RTIER_H
#define KVCD_RTIER_H

#include <hiredis/hiredis.h>

#include "rcluster.h"
#include "remote.h"
#include "rvalue.h"
#include "tier.h"

#define RTIER_MEMO 64 /* caches whose key prefix and shape are remembered */

typedef struct rlookup rlookup_t;
typedef struct wentry wentry_t;

typedef struct remote {
  server_t *srv;
  rcluster_t *cl;
  rvalue_secret_t *sec;
  tier_stats_t st;
  struct {                     /* by cache_id % RTIER_MEMO */
    uint32_t cache_id;
    bool valid;
    rvalue_cache_t rc;
  } memo[RTIER_MEMO];
  rlookup_t *lookups;          /* in flight, and ended ones not yet imported */
  uint64_t lookup_bytes;       /* value bytes they may hold (cluster_lookup_bytes) */
  struct {                     /* value buffers kept for the next values (rlookup.c) */
    void **v;
    size_t n, cap;             /* kept, and at most */
    size_t bytes;              /* each one's size (that of the last value kept) */
  } spare;
  /* The write-behind queue: a ring of cluster_queue_pages entries. */
  wentry_t *q;
  uint32_t qcap, qhead, qlen;
  uint32_t inflight;           /* writes sent, not answered */
  uint64_t inflight_bytes;
  struct wjob *jobs;           /* the writes in flight */
  struct rsend *send;          /* the sender thread (rsend.c) */
  uv_timer_t kick;             /* sends from the queue on a later turn */
  uv_timer_t deadline;         /* the earliest lookup's bound */
  int open_handles;            /* timers not yet closed (stopping) */
  bool stopping;
} remote_t;

/* rshared.c */
/* The cluster's names of a cache's pages (key prefix, shape, tenant), or
 * NULL when the cache is gone. Valid until the next call. */
const rvalue_cache_t *remote_cache(remote_t *r, uint32_t cache_id);
/* Counts a failed command by its kind (a status, or an error reply). */
void remote_error(remote_t *r, enum rc_status st, const redisReply *reply);

/* rwrite.c */
/* Makes the queue: 0 or -1 out of memory. */
int rwrite_start(remote_t *r);
/* Stops the sender (its jobs come back, their pages released) and frees
 * the queue. */
void rwrite_stop(remote_t *r);
/* A job the sender is done with (its done callback, on the loop). */
struct rsend_job;
void rwrite_done(void *ctx, struct rsend_job *j);
/* The engine's hooks (engine_tier_hooks_t): they only queue. */
void rwrite_indexed(void *ctx, uint32_t cache_id, const uint8_t hash[32]);
void rwrite_reclaimed(void *ctx, const engine_page_t *page);

/* rlookup.c */
/* The tier's lookup, import and forget (tier.h's): the pages of q past
 * what the pool holds, GET from the cluster while the request waits; at its
 * run again, what came goes in; or it is let go. */
int rlookup_start(server_t *srv, tier_wait_t *w, unsigned idx, const tier_query_t *q);
void rlookup_import(server_t *srv, tier_wait_t *w, unsigned idx, const tier_query_t *q);
void rlookup_forget(server_t *srv, tier_wait_t *w, unsigned idx);
/* Ends every lookup now (drain, stop). */
void rlookup_end_all(remote_t *r);
/* Frees the value buffers kept for later lookups. */
void rlookup_spare_free(remote_t *r);

#endif
