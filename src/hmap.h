/* hmap.h: an open-addressing map from u64 keys to non-NULL pointers.
 *
 * Linear probing over a power-of-two table, at most 3/4 full; deletion
 * shifts later entries back (no tombstones), so a lookup stops at the first
 * empty slot:
 *
 *   slot:  0     1     2     3     4     5     6     7
 *        [ - ][k=9 ][k=1 ][k=17][ - ][ - ][k=6 ][ - ]    (hash & 7: 9->1, 1->1, 17->1)
 *   del 1:     [k=9 ][k=17][ - ]   17 moves back to the slot 1 left.
 *
 * Any u64 is a valid key; a NULL value marks an empty slot. The map keeps
 * pointers (it does not own what they point to).
 */
#ifndef KVC_HMAP_H
#define KVC_HMAP_H

#include <stddef.h>
#include <stdint.h>

#include "mem.h"

typedef struct hmap_slot {
  uint64_t key;
  void *val; /* NULL: empty */
} hmap_slot_t;

typedef struct hmap {
  hmap_slot_t *slots;
  size_t cap;   /* slots, power of two, or 0 */
  size_t count; /* occupied slots */
} hmap_t;

void hmap_init(hmap_t *h);
void hmap_deinit(hmap_t *h, mem_t *m);
void *hmap_get(const hmap_t *h, uint64_t key);
/* Makes room so that `more` inserts cannot fail. 0 or KVC_E_NOMEM. */
int hmap_reserve(hmap_t *h, mem_t *m, size_t more);
/* Rehashes into cap slots (a power of two holding count at 3/4 load):
 * used to undo a reserve when the call that needed it fails. 0 or NOMEM. */
int hmap_resize(hmap_t *h, mem_t *m, size_t cap);
/* Inserts a key not present (val != NULL); needs room (hmap_reserve). */
void hmap_insert(hmap_t *h, uint64_t key, void *val);
/* Removes key if present; returns its value or NULL. */
void *hmap_remove(hmap_t *h, uint64_t key);
/* Next occupied slot index >= *pos, with *pos moved past it; NULL at the end. */
void *hmap_next(const hmap_t *h, size_t *pos, uint64_t *key);

#endif
