/* rvalue.c: the cluster's key and value of an indexed page (rvalue.h draws
 * both). Every field of a value is checked before its bytes are served;
 * the checks name what a value claims, the MAC proves the claim (a value
 * that passes the checks and fails the MAC is planted or corrupted). */
#include "rvalue.h"

#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAGIC "KVCP"
#define TAG_BYTES 16
#define NONCE_BYTES 16
#define COPY_CHUNK (32u << 10) /* copied and hashed while in the L1/L2 cache */

/* The value's header, little-endian on the wire as in memory (the daemon
 * asserts a little-endian host, dispatch.c). */
typedef struct hdr {
  char magic[4];
  uint16_t version;
  uint16_t hdr_bytes;
  uint32_t page_tokens;
  uint32_t flags;       /* bit 0: has a parent */
  uint64_t page_bytes;
  uint8_t tenant[32];
  uint8_t layout[32];
  uint8_t hash[32];
  uint8_t parent[32];
  uint8_t nonce[NONCE_BYTES];
} hdr_t;
_Static_assert(sizeof(hdr_t) == 168, "the value header has no padding");

struct rvalue_secret {
  EVP_MAC_CTX *name;   /* HMAC-SHA256 under the name key */
  EVP_MAC_CTX *otk;    /* HMAC-SHA256 under the MAC key: one-time keys */
  EVP_MAC *poly;
};

static const char *const verdicts[RV_VERDICTS_] = {
    "ok", "truncated", "format", "stale", "mac", "tenant", "layout", "chain", "tokens"};

const char *rvalue_verdict_name(enum rvalue_verdict v) {
  return (unsigned)v < RV_VERDICTS_ ? verdicts[v] : "?";
}

/* A keyed HMAC-SHA256 context (the key is kept for later inits). */
static EVP_MAC_CTX *hmac_new(const void *key, size_t len) {
  EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
  EVP_MAC_CTX *ctx = mac ? EVP_MAC_CTX_new(mac) : NULL;
  EVP_MAC_free(mac); /* the context holds its own reference */
  OSSL_PARAM p[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0),
                    OSSL_PARAM_construct_end()};
  static const uint8_t zero = 0;
  if (ctx && EVP_MAC_init(ctx, len ? key : &zero, len ? len : 1, p) == 1) return ctx;
  EVP_MAC_CTX_free(ctx);
  return NULL;
}

/* HMAC of two parts under ctx's key into out (32 bytes). */
static bool hmac2(EVP_MAC_CTX *ctx, const void *a, size_t alen, const void *b, size_t blen,
                  uint8_t out[32]) {
  size_t n = 0;
  return EVP_MAC_init(ctx, NULL, 0, NULL) == 1 && EVP_MAC_update(ctx, a, alen) == 1 &&
         EVP_MAC_update(ctx, b, blen) == 1 && EVP_MAC_final(ctx, out, &n, 32) == 1 && n == 32;
}

rvalue_secret_t *rvalue_secret_new(const void *secret, size_t len) {
  rvalue_secret_t *s = calloc(1, sizeof *s);
  EVP_MAC_CTX *root = hmac_new(secret, len);
  uint8_t kname[32], kmac[32];
  bool ok = s && root && hmac2(root, "kvcached-cluster", 16, "name", 4, kname) &&
            hmac2(root, "kvcached-cluster", 16, "mac", 3, kmac);
  EVP_MAC_CTX_free(root);
  if (ok) {
    s->name = hmac_new(kname, 32);
    s->otk = hmac_new(kmac, 32);
    s->poly = EVP_MAC_fetch(NULL, "POLY1305", NULL);
  }
  OPENSSL_cleanse(kname, sizeof kname);
  OPENSSL_cleanse(kmac, sizeof kmac);
  if (!ok || !s->name || !s->otk || !s->poly) {
    rvalue_secret_free(s);
    return NULL;
  }
  return s;
}

void rvalue_secret_free(rvalue_secret_t *s) {
  if (!s) return;
  EVP_MAC_CTX_free(s->name);
  EVP_MAC_CTX_free(s->otk);
  EVP_MAC_free(s->poly);
  free(s);
}

void rvalue_tenant_identity(const char *name, uint8_t out[32]) {
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  unsigned n = 32;
  const char *dom = name ? "kvcached-tenant-v1" : "kvcached-shared-caches-v1";
  EVP_DigestInit_ex(md, EVP_sha256(), NULL);
  EVP_DigestUpdate(md, dom, strlen(dom) + 1);
  if (name) EVP_DigestUpdate(md, name, strlen(name));
  EVP_DigestFinal_ex(md, out, &n);
  EVP_MD_CTX_free(md);
}

static void hex(const uint8_t *b, size_t n, char *out) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = digits[b[i] >> 4];
    out[2 * i + 1] = digits[b[i] & 15];
  }
  out[2 * n] = '\0';
}

