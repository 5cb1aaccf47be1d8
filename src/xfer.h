/* xfer.h: a transfer's ranges and buffer sizes, resolved and checked
 * (xfer.c) before a put or get changes anything. */
#ifndef KVC_XFER_H
#define KVC_XFER_H

#include "core.h"

#define XFER_MAX_BATCH (1u << 20) /* entries (or tokens) of one call */

/* Resolves x's defaults against c's layout into r: 0, or KVC_E_LAYER / HEAD /
 * DTYPE recorded. */
int xfer_resolve(engine_t *eng, const cache_t *c, const engine_xfer_t *x, bool is_put,
                 layout_xfer_t *r);
/* What every put and get checks first: the cache, the entry count, the
 * ranges and each entry's arithmetic and buffers (not its sequence). */
int xfer_begin(engine_t *eng, uint32_t cache_id, const engine_xfer_t *x, bool is_put,
               const engine_io_t *entries, size_t n, cache_t **c, layout_xfer_t *r);

#endif
