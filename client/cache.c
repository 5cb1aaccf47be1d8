/* cache.c: cache handles and the sequence operations that carry no tensor
 * bytes (remove, copy_prefix, can_resume, trim_front, pins, priority, info,
 * list). */
#include "client.h"

#include <stdlib.h>
#include <string.h>

#include "codec.h"

#define REQ(body_field, CASE, value)                                           \
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;                        \
  req.body_case = KVCACHE__V1__REQUEST__BODY_##CASE;                            \
  req.body_field = (value)

static kvc_cache_t *cache_new(kvc_client_t *c, const char *name, uint32_t id,
                              const kvc_layout_t *layout, uint64_t page_bytes) {
  kvc_cache_t *h = calloc(1, sizeof *h);
  if (!h) return NULL;
  h->client = c;
  h->id = id;
  h->page_bytes = page_bytes;
  h->layout = *layout;
  if (h->layout.page_tokens == 0) h->layout.page_tokens = KVC_DEFAULT_PAGE_TOKENS;
  kvc_layout_t n = layout_normalize(&h->layout); /* as the engine keeps it */
  h->geom_ok = layout_geom(&n, &h->geom) == 0;
  strncpy(h->name, name, KVC_MAX_NAME);
  h->next = c->caches;
  if (c->caches) c->caches->prev = h;
  c->caches = h;
  return h;
}

/* A key of at most KVC_MAX_KEY_BYTES, or the reason it is not. */
static int key_check(kvc_client_t *c, const char *what, const void *p, size_t len) {
  if (len > KVC_MAX_KEY_BYTES)
    return client_fail(c, KVC_E_INVAL, "%s of %zu bytes: at most %u", what, len,
                       KVC_MAX_KEY_BYTES);
  if (len && !p) return client_fail(c, KVC_E_INVAL, "%s is NULL with a length of %zu", what, len);
  return 0;
}

KVC_API int kvc_cache_open(kvc_client_t *c, const char *name, const kvc_layout_t *layout,
                           kvc_cache_t **out) {
  return kvc_cache_open_salted(c, name, layout, NULL, 0, out);
}

KVC_API int kvc_cache_open_salted(kvc_client_t *c, const char *name,
                                  const kvc_layout_t *layout, const void *salt,
                                  size_t salt_len, kvc_cache_t **out) {
  if (!c) return KVC_E_INVAL;
  if (!name || !layout || !out)
    return client_fail(c, KVC_E_INVAL, "kvc_cache_open: name, layout and out are required");
  *out = NULL;
  int rc = key_check(c, "salt", salt, salt_len);
  if (rc) return rc;
  Kvcache__V1__Layout wl;
  codec_layout_to_wire(layout, &wl);
  Kvcache__V1__CacheOpen co = KVCACHE__V1__CACHE_OPEN__INIT;
  co.name = (char *)name;
  co.layout = &wl;
  REQ(cache_open, CACHE_OPEN, &co);
  Kvcache__V1__Response *r;
  if ((rc = client_call(c, &req, &r))) return rc;
  if (r->body_case != KVCACHE__V1__RESPONSE__BODY_CACHE_OPEN) {
    kvcache__v1__response__free_unpacked(r, NULL);
    return client_fail(c, KVC_E_PROTO, "cache_open reply without a body");
  }
  *out = cache_new(c, name, r->cache_open->cache_id, layout, r->cache_open->page_bytes);
  kvcache__v1__response__free_unpacked(r, NULL);
  if (!*out) return client_fail(c, KVC_E_NOMEM, "out of memory");
  if (salt_len) memcpy((*out)->salt, salt, salt_len);
  (*out)->salt_len = (uint32_t)salt_len;
  return 0;
}

KVC_API int kvc_cache_set_extra(kvc_cache_t *h, const void *extra, size_t extra_len) {
  if (!h) return KVC_E_INVAL;
  int rc = key_check(h->client, "extra key", extra, extra_len);
  if (rc) return rc;
  if (extra_len) memcpy(h->extra, extra, extra_len);
  h->extra_len = (uint32_t)extra_len;
  return 0;
}

ProtobufCBinaryData client_salt(const kvc_cache_t *h) {
  return (ProtobufCBinaryData){.len = h->salt_len, .data = (uint8_t *)h->salt};
}

