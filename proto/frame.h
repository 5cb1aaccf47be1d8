/* frame.h: the frame format of the protocol, a 4-byte little-endian length
 * then the payload (one packed Request or Response). The client library and
 * the daemon both frame and unframe with it.
 *
 *   +----+----+----+----+---------------------------+
 *   | length (LE u32)   | payload: length bytes      |
 *   +----+----+----+----+---------------------------+
 *
 * Pure functions over byte arrays: no I/O, no allocation (fuzzed on its own).
 */
#ifndef KVC_PROTO_FRAME_H
#define KVC_PROTO_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define FRAME_HEADER_BYTES 4u

enum frame_status {
  FRAME_NEED_MORE = 0, /* the buffer holds no complete frame yet */
  FRAME_OK = 1,        /* a complete frame starts the buffer */
  FRAME_TOO_BIG = -1,  /* the announced length exceeds max_payload */
};

/* Looks at buf[0..len): sets *payload_len (when the header is complete) and
 * returns FRAME_OK if the whole frame is there. A frame occupies
 * FRAME_HEADER_BYTES + *payload_len bytes. An empty payload is a valid frame
 * (it decodes as an empty message). */
int frame_parse(const uint8_t *buf, size_t len, uint32_t max_payload,
                uint32_t *payload_len);

/* Writes the header for a payload of payload_len bytes. */
void frame_put_header(uint8_t hdr[FRAME_HEADER_BYTES], uint32_t payload_len);

#endif
