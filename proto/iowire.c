/* iowire.c: put and get frames packed and unpacked by hand (iowire.h). */
#include "iowire.h"

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

/* Wire types. */
enum { WT_VARINT = 0, WT_I32 = 5, WT_LEN = 2 };

/* Field numbers (kvcache.proto). */
enum {
  REQ_ID = 1, REQ_PUT = 8, REQ_GET = 9, REQ_RELEASE = 64,
  IO_CACHE = 1, IO_XFER = 2, IO_ENTRY = 3, IO_SALT = 4, IO_EXTRA = 5,
  X_LAYER_BEGIN = 1, X_LAYER_END = 2, X_HEAD_BEGIN = 3, X_HEAD_END = 4, X_DTYPE = 5,
  X_K_SCALE = 6, X_V_SCALE = 7,
  E_FIELDS = 13, /* IoEntry's uint64 fields 1..13; 14 (span_keys) is not covered */
};

/* ---- packing ----------------------------------------------------------------- */

static inline size_t vsize(uint64_t v) { /* 1 + floor(log2(v | 1) / 7) */
  return 1 + (size_t)(63 - __builtin_clzll(v | 1)) / 7;
}

static inline uint8_t *vput(uint8_t *p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  *p++ = (uint8_t)v;
  return p;
}

static uint64_t tag(unsigned field, unsigned wt) { return (uint64_t)field << 3 | wt; }

/* An enum is an int32: a negative one goes as its 64-bit sign extension. */
static uint64_t enum_wire(int32_t v) { return (uint64_t)(int64_t)v; }

/* IoEntry's fields 1..13, in field order, as an array (the struct keeps
 * them so: checked below). */
_Static_assert(offsetof(Kvcache__V1__IoEntry, tok_len) - offsetof(Kvcache__V1__IoEntry, seq_id) ==
                   (E_FIELDS - 1) * sizeof(uint64_t),
               "IoEntry's uint64 fields are consecutive");
static inline const uint64_t *entry_fields(const Kvcache__V1__IoEntry *e) { return &e->seq_id; }
static inline uint64_t *entry_fields_w(Kvcache__V1__IoEntry *e) { return &e->seq_id; }

static inline size_t entry_size(const Kvcache__V1__IoEntry *e) {
  const uint64_t *f = entry_fields(e);
  size_t n = 0;
  for (unsigned i = 0; i < E_FIELDS; i++) n += f[i] ? 1 + vsize(f[i]) : 0;
  return n;
}

static size_t xfer_size(const Kvcache__V1__Xfer *x) {
  const uint32_t u[4] = {x->layer_begin, x->layer_end, x->head_begin, x->head_end};
  size_t n = 0;
  for (unsigned i = 0; i < 4; i++)
    if (u[i]) n += 1 + vsize(u[i]);
  if (x->dtype) n += 1 + vsize(enum_wire((int32_t)x->dtype));
  if (x->k_scale != 0) n += 5;
  if (x->v_scale != 0) n += 5;
  return n;
}

static const Kvcache__V1__Io *io_of(const Kvcache__V1__Request *req) {
  if (req->body_case == KVCACHE__V1__REQUEST__BODY_PUT) return req->put;
  if (req->body_case == KVCACHE__V1__REQUEST__BODY_GET) return req->get;
  return NULL;
}

static size_t io_size(const Kvcache__V1__Io *io) {
  size_t n = 0;
  if (io->cache_id) n += 1 + vsize(io->cache_id);
  if (io->xfer) {
    size_t x = xfer_size(io->xfer);
    n += 1 + vsize(x) + x;
  }
  for (size_t i = 0; i < io->n_entries; i++) {
    size_t e = entry_size(io->entries[i]);
    n += 1 + vsize(e) + e;
  }
  if (io->salt.len) n += 1 + vsize(io->salt.len) + io->salt.len;
  if (io->extra.len) n += 1 + vsize(io->extra.len) + io->extra.len;
  return n;
}

