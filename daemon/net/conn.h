/* conn.h: one client connection: its libuv pipe, framing, read buffer, write
 * queue and shared buffer.
 *
 * A connection reads into its own buffer (one max frame and a bit more),
 * runs complete frames until frames_per_turn of them, turn_bytes of bytes
 * moved or turn_us of time are spent in one loop turn (at least one; the rest
 * wait for a uv_idle callback, after every other connection's turn, so one
 * busy client cannot starve the others) and stops reading while more than
 * write_queue_bytes of replies are pending.
 * A frame that has started must be complete within frame_timeout_ms, and the
 * Hello must arrive within it after accept (slowloris clients are closed).
 * However it closes, its pins are released at once and its buffer unmapped.
 *
 * Its life is c->state, changed only by conn_enter (one switch):
 *
 *   accept -> [peer check] -> NEW --Hello--> READY --EOF, drain, Hello refused--> FLUSHING
 *                  |                 |  \                                           |
 *                  |                 |   \--I/O error, bad frame, timeout--+        | flushed
 *                  |                 +--------------------------------------+--> CLOSED -> freed
 *                  \--refused: one Response --------------------> FLUSHING        (handles closed,
 *                                                                                 pool copy done)
 *
 *   NEW       accepted; only a Hello runs, and it must come within frame_timeout_ms
 *   READY     greeted: requests run (a budget per loop turn)
 *   FLUSHING  no request runs; queued replies are written (uv_shutdown), then CLOSED
 *   CLOSED    uv_close called, pins and leases released; freed once its three
 *             handles are closed and no pool thread copies into its buffer
 *
 * Requests arrive through the socket or, once it asked for them in its
 * Hello, through the submission ring in its buffer (ring.h); both run here,
 * through the same dispatch and budgets, one at a time, each in its own order
 * (the order between the two is the client's to keep: libkvcache has one
 * request in flight). A reply goes back the way its request came.
 *
 * Beside the state, a few orthogonal facts: offloaded (a get of it copies on
 * the thread pool; what is asked meanwhile waits in after_offload), greeted
 * (it said Hello: its close releases and logs pins and leases), counted (in
 * connections_current), eof (the peer half-closed), and which libuv
 * activities run: reading (uv_read_start), paused (over write_queue_bytes);
 * the idle and deadline handles answer uv_is_active themselves.
 */
#ifndef KVCD_CONN_H
#define KVCD_CONN_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "kvcache.pb-c.h"
#include "layout.h"
#include "ringfast.h"
#include "server.h"
#include "shm.h"
#include "tier.h"

enum conn_state {
  CONN_NEW,      /* accepted, waiting for its Hello */
  CONN_READY,    /* greeted: requests run */
  CONN_FLUSHING, /* runs nothing more; flushes its replies, then closes */
  CONN_CLOSED,   /* uv_close called; freed when its handles are closed */
};

/* How a request came, and so where its reply goes. */
enum conn_via {
  VIA_SOCKET, /* a frame on the socket: the reply too */
  VIA_RING,   /* a record in the submission ring: the reply into the CQ */
  VIA_FAST,   /* the fast request slot (ring.h): the reply into the fast reply slot */
};

/* What waits for an offloaded get to finish (conn_resume runs it). */
enum conn_after_offload {
  AFTER_OFFLOAD_RESUME, /* carry on: schedule reading and running */
  AFTER_OFFLOAD_FLUSH,  /* answer what is buffered, then flush and close */
  AFTER_OFFLOAD_DRAIN,  /* the daemon drains: conn_drain */
};

