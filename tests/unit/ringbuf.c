/* ringbuf.c: the byte ring both sides link (proto/ringbuf.c): records of
 * every length around the end of the ring, markers, and every impossible
 * counter or length the other side could publish; and the fast slots'
 * structs (proto/ringfast.c): every field where doc/protocol.md puts it,
 * every malformed request refused, replies cut to their bounds. */
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "ringbuf.h"
#include "ringfast.h"
#include "test.h"

#define SIZE 4096u

TEST(ringbuf_sizes_are_powers_of_two_within_bounds) {
  ASSERT_EQ(ringbuf_pow2(0), 1);
  ASSERT_EQ(ringbuf_pow2(4096), 4096);
  ASSERT_EQ(ringbuf_pow2(4097), 8192);
  ASSERT_EQ(ringbuf_pow2(2 * (65536 + 4)), 262144);
  ASSERT(ringbuf_sizes_ok(4096, 65536));
  ASSERT(!ringbuf_sizes_ok(0, 4096));
  ASSERT(!ringbuf_sizes_ok(4096, 2048));         /* too small */
  ASSERT(!ringbuf_sizes_ok(4096, 12288));        /* not a power of two */
  ASSERT(!ringbuf_sizes_ok(128u << 20, 4096));   /* too large */
  ASSERT_U64_EQ(ringbuf_area_bytes(4096, 8192), RING_HDR_BYTES + 12288);
  ring_hdr_t h;
  ringbuf_hdr_init(&h, 8192, 4096);
  ASSERT_EQ(h.magic, RING_MAGIC);
  ASSERT_EQ(h.sq_bytes, 8192);
  ASSERT_EQ(atomic_load(&h.sq_wakeup), 1); /* nobody polls a fresh ring */
  ASSERT_U64_EQ(atomic_load(&h.sq_tail), 0);
}

/* A producer and a consumer over one ring: records of lengths 0..999 in
 * turn, each read back whole, crossing the end of the ring hundreds of
 * times at every offset a header or a payload can be split at. */
TEST(ringbuf_records_wrap_around_the_end) {
  uint8_t *data = malloc(SIZE), *in = malloc(1000), *out = malloc(1000);
  ring_view_t prod = {data, SIZE, 0}, cons = {data, SIZE, 0};
  uint64_t wraps = 0;
  for (uint32_t i = 0; i < 20000; i++) {
    uint32_t len = (i * 37u) % 1000u;
    for (uint32_t k = 0; k < len; k++) in[k] = (uint8_t)(i + k * 7u);
    ASSERT(ringbuf_room(&prod, cons.pos) >= (int64_t)(FRAME_HEADER_BYTES + len));
    uint64_t before = prod.pos;
    ringbuf_put(&prod, in, len);
    wraps += before / SIZE != (prod.pos - 1) / SIZE;
    uint32_t got = 0;
    ASSERT_EQ(ringbuf_peek(&cons, prod.pos, 1000, false, &got), RING_OK);
    ASSERT_EQ(got, len);
    ringbuf_take(&cons, got, out);
    ASSERT_MEM_EQ(out, in, len);
    ASSERT_U64_EQ(cons.pos, prod.pos);
    ASSERT_EQ(ringbuf_peek(&cons, prod.pos, 1000, false, &got), RING_EMPTY);
  }
  ASSERT(wraps > 1000);
  free(data), free(in), free(out);
}

/* Several records in flight, the ring filled to the last byte. */
TEST(ringbuf_fills_exactly_then_refuses_room) {
  uint8_t *data = malloc(SIZE), buf[SIZE];
  ring_view_t prod = {data, SIZE, 3000}, cons = {data, SIZE, 3000}; /* start near the end */
  memset(buf, 0x5a, sizeof buf);
  for (int i = 0; i < 4; i++) ringbuf_put(&prod, buf, 1020); /* 4 x 1024 */
  ASSERT_EQ(ringbuf_room(&prod, cons.pos), 0);
  uint32_t got;
  for (int i = 0; i < 4; i++) {
    ASSERT_EQ(ringbuf_peek(&cons, prod.pos, SIZE, false, &got), RING_OK);
    ASSERT_EQ(got, 1020);
    ringbuf_skip(&cons, got);
    ASSERT_EQ(ringbuf_room(&prod, cons.pos), 1024 * (i + 1));
  }
  free(data);
}

