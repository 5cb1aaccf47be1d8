/* attn.c: what each attention kind lets a token see, and therefore what a
 * cache may free and from where a sequence can resume (doc/attention.md).
 *
 *   kind      a token at p attends to     free once the lowest position
 *                                         still to compute is h
 *   causal    [0, p]                      nothing
 *   window    [p - W, p]                  positions < h - M   (M >= W kept)
 *   chunked   [p - p % C, p]              positions < min(h - h % C, h - M) (M: memory;
 *                                         KVC_ATTN_KEEP_ALL: nothing)
 *   encoder   every entry                 nothing
 */
#include "attn.h"
#include "seq.h"

bool attn_allows(const cache_t *c, uint64_t p, uint64_t q) {
  const kvc_layout_t *l = &c->layout;
  switch (l->attn) {
  case KVC_ATTN_ENCODER:
    return true;
  case KVC_ATTN_WINDOW:
    return q <= p && q + l->attn_window >= p;
  case KVC_ATTN_CHUNKED:
    return q <= p && q >= p - p % l->attn_chunk;
  default:
    return q <= p;
  }
}

/* The first position any token at h or later can still need. */
static uint64_t horizon(const cache_t *c, uint64_t h) {
  const kvc_layout_t *l = &c->layout;
  if (l->attn == KVC_ATTN_WINDOW) return h > l->attn_memory ? h - l->attn_memory : 0;
  if (l->attn == KVC_ATTN_CHUNKED) { /* the chunk, and memory positions before h */
    uint64_t chunk = h - h % l->attn_chunk, m = l->attn_memory;
    if (m == KVC_ATTN_KEEP_ALL) return 0;
    uint64_t kept = h > m ? h - m : 0;
    return kept < chunk ? kept : chunk;
  }
  return 0;
}

void attn_trim(engine_t *eng, seq_t *s, uint64_t h) {
  uint64_t n = horizon(s->cache, h);
  if (n > s->len) n = s->len;
  if (n > s->start) seq_trim(eng, s, n);
}

int engine_can_resume(engine_t *eng, uint32_t cache_id, uint64_t seq_id, uint64_t pos,
                      bool *out) {
  if (!eng) return KVC_E_INVAL;
  if (!out) return engine_fail(eng, KVC_E_INVAL, "NULL argument");
  cache_t *c;
  int rc = engine_find_cache(eng, cache_id, &c);
  if (rc) return rc;
  const seq_t *s = hmap_get(&c->seqs, seq_id);
  const kvc_layout_t *l = &c->layout;
  if (l->attn == KVC_ATTN_ENCODER || (l->attn == KVC_ATTN_CAUSAL && pos == 0)) {
    *out = true; /* nothing positional is needed */
    return 0;
  }
  if (!s || pos > s->len) {
    *out = false;
    return 0;
  }
  uint64_t need = 0; /* the first position the token at pos attends to */
  if (l->attn == KVC_ATTN_WINDOW) need = pos > l->attn_window ? pos - l->attn_window : 0;
  if (l->attn == KVC_ATTN_CHUNKED) need = pos - pos % l->attn_chunk;
  *out = need >= s->start;
  return 0;
}
