/* engine_bench.c: the engine alone, timed against memcpy of the same bytes.
 *
 * A Llama-class layout (32 layers, 8 KV heads, head_dim 128, bf16, 16 tokens
 * a page: 2 MiB pages) over a pre-faulted pool big enough for a 32k-token
 * sequence. Prints medians and ratios; asserts nothing about time (it exits
 * non-zero only if the engine refuses a call that must work).
 *
 *   put / get per page     vs memcpy of 2 MiB into / out of the pool
 *   copy_prefix 32k tokens vs memcpy of its 4 GiB
 *   puts into a full pool (each evicts) vs an empty pool
 *   metadata bytes per page
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "engine.h"

#define PAGE_TOKENS 16
#define SEQ_TOKENS 32768u
#define NPAGES (SEQ_TOKENS / PAGE_TOKENS + 128) /* the 32k sequence + room */
#define TRIALS 5

static engine_t *eng;
static uint8_t *pool;
static uint64_t page_bytes;
static uint32_t cid;
static kvc_layout_t lay = {32, 8, 128, 128, KVC_DTYPE_BF16, PAGE_TOKENS};
static uint8_t *src_k, *src_v; /* one page of K and V, [layer][token][head][dim] */
static uint64_t half;          /* bytes of K (or V) of one page */

static void must(int rc, const char *what) {
  if (rc == 0) return;
  fprintf(stderr, "engine_bench: %s: %s (%s)\n", what, kvc_err_name(rc),
          engine_last_error(eng)->msg);
  exit(1);
}

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[n / 2];
}

static engine_io_t io_of(uint64_t seq, uint64_t pos, uint64_t n, void *k, void *v) {
  engine_io_t io = {seq, pos, n, k, v, half * n / PAGE_TOKENS, half * n / PAGE_TOKENS,
                    NULL, NULL, 0, 0};
  return io;
}

static int put(uint64_t seq, uint64_t pos, uint64_t n) {
  engine_io_t io = io_of(seq, pos, n, src_k, src_v);
  engine_xfer_t x = {.layer_begin = 0, .layer_end = 0, .head_begin = 0, .head_end = 0, .dtype = KVC_DTYPE_BF16};
  return engine_put(eng, cid, &x, &io, 1);
}

static void setup(void) {
  int64_t pb = engine_layout_page_bytes(&lay);
  must(pb < 0 ? (int)pb : 0, "layout");
  page_bytes = (uint64_t)pb;
  uint64_t bytes = page_bytes * NPAGES;
  pool = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
              -1, 0);
  if (pool == MAP_FAILED) {
    perror("mmap pool");
    exit(1);
  }
  memset(pool, 1, bytes); /* pre-fault, as the daemon does */
  engine_config_t cfg = {.base = pool, .pool_bytes = bytes, .page_bytes = page_bytes, .max_caches = 0, .max_seqs = 0};
  if (engine_new(&cfg, &eng) != 0) {
    fprintf(stderr, "engine_new failed\n");
    exit(1);
  }
  must(engine_cache_open(eng, "llama", &lay, &cid), "cache_open");
  half = page_bytes / 2;
  src_k = malloc(half), src_v = malloc(half);
  for (uint64_t i = 0; i < half; i++) src_k[i] = (uint8_t)i, src_v[i] = (uint8_t)(i * 7);
}

/* ---- put and get per page ---------------------------------------------------------- */

#define RUN_PAGES 512 /* pages per trial: 1 GiB */

static double memcpy_in_ns(void) {
  double t[TRIALS];
  for (int r = 0; r < TRIALS; r++) {
    double t0 = now_ns();
    for (uint64_t p = 0; p < RUN_PAGES; p++) {
      memcpy(pool + p * page_bytes, src_k, half);
      memcpy(pool + p * page_bytes + half, src_v, half);
    }
    t[r] = (now_ns() - t0) / RUN_PAGES;
  }
  return median(t, TRIALS);
}