/* A marker holds a reply's place: only where markers may be (the CQ). */
TEST(ringbuf_marker_only_where_allowed) {
  uint8_t *data = calloc(1, SIZE);
  ring_view_t prod = {data, SIZE, SIZE - 2}, cons = prod; /* its header wraps */
  ringbuf_put(&prod, NULL, 0);
  ASSERT_U64_EQ(prod.pos, SIZE + 2);
  uint32_t got = 0;
  ASSERT_EQ(ringbuf_peek(&cons, prod.pos, 1000, false, &got), RING_BAD);
  ASSERT_EQ(ringbuf_peek(&cons, prod.pos, 1000, true, &got), RING_OK);
  ASSERT_EQ(got, RING_ON_SOCKET);
  ringbuf_skip(&cons, got);
  ASSERT_U64_EQ(cons.pos, prod.pos);
  free(data);
}

/* What a broken or hostile peer can publish, and what it gets: RING_BAD,
 * never a read past the ring or the frame. */
TEST(ringbuf_impossible_counters_and_lengths_are_bad) {
  uint8_t *data = calloc(1, SIZE), h[4];
  ring_view_t cons = {data, SIZE, 100};
  uint32_t got;
  ASSERT_EQ(ringbuf_peek(&cons, 100, 1000, false, &got), RING_EMPTY);
  ASSERT_EQ(ringbuf_peek(&cons, 99, 1000, false, &got), RING_BAD);            /* behind */
  ASSERT_EQ(ringbuf_peek(&cons, 100 + SIZE + 1, 1000, false, &got), RING_BAD); /* past a ring */
  ASSERT_EQ(ringbuf_peek(&cons, 102, 1000, false, &got), RING_BAD);           /* half a header */
  frame_put_header(h, 2000);
  memcpy(data + 100, h, 4);
  ASSERT_EQ(ringbuf_peek(&cons, 100 + 4 + 2000, 1000, false, &got), RING_BAD); /* over max */
  ASSERT_EQ(ringbuf_peek(&cons, 100 + 4 + 10, 4000, false, &got), RING_BAD);  /* not all there */
  ASSERT_EQ(ringbuf_peek(&cons, 100 + 4 + 2000, 4000, false, &got), RING_OK);
  frame_put_header(h, SIZE);
  memcpy(data + 100, h, 4); /* longer than the ring itself */
  ASSERT_EQ(ringbuf_peek(&cons, 100 + SIZE, SIZE * 2, false, &got), RING_BAD);
  ring_view_t prod = {data, SIZE, 5000};
  ASSERT(ringbuf_room(&prod, 5000 - SIZE) == 0);
  ASSERT(ringbuf_room(&prod, 5000 - SIZE - 1) < 0); /* head more than a ring behind */
  ASSERT(ringbuf_room(&prod, 5001) < 0);            /* head ahead of the tail */
  free(data);
}

/* ---- the fast slots ---------------------------------------------------------- */

static bool req_same(const ringfast_req_t *a, const ringfast_req_t *b) {
  return a->kind == b->kind && a->dtype == b->dtype && a->cache_id == b->cache_id &&
         a->layer_begin == b->layer_begin && a->layer_end == b->layer_end &&
         a->head_begin == b->head_begin && a->head_end == b->head_end &&
         a->ntokens == b->ntokens && a->seq_id == b->seq_id && a->pos == b->pos &&
         a->k_off == b->k_off && a->v_off == b->v_off && a->release == b->release;
}

