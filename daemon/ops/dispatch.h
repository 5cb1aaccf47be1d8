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

/* Decodes and runs the request in payload (borrowed) and queues its reply. */
bool dispatch_frame(conn_t *c, const uint8_t *payload, size_t len);

/* The wire status of a KVC_E_* code (0 is OK; unknown codes are INTERNAL):
 * wirestatus.c. */
Kvcache__V1__Status dispatch_status(int code);

#endif
