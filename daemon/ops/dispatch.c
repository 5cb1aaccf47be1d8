/* dispatch.c: the request handler table; each handler validates its request
 * completely, then calls the engine once and fills the reply. */
#include "dispatch.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admin.h"
#include "codec.h"
#include "events.h"
#include "iowire.h"
#include "kvcache/kvcache.h"
#include "layout.h"
#include "log.h"
#include "quotas.h"
#include "tier.h"
#include "offload.h"
#include "ring.h"
#include "ringbuf.h"
#include "ringfast.h"
#include "optable.h"
#include "poolown.h"
#include "poolresize.h"
#include "tenant.h"
#include "testhook.h"
#include "topcaches.h"

/* Every KVC_E_* code is the wire status of the same name, negated. */
#define STATUS_CHECK_(name, code, msg)                                         \
  _Static_assert(KVCACHE__V1__STATUS__##name == -(code), "wire status " #name);
KVC_ERRNO_MAP(STATUS_CHECK_)
#undef STATUS_CHECK_
_Static_assert(KVC_PROTOCOL_VERSION == KVCACHE__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT,
               "kvcache.h and kvcache.proto disagree on the protocol version");

/* Token ids travel in the shared buffer as little-endian u32 and the engine
 * reads them in place: a big-endian port must convert them first. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "token ids in the shared buffer are little-endian u32");

#define SHM_MIN_BYTES (1u << 20)
#define SEQ_LIST_DEFAULT 256u
#define SEQ_LIST_MAX 4096u
#define LEASES_PER_CONN 4096u /* leases one connection may hold at once */
#define DEFERRED 1            /* a handler's "the reply comes later" */
#define TIERS_WAIT 2          /* a handler's "run me again once the tiers answered" */
#define TOP_DEFAULT 10u
#define TOP_MAX 1000u

typedef struct reply {
  server_t *srv;
  Kvcache__V1__Response *resp;
  arena_t *a;
  int fd;            /* sent with the reply (SCM_RIGHTS) when >= 0 */
  int fd2;           /* a second one in the same message, when >= 0 */
  int fd3;           /* a third, when >= 0 */
  int nfdv;          /* else the nfdv of fdv (the pool's segments) */
  bool no_park;      /* a BUSY is the answer, not a reason to park and run again */
  bool close_after;  /* close the connection once the reply is flushed */
  bool large;        /* a get or put of at least offload_bytes (copy_where) */
  bool fast;         /* a fast request (ringfast.h): an entry's K and V lengths
                        are the transfer's own, a lease at most
                        RINGFAST_LEASE_PAGES pages */
  uint64_t t0_ns;    /* when decoding began */
  uint32_t cache_id; /* a fast request's cache (the tenant gate's, no reflection) */
  ringfast_rep_t *rep; /* a fast request's reply: a lease's pages go here, not
                          into a LeaseReply */
  /* Last, and not zeroed for each request (reply_init): */
  char err[256];     /* the one-line reason of a failure ("" until one is said) */
  int fdv[POOLMAP_FDS_MAX];
} reply_t;

typedef int (*handler_fn)(conn_t *c, const Kvcache__V1__Request *req, reply_t *r);

static int reject(reply_t *r, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int reject(reply_t *r, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->err, sizeof r->err, fmt, ap);
  va_end(ap);
  return code;
}

/* The engine's reason, and for FULL its figures. */
static int reply_engine_error(reply_t *r, int code) {
  const engine_err_t *e = engine_last_error(r->srv->eng);
  snprintf(r->err, sizeof r->err, "%s", e->msg[0] ? e->msg : kvc_strerror(code));
  if (code == KVC_E_FULL) {
    r->resp->full_needed = e->needed;
    r->resp->full_freeable = e->freeable;
  }
  return code;
}

/* ---- tenants: the one place a request meets the caller's tenant ------------ */

static const char *conn_tenant_name(const conn_t *c) {
  return tenants_name(&c->srv->tenants, c->tenant);
}

/* What the caller may do with a cache of engine tenant owner, named name. */
static enum tenant_right cache_right(const conn_t *c, uint32_t owner, const char *name) {
  if (c->admin || owner == c->tenant) return RIGHT_WRITE;
  if (owner != TENANT_SHARED) return RIGHT_NONE;
  const config_t *cfg = &c->srv->cfg;
  return tenant_shared_right(cfg->shared_rules, cfg->n_shared_rules, name, conn_tenant_name(c));
}

/* The tenant name to show for a cache the caller may see; NULL if not. */
static const char *cache_view(void *ctx, const kvc_cache_info_t *ci) {
  const conn_t *c = ctx;
  uint32_t owner;
  if (engine_cache_tenant(c->srv->eng, ci->cache_id, &owner) != 0) return NULL;
  if (cache_right(c, owner, ci->name) == RIGHT_NONE) return NULL;
  return tenants_name(&c->srv->tenants, owner);
}

/* The cache id a request names, found by reflection so that a request added
 * to the protocol with a cache_id is checked without a line here. */
static bool request_cache_id(const Kvcache__V1__Request *req, uint32_t *cache_id) {
  const ProtobufCFieldDescriptor *f =
      protobuf_c_message_descriptor_get_field(&kvcache__v1__request__descriptor,
                                              (unsigned)req->body_case);
  if (!f || f->type != PROTOBUF_C_TYPE_MESSAGE) return false;
  const ProtobufCMessage *body = *(ProtobufCMessage *const *)(const void *)((const char *)req + f->offset);
  if (!body) return false;
  /* Each body's field, looked up by name once (a strcmp walk a request). */
  static const ProtobufCMessageDescriptor *seen[128];
  static const ProtobufCFieldDescriptor *found[128];
  unsigned k = (unsigned)req->body_case;
  const ProtobufCFieldDescriptor *cf;
  if (k < 128 && seen[k] == body->descriptor) {
    cf = found[k];
  } else {
    cf = protobuf_c_message_descriptor_get_field_by_name(body->descriptor, "cache_id");
    if (k < 128) seen[k] = body->descriptor, found[k] = cf;
  }
  if (!cf || cf->type != PROTOBUF_C_TYPE_UINT32 || cf->label == PROTOBUF_C_LABEL_REPEATED)
    return false;
  *cache_id = *(const uint32_t *)(const void *)((const char *)body + cf->offset);
  return true;
}

/* Every request that names a cache passes here before its handler: a cache
 * of another tenant answers exactly as one that does not exist. A fast
 * request names its cache in a field of its own (ringfast.h). */
static int gate_cache(conn_t *c, uint32_t cache_id, enum op op, reply_t *r) {
  uint32_t owner;
  kvc_cache_info_t ci;
  if (engine_cache_tenant(c->srv->eng, cache_id, &owner) != 0)
    return reject(r, KVC_E_NOCACHE, "no cache with id %u", cache_id);
  if (c->admin || owner == c->tenant) return 0; /* cache_right: RIGHT_WRITE */
  if (engine_cache_info(c->srv->eng, cache_id, &ci) != 0)
    return reject(r, KVC_E_NOCACHE, "no cache with id %u", cache_id);
  enum tenant_right right = cache_right(c, owner, ci.name);
  if (right == RIGHT_NONE) return reject(r, KVC_E_NOCACHE, "no cache with id %u", cache_id);
  /* The operation table says what each needs (optable.h): an rw tenant of
   * a shared cache may do all a tenant may with its own, clear and drop
   * included (doc/security.md). */
  if (op_right(op) == OPR_WRITE && right < RIGHT_WRITE)
    return reject(r, KVC_E_PERM, "tenant %s may only read shared cache '%s'",
                  conn_tenant_name(c), ci.name);
  return 0;
}

static int tenant_gate(conn_t *c, const Kvcache__V1__Request *req, enum op op, reply_t *r) {
  uint32_t cache_id;
  if (!request_cache_id(req, &cache_id)) return 0;
  return gate_cache(c, cache_id, op, r);
}

#define ENGINE_CALL(r, expr)                                                   \
  do {                                                                         \
    int rc_ = (expr);                                                          \
    if (rc_ != 0) return reply_engine_error((r), rc_);                         \
  } while (0)

#define NEED_BODY(r, body, what)                                               \
  do {                                                                         \
    if (!(body)) return reject((r), KVC_E_INVAL, "%s request without a body", what); \
  } while (0)

/* ---- handshake ----------------------------------------------------------- */

static int h_hello(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  server_t *srv = c->srv;
  const Kvcache__V1__Hello *h = req->hello;
  NEED_BODY(r, h, "hello");
  if (c->greeted) return reject(r, KVC_E_PROTO, "Hello was already received");
  if (h->protocol_version != KVC_PROTOCOL_VERSION) {
    r->close_after = true;
    return reject(r, KVC_E_VERSION, "client speaks protocol %u, kvcached %s speaks %d",
                  h->protocol_version, KVC_VERSION_STRING, KVC_PROTOCOL_VERSION);
  }
  uint64_t bytes = shm_buffer_size(h->shm_bytes, srv->cfg.shm_default_bytes,
                                   SHM_MIN_BYTES, srv->cfg.shm_max_bytes);
  char why[200];
  if (quotas_shm_over(srv, c, bytes, why, sizeof why)) {
    r->close_after = true;
    return reject(r, KVC_E_QUOTA_SHM, "%s", why);
  }
  uint32_t sq_bytes = 0, cq_bytes = 0;
  if (h->rings && srv->cfg.rings && srv->rings && fdbudget_ring_fits(srv))
    ring_sizes(srv, &sq_bytes, &cq_bytes);
  uint64_t ring_bytes = sq_bytes ? ringbuf_area_bytes(sq_bytes, cq_bytes) : 0;
  int rc = shm_buffer_open(bytes, ring_bytes, &c->shm, why, sizeof why);
  if (rc == SHM_E_NOFD) {
    /* Out of descriptors is a connection limit: the client may retry later. */
    r->close_after = true;
    srv->stats.connections_rejected++;
    return reject(r, KVC_E_CONNLIMIT, "connection limit reached: no file descriptor for the "
                  "shared buffer (%s)", why);
  }
  if (rc != 0) {
    r->close_after = true;
    return reject(r, KVC_E_NOMEM, "cannot create a %llu-byte shared buffer: %s",
                  (unsigned long long)bytes, why);
  }
  Kvcache__V1__HelloReply *hr = arena_alloc(r->a, sizeof *hr);
  if (!hr) {
    shm_close(&c->shm);
    r->close_after = true;
    return reject(r, KVC_E_NOMEM, "out of memory");
  }
  /* The rings follow the buffer in its memfd. Without them (no descriptor
   * for the doorbell, say) the client simply uses the socket. */
  if (ring_bytes && ring_open(c, c->shm.fd, bytes, sq_bytes, cq_bytes, &c->ring, why,
                              sizeof why) != 0) {
    LOG_WARN("ring", "conn=%llu error=\"%s\" action=\"socket only\"",
             (unsigned long long)c->id, why);
    sq_bytes = 0;
  }
  srv->stats.shm_bytes += bytes;
  /* Escaped once here: the name goes into log lines (no forged lines). */
  tenant_log_escape(h->client_name ? h->client_name : "", c->name, sizeof c->name);
  kvcache__v1__hello_reply__init(hr);
  hr->protocol_version = KVC_PROTOCOL_VERSION;
  hr->shm_bytes = bytes;
  hr->max_frame_bytes = c->max_frame;
  hr->conn_id = c->id;
  hr->pool_bytes = srv->pool.bytes;
  hr->pool_reserve_bytes = srv->pool.reserve;
  hr->pool_gen = srv->pool.gen;
  hr->page_bytes = config_segment_bytes(&srv->cfg); /* the largest cache page */
  hr->server_version = (char *)KVC_VERSION_STRING;
  hr->max_entries = srv->cfg.max_entries;
  hr->max_decode_bytes = srv->cfg.max_decode_bytes;
  /* Arenas: no segment at the Hello; PoolMap lists those it may read. */
  int pool_fd = srv->pool.nseg && !poolown_arenas(srv) ? srv->pool.seg[0].ro_fd : -1;
  hr->pool_fd = pool_fd >= 0 && c->pool_mapped;
  hr->segment_bytes = srv->pool.seg_bytes;
  if (c->ring) {
    hr->ring_off = bytes;
    hr->ring_sq_bytes = sq_bytes;
    hr->ring_cq_bytes = cq_bytes;
    r->fd3 = ring_doorbell(c->ring);
  }
  r->resp->body_case = KVCACHE__V1__RESPONSE__BODY_HELLO;
  r->resp->hello = hr;
  r->fd = c->shm.fd;
  r->fd2 = c->pool_mapped ? pool_fd : -1; /* -1 under arenas */
  conn_greeted(c);
  LOG_DEBUG("connect", "conn=%llu pid=%d uid=%u client=\"%s\" shm_bytes=%llu",
           (unsigned long long)c->id, (int)c->pid, (unsigned)c->uid, c->name,
           (unsigned long long)bytes);
  return 0;
}

static int h_ping(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  (void)c, (void)req, (void)r;
  return 0;
}

/* ---- caches -------------------------------------------------------------- */

/* Whether tenant's cache `name` exists. */
static bool cache_exists(engine_t *eng, uint32_t tenant, const char *name) {
  size_t n = 0;
  engine_cache_list(eng, NULL, 0, &n);
  kvc_cache_info_t *all = n ? malloc(n * sizeof *all) : NULL;
  bool found = false;
  if (all) engine_cache_list(eng, all, n, &n);
  for (size_t i = 0; all && i < n && !found; i++) {
    uint32_t owner;
    found = strcmp(all[i].name, name) == 0 &&
            engine_cache_tenant(eng, all[i].cache_id, &owner) == 0 && owner == tenant;
  }
  free(all);
  return found;
}

static int h_cache_open(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  const Kvcache__V1__CacheOpen *b = req->cache_open;
  NEED_BODY(r, b, "cache_open");
  if (!b->layout) return reject(r, KVC_E_INVAL, "cache_open without a layout");
  kvc_layout_t l;
  codec_layout_from_wire(b->layout, &l);
  int64_t page_bytes = engine_layout_page_bytes(&l);
  if (page_bytes < 0) return reject(r, (int)page_bytes, "%s", kvc_strerror((int)page_bytes));
  const config_t *cfg = &c->srv->cfg;
  if (cfg->zero_copy_tenant[0] && strcmp(conn_tenant_name(c), cfg->zero_copy_tenant) != 0)
    return reject(r, KVC_E_PERM, "this is a single-tenant node (zero_copy_tenant = %s): "
                  "tenant %s may not open caches", cfg->zero_copy_tenant, conn_tenant_name(c));
  /* A name resolves inside the caller's tenant, unless it is a shared cache
   * the caller has a right on. */
  uint32_t ns = c->tenant, id;
  enum tenant_right sr = RIGHT_NONE;
  bool shared = false;
  if (b->name && tenant_is_shared(cfg->shared_rules, cfg->n_shared_rules, b->name) &&
      (sr = cache_right(c, TENANT_SHARED, b->name)) != RIGHT_NONE) {
    ns = TENANT_SHARED;
    shared = true;
  }
  /* Opening needs a read right; creating is a write (optable.h, OPEN): a
   * reader of a declared shared cache nobody opened yet may not make it
   * with a layout of its own. */
  if (shared && sr < RIGHT_WRITE && !cache_exists(c->srv->eng, ns, b->name))
    return reject(r, KVC_E_PERM, "shared cache '%s' does not exist yet, and tenant %s may only "
                  "read it: a tenant with rw (or an admin) creates it", b->name,
                  conn_tenant_name(c));
  /* Each shared cache is an arena group of its own: its readers differ. */
  uint32_t group = shared ? poolown_group(c->srv, b->name) : 0;
  if (shared && !group) return reject(r, KVC_E_NOMEM, "out of memory");
  ENGINE_CALL(r, engine_cache_open_group(c->srv->eng, ns, group, b->name, &l, &id));
  Kvcache__V1__CacheOpenReply *o = arena_alloc(r->a, sizeof *o);
  if (!o) return reject(r, KVC_E_NOMEM, "out of memory");
  kvcache__v1__cache_open_reply__init(o);
  o->cache_id = id;
  o->page_bytes = (uint64_t)page_bytes;
  r->resp->body_case = KVCACHE__V1__RESPONSE__BODY_CACHE_OPEN;
  r->resp->cache_open = o;
  return 0;
}

static int h_cache_list(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  (void)req;
  engine_t *eng = c->srv->eng;
  size_t n = 0, got = 0;
  ENGINE_CALL(r, engine_cache_list(eng, NULL, 0, &n));
  kvc_cache_info_t *infos = n ? arena_alloc(r->a, n * sizeof *infos) : NULL;
  Kvcache__V1__CacheListReply *lr = arena_alloc(r->a, sizeof *lr);
  Kvcache__V1__CacheInfo **items = arena_alloc(r->a, (n ? n : 1) * sizeof *items);
  if ((n && !infos) || !lr || !items) return reject(r, KVC_E_NOMEM, "out of memory");
  if (n) ENGINE_CALL(r, engine_cache_list(eng, infos, n, &got));
  if (got < n) n = got;
  kvcache__v1__cache_list_reply__init(lr);
  size_t shown = 0;
  for (size_t i = 0; i < n; i++) {
    const char *tenant = cache_view(c, &infos[i]);
    if (!tenant) continue;
    snprintf(infos[i].tenant, sizeof infos[i].tenant, "%s", tenant);
    Kvcache__V1__CacheInfo *ci = arena_alloc(r->a, sizeof *ci);
    Kvcache__V1__Layout *wl = arena_alloc(r->a, sizeof *wl);
    if (!ci || !wl) return reject(r, KVC_E_NOMEM, "out of memory");
    codec_cache_info_to_wire(&infos[i], ci, wl);
    items[shown++] = ci;
  }
  lr->n_caches = shown;
  lr->caches = items;
  r->resp->body_case = KVCACHE__V1__RESPONSE__BODY_CACHE_LIST;
  r->resp->cache_list = lr;
  return 0;
}

static int h_cache_clear(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  NEED_BODY(r, req->cache_clear, "cache_clear");
  ENGINE_CALL(r, engine_cache_clear(c->srv->eng, req->cache_clear->cache_id));
  return 0;
}

static int h_cache_drop(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  NEED_BODY(r, req->cache_drop, "cache_drop");
  ENGINE_CALL(r, engine_cache_drop(c->srv->eng, req->cache_drop->cache_id));
  return 0;
}

/* ---- transfers ----------------------------------------------------------- */

/* A region [off, off + len) of the shared buffer, or the reason it is not. */
static int check_region(conn_t *c, reply_t *r, size_t i, const char *what, uint64_t off,
                        uint64_t len, uint64_t want, void **ptr) {
  if (len != want)
    return reject(r, KVC_E_SIZE, "entry %zu: %s_len is %llu, the transfer needs %llu", i,
                  what, (unsigned long long)len, (unsigned long long)want);
  if (off > UINT64_MAX - len)
    return reject(r, KVC_E_OFFSET, "entry %zu: %s_off + %s_len overflows", i, what, what);
  if (off + len > c->shm.bytes)
    return reject(r, KVC_E_OFFSET,
                  "entry %zu: %s [%llu, %llu) lies outside the %llu-byte shared buffer", i,
                  what, (unsigned long long)off, (unsigned long long)(off + len),
                  (unsigned long long)c->shm.bytes);
  *ptr = len ? c->shm.base + off : NULL;
  return 0;
}

/* The ntokens token ids at off in the shared buffer: 4-byte aligned, inside
 * it, without overflow. *ptr points into the buffer (NULL for none). */
static int check_tokens(conn_t *c, reply_t *r, const char *what, uint64_t off,
                        uint64_t ntokens, const uint32_t **ptr) {
  if (ntokens > UINT64_MAX / 4)
    return reject(r, KVC_E_OVERFLOW, "%s: %llu token ids overflow a size", what,
                  (unsigned long long)ntokens);
  uint64_t len = 4 * ntokens;
  if (off % 4)
    return reject(r, KVC_E_OFFSET, "%s: tok_off %llu is not a multiple of 4", what,
                  (unsigned long long)off);
  if (off > UINT64_MAX - len)
    return reject(r, KVC_E_OFFSET, "%s: tok_off + tok_len overflows", what);
  if (off + len > c->shm.bytes)
    return reject(r, KVC_E_OFFSET,
                  "%s: token ids [%llu, %llu) lie outside the %llu-byte shared buffer", what,
                  (unsigned long long)off, (unsigned long long)(off + len),
                  (unsigned long long)c->shm.bytes);
  *ptr = len ? (const uint32_t *)(const void *)(c->shm.base + off) : NULL;
  return 0;
}

/* The prefix key of a request: salt and extra key, each at most 64 bytes.
 * k borrows the decoded message's bytes for the engine call. */
static int check_key(reply_t *r, ProtobufCBinaryData salt, ProtobufCBinaryData extra,
                     engine_pkey_t *k) {
  if (salt.len > KVC_MAX_KEY_BYTES || extra.len > KVC_MAX_KEY_BYTES)
    return reject(r, KVC_E_INVAL, "%s of %zu bytes: at most %u",
                  salt.len > KVC_MAX_KEY_BYTES ? "salt" : "extra key",
                  salt.len > KVC_MAX_KEY_BYTES ? salt.len : extra.len, KVC_MAX_KEY_BYTES);
  *k = (engine_pkey_t){salt.data, salt.len, extra.data, extra.len, NULL, 0};
  return 0;
}

/* Span keys off the wire (the engine checks them), borrowing the message's
 * bytes: *out in the reply's arena, NULL for none. */
static int span_keys(reply_t *r, Kvcache__V1__SpanKey *const *w, size_t n,
                     const kvc_span_key_t **out) {
  *out = NULL;
  if (!n) return 0;
  if (n > KVC_MAX_SPAN_KEYS)
    return reject(r, KVC_E_INVAL, "%zu span keys, at most %u", n, KVC_MAX_SPAN_KEYS);
  kvc_span_key_t *s = arena_alloc(r->a, n * sizeof *s);
  if (!s) return reject(r, KVC_E_NOMEM, "out of memory");
  for (size_t i = 0; i < n; i++) codec_span_key_from_wire(w[i], &s[i]);
  *out = s;
  return 0;
}

/* A put's token ids: tok_len 0 is none, else exactly 4 bytes per token (a
 * layer-range put's ids chain those layers; doc/prefix.md). */
static int check_entry_tokens(conn_t *c, reply_t *r, size_t i, const Kvcache__V1__IoEntry *w,
                              bool is_put, const uint32_t **tokens) {
  char what[32];
  *tokens = NULL;
  if (w->tok_len == 0) return 0;
  if (!is_put) return reject(r, KVC_E_INVAL, "entry %zu: token ids go with puts only", i);
  if (w->ntokens > UINT64_MAX / 4 || w->tok_len != 4 * w->ntokens)
    return reject(r, KVC_E_SIZE, "entry %zu: tok_len is %llu, %llu token ids need %llu", i,
                  (unsigned long long)w->tok_len, (unsigned long long)w->ntokens,
                  (unsigned long long)(w->ntokens * 4));
  snprintf(what, sizeof what, "entry %zu", i);
  return check_tokens(c, r, what, w->tok_off, w->ntokens, tokens);
}

/* The transfer geometry of x over the cache's layout, computed once per
 * request (layout.h, as the client and the engine compute it). An unknown
 * cache is the engine's NOCACHE; where is prefixed to the reason. */
static int resolve_xfer(conn_t *c, reply_t *r, const char *where, uint32_t cache_id,
                        const kvc_xfer_t *x, bool is_put, layout_xfer_t *g) {
  const kvc_layout_t *l;
  char why[sizeof r->err];
  int rc = engine_cache_layout(c->srv->eng, cache_id, &l);
  struct xfer_memo *m = &c->xfer_memo;
  /* A cache's id is never reused and its layout never changes: the same
   * transfer of the same cache resolves as it did. */
  if (!rc && m->ok && m->cache_id == cache_id && m->layout == l && m->is_put == is_put &&
      memcmp(&m->x, x, sizeof *x) == 0) {
    *g = m->g;
    return 0;
  }
  if (rc) {
    reply_engine_error(r, rc);
    snprintf(why, sizeof why, "%s", r->err);
  } else {
    rc = layout_xfer(l, x, is_put, g, why, sizeof why);
  }
  if (rc) return reject(r, rc, "%s%s", where, why);
  *m = (struct xfer_memo){.cache_id = cache_id, .layout = l, .x = *x, .is_put = is_put,
                          .ok = true, .g = *g};
  return 0;
}

/* Validates every entry of an Io against the layout and the shared buffer and
 * builds the engine's entries, pointing into the buffer. */
static int check_io(conn_t *c, const Kvcache__V1__Io *io, bool is_put, reply_t *r,
                    engine_xfer_t *x, engine_io_t **out) {
  server_t *srv = c->srv;
  const char *op = is_put ? "put" : "get";
  if (io->n_entries == 0) return reject(r, KVC_E_INVAL, "%s without entries", op);
  if (io->n_entries > srv->cfg.max_entries)
    return reject(r, KVC_E_TOOMANY, "%s of %zu entries exceeds max_entries %u", op,
                  io->n_entries, srv->cfg.max_entries);
  kvc_xfer_t kx;
  codec_xfer_from_wire(io->xfer, &kx);
  *x = (engine_xfer_t){kx.layer_begin, kx.layer_end, kx.head_begin, kx.head_end, kx.dtype,
                       NULL, kx.k_scale, kx.v_scale};
  engine_io_t *e = arena_alloc(r->a, io->n_entries * sizeof *e);
  if (!e) return reject(r, KVC_E_NOMEM, "out of memory");
  layout_xfer_t g;
  int rc = resolve_xfer(c, r, "entry 0: ", io->cache_id, &kx, is_put, &g);
  if (rc) return rc;
  for (size_t i = 0; i < io->n_entries; i++) {
    const Kvcache__V1__IoEntry *w = io->entries[i];
    uint64_t kb, vb, sb;
    if (layout_xfer_bytes(&g, w->ntokens, &kb, &vb, &sb))
      return reject(r, KVC_E_OVERFLOW, "entry %zu: transfer of %llu tokens overflows", i,
                    (unsigned long long)w->ntokens);
    if (!is_put && w->n_span_keys)
      return reject(r, KVC_E_INVAL, "entry %zu: span keys go with puts only", i);
    e[i].seq_id = w->seq_id;
    e[i].pos = w->pos;
    e[i].ntokens = w->ntokens;
    e[i].k_bytes = kb;
    e[i].v_bytes = vb;
    if ((rc = check_region(c, r, i, "k", w->k_off, r->fast ? kb : w->k_len, kb, &e[i].k)) ||
        (rc = check_region(c, r, i, "v", w->v_off, r->fast ? vb : w->v_len, vb, &e[i].v)) ||
        (rc = check_region(c, r, i, "ks", w->ks_off, w->ks_len, sb, &e[i].k_scale)) ||
        (rc = check_region(c, r, i, "vs", w->vs_off, w->vs_len, sb, &e[i].v_scale)) ||
        (rc = check_entry_tokens(c, r, i, w, is_put, &e[i].tokens)) ||
        (rc = span_keys(r, w->span_keys, w->n_span_keys, &e[i].spans)))
      return rc;
    e[i].nspans = w->n_span_keys;
    e[i].k_scale_bytes = e[i].v_scale_bytes = sb;
  }
  *out = e;
  return 0;
}

/* Tensor bytes the entries move (K, V and scales). */
static uint64_t io_bytes(const engine_io_t *e, size_t n) {
  uint64_t bytes = 0;
  for (size_t i = 0; i < n; i++)
    bytes += e[i].k_bytes + e[i].v_bytes + e[i].k_scale_bytes + e[i].v_scale_bytes;
  return bytes;
}

/* Where a put or get copies (offload.c): on the loop (small ones); on the
 * copy threads while other clients are connected, the reply sent when the
 * copy is done; or, for a client alone, split between the loop and the
 * copy threads within the request. */
typedef enum { COPY_LOOP, COPY_THREADS, COPY_HERE } copy_where_t;

static copy_where_t copy_where(conn_t *c, const engine_io_t *e, size_t n, reply_t *r) {
  server_t *srv = c->srv;
  if (!srv->cfg.offload_bytes || io_bytes(e, n) < srv->cfg.offload_bytes) return COPY_LOOP;
  r->large = true;
  /* A client alone: the loop copies shares of it beside the threads and
   * saves the hand-offs of both ways. Else the copy is queued and the loop
   * goes on to the other clients' requests; while only large copies come
   * (offload_quiet_us), it takes queued shares itself between them
   * (offload.c), so several clients' copies run at once on every CPU. */
  if (srv->stats.connections_current < 2) return COPY_HERE;
  return COPY_THREADS;
}

/* A copy queued to the copy threads (offload.c) leaves c waiting for it:
 * its reply comes when the copy ends (conn_copied). */
static int offloaded(conn_t *c, bool queued) {
  if (!queued) return 0;
  conn_offload_begin(c);
  return DEFERRED;
}

static int h_put(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  NEED_BODY(r, req->put, "put");
  engine_xfer_t x;
  engine_io_t *e;
  engine_pkey_t key;
  int rc = check_io(c, req->put, true, r, &x, &e);
  if (rc || (rc = check_key(r, req->put->salt, req->put->extra, &key))) return rc;
  x.pkey = &key;
  copy_where_t where = copy_where(c, e, req->put->n_entries, r);
  if (where != COPY_LOOP) {
    engine_put_job_t *job;
    uint64_t bytes = io_bytes(e, req->put->n_entries);
    ENGINE_CALL(r, engine_put_begin(c->srv->eng, req->put->cache_id, &x, e,
                                    req->put->n_entries, &job));
    if (where == COPY_THREADS) return offloaded(c, offload_put(c, job, bytes, req->id, r->t0_ns));
    c->turn_bytes += bytes;
    if (!offload_run_here(c->srv, NULL, job, bytes)) engine_put_run(job);
    engine_put_end(c->srv->eng, job);
    return 0;
  }
  c->turn_bytes += io_bytes(e, req->put->n_entries); /* copied on the loop */
  ENGINE_CALL(r, engine_put(c->srv->eng, req->put->cache_id, &x, e, req->put->n_entries));
  return 0;
}

static int h_get(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  NEED_BODY(r, req->get, "get");
  engine_xfer_t x;
  engine_io_t *e;
  int rc = check_io(c, req->get, false, r, &x, &e);
  if (rc) return rc;
  copy_where_t where = copy_where(c, e, req->get->n_entries, r);
  if (where != COPY_LOOP) {
    engine_get_job_t *job;
    uint64_t bytes = io_bytes(e, req->get->n_entries);
    ENGINE_CALL(r, engine_get_begin(c->srv->eng, req->get->cache_id, &x, e,
                                    req->get->n_entries, &job));
    if (where == COPY_THREADS) return offloaded(c, offload_get(c, job, bytes, req->id, r->t0_ns));
    c->turn_bytes += bytes;
    if (!offload_run_here(c->srv, job, NULL, bytes)) engine_get_run(job);
    engine_get_end(c->srv->eng, job);
    return 0;
  }
  c->turn_bytes += io_bytes(e, req->get->n_entries); /* copied on the loop */
  ENGINE_CALL(r, engine_get(c->srv->eng, req->get->cache_id, &x, e, req->get->n_entries));
  return 0;
}

/* ---- sequences ----------------------------------------------------------- */

static int h_remove(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  const Kvcache__V1__Remove *b = req->remove;
  NEED_BODY(r, b, "remove");
  ENGINE_CALL(r, engine_remove(c->srv->eng, b->cache_id, b->seq_id, b->begin, b->end));
  return 0;
}

/* EXISTS when no_replace and the destination exists (the loop is the one
 * writer: nothing can create it between this check and the call). */
static int refuse_replace(conn_t *c, reply_t *r, bool no_replace, uint32_t cache_id,
                          uint64_t dst) {
  kvc_seq_info_t si;
  if (no_replace && engine_seq_info(c->srv->eng, cache_id, dst, &si) == 0)
    return reject(r, KVC_E_EXISTS, "sequence %llu exists (%llu tokens) and no_replace is set",
                  (unsigned long long)dst, (unsigned long long)si.length);
  return 0;
}

static int h_copy_prefix(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  const Kvcache__V1__CopyPrefix *b = req->copy_prefix;
  NEED_BODY(r, b, "copy_prefix");
  int rc = refuse_replace(c, r, b->no_replace, b->cache_id, b->dst);
  if (rc) return rc;
  ENGINE_CALL(r, engine_copy_range(c->srv->eng, b->cache_id, b->src, b->dst, b->begin,
                                   b->ntokens));
  return 0;
}

/* Empty sequences with ids the engine picks; owned ones are listed on the
 * connection, which drops them when it closes (conn.c). */
static int h_seq_create(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  const Kvcache__V1__SeqCreate *b = req->seq_create;
  NEED_BODY(r, b, "seq_create");
  if (b->count == 0 || b->count > 4096)
    return reject(r, KVC_E_INVAL, "create 1 to 4096 sequences, not %u", b->count);
  uint64_t *ids = arena_alloc(r->a, b->count * sizeof *ids);
  Kvcache__V1__SeqCreateReply *sr = arena_alloc(r->a, sizeof *sr);
  if (!ids || !sr || (b->owned && conn_own_reserve(c, b->count) != 0))
    return reject(r, KVC_E_NOMEM, "out of memory");
  ENGINE_CALL(r, engine_seq_create(c->srv->eng, b->cache_id, b->count, ids));
  for (uint32_t i = 0; b->owned && i < b->count; i++) conn_own(c, b->cache_id, ids[i]);
  kvcache__v1__seq_create_reply__init(sr);
  sr->n_seq_ids = b->count;
  sr->seq_ids = ids;
  r->resp->body_case = KVCACHE__V1__RESPONSE__BODY_SEQ_CREATE;
  r->resp->seq_create = sr;
  return 0;
}

static int h_can_resume(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  const Kvcache__V1__SeqPos *b = req->can_resume;
  NEED_BODY(r, b, "can_resume");
  bool ok = false;
  ENGINE_CALL(r, engine_can_resume(c->srv->eng, b->cache_id, b->seq_id, b->pos, &ok));
  Kvcache__V1__BoolReply *br = arena_alloc(r->a, sizeof *br);
  if (!br) return reject(r, KVC_E_NOMEM, "out of memory");
  kvcache__v1__bool_reply__init(br);
  br->value = ok;
  r->resp->body_case = KVCACHE__V1__RESPONSE__BODY_BOOL_VALUE;
  r->resp->bool_value = br;
  return 0;
}

static int h_trim_front(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  const Kvcache__V1__SeqPos *b = req->trim_front;
  NEED_BODY(r, b, "trim_front");
  ENGINE_CALL(r, engine_trim_front(c->srv->eng, b->cache_id, b->seq_id, b->pos));
  return 0;
}

/* ---- attention-aware sequences --------------------------------------------- */

/* The batch of a Reserve or History as engine tokens (arena). */
static int batch_from_wire(conn_t *c, reply_t *r, size_t nseq, const uint64_t *seqs,
                           size_t npos, const uint64_t *pos, engine_tok_t **out) {
  if (nseq != npos)
    return reject(r, KVC_E_INVAL, "%zu sequence ids for %zu positions", nseq, npos);
  if (nseq == 0) return reject(r, KVC_E_INVAL, "a batch without tokens");
  if (nseq > c->srv->cfg.max_entries)
    return reject(r, KVC_E_TOOMANY, "a batch of %zu tokens exceeds max_entries %u", nseq,
                  c->srv->cfg.max_entries);
  engine_tok_t *t = arena_alloc(r->a, nseq * sizeof *t);
  if (!t) return reject(r, KVC_E_NOMEM, "out of memory");
  for (size_t i = 0; i < nseq; i++) t[i] = (engine_tok_t){seqs[i], pos[i]};
  *out = t;
  return 0;
}

static int h_reserve(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  const Kvcache__V1__Reserve *b = req->reserve;
  NEED_BODY(r, b, "reserve");
  engine_tok_t *t;
  int rc = batch_from_wire(c, r, b->n_seq_ids, b->seq_ids, b->n_positions, b->positions, &t);
  if (rc) return rc;
  ENGINE_CALL(r, engine_reserve(c->srv->eng, b->cache_id, t, b->n_seq_ids));
  return 0;
}

static int history_reply(reply_t *r, const engine_hist_t *h, uint64_t kb, uint64_t vb) {
  Kvcache__V1__HistoryReply *hr = arena_alloc(r->a, sizeof *hr);
  Kvcache__V1__HistorySpan **sp = arena_alloc(r->a, (h->nspans + 1) * sizeof *sp);
  if (!hr || !sp) return reject(r, KVC_E_NOMEM, "out of memory");
  kvcache__v1__history_reply__init(hr);
  hr->entries = h->nentries;
  hr->k_len = kb;
  hr->v_len = vb;
  hr->mask_len = h->mask_bytes;
  for (size_t i = 0; h->spans && i < h->nspans; i++) {
    if (!(sp[i] = arena_alloc(r->a, sizeof *sp[i]))) return reject(r, KVC_E_NOMEM, "out of memory");
    const engine_span_t *e = &h->spans[i];
    codec_hist_span_to_wire(&(kvc_hist_span_t){e->seq_id, e->pos, e->first, e->n}, sp[i]);
  }
  hr->spans = sp;
  hr->n_spans = h->spans ? h->nspans : 0;
  if (h->positions && h->own_positions) {
    hr->positions = h->positions;
    hr->n_positions = h->nentries;
  }
  r->resp->body_case = KVCACHE__V1__RESPONSE__BODY_HISTORY;
  r->resp->history = hr;
  return 0;
}

/* The reply's per-entry positions, when the sizes call said a sequence of
 * the view has positions of its own. */
static int hist_positions_room(reply_t *r, engine_hist_t *h) {
  if (!h->own_positions) return 0;
  uint64_t bytes;
  if (__builtin_mul_overflow(h->nentries + 1, (uint64_t)sizeof *h->positions, &bytes) ||
      !(h->positions = arena_alloc(r->a, bytes)))
    return reject(r, KVC_E_NOMEM, "out of memory");
  h->positions_cap = h->nentries;
  return 0;
}

static int h_history(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  const Kvcache__V1__History *b = req->history;
  NEED_BODY(r, b, "history");
  engine_t *eng = c->srv->eng;
  engine_tok_t *t;
  int rc = batch_from_wire(c, r, b->n_seq_ids, b->seq_ids, b->n_positions, b->positions, &t);
  if (rc) return rc;
  kvc_xfer_t kx;
  codec_xfer_from_wire(b->xfer, &kx);
  engine_xfer_t x = {kx.layer_begin, kx.layer_end, kx.head_begin, kx.head_end, kx.dtype, NULL,
                     kx.k_scale, kx.v_scale};
  engine_hist_t h = {0};
  size_t n = b->n_seq_ids;
  ENGINE_CALL(r, engine_history(eng, b->cache_id, &x, t, n, &h));
  uint64_t kb, vb, sb, mb;
  layout_xfer_t g;
  if ((rc = resolve_xfer(c, r, "", b->cache_id, &kx, false, &g))) return rc;
  if (layout_xfer_bytes(&g, h.nentries, &kb, &vb, &sb))
    return reject(r, KVC_E_OVERFLOW, "transfer of %llu tokens overflows",
                  (unsigned long long)h.nentries);
  if (__builtin_mul_overflow(h.nentries, (uint64_t)n * 4, &mb))
    return reject(r, KVC_E_OVERFLOW, "a mask of %zu x %llu overflows", n,
                  (unsigned long long)h.nentries);
  h.mask_bytes = mb;
  if (b->k_len == 0 && b->v_len == 0 && b->mask_len == 0) return history_reply(r, &h, kb, vb);
  void *mask;
  if ((rc = check_region(c, r, 0, "k", b->k_off, b->k_len, kb, &h.k)) ||
      (rc = check_region(c, r, 0, "v", b->v_off, b->v_len, vb, &h.v)) ||
      (rc = check_region(c, r, 0, "mask", b->mask_off, b->mask_len, mb, &mask)))
    return rc;
  if (b->mask_off % 4) return reject(r, KVC_E_OFFSET, "mask_off is not a multiple of 4");
  h.mask = mask;
  h.k_bytes = kb;
  h.v_bytes = vb;
  h.spans_cap = h.nspans;
  if (!(h.spans = arena_alloc(r->a, (h.nspans + 1) * sizeof *h.spans)) ||
      (rc = hist_positions_room(r, &h)))
    return rc ? rc : reject(r, KVC_E_NOMEM, "out of memory");
  ENGINE_CALL(r, engine_history(eng, b->cache_id, &x, t, n, &h));
  return history_reply(r, &h, kb, vb);
}

static int h_shift(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  const Kvcache__V1__Shift *b = req->shift;
  NEED_BODY(r, b, "shift");
  ENGINE_CALL(r, engine_shift(c->srv->eng, b->cache_id, b->seq_id, b->p0, b->p1, b->delta));
  return 0;
}

static int h_seq_div(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  const Kvcache__V1__SeqDiv *b = req->seq_div;
  NEED_BODY(r, b, "seq_div");
  ENGINE_CALL(r, engine_seq_div(c->srv->eng, b->cache_id, b->seq_id, b->p0, b->p1, b->d));
  return 0;
}

static int h_punch(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  const Kvcache__V1__Shift *b = req->punch;
  NEED_BODY(r, b, "punch");
  ENGINE_CALL(r, engine_punch(c->srv->eng, b->cache_id, b->seq_id, b->p0, b->p1));
  return 0;
}

static int h_keep(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  const Kvcache__V1__SeqRef *b = req->keep;
  NEED_BODY(r, b, "keep");
  ENGINE_CALL(r, engine_keep(c->srv->eng, b->cache_id, b->seq_id));
  return 0;
}

static int h_pos_range(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  const Kvcache__V1__SeqRef *b = req->pos_range;
  NEED_BODY(r, b, "pos_range");
  int64_t lo, hi;
  ENGINE_CALL(r, engine_pos_range(c->srv->eng, b->cache_id, b->seq_id, &lo, &hi));
  Kvcache__V1__PosRangeReply *pr = arena_alloc(r->a, sizeof *pr);
  if (!pr) return reject(r, KVC_E_NOMEM, "out of memory");
  kvcache__v1__pos_range_reply__init(pr);
  pr->pos_min = lo;
  pr->pos_max = hi;
  r->resp->body_case = KVCACHE__V1__RESPONSE__BODY_POS_RANGE;
  r->resp->pos_range = pr;
  return 0;
}

static int h_pin(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  const Kvcache__V1__SeqRef *b = req->pin;
  NEED_BODY(r, b, "pin");
  ENGINE_CALL(r, engine_pin(c->srv->eng, b->cache_id, b->seq_id, c->id));
  return 0;
}

static int h_unpin(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  const Kvcache__V1__SeqRef *b = req->unpin;
  NEED_BODY(r, b, "unpin");
  ENGINE_CALL(r, engine_unpin(c->srv->eng, b->cache_id, b->seq_id, c->id));
  return 0;
}

static Kvcache__V1__SeqInfo *seq_info_to_wire(arena_t *a, const kvc_seq_info_t *s) {
  Kvcache__V1__SeqInfo *w = arena_alloc(a, sizeof *w);
  if (w) codec_seq_info_to_wire(s, w);
  return w;
}

static int h_seq_info(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  const Kvcache__V1__SeqRef *b = req->seq_info;
  NEED_BODY(r, b, "seq_info");
  kvc_seq_info_t si;
  ENGINE_CALL(r, engine_seq_info(c->srv->eng, b->cache_id, b->seq_id, &si));
  r->resp->seq_info = seq_info_to_wire(r->a, &si);
  if (!r->resp->seq_info) return reject(r, KVC_E_NOMEM, "out of memory");
  r->resp->body_case = KVCACHE__V1__RESPONSE__BODY_SEQ_INFO;
  return 0;
}

static int h_seq_list(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  const Kvcache__V1__SeqList *b = req->seq_list;
  NEED_BODY(r, b, "seq_list");
  size_t cap = b->max == 0 ? SEQ_LIST_DEFAULT : b->max > SEQ_LIST_MAX ? SEQ_LIST_MAX : b->max;
  kvc_seq_info_t *infos = arena_alloc(r->a, cap * sizeof *infos);
  Kvcache__V1__SeqListReply *lr = arena_alloc(r->a, sizeof *lr);
  Kvcache__V1__SeqInfo **items = arena_alloc(r->a, cap * sizeof *items);
  if (!infos || !lr || !items) return reject(r, KVC_E_NOMEM, "out of memory");
  uint64_t cursor = b->cursor;
  size_t n = 0;
  ENGINE_CALL(r, engine_seq_list(c->srv->eng, b->cache_id, &cursor, infos, cap, &n));
  kvcache__v1__seq_list_reply__init(lr);
  for (size_t i = 0; i < n; i++)
    if (!(items[i] = seq_info_to_wire(r->a, &infos[i])))
      return reject(r, KVC_E_NOMEM, "out of memory");
  lr->n_seqs = n;
  lr->seqs = items;
  lr->cursor = cursor;
  r->resp->body_case = KVCACHE__V1__RESPONSE__BODY_SEQ_LIST;
  r->resp->seq_list = lr;
  return 0;
}

/* Whether the caller may see cache_id of tenant (topcaches_pick's filter). */
static bool stats_sees(void *ctx, uint32_t tenant, uint32_t cache_id) {
  const conn_t *c = ctx;
  if (c->admin || tenant == c->tenant) return true;
  kvc_cache_info_t ci;
  return engine_cache_info(c->srv->eng, cache_id, &ci) == 0 &&
         cache_right(c, tenant, ci.name) != RIGHT_NONE;
}

/* The caches of name the caller may see (an admin's: in every tenant). */
static int stats_named(conn_t *c, const char *name, reply_t *r, uint32_t **ids, size_t *n) {
  engine_t *eng = c->srv->eng;
  if (strlen(name) > KVC_MAX_NAME)
    return reject(r, KVC_E_NAME, "a cache name is at most %u bytes", KVC_MAX_NAME);
  size_t all = engine_caches_named(eng, name, NULL, 0), k = 0;
  uint32_t *v = all ? arena_alloc(r->a, all * sizeof *v) : NULL;
  if (all && !v) return reject(r, KVC_E_NOMEM, "out of memory");
  if (all) all = engine_caches_named(eng, name, v, all);
  for (size_t i = 0; i < all; i++) {
    uint32_t owner;
    if (engine_cache_tenant(eng, v[i], &owner) == 0 && stats_sees(c, owner, v[i])) v[k++] = v[i];
  }
  if (!k) return reject(r, KVC_E_NOCACHE, "no cache named '%s'", name);
  *ids = v;
  *n = k;
  return 0;
}

/* The top caches by pages held that the caller may see: its tenant's and
 * the shared ones it has a right on (an admin's: every tenant's). */
static int stats_top(conn_t *c, uint32_t top, reply_t *r, uint32_t **ids, size_t *n) {
  engine_t *eng = c->srv->eng;
  size_t want = top == 0                   ? KVC_STATS_TOP_DEFAULT
                : top > KVC_STATS_TOP_MAX ? KVC_STATS_TOP_MAX
                                          : top;
  uint32_t mine[2] = {c->tenant, TENANT_SHARED}, *ts = mine;
  size_t nt = c->tenant == TENANT_SHARED ? 1 : 2;
  if (c->admin) {
    nt = engine_tenants(eng, NULL, 0);
    ts = nt ? arena_alloc(r->a, nt * sizeof *ts) : NULL;
    if (nt && !ts) return reject(r, KVC_E_NOMEM, "out of memory");
    if (nt) nt = engine_tenants(eng, ts, nt);
  }
  uint32_t *v = arena_alloc(r->a, want * sizeof *v);
  bool nomem = false;
  size_t k = v ? topcaches_pick(eng, ts, nt, stats_sees, c, want, v, r->a, &nomem) : 0;
  if (!v || nomem) return reject(r, KVC_E_NOMEM, "out of memory");
  *ids = v;
  *n = k;
  return 0;
}

/* The node's figures, and those of the caches asked for (doc/protocol.md,
 * "Stats"): of one name, or the top N by pages held (an empty request: the
 * top KVC_STATS_TOP_DEFAULT), or none. Never a walk of every cache. */
static int h_stats(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  server_t *srv = c->srv;
  const Kvcache__V1__StatsRequest *b = req->stats;
  const char *name = b && b->cache ? b->cache : "";
  uint32_t top = b ? b->top : 0;
  uint32_t *ids = NULL;
  size_t nids = 0;
  int rc = 0;
  if (b && b->node_only) {
    if (name[0] || top)
      return reject(r, KVC_E_INVAL, "stats: node_only asks for no cache's figures, "
                    "neither a cache by name nor the top caches");
  } else if (name[0]) {
    if (top)
      return reject(r, KVC_E_INVAL, "stats: name a cache or ask for the top %u caches, "
                    "not both", top);
    rc = stats_named(c, name, r, &ids, &nids);
  } else {
    rc = stats_top(c, top, r, &ids, &nids);
  }
  if (rc) return rc;
  Kvcache__V1__StatsReply *sr = arena_alloc(r->a, sizeof *sr);
  if (!sr) return reject(r, KVC_E_NOMEM, "out of memory");
  kvcache__v1__stats_reply__init(sr);
  metrics_refusals_t *ref = NULL;
  size_t nref = quotas_refusals(srv, c->tenant, c->admin, r->a, &ref);
  metrics_arena_t *ar = NULL;
  size_t nar = poolown_arena_rows(srv, c, r->a, &ar);
  const tier_view_t *tv[TIERS_MAX];
  size_t ntv = tiers_views(srv, r->a, tv, TIERS_MAX);
  rc = metrics_render(&srv->stats, srv->eng, uv_hrtime(), r->a, ids ? ids : (uint32_t[]){0},
                      nids, cache_view, c, ref, nref, tv, ntv, ar, nar, sr);
  if (rc) return reject(r, rc, "cannot render stats: %s", kvc_strerror(rc));
  r->resp->body_case = KVCACHE__V1__RESPONSE__BODY_STATS;
  r->resp->stats = sr;
  return 0;
}

/* ---- zero-copy read leases -------------------------------------------------- */

/* Whether c may take n more leases: it maps the pool, and stays within
 * LEASES_PER_CONN. */
static int lease_allowed(conn_t *c, reply_t *r, size_t n) {
  if (!c->pool_mapped)
    return reject(r, KVC_E_PERM, "zero-copy reads map the whole pool, which holds other "
                  "tenants' pages: this node gives that mapping to admins%s%s only; read "
                  "with get", c->srv->cfg.zero_copy_tenant[0] ? " and tenant " : "",
                  c->srv->cfg.zero_copy_tenant);
  if (n == 0) return reject(r, KVC_E_INVAL, "no lease asked");
  if (n > LEASES_PER_CONN || c->nleases > LEASES_PER_CONN - n)
    return reject(r, KVC_E_TOOMANY, "this connection holds %u leases and asks %zu more, past "
                  "%u; release some", c->nleases, n, LEASES_PER_CONN);
  return 0;
}

/* Takes one lease and builds its reply (the pages' offsets in the pool). */
static int lease_take(conn_t *c, reply_t *r, uint32_t cache_id, uint64_t seq_id, uint64_t begin,
                      uint64_t end, Kvcache__V1__LeaseReply **out) {
  engine_lease_t l;
  ENGINE_CALL(r, engine_lease(c->srv->eng, cache_id, seq_id, begin, end, c->id, &l));
  Kvcache__V1__LeaseReply *lr = arena_alloc(r->a, sizeof *lr);
  uint64_t *offs = arena_alloc(r->a, l.npages * sizeof *offs);
  if (!lr || !offs) {
    (void)engine_lease_release(c->srv->eng, c->id, l.id);
    return reject(r, KVC_E_NOMEM, "out of memory");
  }
  c->nleases++;
  kvcache__v1__lease_reply__init(lr);
  for (uint32_t i = 0; i < l.npages; i++) offs[i] = engine_page_pool_offset(c->srv->eng, l.pages[i]);
  lr->lease_id = l.id;
  lr->first_pos = l.first_pos;
  lr->n_page_offsets = l.npages;
  lr->page_offsets = offs;
  lr->page_tokens = l.page_tokens;
  lr->layer_bytes = l.layer_bytes;
  lr->v_offset = l.v_offset;
  lr->k_row_bytes = l.k_row_bytes;
  lr->v_row_bytes = l.v_row_bytes;
  lr->k_scale_offset = l.k_scale_offset;
  lr->v_scale_offset = l.v_scale_offset;
  lr->pool_gen = c->srv->pool.gen;
  *out = lr;
  return 0;
}

/* A fast lease's reply holds RINGFAST_LEASE_PAGES pages: a range that
 * spans more is refused before anything changes. */
static int fast_lease_fits(conn_t *c, reply_t *r, const Kvcache__V1__Lease *b) {
  const kvc_layout_t *l;
  if (!r->fast || b->end <= b->begin || engine_cache_layout(c->srv->eng, b->cache_id, &l) != 0)
    return 0; /* the engine's own error */
  /* page_tokens is a power of two (layout_geom): shifts, not two divisions. */
  unsigned sh = (unsigned)__builtin_ctz(l->page_tokens);
  uint64_t pages = ((b->end - 1) >> sh) - (b->begin >> sh) + 1;
  if (pages > RINGFAST_LEASE_PAGES)
    return reject(r, KVC_E_TOOMANY, "a fast lease spans at most %u pages; [%llu, %llu) spans "
                  "%llu: send a Lease", RINGFAST_LEASE_PAGES, (unsigned long long)b->begin,
                  (unsigned long long)b->end, (unsigned long long)pages);
  return 0;
}

/* A fast lease: its pages go straight into the fast reply. */
static int lease_take_fast(conn_t *c, reply_t *r, const Kvcache__V1__Lease *b) {
  engine_lease_t l;
  ENGINE_CALL(r, engine_lease(c->srv->eng, b->cache_id, b->seq_id, b->begin, b->end, c->id, &l));
  c->nleases++;
  ringfast_rep_t *p = r->rep;
  p->npages = l.npages; /* <= RINGFAST_LEASE_PAGES: fast_lease_fits */
  p->lease_id = l.id;
  p->first_pos = l.first_pos;
  p->pool_gen = c->srv->pool.gen;
  for (uint32_t i = 0; i < l.npages; i++)
    p->page_off[i] = engine_page_pool_offset(c->srv->eng, l.pages[i]);
  return 0;
}

static int h_lease(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  const Kvcache__V1__Lease *b = req->lease;
  NEED_BODY(r, b, "lease");
  int rc0 = lease_allowed(c, r, 1);
  if (!rc0) rc0 = fast_lease_fits(c, r, b);
  if (rc0) return rc0;
  if (r->rep) return lease_take_fast(c, r, b);
  Kvcache__V1__LeaseReply *lr;
  int rc = lease_take(c, r, b->cache_id, b->seq_id, b->begin, b->end, &lr);
  if (rc) return rc;
  r->resp->body_case = KVCACHE__V1__RESPONSE__BODY_LEASE;
  r->resp->lease = lr;
  return 0;
}

/* Releases the leases of a batch taken before one of them failed. */
static void leases_undo(conn_t *c, Kvcache__V1__LeaseReply **lr, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (engine_lease_release(c->srv->eng, c->id, lr[i]->lease_id) == 0) c->nleases--;
}

static int h_lease_batch(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  const Kvcache__V1__LeaseBatch *b = req->lease_batch;
  NEED_BODY(r, b, "lease_batch");
  int rc = lease_allowed(c, r, b->n_ranges);
  if (rc) return rc;
  Kvcache__V1__LeaseBatchReply *br = arena_alloc(r->a, sizeof *br);
  Kvcache__V1__LeaseReply **lr = arena_alloc(r->a, (b->n_ranges + 1) * sizeof *lr);
  if (!br || !lr) return reject(r, KVC_E_NOMEM, "out of memory");
  for (size_t i = 0; i < b->n_ranges; i++) {
    const Kvcache__V1__LeaseRange *g = b->ranges[i];
    if ((rc = lease_take(c, r, b->cache_id, g->seq_id, g->begin, g->end, &lr[i]))) {
      leases_undo(c, lr, i);
      char why[sizeof r->err - 32];
      memcpy(why, r->err, sizeof why - 1);
      why[sizeof why - 1] = '\0';
      snprintf(r->err, sizeof r->err, "range %zu: %s", i, why);
      return rc;
    }
  }
  kvcache__v1__lease_batch_reply__init(br);
  br->n_leases = b->n_ranges;
  br->leases = lr;
  r->resp->body_case = KVCACHE__V1__RESPONSE__BODY_LEASE_BATCH;
  r->resp->lease_batch = br;
  return 0;
}

/* Releases every listed lease; an unknown id fails the request after the
 * ones before it were released (each release stands alone). */
static int h_lease_release(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  const Kvcache__V1__LeaseRelease *b = req->lease_release;
  NEED_BODY(r, b, "lease_release");
  for (size_t i = 0; i < b->n_lease_ids; i++) {
    ENGINE_CALL(r, engine_lease_release(c->srv->eng, c->id, b->lease_ids[i]));
    c->nleases--;
  }
  return 0;
}

/* ---- the decode step (doc/worker-guide.md) -------------------------------- */

static uint64_t align64(uint64_t x) { return (x + 63) & ~(uint64_t)63; }

/* Where a step's view goes in [off, off + len) of the buffer: K, V and the
 * mask (each 64-byte aligned; K and V empty for a lease view) for nentries
 * entries and ntok batch tokens. Checks the region and that they fit. */
static int step_place(conn_t *c, reply_t *r, const layout_xfer_t *g, bool gather, bool mask,
                      uint64_t off, uint64_t len, uint64_t nentries, uint64_t ntok,
                      uint64_t place[3], uint64_t sizes[3]) {
  uint64_t kb = 0, vb = 0, mb = 0;
  if ((gather && layout_xfer_bytes(g, nentries, &kb, &vb, NULL)) ||
      (mask && __builtin_mul_overflow(nentries, ntok * 4, &mb)) || kb > (1ull << 62) ||
      vb > (1ull << 62) || mb > (1ull << 62))
    return reject(r, KVC_E_OVERFLOW, "a view of %llu entries overflows",
                  (unsigned long long)nentries);
  if (off > c->shm.bytes || len > c->shm.bytes - off)
    return reject(r, KVC_E_OFFSET, "the view's region [%llu, +%llu) lies outside the "
                  "%llu-byte shared buffer", (unsigned long long)off, (unsigned long long)len,
                  (unsigned long long)c->shm.bytes);
  place[0] = align64(off);
  place[1] = align64(place[0] + kb);
  place[2] = align64(place[1] + vb);
  sizes[0] = kb, sizes[1] = vb, sizes[2] = mb;
  if (place[2] + mb > off + len)
    return reject(r, KVC_E_SIZE, "the view of up to %llu entries needs %llu bytes from "
                  "out_off, out_len is %llu", (unsigned long long)nentries,
                  (unsigned long long)(place[2] + mb - off), (unsigned long long)len);
  return 0;
}

/* A step: the put of its entries, then the history view of its batch (each
 * entry's tokens), all or nothing: everything the view needs is checked
 * before the put, against the most entries the view can have (each
 * sequence from its start, or 0, to its length after the put; the put can
 * only shorten that, by a window's trim). */
static int h_step(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  const Kvcache__V1__Step *b = req->step;
  NEED_BODY(r, b, "step");
  engine_t *eng = c->srv->eng;
  Kvcache__V1__Io io = KVCACHE__V1__IO__INIT;
  io.cache_id = b->cache_id;
  io.xfer = b->xfer;
  io.n_entries = b->n_entries;
  io.entries = b->entries;
  io.salt = b->salt;
  io.extra = b->extra;
  engine_xfer_t x;
  engine_io_t *e;
  engine_pkey_t key;
  int rc = check_io(c, &io, true, r, &x, &e);
  if (rc || (rc = check_key(r, b->salt, b->extra, &key))) return rc;
  x.pkey = &key;
  int view = (int)b->view;
  if (view < 0 || view > KVCACHE__V1__STEP_VIEW__STEP_VIEW_GATHER)
    return reject(r, KVC_E_INVAL, "unknown step view %d", view);
  bool lease = view == KVCACHE__V1__STEP_VIEW__STEP_VIEW_LEASE;
  bool gather = view == KVCACHE__V1__STEP_VIEW__STEP_VIEW_GATHER;
  bool mask = !(lease && b->no_mask);
  if (b->no_mask && !lease) return reject(r, KVC_E_INVAL, "no_mask goes with a lease view");
  uint64_t ntok = 0, bound = 0, lease_pages = 0, place[3] = {0}, sizes[3] = {0};
  kvc_cache_info_t ci;
  uint32_t owner;
  if (engine_cache_info(eng, b->cache_id, &ci) || engine_cache_tenant(eng, b->cache_id, &owner))
    return reject(r, KVC_E_NOCACHE, "no cache with id %u", b->cache_id);
  uint64_t T = ci.layout.page_tokens;
  kvc_xfer_t kx;
  codec_xfer_from_wire(b->xfer, &kx);
  layout_xfer_t g;
  if ((rc = resolve_xfer(c, r, "", b->cache_id, &kx, false, &g))) return rc;
  for (size_t i = 0; i < b->n_entries; i++) {
    kvc_seq_info_t si;
    uint64_t lo = 0, hi = e[i].pos + e[i].ntokens;
    if (engine_seq_info(eng, b->cache_id, e[i].seq_id, &si) == 0) {
      lo = si.start;
      if (si.length > hi) hi = si.length;
    }
    ntok += e[i].ntokens;
    bound += hi > lo ? hi - lo : 0;
    if (hi > lo) lease_pages += (hi - 1) / T - lo / T + 1;
  }
  if (view) {
    if (g.bt == KVC_DTYPE_INT8)
      return reject(r, KVC_E_DTYPE, "a step's view returns floats, not raw int8");
    if (ntok == 0) return reject(r, KVC_E_INVAL, "a step's view needs tokens");
    if (ntok > c->srv->cfg.max_entries)
      return reject(r, KVC_E_TOOMANY, "a step of %llu tokens exceeds max_entries %u",
                    (unsigned long long)ntok, c->srv->cfg.max_entries);
    if (lease && (rc = lease_allowed(c, r, b->n_entries))) return rc;
    engine_tenant_limits_t lim;
    engine_tenant_usage_t use;
    uint64_t lease_bytes = lease_pages * (uint64_t)engine_cache_stride(eng, b->cache_id);
    if (lease && engine_tenant_usage(eng, owner, &lim, &use) == 0 && lim.max_pinned_bytes &&
        use.pinned_bytes + use.leased_bytes + lease_bytes > lim.max_pinned_bytes)
      return reject(r, KVC_E_QUOTA_PINS, "tenant_max_pinned: the tenant pins %llu and leases "
                    "%llu bytes; the step's lease view takes up to %llu more, past the quota "
                    "of %llu (nothing was written)", (unsigned long long)use.pinned_bytes,
                    (unsigned long long)use.leased_bytes, (unsigned long long)lease_bytes,
                    (unsigned long long)lim.max_pinned_bytes);
    if ((rc = step_place(c, r, &g, gather, mask, b->out_off, b->out_len, bound, ntok, place,
                         sizes)))
      return rc;
  }
  c->turn_bytes += io_bytes(e, b->n_entries); /* copied on the loop */
  ENGINE_CALL(r, engine_put(eng, b->cache_id, &x, e, b->n_entries));
  Kvcache__V1__StepReply *sr = arena_alloc(r->a, sizeof *sr);
  if (!sr) return reject(r, KVC_E_NOMEM, "out of memory");
  kvcache__v1__step_reply__init(sr);
  r->resp->body_case = KVCACHE__V1__RESPONSE__BODY_STEP;
  r->resp->step = sr;
  if (!view) return 0;
  engine_tok_t *t = arena_alloc(r->a, ntok * sizeof *t);
  if (!t) return reject(r, KVC_E_NOMEM, "out of memory");
  for (size_t i = 0, k = 0; i < b->n_entries; i++)
    for (uint64_t p = 0; p < e[i].ntokens; p++) t[k++] = (engine_tok_t){e[i].seq_id, e[i].pos + p};
  engine_hist_t h = {0};
  ENGINE_CALL(r, engine_history(eng, b->cache_id, &x, t, ntok, &h)); /* sizes */
  if ((rc = step_place(c, r, &g, gather, mask, b->out_off, b->out_len, h.nentries, ntok, place,
                       sizes)))
    return rc;
  h.spans_cap = h.nspans;
  if (!(h.spans = arena_alloc(r->a, (h.nspans + 1) * sizeof *h.spans)) ||
      (rc = hist_positions_room(r, &h)))
    return rc ? rc : reject(r, KVC_E_NOMEM, "out of memory");
  if (gather) {
    h.k = c->shm.base + place[0];
    h.v = c->shm.base + place[1];
    h.k_bytes = sizes[0];
    h.v_bytes = sizes[1];
  }
  h.mask = mask ? (float *)(void *)(c->shm.base + place[2]) : NULL;
  h.mask_bytes = sizes[2];
  ENGINE_CALL(r, engine_history(eng, b->cache_id, &x, t, ntok, &h));
  if ((rc = history_reply(r, &h, sizes[0], sizes[1]))) return rc;
  sr->history = r->resp->history; /* history_reply set it as the body */
  r->resp->body_case = KVCACHE__V1__RESPONSE__BODY_STEP;
  r->resp->step = sr;
  sr->k_off = place[0];
  sr->v_off = place[1];
  sr->mask_off = place[2];
  if (!lease) return 0;
  Kvcache__V1__LeaseReply **lr = arena_alloc(r->a, (h.nspans + 1) * sizeof *lr);
  if (!lr) return reject(r, KVC_E_NOMEM, "out of memory");
  for (size_t i = 0; i < h.nspans; i++) {
    const engine_span_t *s = &h.spans[i];
    if ((rc = lease_take(c, r, b->cache_id, s->seq_id, s->pos, s->pos + s->n, &lr[i]))) {
      leases_undo(c, lr, i);
      return rc; /* past the checks only out of memory or a tenant's pin quota */
    }
  }
  sr->n_leases = h.nspans;
  sr->leases = lr;
  return 0;
}

/* ---- prefix cache -------------------------------------------------------- */

/* The query's token ids, read in place in the shared buffer: the engine
 * copies each page's ids once before it hashes and verifies them (the client
 * may change them meanwhile) and stops at the first miss, so a Match of
 * millions of ids costs what it matches, not what it names. */
static int match_tokens(conn_t *c, reply_t *r, const char *op, uint64_t off, uint64_t n,
                        const uint32_t **out) {
  return check_tokens(c, r, op, off, n, out);
}

/* Replies to a match or attach, and counts the ids of the pages it
 * matched (what it hashed) against the connection's turn. */
static int match_reply(conn_t *c, reply_t *r, const engine_match_t *m) {
  c->turn_bytes += 4 * m->tokens;
  Kvcache__V1__MatchReply *mr = arena_alloc(r->a, sizeof *mr);
  if (!mr) return reject(r, KVC_E_NOMEM, "out of memory");
  codec_match_to_wire(&(kvc_match_t){m->tokens, m->pages, m->ineligible}, mr);
  r->resp->body_case = KVCACHE__V1__RESPONSE__BODY_MATCH;
  r->resp->match = mr;
  return 0;
}

/* A match or attach that is past what the pool holds goes on in the tiers
 * below it, in the chain's order (tier.h): the request waits (TIERS_WAIT),
 * then runs again, whole, and what came goes in before its own engine call. */
static int tiers_step(conn_t *c, uint32_t cache_id, const uint32_t *tokens, uint64_t n,
                      const engine_pkey_t *key) {
  tier_query_t q = {cache_id, tokens, n, key, &c->turn_bytes};
  return tiers_lookup(c->srv, &c->tw, &q) == TIER_WAIT ? TIERS_WAIT : 0;
}

static int h_match(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  const Kvcache__V1__Match *b = req->match;
  NEED_BODY(r, b, "match");
  engine_pkey_t key;
  const uint32_t *tokens;
  int rc = check_key(r, b->salt, b->extra, &key);
  if (rc || (rc = match_tokens(c, r, "match", b->tok_off, b->ntokens, &tokens)) ||
      (rc = span_keys(r, b->span_keys, b->n_span_keys, &key.spans)))
    return rc;
  key.nspans = b->n_span_keys;
  if ((rc = tiers_step(c, b->cache_id, tokens, b->ntokens, &key))) return rc;
  engine_match_t m;
  ENGINE_CALL(r, engine_match(c->srv->eng, b->cache_id, tokens, b->ntokens, &key, &m));
  return match_reply(c, r, &m);
}

static int h_attach(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  const Kvcache__V1__Attach *b = req->attach;
  NEED_BODY(r, b, "attach");
  engine_pkey_t key;
  const uint32_t *tokens;
  int rc = check_key(r, b->salt, b->extra, &key);
  if (rc || (rc = match_tokens(c, r, "attach", b->tok_off, b->ntokens, &tokens)) ||
      (rc = span_keys(r, b->span_keys, b->n_span_keys, &key.spans)) ||
      (rc = refuse_replace(c, r, b->no_replace, b->cache_id, b->dst_seq)))
    return rc;
  key.nspans = b->n_span_keys;
  if ((rc = tiers_step(c, b->cache_id, tokens, b->ntokens, &key))) return rc;
  engine_match_t m;
  ENGINE_CALL(r, engine_attach(c->srv->eng, b->cache_id, b->dst_seq, tokens, b->ntokens, &key,
                               b->pin ? c->id : 0, &m));
  return match_reply(c, r, &m);
}

static int h_set_priority(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  const Kvcache__V1__SetPriority *b = req->set_priority;
  NEED_BODY(r, b, "set_priority");
  if (b->priority > KVC_MAX_PRIORITY)
    return reject(r, KVC_E_INVAL, "priority %u outside 0..%u", b->priority, KVC_MAX_PRIORITY);
  ENGINE_CALL(r, engine_set_priority(c->srv->eng, b->cache_id, b->seq_id, b->priority));
  return 0;
}

static int h_pin_ttl(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  const Kvcache__V1__PinTtl *b = req->pin_ttl;
  NEED_BODY(r, b, "pin_ttl");
  if (b->ttl_ms > KVC_MAX_TTL_MS)
    return reject(r, KVC_E_RANGE, "ttl_ms %llu exceeds %llu (a year); use a hard pin",
                  (unsigned long long)b->ttl_ms, (unsigned long long)KVC_MAX_TTL_MS);
  ENGINE_CALL(r, engine_pin_ttl(c->srv->eng, b->cache_id, b->seq_id, c->id, b->ttl_ms));
  return 0;
}

static int h_prefix_top(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  const Kvcache__V1__PrefixTop *b = req->prefix_top;
  NEED_BODY(r, b, "prefix_top");
  size_t cap = b->max == 0 ? TOP_DEFAULT : b->max > TOP_MAX ? TOP_MAX : b->max, n = 0;
  engine_prefix_top_t *top = arena_alloc(r->a, cap * sizeof *top);
  Kvcache__V1__PrefixTopReply *tr = arena_alloc(r->a, sizeof *tr);
  Kvcache__V1__PrefixHead **heads = arena_alloc(r->a, cap * sizeof *heads);
  if (!top || !tr || !heads) return reject(r, KVC_E_NOMEM, "out of memory");
  ENGINE_CALL(r, engine_prefix_top(c->srv->eng, b->cache_id, top, cap, &n));
  /* xxHash3-128 fills the first 16 bytes of the engine's 32. */
  size_t hash_bytes = c->srv->cfg.prefix_hash == KVC_HASH_XXH3 ? 16 : 32;
  kvcache__v1__prefix_top_reply__init(tr);
  for (size_t i = 0; i < n && i < cap; i++) {
    Kvcache__V1__PrefixHead *h = arena_alloc(r->a, sizeof *h);
    if (!h) return reject(r, KVC_E_NOMEM, "out of memory");
    kvcache__v1__prefix_head__init(h);
    h->hash.data = top[i].hash;
    h->hash.len = hash_bytes;
    h->hits = top[i].hits;
    h->depth = top[i].depth;
    heads[i] = h;
  }
  tr->n_heads = n < cap ? n : cap;
  tr->heads = heads;
  r->resp->body_case = KVCACHE__V1__RESPONSE__BODY_PREFIX_TOP;
  r->resp->prefix_top = tr;
  return 0;
}

/* ---- tenants ------------------------------------------------------------------ */

/* Usage per tenant: its connected clients and what its caches hold. A
 * non-admin gets its own row only. */
static int h_tenants(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  (void)req;
  server_t *srv = c->srv;
  uint32_t nt = srv->tenants.n + 1; /* ids 0 (shared) .. n */
  Kvcache__V1__TenantInfo *rows = arena_alloc(r->a, nt * sizeof *rows);
  Kvcache__V1__TenantInfo **items = arena_alloc(r->a, nt * sizeof *items);
  Kvcache__V1__TenantsReply *tr = arena_alloc(r->a, sizeof *tr);
  size_t ncaches = 0;
  engine_cache_list(srv->eng, NULL, 0, &ncaches);
  kvc_cache_info_t *infos = ncaches ? arena_alloc(r->a, ncaches * sizeof *infos) : NULL;
  if (!rows || !items || !tr || (ncaches && !infos)) return reject(r, KVC_E_NOMEM, "out of memory");
  if (ncaches) engine_cache_list(srv->eng, infos, ncaches, &ncaches);
  for (uint32_t t = 0; t < nt; t++) {
    kvcache__v1__tenant_info__init(&rows[t]);
    rows[t].name = (char *)tenants_name(&srv->tenants, t);
  }
  for (const conn_t *k = srv->conns; k; k = k->next) {
    if (k->counted && k->tenant < nt) rows[k->tenant].connections++;
    if (k->shm.base && k->tenant < nt) rows[k->tenant].shm_bytes += k->shm.bytes;
  }
  for (uint32_t t = 0; t < nt; t++) quotas_row(srv, t, &rows[t]);
  for (size_t i = 0; i < ncaches; i++) {
    uint32_t owner;
    if (engine_cache_tenant(srv->eng, infos[i].cache_id, &owner) != 0 || owner >= nt) continue;
    rows[owner].caches++;
    rows[owner].sequences += infos[i].sequences;
    rows[owner].tokens += infos[i].tokens;
    rows[owner].pages += infos[i].pages;
  }
  size_t n = 0;
  for (uint32_t t = 0; t < nt; t++) {
    bool mine = t == c->tenant;
    bool used = rows[t].connections || rows[t].caches || rows[t].pool_pages ||
                rows[t].refused_connections || rows[t].refused_shm;
    if (c->admin ? (used || mine) : mine) {
      rows[t].admin = c->admin;
      items[n++] = &rows[t];
    }
  }
  kvcache__v1__tenants_reply__init(tr);
  tr->n_tenants = n;
  tr->tenants = items;
  r->resp->body_case = KVCACHE__V1__RESPONSE__BODY_TENANTS;
  r->resp->tenants = tr;
  return 0;
}
/* ---- the event stream (events.c; doc/events.md) ---------------------------- */

/* The connection becomes a subscriber; this reply is seq 0 of its stream. */
static int h_subscribe(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  const Kvcache__V1__Subscribe *b = req->subscribe;
  NEED_BODY(r, b, "subscribe");
  if (b->cache && strlen(b->cache) > KVC_MAX_NAME)
    return reject(r, KVC_E_NAME, "a cache name is at most %u bytes", KVC_MAX_NAME);
  Kvcache__V1__EventsReply *er = arena_alloc(r->a, sizeof *er);
  if (!er) return reject(r, KVC_E_NOMEM, "out of memory");
  int rc = events_subscribe(c, req->id, b->cache, b->token_ids, r->err, sizeof r->err);
  if (rc) return rc;
  kvcache__v1__events_reply__init(er);
  r->resp->body_case = KVCACHE__V1__RESPONSE__BODY_EVENTS;
  r->resp->events = er;
  return 0;
}

/* ---- operators: admins only (admin.c) ----------------------------------- */

#define ADMIN_HANDLER_(name)                                                   \
  static int h_##name(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) { \
    return admin_##name(c, req, r->a, r->resp, r->err, sizeof r->err);        \
  }