ProtobufCBinaryData client_extra(const kvc_cache_t *h) {
  return (ProtobufCBinaryData){.len = h->extra_len, .data = (uint8_t *)h->extra};
}

KVC_API int kvc_cache_list(kvc_client_t *c, kvc_cache_info_t *out, size_t cap, size_t *n) {
  if (!c) return KVC_E_INVAL;
  if (!n || (cap && !out))
    return client_fail(c, KVC_E_INVAL, "kvc_cache_list: n is required, out with cap");
  Kvcache__V1__Empty e = KVCACHE__V1__EMPTY__INIT;
  REQ(cache_list, CACHE_LIST, &e);
  Kvcache__V1__Response *r;
  int rc = client_call(c, &req, &r);
  if (rc) return rc;
  const Kvcache__V1__CacheListReply *l =
      r->body_case == KVCACHE__V1__RESPONSE__BODY_CACHE_LIST ? r->cache_list : NULL;
  size_t count = l ? l->n_caches : 0;
  for (size_t i = 0; i < count && i < cap; i++) codec_cache_info_from_wire(l->caches[i], &out[i]);
  *n = count;
  kvcache__v1__response__free_unpacked(r, NULL);
  return 0;
}

KVC_API int kvc_cache_find(kvc_client_t *c, const char *name, kvc_cache_t **out) {
  if (!c) return KVC_E_INVAL;
  if (!name || !out) return client_fail(c, KVC_E_INVAL, "kvc_cache_find: name and out required");
  *out = NULL;
  size_t n = 0;
  int rc = kvc_cache_list(c, NULL, 0, &n);
  if (rc) return rc;
  kvc_cache_info_t *infos = calloc(n ? n : 1, sizeof *infos);
  if (!infos) return client_fail(c, KVC_E_NOMEM, "out of memory");
  size_t got = 0;
  rc = kvc_cache_list(c, infos, n, &got);
  if (rc == 0) {
    rc = client_fail(c, KVC_E_NOCACHE, "no cache named '%s'", name);
    for (size_t i = 0; i < got && i < n; i++) {
      if (strcmp(infos[i].name, name) != 0) continue;
      *out = cache_new(c, name, infos[i].cache_id, &infos[i].layout, infos[i].page_bytes);
      rc = *out ? 0 : client_fail(c, KVC_E_NOMEM, "out of memory");
      if (rc == 0) c->err[0] = '\0';
      break;
    }
  }
  free(infos);
  return rc;
}

KVC_API void kvc_cache_close(kvc_cache_t *h) {
  if (!h) return;
  kvc_client_t *c = h->client;
  if (h->prev) h->prev->next = h->next;
  else c->caches = h->next;
  if (h->next) h->next->prev = h->prev;
  free(h);
}

KVC_API const kvc_layout_t *kvc_cache_layout(const kvc_cache_t *h) { return h ? &h->layout : NULL; }
KVC_API const char *kvc_cache_name(const kvc_cache_t *h) { return h ? h->name : ""; }
KVC_API uint32_t kvc_cache_id(const kvc_cache_t *h) { return h ? h->id : 0; }

KVC_API int kvc_cache_clear(kvc_cache_t *h) {
  if (!h) return KVC_E_INVAL;
  Kvcache__V1__CacheRef ref = KVCACHE__V1__CACHE_REF__INIT;
  ref.cache_id = h->id;
  REQ(cache_clear, CACHE_CLEAR, &ref);
  return client_call(h->client, &req, NULL);
}

KVC_API int kvc_cache_drop(kvc_cache_t *h) {
  if (!h) return KVC_E_INVAL;
  Kvcache__V1__CacheRef ref = KVCACHE__V1__CACHE_REF__INIT;
  ref.cache_id = h->id;
  REQ(cache_drop, CACHE_DROP, &ref);
  return client_call(h->client, &req, NULL);
}

/* ---- sequences ------------------------------------------------------------ */

KVC_API int kvc_seq_remove(kvc_cache_t *h, uint64_t seq_id, uint64_t begin, uint64_t end) {
  if (!h) return KVC_E_INVAL;
  Kvcache__V1__Remove b = KVCACHE__V1__REMOVE__INIT;
  b.cache_id = h->id;
  b.seq_id = seq_id;
  b.begin = begin;
  b.end = end;
  REQ(remove, REMOVE, &b);
  return client_call(h->client, &req, NULL);
}

