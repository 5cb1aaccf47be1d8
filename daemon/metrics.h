/* metrics.h: the daemon's own counters, and the Stats reply that joins them
 * with the engine's.
 *
 * DAEMON_STATS(X) lists the connection-level figures once (name, kind, unit,
 * help); the operations of optable.h are the op label of requests_total,
 * request_errors_total (with a status label) and the histogram
 * request_duration_seconds. Latency is the daemon's service time of a request
 * (decode to reply queued) in a log-bucket histogram: 4 buckets per power of
 * two; every fourth bucket's upper edge is exported as an le bound (in
 * seconds), so the exported buckets are exact. The engine's figures come
 * from ENGINE_STATS and CACHE_STATS (src/stats.h) and are exported without a
 * line here; doc/stats.md names each.
 */
#ifndef KVCD_METRICS_H
#define KVCD_METRICS_H

#include <stdint.h>

#include "arena.h"
#include "engine.h"
#include "kvcache.pb-c.h"
#include "optable.h"

#define DAEMON_STATS(X)                                                        \
  X(connections_current, STAT_GAUGE, "connections", "clients connected now")  \
  X(connections_total, STAT_COUNTER, "connections", "clients accepted, ever") \
  X(connections_rejected, STAT_COUNTER, "connections", "connections refused (permission, limit, shutdown)") \
  X(connections_idle_closed, STAT_COUNTER, "connections", "connections closed after idle_timeout_ms") \
  X(connections_dropped, STAT_COUNTER, "connections", "connections closed for a bad frame or protocol error") \
  X(connections_timed_out, STAT_COUNTER, "connections", "connections closed by frame_timeout_ms (a frame or Hello too slow)") \
  X(connections_brief, STAT_COUNTER, "connections", "connections that said Hello and closed within 10 s holding nothing (logged at debug only)") \
  X(accept_pauses, STAT_COUNTER, "pauses", "times accepting paused for lack of file descriptors") \
  X(frames_in, STAT_COUNTER, "frames", "request frames received")             \
  X(socket_bytes_in, STAT_COUNTER, "bytes", "bytes read from client sockets") \
  X(socket_bytes_out, STAT_COUNTER, "bytes", "bytes of replies queued to client sockets") \
  X(shm_bytes, STAT_GAUGE, "bytes", "bytes of the connections' shared buffers") \
  X(deferred_turns, STAT_COUNTER, "turns", "times a connection yielded with frames still buffered") \
  X(write_pauses, STAT_COUNTER, "pauses", "times a connection was held for write backpressure " \
    "(its requests wait; reading too at write_queue_bytes)") \
  X(background_waits, STAT_COUNTER, "waits", "times a connection's requests went to wait in the " \
    "background: its client had not read its replies while clients that read theirs were busy") \
  X(offloaded_gets, STAT_COUNTER, "requests", "gets copied on a copy thread (offload_bytes)") \
  X(offloaded_puts, STAT_COUNTER, "requests", "puts copied on a copy thread (offload_bytes)") \
  X(offloaded_shares, STAT_COUNTER, "shares", "shares the offloaded copies were split in (256 KiB or more a share, at most 16 and the layers moved), each taken by whichever copier is free") \
  X(helped_shares, STAT_COUNTER, "shares", "shares of the offloaded copies the loop took itself while only large copies came (offload_quiet_us)") \
  X(split_copies, STAT_COUNTER, "requests", "gets and puts of a client alone split between the loop and the copy threads") \
  X(parked_requests, STAT_COUNTER, "requests", "times a request waited for a sequence another connection's put held busy") \
  X(ring_connections, STAT_GAUGE, "connections", "connections with shared-memory rings now") \
  X(ring_requests, STAT_COUNTER, "requests", "requests received through a submission ring or its fast slot") \
  X(ring_preempts, STAT_COUNTER, "passes", "times requests waiting in rings ran between two frames of a socket connection's turn") \
  X(ring_doorbells, STAT_COUNTER, "wakeups", "times a client woke the daemon through its ring's doorbell (the daemon was not polling)") \
  X(ring_client_wakeups, STAT_COUNTER, "wakeups", "times the daemon woke a client sleeping on its completion ring") \
  X(config_reloads, STAT_COUNTER, "reloads", "SIGHUP reloads applied")        \
  X(config_reload_failures, STAT_COUNTER, "reloads", "SIGHUP reloads refused (invalid configuration kept out)") \
  X(metrics_scrapes, STAT_COUNTER, "requests", "GET /metrics answered by the metrics_listen endpoint") \
  X(metrics_http_errors, STAT_COUNTER, "requests", "HTTP requests of the metrics endpoint refused (bad, too large, slow, not GET /metrics)") \
  X(pool_segments, STAT_GAUGE, "segments", "memfd segments the pool is made of (arenas: one a segment; page_bytes set: one, and one more a grow)") \
  X(pool_segment_refreshes, STAT_COUNTER, "segments", "segments given fresh memory as they passed to another tenant") \
  X(pool_revoked_bytes, STAT_GAUGE, "bytes", "memory of segments given fresh memory that clients still map (charged to their uid's shm_bytes_per_uid until they map the pool again)") \
  X(pool_reserve_bytes, STAT_GAUGE, "bytes", "address space reserved for the pool: the most it may grow to") \
  X(pool_huge_pages, STAT_GAUGE, "kind", "huge pages backing the pool: 2 hugetlbfs (MFD_HUGETLB), 1 transparent (MADV_HUGEPAGE on shmem), 0 none") \
  X(pool_resizes, STAT_COUNTER, "resizes", "online resizes of the pool done (kvcachectl pool resize, reloads)") \
  X(pool_resize_failures, STAT_COUNTER, "resizes", "online resizes refused (pinned data would be lost, leases, not a segment boundary, no memory)") \
  X(pool_resize_moved_pages, STAT_COUNTER, "pages", "pages a shrink copied below the pool's new end") \
  X(pool_resize_evicted_pages, STAT_COUNTER, "pages", "pages a shrink freed by eviction") \
  X(tier_disk_bytes, STAT_GAUGE, "bytes", "bytes of page files in the disk tier (writes in flight included)") \
  X(tier_disk_pages, STAT_GAUGE, "pages", "pages in the disk tier") \
  X(tier_disk_bound_bytes, STAT_GAUGE, "bytes", "the disk tier's bound in force: disk_bytes, or less after the file system was full") \
  X(tier_disk_loading, STAT_GAUGE, "scans", "1 while the start-up scan indexes the disk tier's files (the daemon serves meanwhile)") \
  X(tier_disk_scanned, STAT_GAUGE, "files", "page files the start-up scan has looked at") \
  X(tier_disk_loaded, STAT_GAUGE, "pages", "pages the start-up scan indexed (what a restart kept)") \
  X(tier_disk_writes, STAT_COUNTER, "pages", "pages written to the disk tier (evicted from memory, or kept by a clean stop)") \
  X(tier_disk_write_bytes, STAT_COUNTER, "bytes", "bytes written to the disk tier") \
  X(tier_disk_write_errors, STAT_COUNTER, "pages", "pages the disk tier failed to write (a full file system included)") \
  X(tier_disk_spill_dropped, STAT_COUNTER, "pages", "evicted prefix pages not written: the write queue was full, or a page larger than the tier") \
  X(tier_disk_reads, STAT_COUNTER, "pages", "pages read back from the disk tier") \
  X(tier_disk_read_bytes, STAT_COUNTER, "bytes", "bytes read back from the disk tier") \
  X(tier_disk_hits, STAT_COUNTER, "pages", "pages of the disk tier a match made resident again") \
  X(tier_disk_evicted, STAT_COUNTER, "pages", "pages the disk tier dropped, least recently used first") \
  X(tier_disk_discarded, STAT_COUNTER, "pages", "page files that did not verify (torn, corrupt, another version, tenant or layout): removed, never served") \
  X(events_batches, STAT_COUNTER, "batches", "batches published on the ZeroMQ event stream (events_endpoint)") \
  X(events_published, STAT_COUNTER, "events", "events in those batches (runs of one chain's stored pages, or of one cache's removed pages, are one event)") \
  X(events_log_dropped, STAT_COUNTER, "records", "changes of the prefix index lost because the engine's event log was full (events_log_bytes); each loss is followed by AllBlocksCleared") \
  X(events_slow_drops, STAT_COUNTER, "stalls", "times a batch found a ZeroMQ subscriber's queue full (events_hwm): stalls, not the batches it then missed (its gap in seq counts those)") \
  X(events_subscriptions, STAT_GAUGE, "subscriptions", "ZeroMQ subscriptions to the event stream now") \
  X(events_replays, STAT_COUNTER, "requests", "replay requests served on events_replay_endpoint") \
  X(events_replayed_batches, STAT_COUNTER, "batches", "batches sent again by replays") \
  X(events_local_subscribers, STAT_GAUGE, "connections", "connections subscribed to the event stream on the daemon's socket (Subscribe)") \
  X(events_local_batches, STAT_COUNTER, "batches", "batches pushed to subscribed connections") \
  X(events_local_drops, STAT_COUNTER, "batches", "batches dropped for a subscribed connection holding more than write_queue_bytes of replies")

