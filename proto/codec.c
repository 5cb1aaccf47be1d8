/* codec.c: public types to wire messages and back, field by field. */
#include "codec.h"

#include <string.h>

void codec_layout_to_wire(const kvc_layout_t *l, Kvcache__V1__Layout *w) {
  kvcache__v1__layout__init(w);
  w->num_layers = l->num_layers;
  w->num_kv_heads = l->num_kv_heads;
  w->head_dim_k = l->head_dim_k;
  w->head_dim_v = l->head_dim_v;
  w->dtype = (Kvcache__V1__DType)l->dtype;
  w->page_tokens = l->page_tokens;
  w->attn = (uint32_t)l->attn;
  w->attn_window = l->attn_window;
  w->attn_memory = l->attn_memory;
  w->attn_chunk = l->attn_chunk;
  w->rope_dims = l->rope_dims;
  w->rope_style = (uint32_t)l->rope_style;
  w->rope_theta = l->rope_theta;
  w->rope_scale = l->rope_scale;
  w->rope_scaling = (uint32_t)l->rope_scaling;
  w->rope_lo = l->rope_lo;
  w->rope_hi = l->rope_hi;
  w->rope_orig_ctx = l->rope_orig_ctx;
}

void codec_layout_from_wire(const Kvcache__V1__Layout *w, kvc_layout_t *l) {
  memset(l, 0, sizeof *l);
  if (!w) return;
  l->num_layers = w->num_layers;
  l->num_kv_heads = w->num_kv_heads;
  l->head_dim_k = w->head_dim_k;
  l->head_dim_v = w->head_dim_v;
  l->dtype = (kvc_dtype_t)w->dtype;
  l->page_tokens = w->page_tokens;
  l->attn = (kvc_attn_t)w->attn;
  l->attn_window = w->attn_window;
  l->attn_memory = w->attn_memory;
  l->attn_chunk = w->attn_chunk;
  l->rope_dims = w->rope_dims;
  l->rope_style = (kvc_rope_style_t)w->rope_style;
  l->rope_theta = w->rope_theta;
  l->rope_scale = w->rope_scale;
  l->rope_scaling = (kvc_rope_scaling_t)w->rope_scaling;
  l->rope_lo = w->rope_lo;
  l->rope_hi = w->rope_hi;
  l->rope_orig_ctx = w->rope_orig_ctx;
}

void codec_xfer_to_wire(const kvc_xfer_t *x, Kvcache__V1__Xfer *w) {
  kvcache__v1__xfer__init(w);
  if (!x) return;
  w->layer_begin = x->layer_begin;
  w->layer_end = x->layer_end;
  w->head_begin = x->head_begin;
  w->head_end = x->head_end;
  w->dtype = (Kvcache__V1__DType)x->dtype;
  w->k_scale = x->k_scale;
  w->v_scale = x->v_scale;
}

void codec_xfer_from_wire(const Kvcache__V1__Xfer *w, kvc_xfer_t *x) {
  memset(x, 0, sizeof *x);
  if (!w) return;
  x->layer_begin = w->layer_begin;
  x->layer_end = w->layer_end;
  x->head_begin = w->head_begin;
  x->head_end = w->head_end;
  x->dtype = (kvc_dtype_t)w->dtype;
  x->k_scale = w->k_scale;
  x->v_scale = w->v_scale;
}

void codec_seq_info_to_wire(const kvc_seq_info_t *s, Kvcache__V1__SeqInfo *w) {
  kvcache__v1__seq_info__init(w);
  w->seq_id = s->seq_id;
  w->start = s->start;
  w->length = s->length;
  w->extent = s->extent;
  w->pages = s->pages;
  w->shared_pages = s->shared_pages;
  w->pins = s->pins;
  w->last_use_ms = s->last_use_ms;
}

void codec_seq_info_from_wire(const Kvcache__V1__SeqInfo *w, kvc_seq_info_t *s) {
  memset(s, 0, sizeof *s);
  if (!w) return;
  s->seq_id = w->seq_id;
  s->start = w->start;
  s->length = w->length;
  s->extent = w->extent;
  s->pages = w->pages;
  s->shared_pages = w->shared_pages;
  s->pins = w->pins;
  s->last_use_ms = w->last_use_ms;
}

void codec_cache_info_to_wire(const kvc_cache_info_t *i, Kvcache__V1__CacheInfo *w,
                              Kvcache__V1__Layout *wl) {
  kvcache__v1__cache_info__init(w);
  codec_layout_to_wire(&i->layout, wl);
  w->name = (char *)i->name;
  w->cache_id = i->cache_id;
  w->layout = wl;
  w->page_bytes = i->page_bytes;
  w->sequences = i->sequences;
  w->tokens = i->tokens;
  w->pages = i->pages;
  w->tenant = (char *)i->tenant;
}

