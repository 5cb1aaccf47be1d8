/* putget.c: put and get: sizing a transfer from the layout, packing entries into
 * the shared buffer and splitting what does not fit into several requests.
 *
 * A caller's entry is [layer][token][head][dim] over all its tokens. When an
 * entry is split by tokens, each part copies one run per layer, and its
 * token ids (a put's, if any) go with it:
 *
 *   caller k (L layers x T tokens)      shared buffer part (tokens t0..t0+m)
 *   [l0: t0 .. t0+m ...............]    [l0: m rows][l1: m rows] ...
 *   [l1: t0 .. t0+m ...............]    ... v, scales ... [ids t0 .. t0+m]
 */
#include "client.h"

#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "layout.h"

#define ALIGN 64u

/* The transfer's geometry (src/layout.h, the engine's own): the daemon
 * still checks every entry, so sizes agree by construction. */
static int resolve(const kvc_cache_t *h, const kvc_xfer_t *x, bool is_put, layout_xfer_t *r) {
  char why[128];
  int rc = layout_xfer(&h->layout, x, is_put, r, why, sizeof why);
  return rc ? client_fail(h->client, rc, "%s", why) : 0;
}

_Static_assert(sizeof(kvc_xfer_t) == 7 * 4, "kvc_xfer_t compares whole: no padding");

/* resolve, remembering the last transfer that resolved: the same one again
 * (a decode loop's) costs a comparison. */
static int resolve_memo(kvc_cache_t *h, const kvc_xfer_t *x, bool is_put, layout_xfer_t *r) {
  kvc_xfer_t want = x ? *x : (kvc_xfer_t){0};
  struct xfer_memo *m = &h->memo;
  if (m->ok && m->is_put == is_put && memcmp(&m->x, &want, sizeof want) == 0) {
    *r = m->r;
    return 0;
  }
  int rc = resolve(h, x, is_put, r);
  if (rc == 0) *m = (struct xfer_memo){.x = want, .is_put = is_put, .ok = true, .r = *r};
  return rc;
}

static uint32_t nlayers(const layout_xfer_t *r) { return r->l1 - r->l0; }

KVC_API int kvc_xfer_bytes(const kvc_cache_t *h, const kvc_xfer_t *x, bool is_put,
                           uint64_t ntokens, uint64_t *k_bytes, uint64_t *v_bytes,
                           uint64_t *scale_bytes) {
  if (!h) return KVC_E_INVAL;
  layout_xfer_t r;
  int rc = resolve(h, x, is_put, &r);
  if (rc) return rc;
  if (layout_xfer_bytes(&r, ntokens, k_bytes, v_bytes, scale_bytes))
    return client_fail(h->client, KVC_E_OVERFLOW, "transfer of %llu tokens overflows",
                       (unsigned long long)ntokens);
  return 0;
}

/* ---- one request ---------------------------------------------------------- */

typedef struct io_req {
  kvc_cache_t *h;
  const kvc_xfer_t *x;
  bool is_put;
  Kvcache__V1__IoEntry *wire;   /* max_io_entries entries */
  Kvcache__V1__IoEntry **ptrs;
  size_t n;
  /* Span keys of the entries (rare: allocated on first use, freed by
   * io_req_free): the wire's entries point into sk at io_req_send. */
  Kvcache__V1__SpanKey *sk;
  Kvcache__V1__SpanKey **skp;
  size_t nsk, skcap;
  size_t *skfirst;              /* per entry: its first span key in sk */
  uint64_t sk_bytes;            /* their bytes on the wire, about */
} io_req_t;

typedef struct part part_t;

/* The client's transfer scratch: allocated once (every transfer used to
 * calloc some 70 KB of it), kept until the client closes. */
static int scratch(kvc_client_t *c) {
  if (c->io_parts) return 0;
  uint32_t cap = c->max_io_entries;
  free(c->io_wire);
  free(c->io_ptrs);
  c->io_wire = malloc(cap * sizeof(Kvcache__V1__IoEntry));
  c->io_ptrs = malloc(cap * sizeof(Kvcache__V1__IoEntry *));
  c->io_parts = c->io_wire && c->io_ptrs ? malloc(cap * 3 * sizeof(uint64_t)) : NULL;
  if (!c->io_parts) return client_fail(c, KVC_E_NOMEM, "out of memory");
  return 0;
}

