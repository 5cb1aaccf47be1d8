/* fuzz_frame.c: the frame codec against a reference reading of the format.
 *
 * Input: 4 bytes of max_payload (bounded to 1 MiB), then a byte stream.
 * The stream is cut into frames the way conn.c does; every verdict of
 * frame_parse must match the definition, and a header written by
 * frame_put_header must parse back to its length.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "frame invariant failed: %s\n", #cond);                  \
      abort();                                                                 \
    }                                                                          \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 4) return 0;
  uint32_t max = ((uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 |
                  (uint32_t)data[3] << 24) & ((1u << 20) - 1);
  const uint8_t *p = data + 4;
  size_t len = size - 4, off = 0;
  for (;;) {
    uint32_t plen = 0xdeadbeef;
    size_t rest = len - off;
    int st = frame_parse(p + off, rest, max, &plen);
    if (rest < FRAME_HEADER_BYTES) {
      CHECK(st == FRAME_NEED_MORE);
      CHECK(plen == 0xdeadbeef); /* nothing read past the bytes given */
      break;
    }
    const uint8_t *h = p + off;
    uint32_t n = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 |
                 (uint32_t)h[3] << 24;
    CHECK(plen == n);
    uint8_t hdr[FRAME_HEADER_BYTES];
    frame_put_header(hdr, n);
    CHECK(memcmp(hdr, h, FRAME_HEADER_BYTES) == 0);
    if (n > max) {
      CHECK(st == FRAME_TOO_BIG);
      break;
    }
    if ((uint64_t)n + FRAME_HEADER_BYTES > rest) {
      CHECK(st == FRAME_NEED_MORE);
      break;
    }
    CHECK(st == FRAME_OK);
    off += FRAME_HEADER_BYTES + n;
    CHECK(off <= len);
  }
  return 0;
}
