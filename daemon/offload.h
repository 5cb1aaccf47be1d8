/* offload.h: large gets and puts copied on libuv's thread pool instead of
 * the loop (doc/offload.md).
 *
 * A get of at least offload_bytes is begun on the loop (engine_get_begin:
 * validated, counted, its pages referenced), copied by a pool thread
 * (engine_get_run: only memcpy out of those pages into the connection's
 * shared buffer) and finished on the loop (engine_get_end, the reply). While
 * it runs, its connection runs no other request (replies stay in order) and
 * keeps its buffer mapped even if it closes; other connections go on.
 *
 *   loop:   decode -> check -> engine_get_begin -> uv_queue_work --.
 *   pool:                                       engine_get_run <--'
 *   loop:   after_work: engine_get_end -> reply -> next request of the connection
 */
#ifndef KVCD_OFFLOAD_H
#define KVCD_OFFLOAD_H

#include <stdbool.h>
#include <stdint.h>

#include "conn.h"
#include "engine.h"

/* Takes job (begun for request id of c) and queues its copy: returns true,
 * and the reply is sent when the copy is done. If it cannot be queued, the
 * copy runs here and it returns false: the caller replies as for any get. */
bool offload_get(conn_t *c, engine_get_job_t *job, uint64_t request_id, uint64_t t0_ns);

/* The same for a put begun with engine_put_begin: its sequences are busy
 * until the copy is done; requests of other connections that need them are
 * parked meanwhile (dispatch_unpark runs them again at the end). */
bool offload_put(conn_t *c, engine_put_job_t *job, uint64_t request_id, uint64_t t0_ns);

#endif
