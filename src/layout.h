/* layout.h: where every byte of a page lives, for one cache layout.
 *
 * A page holds page_tokens (T) tokens of every layer. Per layer, K rows of
 * all tokens come first, then V rows, then (int8 only) the f32 scales:
 *
 *   page = [layer 0][layer 1] ... [layer L-1]
 *   layer = [K: T x H x dk][V: T x H x dv][K scales: T x H][V scales: T x H]
 *
 * so a get of whole heads copies one contiguous run per layer per page.
 */
#ifndef KVC_LAYOUT_H
#define KVC_LAYOUT_H

#include <stdbool.h>
#include <stdint.h>

#include "kvcache/types.h"

typedef struct geom {
  uint32_t L, H, dk, dv; /* layers, heads, K and V head dims (elements) */
  uint32_t T;            /* tokens per page, power of two */
  uint32_t tshift;       /* log2(T) */
  uint32_t es;           /* bytes of one stored element */
  bool int8;             /* stored quantized, with scales */
  uint64_t k_row;        /* bytes of one token's K in one layer: H*dk*es */
  uint64_t v_row;        /* same for V */
  uint64_t k_off_v;      /* offset of V in a layer: T*k_row */
  uint64_t ks_off;       /* offset of K scales in a layer (int8) */
  uint64_t vs_off;       /* offset of V scales in a layer (int8) */
  uint64_t layer_bytes;  /* bytes of one layer in a page */
  uint64_t page_bytes;   /* L * layer_bytes */
} geom_t;

/* Validates layout (page_tokens 0 means the default) and fills g. Returns 0
 * or NLAYERS, NHEADS, HEADDIM, PAGETOKENS, DTYPE, ATTN, WINDOW, CHUNK, ROPE,
 * OVERFLOW. */
int layout_geom(const kvc_layout_t *layout, geom_t *g);
/* The layout with defaults applied (page_tokens 0 -> 16). */
kvc_layout_t layout_normalize(const kvc_layout_t *layout);
bool layout_equal(const kvc_layout_t *a, const kvc_layout_t *b);

#endif