ADMIN_HANDLER_(clients)
ADMIN_HANDLER_(config)
ADMIN_HANDLER_(admin)
#undef ADMIN_HANDLER_

/* ---- the pool's segments (doc/tiers.md, online resize) -------------------- */

/* The segments and their read-only descriptors, for a client that maps the
 * pool: it asks when a lease names a generation or a page it has not
 * mapped. */
static int h_pool_map(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  const poolmap_t *pm = &c->srv->pool;
  if (!c->pool_mapped)
    return reject(r, KVC_E_PERM, "the pool mapping is for admins and the tenant of a "
                  "single-tenant node (doc/security.md)");
  uint32_t from = req->pool_map ? req->pool_map->from : 0;
  if (from > pm->nseg) return reject(r, KVC_E_INVAL, "pool_map from %u: the pool has %u segments",
                                     from, pm->nseg);
  Kvcache__V1__PoolMapReply *pr = arena_alloc(r->a, sizeof *pr);
  Kvcache__V1__PoolSegment *segs = arena_alloc(r->a, POOLMAP_FDS_MAX * sizeof *segs);
  Kvcache__V1__PoolSegment **ptrs = arena_alloc(r->a, POOLMAP_FDS_MAX * sizeof *ptrs);
  if (!pr || !segs || !ptrs) return reject(r, KVC_E_NOMEM, "out of memory");
  kvcache__v1__pool_map_reply__init(pr);
  pr->gen = pm->gen;
  pr->reserve_bytes = pm->reserve;
  pr->pool_bytes = pm->bytes;
  bool arenas = poolown_arenas(c->srv);
  if (arenas && from == 0) poolown_remapped(c); /* it maps every listed one again */
  uint32_t n = 0, i = from;
  for (; i < pm->nseg && n < POOLMAP_FDS_MAX; i++) {
    if (arenas && !poolown_may_read(c, i)) continue;
    if (arenas && poolown_mapped(c, i, pm->seg[i].id) != 0)
      return reject(r, KVC_E_NOMEM, "out of memory");
    kvcache__v1__pool_segment__init(&segs[n]);
    segs[n].offset = pm->seg[i].off;
    segs[n].bytes = pm->seg[i].bytes;
    segs[n].id = pm->seg[i].id;
    engine_arena_info_t ai;
    if (arenas && engine_arena_by_id(c->srv->eng, engine_segment_arena(c->srv->eng, i), &ai) == 0) {
      segs[n].arena = ai.uid;
      segs[n].page_stride = ai.stride;
      segs[n].pages = ai.per_seg;
    }
    ptrs[n] = &segs[n];
    r->fdv[n++] = pm->seg[i].ro_fd;
  }
  if (!arenas && pm->nseg > POOLMAP_FDS_MAX)
    return reject(r, KVC_E_INTERNAL, "more segments than one reply passes");
  pr->next_from = i < pm->nseg ? i : 0;
  pr->n_segments = n;
  pr->segments = ptrs;
  r->nfdv = (int)n;
  r->resp->body_case = KVCACHE__V1__RESPONSE__BODY_POOL_MAP;
  r->resp->pool_map = pr;
  return 0;
}