static int copy_prefix(kvc_cache_t *h, uint64_t src, uint64_t dst, uint64_t begin,
                       uint64_t ntokens, bool no_replace) {
  if (!h) return KVC_E_INVAL;
  Kvcache__V1__CopyPrefix b = KVCACHE__V1__COPY_PREFIX__INIT;
  b.cache_id = h->id;
  b.src = src;
  b.dst = dst;
  b.begin = begin;
  b.ntokens = ntokens;
  b.no_replace = no_replace;
  REQ(copy_prefix, COPY_PREFIX, &b);
  return client_call(h->client, &req, NULL);
}

KVC_API int kvc_seq_copy_prefix(kvc_cache_t *h, uint64_t src, uint64_t dst, uint64_t ntokens) {
  return copy_prefix(h, src, dst, 0, ntokens, false);
}

KVC_API int kvc_seq_copy_prefix_new(kvc_cache_t *h, uint64_t src, uint64_t dst,
                                    uint64_t ntokens) {
  return copy_prefix(h, src, dst, 0, ntokens, true);
}

KVC_API int kvc_seq_copy_range(kvc_cache_t *h, uint64_t src, uint64_t dst, uint64_t p0,
                               uint64_t p1) {
  return copy_prefix(h, src, dst, p0, p1, false);
}

KVC_API int kvc_seq_create(kvc_cache_t *h, size_t n, bool owned, uint64_t *ids) {
  if (!h) return KVC_E_INVAL;
  if (!ids || n == 0 || n > 4096)
    return client_fail(h->client, KVC_E_INVAL, "kvc_seq_create: 1 to 4096 ids into ids");
  Kvcache__V1__SeqCreate b = KVCACHE__V1__SEQ_CREATE__INIT;
  b.cache_id = h->id;
  b.count = (uint32_t)n;
  b.owned = owned;
  REQ(seq_create, SEQ_CREATE, &b);
  Kvcache__V1__Response *r;
  int rc = client_call(h->client, &req, &r);
  if (rc) return rc;
  if (r->body_case != KVCACHE__V1__RESPONSE__BODY_SEQ_CREATE || !r->seq_create ||
      r->seq_create->n_seq_ids != n)
    rc = client_fail(h->client, KVC_E_PROTO, "seq_create reply without its %zu ids", n);
  for (size_t i = 0; rc == 0 && i < n; i++) ids[i] = r->seq_create->seq_ids[i];
  kvcache__v1__response__free_unpacked(r, NULL);
  return rc;
}

KVC_API int kvc_seq_can_resume(kvc_cache_t *h, uint64_t seq_id, uint64_t pos, bool *out) {
  if (!h) return KVC_E_INVAL;
  if (!out) return client_fail(h->client, KVC_E_INVAL, "kvc_seq_can_resume: out is NULL");
  Kvcache__V1__SeqPos b = KVCACHE__V1__SEQ_POS__INIT;
  b.cache_id = h->id;
  b.seq_id = seq_id;
  b.pos = pos;
  REQ(can_resume, CAN_RESUME, &b);
  Kvcache__V1__Response *r;
  int rc = client_call(h->client, &req, &r);
  if (rc) return rc;
  *out = r->body_case == KVCACHE__V1__RESPONSE__BODY_BOOL_VALUE && r->bool_value->value;
  kvcache__v1__response__free_unpacked(r, NULL);
  return 0;
}

KVC_API int kvc_seq_trim_front(kvc_cache_t *h, uint64_t seq_id, uint64_t n) {
  if (!h) return KVC_E_INVAL;
  Kvcache__V1__SeqPos b = KVCACHE__V1__SEQ_POS__INIT;
  b.cache_id = h->id;
  b.seq_id = seq_id;
  b.pos = n;
  REQ(trim_front, TRIM_FRONT, &b);
  return client_call(h->client, &req, NULL);
}

KVC_API int kvc_seq_pin(kvc_cache_t *h, uint64_t seq_id) {
  if (!h) return KVC_E_INVAL;
  Kvcache__V1__SeqRef b = KVCACHE__V1__SEQ_REF__INIT;
  b.cache_id = h->id;
  b.seq_id = seq_id;
  REQ(pin, PIN, &b);
  return client_call(h->client, &req, NULL);
}