void rvalue_cache_init(rvalue_cache_t *rc, const rvalue_secret_t *s, const uint8_t ident[32],
                       const kvc_layout_t *layout, uint64_t page_bytes) {
  memset(rc, 0, sizeof *rc);
  memcpy(rc->tenant, ident, 32);
  /* The shape the chain seed hashes (prefix.c): layers, heads, dims, dtype,
   * page tokens; RoPE and attention settings do not change a page's bytes. */
  uint32_t shape[6] = {layout->num_layers, layout->num_kv_heads, layout->head_dim_k,
                       layout->head_dim_v, (uint32_t)layout->dtype, layout->page_tokens};
  unsigned n = 32;
  EVP_Digest(shape, sizeof shape, rc->layout, &n, EVP_sha256(), NULL);
  rc->page_tokens = layout->page_tokens;
  rc->page_bytes = page_bytes;
  uint8_t t[32];
  char th[33], lh[9];
  if (!hmac2(s->name, "tenant", 6, ident, 32, t)) memset(t, 0, sizeof t);
  hex(t, 8, th);
  hex(rc->layout, 4, lh);
  snprintf(rc->prefix, sizeof rc->prefix, "kvc%d:%s:%s:", RVALUE_VERSION, th, lh);
}

size_t rvalue_key(const rvalue_cache_t *rc, rvalue_secret_t *s, const uint8_t hash[32],
                  char *out) {
  uint8_t t[32];
  char ph[41];
  if (!hmac2(s->name, "page", 4, hash, 32, t)) memset(t, 0, sizeof t);
  hex(t, 20, ph);
  int n = snprintf(out, RVALUE_KEY_MAX, "%s%s", rc->prefix, ph);
  return n > 0 ? (size_t)n : 0;
}

size_t rvalue_size(const rvalue_cache_t *rc) {
  return sizeof(hdr_t) + (size_t)rc->page_tokens * 4 + (size_t)rc->page_bytes + TAG_BYTES;
}

/* The Poly1305 tag of v[0..n) under the one-time key of nonce. */
static bool tag_of(rvalue_secret_t *s, const uint8_t nonce[NONCE_BYTES], const uint8_t *v,
                   size_t n, uint8_t tag[TAG_BYTES]) {
  uint8_t otk[32];
  size_t tl = 0;
  EVP_MAC_CTX *ctx = EVP_MAC_CTX_new(s->poly);
  bool ok = ctx && hmac2(s->otk, "otk", 3, nonce, NONCE_BYTES, otk) &&
            EVP_MAC_init(ctx, otk, sizeof otk, NULL) == 1 && EVP_MAC_update(ctx, v, n) == 1 &&
            EVP_MAC_final(ctx, tag, &tl, TAG_BYTES) == 1 && tl == TAG_BYTES;
  EVP_MAC_CTX_free(ctx);
  OPENSSL_cleanse(otk, sizeof otk);
  return ok;
}

int rvalue_encode(const rvalue_cache_t *rc, rvalue_secret_t *s, const engine_page_t *pg,
                  uint8_t *out) {
  if (pg->page_tokens != rc->page_tokens || pg->data_bytes != rc->page_bytes) return -1;
  hdr_t h;
  memset(&h, 0, sizeof h);
  memcpy(h.magic, MAGIC, 4);
  h.version = RVALUE_VERSION;
  h.hdr_bytes = sizeof h;
  h.page_tokens = rc->page_tokens;
  h.flags = !pg->head ? 1u : 0u;
  h.page_bytes = rc->page_bytes;
  memcpy(h.tenant, rc->tenant, 32);
  memcpy(h.layout, rc->layout, 32);
  memcpy(h.hash, pg->hash, 32);
  if (!pg->head) memcpy(h.parent, pg->parent, 32);
  if (RAND_bytes(h.nonce, NONCE_BYTES) != 1) return -1;
  size_t ids = (size_t)rc->page_tokens * 4, body = sizeof h + ids + rc->page_bytes;
  memcpy(out, &h, sizeof h);
  memcpy(out + sizeof h, pg->tokens, ids);
  memcpy(out + sizeof h + ids, pg->bytes, rc->page_bytes);
  return tag_of(s, h.nonce, out, body, out + body) ? 0 : -1;
}

size_t rvalue_head_size(const rvalue_cache_t *rc) {
  return sizeof(hdr_t) + (size_t)rc->page_tokens * 4;
}