static uint64_t le_at(const uint8_t *slot, size_t off, size_t n) {
  uint64_t v = 0;
  for (size_t i = n; i-- > 0;) v = v << 8 | slot[off + i];
  return v;
}

/* Each field at its offset of the slot, little-endian, and back. */
TEST(ringfast_request_fields_where_the_protocol_says) {
  ring_hdr_t h;
  ringbuf_hdr_init(&h, 4096, 4096);
  ASSERT_EQ(h.fast, RING_FAST_VERSION);
  ASSERT_EQ(atomic_load(&h.fast_req.seq), 0);
  ASSERT_EQ(atomic_load(&h.fast_rep.seq), 0);
  const uint8_t *hb = (const uint8_t *)&h;
  ASSERT_U64_EQ(le_at(hb, 16, 4), RING_FAST_VERSION);
  ringfast_req_t q = {.kind = RINGFAST_GET, .dtype = 4, .cache_id = 0x01020304,
                      .layer_begin = 0x0506, .layer_end = 0x0708, .head_begin = 0x090a,
                      .head_end = 0x0b0c, .ntokens = 0x0d0e0f10, .seq_id = 0x1112131415161718ull,
                      .pos = 0x2122232425262728ull, .k_off = 0x3132333435363738ull,
                      .v_off = 0x4142434445464748ull, .release = 0x5152535455565758ull};
  uint8_t slot[64] = {0};
  ringfast_req_encode(&q, slot + 4);
  ASSERT_U64_EQ(le_at(slot, 4, 1), RINGFAST_GET);
  ASSERT_U64_EQ(le_at(slot, 5, 1), 4);
  ASSERT_U64_EQ(le_at(slot, 6, 2), 0);
  ASSERT_U64_EQ(le_at(slot, 8, 4), 0x01020304);
  ASSERT_U64_EQ(le_at(slot, 12, 2), 0x0506);
  ASSERT_U64_EQ(le_at(slot, 14, 2), 0x0708);
  ASSERT_U64_EQ(le_at(slot, 16, 2), 0x090a);
  ASSERT_U64_EQ(le_at(slot, 18, 2), 0x0b0c);
  ASSERT_U64_EQ(le_at(slot, 20, 4), 0x0d0e0f10);
  ASSERT_U64_EQ(le_at(slot, 24, 8), 0x1112131415161718ull);
  ASSERT_U64_EQ(le_at(slot, 32, 8), 0x2122232425262728ull);
  ASSERT_U64_EQ(le_at(slot, 40, 8), 0x3132333435363738ull);
  ASSERT_U64_EQ(le_at(slot, 48, 8), 0x4142434445464748ull);
  ASSERT_U64_EQ(le_at(slot, 56, 8), 0x5152535455565758ull);
  ringfast_req_t back;
  const char *why = NULL;
  ASSERT_EQ(ringfast_req_decode(slot + 4, &back, &why), 0);
  ASSERT(req_same(&back, &q));
}

/* Unknown kinds, flags, and a lease with a transfer's field: malformed. */
TEST(ringfast_malformed_requests_refused) {
  uint8_t body[RING_FAST_BODY];
  ringfast_req_t q, back;
  const char *why;
  static const uint8_t kinds[] = {0, 4, 5, 255};
  for (size_t i = 0; i < sizeof kinds; i++) {
    q = (ringfast_req_t){.kind = kinds[i], .seq_id = 1};
    ringfast_req_encode(&q, body);
    why = NULL;
    ASSERT_EQ(ringfast_req_decode(body, &back, &why), -1);
    ASSERT_STR_EQ(why, "fast request of an unknown kind");
  }
  q = (ringfast_req_t){.kind = RINGFAST_PUT};
  ringfast_req_encode(&q, body);
  body[3] = 0x80; /* flags' high byte */
  ASSERT_EQ(ringfast_req_decode(body, &back, &why), -1);
  ASSERT_STR_EQ(why, "fast request with flags set");
  ringfast_req_t leases[] = {{.dtype = 1}, {.layer_begin = 1}, {.layer_end = 1}, {.head_begin = 1},
                             {.head_end = 1}, {.k_off = 1}, {.v_off = 1}};
  for (size_t i = 0; i < sizeof leases / sizeof leases[0]; i++) {
    leases[i].kind = RINGFAST_LEASE;
    ringfast_req_encode(&leases[i], body);
    ASSERT_EQ(ringfast_req_decode(body, &back, &why), -1);
  }
  q = (ringfast_req_t){.kind = RINGFAST_LEASE, .seq_id = 3, .pos = 9, .ntokens = 2, .release = 7};
  ringfast_req_encode(&q, body);
  ASSERT_EQ(ringfast_req_decode(body, &back, &why), 0);
  ASSERT(req_same(&back, &q));
}