KVC_API int kvc_seq_unpin(kvc_cache_t *h, uint64_t seq_id) {
  if (!h) return KVC_E_INVAL;
  Kvcache__V1__SeqRef b = KVCACHE__V1__SEQ_REF__INIT;
  b.cache_id = h->id;
  b.seq_id = seq_id;
  REQ(unpin, UNPIN, &b);
  return client_call(h->client, &req, NULL);
}

KVC_API int kvc_seq_pin_ttl(kvc_cache_t *h, uint64_t seq_id, uint64_t ttl_ms) {
  if (!h) return KVC_E_INVAL;
  Kvcache__V1__PinTtl b = KVCACHE__V1__PIN_TTL__INIT;
  b.cache_id = h->id;
  b.seq_id = seq_id;
  b.ttl_ms = ttl_ms;
  REQ(pin_ttl, PIN_TTL, &b);
  return client_call(h->client, &req, NULL);
}

KVC_API int kvc_seq_set_priority(kvc_cache_t *h, uint64_t seq_id, uint32_t priority) {
  if (!h) return KVC_E_INVAL;
  Kvcache__V1__SetPriority b = KVCACHE__V1__SET_PRIORITY__INIT;
  b.cache_id = h->id;
  b.seq_id = seq_id;
  b.priority = priority;
  REQ(set_priority, SET_PRIORITY, &b);
  return client_call(h->client, &req, NULL);
}

KVC_API int kvc_seq_info(kvc_cache_t *h, uint64_t seq_id, kvc_seq_info_t *out) {
  if (!h) return KVC_E_INVAL;
  if (!out) return client_fail(h->client, KVC_E_INVAL, "kvc_seq_info: out is NULL");
  Kvcache__V1__SeqRef b = KVCACHE__V1__SEQ_REF__INIT;
  b.cache_id = h->id;
  b.seq_id = seq_id;
  REQ(seq_info, SEQ_INFO, &b);
  Kvcache__V1__Response *r;
  int rc = client_call(h->client, &req, &r);
  if (rc) return rc;
  if (r->body_case == KVCACHE__V1__RESPONSE__BODY_SEQ_INFO)
    codec_seq_info_from_wire(r->seq_info, out);
  else
    rc = client_fail(h->client, KVC_E_PROTO, "seq_info reply without a body");
  kvcache__v1__response__free_unpacked(r, NULL);
  return rc;
}

KVC_API int kvc_seq_list(kvc_cache_t *h, uint64_t *cursor, kvc_seq_info_t *out, size_t cap,
                         size_t *n) {
  if (!h) return KVC_E_INVAL;
  if (!cursor || !out || !n || cap == 0)
    return client_fail(h->client, KVC_E_INVAL, "kvc_seq_list: cursor, out, cap and n required");
  Kvcache__V1__SeqList b = KVCACHE__V1__SEQ_LIST__INIT;
  b.cache_id = h->id;
  b.cursor = *cursor;
  b.max = cap > 4096 ? 4096u : (uint32_t)cap;
  REQ(seq_list, SEQ_LIST, &b);
  Kvcache__V1__Response *r;
  int rc = client_call(h->client, &req, &r);
  if (rc) return rc;
  if (r->body_case != KVCACHE__V1__RESPONSE__BODY_SEQ_LIST) {
    kvcache__v1__response__free_unpacked(r, NULL);
    return client_fail(h->client, KVC_E_PROTO, "seq_list reply without a body");
  }
  size_t count = r->seq_list->n_seqs < cap ? r->seq_list->n_seqs : cap;
  for (size_t i = 0; i < count; i++) codec_seq_info_from_wire(r->seq_list->seqs[i], &out[i]);
  *n = count;
  *cursor = r->seq_list->cursor;
  kvcache__v1__response__free_unpacked(r, NULL);
  return 0;
}

/* ---- attention-aware sequences -------------------------------------------- */

/* The batch as the two parallel arrays of the wire (malloc'd). */
static int batch_to_wire(kvc_client_t *c, const kvc_tok_t *toks, size_t n, uint64_t **seqs,
                         uint64_t **pos) {
  if (!toks || n == 0) return client_fail(c, KVC_E_INVAL, "a batch without tokens");
  *seqs = malloc(n * sizeof **seqs);
  *pos = malloc(n * sizeof **pos);
  if (!*seqs || !*pos) {
    free(*seqs);
    free(*pos);
    return client_fail(c, KVC_E_NOMEM, "out of memory");
  }
  for (size_t i = 0; i < n; i++) {
    (*seqs)[i] = toks[i].seq_id;
    (*pos)[i] = toks[i].pos;
  }
  return 0;
}

