/* ring.h: the client's side of its connection's shared-memory rings
 * (proto/ringbuf.h has the layout; doc/protocol.md, "Rings").
 *
 * client_call packs a request as always, then either writes it to the socket
 * or puts it into the submission ring (ring_submit), ringing the doorbell only
 * if the daemon says it is not polling; ring_wait then polls the completion
 * ring for up to its spin (at most spin_us, shorter while replies keep
 * coming later than any spin allowed: a busy or shared CPU) and sleeps on
 * the futex word after that, where the daemon wakes it only if it said it
 * sleeps. Whatever the daemon
 * says on the socket meanwhile (a goodbye, a reply too large for the ring,
 * EOF) ring_wait hands to the socket path.
 */
#ifndef KVC_CLIENT_RING_H
#define KVC_CLIENT_RING_H

#include <stdbool.h>
#include <stdint.h>

#include "kvcache.pb-c.h"
#include "ringbuf.h"
#include "ringfast.h"

typedef struct kvc_client kvc_client_t;

typedef struct client_ring {
  uint8_t *map;           /* the ring area, MAP_SHARED; NULL: no rings */
  uint64_t map_bytes;
  ring_hdr_t *hdr;
  ring_view_t sq, cq;     /* sq.pos: published; cq.pos: consumed (ours alone) */
  int bell;               /* the doorbell eventfd; -1 when none */
  uint8_t *buf;           /* a reply copied out of the CQ (cq size) */
  uint64_t spin_ns;       /* how long the next wait spins: adapts below the
                             client's spin_ns (ring.c, adapt) */
  bool fast;              /* the daemon serves the fast slots (ring_hdr_t.fast) */
  uint32_t fast_seq;      /* seq of the last fast request sent (0: none yet) */
} client_ring_t;

#define RING_WAIT_SOCKET (-1000) /* ring_wait: the reply, or the daemon's word, is on the socket */

/* Maps the rings the Hello reply h grants (memfd: the buffer's, bell: the
 * doorbell, taken). 0, or KVC_E_PROTO / KVC_E_NOMEM (then no rings, bell closed). */
int ring_attach(kvc_client_t *c, int memfd, int bell, const Kvcache__V1__HelloReply *h);
/* Unmaps, closes the doorbell. */
void ring_detach(client_ring_t *r);

/* Whether requests go through the rings (attached, not closed). */
bool ring_usable(const client_ring_t *r);

/* Puts the frame (header included, as packed for the socket) into the SQ and
 * rings if the daemon sleeps: 0; 1 if it does not fit now (send it on the
 * socket); KVC_E_PROTO if the daemon's counters are impossible. */
int ring_submit(kvc_client_t *c, const uint8_t *frame, size_t len);

/* Waits for the next reply in the CQ (polling up to c->spin_ns, then
 * sleeping): its payload length, with the payload at *payload (valid until
 * the next wait); RING_WAIT_SOCKET if it is on the socket; or a negative
 * KVC_E_* code (KVC_E_TIMEOUT after timeout_ms; KVC_E_PROTO). */
int64_t ring_wait(kvc_client_t *c, const uint8_t **payload);

/* The fast slots (proto/ringfast.h): whether requests may use them (the
 * daemon serves them, the client did not opt out: KVC_CLIENT_NO_FAST). */
bool ring_fast_usable(const kvc_client_t *c);
/* Writes q into the fast request slot under the next seq and rings if the
 * daemon sleeps. One fast request is in flight at a time, and none with a
 * request on the ring or the socket. */
void ring_fast_submit(kvc_client_t *c, const ringfast_req_t *q);
/* Waits for its reply as ring_wait does: 0 and *rep; RING_WAIT_SOCKET when
 * the daemon closed the rings first; or a negative KVC_E_* code. */
int ring_fast_wait(kvc_client_t *c, ringfast_rep_t *rep);

#endif
