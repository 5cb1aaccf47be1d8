/* offload.h: large gets and puts copied on the daemon's copy threads
 * instead of the loop (doc/offload.md).
 *
 * A get or put of at least offload_bytes is begun on the loop
 * (engine_get_begin / engine_put_begin: validated, room made, pages
 * referenced or made its own), copied by a copy thread (engine_*_run: only
 * memcpy between those pages and the connection's shared buffer) and ended
 * on the loop (engine_*_end, the reply). While it runs, its connection runs
 * no other request (replies stay in order) and keeps its buffer mapped even
 * if it closes; other connections go on.
 *
 *   loop:   decode -> check -> engine_*_begin -> queue --.
 *   threads:                 engine_*_run_part (a share each) <--' -> done stack, eventfd
 *   loop:   on_done: engine_*_end -> reply -> next request of the connection
 */
#ifndef KVCD_OFFLOAD_H
#define KVCD_OFFLOAD_H

#include <stdbool.h>
#include <stdint.h>

#include "conn.h"
#include "engine.h"

/* The copy threads (offload_threads of them; 0: as many as work_cpus).
 * Returns 0, or -1 with err (the caller then calls offload_stop). */
int offload_start(server_t *srv, unsigned nthreads, char *err, size_t errlen);
/* After the loop ran out of work: joins the threads, closes the poll handle
 * (the loop must run once more to finish closing it). */
void offload_stop(server_t *srv);
/* Copy threads running (kvcachectl config, stats). */
unsigned offload_threads(const server_t *srv);

/* Takes job (begun for request id of c) and queues its copy: returns true,
 * and the reply is sent when the copy is done. If it cannot be queued, the
 * copy runs here and it returns false: the caller replies as for any get. */
bool offload_get(conn_t *c, engine_get_job_t *job, uint64_t bytes, uint64_t request_id,
                 uint64_t t0_ns);

/* The same for a put begun with engine_put_begin: its sequences are busy
 * until the copy is done; requests of other connections that need them are
 * parked meanwhile (conn_unpark_all, through srv->up.seqs_free, runs them
 * again at the end). */
bool offload_put(conn_t *c, engine_put_job_t *job, uint64_t bytes, uint64_t request_id,
                 uint64_t t0_ns);

/* Copies a job begun for a client alone (get or put) now, its shares on
 * the loop and the copy threads at once, and returns true once every byte
 * is copied (the caller ends it); false, having copied nothing, where
 * splitting gains nothing (fewer than two copy threads, a small copy). */
bool offload_run_here(server_t *srv, engine_get_job_t *get, engine_put_job_t *put,
                      uint64_t bytes);

/* Ends the copies the threads finished, if any (returns whether there were):
 * the ring poller looks here on each pass, so a copy's reply does not wait
 * for the loop's next look at the threads' eventfd. */
bool offload_reap(server_t *srv);

/* Whether no request but large copies began within offload_quiet_us of
 * now_ns (uv_hrtime): nobody waits behind the loop, so it may copy too. */
bool offload_quiet(const server_t *srv, uint64_t now_ns);

/* Shares of copies handed to the threads and not yet ended. */
uint64_t offload_shares(const server_t *srv);

#endif
