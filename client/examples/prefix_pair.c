/* prefix_pair.c: two workers share a system prompt through the prefix
 * cache (doc/prefix.md). Worker A prefills the prompt with its token ids; B,
 * another connection, asks how much of its own prompt is cached
 * (kvc_match) and attaches it to its sequence in one request (kvc_attach:
 * no bytes copied, the pages shared), then appends only what was missing.
 *
 *   build/examples/prefix_pair [SOCKET]     (default: $KVCACHED_SOCKET)
 *
 * Prints what matched and "ok"; exits non-zero on an error. */
#include <stdio.h>
#include <stdlib.h>

#include "kvcache/kvcache.h"

enum { SYSTEM = 64, QUESTION = 10 };

static int fail(kvc_client_t *c, const char *what, int rc) {
  fprintf(stderr, "prefix_pair: %s: %s: %s\n", what, kvc_err_name(rc),
          c ? kvc_client_last_error(c) : kvc_client_open_error());
  return 1;
}

static const kvc_layout_t layout = {.num_layers = 2, .num_kv_heads = 2, .head_dim_k = 32,
                                    .head_dim_v = 32, .dtype = KVC_DTYPE_F32,
                                    .page_tokens = 16};

static kvc_client_t *worker(const char *sock, kvc_cache_t **h) {
  kvc_client_opts_t o = {.socket_path = sock, .client_name = "example"};
  kvc_client_t *c;
  int rc = kvc_client_open(&o, &c);
  if (rc) {
    fail(NULL, "open", rc);
    exit(1);
  }
  if ((rc = kvc_cache_open(c, "example-prefix", &layout, h))) {
    fail(c, "cache_open", rc);
    exit(1);
  }
  return c;
}

int main(int argc, char **argv) {
  const char *sock = argc > 1 ? argv[1] : NULL;
  uint32_t ids[SYSTEM + QUESTION];
  for (int i = 0; i < SYSTEM + QUESTION; i++) ids[i] = 1000u + (uint32_t)i * 7u;
  size_t tok = (size_t)layout.num_layers * layout.num_kv_heads * layout.head_dim_k;
  float *k = calloc(tok * (SYSTEM + QUESTION), 4), *v = calloc(tok * (SYSTEM + QUESTION), 4);
  if (!k || !v) return 1;
  for (size_t i = 0; i < tok * (SYSTEM + QUESTION); i++) k[i] = (float)i, v[i] = -(float)i;

  kvc_cache_t *a, *b;
  kvc_client_t *ca = worker(sock, &a), *cb = worker(sock, &b);
  int rc;
  /* A: the system prompt with its token ids: full pages enter the index. */
  if ((rc = kvc_put_tokens(a, 1, 0, SYSTEM, k, v, ids))) return fail(ca, "put_tokens", rc);
  /* B: its prompt is the system prompt and a question. */
  kvc_match_t m;
  if ((rc = kvc_match(b, ids, SYSTEM + QUESTION, &m))) return fail(cb, "match", rc);
  printf("B's prompt: %llu of %d tokens cached\n", (unsigned long long)m.tokens,
         SYSTEM + QUESTION);
  if ((rc = kvc_attach(b, 7, ids, SYSTEM + QUESTION, false, &m))) return fail(cb, "attach", rc);
  /* Only the rest is computed and put (the K/V layout is [layer][token]...:
   * put_batch with a pointer per layer range would do; here the whole rest). */
  uint64_t rest = SYSTEM + QUESTION - m.tokens;
  float *rk = calloc(tok * rest, 4), *rv = calloc(tok * rest, 4);
  if (!rk || !rv) return 1;
  if ((rc = kvc_put(b, 7, m.tokens, rest, rk, rv))) return fail(cb, "put rest", rc);
  kvc_seq_info_t si;
  if ((rc = kvc_seq_info(b, 7, &si))) return fail(cb, "seq_info", rc);
  printf("B's sequence: %llu tokens, %u pages shared with A\n", (unsigned long long)si.length,
         si.shared_pages);
  if (m.tokens != SYSTEM || si.length != SYSTEM + QUESTION || si.shared_pages == 0) {
    fprintf(stderr, "prefix_pair: expected the %d-token system prompt shared\n", SYSTEM);
    return 1;
  }
  kvc_seq_remove(a, 1, 0, UINT64_MAX);
  kvc_seq_remove(b, 7, 0, UINT64_MAX);
  kvc_client_close(ca);
  kvc_client_close(cb);
  free(k), free(v), free(rk), free(rv);
  printf("ok\n");
  return 0;
}
