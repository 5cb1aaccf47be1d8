/* poolresize.h: resizing the pool online, for `kvcachectl pool resize` and
 * for a reload that changes pool_bytes (doc/tiers.md, online resize).
 *
 *   grow:    a thread makes the new segment (backing and pre-faulting take
 *            long: the loop goes on) -> loop: engine_pool_grow, the segment
 *            joins the map, limits in pages follow the new size
 *   shrink:  loop: engine_pool_shrink (evict, move) -> the segments past
 *            the new end are released; a copy or lease holding a page there
 *            is waited for (every 10 ms, up to 2 s) before it is refused
 *
 * One resize at a time. The asking connection waits (its request runs
 * nothing else meanwhile) and gets the PoolResizeReply; a reload's resize
 * is logged.
 */
#ifndef KVCD_POOLRESIZE_H
#define KVCD_POOLRESIZE_H

#include <stddef.h>
#include <stdint.h>

#include "conn.h"

/* At start: the handles a resize needs. */
void pool_resize_init(server_t *srv);
/* At the stop: waits for a grow in flight and closes the handles. */
void pool_resize_stop(server_t *srv);

/* Starts a resize to bytes, for request_id of c (c NULL: a reload). 0: it
 * replies later (c waits, as an offloaded request); else a KVC_E_* code
 * with the reason in err and nothing started (INVAL: not a size the pool
 * can take, with the sizes it can shrink to; BUSY: a resize is running). */
int pool_resize_start(server_t *srv, conn_t *c, uint64_t bytes, uint64_t request_id,
                      uint64_t t0_ns, char *err, size_t errlen);

#endif
