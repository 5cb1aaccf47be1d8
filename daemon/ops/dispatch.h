/* dispatch.h: decoding one request frame and running its handler.
 *
 * One table, indexed by the Request oneof case, maps each request to its
 * handler and its stats slot (built from DAEMON_OPS in optable.h). A handler
 * validates the whole request (ids, ranges, every entry's offsets and
 * lengths against the shared buffer) before it calls the engine, so a bad
 * request changes nothing. Engine and validation errors become a Response
 * status (value = -KVC_E_code) with a one-line message; the connection stays
 * usable. A frame that does not decode within max_decode_bytes of heap closes
 * the connection.
 */
#ifndef KVCD_DISPATCH_H
#define KVCD_DISPATCH_H

#include <stddef.h>
#include <stdint.h>

#include "conn.h"

/* Decodes and runs the request in payload (borrowed) and queues its reply.
 * Returns false when c parked (the frame runs again, whole, later). */
bool dispatch_frame(conn_t *c, const uint8_t *payload, size_t len);

/* Runs the fast request whose slot body (RING_FAST_BODY bytes, a copy) is
 * body, numbered seq, as the Request it stands for: the same handlers,
 * validation and figures (lengths of K and V are the transfer's own). A
 * malformed one (ringfast_req_decode) closes the connection. t0_ns: when it
 * was seen (uv_hrtime), the start of its request_duration_seconds. Returns
 * false when c parked. */
bool dispatch_fast(conn_t *c, const uint8_t *body, uint32_t seq, uint64_t t0_ns);

/* The wire status of a KVC_E_* code (0 is OK; unknown codes are INTERNAL):
 * wirestatus.c. */
Kvcache__V1__Status dispatch_status(int code);

#endif
