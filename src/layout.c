/* layout.c: validates a layout and computes the byte geometry of its pages
 * and of a transfer. */
#include "layout.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "dtype.h"
#include "fp8.h"
#include "kvcache/errors.h"

kvc_layout_t layout_normalize(const kvc_layout_t *layout) {
  kvc_layout_t l = *layout;
  if (l.page_tokens == 0) l.page_tokens = KVC_DEFAULT_PAGE_TOKENS;
  if (l.attn == KVC_ATTN_WINDOW && l.attn_memory == 0) l.attn_memory = l.attn_window;
  if (l.rope_dims && l.rope_scale == 0) l.rope_scale = 1;
  return l;
}

bool layout_equal(const kvc_layout_t *a, const kvc_layout_t *b) {
  kvc_layout_t x = layout_normalize(a), y = layout_normalize(b);
  return x.num_layers == y.num_layers && x.num_kv_heads == y.num_kv_heads &&
         x.head_dim_k == y.head_dim_k && x.head_dim_v == y.head_dim_v &&
         x.dtype == y.dtype && x.page_tokens == y.page_tokens && x.attn == y.attn &&
         x.attn_window == y.attn_window && x.attn_memory == y.attn_memory &&
         x.attn_chunk == y.attn_chunk && x.rope_dims == y.rope_dims &&
         x.rope_style == y.rope_style && x.rope_theta == y.rope_theta &&
         x.rope_scale == y.rope_scale && x.rope_scaling == y.rope_scaling &&
         x.rope_lo == y.rope_lo && x.rope_hi == y.rope_hi && x.rope_orig_ctx == y.rope_orig_ctx;
}

static const char *dtype_text(kvc_dtype_t d) {
  static const char *const names[] = {"?", "f32", "f64", "f16", "bf16", "int8"};
  return (unsigned)d < sizeof names / sizeof names[0] ? names[d] : "?";
}

void layout_diff(const kvc_layout_t *have, const kvc_layout_t *asked, char *buf, size_t len) {
  kvc_layout_t x = layout_normalize(have), y = layout_normalize(asked);
  const struct { const char *name; double a, b; } f[] = {
      {"num_layers", x.num_layers, y.num_layers},
      {"num_kv_heads", x.num_kv_heads, y.num_kv_heads},
      {"head_dim_k", x.head_dim_k, y.head_dim_k},
      {"head_dim_v", x.head_dim_v, y.head_dim_v},
      {"dtype", x.dtype, y.dtype},
      {"page_tokens", x.page_tokens, y.page_tokens},
      {"attn", x.attn, y.attn},
      {"attn_window", x.attn_window, y.attn_window},
      {"attn_memory", x.attn_memory, y.attn_memory},
      {"attn_chunk", x.attn_chunk, y.attn_chunk},
      {"rope_dims", x.rope_dims, y.rope_dims},
      {"rope_style", x.rope_style, y.rope_style},
      {"rope_theta", x.rope_theta, y.rope_theta},
      {"rope_scale", x.rope_scale, y.rope_scale},
      {"rope_scaling", x.rope_scaling, y.rope_scaling},
      {"rope_lo", x.rope_lo, y.rope_lo},
      {"rope_hi", x.rope_hi, y.rope_hi},
      {"rope_orig_ctx", x.rope_orig_ctx, y.rope_orig_ctx},
  };
  size_t used = 0;
  if (len) buf[0] = '\0';
  for (size_t i = 0; i < sizeof f / sizeof f[0] && used < len; i++) {
    if (f[i].a == f[i].b) continue;
    const char *sep = used ? ", " : "";
    int w = strcmp(f[i].name, "dtype") == 0
                ? snprintf(buf + used, len - used, "%sdtype %s (asked %s)", sep,
                           dtype_text(x.dtype), dtype_text(y.dtype))
                : snprintf(buf + used, len - used, "%s%s %g (asked %g)", sep, f[i].name, f[i].a,
                           f[i].b);
    if (w < 0) break;
    used += (size_t)w;
  }
}

/* The attention kind and its sizes: ATTN, WINDOW or CHUNK. */
static int attn_check(const kvc_layout_t *l) {
  if ((unsigned)l->attn > KVC_ATTN_ENCODER) return KVC_E_ATTN;
  bool win = l->attn == KVC_ATTN_WINDOW, chunked = l->attn == KVC_ATTN_CHUNKED;
  if (win ? (l->attn_window == 0 || l->attn_window > KVC_MAX_ATTN_SPAN ||
             l->attn_memory < l->attn_window || l->attn_memory > KVC_MAX_ATTN_SPAN)
          : chunked ? (l->attn_window != 0 ||
                       (l->attn_memory > KVC_MAX_ATTN_SPAN && l->attn_memory != KVC_ATTN_KEEP_ALL))
                    : (l->attn_window != 0 || l->attn_memory != 0))
    return KVC_E_WINDOW;
  if (chunked ? (l->attn_chunk == 0 || l->attn_chunk > KVC_MAX_ATTN_SPAN) : l->attn_chunk != 0)
    return KVC_E_CHUNK;
  return 0;
}

