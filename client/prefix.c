/* prefix.c: the prefix cache's requests: match and attach (token ids through
 * the shared buffer, one round trip each) and the index's top chain heads. */
#include "client.h"

#include <stdlib.h>
#include <string.h>

#include "codec.h"

/* Copies the query's ids to the start of the shared buffer (u32, the host
 * order, which the protocol fixes as little-endian). */
static int stage_tokens(kvc_cache_t *h, const uint32_t *tokens, uint64_t n) {
  kvc_client_t *c = h->client;
  if (n && !tokens) return client_fail(c, KVC_E_INVAL, "tokens is NULL with %llu ids",
                                       (unsigned long long)n);
  if (n > c->shm_use / sizeof *tokens)
    return client_fail(c, KVC_E_SIZE,
                       "%llu token ids need %llu bytes, the shared buffer has %llu for the "
                       "library: open the client with a larger shm_bytes",
                       (unsigned long long)n, (unsigned long long)(n * sizeof *tokens),
                       (unsigned long long)c->shm_use);
  if (n) memcpy(c->shm, tokens, n * sizeof *tokens);
  return 0;
}

static int match_from_wire(kvc_client_t *c, Kvcache__V1__Response *r, kvc_match_t *out) {
  int rc = 0;
  if (r->body_case == KVCACHE__V1__RESPONSE__BODY_MATCH)
    codec_match_from_wire(r->match, out);
  else
    rc = client_fail(c, KVC_E_PROTO, "match reply without a body");
  kvcache__v1__response__free_unpacked(r, NULL);
  return rc;
}

/* The query's span keys on the wire, in wire[0..n) and ptrs (the caller's
 * arrays, n at most KVC_MAX_SPAN_KEYS: the daemon checks the rest). */
static int spans_to_wire(kvc_cache_t *h, const kvc_span_key_t *sp, size_t n,
                         Kvcache__V1__SpanKey **wire, Kvcache__V1__SpanKey ***ptrs) {
  *wire = NULL;
  *ptrs = NULL;
  if (!n) return 0;
  if (!sp) return client_fail(h->client, KVC_E_INVAL, "span_keys is NULL with %zu keys", n);
  if (n > KVC_MAX_SPAN_KEYS)
    return client_fail(h->client, KVC_E_INVAL, "%zu span keys, at most %u", n,
                       KVC_MAX_SPAN_KEYS);
  *wire = malloc(n * sizeof **wire);
  *ptrs = malloc(n * sizeof **ptrs);
  if (!*wire || !*ptrs) {
    free(*wire), free(*ptrs);
    return client_fail(h->client, KVC_E_NOMEM, "out of memory");
  }
  for (size_t i = 0; i < n; i++) {
    codec_span_key_to_wire(&sp[i], &(*wire)[i]);
    (*ptrs)[i] = &(*wire)[i];
  }
  return 0;
}

KVC_API int kvc_match(kvc_cache_t *h, const uint32_t *tokens, uint64_t ntokens,
                      kvc_match_t *out) {
  return kvc_match_spans(h, tokens, ntokens, NULL, 0, out);
}

KVC_API int kvc_match_spans(kvc_cache_t *h, const uint32_t *tokens, uint64_t ntokens,
                            const kvc_span_key_t *span_keys, size_t nspan_keys,
                            kvc_match_t *out) {
  if (!h) return KVC_E_INVAL;
  if (!out) return client_fail(h->client, KVC_E_INVAL, "kvc_match: out is NULL");
  int rc = stage_tokens(h, tokens, ntokens);
  Kvcache__V1__SpanKey *sk, **skp;
  if (rc || (rc = spans_to_wire(h, span_keys, nspan_keys, &sk, &skp))) return rc;
  Kvcache__V1__Match b = KVCACHE__V1__MATCH__INIT;
  b.cache_id = h->id;
  b.tok_off = 0;
  b.ntokens = ntokens;
  b.salt = client_salt(h);
  b.extra = client_extra(h);
  b.n_span_keys = nspan_keys;
  b.span_keys = skp;
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  req.body_case = KVCACHE__V1__REQUEST__BODY_MATCH;
  req.match = &b;
  Kvcache__V1__Response *r;
  rc = client_call(h->client, &req, &r);
  free(sk), free(skp);
  if (rc) return rc;
  return match_from_wire(h->client, r, out);
}