KVC_API int kvc_reserve(kvc_cache_t *h, const kvc_tok_t *toks, size_t n) {
  if (!h) return KVC_E_INVAL;
  Kvcache__V1__Reserve b = KVCACHE__V1__RESERVE__INIT;
  int rc = batch_to_wire(h->client, toks, n, &b.seq_ids, &b.positions);
  if (rc) return rc;
  b.cache_id = h->id;
  b.n_seq_ids = b.n_positions = n;
  REQ(reserve, RESERVE, &b);
  rc = client_call(h->client, &req, NULL);
  free(b.seq_ids);
  free(b.positions);
  return rc;
}

static uint64_t align64(uint64_t x) { return (x + 63) & ~(uint64_t)63; }

/* One History request; *reply is the daemon's (free it). */
static int history_call(kvc_cache_t *h, Kvcache__V1__History *b,
                        Kvcache__V1__HistoryReply **reply, Kvcache__V1__Response **r) {
  REQ(history, HISTORY, b);
  int rc = client_call(h->client, &req, r);
  if (rc) return rc;
  if ((*r)->body_case != KVCACHE__V1__RESPONSE__BODY_HISTORY) {
    kvcache__v1__response__free_unpacked(*r, NULL);
    return client_fail(h->client, KVC_E_PROTO, "history reply without a body");
  }
  *reply = (*r)->history;
  return 0;
}

KVC_API int kvc_history(kvc_cache_t *h, const kvc_xfer_t *x, const kvc_tok_t *toks, size_t n,
                        kvc_hist_t *out, kvc_hist_span_t *spans, size_t spans_cap) {
  if (!h) return KVC_E_INVAL;
  kvc_client_t *c = h->client;
  if (!out) return client_fail(c, KVC_E_INVAL, "kvc_history: out is NULL");
  Kvcache__V1__History b = KVCACHE__V1__HISTORY__INIT;
  Kvcache__V1__Xfer wx;
  int rc = batch_to_wire(c, toks, n, &b.seq_ids, &b.positions);
  if (rc) return rc;
  b.cache_id = h->id;
  b.n_seq_ids = b.n_positions = n;
  if (x) {
    codec_xfer_to_wire(x, &wx);
    b.xfer = &wx;
  }
  Kvcache__V1__Response *r = NULL;
  Kvcache__V1__HistoryReply *hr;
  if ((rc = history_call(h, &b, &hr, &r))) goto out; /* the sizes first */
  memset(out, 0, sizeof *out);
  out->k_bytes = hr->k_len;
  out->v_off = align64(hr->k_len);
  out->v_bytes = hr->v_len;
  out->mask_off = align64(out->v_off + hr->v_len);
  out->mask_bytes = hr->mask_len;
  kvcache__v1__response__free_unpacked(r, NULL);
  r = NULL;
  if (out->mask_off + out->mask_bytes > c->shm_use) {
    rc = client_fail(c, KVC_E_SIZE, "a history of %llu + %llu + %llu bytes exceeds the "
                     "%llu-byte shared buffer", (unsigned long long)out->k_bytes,
                     (unsigned long long)out->v_bytes, (unsigned long long)out->mask_bytes,
                     (unsigned long long)c->shm_use);
    goto out;
  }
  b.k_off = 0, b.k_len = out->k_bytes;
  b.v_off = out->v_off, b.v_len = out->v_bytes;
  b.mask_off = out->mask_off, b.mask_len = out->mask_bytes;
  if ((rc = history_call(h, &b, &hr, &r))) goto out;
  out->entries = hr->entries;
  out->nspans = hr->n_spans;
  for (size_t i = 0; spans && i < hr->n_spans && i < spans_cap; i++)
    codec_hist_span_from_wire(hr->spans[i], &spans[i]);
  rc = client_hist_positions(c, hr, &out->positions);
  kvcache__v1__response__free_unpacked(r, NULL);
out:
  free(b.seq_ids);
  free(b.positions);
  return rc;
}

