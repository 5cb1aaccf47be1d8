/* copy.h: moves token rows between a caller's buffer and one page.
 *
 * The caller's buffer is [layer][token][head][dim] over the transfer's
 * ranges (see kvcache/types.h); the page is laid out as in layout.h. With
 * whole heads and no dtype conversion a page's share of a transfer is one
 * memcpy per layer for K and one for V.
 */
#ifndef KVC_COPY_H
#define KVC_COPY_H

#include <stdbool.h>
#include <stdint.h>

#include "layout.h"

typedef struct copy_plan {
  const geom_t *g;
  uint32_t l0, nl;      /* layer range */
  uint32_t h0, nh;      /* head range */
  kvc_dtype_t stored;   /* the cache's dtype */
  kvc_dtype_t bt;       /* the buffer's dtype (INT8 means raw int8 + scales) */
  unsigned bes;         /* bytes of one buffer element (0: ggml blocks) */
  uint64_t n;           /* tokens of the entry: the buffer's token extent */
  uint64_t bk_row;      /* buffer bytes of one token's K in one layer */
  uint64_t bv_row;
  bool plain;           /* whole heads, same dtype, not int8: memcpy runs */
  float k_scale;        /* fp8 conversions: x / scale encoded, code x scale decoded */
  float v_scale;
} copy_plan_t;

/* Fills plan for a transfer (ranges already validated). */
void copy_plan_init(copy_plan_t *plan, const geom_t *g, kvc_dtype_t stored, uint32_t l0,
                    uint32_t nl, uint32_t h0, uint32_t nh, kvc_dtype_t bt, uint64_t n);

/* Sets the fp8 conversion scales of plan (copy_plan_init sets 1). */
void copy_plan_scale(copy_plan_t *plan, float k_scale, float v_scale);

/* The share part of nparts of a transfer's layers: *out is x over layers
 * [l0 + nl * part / nparts, l0 + nl * (part + 1) / nparts), and *k, *v, *ks,
 * *vs (NULL ones stay NULL) move to where that range starts in the buffers.
 * Returns false if the share is empty. Running every share is running x:
 * how a copy splits across threads (no two shares touch the same bytes). */
bool copy_plan_slice(const copy_plan_t *x, unsigned part, unsigned nparts, copy_plan_t *out,
                     const void **k, const void **v, const void **ks, const void **vs);

/* Page tokens [pt0, pt0 + cnt) <- buffer tokens [bt0, bt0 + cnt). Whole
 * runs go past the caches (ntcopy): ntcopy_fence before the bytes are handed
 * on. */
void copy_in(const copy_plan_t *x, unsigned char *page, uint64_t pt0, uint64_t bt0,
             uint64_t cnt, const void *k, const void *v);
/* Buffer tokens [bt0, bt0 + cnt) <- page tokens [pt0, pt0 + cnt). ks/vs are
 * written only for a raw int8 transfer. */
void copy_out(const copy_plan_t *x, const unsigned char *page, uint64_t pt0, uint64_t bt0,
              uint64_t cnt, void *k, void *v, void *ks, void *vs);

/* Zeroes buffer tokens [bt0, bt0 + cnt) of every layer (and their scales):
 * what a get returns for holes. */
void copy_zero(const copy_plan_t *x, uint64_t bt0, uint64_t cnt, void *k, void *v, void *ks,
               void *vs);

#endif
