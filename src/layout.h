/* layout.h: where every byte of a page lives, for one cache layout.
 *
 * A page holds page_tokens (T) tokens of every layer. Per layer, K rows of
 * all tokens come first, then V rows, then (int8 only) the f32 scales:
 *
 *   page = [layer 0][layer 1] ... [layer L-1]
 *   layer = [K: T x H x dk][V: T x H x dv][K scales: T x H][V scales: T x H]
 *
 * so a get of whole heads copies one contiguous run per layer per page.
 *
 * It is also the one transfer geometry (layout_xfer, layout_xfer_bytes): what
 * part of each token a put or get moves and how many bytes each of its
 * buffers takes, [layer][token][head][dim]. The client library sizes and
 * splits its transfers with it, the daemon checks the shared-buffer regions
 * of each entry with it and the engine validates with it: pure, no engine
 * state, linked into libkvcache too.
 */
#ifndef KVC_LAYOUT_H
#define KVC_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvcache/types.h"

typedef struct geom {
  uint32_t L, H, dk, dv; /* layers, heads, K and V head dims (elements) */
  uint32_t T;            /* tokens per page, power of two */
  uint32_t tshift;       /* log2(T) */
  uint32_t es;           /* bytes of one stored element (0: ggml blocks) */
  bool int8;             /* stored quantized, with scales */
  uint64_t k_head;       /* bytes of one head's K of one token: dk*es, or its blocks */
  uint64_t v_head;       /* same for V */
  uint64_t k_row;        /* bytes of one token's K in one layer: H*k_head */
  uint64_t v_row;        /* same for V */
  uint64_t k_off_v;      /* offset of V in a layer: T*k_row */
  uint64_t ks_off;       /* offset of K scales in a layer (int8) */
  uint64_t vs_off;       /* offset of V scales in a layer (int8) */
  uint64_t layer_bytes;  /* bytes of one layer in a page */
  uint64_t page_bytes;   /* L * layer_bytes */
} geom_t;

/* Validates layout (page_tokens 0 means the default) and fills g. Returns 0
 * or NLAYERS, NHEADS, HEADDIM (also: a q8_0 / q4_0 head dim that is not a
 * multiple of 32), PAGETOKENS, DTYPE, ATTN, WINDOW, CHUNK, ROPE, OVERFLOW. */
int layout_geom(const kvc_layout_t *layout, geom_t *g);
/* The layout with defaults applied (page_tokens 0 -> 16). */
kvc_layout_t layout_normalize(const kvc_layout_t *layout);
bool layout_equal(const kvc_layout_t *a, const kvc_layout_t *b);
/* The fields in which a cache's layout (have) differs from the one asked,
 * as "name have (asked value)" joined by ", " into buf[len]
 * ("num_layers 2 (asked 4), dtype bf16 (asked f32)"); "" if none. */
void layout_diff(const kvc_layout_t *have, const kvc_layout_t *asked, char *buf, size_t len);

/* A transfer's part of each token, resolved against a layout. */
typedef struct layout_xfer {
  uint32_t l0, l1;  /* layers [l0, l1) */
  uint32_t h0, h1;  /* heads [h0, h1) */
  kvc_dtype_t bt;   /* dtype of the caller's buffers */
  bool raw;         /* a raw int8 get: scale buffers too */
  uint64_t k_head;  /* bytes of one head's K of one token: head_dim_k * size(bt) */
  uint64_t v_head;  /* same for V */
  uint64_t k_row;   /* bytes of one token's K in one layer, the range's heads */
  uint64_t v_row;   /* same for V */
  uint64_t s_row;   /* bytes of one token's scales in one layer (raw), else 0 */
  float k_scale;    /* fp8 conversions: the scale of K (1 unless given) */
  float v_scale;
} layout_xfer_t;

/* The dtype a transfer moves when it names none: the cache's, or f32 for
 * an int8 cache. */
kvc_dtype_t layout_natural_dtype(const kvc_layout_t *l);

/* Resolves x (NULL: all zero) against the layout l (valid) for a put or a
 * get into *r. Layer and head ends of 0 mean "to the last"; a put covers
 * every head; puts take the cache dtype or f32 (int8 caches: f32, f16,
 * bf16), gets return the cache dtype or f32 (int8: f32, or int8 raw with
 * scales; fp8, q8_0, q4_0: the cache dtype as given, or f32, f16, bf16
 * converted). A k_scale / v_scale other than 0 is for an fp8 cache's
 * converting transfer only, finite and > 0. Returns 0, or KVC_E_LAYER,
 * KVC_E_HEAD, KVC_E_DTYPE with the reason in why (why_len bytes, may be 0). */
int layout_xfer(const kvc_layout_t *l, const kvc_xfer_t *x, bool is_put, layout_xfer_t *r,
                char *why, size_t why_len);

/* Bytes of ntokens tokens in each buffer of the transfer r: K, V and each of
 * the two scale buffers (0 unless raw); any pointer may be NULL. 0, or
 * KVC_E_OVERFLOW with nothing written. */
int layout_xfer_bytes(const layout_xfer_t *r, uint64_t ntokens, uint64_t *k_bytes,
                      uint64_t *v_bytes, uint64_t *scale_bytes);

#endif
