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
  X(write_pauses, STAT_COUNTER, "pauses", "times reading paused for write backpressure") \
  X(offloaded_gets, STAT_COUNTER, "requests", "gets copied on a copy thread (offload_bytes)") \
  X(offloaded_puts, STAT_COUNTER, "requests", "puts copied on a copy thread (offload_bytes)") \
  X(offloaded_shares, STAT_COUNTER, "shares", "shares the offloaded copies were split in, one a copy thread (a copy of 256 KiB or more a share)") \
  X(parked_requests, STAT_COUNTER, "requests", "times a request waited for a sequence another connection's put held busy") \
  X(ring_connections, STAT_GAUGE, "connections", "connections with shared-memory rings now") \
  X(ring_requests, STAT_COUNTER, "requests", "requests received through a submission ring") \
  X(ring_doorbells, STAT_COUNTER, "wakeups", "times a client woke the daemon through its ring's doorbell (the daemon was not polling)") \
  X(ring_client_wakeups, STAT_COUNTER, "wakeups", "times the daemon woke a client sleeping on its completion ring") \
  X(config_reloads, STAT_COUNTER, "reloads", "SIGHUP reloads applied")        \
  X(config_reload_failures, STAT_COUNTER, "reloads", "SIGHUP reloads refused (invalid configuration kept out)") \
  X(metrics_scrapes, STAT_COUNTER, "requests", "GET /metrics answered by the metrics_listen endpoint") \
  X(metrics_http_errors, STAT_COUNTER, "requests", "HTTP requests of the metrics endpoint refused (bad, too large, slow, not GET /metrics)") \
  X(events_batches, STAT_COUNTER, "batches", "batches published on the ZeroMQ event stream (events_endpoint)") \
  X(events_published, STAT_COUNTER, "events", "events in those batches (runs of one chain's stored pages, or of one cache's removed pages, are one event)") \
  X(events_log_dropped, STAT_COUNTER, "records", "changes of the prefix index lost because the engine's event log was full (events_log_bytes); each loss is followed by AllBlocksCleared") \
  X(events_slow_drops, STAT_COUNTER, "batches", "batches a ZeroMQ subscriber missed because its queue held events_hwm messages") \
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

/* The value at quantile q (0..1) of op's latency, in ns (0 with no data). */
uint64_t metrics_percentile(const daemon_stats_t *s, enum op op, double q);

/* Histogram bucket of a value and the largest value in a bucket. */
unsigned metrics_bucket(uint64_t v);
uint64_t metrics_bucket_max(unsigned idx);

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

/* The name of an operation ("put"), as its op label says it. */
const char *metrics_op_name(enum op op);

/* Fills out with every figure: engine, per cache (those view shows, with
 * their tenant label), daemon, per operation. Strings and arrays come from
 * a (freed with the reply). Returns 0 or KVC_E_NOMEM. */
int metrics_render(const daemon_stats_t *s, engine_t *eng, uint64_t now_ns, arena_t *a,
                   metrics_cache_view_fn view, void *view_ctx, const metrics_refusals_t *ref,
                   size_t nref, Kvcache__V1__StatsReply *out);

#endif