/* A lease's pages past the first line, an error's message cut to its bound;
 * a reply claiming more pages or a longer message than fit is refused. */
TEST(ringfast_replies_round_trip_within_their_bounds) {
  ring_fast_rep_t slot;
  memset(&slot, 0xee, sizeof slot);
  ringfast_rep_t p, back;
  memset(&p, 0, sizeof p);
  p.npages = RINGFAST_LEASE_PAGES;
  p.lease_id = 77;
  p.first_pos = 32;
  p.pool_gen = 5;
  for (uint32_t i = 0; i < p.npages; i++) p.page_off[i] = (uint64_t)(i + 1) << 21;
  ringfast_rep_encode(&p, slot.body, slot.more);
  ASSERT_EQ(ringfast_rep_decode(slot.body, slot.more, &back), 0);
  ASSERT_EQ(back.status, 0);
  ASSERT_EQ(back.npages, RINGFAST_LEASE_PAGES);
  ASSERT_U64_EQ(back.lease_id, 77);
  ASSERT_U64_EQ(back.first_pos, 32);
  ASSERT_U64_EQ(back.pool_gen, 5);
  ASSERT_MEM_EQ(back.page_off, p.page_off, sizeof p.page_off);
  ASSERT_STR_EQ(back.err, "");
  const uint8_t *s8 = (const uint8_t *)&slot;
  ASSERT_U64_EQ(le_at(s8, 16, 8), 77);
  ASSERT_U64_EQ(le_at(s8, 40, 8), 1ull << 21);
  ASSERT_U64_EQ(le_at(s8, 80, 8), 4ull << 21); /* page_off[3], in the more lines */
  /* An error: the message cut to RINGFAST_ERR_MAX bytes, FULL's figures. */
  char msg[400];
  memset(msg, 'x', sizeof msg - 1);
  msg[sizeof msg - 1] = '\0';
  memset(&p, 0, sizeof p);
  p.status = 3;
  ringfast_rep_error(&p, msg, 12, 4);
  ASSERT_EQ(p.err_len, RINGFAST_ERR_MAX);
  ringfast_rep_encode(&p, slot.body, slot.more);
  ASSERT_EQ(ringfast_rep_decode(slot.body, slot.more, &back), 0);
  ASSERT_EQ(back.status, 3);
  ASSERT_EQ(back.err_len, RINGFAST_ERR_MAX);
  ASSERT_EQ(strlen(back.err), RINGFAST_ERR_MAX);
  ASSERT_U64_EQ(back.full_needed, 12);
  ASSERT_U64_EQ(back.full_freeable, 4);
  ASSERT_EQ(s8[128], 'x');
  /* Impossible counts: refused. */
  slot.body[4] = (uint8_t)(RINGFAST_LEASE_PAGES + 1); /* npages, at offset 8 */
  ASSERT_EQ(ringfast_rep_decode(slot.body, slot.more, &back), -1);
  slot.body[4] = 0;
  slot.body[8] = 0;
  slot.body[9] = 1; /* err_len 256, at offset 12 */
  ASSERT_EQ(ringfast_rep_decode(slot.body, slot.more, &back), -1);
}
