/* prefix_pair.c: two workers share a system prompt through the prefix
 * cache (doc/prefix.md). Each worker prefills its prompt the same way: it
 * attaches what the node already holds of it (kvc_attach: a match and the
 * pages made its sequence's in one request, no bytes copied), then computes
 * and puts only the rest, with its token ids, so that the full pages it adds
 * serve the next worker. A runs first with the system prompt; B's prompt is
 * the system prompt and a question. On a node that already holds the system
 * prompt (any run after the first), A puts nothing either.
 *
 * Its sequences are owned (kvc_seq_create): ids the daemon picks, never
 * another worker's, dropped when the worker's connection closes.
 *
 *   build/examples/prefix_pair [SOCKET]     (default: as kvcachectl's)
 *
 * Prints what each worker found cached and "ok"; exits non-zero on an
 * error. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "kvcache/kvcache.h"

enum { SYSTEM = 64, QUESTION = 10 };

static const kvc_layout_t layout = {.num_layers = 2, .num_kv_heads = 2, .head_dim_k = 32,
                                    .head_dim_v = 32, .dtype = KVC_DTYPE_F32,
                                    .page_tokens = 16};
/* Bytes of K (and of V) of one token, every layer: 2 x 2 x 32 f32. */
static const size_t token_bytes = 2 * 2 * 32 * 4;

typedef struct worker {
  const char *name;
  kvc_client_t *c;
  kvc_cache_t *h;
  uint64_t seq; /* its sequence, owned */
} worker_t;

static int fail(const worker_t *w, const char *what, int rc) {
  fprintf(stderr, "prefix_pair: %s: %s: %s: %s\n", w->name, what, kvc_err_name(rc),
          w->c ? kvc_client_last_error(w->c) : kvc_client_open_error());
  return 1;
}

/* The model's K/V of tokens [pos, pos + n): a stand-in, each element its
 * token's id (the same ids give the same K/V, as a model's would). */
static void compute(const uint32_t *ids, uint64_t pos, uint64_t n, float *k, float *v) {
  size_t per = token_bytes / 4;
  for (uint64_t t = 0; t < n; t++)
    for (size_t i = 0; i < per; i++) {
      k[t * per + i] = (float)ids[pos + t];
      v[t * per + i] = -(float)ids[pos + t];
    }
}

/* Connects, opens the cache and creates the worker's sequence. */
static int start(worker_t *w, const char *sock) {
  kvc_client_opts_t o = {.socket_path = sock, .client_name = "example"};
  int rc = kvc_client_open(&o, &w->c);
  if (rc) return fail(w, "open", rc);
  if ((rc = kvc_cache_open(w->c, "example-prefix", &layout, &w->h)))
    return fail(w, "cache_open", rc);
  if ((rc = kvc_seq_create(w->h, 1, true, &w->seq))) return fail(w, "seq_create", rc);
  return 0;
}

/* Prefill: attach the cached part of the prompt, put the rest with its ids. */
static int prefill(worker_t *w, const uint32_t *ids, uint64_t n, kvc_match_t *m) {
  int rc = kvc_attach(w->h, w->seq, ids, n, false, m);
  if (rc) return fail(w, "attach", rc);
  printf("%s's prompt: %" PRIu64 " of %" PRIu64 " tokens cached\n", w->name, m->tokens, n);
  uint64_t rest = n - m->tokens;
  if (rest == 0) return 0;
  float *k = malloc(token_bytes * rest), *v = malloc(token_bytes * rest);
  if (!k || !v) return fail(w, "malloc", KVC_E_NOMEM);
  compute(ids, m->tokens, rest, k, v);
  rc = kvc_put_tokens(w->h, w->seq, m->tokens, rest, k, v, ids + m->tokens);
  free(k), free(v);
  return rc ? fail(w, "put_tokens", rc) : 0;
}

int main(int argc, char **argv) {
  const char *sock = argc > 1 ? argv[1] : NULL;
  uint32_t ids[SYSTEM + QUESTION];
  for (int i = 0; i < SYSTEM + QUESTION; i++) ids[i] = 1000u + (uint32_t)i * 7u;
  worker_t a = {.name = "A"}, b = {.name = "B"};
  kvc_match_t ma, mb;
  if (start(&a, sock) || start(&b, sock)) return 1;
  if (prefill(&a, ids, SYSTEM, &ma)) return 1;            /* the system prompt */
  if (prefill(&b, ids, SYSTEM + QUESTION, &mb)) return 1; /* and a question */
  kvc_seq_info_t si;
  int rc = kvc_seq_info(b.h, b.seq, &si);
  if (rc) return fail(&b, "seq_info", rc);
  printf("B's sequence: %" PRIu64 " tokens, %u pages shared\n", si.length, si.shared_pages);
  if (mb.tokens != SYSTEM || si.length != SYSTEM + QUESTION || si.shared_pages < SYSTEM / 16) {
    fprintf(stderr, "prefix_pair: expected B to find the %d-token system prompt cached and "
            "share its %d pages\n", SYSTEM, SYSTEM / 16);
    return 1;
  }
  kvc_client_close(a.c); /* drops the owned sequences */
  kvc_client_close(b.c);
  printf("ok\n");
  return 0;
}