struct conn {
  server_t *srv;
  uv_pipe_t pipe;
  uv_idle_t idle;            /* runs buffered frames on the next turns */
  uv_timer_t deadline;       /* frame_timeout_ms: a started frame (or the
                                Hello) must arrive whole before it fires */
  uv_shutdown_t shutdown_req;
  conn_t *prev, *next;       /* srv->conns */
  uint64_t id;               /* conn_id: pin owner, unique, never 0 */
  pid_t pid;                 /* peer credentials (SO_PEERCRED) */
  uid_t uid;
  gid_t gid;
  uint32_t tenant;           /* engine tenant id of its caches (tenant.h) */
  bool admin;                /* sees and may act on every tenant */
  bool pool_mapped;          /* gets the pool's read-only mapping (doc/security.md) */
  uint64_t *mapped;          /* arenas: per segment, the memfd id it was given (0: none) */
  uint32_t nmapped;
  uint64_t revoked_bytes;    /* of segments given fresh memory it may still map */
  uint8_t *rbuf;             /* read buffer */
  size_t rlen, rcap;         /* bytes held, capacity */
  size_t roff;               /* bytes at its front already run: moved down only
                                when no whole frame is left (one turn's frames
                                cost no memmove of the rest) */
  uint32_t max_frame;        /* max_frame_bytes at accept */
  uint64_t wq_bytes;         /* bytes the replies queued to libuv hold (frames
                                and their write requests), not yet written,
                                and the tail's */
  struct wreq *tail;         /* small replies gathered while writes are queued */
  uint32_t nwrites;          /* write requests queued to libuv */
  uint64_t turn_bytes;       /* bytes its requests moved in this loop turn
                                (dispatch adds, run_frames resets) */
  uint32_t nleases;          /* zero-copy read leases this connection holds */
  struct xfer_memo {         /* its last transfer resolved (dispatch.c): a loop of
                                puts or gets resolves its transfer once */
    uint32_t cache_id;
    const kvc_layout_t *layout; /* the cache's, as engine_cache_layout gave it */
    kvc_xfer_t x;
    bool is_put, ok;
    layout_xfer_t g;
  } xfer_memo;
  struct events_sub *sub;    /* subscribed to the event stream (events.c), or NULL */
  struct owned { uint32_t cache_id; uint64_t seq_id; } *owned; /* dropped at close */
  uint32_t nowned, owned_cap;
  enum conn_state state;     /* where it is in its life (above) */
  enum conn_after_offload after_offload; /* asked while offloaded */
  char flush_reason[64];     /* the reason of AFTER_OFFLOAD_FLUSH */
  shm_region_t shm;          /* the shared buffer (after Hello) */
  struct ring *ring;         /* its shared-memory rings (ring.h), if it asked for them */
  enum conn_via via;         /* how the request running (or offloaded, or parked)
                                came: its reply goes back that way */
  bool offloaded;            /* a get or put copies on the thread pool: no
                                other request runs, the buffer stays mapped */
  bool parked;               /* the one flag of a request that waits: it runs
                                again, from the start, when what it waits on
                                ends: a sequence another connection's put
                                holds busy (a put ends: conn_unpark_all), or
                                the tiers of tw.pending (tiers_done) */
  tier_wait_t tw;            /* its request's walk of the tiers (tier.h) */
  bool greeted;              /* said Hello (stays set through FLUSHING, CLOSED) */
  bool counted;              /* counted in connections_current */
  bool eof;                  /* the peer closed its side; never read again */
  bool reading;              /* uv_read_start in effect */
  bool backlog;              /* frames buffered, waiting for a turn (idle runs) */
  bool paused;               /* over write_queue_bytes: not reading or running */
  bool sent;                 /* bytes written to its socket since it was last seen
                                empty (behind(): its client may not have read them) */
  bool bg;                   /* behind on its replies while clients that read
                                theirs are busy: its requests wait in the
                                background (conn.c; srv->nbg counts it) */
  bool bg_pass;              /* the background's share: one frame may run */
  int open_handles;          /* handles not yet through their close callback */
  char name[48];             /* client_name from Hello, for logs */
  uint64_t requests;         /* requests run (kvcachectl clients) */
  uint64_t accepted_ms;      /* uv_now at accept */
  uint64_t last_ms;          /* uv_now at its last request */
};

/* Whether the peer may run the operator's requests (clients, config and the
 * admin writes: drop, remove, unpin, disconnect). For now root and the
 * daemon's own uid; the tenant model widens it (admin_uids, admin_gids). */
bool conn_is_admin(const conn_t *c);

/* The tenant of a connection, as the clients listing and labels show it
 * ("": no tenant model yet). */
const char *conn_tenant(const conn_t *c);