static int io_req_init(io_req_t *b, kvc_cache_t *h, const kvc_xfer_t *x, bool is_put) {
  int rc = scratch(h->client);
  if (rc) return rc;
  memset(b, 0, sizeof *b);
  b->h = h;
  b->x = x;
  b->is_put = is_put;
  b->n = 0;
  b->wire = h->client->io_wire;
  b->ptrs = h->client->io_ptrs;
  return 0;
}

static Kvcache__V1__IoEntry *io_req_add(io_req_t *b) {
  Kvcache__V1__IoEntry *w = &b->wire[b->n];
  kvcache__v1__io_entry__init(w);
  b->ptrs[b->n++] = w;
  return w;
}

static void io_req_free(io_req_t *b) {
  free(b->sk);
  free(b->skp);
  free(b->skfirst);
  b->sk = NULL, b->skp = NULL, b->skfirst = NULL;
}

/* Wire bytes of the span keys of sp[0..n) that overlap [lo, hi), about. */
static uint64_t spans_bytes(const kvc_span_key_t *sp, size_t n, uint64_t lo, uint64_t hi) {
  uint64_t bytes = 0;
  for (size_t i = 0; sp && i < n; i++)
    if (sp[i].end > lo && sp[i].begin < hi) bytes += sp[i].key_len + 32;
  return bytes;
}

/* Gives the last entry added the span keys of sp[0..n) that overlap
 * [lo, hi) (the daemon clips them to the entry). */
static int io_req_spans(io_req_t *b, const kvc_span_key_t *sp, size_t n, uint64_t lo,
                        uint64_t hi) {
  kvc_client_t *c = b->h->client;
  if (!sp || !n) return 0;
  if (!b->skfirst && !(b->skfirst = calloc(c->max_io_entries + 1, sizeof *b->skfirst)))
    return client_fail(c, KVC_E_NOMEM, "out of memory");
  Kvcache__V1__IoEntry *w = b->ptrs[b->n - 1];
  b->skfirst[b->n - 1] = b->nsk;
  for (size_t i = 0; i < n; i++) {
    if (sp[i].end <= lo || sp[i].begin >= hi) continue;
    if (b->nsk == b->skcap) {
      size_t cap = b->skcap ? 2 * b->skcap : 64;
      Kvcache__V1__SpanKey *sk = realloc(b->sk, cap * sizeof *sk);
      if (sk) b->sk = sk;
      Kvcache__V1__SpanKey **skp = sk ? realloc(b->skp, cap * sizeof *skp) : NULL;
      if (!skp) return client_fail(c, KVC_E_NOMEM, "out of memory");
      b->skp = skp;
      b->skcap = cap;
    }
    codec_span_key_to_wire(&sp[i], &b->sk[b->nsk++]);
    w->n_span_keys++;
    b->sk_bytes += sp[i].key_len + 32;
  }
  return 0;
}

/* Points each entry's span keys into sk (moved by realloc meanwhile). */
static void io_req_span_ptrs(io_req_t *b) {
  for (size_t i = 0; i < b->nsk; i++) b->skp[i] = &b->sk[i];
  for (size_t i = 0; i < b->n; i++)
    if (b->ptrs[i]->n_span_keys) b->ptrs[i]->span_keys = b->skp + b->skfirst[i];
}

/* Sends the batch's entries as one Io request. */
static int io_req_send(io_req_t *b) {
  Kvcache__V1__Xfer wx;
  Kvcache__V1__Io io = KVCACHE__V1__IO__INIT;
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  codec_xfer_to_wire(b->x, &wx);
  io.cache_id = b->h->id;
  io.xfer = &wx;
  io.n_entries = b->n;
  io.entries = b->ptrs;
  io_req_span_ptrs(b);
  if (b->is_put) { /* the key of any token ids the entries carry */
    io.salt = client_salt(b->h);
    io.extra = client_extra(b->h);
  }
  if (b->is_put) {
    req.body_case = KVCACHE__V1__REQUEST__BODY_PUT;
    req.put = &io;
  } else {
    req.body_case = KVCACHE__V1__REQUEST__BODY_GET;
    req.get = &io;
  }
  b->n = 0;
  b->nsk = 0;
  b->sk_bytes = 0;
  return client_call(b->h->client, &req, NULL);
}

/* ---- the pointer forms: copy through the shared buffer --------------------- */

