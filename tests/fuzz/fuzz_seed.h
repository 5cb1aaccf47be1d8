/* fuzz_seed.h: valid requests for the fuzzers' seeds, packed as payloads.
 *
 * The seed layout is cache "f": f32, 2 layers, 2 kv heads, head dims 4,
 * 4-token pages: a token is 64 bytes of K and 64 of V over every layer, a
 * cache page is 1 KiB. Data lives at offset 0 (K) and 64 KiB (V) of the
 * shared buffer, token ids (u32) at 192 KiB. Used by gen_corpus.c and by
 * fuzz_msg.c's fixed state.
 */
#ifndef KVC_FUZZ_SEED_H
#define KVC_FUZZ_SEED_H

#include <stdint.h>
#include <string.h>

#include "kvcache.pb-c.h"

#define SEED_UNUSED __attribute__((unused))
#define SEED_TOKEN_BYTES 64u
#define SEED_V_OFF 65536u
#define SEED_TOK_OFF 196608u

typedef Kvcache__V1__Request seed_req_t;

/* Packs req with id into out (at least FZ_MAX_FRAME bytes); returns length. */
SEED_UNUSED static size_t seed_pack(seed_req_t *req, uint64_t id, uint8_t *out) {
  req->id = id;
  return kvcache__v1__request__pack(req, out);
}

SEED_UNUSED static size_t seed_hello(uint8_t *out, uint64_t id) {
  seed_req_t r = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__Hello h = KVCACHE__V1__HELLO__INIT;
  h.protocol_version = 1;
  h.shm_bytes = 1u << 20;
  h.client_name = (char *)"fuzz";
  r.body_case = KVCACHE__V1__REQUEST__BODY_HELLO;
  r.hello = &h;
  return seed_pack(&r, id, out);
}

SEED_UNUSED static size_t seed_ping(uint8_t *out, uint64_t id) {
  seed_req_t r = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__Ping p = KVCACHE__V1__PING__INIT;
  r.body_case = KVCACHE__V1__REQUEST__BODY_PING;
  r.ping = &p;
  return seed_pack(&r, id, out);
}

SEED_UNUSED static size_t seed_tenants(uint8_t *out, uint64_t id) {
  seed_req_t r = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__Empty e = KVCACHE__V1__EMPTY__INIT;
  r.body_case = KVCACHE__V1__REQUEST__BODY_TENANTS;
  r.tenants = &e;
  return seed_pack(&r, id, out);
}

/* A cache of 2 layers, 2 heads, head dims hd (K and V), 4 tokens a page. */
SEED_UNUSED static size_t seed_cache_open_hd(uint8_t *out, uint64_t id, const char *name,
                                             uint32_t dtype, uint32_t hd) {
  seed_req_t r = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__CacheOpen o = KVCACHE__V1__CACHE_OPEN__INIT;
  Kvcache__V1__Layout l = KVCACHE__V1__LAYOUT__INIT;
  l.num_layers = 2, l.num_kv_heads = 2, l.head_dim_k = hd, l.head_dim_v = hd;
  l.dtype = (Kvcache__V1__DType)dtype, l.page_tokens = 4;
  o.name = (char *)name;
  o.layout = &l;
  r.body_case = KVCACHE__V1__REQUEST__BODY_CACHE_OPEN;
  r.cache_open = &o;
  return seed_pack(&r, id, out);
}

SEED_UNUSED static size_t seed_cache_open(uint8_t *out, uint64_t id, const char *name,
                                          uint32_t dtype) {
  seed_req_t r = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__CacheOpen o = KVCACHE__V1__CACHE_OPEN__INIT;
  Kvcache__V1__Layout l = KVCACHE__V1__LAYOUT__INIT;
  l.num_layers = 2, l.num_kv_heads = 2, l.head_dim_k = 4, l.head_dim_v = 4;
  l.dtype = (Kvcache__V1__DType)dtype, l.page_tokens = 4;
  o.name = (char *)name;
  o.layout = &l;
  r.body_case = KVCACHE__V1__REQUEST__BODY_CACHE_OPEN;
  r.cache_open = &o;
  return seed_pack(&r, id, out);
}

/* A put (is_put) or get of n entries of (seq + i, pos, ntokens) in the f32 seed layout;
 * bytes_per_token is the K (and V) size of one token in the xfer's dtype. */