#define STATS_HIST_BUCKETS 252
#define STATS_STATUS_CODES 64 /* -KVC_E_* codes counted per operation */

/* The histogram buckets exported: every power of two from 2^10 ns (about a
 * microsecond) to 2^35 ns (34 s), each bound the exact upper edge of one of
 * the 252 internal buckets (2^k - 1 ns). */
#define METRICS_EXPORT_MIN_POW 10
#define METRICS_EXPORT_MAX_POW 35
#define METRICS_EXPORT_BUCKETS (METRICS_EXPORT_MAX_POW - METRICS_EXPORT_MIN_POW + 1)

typedef struct op_stats {
  uint64_t requests;                  /* requests of this operation */
  uint64_t errors;                    /* of those, answered with a non-OK status */
  uint64_t sum_ns;                    /* total service time */
  uint64_t by_status[STATS_STATUS_CODES]; /* errors by -code */
  uint64_t hist[STATS_HIST_BUCKETS];  /* service time, log buckets of ns */
} op_stats_t;

typedef struct daemon_stats {
#define DSTAT_FIELD_(name, kind, unit, help) uint64_t name;
  DAEMON_STATS(DSTAT_FIELD_)
#undef DSTAT_FIELD_
  uint64_t start_ns;        /* uv_hrtime() at start, for uptime */
  uint64_t start_unix;      /* time(NULL) at start: process_start_time_seconds */
  op_stats_t ops[OP_COUNT_];
  op_stats_t ring_poll;     /* the ring poller's stretches without work (ring.c):
                               ring_poll_seconds, the CPU it spent polling */
} daemon_stats_t;