/* The RoPE description: none (all zero), or a valid one on a positional kind. */
static int rope_check(const kvc_layout_t *l) {
  bool linear = l->rope_scaling == KVC_ROPE_SCALE_LINEAR;
  if (l->rope_dims == 0) /* no RoPE, or keys that carry no position at all */
    return (l->rope_style == KVC_ROPE_NEOX || l->rope_style == KVC_ROPE_NONE) &&
                   l->rope_theta == 0 && l->rope_scale == 0 && linear && l->rope_lo == 0 &&
                   l->rope_hi == 0 && l->rope_orig_ctx == 0
               ? 0
               : KVC_E_ROPE;
  if (l->attn == KVC_ATTN_ENCODER || (l->rope_dims & 1) || l->rope_dims > l->head_dim_k ||
      (unsigned)l->rope_style > KVC_ROPE_GPTJ || !isfinite(l->rope_theta) ||
      l->rope_theta <= 0 || !isfinite(l->rope_scale) || l->rope_scale <= 0)
    return KVC_E_ROPE;
  if ((unsigned)l->rope_scaling > KVC_ROPE_SCALE_YARN) return KVC_E_ROPE;
  if (linear) return l->rope_lo == 0 && l->rope_hi == 0 && l->rope_orig_ctx == 0 ? 0 : KVC_E_ROPE;
  if (l->rope_scale < 1 || !isfinite(l->rope_lo) || !isfinite(l->rope_hi) || l->rope_lo <= 0 ||
      l->rope_hi <= l->rope_lo || l->rope_orig_ctx == 0)
    return KVC_E_ROPE;
  return 0;
}

/* a * b into *out; false on u64 overflow. */
static bool mul_ok(uint64_t a, uint64_t b, uint64_t *out) {
  return !__builtin_mul_overflow(a, b, out);
}

int layout_geom(const kvc_layout_t *layout, geom_t *g) {
  kvc_layout_t l = layout_normalize(layout);
  if (l.num_layers == 0 || l.num_layers > KVC_MAX_LAYERS) return KVC_E_NLAYERS;
  if (l.num_kv_heads == 0 || l.num_kv_heads > KVC_MAX_HEADS) return KVC_E_NHEADS;
  if (l.head_dim_k == 0 || l.head_dim_k > KVC_MAX_HEAD_DIM || l.head_dim_v == 0 ||
      l.head_dim_v > KVC_MAX_HEAD_DIM)
    return KVC_E_HEADDIM;
  if (l.page_tokens > KVC_MAX_PAGE_TOKENS || (l.page_tokens & (l.page_tokens - 1)))
    return KVC_E_PAGETOKENS;
  if (!dtype_valid(l.dtype)) return KVC_E_DTYPE;
  if (dtype_is_block(l.dtype) && (l.head_dim_k % DTYPE_QBLOCK || l.head_dim_v % DTYPE_QBLOCK))
    return KVC_E_HEADDIM; /* a page holds whole blocks */
  int rc = attn_check(&l);
  if (rc == 0) rc = rope_check(&l);
  if (rc) return rc;
  g->L = l.num_layers;
  g->H = l.num_kv_heads;
  g->dk = l.head_dim_k;
  g->dv = l.head_dim_v;
  g->T = l.page_tokens;
  g->tshift = (uint32_t)__builtin_ctz(l.page_tokens);
  g->es = dtype_size(l.dtype);
  g->int8 = l.dtype == KVC_DTYPE_INT8;
  g->k_head = dtype_row_bytes(l.dtype, g->dk); /* < 2^17: no overflow */
  g->v_head = dtype_row_bytes(l.dtype, g->dv);
  uint64_t k_blk, v_blk, s_blk = 0, x;
  if (!mul_ok(g->H, g->k_head, &g->k_row) || !mul_ok(g->H, g->v_head, &g->v_row) ||
      !mul_ok(g->k_row, g->T, &k_blk) || !mul_ok(g->v_row, g->T, &v_blk) ||
      !mul_ok((uint64_t)g->T * g->H, g->int8 ? 4 : 0, &s_blk))
    return KVC_E_OVERFLOW;
  g->k_off_v = k_blk;
  g->ks_off = k_blk + v_blk;
  g->vs_off = g->ks_off + s_blk;
  g->layer_bytes = g->vs_off + s_blk;
  /* Keep every layer 8-byte aligned so scales and wide dtypes stay aligned. */
  if (__builtin_add_overflow(g->layer_bytes, 7, &x)) return KVC_E_OVERFLOW;
  g->layer_bytes = x & ~(uint64_t)7;
  if (!mul_ok(g->layer_bytes, g->L, &g->page_bytes)) return KVC_E_OVERFLOW;
  return 0;
}