SEED_UNUSED static size_t seed_io(uint8_t *out, uint64_t id, int is_put, uint32_t cache,
                                  uint64_t seq, uint64_t pos, uint64_t ntokens, size_t n,
                                  uint64_t bytes_per_token, const Kvcache__V1__Xfer *x) {
  seed_req_t r = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__Io io = KVCACHE__V1__IO__INIT;
  Kvcache__V1__IoEntry e[8], *pe[8];
  if (n > 8) n = 8;
  for (size_t i = 0; i < n; i++) {
    kvcache__v1__io_entry__init(&e[i]);
    e[i].seq_id = seq + i;
    e[i].pos = pos;
    e[i].ntokens = ntokens;
    e[i].k_off = i * ntokens * bytes_per_token;
    e[i].k_len = ntokens * bytes_per_token;
    e[i].v_off = SEED_V_OFF + i * ntokens * bytes_per_token;
    e[i].v_len = ntokens * bytes_per_token;
    pe[i] = &e[i];
  }
  io.cache_id = cache;
  io.xfer = (Kvcache__V1__Xfer *)x;
  io.n_entries = n;
  io.entries = pe;
  r.body_case = is_put ? KVCACHE__V1__REQUEST__BODY_PUT : KVCACHE__V1__REQUEST__BODY_GET;
  if (is_put) r.put = &io;
  else r.get = &io;
  return seed_pack(&r, id, out);
}

/* A put like seed_io's, each entry with its ntokens token ids at
 * SEED_TOK_OFF + 4 * ntokens * i, under the key (salt, extra), either "". */
SEED_UNUSED static size_t seed_put_tokens(uint8_t *out, uint64_t id, uint32_t cache,
                                          uint64_t seq, uint64_t pos, uint64_t ntokens,
                                          size_t n, const char *salt, const char *extra) {
  seed_req_t r = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__Io io = KVCACHE__V1__IO__INIT;
  Kvcache__V1__IoEntry e[8], *pe[8];
  if (n > 8) n = 8;
  for (size_t i = 0; i < n; i++) {
    kvcache__v1__io_entry__init(&e[i]);
    e[i].seq_id = seq + i;
    e[i].pos = pos;
    e[i].ntokens = ntokens;
    e[i].k_off = i * ntokens * SEED_TOKEN_BYTES;
    e[i].k_len = ntokens * SEED_TOKEN_BYTES;
    e[i].v_off = SEED_V_OFF + i * ntokens * SEED_TOKEN_BYTES;
    e[i].v_len = ntokens * SEED_TOKEN_BYTES;
    e[i].tok_off = SEED_TOK_OFF + i * ntokens * 4;
    e[i].tok_len = ntokens * 4;
    pe[i] = &e[i];
  }
  io.cache_id = cache;
  io.n_entries = n;
  io.entries = pe;
  io.salt.data = (uint8_t *)salt, io.salt.len = strlen(salt);
  io.extra.data = (uint8_t *)extra, io.extra.len = strlen(extra);
  r.body_case = KVCACHE__V1__REQUEST__BODY_PUT;
  r.put = &io;
  return seed_pack(&r, id, out);
}

/* A put of one entry (seq, pos, ntokens) of layers [l0, l1) with its ids
 * at SEED_TOK_OFF and span keys sk[0..nsk) (begin, end, key triples). */
typedef struct seed_span {
  uint64_t begin, end;
  const char *key;
} seed_span_t;

static size_t seed_spans_(const seed_span_t *s, size_t n, Kvcache__V1__SpanKey *w,
                          Kvcache__V1__SpanKey **pw) {
  if (n > 8) n = 8;
  for (size_t i = 0; i < n; i++) {
    kvcache__v1__span_key__init(&w[i]);
    w[i].begin = s[i].begin, w[i].end = s[i].end;
    w[i].key.data = (uint8_t *)s[i].key, w[i].key.len = strlen(s[i].key);
    pw[i] = &w[i];
  }
  return n;
}

