/* events.h: the daemon's stream of prefix-index changes (doc/events.md).
 *
 * Once per loop turn (a uv_check handle, after the turn's I/O) the engine's
 * log of changes is drained into one batch for the ZeroMQ stream (vLLM's
 * KV events: events_wire.c, events_zmq.c) and one for each connection that
 * subscribed on the daemon's socket (Subscribe), each cut to the caches its
 * reader may see (doc/security.md): the ZeroMQ stream to events_tenant's,
 * a connection to its tenant's (an admin's: every tenant's). Off, nothing
 * runs: the engine's log is on only while the ZeroMQ stream is configured
 * or a connection subscribes.
 */
#ifndef KVCD_EVENTS_H
#define KVCD_EVENTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "conn.h"
#include "server.h"

/* Sets up srv->events and, with events_endpoint set, the ZeroMQ stream.
 * Returns 0, or -1 with a reason in err. */
int events_init(server_t *srv, char *err, size_t errlen);

/* Closes the loop handles and the ZeroMQ sockets (server_stop). */
void events_stop(server_t *srv);

/* Frees what is left once the loop ended. */
void events_free(server_t *srv);

/* Makes c a subscriber: each later batch with events of caches it may see
 * (of the cache named `cache` only, unless empty) is pushed as a Response
 * with id req_id. Returns 0, or a KVC_E_* code with a reason in err
 * (NOTRUNNING without events_init, NOMEM). */
int events_subscribe(conn_t *c, uint64_t req_id, const char *cache, bool token_ids, char *err,
                     size_t errlen);

/* c closes: it is a subscriber no more. */
void events_unsubscribe(conn_t *c);

#endif