struct part {
  const kvc_io_t *e; /* the caller's entry */
  uint64_t t0, m;    /* its tokens [t0, t0 + m) */
};
_Static_assert(sizeof(part_t) <= 3 * sizeof(uint64_t), "scratch() sizes parts as 3 words");

/* Copies m tokens starting at t0 of each of nl layers between the caller's
 * buffer (total tokens per layer) and a packed run in the shared buffer. */
static void copy_rows(uint8_t *shm, uint8_t *user, uint32_t nl, uint64_t total, uint64_t t0,
                      uint64_t m, uint64_t row, bool to_shm) {
  if (!user || m == 0 || row == 0) return;
  if (t0 == 0 && m == total) {
    if (to_shm) memcpy(shm, user, nl * m * row);
    else memcpy(user, shm, nl * m * row);
    return;
  }
  for (uint32_t l = 0; l < nl; l++) {
    uint8_t *u = user + (l * total + t0) * row, *s = shm + l * m * row;
    if (to_shm) memcpy(s, u, m * row);
    else memcpy(u, s, m * row);
  }
}

static uint64_t align_up(uint64_t v) { return (v + ALIGN - 1) & ~(uint64_t)(ALIGN - 1); }

/* Places part p at *used in the shared buffer and fills its wire entry. */
static void place(kvc_client_t *c, const layout_xfer_t *r, const part_t *p, Kvcache__V1__IoEntry *w,
                  uint64_t *used, bool is_put) {
  uint64_t kb = nlayers(r) * p->m * r->k_row, vb = nlayers(r) * p->m * r->v_row;
  uint64_t sb = nlayers(r) * p->m * r->s_row;
  w->seq_id = p->e->seq_id;
  w->pos = p->e->pos + p->t0;
  w->ntokens = p->m;
  w->k_off = *used;
  w->k_len = kb;
  w->v_off = align_up(w->k_off + kb);
  w->v_len = vb;
  w->ks_off = align_up(w->v_off + vb);
  w->ks_len = sb;
  w->vs_off = align_up(w->ks_off + sb);
  w->vs_len = sb;
  *used = align_up(w->vs_off + sb);
  if (!is_put) return;
  uint64_t T = p->e->ntokens;
  copy_rows(c->shm + w->k_off, p->e->k, nlayers(r), T, p->t0, p->m, r->k_row, true);
  copy_rows(c->shm + w->v_off, p->e->v, nlayers(r), T, p->t0, p->m, r->v_row, true);
  if (p->e->tokens && p->m) {
    w->tok_off = *used;
    w->tok_len = p->m * sizeof *p->e->tokens;
    memcpy(c->shm + w->tok_off, p->e->tokens + p->t0, w->tok_len);
    *used = align_up(w->tok_off + w->tok_len);
  }
}

static void unplace(kvc_client_t *c, const layout_xfer_t *r, const part_t *p,
                    const Kvcache__V1__IoEntry *w) {
  uint64_t T = p->e->ntokens;
  copy_rows(c->shm + w->k_off, p->e->k, nlayers(r), T, p->t0, p->m, r->k_row, false);
  copy_rows(c->shm + w->v_off, p->e->v, nlayers(r), T, p->t0, p->m, r->v_row, false);
  copy_rows(c->shm + w->ks_off, (uint8_t *)p->e->k_scale, nlayers(r), T, p->t0, p->m, r->s_row, false);
  copy_rows(c->shm + w->vs_off, (uint8_t *)p->e->v_scale, nlayers(r), T, p->t0, p->m, r->s_row, false);
}

static int flush(io_req_t *b, const layout_xfer_t *r, part_t *parts, uint64_t *used) {
  size_t n = b->n;
  int rc = io_req_send(b);
  if (rc == 0 && !b->is_put)
    for (size_t i = 0; i < n; i++) unplace(b->h->client, r, &parts[i], &b->wire[i]);
  *used = 0;
  return rc;
}

static int check_entry(kvc_client_t *c, const layout_xfer_t *r, const kvc_io_t *e, size_t i, bool is_put) {
  uint64_t kb, vb, sb;
  if (layout_xfer_bytes(r, e->ntokens, &kb, &vb, &sb) != 0)
    return client_fail(c, KVC_E_OVERFLOW, "entry %zu: %llu tokens overflow a size", i,
                       (unsigned long long)e->ntokens);
  if (e->ntokens && is_put && (!e->k || !e->v))
    return client_fail(c, KVC_E_INVAL, "entry %zu: NULL k or v", i);
  if (e->tokens && !is_put)
    return client_fail(c, KVC_E_INVAL, "entry %zu: token ids go with puts only", i);
  return 0;
}

