/* fuzz_handler.c: the whole request path, several connections at once.
 *
 * The input is a list of records, each [ctl][len lo][len hi][len bytes]:
 *   conn = ctl & 3 (four simulated connections)
 *   op = ctl >> 2 & 7:
 *     0..1  a frame: the bytes get a correct header and are fed in
 *     2     a fast request (proto/ringfast.h): the bytes are the slot's body
 *           (zero-padded or cut to its 60 bytes), run as conn.c runs one
 *     3     raw bytes fed to the stream (partial frames, bad headers)
 *     4     the connection disconnects; a fresh one takes its place
 *     5     the next frame's k-th engine allocation fails (k = first byte)
 *     6     a Hello frame (so mutated inputs keep reaching the handlers)
 *     7     bytes written into the connection's shared buffer (what a client
 *           writes there: tensor data, token ids): the first 3 bytes are the
 *           offset (little-endian), the rest is copied, clipped to the buffer
 * After every frame the engine audit must pass (fake_conn.c); after a
 * disconnect the connection's buffer is gone and, at the end, once every
 * connection closed, no page is pinned, no buffer or descriptor is left.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_daemon.h"
#include "fuzz_seed.h"

#define NCONN 4

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "handler invariant failed: %s\n", #cond);                \
      abort();                                                                 \
    }                                                                          \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static server_t srv;
  static uint8_t buf[FZ_MAX_FRAME];
  fz_server_init(&srv, 24, 4096);
  conn_t *conns[NCONN];
  for (int i = 0; i < NCONN; i++) conns[i] = fz_conn_open(&srv);
  int64_t fail_next = -1;
  size_t off = 0;
  while (size - off >= 3) {
    uint8_t ctl = data[off];
    size_t len = (size_t)data[off + 1] | (size_t)data[off + 2] << 8;
    off += 3;
    if (len > size - off) len = size - off;
    const uint8_t *p = data + off;
    off += len;
    conn_t **c = &conns[ctl & 3];
    switch (ctl >> 2 & 7) {
    case 3:
      fz_conn_feed(*c, p, len);
      break;
    case 4:
      fz_conn_free(*c);
      fz_audit(&srv, "a disconnect");
      *c = fz_conn_open(&srv);
      break;
    case 5:
      fail_next = len ? p[0] : 0;
      break;
    case 6:
      fz_conn_frame(*c, buf, seed_hello(buf, len));
      break;
    case 2:
      if (fail_next >= 0) engine_fail_alloc_after(srv.eng, fail_next);
      fz_conn_fast(*c, p, len);
      engine_fail_alloc_after(srv.eng, -1);
      fail_next = -1;
      break;
    case 7:
      if ((*c)->shm.base && len >= 3) {
        size_t at = (size_t)p[0] | (size_t)p[1] << 8 | (size_t)p[2] << 16;
        size_t n = len - 3;
        if (at < (*c)->shm.bytes) {
          if (n > (*c)->shm.bytes - at) n = (*c)->shm.bytes - at;
          memcpy((*c)->shm.base + at, p + 3, n);
        }
      }
      break;
    default:
      if (fail_next >= 0) engine_fail_alloc_after(srv.eng, fail_next);
      fz_conn_frame(*c, p, len);
      engine_fail_alloc_after(srv.eng, -1);
      fail_next = -1;
      break;
    }
  }
  for (int i = 0; i < NCONN; i++) fz_conn_free(conns[i]);
  fz_audit(&srv, "closing every connection");
  engine_stats_t s;
  engine_stats(srv.eng, &s);
  CHECK(s.pages_pinned == 0 && s.sequences_pinned == 0);
  CHECK(s.pages_used + s.pages_free == s.pool_pages);
  fz_server_deinit(&srv);
  CHECK(fz_count_memfds() == 0);
  return 0;
}
