/* xfer.h: a transfer's ranges and buffer sizes, resolved and checked
 * (xfer.c) before a put or get changes anything. */
#ifndef KVC_XFER_H
#define KVC_XFER_H

#include "core.h"

#define XFER_MAX_BATCH (1u << 20) /* entries (or tokens) of one call */

/* A transfer's ranges after defaults and checks. */
typedef struct xr {
  uint32_t l0, l1, h0, h1;
  kvc_dtype_t bt; /* buffer dtype */
} xrange_t;
/* Resolves x's defaults against c's layout into r: 0, or KVC_E_LAYER / HEAD /
 * DTYPE recorded. */
int xfer_resolve(engine_t *eng, const cache_t *c, const engine_xfer_t *x, bool is_put,
                 xrange_t *r);
/* Buffer bytes of ntokens: K, V, each scale buffer (raw int8); OVERFLOW. */
int xfer_sizes(const cache_t *c, const xrange_t *r, uint64_t ntokens, uint64_t *kb,
               uint64_t *vb, uint64_t *sb);
/* What every put and get checks first: the cache, the entry count, the
 * ranges and each entry's arithmetic and buffers (not its sequence). */
int xfer_begin(engine_t *eng, uint32_t cache_id, const engine_xfer_t *x, bool is_put,
               const engine_io_t *entries, size_t n, cache_t **c, xrange_t *r);

#endif