static int transfer(kvc_cache_t *h, const kvc_xfer_t *x, const kvc_io_t *entries, size_t n,
                    bool is_put) {
  if (!h) return KVC_E_INVAL;
  kvc_client_t *c = h->client;
  if (!entries && n) return client_fail(c, KVC_E_INVAL, "entries is NULL");
  layout_xfer_t r;
  int rc = resolve(h, x, is_put, &r);
  for (size_t i = 0; rc == 0 && i < n; i++) rc = check_entry(c, &r, &entries[i], i, is_put);
  if (rc) return rc;
  io_req_t b;
  if ((rc = io_req_init(&b, h, x, is_put)) != 0) return rc;
  part_t *parts = c->io_parts;
  /* Bytes of one token in the buffer, and the alignment slack of a part. */
  bool tokened = false;
  for (size_t i = 0; i < n; i++) tokened |= entries[i].tokens != NULL;
  uint64_t per_token = nlayers(&r) * (r.k_row + r.v_row + 2 * r.s_row) + (tokened ? 4u : 0u);
  uint64_t slack = 5 * ALIGN;
  uint64_t used = 0;
  for (size_t i = 0; rc == 0 && i < n; i++) {
    const kvc_io_t *e = &entries[i];
    uint64_t t0 = 0;
    for (;;) {
      uint64_t rem = e->ntokens - t0, room = c->shm_use > used ? c->shm_use - used : 0;
      uint64_t fit = room > slack ? (room - slack) / (per_token ? per_token : 1) : 0;
      uint64_t m = rem < fit ? rem : fit;
      /* span keys ride in the frame: a full one goes first */
      uint64_t skb = is_put ? spans_bytes(e->span_keys, e->nspan_keys, e->pos + t0,
                                          e->pos + t0 + m) : 0;
      bool frame_full = skb && b.n && c->info.max_frame_bytes &&
                        b.sk_bytes + skb + (b.n + 1) * 160 + 512 > c->info.max_frame_bytes;
      if ((m == 0 && rem > 0) || b.n == c->max_io_entries || frame_full) {
        if (b.n == 0) {
          rc = client_fail(c, KVC_E_SIZE,
                           "one token needs %llu bytes, the shared buffer has %llu for the "
                           "library: open the client with a larger shm_bytes",
                           (unsigned long long)per_token, (unsigned long long)c->shm_use);
          break;
        }
        if ((rc = flush(&b, &r, parts, &used)) != 0) break;
        continue;
      }
      part_t *p = &parts[b.n];
      *p = (part_t){.e = e, .t0 = t0, .m = m};
      place(c, &r, p, io_req_add(&b), &used, is_put);
      if (skb && (rc = io_req_spans(&b, e->span_keys, e->nspan_keys, e->pos + t0,
                                    e->pos + t0 + m)))
        break;
      t0 += m;
      if (t0 >= e->ntokens) break;
    }
  }
  if (rc == 0 && b.n) rc = flush(&b, &r, parts, &used);
  io_req_free(&b);
  return rc;
}

KVC_API int kvc_put_batch(kvc_cache_t *h, const kvc_xfer_t *x, const kvc_io_t *entries,
                          size_t n) {
  return transfer(h, x, entries, n, true);
}

KVC_API int kvc_get_batch(kvc_cache_t *h, const kvc_xfer_t *x, const kvc_io_t *entries,
                          size_t n) {
  return transfer(h, x, entries, n, false);
}

KVC_API int kvc_put(kvc_cache_t *h, uint64_t seq_id, uint64_t pos, uint64_t ntokens,
                    const void *k, const void *v) {
  kvc_io_t e = {.seq_id = seq_id, .pos = pos, .ntokens = ntokens, .k = (void *)k, .v = (void *)v};
  return transfer(h, NULL, &e, 1, true);
}

KVC_API int kvc_put_tokens(kvc_cache_t *h, uint64_t seq_id, uint64_t pos, uint64_t ntokens,
                           const void *k, const void *v, const uint32_t *tokens) {
  if (h && ntokens && !tokens) return client_fail(h->client, KVC_E_INVAL, "tokens is NULL");
  kvc_io_t e = {.seq_id = seq_id, .pos = pos, .ntokens = ntokens, .k = (void *)k,
                .v = (void *)v, .tokens = tokens};
  return transfer(h, NULL, &e, 1, true);
}