void metrics_init(daemon_stats_t *s, uint64_t now_ns);

/* Counts one request of op that took elapsed_ns and answered code (0: OK,
 * else a KVC_E_* code). */
void metrics_record(daemon_stats_t *s, enum op op, uint64_t elapsed_ns, int code);

/* Counts one observation of ns in o's histogram (not a request's). */
void metrics_observe(op_stats_t *o, uint64_t ns);


/* Histogram bucket of a value. */
unsigned metrics_bucket(uint64_t v);

/* ---- the tiers behind the pool (remote.c: the cluster) ----------------------
 * Each tier's figures are rendered with a tier label ("cluster"), as
 * tier_NAME (counters tier_NAME_total); doc/stats.md, The cluster tier. */
#define TIER_STATS(X)                                                          \
  X(lookups, STAT_COUNTER, "requests", "match and attach requests that looked in the tier") \
  X(lookup_pages, STAT_COUNTER, "pages", "pages looked up in the tier")       \
  X(hit_pages, STAT_COUNTER, "pages", "pages found, verified and brought into the pool") \
  X(hit_tokens, STAT_COUNTER, "tokens", "tokens of the pages brought into the pool") \
  X(read_bytes, STAT_COUNTER, "bytes", "value bytes read from the tier")      \
  X(writes, STAT_COUNTER, "pages", "pages written to the tier")               \
  X(written_bytes, STAT_COUNTER, "bytes", "value bytes written to the tier")  \
  X(write_retries, STAT_COUNTER, "pages", "page writes tried again after a failure") \
  X(queue_pages, STAT_GAUGE, "pages", "pages waiting to be written (the write-behind queue)") \
  X(queue_drops, STAT_COUNTER, "pages", "pages never written: the queue was full, retries ran out, or the page was gone") \
  X(up, STAT_GAUGE, "", "1 when the tier's map covers all of it and no master of it is failing, else 0") \
  X(slots_covered, STAT_GAUGE, "slots", "cluster slots the slot map covers (16384: all)") \
  X(nodes_connected, STAT_GAUGE, "nodes", "nodes the daemon is connected to")   \
  X(breakers_open, STAT_GAUGE, "nodes", "nodes whose circuit breaker is open") \
  X(map_refreshes, STAT_COUNTER, "refreshes", "slot maps read (CLUSTER SLOTS)")

