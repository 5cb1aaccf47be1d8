/* iowire.c: put and get frames packed and unpacked by hand (proto/iowire.h)
 * against protobuf-c itself: the same bytes packed, the same message
 * unpacked, and a frame the hand unpacker takes is one protobuf-c takes to
 * the same message, through random requests and a million mutations of
 * them. */
#include <stdlib.h>
#include <string.h>

#include "../../proto/iowire.h"
#include "test.h"

static uint64_t rs = 0x9e3779b97f4a7c15u;
static uint64_t rnd(void) { /* xorshift64*: the same runs every time */
  rs ^= rs >> 12;
  rs ^= rs << 25;
  rs ^= rs >> 27;
  return rs * 2685821657736338717u;
}

/* A value of every width a varint takes, zero often (a field left out). */
static uint64_t rval(void) {
  static const uint64_t edge[] = {0, 1, 127, 128, 16383, 16384, UINT32_MAX, (uint64_t)1 << 32,
                                  (uint64_t)1 << 63, UINT64_MAX};
  switch (rnd() % 4) {
  case 0: return 0;
  case 1: return edge[rnd() % (sizeof edge / sizeof edge[0])];
  case 2: return rnd() % 100000;
  default: return rnd() >> (rnd() % 64);
  }
}

typedef struct gen {
  Kvcache__V1__Request req;
  Kvcache__V1__Io io;
  Kvcache__V1__Xfer x;
  Kvcache__V1__IoEntry e[70], *ep[70];
  uint64_t rel[4];
  uint8_t salt[70], extra[70];
} gen_t;

static void gen(gen_t *g) {
  kvcache__v1__request__init(&g->req);
  kvcache__v1__io__init(&g->io);
  kvcache__v1__xfer__init(&g->x);
  g->req.id = rval();
  if (rnd() % 2) {
    g->req.body_case = KVCACHE__V1__REQUEST__BODY_PUT;
    g->req.put = &g->io;
  } else {
    g->req.body_case = KVCACHE__V1__REQUEST__BODY_GET;
    g->req.get = &g->io;
  }
  g->req.n_release_leases = rnd() % 3 ? 0 : 1 + rnd() % 4;
  for (size_t i = 0; i < g->req.n_release_leases; i++) g->rel[i] = rval();
  g->req.release_leases = g->rel;
  g->io.cache_id = (uint32_t)rval();
  if (rnd() % 4) {
    g->io.xfer = &g->x;
    g->x.layer_begin = (uint32_t)rval();
    g->x.layer_end = (uint32_t)rval();
    g->x.head_begin = (uint32_t)rval();
    g->x.head_end = (uint32_t)rval();
    g->x.dtype = (Kvcache__V1__DType)(int32_t)(rnd() % 3 ? rnd() % 12 : rval());
    static const float fs[] = {0.0f, -0.0f, 1.0f, 0.5f, -3.25f, 1e-30f};
    g->x.k_scale = fs[rnd() % 6];
    g->x.v_scale = fs[rnd() % 6];
  }
  g->io.n_entries = rnd() % 8 ? rnd() % 5 : rnd() % 70;
  for (size_t i = 0; i < g->io.n_entries; i++) {
    Kvcache__V1__IoEntry *e = &g->e[i];
    kvcache__v1__io_entry__init(e);
    uint64_t *f[13] = {&e->seq_id, &e->pos,    &e->ntokens, &e->k_off,  &e->k_len,
                       &e->v_off,  &e->v_len,  &e->ks_off,  &e->ks_len, &e->vs_off,
                       &e->vs_len, &e->tok_off, &e->tok_len};
    for (int k = 0; k < 13; k++) *f[k] = rval();
    g->ep[i] = e;
  }
  g->io.entries = g->ep;
  g->io.salt.len = rnd() % 3 ? 0 : rnd() % 70;
  g->io.extra.len = rnd() % 3 ? 0 : rnd() % 70;
  for (size_t i = 0; i < 70; i++) g->salt[i] = (uint8_t)rnd(), g->extra[i] = (uint8_t)rnd();
  g->io.salt.data = g->io.salt.len ? g->salt : NULL;
  g->io.extra.data = g->io.extra.len ? g->extra : NULL;
}

/* malloc and free, as protobuf-c's default allocator (free_unpacked with
 * NULL frees with it). */
static void *m_alloc(void *d, size_t n) {
  (void)d;
  return malloc(n);
}
static void m_free(void *d, void *p) {
  (void)d;
  free(p);
}
static ProtobufCAllocator mal = {m_alloc, m_free, NULL};

/* protobuf-c's bytes of m (malloc'd), their count in *n. */
static uint8_t *pb_pack(const ProtobufCMessage *m, size_t *n) {
  *n = protobuf_c_message_get_packed_size(m);
  uint8_t *b = malloc(*n ? *n : 1);
  ASSERT(b != NULL);
  ASSERT_EQ(protobuf_c_message_pack(m, b), *n);
  return b;
}

TEST(iowire_packs_the_bytes_protobuf_c_packs_and_unpacks_them_back) {
  static gen_t g;
  static uint8_t out[1 << 16];
  for (int it = 0; it < 20000; it++) {
    gen(&g);
    size_t n, hn = iowire_packed_size(&g.req);
    uint8_t *want = pb_pack(&g.req.base, &n);
    ASSERT_EQ(hn, n);
    ASSERT_EQ(iowire_pack(&g.req, out), n);
    ASSERT(memcmp(out, want, n) == 0);
    /* Unpacked by hand (malloc, as protobuf-c's default), packed again by
     * protobuf-c: the same bytes; freed as protobuf-c frees its own. */
    Kvcache__V1__Request *u = iowire_unpack(&mal, n, out);
    if (g.io.xfer && (int32_t)g.x.dtype < 0) { /* a negative enum: left to protobuf-c */
      ASSERT(u == NULL);
      free(want);
      continue;
    }
    ASSERT(u != NULL);
    size_t n2;
    uint8_t *again = pb_pack(&u->base, &n2);
    ASSERT_EQ(n2, n);
    ASSERT(memcmp(again, want, n) == 0);
    kvcache__v1__request__free_unpacked(u, NULL);
    free(again);
    free(want);
  }
}

