/* prefix.c: the prefix cache's requests: match and attach (token ids through
 * the shared buffer, one round trip each) and the index's top chain heads. */
#include "client.h"

#include <string.h>

#include "codec.h"

/* Copies the query's ids to the start of the shared buffer (u32, the host
 * order, which the protocol fixes as little-endian). */
static int stage_tokens(kvc_cache_t *h, const uint32_t *tokens, uint64_t n) {
  kvc_client_t *c = h->client;
  if (n && !tokens) return client_fail(c, KVC_E_INVAL, "tokens is NULL with %llu ids",
                                       (unsigned long long)n);
  if (n > c->shm_bytes / sizeof *tokens)
    return client_fail(c, KVC_E_SIZE,
                       "%llu token ids need %llu bytes, the shared buffer has %llu: open the "
                       "client with a larger shm_bytes",
                       (unsigned long long)n, (unsigned long long)(n * sizeof *tokens),
                       (unsigned long long)c->shm_bytes);
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

KVC_API int kvc_match(kvc_cache_t *h, const uint32_t *tokens, uint64_t ntokens,
                      kvc_match_t *out) {
  if (!h) return KVC_E_INVAL;
  if (!out) return client_fail(h->client, KVC_E_INVAL, "kvc_match: out is NULL");
  int rc = stage_tokens(h, tokens, ntokens);
  if (rc) return rc;
  Kvcache__V1__Match b = KVCACHE__V1__MATCH__INIT;
  b.cache_id = h->id;
  b.tok_off = 0;
  b.ntokens = ntokens;
  b.salt = client_salt(h);
  b.extra = client_extra(h);
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  req.body_case = KVCACHE__V1__REQUEST__BODY_MATCH;
  req.match = &b;
  Kvcache__V1__Response *r;
  if ((rc = client_call(h->client, &req, &r))) return rc;
  return match_from_wire(h->client, r, out);
}

KVC_API int kvc_attach(kvc_cache_t *h, uint64_t dst_seq, const uint32_t *tokens,
                       uint64_t ntokens, bool pin, kvc_match_t *out) {
  return kvc_attach_ex(h, dst_seq, tokens, ntokens, pin ? KVC_ATTACH_PIN : 0, out);
}

KVC_API int kvc_attach_ex(kvc_cache_t *h, uint64_t dst_seq, const uint32_t *tokens,
                          uint64_t ntokens, unsigned flags, kvc_match_t *out) {
  if (!h) return KVC_E_INVAL;
  if (flags & ~(unsigned)(KVC_ATTACH_PIN | KVC_ATTACH_NO_REPLACE))
    return client_fail(h->client, KVC_E_INVAL, "kvc_attach_ex: unknown flags %#x", flags);
  if (!out) return client_fail(h->client, KVC_E_INVAL, "kvc_attach: out is NULL");
  int rc = stage_tokens(h, tokens, ntokens);
  if (rc) return rc;
  Kvcache__V1__Attach b = KVCACHE__V1__ATTACH__INIT;
  b.cache_id = h->id;
  b.dst_seq = dst_seq;
  b.tok_off = 0;
  b.ntokens = ntokens;
  b.salt = client_salt(h);
  b.extra = client_extra(h);
  b.pin = (flags & KVC_ATTACH_PIN) != 0;
  b.no_replace = (flags & KVC_ATTACH_NO_REPLACE) != 0;
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  req.body_case = KVCACHE__V1__REQUEST__BODY_ATTACH;
  req.attach = &b;
  Kvcache__V1__Response *r;
  if ((rc = client_call(h->client, &req, &r))) return rc;
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