static int h_pool_resize(conn_t *c, const Kvcache__V1__Request *req, reply_t *r) {
  const Kvcache__V1__PoolResize *b = req->pool_resize;
  NEED_BODY(r, b, "pool_resize");
  if (!conn_is_admin(c)) return reject(r, KVC_E_PERM, "resizing the pool is for admins");
  int rc = pool_resize_start(c->srv, c, b->bytes, req->id, r->t0_ns, r->err, sizeof r->err);
  if (rc == 0) return DEFERRED; /* poolresize.c replies */
  r->no_park = true;
  return rc;
}

/* ---- the table ----------------------------------------------------------- */

static const struct {
  handler_fn fn;
  enum op op;
} handlers[] = {
#define ROW_(name, CASE, RIGHT) [KVCACHE__V1__REQUEST__BODY_##CASE] = {h_##name, OP_##CASE},
    DAEMON_OPS(ROW_)
#undef ROW_
};
#define NHANDLERS (sizeof handlers / sizeof handlers[0])

/* protobuf-c allocates through this: a request that needs more heap than
 * max_decode_bytes fails to decode instead of exhausting the daemon. The
 * decoded request lives in an arena of its own, dropped whole once it is
 * answered (req_done): no malloc and free of each submessage, no walk of
 * the message to free it (issue 34: 20% of the daemon's time in a 4 KiB
 * put). dispatch_frame is never re-entered (ring_preempt runs between
 * frames), so one arena serves every request. */