/* Why a tier operation failed: the kind label of tier_errors_total. */
#define TIER_ERRORS(X)                                                         \
  X(timeout)    /* no answer in time (a lookup past its bound, a silent node) */ \
  X(connection) /* a connection refused or lost */                           \
  X(breaker)    /* not tried: the node's circuit breaker is open */           \
  X(noroute)    /* no node serves the slot (no slot map) */                  \
  X(redirects)  /* too many MOVED/ASK in a row */                            \
  X(server)     /* an error reply (CLUSTERDOWN, TRYAGAIN, LOADING, ...) */   \
  X(oom)        /* the cluster is full and evicts nothing (maxmemory-policy noeviction) */ \
  X(import)     /* verified pages the pool had no room for */              \
  X(budget)     /* lookups not made: cluster_lookup_bytes held by others */

enum tier_err {
#define TIER_ERR_ENUM_(name) TIER_ERR_##name,
  TIER_ERRORS(TIER_ERR_ENUM_)
#undef TIER_ERR_ENUM_
  TIER_ERR_COUNT_
};
extern const char *const tier_err_names[TIER_ERR_COUNT_];

#define TIER_DISCARDS_MAX 16

typedef struct tier_stats {
#define TSTAT_FIELD_(name, kind, unit, help) uint64_t name;
  TIER_STATS(TSTAT_FIELD_)
#undef TSTAT_FIELD_
  uint64_t errors[TIER_ERR_COUNT_];
  uint64_t discarded[TIER_DISCARDS_MAX];  /* values refused, by reason (tier_view_t) */
  uint64_t moved, ask;                    /* redirections followed */
  uint64_t lookup_hist[STATS_HIST_BUCKETS]; /* lookup latency, log buckets of ns */
  uint64_t lookup_ns;                     /* its sum */
} tier_stats_t;

/* One node of a tier, for kvcachectl. */
typedef struct tier_node {
  const char *addr;
  const char *role;   /* master, replica, seed */
  const char *state;  /* connected, down, breaker_open */
  uint32_t slots;     /* slots it serves as a master */
} tier_node_t;

/* What metrics_render shows of a tier. */
typedef struct tier_view {
  const char *tier;                 /* its label: "disk", "cluster" */
  const tier_stats_t *st;
  const char *const *discard_names; /* the reason of discarded[i] */
  size_t ndiscards;
  const tier_node_t *nodes;
  size_t nnodes;
} tier_view_t;

/* Which caches a viewer may see: the tenant name to label one it may with,
 * NULL for one it may not (doc/security.md). */
typedef const char *(*metrics_cache_view_fn)(void *ctx, const kvc_cache_info_t *ci);

/* One tenant's quota refusals by limit (quota_refusals_total). */
#define METRICS_LIMITS 7
typedef struct metrics_refusals {
  const char *tenant;
  uint64_t n[METRICS_LIMITS]; /* in the order of metrics_limit_names */
} metrics_refusals_t;
/* pages, pins, sequences, caches, keys, connections, shm: the limit label. */
extern const char *const metrics_limit_names[METRICS_LIMITS];

/* One arena of the pool (doc/design.md, "The pool"), as a viewer may see it. */
typedef struct metrics_arena {
  const char *tenant;     /* its tenant's name ("shared" for a shared cache's) */
  const char *page_bytes; /* its caches' page bytes, as a label */
  uint64_t segments, pages_used, pages_free, padding_bytes, segs_taken, segs_given;
} metrics_arena_t;


/* Fills out with every figure of the node (engine, daemon, per operation,
 * quota refusals, arenas, tiers) and those of the caches cache_ids[0..ncaches)
 * that view shows, with their tenant label; cache_ids NULL: every cache (the
 * scrape). Strings and arrays come from a (freed with the reply). Returns 0
 * or KVC_E_NOMEM. */
int metrics_render(const daemon_stats_t *s, engine_t *eng, uint64_t now_ns, arena_t *a,
                   const uint32_t *cache_ids, size_t ncaches, metrics_cache_view_fn view,
                   void *view_ctx, const metrics_refusals_t *ref, size_t nref,
                   const tier_view_t *const *tiers, size_t ntiers, const metrics_arena_t *arenas,
                   size_t narenas, Kvcache__V1__StatsReply *out);

#endif
