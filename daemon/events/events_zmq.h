/* events_zmq.h: the ZeroMQ side of the event stream (doc/events.md): the
 * publishing socket, the replay socket and the batches kept for replay.
 *
 *   publish: [topic, seq (8 bytes, big-endian), payload]     XPUB, bound
 *   replay:  [identity, "", start_seq (8 bytes BE)]  ->       ROUTER, bound
 *            [identity, "", seq, payload] for each kept batch from start_seq,
 *            then [identity, "", -1 (8 bytes of 0xff), ""]
 *
 * as vLLM's ZmqEventPublisher sends them. Nothing here blocks the loop:
 * sends are ZMQ_DONTWAIT, and both sockets are serviced from their ZMQ_FD
 * in a uv_poll (edge-triggered: drained until ZMQ_EVENTS has no POLLIN,
 * after every send as well). A subscriber whose queue holds events_hwm
 * messages misses batches: it sees the gap in the sequence numbers, the
 * daemon counts the stall (events_slow_drops: once a stall, as libzmq reports
 * a full queue, not once a missed batch) and the others are not slowed.
 */
#ifndef KVCD_EVENTS_ZMQ_H
#define KVCD_EVENTS_ZMQ_H

#include <stddef.h>
#include <stdint.h>

#include "server.h"

typedef struct zpub zpub_t;

/* Binds cfg.events_endpoint (and cfg.events_replay_endpoint when set) and
 * starts servicing them on srv's loop. Returns new *out, or -1 with err. */
int zpub_open(server_t *srv, zpub_t **out, char *err, size_t errlen);

/* Publishes one batch's payload under the next sequence number (the first
 * is 0) and keeps it for replay (cfg.events_buffer batches, 64 MiB at most).
 * Returns 0, or -1 when it could not be sent to anyone (logged; the sequence
 * number is used all the same, so subscribers see the gap). */
int zpub_publish(zpub_t *z, const void *payload, size_t len);

/* The subscriptions to the stream's topic that arrived since the last call
 * (read from the socket first): subscribers that will get the next batch. */
uint32_t zpub_take_joins(zpub_t *z);

/* Stops servicing, closes both sockets and the context, frees z. NULL is
 * accepted. */
void zpub_close(zpub_t *z);

#endif