/* How long a connection that holds nothing may live and still count as brief:
 * its connect and disconnect are logged at debug, and it is counted in
 * connections_brief (a scrape every 15 s would otherwise log two lines each). */
#define CONN_BRIEF_MS 10000u

/* Accepts a pending connection of srv->listener, checks the peer and either
 * starts reading or refuses it (PERM, CONNLIMIT, SHUTDOWN). */
void conn_accept(server_t *srv);

/* Sends resp back the way its request came (c->via): packs it into a frame
 * and queues it, or puts it into the CQ, or, for a fast request, writes it
 * into the fast reply slot. Returns 0 or a negative code (the connection is
 * then closed). */
int conn_send(conn_t *c, const Kvcache__V1__Response *resp);

/* Sends the reply of the fast request running (c->via is VIA_FAST) into
 * the fast reply slot: 0, or a negative code (the connection is then
 * closed). */
int conn_send_fast(conn_t *c, const ringfast_rep_t *p);

/* Sends resp with nfds (1 to POOLMAP_FDS_MAX) descriptors passed along
 * (one SCM_RIGHTS message) on the raw socket; only while the write queue is
 * empty (the handshake; a synchronous client's PoolMap). Returns 0 or a
 * negative code. */
int conn_send_fds(conn_t *c, const Kvcache__V1__Response *resp, const int *fds, int nfds);

/* Sequences owned by c (SeqCreate with owned): room for n more (0, or -1
 * out of memory), then one noted. conn.c drops them when c closes. */
int conn_own_reserve(conn_t *c, uint32_t n);
void conn_own(conn_t *c, uint32_t cache_id, uint64_t seq_id);

/* Parks c: the frame at the head of its buffer (or ring) stays there, and
 * nothing runs until what it waits on ends: with c->tw.pending, the tiers'
 * lookups (conn_tier_done), else a busy sequence (conn_unpark_all). */
void conn_park(conn_t *c);
/* Runs the parked connections of srv again (a put ended); those waiting
 * on a tier stay parked (srv->up.seqs_free). */
void conn_unpark_all(server_t *srv);
/* The one resume of a request that waited on a tier (srv->up.resume, which
 * tiers_done calls): conn_id's wait on tier idx ended; with no other
 * pending, its request runs again. */
void conn_tier_done(server_t *srv, uint64_t conn_id, unsigned idx);

/* READY: the Hello was accepted (dispatch). */
void conn_greeted(conn_t *c);

/* Stops running requests, flushes queued replies, then closes. */
void conn_close_after_flush(conn_t *c, const char *reason);

/* Closes now (pending writes are dropped). reason goes to the log. */
void conn_close(conn_t *c, const char *reason);

/* A get of c is being copied off the loop (offload.c): c runs nothing else
 * and keeps its buffer until conn_offload_end. */
void conn_offload_begin(conn_t *c);
/* The copy is done: returns false if c was closed meanwhile (then it is
 * freed here and must not be used), else true (reply, then conn_resume). */
bool conn_offload_end(conn_t *c);
/* Runs what waited for the offloaded request (buffered frames, a pending
 * close after flush). */
void conn_resume(conn_t *c);
/* An offloaded copy of c's request ended (srv->up.copied): conn_offload_end,
 * the OK reply, conn_resume. */
void conn_copied(conn_t *c, uint64_t request_id);

/* Closes the connections idle past idle_timeout_ms (the expire timer);
 * returns how many. */
size_t conn_idle_sweep(server_t *srv);

/* Runs every complete buffered frame and every request waiting in the
 * submission ring, ignoring the per-turn bound (drain). */
void conn_run_all(conn_t *c);

/* Runs the requests waiting in c's submission ring and fast slot, one
 * turn's budget from now_ns (uv_hrtime, just read); returns whether it ran
 * any (the ring poller's ring_run_fn). */
bool conn_run_ring(conn_t *c, uint64_t now_ns);

/* The drain of one connection: answers every complete request the client has
 * sent (what is buffered and what is still in the socket, up to write
 * backpressure), queues the goodbye (a Response with id 0 and status
 * SHUTDOWN), flushes and closes. */
void conn_drain(conn_t *c);

#endif
