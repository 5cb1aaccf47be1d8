/* pin.h: pins, the pin limit and retention priorities (pin.c). */
#ifndef KVC_PIN_H
#define KVC_PIN_H

#include "core.h"

/* The owner's pin of s, or NULL. */
pin_t *pin_find(const seq_t *s, uint64_t owner);
/* Frees a pin record out of its sequence's and owner's lists (and the owner
 * with its last pin); the sequence's pin count is the caller's. */
void pin_unlink(engine_t *eng, pin_t *p);
/* Unlinks a pin and, with the sequence's last, puts it back on the LRU. */
void pin_release(engine_t *eng, pin_t *p);
/* Takes a pin off the soft-pin list if it is on it. */
void pin_soft_unlink(engine_t *eng, pin_t *p);

/* A pin record and, for a new owner, its owner (map room reserved). */
typedef struct pin_prep {
  pin_t *p;
  owner_t *o;
  bool new_owner;
  size_t map_cap;
} pin_prep_t;

/* Allocates a pin record (and a new owner's record); NOMEM keeps nothing. */
int pin_prepare(engine_t *eng, uint64_t owner, pin_prep_t *pp);
/* Links a prepared pin of s (ttl_ms 0: hard); cannot fail. */
void pin_commit(engine_t *eng, seq_t *s, pin_prep_t *pp, uint64_t ttl_ms);
/* KVC_E_PINLIMIT if pinning these n pages would pin more than the limit. */
int pin_limit_check(engine_t *eng, const cache_t *c, const uint32_t *pages, uint64_t n);

#endif
