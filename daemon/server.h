/* server.h: the daemon's state, one instance owned by main.c.
 *
 * Everything the event loop's callbacks reach: the loop, the configuration in
 * force, the engine and its pool, the listening socket, the live
 * connections and the counters. Single-threaded: only loop callbacks touch it.
 */
#ifndef KVCD_SERVER_H
#define KVCD_SERVER_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "arena.h"
#include "config.h"
#include "engine.h"
#include "shm.h"
#include "stats.h"

typedef struct conn conn_t;

typedef struct server {
  uv_loop_t *loop;
  config_t cfg;            /* the configuration in force */
  engine_t *eng;           /* the cache engine over pool */
  shm_region_t pool;       /* the page pool memfd */
  daemon_stats_t stats;
  uv_pipe_t listener;
  bool listening;          /* listener open (closed when draining starts) */
  bool draining;           /* SIGTERM seen: no new work, close when flushed */
  uv_signal_t sig_term, sig_int;
  conn_t *conns;           /* every connection not yet freed (doubly linked) */
  uint64_t next_conn_id;   /* next conn_id to hand out; starts at 1 */
  arena_t arena;           /* scratch for building the current reply */
} server_t;

/* Starts listening on cfg.socket_path: creates the parent directory, removes
 * a stale socket (one nobody listens on), binds under a umask giving at most
 * cfg.socket_mode, listens. Returns 0 or -1 with a reason in err. */
int server_listen(server_t *srv, char *err, size_t errlen);

/* Stops accepting and removes the socket file. Idempotent. */
void server_unlisten(server_t *srv);

/* Begins the graceful shutdown: stop accepting, run what each connection has
 * buffered, flush replies and close every connection. */
void server_drain(server_t *srv);

/* Called when a connection is freed; finishes the drain when none is left. */
void server_conn_gone(server_t *srv);

#endif
