/* ringfast.h: the fast frame, the hot requests as fixed little-endian structs
 * in the rings' fast slots (proto/ringbuf.h; doc/protocol.md, "The fast
 * slots"): a put or get of one entry, or a lease, of one small run, and the
 * reply to it. The daemon turns a request into the same Request a frame
 * decodes to and runs it through the same dispatch; only the encoding and
 * the slot differ.
 *
 *   request line (client), after seq:         reply line (daemon), after seq:
 *    4 kind u8     5 dtype u8   6 flags u16     4 status u32   8 npages u32
 *    8 cache_id u32                            12 err_len u32
 *   12 layer_begin u16  14 layer_end u16       16 lease_id u64
 *   16 head_begin u16   18 head_end u16        24 first_pos u64
 *   20 ntokens u32                             32 pool_gen u64
 *   24 seq_id u64                              40 page_off[0..3) u64
 *   32 pos u64                               more (written only when needed):
 *   40 k_off u64                               64 full_needed u64  72 full_freeable u64
 *   48 v_off u64                               80 page_off[3..8) u64
 *   56 release u64                            128 err: err_len bytes (< 256)
 *
 * (offsets from the slot's start; seq is at 0.) A lease names [pos, pos +
 * ntokens) and uses neither dtype, layers, heads nor offsets.
 *
 * Pure functions over bytes: no I/O, no allocation (fuzzed with the
 * handlers: tests/fuzz/fuzz_fast.c).
 */
#ifndef KVC_PROTO_RINGFAST_H
#define KVC_PROTO_RINGFAST_H

#include <stdbool.h>
#include <stdint.h>

#include "ringbuf.h"

enum ringfast_kind {
  RINGFAST_PUT = 1,   /* Io put of one entry, its K and V lengths the transfer's own */
  RINGFAST_GET = 2,   /* Io get of one entry, likewise */
  RINGFAST_LEASE = 3, /* Lease of [pos, pos + ntokens) */
};

#define RINGFAST_LEASE_PAGES 8u  /* pages a fast lease's reply holds */
#define RINGFAST_LINE_PAGES 3u   /* of them, in the reply's first line */
#define RINGFAST_ERR_MAX 255u    /* bytes of a reply's message */

typedef struct ringfast_req {
  uint8_t kind;            /* enum ringfast_kind */
  uint8_t dtype;           /* Xfer.dtype (kvc_dtype_t); 0: the cache's own */
  uint32_t cache_id;
  uint16_t layer_begin, layer_end; /* Xfer's: layer_end 0 is to the last layer */
  uint16_t head_begin, head_end;   /* Xfer's: head_end 0 is to the last head */
  uint32_t ntokens;        /* tokens of the entry; a lease: end - begin */
  uint64_t seq_id;
  uint64_t pos;            /* the entry's first position; a lease: begin */
  uint64_t k_off, v_off;   /* the entry's regions of the shared buffer */
  uint64_t release;        /* a lease to release before it runs (0: none) */
} ringfast_req_t;

typedef struct ringfast_rep {
  uint32_t status;         /* the wire Status (0: OK) */
  uint32_t npages;         /* a lease's pages (at most RINGFAST_LEASE_PAGES) */
  uint64_t lease_id, first_pos, pool_gen;
  uint64_t page_off[RINGFAST_LEASE_PAGES];
  uint64_t full_needed, full_freeable; /* FULL's figures */
  uint32_t err_len;        /* bytes of err (at most RINGFAST_ERR_MAX) */
  char err[RINGFAST_ERR_MAX + 1]; /* NUL-terminated once decoded */
} ringfast_rep_t;

/* Writes q into a request slot's body. */
void ringfast_req_encode(const ringfast_req_t *q, uint8_t body[RING_FAST_BODY]);
/* Reads a request slot's body (a copy the writer can no longer change):
 * 0, or -1 with why (a static string) when it is malformed: an unknown
 * kind, flags set, or a field its kind does not use not 0. Ranges are the
 * handlers' to judge. */
int ringfast_req_decode(const uint8_t body[RING_FAST_BODY], ringfast_req_t *q,
                        const char **why);

/* Sets an error reply's message (cut to RINGFAST_ERR_MAX bytes) and FULL's
 * figures. */
void ringfast_rep_error(ringfast_rep_t *p, const char *msg, uint64_t full_needed,
                        uint64_t full_freeable);
/* Writes p into a reply slot: body always, more only when p needs it (a
 * status other than OK, or more than RINGFAST_LINE_PAGES pages). p's npages
 * and err_len must be within their bounds. */
void ringfast_rep_encode(const ringfast_rep_t *p, uint8_t body[RING_FAST_BODY],
                         uint8_t more[RING_FAST_MORE]);
/* Reads a reply slot (more only when body says it was written): 0, or -1
 * when npages or err_len exceeds its bound. */
int ringfast_rep_decode(const uint8_t body[RING_FAST_BODY], const uint8_t more[RING_FAST_MORE],
                        ringfast_rep_t *p);

#endif