size_t iowire_packed_size(const Kvcache__V1__Request *req) {
  const Kvcache__V1__Io *io = io_of(req);
  if (!io || req->base.n_unknown_fields || io->base.n_unknown_fields ||
      (io->xfer && io->xfer->base.n_unknown_fields))
    return 0;
  for (size_t i = 0; i < io->n_entries; i++)
    if (io->entries[i]->n_span_keys || io->entries[i]->base.n_unknown_fields) return 0;
  size_t n = 0, body = io_size(io);
  if (req->id) n += 1 + vsize(req->id);
  n += 1 + vsize(body) + body;
  if (req->n_release_leases) {
    size_t r = 0;
    for (size_t i = 0; i < req->n_release_leases; i++) r += vsize(req->release_leases[i]);
    n += vsize(tag(REQ_RELEASE, WT_LEN)) + vsize(r) + r;
  }
  return n;
}

static uint8_t *put_i32(uint8_t *p, unsigned field, float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  *p++ = (uint8_t)tag(field, WT_I32);
  for (int i = 0; i < 4; i++) *p++ = (uint8_t)(u >> (8 * i));
  return p;
}

static uint8_t *put_bytes(uint8_t *p, unsigned field, const ProtobufCBinaryData *b) {
  p = vput(p, tag(field, WT_LEN));
  p = vput(p, b->len);
  memcpy(p, b->data, b->len);
  return p + b->len;
}

size_t iowire_pack(const Kvcache__V1__Request *req, uint8_t *out) {
  const Kvcache__V1__Io *io = io_of(req);
  uint8_t *p = out;
  if (req->id) p = vput(vput(p, tag(REQ_ID, WT_VARINT)), req->id);
  p = vput(p, tag(req->body_case == KVCACHE__V1__REQUEST__BODY_PUT ? REQ_PUT : REQ_GET, WT_LEN));
  p = vput(p, io_size(io));
  if (io->cache_id) p = vput(vput(p, tag(IO_CACHE, WT_VARINT)), io->cache_id);
  if (io->xfer) {
    const Kvcache__V1__Xfer *x = io->xfer;
    const uint32_t u[4] = {x->layer_begin, x->layer_end, x->head_begin, x->head_end};
    p = vput(vput(p, tag(IO_XFER, WT_LEN)), xfer_size(x));
    for (unsigned i = 0; i < 4; i++)
      if (u[i]) p = vput(vput(p, tag(X_LAYER_BEGIN + i, WT_VARINT)), u[i]);
    if (x->dtype) p = vput(vput(p, tag(X_DTYPE, WT_VARINT)), enum_wire((int32_t)x->dtype));
    if (x->k_scale != 0) p = put_i32(p, X_K_SCALE, x->k_scale);
    if (x->v_scale != 0) p = put_i32(p, X_V_SCALE, x->v_scale);
  }
  for (size_t i = 0; i < io->n_entries; i++) {
    const uint64_t *f = entry_fields(io->entries[i]);
    /* The entry after a 1-byte length (it is under 128 bytes unless most
     * fields are wide), moved up one byte if not. */
    uint8_t *len = vput(p, tag(IO_ENTRY, WT_LEN)), *q = len + 1;
    for (unsigned k = 0; k < E_FIELDS; k++)
      if (f[k]) {
        *q++ = (uint8_t)tag(k + 1, WT_VARINT);
        q = vput(q, f[k]);
      }
    size_t n = (size_t)(q - len - 1);
    if (n < 0x80) {
      *len = (uint8_t)n;
    } else {
      memmove(len + 2, len + 1, n);
      vput(len, n);
    }
    p = len + vsize(n) + n;
  }
  if (io->salt.len) p = put_bytes(p, IO_SALT, &io->salt);
  if (io->extra.len) p = put_bytes(p, IO_EXTRA, &io->extra);
  if (req->n_release_leases) {
    size_t r = 0;
    for (size_t i = 0; i < req->n_release_leases; i++) r += vsize(req->release_leases[i]);
    p = vput(vput(p, tag(REQ_RELEASE, WT_LEN)), r);
    for (size_t i = 0; i < req->n_release_leases; i++) p = vput(p, req->release_leases[i]);
  }
  return (size_t)(p - out);
}

/* ---- unpacking ----------------------------------------------------------------- */

/* A reader over [p, end): every get fails (false) rather than read past end. */
typedef struct rd {
  const uint8_t *p, *end;
} rd_t;