SEED_UNUSED static size_t seed_put_spans(uint8_t *out, uint64_t id, uint32_t cache, uint64_t seq,
                                         uint64_t pos, uint64_t ntokens, uint32_t l0, uint32_t l1,
                                         const seed_span_t *sk, size_t nsk) {
  seed_req_t r = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__Io io = KVCACHE__V1__IO__INIT;
  Kvcache__V1__Xfer x = KVCACHE__V1__XFER__INIT;
  Kvcache__V1__IoEntry e = KVCACHE__V1__IO_ENTRY__INIT, *pe = &e;
  Kvcache__V1__SpanKey w[8], *pw[8];
  uint64_t per = SEED_TOKEN_BYTES / 2 * (l1 - l0); /* a layer of a token: 32 bytes */
  x.layer_begin = l0, x.layer_end = l1;
  e.seq_id = seq, e.pos = pos, e.ntokens = ntokens;
  e.k_off = 0, e.k_len = ntokens * per;
  e.v_off = SEED_V_OFF, e.v_len = ntokens * per;
  e.tok_off = SEED_TOK_OFF, e.tok_len = ntokens * 4;
  e.n_span_keys = seed_spans_(sk, nsk, w, pw);
  e.span_keys = pw;
  io.cache_id = cache;
  io.xfer = &x;
  io.n_entries = 1;
  io.entries = &pe;
  r.body_case = KVCACHE__V1__REQUEST__BODY_PUT;
  r.put = &io;
  return seed_pack(&r, id, out);
}

/* Match (dst UINT64_MAX) or Attach into dst of ntokens ids at SEED_TOK_OFF
 * with span keys. */
SEED_UNUSED static size_t seed_match_spans(uint8_t *out, uint64_t id, uint32_t cache,
                                           uint64_t dst, uint64_t ntokens, const seed_span_t *sk,
                                           size_t nsk) {
  seed_req_t r = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__Match m = KVCACHE__V1__MATCH__INIT;
  Kvcache__V1__Attach a = KVCACHE__V1__ATTACH__INIT;
  Kvcache__V1__SpanKey w[8], *pw[8];
  size_t n = seed_spans_(sk, nsk, w, pw);
  if (dst == UINT64_MAX) {
    m.cache_id = cache, m.tok_off = SEED_TOK_OFF, m.ntokens = ntokens;
    m.n_span_keys = n, m.span_keys = pw;
    r.body_case = KVCACHE__V1__REQUEST__BODY_MATCH, r.match = &m;
  } else {
    a.cache_id = cache, a.dst_seq = dst, a.tok_off = SEED_TOK_OFF, a.ntokens = ntokens;
    a.n_span_keys = n, a.span_keys = pw;
    r.body_case = KVCACHE__V1__REQUEST__BODY_ATTACH, r.attach = &a;
  }
  return seed_pack(&r, id, out);
}

/* Match (dst UINT64_MAX) or Attach into dst of ntokens ids at tok_off. */
SEED_UNUSED static size_t seed_match(uint8_t *out, uint64_t id, uint32_t cache, uint64_t dst,
                                     uint64_t tok_off, uint64_t ntokens, const char *salt,
                                     const char *extra, int pin) {
  seed_req_t r = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__Match m = KVCACHE__V1__MATCH__INIT;
  Kvcache__V1__Attach a = KVCACHE__V1__ATTACH__INIT;
  ProtobufCBinaryData bs = {strlen(salt), (uint8_t *)salt};
  ProtobufCBinaryData be = {strlen(extra), (uint8_t *)extra};
  if (dst == UINT64_MAX) {
    m.cache_id = cache, m.tok_off = tok_off, m.ntokens = ntokens, m.salt = bs, m.extra = be;
    r.body_case = KVCACHE__V1__REQUEST__BODY_MATCH, r.match = &m;
  } else {
    a.cache_id = cache, a.dst_seq = dst, a.tok_off = tok_off, a.ntokens = ntokens;
    a.salt = bs, a.extra = be, a.pin = pin != 0;
    r.body_case = KVCACHE__V1__REQUEST__BODY_ATTACH, r.attach = &a;
  }
  return seed_pack(&r, id, out);
}

/* Requests naming (cache, seq) and one or two numbers. */
enum seed_seqop { SEED_REMOVE, SEED_COPY, SEED_RESUME, SEED_TRIM, SEED_PIN, SEED_UNPIN,
                  SEED_INFO, SEED_LIST, SEED_CLEAR, SEED_DROP, SEED_CLIST, SEED_STATS,
                  SEED_PRIORITY, SEED_PIN_TTL, SEED_PREFIX_TOP };

