/* ringbuf.c: records in a shared byte ring, wrapping around its end. */
#include "ringbuf.h"

#include <string.h>

#include "frame.h"

uint32_t ringbuf_pow2(uint32_t n) {
  uint32_t p = 1;
  while (p < n && p < (1u << 31)) p <<= 1;
  return p;
}

static bool pow2_in(uint32_t n) {
  return n >= 4096u && n <= (64u << 20) && (n & (n - 1)) == 0;
}

bool ringbuf_sizes_ok(uint32_t sq_bytes, uint32_t cq_bytes) {
  return pow2_in(sq_bytes) && pow2_in(cq_bytes);
}

void ringbuf_hdr_init(ring_hdr_t *h, uint32_t sq_bytes, uint32_t cq_bytes) {
  memset(h, 0, sizeof *h);
  h->magic = RING_MAGIC;
  h->version = RING_VERSION;
  h->sq_bytes = sq_bytes;
  h->cq_bytes = cq_bytes;
  h->fast = RING_FAST_VERSION;
  atomic_store(&h->sq_wakeup, 1);
}

/* Copies n bytes from the ring at byte position pos (mod size). */
static void copy_out(const ring_view_t *v, uint64_t pos, void *dst, size_t n) {
  uint32_t at = (uint32_t)(pos & (v->size - 1));
  size_t first = v->size - at < n ? v->size - at : n;
  memcpy(dst, v->data + at, first);
  if (n > first) memcpy((uint8_t *)dst + first, v->data, n - first);
}

static void copy_in(ring_view_t *v, uint64_t pos, const void *src, size_t n) {
  uint32_t at = (uint32_t)(pos & (v->size - 1));
  size_t first = v->size - at < n ? v->size - at : n;
  memcpy(v->data + at, src, first);
  if (n > first) memcpy(v->data, (const uint8_t *)src + first, n - first);
}

int ringbuf_peek(const ring_view_t *v, uint64_t tail, uint32_t max_payload, bool on_socket_ok,
              uint32_t *len) {
  uint64_t avail = tail - v->pos;
  if (avail > v->size) return RING_BAD; /* behind pos, or more than the ring holds */
  if (avail < FRAME_HEADER_BYTES) return avail ? RING_BAD : RING_EMPTY;
  uint8_t h[FRAME_HEADER_BYTES];
  copy_out(v, v->pos, h, sizeof h);
  uint32_t n = 0;
  (void)frame_parse(h, sizeof h, UINT32_MAX, &n);
  if (n == RING_ON_SOCKET) {
    if (!on_socket_ok) return RING_BAD;
    *len = n;
    return RING_OK;
  }
  /* A record is published whole: a published part of one is a lie too. */
  if (n > max_payload || n > avail - FRAME_HEADER_BYTES) return RING_BAD;
  *len = n;
  return RING_OK;
}

void ringbuf_take(ring_view_t *v, uint32_t len, void *out) {
  copy_out(v, v->pos + FRAME_HEADER_BYTES, out, len);
  ringbuf_skip(v, len);
}

void ringbuf_skip(ring_view_t *v, uint32_t len) {
  v->pos += FRAME_HEADER_BYTES + (len == RING_ON_SOCKET ? 0 : len);
}

int64_t ringbuf_room(const ring_view_t *v, uint64_t head) {
  uint64_t used = v->pos - head;
  if (used > v->size) return -1;
  return (int64_t)(v->size - used);
}

void ringbuf_put(ring_view_t *v, const void *payload, uint32_t len) {
  uint8_t h[FRAME_HEADER_BYTES];
  frame_put_header(h, payload ? len : RING_ON_SOCKET);
  copy_in(v, v->pos, h, sizeof h);
  if (payload) copy_in(v, v->pos + FRAME_HEADER_BYTES, payload, len);
  v->pos += FRAME_HEADER_BYTES + (payload ? len : 0);
}