kvc_dtype_t layout_natural_dtype(const kvc_layout_t *l) {
  return l->dtype == KVC_DTYPE_INT8 ? KVC_DTYPE_F32 : l->dtype;
}

static int xfer_fail(int code, char *why, size_t why_len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int xfer_fail(int code, char *why, size_t why_len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (why_len) vsnprintf(why, why_len, fmt, ap);
  va_end(ap);
  return code;
}

int layout_xfer(const kvc_layout_t *l, const kvc_xfer_t *x, bool is_put, layout_xfer_t *r,
                char *why, size_t why_len) {
  static const kvc_xfer_t all;
  if (!x) x = &all;
  r->l0 = x->layer_begin;
  r->l1 = x->layer_end ? x->layer_end : l->num_layers;
  r->h0 = x->head_begin;
  r->h1 = x->head_end ? x->head_end : l->num_kv_heads;
  if (r->l0 >= r->l1 || r->l1 > l->num_layers)
    return xfer_fail(KVC_E_LAYER, why, why_len, "layer range [%u, %u) outside 0..%u", r->l0,
                     r->l1, l->num_layers);
  if (r->h0 >= r->h1 || r->h1 > l->num_kv_heads)
    return xfer_fail(KVC_E_HEAD, why, why_len, "head range [%u, %u) outside 0..%u", r->h0,
                     r->h1, l->num_kv_heads);
  if (is_put && (r->h0 != 0 || r->h1 != l->num_kv_heads))
    return xfer_fail(KVC_E_HEAD, why, why_len, "a put writes every head");
  kvc_dtype_t bt = x->dtype ? x->dtype : layout_natural_dtype(l);
  bool int8 = l->dtype == KVC_DTYPE_INT8, ok;
  bool half = bt == KVC_DTYPE_F32 || bt == KVC_DTYPE_F16 || bt == KVC_DTYPE_BF16;
  if (int8)
    ok = is_put ? half : (bt == KVC_DTYPE_F32 || bt == KVC_DTYPE_INT8);
  else if (fp8_is(l->dtype) || dtype_is_block(l->dtype)) /* as given, or converted */
    ok = bt == l->dtype || half;
  else
    ok = bt == l->dtype || bt == KVC_DTYPE_F32;
  if (!ok)
    return xfer_fail(KVC_E_DTYPE, why, why_len, "cannot %s dtype %d for a cache of dtype %d",
                     is_put ? "put" : "get", (int)bt, (int)l->dtype);
  bool scaled = x->k_scale != 0 || x->v_scale != 0;
  if (scaled && (!fp8_is(l->dtype) || bt == l->dtype))
    return xfer_fail(KVC_E_DTYPE, why, why_len,
                     "k_scale and v_scale apply to fp8 conversions only (a cache of dtype %d, "
                     "a buffer of dtype %d)", (int)l->dtype, (int)bt);
  if (scaled && !(isfinite(x->k_scale) && isfinite(x->v_scale) && x->k_scale >= 0 &&
                  x->v_scale >= 0))
    return xfer_fail(KVC_E_DTYPE, why, why_len, "k_scale %g and v_scale %g must be finite and > 0",
                     (double)x->k_scale, (double)x->v_scale);
  r->k_scale = x->k_scale != 0 ? x->k_scale : 1.0f;
  r->v_scale = x->v_scale != 0 ? x->v_scale : 1.0f;
  uint64_t heads = r->h1 - r->h0;
  r->bt = bt;
  r->raw = int8 && bt == KVC_DTYPE_INT8;
  r->k_head = dtype_row_bytes(bt, l->head_dim_k);
  r->v_head = dtype_row_bytes(bt, l->head_dim_v);
  r->k_row = heads * r->k_head; /* < 2^38: no overflow */
  r->v_row = heads * r->v_head;
  r->s_row = r->raw ? heads * 4u : 0;
  return 0;
}

int layout_xfer_bytes(const layout_xfer_t *r, uint64_t ntokens, uint64_t *k_bytes,
                      uint64_t *v_bytes, uint64_t *scale_bytes) {
  uint64_t rows, kb, vb, sb;
  if (__builtin_mul_overflow((uint64_t)(r->l1 - r->l0) * (r->h1 - r->h0), ntokens, &rows) ||
      __builtin_mul_overflow(rows, r->k_head, &kb) ||
      __builtin_mul_overflow(rows, r->v_head, &vb) || __builtin_mul_overflow(rows, 4, &sb))
    return KVC_E_OVERFLOW;
  if (k_bytes) *k_bytes = kb;
  if (v_bytes) *v_bytes = vb;
  if (scale_bytes) *scale_bytes = r->raw ? sb : 0;
  return 0;
}
