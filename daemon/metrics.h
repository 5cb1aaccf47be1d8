/* metrics.h: the daemon's own counters, and the Stats reply that joins them
 * with the engine's.
 *
 * DAEMON_STATS(X) lists the connection-level figures once; each operation of
 * optable.h adds requests_<op>, errors_<op>, latency_<op>_p50_ns and
 * latency_<op>_p99_ns. Latency is the daemon's service time of a request
 * (decode to reply queued) in a log-bucket histogram: 4 buckets per power of
 * two, so a reported percentile is the upper edge of its bucket, at most 25%
 * above the true value. The engine's figures come from ENGINE_STATS and
 * CACHE_STATS (src/stats.h) and are exported without a line here.
 */
#ifndef KVCD_METRICS_H
#define KVCD_METRICS_H

#include <stdint.h>

#include "arena.h"
#include "engine.h"
#include "kvcache.pb-c.h"
#include "optable.h"

#define DAEMON_STATS(X)                                                        \
  X(connections_current, STAT_GAUGE, "clients connected now")                 \
  X(connections_total, STAT_COUNTER, "clients accepted, ever")                \
  X(connections_rejected, STAT_COUNTER, "connections refused (permission, limit, shutdown)") \
  X(connections_idle_closed, STAT_COUNTER, "connections closed after idle_timeout_ms") \
  X(connections_dropped, STAT_COUNTER, "connections closed for a bad frame or protocol error") \
  X(connections_timed_out, STAT_COUNTER, "connections closed by frame_timeout_ms (a frame or Hello too slow)") \
  X(accept_pauses, STAT_COUNTER, "times accepting paused for lack of file descriptors") \
  X(frames_in, STAT_COUNTER, "request frames received")                       \
  X(socket_bytes_in, STAT_COUNTER, "bytes read from client sockets")          \
  X(socket_bytes_out, STAT_COUNTER, "bytes of replies queued to client sockets") \
  X(shm_bytes, STAT_GAUGE, "bytes of the connections' shared buffers")        \
  X(deferred_turns, STAT_COUNTER, "times a connection yielded with frames still buffered") \
  X(write_pauses, STAT_COUNTER, "times reading paused for write backpressure") \
  X(offloaded_gets, STAT_COUNTER, "gets copied on the thread pool (offload_bytes)") \
  X(config_reloads, STAT_COUNTER, "SIGHUP reloads applied")                  \
  X(config_reload_failures, STAT_COUNTER, "SIGHUP reloads refused (invalid configuration kept out)")

#define STATS_HIST_BUCKETS 252

typedef struct op_stats {
  uint64_t requests;                  /* requests of this operation */
  uint64_t errors;                    /* of those, answered with a non-OK status */
  uint64_t hist[STATS_HIST_BUCKETS];  /* service time, log buckets of ns */
} op_stats_t;

typedef struct daemon_stats {
#define DSTAT_FIELD_(name, kind, help) uint64_t name;
  DAEMON_STATS(DSTAT_FIELD_)
#undef DSTAT_FIELD_
  uint64_t start_ns;        /* uv_hrtime() at start, for uptime */
  op_stats_t ops[OP_COUNT_];
} daemon_stats_t;

void metrics_init(daemon_stats_t *s, uint64_t now_ns);

/* Counts one request of op that took elapsed_ns and failed if !ok. */
void metrics_record(daemon_stats_t *s, enum op op, uint64_t elapsed_ns, int ok);

/* The value at quantile q (0..1) of op's latency, in ns (0 with no data). */
uint64_t metrics_percentile(const daemon_stats_t *s, enum op op, double q);

/* Histogram bucket of a value and the largest value in a bucket. */
unsigned metrics_bucket(uint64_t v);
uint64_t metrics_bucket_max(unsigned idx);

/* Which caches a viewer may see: the tenant name to show for one it may,
 * NULL for one it may not (doc/security.md). */
typedef const char *(*metrics_cache_view_fn)(void *ctx, const kvc_cache_info_t *ci);

/* Fills out with every figure: engine, per cache (those view shows),
 * daemon, per operation. Strings and arrays come from a (freed with the
 * reply). Returns 0 or KVC_E_NOMEM. */
int metrics_render(const daemon_stats_t *s, engine_t *eng, uint64_t now_ns, arena_t *a,
                   metrics_cache_view_fn view, void *view_ctx, Kvcache__V1__StatsReply *out);

#endif
