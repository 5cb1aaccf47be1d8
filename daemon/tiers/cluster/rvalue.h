/* rvalue.h: a page of the prefix index as the cluster stores it: its key
 * and its value, written and verified here alone (rvalue.c; doc/cluster.md).
 *
 *   key    kvc1:<tenant tag>:<layout tag>:<page tag>
 *            tenant tag  16 hex of HMAC(name key, "tenant" || tenant identity)
 *            layout tag   8 hex of SHA-256 of the layout's shape
 *            page tag    40 hex of HMAC(name key, "page" || chain hash)
 *   value  header (magic, version, sizes, tenant, layout, chain hash,
 *          parent hash, nonce) | page_tokens token ids | page bytes | tag
 *            tag  Poly1305 of everything before it, under a one-time key
 *                 HMAC(MAC key, nonce): only a holder of the cluster secret
 *                 writes a value that verifies
 *
 * The name and MAC keys are derived from the cluster secret
 * (cluster_secret_file). Without one they are derived from nothing: a value
 * is then checksummed (corruption, truncation) but anyone who can write to
 * the cluster can plant one that verifies.
 */
#ifndef KVCD_RVALUE_H
#define KVCD_RVALUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine_tier.h"

#define RVALUE_VERSION 1
#define RVALUE_KEY_MAX 96 /* bytes of a key, with its NUL */

/* The keys derived from the cluster secret, and the MAC contexts. */
typedef struct rvalue_secret rvalue_secret_t;

/* What names a cache's pages in the cluster: its tenant and layout. */
typedef struct rvalue_cache {
  uint8_t tenant[32];     /* the tenant's identity */
  uint8_t layout[32];     /* SHA-256 of the layout's shape */
  uint32_t page_tokens;
  uint64_t page_bytes;    /* the layout's page bytes */
  char prefix[48];        /* "kvc1:<tenant tag>:<layout tag>:" */
} rvalue_cache_t;

/* Why a value was refused (RV_OK: it verified). */
enum rvalue_verdict {
  RV_OK = 0,
  RV_TRUNCATED, /* not the size the header and the cache say */
  RV_FORMAT,    /* not a page value: magic or header size */
  RV_STALE,     /* another format version (written by another release) */
  RV_MAC,       /* corrupted, or written without the cluster secret */
  RV_TENANT,    /* another tenant's */
  RV_LAYOUT,    /* another layout's */
  RV_CHAIN,     /* not this page of this chain (hash or parent) */
  RV_TOKENS,    /* other token ids */
  RV_VERDICTS_
};
/* "truncated", "format", ...: the reason label of a discarded value. */
const char *rvalue_verdict_name(enum rvalue_verdict v);

/* Derives the keys from secret (len 0: none). Returns new, or NULL out of
 * memory or when OpenSSL lacks HMAC or Poly1305. */
rvalue_secret_t *rvalue_secret_new(const void *secret, size_t len);
void rvalue_secret_free(rvalue_secret_t *s);

/* The tenant identity a tenant name stands for on every node (also the
 * engine's, engine_tenant_identity). The shared caches' namespace has its
 * own (name NULL). */
void rvalue_tenant_identity(const char *name, uint8_t out[32]);

/* Fills rc for a cache of the tenant of identity ident and this layout
 * (normalized, as engine_cache_info gives it). */
void rvalue_cache_init(rvalue_cache_t *rc, const rvalue_secret_t *s, const uint8_t ident[32],
                       const kvc_layout_t *layout, uint64_t page_bytes);

/* The key of the page of chain hash `hash` into out (RVALUE_KEY_MAX bytes);
 * returns its length. */
size_t rvalue_key(const rvalue_cache_t *rc, rvalue_secret_t *s, const uint8_t hash[32],
                  char *out);

/* Bytes of a value of rc's pages. */
size_t rvalue_size(const rvalue_cache_t *rc);

/* Writes the value of pg (a page of rc's cache) into out (rvalue_size
 * bytes). 0, or -1 when pg is not of rc's shape or the MAC fails. */
int rvalue_encode(const rvalue_cache_t *rc, rvalue_secret_t *s, const engine_page_t *pg,
                  uint8_t *out);

/* Checks what a value v of len bytes fetched as the page of chain hash
 * `hash` under `parent` (NULL: a chain head) with these page_tokens token
 * ids claims: format, size, tenant, layout, chain, ids. RV_OK and *bytes
 * pointing at its page bytes inside v, or why not. The MAC is not checked:
 * rvalue_copy_verified (or rvalue_verify) does. */
enum rvalue_verdict rvalue_check(const rvalue_cache_t *rc, const uint8_t *v, size_t len,
                                 const uint8_t hash[32], const uint8_t *parent,
                                 const uint32_t *tokens, const uint8_t **bytes);
/* Bytes of a value before its page bytes (header and token ids); the tag
 * (RVALUE_TAG_BYTES) follows the page bytes. */
size_t rvalue_head_size(const rvalue_cache_t *rc);
#define RVALUE_TAG_BYTES 16
/* rvalue_check of a value of len bytes held in parts: its head
 * (rvalue_head_size bytes; the caller holds that many when len is
 * rvalue_size) apart from its page bytes. */
enum rvalue_verdict rvalue_check_head(const rvalue_cache_t *rc, const uint8_t *head, size_t len,
                                      const uint8_t hash[32], const uint8_t *parent,
                                      const uint32_t *tokens);
/* The MAC of a value held in parts, rvalue_check_head passed: head, the
 * page bytes (page_bytes of them) wherever they are, and the tag: whether
 * it verifies. */
bool rvalue_mac_parts(rvalue_secret_t *s, const uint8_t *head, size_t head_len,
                      const uint8_t *page, size_t page_bytes, const uint8_t *tag);
/* Copies the page bytes of a value rvalue_check passed into dst, computing
 * its MAC on the way (a chunk at a time while it is in the cache: one pass
 * over the bytes, not two): whether the MAC verifies. When it does not,
 * dst holds bytes that must not be used. */
bool rvalue_copy_verified(rvalue_secret_t *s, const uint8_t *v, size_t len, void *dst);
/* rvalue_check, then the MAC (RV_MAC) over v in place. */
enum rvalue_verdict rvalue_verify(const rvalue_cache_t *rc, rvalue_secret_t *s, const uint8_t *v,
                                  size_t len, const uint8_t hash[32], const uint8_t *parent,
                                  const uint32_t *tokens, const uint8_t **bytes);

#endif