enum rvalue_verdict rvalue_check_head(const rvalue_cache_t *rc, const uint8_t *v, size_t len,
                                      const uint8_t hash[32], const uint8_t *parent,
                                      const uint32_t *tokens) {
  hdr_t h;
  if (len < sizeof h) return len >= 4 && memcmp(v, MAGIC, 4) == 0 ? RV_TRUNCATED : RV_FORMAT;
  memcpy(&h, v, sizeof h);
  if (memcmp(h.magic, MAGIC, 4) != 0) return RV_FORMAT;
  if (h.version != RVALUE_VERSION) return RV_STALE;
  if (h.hdr_bytes != sizeof h) return RV_FORMAT;
  uint64_t want = sizeof h + (uint64_t)h.page_tokens * 4 + h.page_bytes + TAG_BYTES;
  if (h.page_tokens > (1u << 20) || h.page_bytes > (1ull << 40) || len != want)
    return RV_TRUNCATED;
  if (memcmp(h.tenant, rc->tenant, 32) != 0) return RV_TENANT;
  if (memcmp(h.layout, rc->layout, 32) != 0 || h.page_tokens != rc->page_tokens ||
      h.page_bytes != rc->page_bytes)
    return RV_LAYOUT;
  static const uint8_t none[32];
  if (memcmp(h.hash, hash, 32) != 0 || (h.flags & 1u) != (parent != NULL) ||
      memcmp(h.parent, parent ? parent : none, 32) != 0)
    return RV_CHAIN;
  if (memcmp(v + sizeof h, tokens, (size_t)rc->page_tokens * 4) != 0) return RV_TOKENS;
  return RV_OK;
}

enum rvalue_verdict rvalue_check(const rvalue_cache_t *rc, const uint8_t *v, size_t len,
                                 const uint8_t hash[32], const uint8_t *parent,
                                 const uint32_t *tokens, const uint8_t **bytes) {
  enum rvalue_verdict why = rvalue_check_head(rc, v, len, hash, parent, tokens);
  if (why == RV_OK) *bytes = v + rvalue_head_size(rc);
  return why;
}

/* The MAC of a checked value in parts (head: header and ids; its page
 * bytes read from page, or copied from it to copy_to and read there; tag):
 * whether it verifies. */
static bool mac_ok(rvalue_secret_t *s, const uint8_t *head, size_t head_len, const uint8_t *page,
                   size_t page_bytes, const uint8_t *tag, uint8_t *copy_to) {
  hdr_t h;
  memcpy(&h, head, sizeof h);
  uint8_t otk[32], got[TAG_BYTES];
  size_t tl = 0;
  EVP_MAC_CTX *ctx = EVP_MAC_CTX_new(s->poly);
  bool ok = ctx && hmac2(s->otk, "otk", 3, h.nonce, NONCE_BYTES, otk) &&
            EVP_MAC_init(ctx, otk, sizeof otk, NULL) == 1 &&
            EVP_MAC_update(ctx, head, head_len) == 1;
  /* A chunk at a time: copied, then hashed while it is in the cache. */
  for (size_t off = 0; ok && off < page_bytes; off += COPY_CHUNK) {
    size_t n = page_bytes - off < COPY_CHUNK ? page_bytes - off : COPY_CHUNK;
    const uint8_t *src = page + off;
    if (copy_to) {
      memcpy(copy_to + off, src, n);
      src = copy_to + off;
    }
    ok = EVP_MAC_update(ctx, src, n) == 1;
  }
  ok = ok && EVP_MAC_final(ctx, got, &tl, TAG_BYTES) == 1 && tl == TAG_BYTES &&
       CRYPTO_memcmp(got, tag, TAG_BYTES) == 0;
  EVP_MAC_CTX_free(ctx);
  OPENSSL_cleanse(otk, sizeof otk);
  return ok;
}

bool rvalue_mac_parts(rvalue_secret_t *s, const uint8_t *head, size_t head_len,
                      const uint8_t *page, size_t page_bytes, const uint8_t *tag) {
  return mac_ok(s, head, head_len, page, page_bytes, tag, NULL);
}

bool rvalue_copy_verified(rvalue_secret_t *s, const uint8_t *v, size_t len, void *dst) {
  hdr_t h;
  memcpy(&h, v, sizeof h);
  size_t head = sizeof h + (size_t)h.page_tokens * 4, body = len - TAG_BYTES;
  return mac_ok(s, v, head, v + head, body - head, v + body, dst);
}

enum rvalue_verdict rvalue_verify(const rvalue_cache_t *rc, rvalue_secret_t *s, const uint8_t *v,
                                  size_t len, const uint8_t hash[32], const uint8_t *parent,
                                  const uint32_t *tokens, const uint8_t **bytes) {
  const uint8_t *b;
  enum rvalue_verdict why = rvalue_check(rc, v, len, hash, parent, tokens, &b);
  if (why != RV_OK) return why;
  size_t head = (size_t)(b - v), body = len - TAG_BYTES;
  if (!mac_ok(s, v, head, b, body - head, v + body, NULL)) return RV_MAC;
  *bytes = b;
  return RV_OK;
}
