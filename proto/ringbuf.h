/* ringbuf.h: the layout of a connection's shared-memory rings and the byte-ring
 * operations both sides link (doc/protocol.md, "Rings").
 *
 * A connection that asked for rings in its Hello gets, in the same memfd as
 * its shared buffer and right after it, a header page and two byte rings: the
 * submission ring (SQ: the client writes request frames, the daemon reads)
 * and the completion ring (CQ: the daemon writes reply frames, the client
 * reads). A record is a frame exactly as on the socket (a 4-byte LE length,
 * then the packed message), stored at its byte position modulo the ring's
 * size, so a record may wrap around the end. A CQ record whose length is
 * RING_ON_SOCKET carries no payload: that reply was too large for the ring
 * and comes on the socket instead, in its place in the order.
 *
 *   memfd:  [ shared buffer: shm_bytes ][ header: 4 KiB ][ SQ: sq_bytes ][ CQ: cq_bytes ]
 *                                        ^ ring_off
 *
 * The header page also holds the fast slots (fast is RING_FAST_VERSION): a
 * request line the client writes and a reply line the daemon writes, each
 * one cache line whose first word, written last, says a new one is there.
 * They carry the hot requests (a put, get or lease of one small run) as
 * fixed little-endian structs (proto/ringfast.h): a round trip then moves
 * one line each way, where a ring record moves its counter's line and the
 * record's.
 *
 *   header:  0 setup | 64 client line | 128 daemon line | ... |
 *            1024 fast request (64) | ... | 2048 fast reply (64 + 320) | ...
 *
 *   SQ:  ....[len|request][len|req....uest]....      head <= tail, tail - head <= size
 *            ^ sq_head (daemon)              ^ sq_tail (client)
 *
 * Positions are u64 byte counts that only grow; each side writes only its
 * own counters and reads the other's, and never trusts them: a counter that
 * puts more than a ring's size in flight is a protocol error (the daemon
 * closes the connection). Whoever sleeps says so in the header, and the
 * other side wakes it only then: the daemon clears sq_wakeup while it polls
 * the SQ (else the client writes the connection's doorbell eventfd after
 * publishing), the client sets client_waiting before it sleeps on the futex
 * word cq_seq (else the daemon does not call FUTEX_WAKE). Each side stores
 * its flag, then (seq_cst) loads the other's counter, and the other stores
 * its counter, then (seq_cst) loads the flag: one of the two always sees the
 * other, so no wakeup is lost.
 *
 * Pure functions over memory: no I/O, no allocation, no system call.
 */
#ifndef KVC_PROTO_RINGBUF_H
#define KVC_PROTO_RINGBUF_H

#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RING_MAGIC 0x6b766372u  /* "kvcr" */
#define RING_VERSION 1u
#define RING_HDR_BYTES 4096u    /* the header's page */
#define RING_ON_SOCKET 0xffffffffu /* a CQ record: this reply comes on the socket */
#define RING_FAST_VERSION 1u       /* ring_hdr_t.fast: the fast slots are served */
#define RING_FAST_BODY 60u         /* bytes of a fast slot's line after its seq */
#define RING_FAST_MORE 320u        /* bytes of the reply slot past its first line */

/* A fast slot: seq, then the struct (proto/ringfast.h). The writer fills
 * body (and more), then stores seq (seq_cst); the reader sees a new seq with
 * acquire and then reads the rest. */
typedef struct ring_fast_req {
  _Atomic uint32_t seq;              /* client: this request's number (never 0) */
  uint8_t body[RING_FAST_BODY];
} ring_fast_req_t;

typedef struct ring_fast_rep {
  _Atomic uint32_t seq;              /* daemon: the seq of the request answered */
  uint8_t body[RING_FAST_BODY];
  uint8_t more[RING_FAST_MORE];      /* written only when needed: an error's
                                        message and figures, a lease's pages past
                                        the third */
} ring_fast_rep_t;

/* The header page. Client-written and daemon-written fields sit on separate
 * cache lines, so that each side's polling reads a line only the other
 * writes. */