static int get_range(kvc_cache_t *h, uint64_t begin, uint64_t end) {
  if (!h) return KVC_E_INVAL;
  if (end < begin)
    return client_fail(h->client, KVC_E_RANGE, "end %llu precedes begin %llu",
                       (unsigned long long)end, (unsigned long long)begin);
  return 0;
}

KVC_API int kvc_get(kvc_cache_t *h, uint64_t seq_id, uint64_t begin, uint64_t end, void *k,
                    void *v) {
  int rc = get_range(h, begin, end);
  if (rc) return rc;
  kvc_io_t e = {.seq_id = seq_id, .pos = begin, .ntokens = end - begin, .k = k, .v = v};
  return transfer(h, NULL, &e, 1, false);
}

KVC_API int kvc_get_token(kvc_cache_t *h, uint64_t seq_id, uint64_t pos, const kvc_xfer_t *x,
                          void *k, void *v) {
  kvc_io_t e = {.seq_id = seq_id, .pos = pos, .ntokens = 1, .k = k, .v = v};
  return transfer(h, x, &e, 1, false);
}

KVC_API int kvc_get_head(kvc_cache_t *h, uint64_t seq_id, uint32_t layer, uint32_t head,
                         uint64_t begin, uint64_t end, void *k, void *v) {
  int rc = get_range(h, begin, end);
  if (rc) return rc;
  if (layer == UINT32_MAX || head == UINT32_MAX)
    return client_fail(h->client, layer == UINT32_MAX ? KVC_E_LAYER : KVC_E_HEAD,
                       "layer or head out of range");
  kvc_xfer_t x = {.layer_begin = layer, .layer_end = layer + 1, .head_begin = head,
                  .head_end = head + 1};
  kvc_io_t e = {.seq_id = seq_id, .pos = begin, .ntokens = end - begin, .k = k, .v = v};
  return transfer(h, &x, &e, 1, false);
}

KVC_API int kvc_get_raw(kvc_cache_t *h, uint64_t seq_id, uint64_t begin, uint64_t end,
                        const kvc_xfer_t *x, int8_t *k, int8_t *v, float *k_scale,
                        float *v_scale) {
  int rc = get_range(h, begin, end);
  if (rc) return rc;
  if (h->layout.dtype != KVC_DTYPE_INT8)
    return client_fail(h->client, KVC_E_DTYPE, "raw reads need an int8 cache");
  kvc_xfer_t rx = x ? *x : (kvc_xfer_t){0};
  rx.dtype = KVC_DTYPE_INT8;
  kvc_io_t e = {.seq_id = seq_id, .pos = begin, .ntokens = end - begin, .k = k, .v = v,
                .k_scale = k_scale, .v_scale = v_scale};
  return transfer(h, &rx, &e, 1, false);
}

/* ---- the direct-buffer forms ---------------------------------------------- */

/* A direct-buffer entry on the wire; lengths it does not state follow from
 * the transfer r (NULL: unknown, sent as 0 for the daemon to judge). */
static void shm_entry(const layout_xfer_t *r, const kvc_shm_io_t *e, Kvcache__V1__IoEntry *w) {
  uint64_t kb = 0, vb = 0, sb = 0;
  if (!r || layout_xfer_bytes(r, e->ntokens, &kb, &vb, &sb) != 0) kb = vb = sb = 0;
  w->seq_id = e->seq_id;
  w->pos = e->pos;
  w->ntokens = e->ntokens;
  w->k_off = e->k_off;
  w->k_len = e->k_len ? e->k_len : kb;
  w->v_off = e->v_off;
  w->v_len = e->v_len ? e->v_len : vb;
  w->ks_off = e->k_scale_off;
  w->ks_len = sb;
  w->vs_off = e->v_scale_off;
  w->vs_len = sb;
  w->tok_off = e->tok_off;
  w->tok_len = e->tok_len;
}

/* The entry as a fast request (proto/ringfast.h), if it is one: a transfer
 * whose every field fits the struct and whose lengths are its own, without
 * scales, token ids or span keys. Anything else goes as a Request, so the
 * daemon's answer to it stays what it was. */
