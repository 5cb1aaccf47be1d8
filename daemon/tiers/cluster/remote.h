/* remote.h: the cluster tier behind the pool (doc/cluster.md): pages of the
 * prefix index written to a Redis Cluster, and matches that miss in the
 * pool continued there.
 *
 *   put indexes a page --hook--> write-behind queue --sender thread: SET--> cluster
 *   (or the pool reclaims it, with cluster_write = evicted)   (rwrite.c, rsend.c)
 *
 *   match/attach: pages past the local match --GET, pipelined, 8 MiB ahead-->
 *   the connection waits (parked, at most cluster_lookup_timeout_ms); each
 *   value is read into the pool page it will be (rnode.c), its claims and
 *   its MAC checked as it comes (rvalue.c), and the run of pages from the
 *   first is imported as it grows (engine_tier_import, which recomputes
 *   every hash from the query and indexes the pages where they are); then
 *   the request runs again and matches them as any cached pages (rlookup.c)
 *
 * Nothing of it can fail a request: a slow, partitioned or dead cluster
 * costs a request at most the lookup bound (nothing while breakers are
 * open), and the request then runs on what the pool holds.
 */
#ifndef KVCD_REMOTE_H
#define KVCD_REMOTE_H

#include <stddef.h>
#include <stdint.h>

#include "engine_tier.h"
#include "metrics.h"
#include "server.h"

/* Starts the tier when cluster_nodes is set: reads the auth and secret
 * files (each owned by the daemon's user, readable by nobody else),
 * connects in the background and hooks the engine. 0 (also when off), or
 * -1 with the reason in err. */
int remote_start(server_t *srv, char *err, size_t errlen);
/* Ends the lookups (their requests run on), drops the queue, closes the
 * connections (server_stop). */
void remote_stop(server_t *srv);
/* The daemon drains: every lookup ends now with what it has. */
void remote_drain(server_t *srv);

/* The tier's figures for metrics_render, NULL when off (strings in a). */
const tier_view_t *remote_view(server_t *srv, arena_t *a);

#endif
