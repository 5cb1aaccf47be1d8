/* fuzz_daemon.h: the daemon's dispatch layer in process, without sockets or
 * an event loop, for the fuzzers and their replay tests.
 *
 * fake_conn.c stands in for daemon/net/conn.c: replies are packed, decoded again
 * and counted instead of written; closing a connection does what conn_close
 * does to the engine (unpin everything of its owner, unmap its buffer). A
 * fuzz server has a small pool, so eviction and FULL are reached quickly.
 *
 *   input bytes --frame_parse--> payload --dispatch_frame--> handler --> engine
 *                                                   \--> conn_send (fake): reply checked
 */
#ifndef KVC_FUZZ_DAEMON_H
#define KVC_FUZZ_DAEMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "conn.h"
#include "dispatch.h"
#include "frame.h"
#include "ringfast.h"
#include "server.h"

#define FZ_MAX_FRAME 8192u /* max_frame_bytes of a fuzz server */

/* What the fake connection layer saw since fz_conn_open. */
typedef struct fz_seen {
  uint64_t replies;          /* Responses sent */
  uint64_t last_id;          /* id of the last one */
  int last_status;           /* its status */
  uint64_t fds;              /* fds attached (Hello replies) */
  uint64_t fast_replies;     /* of the replies, those to fast requests */
  uint32_t fast_seq;         /* the last fast request's seq (fz_conn_fast) */
  char last_error[256];      /* the last reply's message */
  uint64_t last_lease_id;    /* the last reply's lease, if it was one */
  uint32_t last_npages;
  uint64_t last_pages[8];    /* its pages' offsets (the first 8) */
} fz_seen_t;

/* Creates the server: config defaults made small, an engine over a heap
 * pool of npages pages of page_bytes. Aborts on failure (a harness bug). */
void fz_server_init(server_t *srv, uint64_t npages, uint64_t page_bytes);
/* Frees the engine and the pool; checks the arena and stats gauges. */
void fz_server_deinit(server_t *srv);

/* A fresh connection of srv (calloc'd; its read buffer holds two frames). */
conn_t *fz_conn_open(server_t *srv);
/* Closes it if open, then frees it. */
void fz_conn_free(conn_t *c);
/* Appends bytes to c's read buffer (as much as fits) and runs every complete
 * frame, as conn.c's read callback does; an oversized frame closes c. */
void fz_conn_feed(conn_t *c, const uint8_t *p, size_t n);
/* Queues a framed copy of payload and runs it. */
void fz_conn_frame(conn_t *c, const uint8_t *payload, size_t n);

/* Runs a fast request (ringfast.h) whose slot body is p (zero-padded or cut
 * to RING_FAST_BODY bytes) on c, as conn.c's run_ring would, if c said
 * Hello (a client has the slots only then); then the engine audit. */
void fz_conn_fast(conn_t *c, const uint8_t *p, size_t n);
/* The fixed state of fuzz_msg and fuzz_fast, through c: Hello, cache 0 ("f",
 * fuzz_seed.h), sequence 1 of 8 tokens, 2 of 3 (pinned), 3 of 8 with token
 * ids 1..8; the buffer's seed regions filled. Aborts if it does not build. */
void fz_seed_state(conn_t *c);

fz_seen_t *fz_seen(conn_t *c);
/* The pool bytes of the current fuzz server. */
uint8_t *fz_pool(void);

/* Aborts with a message unless engine_audit passes. */
void fz_audit(server_t *srv, const char *where);
/* kvcached memfds the process holds now (every one is closed once its
 * connection is). */
int fz_count_memfds(void);

#endif