static double memcpy_out_ns(uint8_t *dk, uint8_t *dv) {
  double t[TRIALS];
  for (int r = 0; r < TRIALS; r++) {
    double t0 = now_ns();
    for (uint64_t p = 0; p < RUN_PAGES; p++) {
      memcpy(dk, pool + p * page_bytes, half);
      memcpy(dv, pool + p * page_bytes + half, half);
    }
    t[r] = (now_ns() - t0) / RUN_PAGES;
  }
  return median(t, TRIALS);
}

static double put_ns(void) {
  double t[TRIALS];
  for (int r = 0; r < TRIALS; r++) {
    (void)engine_remove(eng, cid, 1, 0, UINT64_MAX); /* NOSEQ the first time */
    double t0 = now_ns();
    for (uint64_t p = 0; p < RUN_PAGES; p++) must(put(1, p * PAGE_TOKENS, PAGE_TOKENS), "put");
    t[r] = (now_ns() - t0) / RUN_PAGES;
  }
  return median(t, TRIALS);
}

static double get_ns(uint8_t *dk, uint8_t *dv) {
  double t[TRIALS];
  engine_xfer_t x = {.layer_begin = 0, .layer_end = 0, .head_begin = 0, .head_end = 0, .dtype = KVC_DTYPE_BF16};
  for (int r = 0; r < TRIALS; r++) {
    double t0 = now_ns();
    for (uint64_t p = 0; p < RUN_PAGES; p++) {
      engine_io_t io = io_of(1, p * PAGE_TOKENS, PAGE_TOKENS, dk, dv);
      must(engine_get(eng, cid, &x, &io, 1), "get");
    }
    t[r] = (now_ns() - t0) / RUN_PAGES;
  }
  return median(t, TRIALS);
}

static void bench_put_get(void) {
  uint8_t *dk = malloc(half), *dv = malloc(half);
  double mi = memcpy_in_ns(), pu = put_ns(), mo = memcpy_out_ns(dk, dv), ge = get_ns(dk, dv);
  printf("%-34s %12.0f ns %12.0f ns %8.2fx  (%.1f GB/s)\n", "put 1 page (2 MiB) vs memcpy", pu,
         mi, mi / pu, (double)page_bytes / pu);
  printf("%-34s %12.0f ns %12.0f ns %8.2fx  (%.1f GB/s)\n", "get 1 page (2 MiB) vs memcpy", ge,
         mo, mo / ge, (double)page_bytes / ge);
  must(engine_remove(eng, cid, 1, 0, UINT64_MAX), "remove");
  free(dk);
  free(dv);
}

/* ---- copy_prefix of 32k tokens ---------------------------------------------------------- */

