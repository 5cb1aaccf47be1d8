/* events_vhash.h: vLLM's block hashes for the pages the ZeroMQ stream
 * publishes (events_hash = vllm; doc/events.md, "Block hashes"): the hash a
 * router computes from a prompt's token ids alone, as vLLM's prefix cache
 * does with sha256_cbor and PYTHONHASHSEED set:
 *
 *   NONE_HASH = sha256(cbor(seed))                       seed: a text string
 *   H(block)  = sha256(cbor([H(parent) or NONE_HASH, [token ids], null]))
 *
 * in canonical CBOR, as cbor2.dumps(..., canonical=True) writes it. A
 * table maps each published page (by kvcached's chain hash) to its vLLM
 * hash, so that a child finds its parent's and a removal says which hash
 * goes; it holds one entry per indexed page of the stream.
 */
#ifndef KVCD_EVENTS_VHASH_H
#define KVCD_EVENTS_VHASH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"

typedef struct vhash vhash_t;

/* A table for chains seeded with seed (NUL-terminated text). NULL out of
 * memory. */
vhash_t *vhash_new(const char *seed);
void vhash_free(vhash_t *v);

/* A stored page: its vLLM hash into out and its parent's into parent
 * (*has_parent false for a chain head). false when its parent is not in the
 * table (stored before a loss) or out of memory: the page is not published. */
bool vhash_stored(vhash_t *v, const engine_event_t *ev, uint8_t out[32], uint8_t parent[32],
                  bool *has_parent);

/* A removed page: its vLLM hash into out, forgotten. false when unknown. */
bool vhash_removed(vhash_t *v, const engine_event_t *ev, uint8_t out[32]);

/* Forgets every page (the stream said AllBlocksCleared). */
void vhash_clear(vhash_t *v);

#endif