void codec_cache_info_from_wire(const Kvcache__V1__CacheInfo *w, kvc_cache_info_t *i) {
  memset(i, 0, sizeof *i);
  if (!w) return;
  strncpy(i->name, w->name ? w->name : "", KVC_MAX_NAME);
  i->cache_id = w->cache_id;
  codec_layout_from_wire(w->layout, &i->layout);
  i->page_bytes = w->page_bytes;
  i->sequences = w->sequences;
  i->tokens = w->tokens;
  i->pages = w->pages;
  strncpy(i->tenant, w->tenant ? w->tenant : "", sizeof i->tenant - 1);
}

void codec_match_to_wire(const kvc_match_t *m, Kvcache__V1__MatchReply *w) {
  kvcache__v1__match_reply__init(w);
  w->tokens = m->tokens;
  w->pages = m->pages;
  w->ineligible = m->ineligible;
}

void codec_match_from_wire(const Kvcache__V1__MatchReply *w, kvc_match_t *m) {
  memset(m, 0, sizeof *m);
  if (!w) return;
  m->tokens = w->tokens;
  m->pages = w->pages;
  m->ineligible = w->ineligible;
}

void codec_stat_to_wire(const kvc_stat_t *s, Kvcache__V1__Stat *w) {
  kvcache__v1__stat__init(w);
  w->name = (char *)(s->name ? s->name : "");
  w->value = s->value;
  w->gauge = s->gauge;
  w->help = (char *)(s->help ? s->help : "");
  w->cache = (char *)(s->cache ? s->cache : "");
  w->kind = (Kvcache__V1__StatKind)s->kind;
  w->unit = (char *)(s->unit ? s->unit : "");
  w->sum = s->sum;
  w->n_bucket_le = w->n_bucket_count = s->nbuckets;
  w->bucket_le = (double *)s->bucket_le;
  w->bucket_count = (uint64_t *)s->bucket_count;
}

void codec_stat_from_wire(const Kvcache__V1__Stat *w, kvc_stat_t *s, kvc_label_t *labels) {
  memset(s, 0, sizeof *s);
  if (!w) return;
  s->name = w->name ? w->name : "";
  s->value = w->value;
  s->kind = (kvc_stat_kind_t)w->kind;
  if (s->kind > KVC_STAT_INFO) s->kind = w->gauge ? KVC_STAT_GAUGE : KVC_STAT_COUNTER;
  s->gauge = s->kind != KVC_STAT_COUNTER;
  s->help = w->help ? w->help : "";
  s->cache = w->cache ? w->cache : "";
  s->unit = w->unit ? w->unit : "";
  s->sum = w->sum;
  /* Buckets only as pairs: a count for every bound. */
  s->nbuckets = w->n_bucket_le < w->n_bucket_count ? w->n_bucket_le : w->n_bucket_count;
  s->bucket_le = w->bucket_le;
  s->bucket_count = w->bucket_count;
  if (labels) {
    for (size_t i = 0; i < w->n_labels; i++)
      labels[i] = (kvc_label_t){w->labels[i]->key ? w->labels[i]->key : "",
                                w->labels[i]->value ? w->labels[i]->value : ""};
    s->nlabels = w->n_labels;
    s->labels = labels;
  }
}

void codec_hist_span_to_wire(const kvc_hist_span_t *s, Kvcache__V1__HistorySpan *w) {
  kvcache__v1__history_span__init(w);
  w->seq_id = s->seq_id;
  w->pos = s->pos;
  w->first = s->first;
  w->n = s->n;
}

void codec_hist_span_from_wire(const Kvcache__V1__HistorySpan *w, kvc_hist_span_t *s) {
  memset(s, 0, sizeof *s);
  if (!w) return;
  s->seq_id = w->seq_id;
  s->pos = w->pos;
  s->first = w->first;
  s->n = w->n;
}

void codec_span_key_to_wire(const kvc_span_key_t *s, Kvcache__V1__SpanKey *w) {
  kvcache__v1__span_key__init(w);
  w->begin = s->begin;
  w->end = s->end;
  w->key.data = (uint8_t *)(uintptr_t)s->key;
  w->key.len = s->key_len;
}

void codec_span_key_from_wire(const Kvcache__V1__SpanKey *w, kvc_span_key_t *s) {
  *s = (kvc_span_key_t){0};
  if (!w) return;
  s->begin = w->begin;
  s->end = w->end;
  s->key = w->key.data;
  s->key_len = w->key.len;
}
