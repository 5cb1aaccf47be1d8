/* events_wire.h: one batch of prefix-index events as vLLM's KV events
 * payload (msgpack; doc/events.md, "The wire").
 *
 *   batch  = [ts, [event, ...], data_parallel_rank]            always an array
 *   array form (events_format = array):
 *     ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
 *      lora_id, medium, lora_name]
 *     ["BlockRemoved", block_hashes, medium]
 *     ["AllBlocksCleared"]
 *   map form (events_format = map): the same fields by name, the tag under
 *     "type": {"type": "BlockStored", "block_hashes": ..., ...}
 *
 * That is how msgspec encodes vLLM's KVEventBatch (array_like=True) and its
 * tagged events (tag=True; array_like=True before vLLM's switch to maps). A
 * run of stored pages of one chain in one cache is one BlockStored, as vLLM
 * stores a request's new blocks; a run of removed pages of one cache is one
 * BlockRemoved. Pure: no I/O, no state.
 */
#ifndef KVCD_EVENTS_WIRE_H
#define KVCD_EVENTS_WIRE_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"

/* One event of a batch. */
typedef struct wire_ev {
  const engine_event_t *ev; /* STORED or REMOVED; NULL: AllBlocksCleared */
  const uint8_t *hash;      /* the block hash published for it */
  const uint8_t *parent;    /* STORED: its parent's published hash, NULL: none */
} wire_ev_t;

typedef struct wire_opts {
  bool map;                 /* tagged maps instead of tagged arrays */
  bool token_ids;           /* stored events carry the pages' ids (else []) */
  bool hash_int;            /* hashes as 64-bit ints: the last 8 bytes, big-endian */
  size_t hash_len;          /* bytes of a hash as bytes: 32, or 16 (xxHash3) */
  int64_t dp_rank;          /* data_parallel_rank of the batch */
} wire_opts_t;

/* The medium name of an engine medium ("CPU": the memory pool). */
const char *wire_medium(uint32_t medium);

/* Packs the batch of the n events at ts (seconds since the epoch) into sb,
 * which it empties first. Returns the number of events packed (runs
 * coalesced), or -1 out of memory. */
long wire_batch(msgpack_sbuffer *sb, double ts, const wire_ev_t *evs, size_t n,
                const wire_opts_t *o);

#endif