typedef struct budget {
  size_t left;
} budget_t;

static arena_t req_arena;

static void *budget_alloc(void *data, size_t size) {
  budget_t *b = data;
  if (size > b->left) return NULL;
  b->left -= size;
  return arena_alloc(&req_arena, size);
}

static void budget_free(void *data, void *p) {
  (void)data;
  (void)p; /* the arena goes whole */
}

static void req_done(void) { arena_reset(&req_arena); }

static int run(conn_t *c, const Kvcache__V1__Request *req, reply_t *r, int *op) {
  *op = -1;
  unsigned bc = (unsigned)req->body_case;
  if (!c->greeted && req->body_case != KVCACHE__V1__REQUEST__BODY_HELLO) {
    r->close_after = true;
    return reject(r, KVC_E_PROTO, "the first request must be Hello");
  }
  if (bc >= NHANDLERS || !handlers[bc].fn)
    return reject(r, KVC_E_PROTO, "unknown or empty request (body %u)", bc);
  *op = (int)handlers[bc].op;
  int rc = r->fast ? gate_cache(c, r->cache_id, handlers[bc].op, r)
                   : tenant_gate(c, req, handlers[bc].op, r);
  return rc ? rc : handlers[bc].fn(c, req, r);
}

/* Deferred lease releases ride on any request of a greeted connection. */
static void release_deferred(conn_t *c, const Kvcache__V1__Request *req) {
  for (size_t i = 0; i < req->n_release_leases; i++)
    if (engine_lease_release(c->srv->eng, c->id, req->release_leases[i]) == 0) c->nleases--;
}

