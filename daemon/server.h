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
#include "log.h"
#include "notify.h"
#include "shm.h"
#include "metrics.h"
#include "poolmap.h"
#include "tenant.h"

typedef struct conn conn_t;

typedef struct offload offload_t; /* offload.c */
typedef struct ring_poller ring_poller_t; /* ring.c */
typedef struct remote remote_t;   /* remote.c: the cluster tier */
typedef struct disk disk_t;       /* disk.c */
typedef struct tiers tiers_t;     /* tiers.c: the chain's deadlines */
typedef struct events events_t;   /* events.c */

struct server;

/* What the layers below call up into, set once by main.c before anything
 * runs: the connection layer and the tiers name nothing above them, so no
 * file calls back into one that calls it (tests/callgraph.py). */
typedef struct server_up {
  /* A whole frame of c's arrived (dispatch_frame): false when c parked. */
  bool (*frame)(conn_t *c, const uint8_t *payload, size_t len);
  /* A fast request of c's, its slot's body copied out (dispatch_fast): false
   * when c parked. */
  bool (*fast)(conn_t *c, const uint8_t *body, uint32_t seq, uint64_t t0_ns);
  /* c closes with a subscription to the event stream (events_unsubscribe). */
  void (*closing)(conn_t *c);
  /* A connection was freed (server_conn_gone: a drain ends with the last). */
  void (*gone)(struct server *srv);
  /* The one call back of a tier: conn_id's request waited on tier idx,
   * whose lookup ended (tiers_done; conn_tier_done). */
  void (*resume)(struct server *srv, uint64_t conn_id, unsigned idx);
  /* An offloaded copy of c's request ended on the loop: reply OK and run
   * what waited (conn_copied). */
  void (*copied)(conn_t *c, uint64_t request_id);
  /* A put ended: the requests parked on its busy sequences run again
   * (conn_unpark_all). */
  void (*seqs_free)(struct server *srv);
} server_up_t;

typedef struct server {
  uv_loop_t *loop;
  server_up_t up;          /* the calls up (above), main.c's */
  config_t cfg;            /* the configuration in force */
  config_cmdline_t cmdline;/* how it was built, read again on SIGHUP */
  char config_file[4096];  /* the file read at start or last reload ("": none) */
  engine_t *eng;           /* the cache engine over pool */
  struct work *work;       /* the one work queue (work.h): copies, disk, cluster writes */
  offload_t *offload;      /* the copy threads of large gets and puts */
  ring_poller_t *rings;    /* polls the shared-memory rings of active connections */
  uint32_t nrings;         /* connections with rings (a doorbell descriptor each) */
  remote_t *remote;        /* the cluster tier; NULL: none (cluster_nodes empty) */
  disk_t *disk;            /* the disk tier (disk_dir), or NULL */
  tiers_t *tiers;          /* the requests waiting on a tier, by deadline (tiers.c) */
  events_t *events;        /* the stream of prefix-index changes (events.c) */
  uint32_t floored[TENANT_RULES_MAX]; /* tenants given a floor by the last quotas_apply */
  uint32_t nfloored;
  poolmap_t pool;          /* the page pool: segments of sealed memfds */
  uint64_t seg_mem_owner[POOLMAP_SEGMENTS_MAX]; /* per segment: whose bytes its memory
                              may hold (poolown.c) */
  char (*groups)[KVC_MAX_NAME + 1]; /* shared caches by group - 1 (poolown.c) */
  uint32_t ngroups, groups_cap;
  struct resize *resize;   /* an online resize (poolresize.c) */
  daemon_stats_t stats;
  uv_pipe_t listener;
  char listen_path[108];   /* the socket actually served (systemd's, or cfg's) */
  bool activated;          /* listener inherited from systemd: never unlinked */
  bool listening;          /* listener open (closed when draining starts) */
  bool accept_paused;      /* out of descriptors: listener closed for a while */
  bool listener_closing;   /* its uv_close callback has not run yet */
  int listen_spare;        /* a dup of the listening socket (-1: none) */
  uv_timer_t accept_timer; /* listens again after a pause */
  bool draining;           /* SIGTERM seen: no new work, close when flushed */
  bool stopped;            /* signals and timers closed: the loop may end */
  uv_signal_t sig_term, sig_int, sig_hup;
  uv_timer_t status_timer; /* STATUS= and the eviction summary */
  uv_timer_t drain_timer;  /* ends a drain that takes too long */
  notify_t notify;         /* $NOTIFY_SOCKET */
  uint64_t seen_evicted_seqs, seen_evicted_pages, seen_full_errors; /* at last status */
  log_limit_t limit_refused;  /* budget of "refused" lines */
  log_limit_t limit_bad_frame;/* budget of "bad_frame" lines */
  uv_timer_t expire_timer; /* lapses TTL pins once a second */
  conn_t *conns;           /* every connection not yet freed (doubly linked) */
  uint32_t nconns;         /* their number (refused ones too: a socket each) */
  uint32_t nparked;        /* of them parked (conn_park) */
  uint64_t fd_base;        /* descriptors held without clients (fdbudget.c) */
  log_limit_t limit_accept;/* budget of "accept" error lines */
  uint64_t next_conn_id;   /* next conn_id to hand out; starts at 1 */
  uint32_t backlogged;     /* connections with frames waiting for a turn */
  uint64_t fg_ns;          /* when a request of a client not behind on its replies
                              last ran (uv_hrtime): the background waits while recent */
  uint64_t fg_id;          /* the connection it was */
  uint64_t fg2_ns;         /* the last such request of another connection than fg_id */
  uint64_t bg_ns;          /* when the background's share last ran a frame */
  uint64_t bg_last;        /* the connection it ran (round robin by id) */
  uint32_t nbg;            /* connections in the background (conn.c) */
  uint32_t bg_ticks;       /* ticks of bg_timer (every tenth sweeps the gone) */
  uv_timer_t bg_timer;     /* runs the background while it holds any */
  uint64_t small_ns;       /* when the last request that was not a large copy began */
  uint64_t answered_ns;    /* uv_hrtime when the last request was answered (its
                              figures' clock read, which the poll loop reuses) */
  arena_t arena;           /* scratch for building the current reply */
  tenants_t tenants;       /* tenant names seen, by id */
  uv_tcp_t http;           /* metrics_listen (http.c), when http_on */
  bool http_on;
  unsigned http_port;      /* the port it listens on (metrics_listen ...:0 picks) */
  uint32_t http_conns;     /* scrapes open now */
  uint64_t refused_conns[TENANTS_MAX + 1]; /* per tenant id: QUOTA_CONNS refusals */
  uint64_t refused_shm[TENANTS_MAX + 1];   /* per tenant id: QUOTA_SHM refusals */
} server_t;

