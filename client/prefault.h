/* prefault.h: the background fault-in of the pool's read-only mapping
 * (prefault.c says why). */
#ifndef KVC_CLIENT_PREFAULT_H
#define KVC_CLIENT_PREFAULT_H

#include <stdint.h>

#include "kvcache/kvcache.h"

typedef struct prefault prefault_t;

/* Starts populating [base, base + min(bytes, KVC_PREFAULT_MAX_BYTES)) on a
 * SCHED_IDLE thread. Returns new, or NULL (no thread: reads fault as they
 * come). base is borrowed and must stay mapped until prefault_stop. */
prefault_t *prefault_start(const uint8_t *base, uint64_t bytes);
/* Bytes populated so far, and of how many (0 for NULL). */
uint64_t prefault_done(const prefault_t *pf);
uint64_t prefault_total(const prefault_t *pf);
/* Stops the thread (at its next 2 MiB), waits until it no longer touches
 * the mapping (not in a fork child, which has no such thread) and frees;
 * accepts NULL. */
void prefault_stop(prefault_t *pf);

#endif