/* Runs a decoded request (a frame's, or a fast request's) and replies. */
/* The fields of a reply before its handler runs: the message and the
 * descriptor list (a third of a kilobyte) are not zeroed, only emptied. */
static void reply_init(reply_t *r, server_t *srv, Kvcache__V1__Response *resp, uint64_t t0) {
  memset(r, 0, offsetof(reply_t, err));
  r->srv = srv;
  r->resp = resp;
  r->a = &srv->arena;
  r->fd = r->fd2 = r->fd3 = -1;
  r->t0_ns = t0;
  r->err[0] = '\0';
}

static bool dispatch_request(conn_t *c, const Kvcache__V1__Request *req, uint64_t t0,
                             const ringfast_req_t *fast) {
  server_t *srv = c->srv;
  engine_set_now(srv->eng, uv_now(srv->loop));
  Kvcache__V1__Response resp = KVCACHE__V1__RESPONSE__INIT;
  reply_t r;
  ringfast_rep_t rep;
  reply_init(&r, srv, &resp, t0);
  if (fast) {
    r.fast = true;
    r.cache_id = fast->cache_id;
    r.rep = &rep;
    /* Field by field: a memset of this size is a rep stos, slow to start. */
    rep.status = rep.npages = rep.err_len = 0;
    rep.lease_id = rep.first_pos = rep.pool_gen = rep.full_needed = rep.full_freeable = 0;
    rep.err[0] = '\0';
  }
  int op;
  TESTHOOK(before, srv->eng);
  if (c->greeted) release_deferred(c, req);
  c->requests++;
  c->last_ms = uv_now(srv->loop);
  int rc = run(c, req, &r, &op);
  if (!r.large && rc != TIERS_WAIT) srv->small_ns = t0;
  TESTHOOK(after, srv->eng);
  if (rc == TIERS_WAIT) {
    /* Nothing ran: the frame runs again, whole, when the lookups end. */
    req_done();
    arena_reset(&srv->arena);
    c->requests--;
    conn_park(c);
    return false;
  }
  if (rc == DEFERRED || (rc == KVC_E_BUSY && !c->offloaded && !r.no_park)) {
    /* Offloaded: offload.c replies and counts it. Busy: a sequence it needs
     * has a put of another connection in flight; the engine changed
     * nothing, so the frame runs again, whole, when a put ends. */
    req_done();
    arena_reset(&srv->arena);
    if (rc == DEFERRED) return true;
    c->requests--;
    conn_park(c);
    return false;
  }
  resp.id = req->id;
  resp.status = dispatch_status(rc);
  resp.error = rc ? r.err : (char *)"";
  if (rc) {
    resp.body_case = KVCACHE__V1__RESPONSE__BODY__NOT_SET;
    LOG_DEBUG("request_error", "conn=%llu op=%u status=%s error=\"%s\"",
              (unsigned long long)c->id, (unsigned)req->body_case, kvc_err_name(rc), r.err);
  }
  int sent;
  if (r.fd >= 0) {
    int fds[3], nfds = 0;
    fds[nfds++] = r.fd;
    if (r.fd2 >= 0) fds[nfds++] = r.fd2;
    if (r.fd3 >= 0) fds[nfds++] = r.fd3;
    sent = conn_send_fds(c, &resp, fds, nfds);
    shm_close_fd(&c->shm);
  } else if (r.nfdv && !rc) {
    sent = conn_send_fds(c, &resp, r.fdv, r.nfdv);
  } else if (fast) { /* the same Response, as the fast reply holds it */
    rep.status = (uint32_t)resp.status;
    if (rc) ringfast_rep_error(&rep, r.err, resp.full_needed, resp.full_freeable);
    sent = conn_send_fast(c, &rep);
  } else {
    sent = conn_send(c, &resp);
  }
  /* After the reply, what nothing in it needs: the decoded request, the
   * reply's arena, the tiers' walk (the next request walks them anew). */
  req_done();
  tiers_end(srv, &c->tw);
  arena_reset(&srv->arena);
  srv->answered_ns = uv_hrtime();
  if (op >= 0) metrics_record(&srv->stats, (enum op)op, srv->answered_ns - t0, rc);
  if (sent != 0) conn_close(c, "cannot send a reply");
  else if (r.close_after) conn_close_after_flush(c, r.err);
  return true;
}