static bool fast_entry(const kvc_cache_t *h, const kvc_xfer_t *x, const layout_xfer_t *r,
                       const kvc_shm_io_t *e, bool is_put, ringfast_req_t *q) {
  kvc_xfer_t d = x ? *x : (kvc_xfer_t){0};
  uint64_t kb, vb, sb;
  if (d.layer_begin > UINT16_MAX || d.layer_end > UINT16_MAX || d.head_begin > UINT16_MAX ||
      d.head_end > UINT16_MAX || (uint32_t)d.dtype > UINT8_MAX || d.k_scale != 0 ||
      d.v_scale != 0 || e->ntokens > UINT32_MAX || layout_xfer_bytes(r, e->ntokens, &kb, &vb, &sb) ||
      sb || (e->k_len && e->k_len != kb) || (e->v_len && e->v_len != vb) || e->k_scale_off ||
      e->v_scale_off || e->tok_off || e->tok_len || e->span_keys || e->nspan_keys)
    return false;
  *q = (ringfast_req_t){.kind = is_put ? RINGFAST_PUT : RINGFAST_GET,
                        .dtype = (uint8_t)d.dtype,
                        .cache_id = h->id,
                        .layer_begin = (uint16_t)d.layer_begin,
                        .layer_end = (uint16_t)d.layer_end,
                        .head_begin = (uint16_t)d.head_begin,
                        .head_end = (uint16_t)d.head_end,
                        .ntokens = (uint32_t)e->ntokens,
                        .seq_id = e->seq_id,
                        .pos = e->pos,
                        .k_off = e->k_off,
                        .v_off = e->v_off};
  return true;
}

static int transfer_shm(kvc_cache_t *h, const kvc_xfer_t *x, const kvc_shm_io_t *entries,
                        size_t n, bool is_put) {
  if (!h) return KVC_E_INVAL;
  kvc_client_t *c = h->client;
  if (!entries && n) return client_fail(c, KVC_E_INVAL, "entries is NULL");
  layout_xfer_t r;
  io_req_t b;
  /* Entries go out as they are: the daemon judges (and counts) bad ranges,
   * dtypes, sizes and offsets; lengths it cannot derive are sent as 0. */
  bool sized = resolve_memo(h, x, is_put, &r) == 0;
  c->err[0] = '\0';
  ringfast_req_t q;
  if (n == 1 && sized && client_fast_ok(c) && fast_entry(h, x, &r, entries, is_put, &q)) {
    ringfast_rep_t rep;
    return client_call_fast(c, &q, &rep);
  }
  int rc = io_req_init(&b, h, x, is_put);
  if (rc) return rc;
  for (size_t i = 0; rc == 0 && i < n; i++) {
    const kvc_shm_io_t *e = &entries[i];
    uint64_t skb = spans_bytes(e->span_keys, e->nspan_keys, 0, UINT64_MAX);
    if (skb && b.n && c->info.max_frame_bytes &&
        b.sk_bytes + skb + (b.n + 1) * 160 + 512 > c->info.max_frame_bytes &&
        (rc = io_req_send(&b)))
      break;
    shm_entry(sized ? &r : NULL, e, io_req_add(&b));
    if ((rc = io_req_spans(&b, e->span_keys, e->nspan_keys, 0, UINT64_MAX))) break;
    if (b.n == c->max_io_entries || i + 1 == n) rc = io_req_send(&b);
  }
  io_req_free(&b);
  return rc;
}

KVC_API int kvc_put_shm(kvc_cache_t *h, const kvc_xfer_t *x, const kvc_shm_io_t *entries,
                        size_t n) {
  return transfer_shm(h, x, entries, n, true);
}

KVC_API int kvc_get_shm(kvc_cache_t *h, const kvc_xfer_t *x, const kvc_shm_io_t *entries,
                        size_t n) {
  return transfer_shm(h, x, entries, n, false);
}

/* ---- the decode step -------------------------------------------------------- */