SEED_UNUSED static size_t seed_seqop(uint8_t *out, uint64_t id, enum seed_seqop op,
                                     uint32_t cache, uint64_t seq, uint64_t a, uint64_t b) {
  seed_req_t r = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__Remove rm = KVCACHE__V1__REMOVE__INIT;
  Kvcache__V1__CopyPrefix cp = KVCACHE__V1__COPY_PREFIX__INIT;
  Kvcache__V1__SeqPos sp = KVCACHE__V1__SEQ_POS__INIT;
  Kvcache__V1__SeqRef sr = KVCACHE__V1__SEQ_REF__INIT;
  Kvcache__V1__SeqList sl = KVCACHE__V1__SEQ_LIST__INIT;
  Kvcache__V1__CacheRef cr = KVCACHE__V1__CACHE_REF__INIT;
  Kvcache__V1__Empty cl = KVCACHE__V1__EMPTY__INIT;
  Kvcache__V1__StatsRequest st = KVCACHE__V1__STATS_REQUEST__INIT;
  Kvcache__V1__SetPriority pr = KVCACHE__V1__SET_PRIORITY__INIT;
  Kvcache__V1__PinTtl pt = KVCACHE__V1__PIN_TTL__INIT;
  Kvcache__V1__PrefixTop top = KVCACHE__V1__PREFIX_TOP__INIT;
  pr.cache_id = pt.cache_id = top.cache_id = cache;
  pr.seq_id = pt.seq_id = seq;
  rm.cache_id = cp.cache_id = sp.cache_id = sr.cache_id = sl.cache_id = cr.cache_id = cache;
  rm.seq_id = sp.seq_id = sr.seq_id = seq;
  switch (op) {
  case SEED_REMOVE: rm.begin = a, rm.end = b;
    r.body_case = KVCACHE__V1__REQUEST__BODY_REMOVE, r.remove = &rm; break;
  case SEED_COPY: cp.src = seq, cp.dst = a, cp.ntokens = b;
    r.body_case = KVCACHE__V1__REQUEST__BODY_COPY_PREFIX, r.copy_prefix = &cp; break;
  case SEED_RESUME: sp.pos = a;
    r.body_case = KVCACHE__V1__REQUEST__BODY_CAN_RESUME, r.can_resume = &sp; break;
  case SEED_TRIM: sp.pos = a;
    r.body_case = KVCACHE__V1__REQUEST__BODY_TRIM_FRONT, r.trim_front = &sp; break;
  case SEED_PIN: r.body_case = KVCACHE__V1__REQUEST__BODY_PIN, r.pin = &sr; break;
  case SEED_UNPIN: r.body_case = KVCACHE__V1__REQUEST__BODY_UNPIN, r.unpin = &sr; break;
  case SEED_INFO: r.body_case = KVCACHE__V1__REQUEST__BODY_SEQ_INFO, r.seq_info = &sr; break;
  case SEED_LIST: sl.cursor = a, sl.max = (uint32_t)b;
    r.body_case = KVCACHE__V1__REQUEST__BODY_SEQ_LIST, r.seq_list = &sl; break;
  case SEED_CLEAR: r.body_case = KVCACHE__V1__REQUEST__BODY_CACHE_CLEAR, r.cache_clear = &cr; break;
  case SEED_DROP: r.body_case = KVCACHE__V1__REQUEST__BODY_CACHE_DROP, r.cache_drop = &cr; break;
  case SEED_CLIST: r.body_case = KVCACHE__V1__REQUEST__BODY_CACHE_LIST, r.cache_list = &cl; break;
  case SEED_STATS: /* a: the top caches; b: 1 node_only, 2 a cache by name */
    st.top = (uint32_t)a, st.node_only = b == 1, st.cache = (char *)(b == 2 ? "c" : "");
    r.body_case = KVCACHE__V1__REQUEST__BODY_STATS, r.stats = &st; break;
  case SEED_PRIORITY: pr.priority = (uint32_t)a;
    r.body_case = KVCACHE__V1__REQUEST__BODY_SET_PRIORITY, r.set_priority = &pr; break;
  case SEED_PIN_TTL: pt.ttl_ms = a;
    r.body_case = KVCACHE__V1__REQUEST__BODY_PIN_TTL, r.pin_ttl = &pt; break;
  case SEED_PREFIX_TOP: top.max = (uint32_t)b;
    r.body_case = KVCACHE__V1__REQUEST__BODY_PREFIX_TOP, r.prefix_top = &top; break;
  }
  return seed_pack(&r, id, out);
}

#endif