bool dispatch_frame(conn_t *c, const uint8_t *payload, size_t len) {
  server_t *srv = c->srv;
  uint64_t t0 = uv_hrtime();
  quotas_touch(c);
  budget_t budget = {srv->cfg.max_decode_bytes};
  ProtobufCAllocator alloc = {budget_alloc, budget_free, &budget};
  /* A put or get in the canonical form unpacks by hand (proto/iowire.h),
   * to the same message; anything else, from a fresh budget, as before. */
  Kvcache__V1__Request *req = iowire_unpack(&alloc, len, payload);
  if (!req) {
    req_done();
    budget.left = srv->cfg.max_decode_bytes;
    req = kvcache__v1__request__unpack(&alloc, len, payload);
  }
  if (!req) {
    req_done();
    LOG_LIMITED(&srv->limit_bad_frame, uv_now(srv->loop), LOG_LEVEL_WARN, "bad_frame",
                "conn=%llu pid=%d frame_bytes=%zu reason=\"does not decode within "
                "max_decode_bytes\"", (unsigned long long)c->id, (int)c->pid, len);
    srv->stats.connections_dropped++;
    conn_close(c, "frame does not decode");
    return true;
  }
  return dispatch_request(c, req, t0, NULL);
}

/* ---- the fast slots (proto/ringfast.h) ---------------------------------------- */