typedef struct ring_hdr {
  uint32_t magic, version;          /* RING_MAGIC, RING_VERSION (daemon, at setup) */
  uint32_t sq_bytes, cq_bytes;      /* ring sizes, powers of two (daemon, at setup) */
  uint32_t fast;                    /* RING_FAST_VERSION: the fast slots are served;
                                       0: not (daemon, at setup) */
  alignas(64) _Atomic uint64_t sq_tail;  /* client: SQ bytes published */
  _Atomic uint64_t cq_head;              /* client: CQ bytes consumed */
  _Atomic uint32_t client_waiting;       /* client: 1 while it sleeps on cq_seq */
  alignas(64) _Atomic uint64_t sq_head;  /* daemon: SQ bytes consumed */
  _Atomic uint64_t cq_tail;              /* daemon: CQ bytes published */
  _Atomic uint32_t cq_seq;               /* daemon: bumped at each publication and at
                                            close; the client's futex word */
  _Atomic uint32_t sq_wakeup;            /* daemon: 1 while it does not poll the SQ:
                                            ring the doorbell after publishing */
  _Atomic uint32_t cq_full;              /* daemon: 1 while a request waits for CQ
                                            room: ring the doorbell after reading */
  _Atomic uint32_t closed;               /* daemon: nothing more comes through the
                                            rings; look at the socket */
  /* Apart from the lines above and from each other (the adjacent-line
   * prefetcher pairs lines by 128 bytes). */
  alignas(1024) ring_fast_req_t fast_req; /* client: one fast request */
  alignas(1024) ring_fast_rep_t fast_rep; /* daemon: its reply */
} ring_hdr_t;

_Static_assert(sizeof(ring_hdr_t) <= RING_HDR_BYTES, "ring header fits its page");
_Static_assert(offsetof(ring_hdr_t, fast_req) == 1024 && offsetof(ring_hdr_t, fast_rep) == 2048 &&
                   sizeof(ring_fast_req_t) == 64,
               "the fast slots sit where doc/protocol.md says");

/* One side's view of one ring: where its bytes are, and the counter this
 * side owns (kept privately; the shared copy is only published). */
typedef struct ring_view {
  uint8_t *data;      /* the ring's bytes */
  uint32_t size;      /* bytes, a power of two */
  uint64_t pos;       /* producer: next byte to write; consumer: next to read */
} ring_view_t;

enum ring_status {
  RING_EMPTY = 0,   /* no complete record */
  RING_OK = 1,      /* a complete record at pos */
  RING_BAD = -1,    /* the other side's counter or a length is impossible */
};

/* Bytes of the whole ring area (header and both rings). */
static inline uint64_t ringbuf_area_bytes(uint32_t sq_bytes, uint32_t cq_bytes) {
  return (uint64_t)RING_HDR_BYTES + sq_bytes + cq_bytes;
}

/* The smallest power of two >= n (n <= 2^31). */
uint32_t ringbuf_pow2(uint32_t n);

/* Whether sizes are acceptable: powers of two of at least 4 KiB and at most
 * 64 MiB each. */
bool ringbuf_sizes_ok(uint32_t sq_bytes, uint32_t cq_bytes);

/* Writes a fresh header (the daemon, before the client maps it): counters 0,
 * sq_wakeup 1 (nobody polls yet), the fast slots served and empty (seq 0). */
void ringbuf_hdr_init(ring_hdr_t *h, uint32_t sq_bytes, uint32_t cq_bytes);

/* Consumer: looks at the record at v->pos given the producer's published
 * tail. Sets *len to its payload length (or RING_ON_SOCKET, allowed only if
 * on_socket_ok) and returns RING_OK; RING_EMPTY if no whole record is
 * published; RING_BAD if tail - pos exceeds the size, or the length exceeds
 * max_payload or the bytes published. */
int ringbuf_peek(const ring_view_t *v, uint64_t tail, uint32_t max_payload, bool on_socket_ok,
              uint32_t *len);

/* Consumer: copies len payload bytes of the record at v->pos into out and
 * moves v->pos past the record (the caller publishes it). */
void ringbuf_take(ring_view_t *v, uint32_t len, void *out);

/* Consumer: moves v->pos past a record of payload len without copying. */
void ringbuf_skip(ring_view_t *v, uint32_t len);

/* Producer: bytes free given the consumer's published head, or -1 if head
 * is impossible (ahead of pos, or more than a ring behind). */
int64_t ringbuf_room(const ring_view_t *v, uint64_t head);

/* Producer: writes one record (header and len payload bytes, or a
 * RING_ON_SOCKET marker when payload is NULL) at v->pos and moves v->pos
 * past it. The caller checked ringbuf_room >= 4 + len, and publishes. */
void ringbuf_put(ring_view_t *v, const void *payload, uint32_t len);

#endif