/* listen.c. Listens on the socket systemd passed (socket activation), else
 * on cfg.socket_path: creates the parent directory, removes a stale socket
 * (one nobody listens on), binds under a umask giving at most
 * cfg.socket_mode, listens. Sets listen_path and activated. Returns 0 or -1
 * with a reason in err. */
int server_listen(server_t *srv, char *err, size_t errlen);

/* Stops accepting and removes the socket file (not systemd's). Idempotent. */
void server_unlisten(server_t *srv);

/* drain.c. Begins the graceful shutdown: stop accepting, answer what each
 * connection already sent, send it a SHUTDOWN goodbye, flush and close;
 * after drain_timeout_ms the connections left are closed. */
void server_drain(server_t *srv);

/* Called when a connection is freed; finishes the drain when none is left. */
void server_conn_gone(server_t *srv);

/* signals.c. Starts SIGTERM/SIGINT (drain, a second one exits at once) and
 * SIGHUP (reload). */
void signals_start(server_t *srv);
/* Closes the signal handles of a start that failed (the loop never ran). */
void signals_stop(server_t *srv);

/* reload.c. Reads the configuration again (file and flags) into a fresh
 * struct and swaps in its reloadable options; an invalid one keeps the
 * running configuration. Returns 0 or -1 (logged). */
int server_reload(server_t *srv);

/* status.c. Starts the status_interval_ms timer: STATUS= to systemd and a
 * log line when evictions or FULL refusals happened since the last tick. */
void status_start(server_t *srv);
/* Applies a new status_interval_ms. */
void status_reschedule(server_t *srv);
/* The live figures as one line, for STATUS= ("12 clients, ..."). */
void status_line(server_t *srv, char *buf, size_t len);

/* fdbudget.c. Counts the descriptors held without clients (once), raises
 * the soft RLIMIT_NOFILE so that max_connections fit (up to the hard limit)
 * and warns when they cannot. At start once listening, and after a reload. */
void fdbudget_adjust(server_t *srv);
/* Whether one more connection would leave too few descriptors (its socket is
 * counted in nconns already): it is then refused with CONNLIMIT. */
bool fdbudget_full(const server_t *srv);
/* Whether the doorbell of one more connection's rings fits beside them (else
 * that connection gets no rings and uses its socket). */
bool fdbudget_ring_fits(const server_t *srv);

/* tenantid.c. The engine tenant of a tenant name, registered (0: the
 * registry is full) with the identity every node gives that name, so its
 * prompts hash alike on every node (engine_tenant_identity). */
uint32_t server_tenant(server_t *srv, const char *name);
/* At start: the shared caches' namespace gets its identity. */
int server_tenant_shared(server_t *srv);

/* drain.c. Closes the signal handlers, timers and the tiers' handles so
 * the loop can end. */
void server_stop(server_t *srv);

#endif
