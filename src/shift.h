/* shift.h: moving a sequence's tokens with their keys re-rotated (shift.c). */
#ifndef KVC_SHIFT_H
#define KVC_SHIFT_H

#include "core.h"

/* Removes a middle range [b, e) (e < len), moving later tokens down with
 * their keys re-rotated; all or nothing. */
int shift_remove(engine_t *eng, seq_t *s, uint64_t b, uint64_t e);

#endif
