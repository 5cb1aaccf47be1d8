/* attn.h: what a token may attend to in each attention kind, and freeing
 * what no future token can (attn.c; doc/attention.md). */
#ifndef KVC_ATTN_H
#define KVC_ATTN_H

#include "core.h"

/* Frees what no future token of s can attend to, given that the lowest
 * position still to be computed is h (window, chunked). */
void attn_trim(engine_t *eng, seq_t *s, uint64_t h);
/* Whether a token at p may attend to position q of its own sequence. */
bool attn_allows(const cache_t *c, uint64_t p, uint64_t q);

#endif