/* A varint of at most 10 bytes whose value fits 64 bits. */
static bool vget_long(rd_t *r, uint64_t *v) {
  uint64_t x = 0;
  for (unsigned i = 0; i < 10; i++) {
    if (r->p == r->end) return false;
    uint8_t b = *r->p++;
    if (i == 9 && b > 1) return false; /* past 64 bits */
    x |= (uint64_t)(b & 0x7f) << (7 * i);
    if (!(b & 0x80)) {
      *v = x;
      return true;
    }
  }
  return false;
}

static inline bool vget(rd_t *r, uint64_t *v) {
  if (r->p < r->end && *r->p < 0x80) { /* one byte: most tags and values */
    *v = *r->p++;
    return true;
  }
  return vget_long(r, v);
}

/* The next field's number and wire type. */
static inline bool tget(rd_t *r, unsigned *field, unsigned *wt) {
  uint64_t t;
  if (!vget(r, &t) || t >> 3 == 0 || t >> 3 > 0x1fffffff) return false;
  *field = (unsigned)(t >> 3);
  *wt = (unsigned)(t & 7);
  return true;
}

/* A length-delimited field's bytes, as a reader of its own. */
static bool lget(rd_t *r, rd_t *sub) {
  uint64_t n;
  if (!vget(r, &n) || n > (uint64_t)(r->end - r->p)) return false;
  sub->p = r->p;
  sub->end = r->p + n;
  r->p += n;
  return true;
}

static bool u32get(rd_t *r, uint32_t *v) {
  uint64_t x;
  if (!vget(r, &x) || x > UINT32_MAX) return false;
  *v = (uint32_t)x;
  return true;
}

static bool entry_unpack(rd_t r, Kvcache__V1__IoEntry *e) {
  uint64_t *f = entry_fields_w(e);
  unsigned last = 0;
  while (r.p < r.end) {
    /* Fields 1..13 of wire type 0: one-byte tags, (field << 3); any other
     * byte is not the canonical form. */
    uint8_t t = *r.p++;
    unsigned field = t >> 3;
    if ((t & 0x87) || field <= last || field > E_FIELDS || !vget(&r, &f[field - 1]))
      return false;
    last = field;
  }
  return true;
}

static bool xfer_unpack(rd_t r, Kvcache__V1__Xfer *x) {
  uint32_t *u[4] = {&x->layer_begin, &x->layer_end, &x->head_begin, &x->head_end};
  unsigned last = 0, field = 0, wt = 0;
  while (r.p < r.end) {
    if (!tget(&r, &field, &wt) || field <= last) return false;
    last = field;
    if (field <= X_HEAD_END) {
      if (wt != WT_VARINT || !u32get(&r, u[field - 1])) return false;
    } else if (field == X_DTYPE) {
      uint32_t d;
      if (wt != WT_VARINT || !u32get(&r, &d) || d > INT32_MAX) return false;
      x->dtype = (Kvcache__V1__DType)d;
    } else if (field == X_K_SCALE || field == X_V_SCALE) {
      if (wt != WT_I32 || r.end - r.p < 4) return false;
      uint32_t b = (uint32_t)r.p[0] | (uint32_t)r.p[1] << 8 | (uint32_t)r.p[2] << 16 |
                   (uint32_t)r.p[3] << 24;
      memcpy(field == X_K_SCALE ? &x->k_scale : &x->v_scale, &b, 4);
      r.p += 4;
    } else {
      return false;
    }
  }
  return true;
}

static void *alloc(ProtobufCAllocator *a, size_t n) { return a->alloc(a->allocator_data, n); }

static bool bytes_get(ProtobufCAllocator *a, rd_t *r, ProtobufCBinaryData *b) {
  rd_t s;
  if (!lget(r, &s)) return false;
  size_t n = (size_t)(s.end - s.p);
  if (n == 0) return true; /* as protobuf-c: an empty field stays {0, NULL} */
  if (!(b->data = alloc(a, n))) return false;
  memcpy(b->data, s.p, n);
  b->len = n;
  return true;
}

/* Fills io (allocated and initialized, already in the request, so that
 * whatever is allocated here is freed with it) from r: false when r is not
 * canonical or an allocation failed. */
