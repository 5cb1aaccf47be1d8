/* ring.h: the daemon's side of a connection's shared-memory rings
 * (proto/ringbuf.h has the layout): the mapping, the doorbell, replies into the
 * completion ring, and the poller.
 *
 * The rings are a transport, not a second protocol: the frames in the
 * submission ring are the same framed Requests the socket carries, and
 * conn.c runs them through the same dispatch (the same validation, tenant
 * checks, quotas, budgets per turn and parking). Only where a request comes
 * from and where its reply goes differ.
 *
 * The poller. After the daemon publishes a reply into a connection's CQ, it
 * keeps polling that connection's SQ for a while (its budget) before it lets
 * the loop sleep; a request that arrives meanwhile costs no wakeup on either
 * side. A ring not polled has sq_wakeup set, and its client writes the
 * doorbell (an eventfd in the loop) after publishing. The budget adapts per
 * connection, within ring_poll_us (the cap, reloadable; 0: never poll):
 *
 *   request found while polling              keep the budget
 *   request came by the doorbell, after g    g <= cap: budget = max(2 x budget, 1.25 g)
 *                                            g  > cap, the 3rd time in a row: budget / 2
 *                                            (polling cannot help; once is a pause
 *                                            between bursts)
 *   the poll loop was preempted (> 50 us     every budget / 2, and the loop sleeps:
 *   between two looks: the CPU is wanted)    the daemon never spins against its clients
 *   copies in flight could fill every CPU    the loop sleeps: it would spin on a CPU
 *   the daemon may use (two or more)         its own copy threads need
 *
 * so a client whose next request comes within the cap after each reply is
 * served without wakeups, one that thinks longer costs no polling at all
 * after a few requests, and an idle daemon polls nothing (the loop's idle
 * handle runs only while some ring is polled). The poll loop returns to the
 * event loop every 30 us (after a request that ran past that, at once), so
 * sockets, timers and copy completions are served meanwhile; between, a
 * client's next request is caught as soon as it is written (while the event
 * stream runs, after a request that changed the index the loop gets its turn:
 * a turn is a batch). The histogram ring_poll_seconds sums the
 * time spent polling without finding work.
 */
#ifndef KVCD_RING_H
#define KVCD_RING_H

#include <stdbool.h>
#include <stdint.h>

#include "conn.h"
#include "kvcache.pb-c.h"
#include "ringfast.h"
#include "server.h"

typedef struct ring ring_t;

/* Runs the request frames waiting in c's SQ, within one turn's budget
 * (conn.c) counted from now_ns (uv_hrtime, just read); returns whether it
 * ran any. The poller calls it. */
typedef bool (*ring_run_fn)(conn_t *c, uint64_t now_ns);

/* The poller of srv (its idle handle); run is how it runs a connection's
 * frames. Returns 0 or -1 (out of memory). */
int ring_poller_start(server_t *srv, ring_run_fn run);
/* Closes the idle handle (after the loop ran out of work; the loop must run
 * once more to finish closing it) and frees the poller. */
void ring_poller_stop(server_t *srv);

/* Runs the requests waiting in polled rings now, from inside a socket
 * connection's turn (conn.c, between two of its frames): a request through a
 * ring then waits for at most one socket frame, not for the loop's pass over
 * every readable socket (a pipelining flood's share of each turn). Does
 * nothing inside a pass over the rings. Whether any ran. */
bool ring_preempt(server_t *srv);

/* The ring sizes this daemon grants: an SQ holding two of the largest
 * request frames (one in flight and the next), a CQ of 64 KiB. */
void ring_sizes(const server_t *srv, uint32_t *sq_bytes, uint32_t *cq_bytes);

/* At Hello: maps [off, off + ring_area_bytes) of fd (the buffer's memfd,
 * sized for it), writes the header, creates the doorbell and watches it.
 * Returns new *out, or -1 with the reason in err (nothing is left). */
int ring_open(conn_t *c, int fd, uint64_t off, uint32_t sq_bytes, uint32_t cq_bytes,
              ring_t **out, char *err, size_t errlen);

/* The doorbell eventfd, passed to the client with the Hello reply (borrowed). */
int ring_doorbell(const ring_t *r);

/* The connection closes: sets closed and wakes the client (it then reads
 * the socket: a goodbye or EOF), stops polling; the mapping and the doorbell
 * go once libuv has closed the doorbell's handle. Accepts NULL. */
void ring_close(ring_t *r);

/* A loop turn begins to run r's requests: the requests published after
 * this wait for the next turn (ring_next with this_turn), as a socket's next
 * read does, so that what runs between turns (other connections, timers,
 * the event stream's batch) sees one synchronous client's requests one turn
 * each. */
void ring_turn_begin(ring_t *r);

/* The next request in the SQ (published by the turn's beginning, if
 * this_turn), if the CQ has room for its reply's place: copies its payload
 * into the poller's scratch, sets *payload and *len and returns 1, without
 * consuming it; 0 if there is none (or no room); -1 if the client broke the
 * ring (the caller closes the connection). */
int ring_next(ring_t *r, const uint8_t **payload, uint32_t *len, bool this_turn);
/* Consumes the frame ring_next gave (it ran, or was refused). */
void ring_consume(ring_t *r, uint32_t len);

/* Puts resp into the CQ and wakes the client if it sleeps: 0; or 1 when it
 * does not fit, or is NULL (a reply with descriptors), and a RING_ON_SOCKET
 * marker takes its place (the caller sends it on the socket); -1 if the
 * client broke the ring. Starts polling the SQ for the connection's budget. */
int ring_reply(ring_t *r, const Kvcache__V1__Response *resp);

/* c may run requests again (it was parked, offloaded or paused): polls its
 * SQ if a request waits there. */
void ring_kick(ring_t *r);

/* The fast slots (proto/ringfast.h). The request in the slot if one is new:
 * copies its body out, sets *seq and returns 1, without consuming it; else
 * 0. */
int ring_fast_next(ring_t *r, uint8_t body[RING_FAST_BODY], uint32_t *seq);
/* Consumes the fast request seq (it ran, or was refused). */
void ring_fast_consume(ring_t *r, uint32_t seq);
/* Writes the reply to the fast request ring_fast_next gave, wakes the
 * client if it sleeps, and starts polling for the connection's budget as
 * ring_reply does: 0. */
int ring_fast_reply(ring_t *r, const ringfast_rep_t *p);

#endif