/* Fills the step's results from the reply; leases for a lease view. */
static int step_done(kvc_cache_t *h, const Kvcache__V1__StepReply *sr, kvc_step_t *s) {
  kvc_client_t *c = h->client;
  const Kvcache__V1__HistoryReply *hr = sr->history;
  memset(&s->hist, 0, sizeof s->hist);
  if (s->view == KVC_VIEW_NONE) return 0;
  if (!hr) return client_fail(c, KVC_E_PROTO, "step reply without its view");
  s->hist = (kvc_hist_t){hr->entries, sr->k_off, hr->k_len, sr->v_off, hr->v_len, sr->mask_off,
                         hr->mask_len, hr->n_spans};
  for (size_t i = 0; s->spans && i < hr->n_spans && i < s->spans_cap; i++)
    codec_hist_span_from_wire(hr->spans[i], &s->spans[i]);
  int prc = client_hist_positions(c, hr, &s->hist.positions);
  if (prc) return prc; /* (a lease view's leases are not taken: nothing to release) */
  if (s->view != KVC_VIEW_LEASE) return 0;
  if (sr->n_leases != hr->n_spans) return client_fail(c, KVC_E_PROTO, "step reply: a lease per span");
  int rc = 0;
  for (size_t i = 0; i < sr->n_leases; i++) {
    kvc_hist_span_t sp;
    codec_hist_span_from_wire(hr->spans[i], &sp);
    if (rc == 0) rc = client_lease_take(h, sr->leases[i], sp.seq_id, sp.pos, sp.pos + sp.n,
                                        &s->leases[i]);
    else if (c->nrelease < sizeof c->release_q / sizeof c->release_q[0])
      c->release_q[c->nrelease++] = sr->leases[i]->lease_id; /* goes with the next request */
  }
  return rc;
}

KVC_API int kvc_step(kvc_cache_t *h, const kvc_xfer_t *x, const kvc_shm_io_t *entries,
                     size_t n, kvc_step_t *s) {
  if (!h) return KVC_E_INVAL;
  kvc_client_t *c = h->client;
  if (!s || (!entries && n)) return client_fail(c, KVC_E_INVAL, "kvc_step: NULL argument");
  if (s->view != KVC_VIEW_NONE && s->view != KVC_VIEW_LEASE && s->view != KVC_VIEW_GATHER)
    return client_fail(c, KVC_E_INVAL, "kvc_step: unknown view %d", (int)s->view);
  if (n > c->max_io_entries)
    return client_fail(c, KVC_E_TOOMANY, "a step of %zu entries exceeds the daemon's %u per "
                       "request (a step is one request)", n, c->max_io_entries);
  if (s->view == KVC_VIEW_LEASE) {
    if (!client_may_lease(c))
      return client_need_pool(c, "use the gathered view (C: KVC_VIEW_GATHER, Python: "
                              "view=\"gather\")");
    if (!s->leases || s->leases_cap < n)
      return client_fail(c, KVC_E_INVAL, "kvc_step: a lease view needs leases_cap >= %zu (a "
                         "lease per entry's sequence)", n);
    for (size_t i = 0; i < n; i++) s->leases[i] = NULL;
  }
  layout_xfer_t r;
  bool sized = resolve(h, x, true, &r) == 0;
  c->err[0] = '\0';
  io_req_t b;
  int rc = io_req_init(&b, h, x, true);
  if (rc) return rc;
  for (size_t i = 0; rc == 0 && i < n; i++) {
    shm_entry(sized ? &r : NULL, &entries[i], io_req_add(&b));
    rc = io_req_spans(&b, entries[i].span_keys, entries[i].nspan_keys, 0, UINT64_MAX);
  }
  if (rc) {
    io_req_free(&b);
    return rc;
  }
  io_req_span_ptrs(&b);
  Kvcache__V1__Xfer wx;
  Kvcache__V1__Step st = KVCACHE__V1__STEP__INIT;
  codec_xfer_to_wire(x, &wx);
  st.cache_id = h->id;
  st.xfer = &wx;
  st.n_entries = b.n;
  st.entries = b.ptrs;
  st.salt = client_salt(h);
  st.extra = client_extra(h);
  st.view = (Kvcache__V1__StepView)s->view;
  st.out_off = s->out_off;
  st.out_len = s->out_len;
  st.no_mask = s->no_mask;
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  req.body_case = KVCACHE__V1__REQUEST__BODY_STEP;
  req.step = &st;
  Kvcache__V1__Response *resp;
  rc = client_call(c, &req, &resp);
  io_req_free(&b);
  if (rc) return rc;
  if (resp->body_case != KVCACHE__V1__RESPONSE__BODY_STEP || !resp->step)
    rc = client_fail(c, KVC_E_PROTO, "step reply without a step");
  else
    rc = step_done(h, resp->step, s);
  kvcache__v1__response__free_unpacked(resp, NULL);
  return rc;
}