TEST(iowire_covers_only_puts_and_gets_without_span_keys) {
  static gen_t g;
  gen(&g);
  g.io.n_entries = 1;
  g.ep[0] = &g.e[0];
  ASSERT(iowire_packed_size(&g.req) > 0);
  Kvcache__V1__SpanKey sk = KVCACHE__V1__SPAN_KEY__INIT, *skp = &sk;
  g.e[0].n_span_keys = 1;
  g.e[0].span_keys = &skp;
  ASSERT_EQ(iowire_packed_size(&g.req), 0); /* protobuf-c packs it */
  g.e[0].n_span_keys = 0;
  Kvcache__V1__Request ping = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__Ping p = KVCACHE__V1__PING__INIT;
  ping.body_case = KVCACHE__V1__REQUEST__BODY_PING;
  ping.ping = &p;
  ASSERT_EQ(iowire_packed_size(&ping), 0);
  /* Frames protobuf-c takes that are not canonical: left to it. */
  const uint8_t release_first[] = {0x82, 0x04, 0x01, 0x05, 0x08, 0x01, 0x4a, 0x00};
  const uint8_t cache_id_wide[] = {0x4a, 0x06, 0x08, 0x80, 0x80, 0x80, 0x80, 0x10};
  const uint8_t twice_xfer[] = {0x4a, 0x04, 0x12, 0x00, 0x12, 0x00};
  const uint8_t unknown[] = {0x4a, 0x02, 0x30, 0x01};
  const uint8_t no_body[] = {0x08, 0x07};
  const struct {
    const uint8_t *b;
    size_t n;
  } odd[] = {{release_first, sizeof release_first}, {cache_id_wide, sizeof cache_id_wide},
             {twice_xfer, sizeof twice_xfer}, {unknown, sizeof unknown},
             {no_body, sizeof no_body}};
  for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
    ASSERT(iowire_unpack(&mal, odd[i].n, odd[i].b) == NULL);
    Kvcache__V1__Request *u = kvcache__v1__request__unpack(NULL, odd[i].n, odd[i].b);
    ASSERT(u != NULL); /* protobuf-c reads each */
    kvcache__v1__request__free_unpacked(u, NULL);
  }
}

/* An allocator that fails after a number of allocations. */
static int allocs_left;
static void *fail_alloc(void *d, size_t n) {
  (void)d;
  return allocs_left-- > 0 ? malloc(n) : NULL;
}

TEST(iowire_unpacks_a_mutated_frame_only_as_protobuf_c_does) {
  static gen_t g;
  static uint8_t out[1 << 16], mut[(1 << 16) + 16];
  unsigned took = 0, left = 0;
  for (int it = 0; it < 200000; it++) {
    gen(&g);
    size_t n = iowire_pack(&g.req, out), m = n;
    memcpy(mut, out, n);
    for (unsigned k = 0, nk = 1 + (unsigned)(rnd() % 3); k < nk; k++) {
      switch (rnd() % 5) {
      case 0: if (m) mut[rnd() % m] ^= (uint8_t)(1u << (rnd() % 8)); break;
      case 1: if (m) mut[rnd() % m] = (uint8_t)rnd(); break;
      case 2: if (m) m = rnd() % m; break; /* cut short */
      case 3: if (m < sizeof mut - 4) for (int q = 0; q < 3; q++) mut[m++] = (uint8_t)rnd(); break;
      default: if (m > 2) { size_t at = rnd() % m; memmove(mut + at, mut + at + 1, m - at - 1); m--; }
      }
    }
    Kvcache__V1__Request *h = iowire_unpack(&mal, m, mut);
    Kvcache__V1__Request *p = kvcache__v1__request__unpack(NULL, m, mut);
    if (h) {
      ASSERT(p != NULL);
      size_t hn, pn;
      uint8_t *hb = pb_pack(&h->base, &hn), *pbytes = pb_pack(&p->base, &pn);
      ASSERT_EQ(hn, pn);
      ASSERT(memcmp(hb, pbytes, hn) == 0);
      free(hb);
      free(pbytes);
      kvcache__v1__request__free_unpacked(h, NULL);
      took++;
    } else {
      left++;
    }
    if (p) kvcache__v1__request__free_unpacked(p, NULL);
  }
  ASSERT(took > 1000 && left > 1000); /* both ways, often */
  /* An allocator that fails part way: NULL, and nothing allocated is left
   * (ASan's leak check), until it has enough. */
  gen(&g);
  g.io.n_entries = 3;
  for (int i = 0; i < 3; i++) g.ep[i] = &g.e[i];
  size_t n = iowire_pack(&g.req, out);
  ProtobufCAllocator fa = {fail_alloc, m_free, NULL};
  int enough = -1;
  for (int k = 0; k < 16; k++) {
    allocs_left = k;
    Kvcache__V1__Request *u = iowire_unpack(&fa, n, out);
    if (u && enough < 0) enough = k;
    ASSERT((u != NULL) == (enough >= 0)); /* fails below enough, succeeds from it */
    if (u) kvcache__v1__request__free_unpacked(u, &fa);
  }
  ASSERT(enough >= 5); /* the request, its Io, three entries and their array at least */
}
