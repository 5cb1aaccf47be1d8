/* iowire.h: the hot frames, a Request whose body is a put or get (Io) of
 * entries without span keys, packed and unpacked by hand.
 *
 * They are ordinary protobuf frames (kvcache.proto), byte for byte what
 * protobuf-c packs; only the code differs. protobuf-c's generic packer
 * walks every field descriptor of every entry twice (size, then bytes), and
 * its unpacker looks each field up: for the decode step's 64 entries, 10 us
 * to pack on the client and 8.6 us to unpack on the daemon, a tenth of the
 * request's time besides its copy (doc/protocol.md, "Frames packed by
 * hand"). Here: 2.8 us to pack, 3.1 us to unpack.
 *
 *   client: iowire_pack(req) -> the bytes protobuf-c would pack, or 0 for
 *           a request it does not cover (the caller packs it as before)
 *   daemon: iowire_unpack(bytes) -> the Request protobuf-c would unpack,
 *           or NULL for a frame not in the canonical form (fields in field
 *           order, each once, no unknown field, no span keys, no value out
 *           of its field's range): the caller unpacks it as before
 *
 * So the daemon's answer to a frame never depends on which decoder read
 * it: a frame iowire_unpack takes decodes to the same message through
 * protobuf-c (tests/unit/iowire.c checks both ways, and the msg fuzzer on
 * every input). Pure functions over bytes; the unpacker allocates through
 * the caller's allocator only.
 */
#ifndef KVC_PROTO_IOWIRE_H
#define KVC_PROTO_IOWIRE_H

#include <stddef.h>
#include <stdint.h>

#include "kvcache.pb-c.h"

/* The packed size of req, a put or get without span keys; 0 for any other
 * request (which iowire_pack does not cover). */
size_t iowire_packed_size(const Kvcache__V1__Request *req);
/* Packs req (iowire_packed_size(req) > 0) into out, which holds that many
 * bytes; returns that size. */
size_t iowire_pack(const Kvcache__V1__Request *req, uint8_t *out);

/* The Request of a canonical put or get frame, allocated through a (every
 * part, as protobuf-c allocates them, so protobuf_c_message_free_unpacked
 * frees it); NULL for any other frame, or when a fails (the caller then
 * unpacks it as before, from a fresh budget). */
Kvcache__V1__Request *iowire_unpack(ProtobufCAllocator *a, size_t len, const uint8_t *data);

#endif