static bool io_unpack(ProtobufCAllocator *a, rd_t r, Kvcache__V1__Io *io) {
  /* First pass: the fields in order, each once (entries one run), and how
   * many entries. */
  rd_t s = r;
  unsigned last = 0, field = 0, wt = 0;
  size_t n = 0;
  while (s.p < s.end) {
    rd_t sub;
    uint64_t v;
    if (!tget(&s, &field, &wt)) return false;
    if (field < last || (field == last && field != IO_ENTRY)) return false;
    last = field;
    if (field == IO_CACHE) {
      if (wt != WT_VARINT || !vget(&s, &v) || v > UINT32_MAX) return false;
      io->cache_id = (uint32_t)v;
    } else if (field >= IO_XFER && field <= IO_EXTRA) {
      if (wt != WT_LEN || !lget(&s, &sub)) return false;
      n += field == IO_ENTRY;
    } else {
      return false;
    }
  }
  if (n && !(io->entries = alloc(a, n * sizeof *io->entries))) return false;
  /* Second pass: the submessages and bytes. */
  while (r.p < r.end) {
    rd_t sub;
    uint64_t v;
    tget(&r, &field, &wt); /* the first pass read them all */
    if (field == IO_CACHE) {
      vget(&r, &v);
    } else if (field == IO_XFER) {
      lget(&r, &sub);
      if (!(io->xfer = alloc(a, sizeof *io->xfer))) return false;
      kvcache__v1__xfer__init(io->xfer);
      if (!xfer_unpack(sub, io->xfer)) return false;
    } else if (field == IO_ENTRY) {
      lget(&r, &sub);
      Kvcache__V1__IoEntry *e = alloc(a, sizeof *e);
      if (!e) return false;
      kvcache__v1__io_entry__init(e);
      io->entries[io->n_entries++] = e;
      if (!entry_unpack(sub, e)) return false;
    } else if (!bytes_get(a, &r, field == IO_SALT ? &io->salt : &io->extra)) {
      return false;
    }
  }
  return true;
}

/* Reads the request's fields into req: false as io_unpack. */
static bool req_unpack(ProtobufCAllocator *a, rd_t r, Kvcache__V1__Request *req) {
  unsigned last = 0, field = 0, wt = 0;
  while (r.p < r.end) {
    rd_t sub;
    if (!tget(&r, &field, &wt) || field <= last) return false;
    last = field;
    if (field == REQ_ID) {
      if (wt != WT_VARINT || !vget(&r, &req->id)) return false;
    } else if (field == REQ_PUT || field == REQ_GET) {
      if (req->body_case || wt != WT_LEN || !lget(&r, &sub)) return false;
      Kvcache__V1__Io *io = alloc(a, sizeof *io);
      if (!io) return false;
      kvcache__v1__io__init(io);
      if (field == REQ_PUT) {
        req->body_case = KVCACHE__V1__REQUEST__BODY_PUT;
        req->put = io;
      } else {
        req->body_case = KVCACHE__V1__REQUEST__BODY_GET;
        req->get = io;
      }
      if (!io_unpack(a, sub, io)) return false;
    } else if (field == REQ_RELEASE) { /* packed, as proto3 packs it */
      if (wt != WT_LEN || !lget(&r, &sub)) return false;
      size_t n = 0;
      for (const uint8_t *q = sub.p; q < sub.end; q++) n += !(*q & 0x80);
      if (sub.p == sub.end) continue; /* an empty run: nothing, as protobuf-c reads it */
      if (n == 0) return false;       /* a varint cut short */
      if (!(req->release_leases = alloc(a, n * sizeof *req->release_leases))) return false;
      while (sub.p < sub.end) {
        if (!vget(&sub, &req->release_leases[req->n_release_leases])) return false;
        req->n_release_leases++;
      }
    } else {
      return false;
    }
  }
  return req->body_case != KVCACHE__V1__REQUEST__BODY__NOT_SET;
}

Kvcache__V1__Request *iowire_unpack(ProtobufCAllocator *a, size_t len, const uint8_t *data) {
  Kvcache__V1__Request *req = alloc(a, sizeof *req);
  if (!req) return NULL;
  kvcache__v1__request__init(req);
  if (req_unpack(a, (rd_t){data, data + len}, req)) return req;
  /* Every part allocated is in req, as far as it got: freed as protobuf-c
   * frees its own. */
  protobuf_c_message_free_unpacked(&req->base, a);
  return NULL;
}