bool dispatch_fast(conn_t *c, const uint8_t *body, uint32_t seq, uint64_t t0) {
  server_t *srv = c->srv;
  quotas_touch(c);
  ringfast_req_t q;
  const char *why;
  if (ringfast_req_decode(body, &q, &why) != 0) {
    LOG_LIMITED(&srv->limit_bad_frame, uv_now(srv->loop), LOG_LEVEL_WARN, "bad_frame",
                "conn=%llu pid=%d reason=\"%s\"", (unsigned long long)c->id, (int)c->pid, why);
    srv->stats.connections_dropped++;
    conn_close(c, why);
    return true;
  }
  /* The Request it stands for, on the stack: a frame with the same fields
   * decodes to the same structure (lengths aside: r.fast). Only the kind's
   * own parts are initialized. */
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  uint64_t release = q.release;
  req.id = seq;
  if (release) {
    req.n_release_leases = 1;
    req.release_leases = &release;
  }
  if (q.kind == RINGFAST_LEASE) {
    Kvcache__V1__Lease l = KVCACHE__V1__LEASE__INIT;
    l.cache_id = q.cache_id;
    l.seq_id = q.seq_id;
    l.begin = q.pos;
    l.end = q.pos + q.ntokens; /* cannot wrap to a valid range: the engine refuses */
    if (l.end < l.begin) l.end = UINT64_MAX;
    req.body_case = KVCACHE__V1__REQUEST__BODY_LEASE;
    req.lease = &l;
    return dispatch_request(c, &req, t0, &q);
  }
  Kvcache__V1__Io io = KVCACHE__V1__IO__INIT;
  Kvcache__V1__Xfer x = KVCACHE__V1__XFER__INIT;
  Kvcache__V1__IoEntry e = KVCACHE__V1__IO_ENTRY__INIT, *ep = &e;
  x.layer_begin = q.layer_begin;
  x.layer_end = q.layer_end;
  x.head_begin = q.head_begin;
  x.head_end = q.head_end;
  x.dtype = (Kvcache__V1__DType)q.dtype;
  e.seq_id = q.seq_id;
  e.pos = q.pos;
  e.ntokens = q.ntokens;
  e.k_off = q.k_off;
  e.v_off = q.v_off;
  io.cache_id = q.cache_id;
  io.xfer = &x;
  io.n_entries = 1;
  io.entries = &ep;
  if (q.kind == RINGFAST_PUT) {
    req.body_case = KVCACHE__V1__REQUEST__BODY_PUT;
    req.put = &io;
  } else {
    req.body_case = KVCACHE__V1__REQUEST__BODY_GET;
    req.get = &io;
  }
  return dispatch_request(c, &req, t0, &q);
}