int client_hist_positions(kvc_client_t *c, const Kvcache__V1__HistoryReply *hr,
                          const int64_t **out) {
  *out = NULL;
  if (hr->n_positions == 0) return 0;
  if (hr->n_positions != hr->entries)
    return client_fail(c, KVC_E_PROTO, "history reply: %zu positions for %llu entries",
                       hr->n_positions, (unsigned long long)hr->entries);
  if (hr->n_positions > c->hist_pos_cap) {
    int64_t *p = realloc(c->hist_pos, hr->n_positions * sizeof *p);
    if (!p) return client_fail(c, KVC_E_NOMEM, "out of memory");
    c->hist_pos = p;
    c->hist_pos_cap = hr->n_positions;
  }
  memcpy(c->hist_pos, hr->positions, hr->n_positions * sizeof *c->hist_pos);
  *out = c->hist_pos;
  return 0;
}

KVC_API int kvc_seq_div(kvc_cache_t *h, uint64_t seq_id, int64_t p0, int64_t p1, int64_t d) {
  if (!h) return KVC_E_INVAL;
  Kvcache__V1__SeqDiv b = KVCACHE__V1__SEQ_DIV__INIT;
  b.cache_id = h->id;
  b.seq_id = seq_id;
  b.p0 = p0;
  b.p1 = p1;
  b.d = d;
  REQ(seq_div, SEQ_DIV, &b);
  return client_call(h->client, &req, NULL);
}

static int shift_call(kvc_cache_t *h, bool punch, uint64_t seq_id, int64_t p0, int64_t p1,
                      int64_t delta) {
  if (!h) return KVC_E_INVAL;
  Kvcache__V1__Shift b = KVCACHE__V1__SHIFT__INIT;
  b.cache_id = h->id;
  b.seq_id = seq_id;
  b.p0 = p0;
  b.p1 = p1;
  b.delta = delta;
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  if (punch) {
    req.body_case = KVCACHE__V1__REQUEST__BODY_PUNCH;
    req.punch = &b;
  } else {
    req.body_case = KVCACHE__V1__REQUEST__BODY_SHIFT;
    req.shift = &b;
  }
  return client_call(h->client, &req, NULL);
}

KVC_API int kvc_seq_shift(kvc_cache_t *h, uint64_t seq_id, int64_t p0, int64_t p1,
                          int64_t delta) {
  return shift_call(h, false, seq_id, p0, p1, delta);
}

KVC_API int kvc_seq_punch(kvc_cache_t *h, uint64_t seq_id, int64_t p0, int64_t p1) {
  return shift_call(h, true, seq_id, p0, p1, 0);
}

KVC_API int kvc_seq_rm(kvc_cache_t *h, uint64_t seq_id, int64_t p0, int64_t p1) {
  return kvc_seq_punch(h, seq_id, p0, p1);
}

KVC_API int kvc_seq_keep(kvc_cache_t *h, uint64_t seq_id) {
  if (!h) return KVC_E_INVAL;
  Kvcache__V1__SeqRef b = KVCACHE__V1__SEQ_REF__INIT;
  b.cache_id = h->id;
  b.seq_id = seq_id;
  REQ(keep, KEEP, &b);
  return client_call(h->client, &req, NULL);
}

KVC_API int kvc_seq_pos_range(kvc_cache_t *h, uint64_t seq_id, int64_t *pos_min,
                              int64_t *pos_max) {
  if (!h) return KVC_E_INVAL;
  if (!pos_min || !pos_max)
    return client_fail(h->client, KVC_E_INVAL, "kvc_seq_pos_range: NULL out");
  Kvcache__V1__SeqRef b = KVCACHE__V1__SEQ_REF__INIT;
  b.cache_id = h->id;
  b.seq_id = seq_id;
  REQ(pos_range, POS_RANGE, &b);
  Kvcache__V1__Response *r;
  int rc = client_call(h->client, &req, &r);
  if (rc) return rc;
  if (r->body_case != KVCACHE__V1__RESPONSE__BODY_POS_RANGE) {
    kvcache__v1__response__free_unpacked(r, NULL);
    return client_fail(h->client, KVC_E_PROTO, "pos_range reply without a body");
  }
  *pos_min = r->pos_range->pos_min;
  *pos_max = r->pos_range->pos_max;
  kvcache__v1__response__free_unpacked(r, NULL);
  return 0;
}
