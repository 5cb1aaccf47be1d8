/* ringbuf.c: the byte ring both sides link (proto/ringbuf.c): records of
 * every length around the end of the ring, markers, and every impossible
 * counter or length the other side could publish. */
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "ringbuf.h"
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
