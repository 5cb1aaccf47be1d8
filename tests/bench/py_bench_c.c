/* py_bench_c.c: the C side of tests/bench/py_bench.py: the same calls the
 * Python bench makes, through libkvcache directly, timed here and printed as
 * one figure (ns per call), so the script can alternate C and Python trials.
 *
 *   py_bench_c SOCKET put|get TOKENS ITERS    1-layer cache "pyb1": one token
 *                                             is 4 KiB (K + V, 8 heads x 128, bf16)
 *   py_bench_c SOCKET dput|dget SEQS ITERS    32-layer cache "pyb32": a decode
 *                                             step of SEQS sequences, one token each
 *   py_bench_c SOCKET sput|sget TOKENS ITERS  "pyb1" through the shared buffer
 *                                             (kvc_put_shm / kvc_get_shm: the
 *                                             bytes already there, no copy here)
 *   py_bench_c SOCKET dstep SEQS ITERS        "pyb32": the decode step with
 *                                             history reads: kvc_step writing token
 *                                             127 of sequences 200.. (K/V already in
 *                                             the shared buffer), a lease view
 *                                             without mask, then the address of
 *                                             every page's K and V of every layer
 *                                             (kvc_lease_k/v: what a kernel is
 *                                             given), the leases released later
 *
 * The caches and sequences must exist (py_bench.py puts them first); puts
 * overwrite the same positions. Exits 1 if a call fails.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "kvcache/kvcache.h"

static const kvc_layout_t one = {1, 8, 128, 128, KVC_DTYPE_BF16, 512};
static const kvc_layout_t deep = {32, 8, 128, 128, KVC_DTYPE_BF16, 16};

static volatile uintptr_t sink;

/* One decode step with history reads (dstep). */
static int dstep(kvc_cache_t *h, uint64_t n, kvc_shm_io_t *io, kvc_hist_span_t *spans,
                 kvc_lease_t **leases) {
  kvc_step_t st = {.view = KVC_VIEW_LEASE, .no_mask = true, .spans = spans, .spans_cap = n,
                   .leases = leases, .leases_cap = n};
  int rc = kvc_step(h, NULL, io, n, &st);
  if (rc) return rc;
  uintptr_t acc = 0;
  for (uint64_t i = 0; i < n; i++) {
    const kvc_lease_info_t *li = kvc_lease_info(leases[i]);
    for (uint32_t l = 0; l < deep.num_layers; l++)
      for (uint64_t p = li->first_pos; p < li->end; p += li->page_tokens)
        acc += (uintptr_t)kvc_lease_k(leases[i], l, p < li->begin ? li->begin : p) +
               (uintptr_t)kvc_lease_v(leases[i], l, p < li->begin ? li->begin : p);
    kvc_lease_release_later(leases[i]);
  }
  sink = acc;
  return 0;
}

static int run(kvc_cache_t *h, const char *op, uint64_t n, void *k, void *v, kvc_io_t *io) {
  if (!strcmp(op, "sput") || !strcmp(op, "sget")) {
    kvc_shm_io_t e = {.seq_id = 1, .pos = 0, .ntokens = n, .k_off = 0, .v_off = n * 2048};
    return op[1] == 'p' ? kvc_put_shm(h, NULL, &e, 1) : kvc_get_shm(h, NULL, &e, 1);
  }
  if (!strcmp(op, "put")) return kvc_put(h, 1, 0, n, k, v);
  if (!strcmp(op, "get")) return kvc_get(h, 1, 0, n, k, v);
  if (!strcmp(op, "dput")) return kvc_put_batch(h, NULL, io, n);
  return kvc_get_batch(h, NULL, io, n);
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s SOCKET put|get|sput|sget|dput|dget|dstep N ITERS\n", argv[0]);
    return 2;
  }
  const char *op = argv[2];
  uint64_t n = strtoull(argv[3], NULL, 10), iters = strtoull(argv[4], NULL, 10);
  bool decode = op[0] == 'd', step = !strcmp(op, "dstep");
  kvc_client_opts_t o = {.socket_path = argv[1], .shm_bytes = 32u << 20};
  kvc_client_t *c;
  kvc_cache_t *h;
  if (kvc_client_open(&o, &c) || kvc_cache_open(c, decode ? "pyb32" : "pyb1",
                                                decode ? &deep : &one, &h)) {
    fprintf(stderr, "py_bench_c: open failed\n");
    return 1;
  }
  uint64_t tok_bytes = decode ? 32 * 8 * 128 * 2 : 8 * 128 * 2; /* K of one token */
  uint64_t bytes = tok_bytes * n;
  char *k = calloc(1, bytes), *v = calloc(1, bytes);
  kvc_io_t *io = calloc(n, sizeof *io);
  /* Touched, finite bf16 bytes (untouched calloc pages would all be the one
   * zero page, cache-hot, flattering every copy); py_bench.py uses the same. */
  memset(k, 0x3c, bytes);
  memset(v, 0x3c, bytes);
  for (uint64_t i = 0; decode && i < n; i++)
    io[i] = (kvc_io_t){.seq_id = 100 + i, .pos = 0, .ntokens = 1, .k = k + i * tok_bytes,
                       .v = v + i * tok_bytes};
  /* dstep: each sequence's token K then V, one after another in the buffer */
  kvc_shm_io_t *sio = calloc(n, sizeof *sio);
  kvc_hist_span_t *spans = calloc(n, sizeof *spans);
  kvc_lease_t **leases = calloc(n, sizeof *leases);
  void *shm;
  kvc_client_shm(c, &shm, NULL);
  for (uint64_t i = 0; step && i < n; i++) {
    sio[i] = (kvc_shm_io_t){.seq_id = 200 + i, .pos = 127, .ntokens = 1,
                            .k_off = 2 * i * tok_bytes, .v_off = (2 * i + 1) * tok_bytes};
    memset((char *)shm + 2 * i * tok_bytes, 0x3c, 2 * tok_bytes);
  }
  if (!strcmp(op, "sput") || !strcmp(op, "sget")) memset(shm, 0x3c, 2 * bytes);
  int rc = 0;
  for (uint64_t i = 0; i < iters / 10 + 1 && !rc; i++)
    rc = step ? dstep(h, n, sio, spans, leases) : run(h, op, n, k, v, io);
  double t0 = now_ns();
  for (uint64_t i = 0; i < iters && !rc; i++)
    rc = step ? dstep(h, n, sio, spans, leases) : run(h, op, n, k, v, io);
  double t1 = now_ns();
  free(sio);
  free(spans);
  free(leases);
  if (rc) {
    fprintf(stderr, "py_bench_c: %s: %s\n", op, kvc_client_last_error(c));
    return 1;
  }
  printf("%.1f\n", (t1 - t0) / (double)iters);
  free(k);
  free(v);
  free(io);
  kvc_client_close(c);
  return 0;
}
