/* frame.c: parse and write the 4-byte length prefix of a frame. */
#include "frame.h"

int frame_parse(const uint8_t *buf, size_t len, uint32_t max_payload,
                uint32_t *payload_len) {
  if (len < FRAME_HEADER_BYTES) return FRAME_NEED_MORE;
  uint32_t n = (uint32_t)buf[0] | (uint32_t)buf[1] << 8 | (uint32_t)buf[2] << 16 |
               (uint32_t)buf[3] << 24;
  *payload_len = n;
  if (n > max_payload) return FRAME_TOO_BIG;
  if (len - FRAME_HEADER_BYTES < n) return FRAME_NEED_MORE;
  return FRAME_OK;
}

void frame_put_header(uint8_t hdr[FRAME_HEADER_BYTES], uint32_t payload_len) {
  hdr[0] = (uint8_t)payload_len;
  hdr[1] = (uint8_t)(payload_len >> 8);
  hdr[2] = (uint8_t)(payload_len >> 16);
  hdr[3] = (uint8_t)(payload_len >> 24);
}
