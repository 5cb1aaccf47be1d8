/* holes.h: the hole set of a sequence: slots [b, e) that hold no token
 * (never written, or vacated by a move; doc/attention.md). holes.c. */
#ifndef KVC_HOLES_H
#define KVC_HOLES_H

#include "core.h"

/* Makes room for k more ranges (0 or KVC_E_NOMEM); add and cut then never
 * allocate as long as the room reserved covers them (a cut inside one range
 * splits it: one more). */
int holes_reserve(engine_t *eng, seq_t *s, uint32_t k);
void holes_add(seq_t *s, uint64_t b, uint64_t e);
void holes_cut(seq_t *s, uint64_t b, uint64_t e);
bool holes_has(const seq_t *s, uint64_t pos);
/* Whether ranges h[0..n) (sorted, apart) cover every slot of [b, e). */
bool holes_cover(const hole_t *h, uint32_t n, uint64_t b, uint64_t e);
/* Slots [b, e) move by delta: the target range's holes are replaced by the
 * moved ones (tmp: room for nholes ranges; reserve nholes + 2 first). */
void holes_move(seq_t *s, uint64_t b, uint64_t e, int64_t delta, hole_t *tmp);
/* Calls fn for each hole's part inside [b, e), as an offset from b. */
void holes_within(const seq_t *s, uint64_t b, uint64_t e,
                  void (*fn)(uint64_t off, uint64_t n, void *arg), void *arg);
/* Zeroes, in every layer and head, the slots of the holes inside [b, e):
 * a put about to write some layers or heads of them (its pages its own)
 * makes them tokens for all, and the rest must read as the hole did, not as
 * whatever the page held before (pool pages are not cleared when freed). */
void holes_zero(engine_t *eng, const seq_t *s, uint64_t b, uint64_t e);

#endif
