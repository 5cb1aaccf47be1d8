/* hmap.c: open addressing with linear probing and backward-shift deletion. */
#include "hmap.h"

#include "kvcache/errors.h"

static uint64_t mix(uint64_t x) { /* splitmix64 finalizer */
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

void hmap_init(hmap_t *h) {
  h->slots = NULL;
  h->cap = 0;
  h->count = 0;
}

void hmap_deinit(hmap_t *h, mem_t *m) {
  mem_free(m, h->slots);
  hmap_init(h);
}

static size_t find(const hmap_t *h, uint64_t key) {
  size_t mask = h->cap - 1, i = (size_t)mix(key) & mask;
  while (h->slots[i].val && h->slots[i].key != key) i = (i + 1) & mask;
  return i;
}

void *hmap_get(const hmap_t *h, uint64_t key) {
  if (h->cap == 0) return NULL;
  return h->slots[find(h, key)].val;
}

void hmap_insert(hmap_t *h, uint64_t key, void *val) {
  size_t i = find(h, key);
  h->slots[i].key = key;
  h->slots[i].val = val;
  h->count++;
}

int hmap_resize(hmap_t *h, mem_t *m, size_t cap) {
  if (cap == h->cap) return 0;
  if (cap == 0) {
    if (h->count) return KVC_E_INVAL;
    hmap_deinit(h, m);
    return 0;
  }
  if ((cap & (cap - 1)) || h->count > cap / 4 * 3) return KVC_E_INVAL;
  hmap_slot_t *slots = mem_calloc(m, cap, sizeof *slots);
  if (!slots) return KVC_E_NOMEM;
  hmap_t next = {slots, cap, 0};
  for (size_t i = 0; i < h->cap; i++)
    if (h->slots[i].val) hmap_insert(&next, h->slots[i].key, h->slots[i].val);
  mem_free(m, h->slots);
  *h = next;
  return 0;
}

int hmap_reserve(hmap_t *h, mem_t *m, size_t more) {
  size_t need = h->count + more;
  if (need < h->count) return KVC_E_NOMEM;
  if (h->cap && need <= h->cap / 4 * 3) return 0;
  size_t cap = h->cap ? h->cap : 16;
  while (need > cap / 4 * 3) {
    if (cap > SIZE_MAX / 2 / sizeof(hmap_slot_t)) return KVC_E_NOMEM;
    cap *= 2;
  }
  return hmap_resize(h, m, cap);
}

void *hmap_remove(hmap_t *h, uint64_t key) {
  if (h->cap == 0) return NULL;
  size_t mask = h->cap - 1, i = find(h, key);
  void *val = h->slots[i].val;
  if (!val) return NULL;
  /* Shift back every entry of the probe run that may move into the hole. */
  size_t j = i;
  for (;;) {
    j = (j + 1) & mask;
    if (!h->slots[j].val) break;
    size_t home = (size_t)mix(h->slots[j].key) & mask;
    /* The entry at j may fill i unless its home lies cyclically in (i, j]. */
    int stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
    if (stays) continue;
    h->slots[i] = h->slots[j];
    i = j;
  }
  h->slots[i].val = NULL;
  h->count--;
  return val;
}

void *hmap_next(const hmap_t *h, size_t *pos, uint64_t *key) {
  for (size_t i = *pos; i < h->cap; i++) {
    if (h->slots[i].val) {
      *pos = i + 1;
      if (key) *key = h->slots[i].key;
      return h->slots[i].val;
    }
  }
  *pos = h->cap;
  return NULL;
}
