/* events_vhash.c: vLLM's sha256_cbor block hashes of published pages, and
 * the table from kvcached's chain hash to them (events_vhash.h).
 *
 *   table: open addressing, linear probing, keyed by the chain hash's first
 *   8 bytes (the whole 32 compared); a removal shifts the entries after it
 *   back, so there are no tombstones. Grown at half full.
 */
#include "events_vhash.h"

#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

typedef struct entry {
  bool used;
  uint8_t chain[32]; /* kvcached's chain hash of the page */
  uint8_t vh[32];    /* its vLLM hash */
} entry_t;

struct vhash {
  uint8_t none_hash[32];
  entry_t *tab;
  size_t cap, n;     /* slots (a power of two), entries */
  EVP_MD_CTX *md;
  uint8_t *cbor;     /* the encoding of one block */
  size_t cbor_cap;
};

/* ---- canonical CBOR: the head of an item of major type mt and argument v -- */

static size_t cbor_head(uint8_t *p, unsigned mt, uint64_t v) {
  uint8_t m = (uint8_t)(mt << 5);
  if (v < 24) return p[0] = (uint8_t)(m | v), 1;
  int n = v < 0x100 ? 1 : v < 0x10000 ? 2 : v < 0x100000000ull ? 4 : 8;
  p[0] = (uint8_t)(m | (n == 1 ? 24 : n == 2 ? 25 : n == 4 ? 26 : 27));
  for (int i = 0; i < n; i++) p[1 + i] = (uint8_t)(v >> (8 * (n - 1 - i)));
  return 1 + (size_t)n;
}

static void sha256(vhash_t *v, const uint8_t *p, size_t n, uint8_t out[32]) {
  unsigned len = 32;
  EVP_DigestInit_ex(v->md, EVP_sha256(), NULL);
  EVP_DigestUpdate(v->md, p, n);
  EVP_DigestFinal_ex(v->md, out, &len);
}

/* sha256(cbor([parent, [ids...], null])): vLLM's hash_block_tokens with no
 * extra keys. false out of memory. */
static bool block_hash(vhash_t *v, const uint8_t parent[32], const uint32_t *ids, size_t n,
                       uint8_t out[32]) {
  size_t need = 1 + 2 + 32 + 9 + 5 * n + 1;
  if (need > v->cbor_cap) {
    uint8_t *b = realloc(v->cbor, need);
    if (!b) return false;
    v->cbor = b;
    v->cbor_cap = need;
  }
  uint8_t *p = v->cbor;
  size_t k = cbor_head(p, 4, 3);
  k += cbor_head(p + k, 2, 32);
  memcpy(p + k, parent, 32);
  k += 32;
  k += cbor_head(p + k, 4, n);
  for (size_t i = 0; i < n; i++) k += cbor_head(p + k, 0, ids[i]);
  p[k++] = 0xf6; /* null: no extra keys */
  sha256(v, p, k, out);
  return true;
}

/* ---- the table ------------------------------------------------------------ */

static size_t slot_of(const vhash_t *v, const uint8_t chain[32]) {
  uint64_t k;
  memcpy(&k, chain, 8);
  return (size_t)(k * 0x9e3779b97f4a7c15ull >> 17) & (v->cap - 1);
}

static entry_t *find(vhash_t *v, const uint8_t chain[32]) {
  for (size_t i = slot_of(v, chain);; i = (i + 1) & (v->cap - 1)) {
    if (!v->tab[i].used) return NULL;
    if (memcmp(v->tab[i].chain, chain, 32) == 0) return &v->tab[i];
  }
}

static bool grow(vhash_t *v) {
  size_t cap = v->cap * 2;
  entry_t *tab = calloc(cap, sizeof *tab), *old = v->tab;
  if (!tab) return false;
  size_t ocap = v->cap;
  v->tab = tab;
  v->cap = cap;
  for (size_t i = 0; i < ocap; i++) {
    if (!old[i].used) continue;
    size_t j = slot_of(v, old[i].chain);
    while (tab[j].used) j = (j + 1) & (cap - 1);
    tab[j] = old[i];
  }
  free(old);
  return true;
}

static bool insert(vhash_t *v, const uint8_t chain[32], const uint8_t vh[32]) {
  entry_t *e = find(v, chain);
  if (!e) {
    if (2 * (v->n + 1) > v->cap && !grow(v)) return false;
    size_t i = slot_of(v, chain);
    while (v->tab[i].used) i = (i + 1) & (v->cap - 1);
    e = &v->tab[i];
    e->used = true;
    memcpy(e->chain, chain, 32);
    v->n++;
  }
  memcpy(e->vh, vh, 32);
  return true;
}

/* Removes e, moving back the entries of its probe run that it displaced. */
static void erase(vhash_t *v, entry_t *e) {
  size_t hole = (size_t)(e - v->tab), mask = v->cap - 1;
  v->tab[hole].used = false;
  v->n--;
  for (size_t i = (hole + 1) & mask; v->tab[i].used; i = (i + 1) & mask) {
    size_t home = slot_of(v, v->tab[i].chain);
    /* It may fill the hole unless its home lies cyclically in (hole, i]. */
    bool stays = hole <= i ? (home > hole && home <= i) : (home > hole || home <= i);
    if (stays) continue;
    v->tab[hole] = v->tab[i];
    v->tab[i].used = false;
    hole = i;
  }
}

/* ---- the interface ---------------------------------------------------------- */

vhash_t *vhash_new(const char *seed) {
  vhash_t *v = calloc(1, sizeof *v);
  if (!v) return NULL;
  v->cap = 1024;
  v->tab = calloc(v->cap, sizeof *v->tab);
  v->md = EVP_MD_CTX_new();
  size_t len = strlen(seed);
  uint8_t *enc = malloc(9 + len);
  if (!v->tab || !v->md || !enc) {
    free(enc);
    vhash_free(v);
    return NULL;
  }
  size_t k = cbor_head(enc, 3, len); /* a text string */
  memcpy(enc + k, seed, len);
  sha256(v, enc, k + len, v->none_hash);
  free(enc);
  return v;
}

void vhash_free(vhash_t *v) {
  if (!v) return;
  free(v->tab);
  free(v->cbor);
  EVP_MD_CTX_free(v->md);
  free(v);
}

void vhash_clear(vhash_t *v) {
  memset(v->tab, 0, v->cap * sizeof *v->tab);
  v->n = 0;
}

bool vhash_stored(vhash_t *v, const engine_event_t *ev, uint8_t out[32], uint8_t parent[32],
                  bool *has_parent) {
  *has_parent = ev->has_parent;
  if (ev->has_parent) {
    const entry_t *p = find(v, ev->parent);
    if (!p) return false;
    memcpy(parent, p->vh, 32);
  }
  return block_hash(v, ev->has_parent ? parent : v->none_hash, ev->tokens, ev->ntokens, out) &&
         insert(v, ev->hash, out);
}

bool vhash_removed(vhash_t *v, const engine_event_t *ev, uint8_t out[32]) {
  entry_t *e = find(v, ev->hash);
  if (!e) return false;
  memcpy(out, e->vh, 32);
  erase(v, e);
  return true;
}
