/* prefill_decode.c: a worker's loop with the fewest round trips
 * (doc/worker-guide.md). It prefills 4 sequences (one put each), then runs
 * decode steps: each step writes every sequence's new token and gets a
 * zero-copy view of every sequence's history in ONE request (kvc_step),
 * reads the history in place, and releases the leases with the next
 * request (no round trip of their own). Its sequences are owned
 * (kvc_seq_create): ids the daemon picks, dropped when it disconnects.
 *
 *   build/examples/prefill_decode [SOCKET]     (default: as kvcachectl's)
 *
 * Prints one line per step and "ok" at the end; exits non-zero on an error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvcache/kvcache.h"

enum { NSEQ = 4, PROMPT = 100, STEPS = 8 };

static int fail(kvc_client_t *c, const char *what, int rc) {
  fprintf(stderr, "prefill_decode: %s: %s: %s\n", what, kvc_err_name(rc),
          c ? kvc_client_last_error(c) : kvc_client_open_error());
  return 1;
}

/* A stand-in for the model: the K/V of token pos of seq, every element. */
static float value(uint64_t seq, uint64_t pos, size_t i) { return (float)(seq * 1000 + pos) + (float)i / 1e4f; }

int main(int argc, char **argv) {
  kvc_client_opts_t o = {.socket_path = argc > 1 ? argv[1] : NULL, .client_name = "example"};
  kvc_client_t *c;
  int rc = kvc_client_open(&o, &c);
  if (rc) return fail(NULL, "open", rc);
  /* 4 layers, 2 KV heads of 64 dims, f32: 512 B of K and 512 B of V a token
   * per layer, 4 KiB a token in all; a page of 256 tokens is 1 MiB (the PAGE
   * of kvcachectl caches). */
  kvc_layout_t l = {.num_layers = 4, .num_kv_heads = 2, .head_dim_k = 64, .head_dim_v = 64,
                    .dtype = KVC_DTYPE_F32, .page_tokens = 256};
  kvc_cache_t *h;
  if ((rc = kvc_cache_open(c, "example-decode", &l, &h))) return fail(c, "cache_open", rc);
  uint64_t ids[NSEQ]; /* sequence s is ids[s - 1] */
  if ((rc = kvc_seq_create(h, NSEQ, true, ids))) return fail(c, "seq_create", rc);
  void *shm;
  uint64_t shm_bytes, kb, vb;
  kvc_client_shm(c, &shm, &shm_bytes);
  /* Prefill: each prompt's K/V straight into the shared buffer, one put. */
  if ((rc = kvc_xfer_bytes(h, NULL, true, PROMPT, &kb, &vb, NULL))) return fail(c, "sizes", rc);
  for (uint64_t s = 1; s <= NSEQ; s++) {
    float *k = shm, *v = (float *)((char *)shm + kb);
    for (size_t i = 0; i < kb / 4; i++) k[i] = value(s, 0, i), v[i] = -value(s, 0, i);
    kvc_shm_io_t e = {.seq_id = ids[s - 1], .pos = 0, .ntokens = PROMPT, .k_off = 0, .v_off = kb};
    if ((rc = kvc_put_shm(h, NULL, &e, 1))) return fail(c, "prefill", rc);
  }
  /* Decode: one request a step. */
  if ((rc = kvc_xfer_bytes(h, NULL, true, 1, &kb, &vb, NULL))) return fail(c, "sizes", rc);
  /* Zero-copy: every client may lease, but a daemon still run with the
   * deprecated page_bytes leases to admins alone (PERM): the gathered view. */
  kvc_view_t view = KVC_VIEW_LEASE;
  for (uint64_t step = 0; step < STEPS; step++) {
    uint64_t pos = PROMPT + step;
    kvc_shm_io_t e[NSEQ];
    for (uint64_t s = 1; s <= NSEQ; s++) { /* the new token's K/V: one entry per sequence */
      uint64_t off = (s - 1) * (kb + vb);
      float *k = (float *)((char *)shm + off), *v = (float *)((char *)shm + off + kb);
      for (size_t i = 0; i < kb / 4; i++) k[i] = value(s, pos, i), v[i] = -value(s, pos, i);
      e[s - 1] = (kvc_shm_io_t){.seq_id = ids[s - 1], .pos = pos, .ntokens = 1, .k_off = off,
                                .v_off = off + kb};
    }
    kvc_hist_span_t spans[NSEQ];
    kvc_lease_t *leases[NSEQ];
    uint64_t out = NSEQ * (kb + vb);
    kvc_step_t st = {.view = view, .no_mask = view == KVC_VIEW_LEASE, .out_off = out,
                     .out_len = shm_bytes - out, .spans = spans, .spans_cap = NSEQ,
                     .leases = leases, .leases_cap = NSEQ};
    rc = kvc_step(h, NULL, e, NSEQ, &st);
    if (rc == KVC_E_PERM && view == KVC_VIEW_LEASE) { /* all or nothing: nothing written */
      st.view = view = KVC_VIEW_GATHER;
      st.no_mask = false;
      rc = kvc_step(h, NULL, e, NSEQ, &st);
    }
    if (rc) return fail(c, "step", rc);
    /* The attention would read here: check the newest token of each. */
    for (int s = 0; s < NSEQ; s++) {
      float k0;
      if (view == KVC_VIEW_LEASE) {
        memcpy(&k0, kvc_lease_k(leases[s], 0, pos), 4); /* layer 0, in the pool, in place */
      } else { /* K is [layer][entry][head][dim]: entry first + n - 1 of layer 0 */
        const char *k = (const char *)shm + st.hist.k_off;
        memcpy(&k0, k + (spans[s].first + spans[s].n - 1) * 2 * 64 * 4, 4);
      }
      if (k0 != value((uint64_t)s + 1, pos, 0)) {
        fprintf(stderr, "prefill_decode: step %llu: seq %d reads %g\n",
                (unsigned long long)step, s + 1, (double)k0);
        return 1;
      }
      if (view == KVC_VIEW_LEASE)
        kvc_lease_release_later(leases[s]); /* rides on the next request */
    }
    printf("step %llu: %llu history entries, %s view, 1 request\n", (unsigned long long)step,
           (unsigned long long)st.hist.entries, view == KVC_VIEW_LEASE ? "lease" : "gathered");
  }
  kvc_client_close(c); /* drops the owned sequences */
  printf("ok\n");
  return 0;
}