static void bench_copy_prefix(void) {
  for (uint64_t p = 0; p < SEQ_TOKENS / PAGE_TOKENS; p++)
    must(put(2, p * PAGE_TOKENS, PAGE_TOKENS), "put 32k");
  double t[11];
  for (int r = 0; r < 11; r++) {
    double t0 = now_ns();
    must(engine_copy_prefix(eng, cid, 2, 3, SEQ_TOKENS), "copy_prefix");
    t[r] = now_ns() - t0;
    must(engine_remove(eng, cid, 3, 0, UINT64_MAX), "drop copy");
  }
  double cp = median(t, 11);
  /* memcpy of the sequence's bytes, page by page, into a 512 MiB region */
  uint64_t npages = SEQ_TOKENS / PAGE_TOKENS, ring = 256;
  uint8_t *dst = mmap(NULL, ring * page_bytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (dst == MAP_FAILED) {
    perror("mmap");
    exit(1);
  }
  memset(dst, 0, ring * page_bytes);
  double m[3];
  for (int r = 0; r < 3; r++) {
    double t0 = now_ns();
    for (uint64_t p = 0; p < npages; p++)
      memcpy(dst + (p % ring) * page_bytes, pool + p * page_bytes, page_bytes);
    m[r] = now_ns() - t0;
  }
  double mc = median(m, 3);
  printf("%-34s %12.0f ns %12.0f ns %8.0fx  (%" PRIu64 " pages, %.1f GiB)\n",
         "copy_prefix 32k tokens vs memcpy", cp, mc, mc / cp, npages,
         (double)(npages * page_bytes) / (1u << 30));
  munmap(dst, ring * page_bytes);
  must(engine_remove(eng, cid, 2, 0, UINT64_MAX), "drop 32k");
}

/* ---- steady puts: full pool vs empty pool -------------------------------------------------- */

/* ns per put of ntok tokens into a new sequence each time, over n puts. */
static double new_seq_puts(uint64_t first_id, uint64_t n, uint64_t ntok) {
  double t0 = now_ns();
  for (uint64_t i = 0; i < n; i++) must(put(first_id + i, 0, ntok), "steady put");
  return (now_ns() - t0) / (double)n;
}

static void bench_full_vs_empty(uint64_t ntok, const char *label) {
  engine_stats_t s;
  engine_stats(eng, &s);
  uint64_t total = s.pool_pages, n = total / 2, id = 1000000;
  double e[TRIALS], f[TRIALS];
  uint64_t evicted = 0;
  for (int r = 0; r < TRIALS; r++) {
    must(engine_cache_clear(eng, cid), "clear");
    e[r] = new_seq_puts(id, n, ntok); /* the pool has room: no eviction */
    id += n;
    new_seq_puts(id, total - n, ntok); /* now full */
    id += total - n;
    engine_stats(eng, &s);
    uint64_t ev0 = s.evicted_sequences;
    f[r] = new_seq_puts(id, n, ntok); /* each put evicts the oldest */
    id += n;
    engine_stats(eng, &s);
    evicted += s.evicted_sequences - ev0;
  }
  double me = median(e, TRIALS), mf = median(f, TRIALS);
  printf("%-34s %12.0f ns %12.0f ns %8.2fx  (%.2f evictions a put)\n", label, mf, me, me / mf,
         (double)evicted / (double)(n * TRIALS));
}

static void bench_metadata(void) {
  engine_stats_t s;
  must(engine_cache_clear(eng, cid), "clear");
  engine_stats(eng, &s);
  double empty = (double)s.metadata_bytes / (double)s.pool_pages;
  for (uint64_t i = 0; i < s.pool_pages; i++) must(put(5000000 + i, 0, 1), "fill");
  engine_stats(eng, &s);
  double full = (double)s.metadata_bytes / (double)s.pool_pages;
  printf("%-34s %12.0f B  %12.0f B  %8.4f%% of a page (full)\n",
         "metadata per page: full / empty", full, empty, 100.0 * full / (double)page_bytes);
  must(engine_cache_clear(eng, cid), "clear");
  for (uint64_t p = 0; p < SEQ_TOKENS / PAGE_TOKENS; p++)
    must(put(2, p * PAGE_TOKENS, PAGE_TOKENS), "put 32k");
  engine_stats(eng, &s);
  printf("%-34s %12.0f B  %27.4f%% of a page\n", "metadata per page: one 32k seq",
         (double)s.metadata_bytes / (double)s.pool_pages,
         100.0 * (double)s.metadata_bytes / (double)s.pool_pages / (double)page_bytes);
}

int main(void) {
  double t0 = now_ns();
  setup();
  printf("engine bench: %" PRIu64 " pages of %" PRIu64 " bytes (32 layers x 8 heads x 128, "
         "bf16, 16 tokens), medians of %d\n", (uint64_t)NPAGES, page_bytes, TRIALS);
  printf("%-34s %15s %15s %9s\n", "", "engine", "reference", "ratio");
  bench_put_get();
  bench_copy_prefix();
  bench_full_vs_empty(PAGE_TOKENS, "put 1 page: full pool vs empty");
  bench_full_vs_empty(1, "put 1 token: full pool vs empty");
  bench_metadata();
  printf("(ratio = reference time / engine time; %.1f s in all)\n", (now_ns() - t0) / 1e9);
  engine_free(eng);
  munmap(pool, page_bytes * NPAGES);
  free(src_k);
  free(src_v);
  return 0;
}