KVC_API int kvc_attach(kvc_cache_t *h, uint64_t dst_seq, const uint32_t *tokens,
                       uint64_t ntokens, bool pin, kvc_match_t *out) {
  return kvc_attach_spans(h, dst_seq, tokens, ntokens, NULL, 0, pin ? KVC_ATTACH_PIN : 0, out);
}

KVC_API int kvc_attach_ex(kvc_cache_t *h, uint64_t dst_seq, const uint32_t *tokens,
                          uint64_t ntokens, unsigned flags, kvc_match_t *out) {
  return kvc_attach_spans(h, dst_seq, tokens, ntokens, NULL, 0, flags, out);
}

KVC_API int kvc_attach_spans(kvc_cache_t *h, uint64_t dst_seq, const uint32_t *tokens,
                             uint64_t ntokens, const kvc_span_key_t *span_keys,
                             size_t nspan_keys, unsigned flags, kvc_match_t *out) {
  if (!h) return KVC_E_INVAL;
  if (flags & ~(unsigned)(KVC_ATTACH_PIN | KVC_ATTACH_NO_REPLACE))
    return client_fail(h->client, KVC_E_INVAL, "kvc_attach_ex: unknown flags %#x", flags);
  if (!out) return client_fail(h->client, KVC_E_INVAL, "kvc_attach: out is NULL");
  int rc = stage_tokens(h, tokens, ntokens);
  Kvcache__V1__SpanKey *sk, **skp;
  if (rc || (rc = spans_to_wire(h, span_keys, nspan_keys, &sk, &skp))) return rc;
  Kvcache__V1__Attach b = KVCACHE__V1__ATTACH__INIT;
  b.cache_id = h->id;
  b.dst_seq = dst_seq;
  b.tok_off = 0;
  b.ntokens = ntokens;
  b.salt = client_salt(h);
  b.extra = client_extra(h);
  b.pin = (flags & KVC_ATTACH_PIN) != 0;
  b.no_replace = (flags & KVC_ATTACH_NO_REPLACE) != 0;
  b.n_span_keys = nspan_keys;
  b.span_keys = skp;
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  req.body_case = KVCACHE__V1__REQUEST__BODY_ATTACH;
  req.attach = &b;
  Kvcache__V1__Response *r;
  rc = client_call(h->client, &req, &r);
  free(sk), free(skp);
  if (rc) return rc;
  return match_from_wire(h->client, r, out);
}

KVC_API int kvc_prefix_top(kvc_cache_t *h, kvc_prefix_head_t *out, size_t cap, size_t *n) {
  if (!h) return KVC_E_INVAL;
  if (!n || !out || cap == 0)
    return client_fail(h->client, KVC_E_INVAL, "kvc_prefix_top: out, cap and n required");
  Kvcache__V1__PrefixTop b = KVCACHE__V1__PREFIX_TOP__INIT;
  b.cache_id = h->id;
  b.max = cap > 1000 ? 1000u : (uint32_t)cap;
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  req.body_case = KVCACHE__V1__REQUEST__BODY_PREFIX_TOP;
  req.prefix_top = &b;
  Kvcache__V1__Response *r;
  int rc = client_call(h->client, &req, &r);
  if (rc) return rc;
  if (r->body_case != KVCACHE__V1__RESPONSE__BODY_PREFIX_TOP) {
    kvcache__v1__response__free_unpacked(r, NULL);
    return client_fail(h->client, KVC_E_PROTO, "prefix_top reply without a body");
  }
  size_t count = r->prefix_top->n_heads < cap ? r->prefix_top->n_heads : cap;
  for (size_t i = 0; i < count; i++) {
    const Kvcache__V1__PrefixHead *w = r->prefix_top->heads[i];
    kvc_prefix_head_t *o = &out[i];
    memset(o, 0, sizeof *o);
    o->hash_len = (uint32_t)(w->hash.len < sizeof o->hash ? w->hash.len : sizeof o->hash);
    if (o->hash_len) memcpy(o->hash, w->hash.data, o->hash_len);
    o->hits = w->hits;
    o->depth = w->depth;
  }
  *n = count;
  kvcache__v1__response__free_unpacked(r, NULL);
  return 0;
}
