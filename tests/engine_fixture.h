/* engine_fixture.h: one engine over a test pool, deterministic K/V payloads
 * and checks that say which element differs, shared by the engine unit tests.
 *
 * Every helper is static inline so each test binary takes only what it uses.
 * Payload element (seq, layer, pos, head, dim, K or V, salt) has one f32
 * value: a test writes with a salt and later expects the same salt back, so
 * an overwrite or a copy shows up as a different (seq, salt) pair.
 */
#ifndef KVC_ENGINE_FIXTURE_H
#define KVC_ENGINE_FIXTURE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "test.h"

typedef struct fx {
  engine_t *eng;
  void *base;          /* pool bytes, 4096-aligned */
  uint64_t page_bytes; /* pool page */
  uint64_t npages;     /* pool pages */
  kvc_layout_t lay;    /* layout of cache cid */
  uint32_t cid;        /* the cache opened by fx_open ("main") */
} fx_t;

/* A transfer's resolved ranges: layers [lb, le), heads [hb, he). */
typedef struct fx_rng {
  uint32_t lb, le, hb, he;
} fx_rng_t;

static inline kvc_layout_t fx_layout(uint32_t nl, uint32_t nh, uint32_t dk, uint32_t dv,
                                     kvc_dtype_t dt, uint32_t pt) {
  kvc_layout_t l = {nl, nh, dk, dv, dt, pt};
  return l;
}

/* The layout most tests use: 4 layers, 2 heads, K dim 8, V dim 4, f32, 4 tokens
 * a page (1536 bytes a page, a multiple of 64). */
static inline kvc_layout_t fx_small_layout(void) {
  return fx_layout(4, 2, 8, 4, KVC_DTYPE_F32, 4);
}

static inline void fx_audit_(engine_t *eng, const char *file, int line) {
  char why[256] = "";
  int r = engine_audit(eng, why, sizeof why);
  if (r != 0) {
    fprintf(stderr, "%s:%d: ", file, line);
    TEST_FAIL_("engine_audit: %d (%s): %s", r, kvc_err_name(r), why);
  }
}
#define FX_AUDIT(eng) fx_audit_((eng), __FILE__, __LINE__)

static inline uint64_t fx_round_up(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

static inline void *fx_pool_alloc(uint64_t bytes) {
  void *p = aligned_alloc(4096, fx_round_up(bytes ? bytes : 1, 4096));
  if (!p) TEST_FAIL_("aligned_alloc(%" PRIu64 ") failed", bytes);
  memset(p, 0xA5, fx_round_up(bytes ? bytes : 1, 4096));
  return p;
}

/* An engine with npages pool pages of page_bytes (0: the layout's page
 * rounded up to 64) and max_seqs, no cache. */
static inline void fx_engine(fx_t *f, uint64_t page_bytes, uint64_t npages, uint64_t max_seqs) {
  memset(f, 0, sizeof *f);
  f->page_bytes = page_bytes;
  f->npages = npages;
  f->base = fx_pool_alloc(page_bytes * npages);
  /* A segment of one page: every tenant and page size takes pages one at a
   * time, as from one pool (src/pool.h). */
  engine_config_t cfg = {.base = f->base, .pool_bytes = page_bytes * npages, .page_bytes = page_bytes, .segment_bytes = page_bytes, .max_caches = 0, .max_seqs = max_seqs};
  int r = engine_new(&cfg, &f->eng);
  if (r != 0) TEST_FAIL_("engine_new: %s", kvc_err_name(r));
  engine_set_now(f->eng, 1);
}

/* An engine sized for lay with npages pages, and cache "main" of lay. */
static inline void fx_open(fx_t *f, const kvc_layout_t *lay, uint64_t npages) {
  int64_t pb = engine_layout_page_bytes(lay);
  if (pb <= 0) TEST_FAIL_("engine_layout_page_bytes: %s", kvc_err_name((int)pb));
  fx_engine(f, fx_round_up((uint64_t)pb, 64), npages, 0);
  f->lay = *lay;
  if (f->lay.page_tokens == 0) f->lay.page_tokens = KVC_DEFAULT_PAGE_TOKENS;
  int r = engine_cache_open(f->eng, "main", lay, &f->cid);
  if (r != 0) TEST_FAIL_("engine_cache_open: %s", kvc_err_name(r));
}

/* Audits, then frees everything. Every test ends here. */
static inline void fx_close(fx_t *f) {
  FX_AUDIT(f->eng);
  engine_free(f->eng);
  free(f->base);
  f->eng = NULL;
  f->base = NULL;
}

static inline fx_rng_t fx_rng(const kvc_layout_t *l, uint32_t lb, uint32_t le, uint32_t hb,
                              uint32_t he) {
  fx_rng_t r = {lb, le ? le : l->num_layers, hb, he ? he : l->num_kv_heads};
  return r;
}

static inline fx_rng_t fx_all(const kvc_layout_t *l) { return fx_rng(l, 0, 0, 0, 0); }

/* Elements of K (is_v 0) or V of ntokens over r. */
static inline uint64_t fx_elems(const kvc_layout_t *l, fx_rng_t r, uint64_t ntokens, int is_v) {
  uint64_t dim = is_v ? l->head_dim_v : l->head_dim_k;
  return (uint64_t)(r.le - r.lb) * ntokens * (r.he - r.hb) * dim;
}

static inline uint64_t fx_mix(uint64_t x) {
  x ^= x >> 31;
  x *= 0x9e3779b97f4a7c15ull;
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 32;
  return x;
}

/* The payload value of one element: a multiple of 1/64 in [-512, 512), so
 * exact in f32 and distinct enough that a misplaced element shows. */
static inline float fx_val(uint64_t seq, uint32_t layer, uint64_t pos, uint32_t head, uint32_t d,
                           int is_v, uint32_t salt) {
  uint64_t h = fx_mix(seq * 0x100000001b3ull ^ fx_mix(pos + ((uint64_t)layer << 40)) ^
                      fx_mix(((uint64_t)head << 32 | d) + ((uint64_t)is_v << 60) + salt));
  return (float)((int64_t)(h % 65536) - 32768) / 64.0f;
}

/* Fills k and v ([layer][token][head][dim] over r) with seq's payload. */
static inline void fx_fill(const kvc_layout_t *l, fx_rng_t r, uint64_t seq, uint64_t pos,
                           uint64_t n, uint32_t salt, float *k, float *v) {
  for (int is_v = 0; is_v < 2; is_v++) {
    uint32_t dim = is_v ? l->head_dim_v : l->head_dim_k;
    float *out = is_v ? v : k;
    size_t i = 0;
    for (uint32_t ly = r.lb; ly < r.le; ly++)
      for (uint64_t t = 0; t < n; t++)
        for (uint32_t h = r.hb; h < r.he; h++)
          for (uint32_t d = 0; d < dim; d++)
            out[i++] = fx_val(seq, ly, pos + t, h, d, is_v, salt);
  }
}

typedef struct fx_buf {
  float *k, *v;
  uint64_t kb, vb; /* bytes */
} fx_buf_t;

static inline fx_buf_t fx_buf_new(const kvc_layout_t *l, fx_rng_t r, uint64_t n) {
  fx_buf_t b;
  b.kb = fx_elems(l, r, n, 0) * sizeof(float);
  b.vb = fx_elems(l, r, n, 1) * sizeof(float);
  b.k = calloc(1, b.kb + 4);
  b.v = calloc(1, b.vb + 4);
  if (!b.k || !b.v) TEST_FAIL_("calloc");
  return b;
}

static inline void fx_buf_free(fx_buf_t *b) {
  free(b->k);
  free(b->v);
  b->k = b->v = NULL;
}

static inline engine_io_t fx_io(uint64_t seq, uint64_t pos, uint64_t n, fx_buf_t *b) {
  engine_io_t io;
  memset(&io, 0, sizeof io);
  io.seq_id = seq;
  io.pos = pos;
  io.ntokens = n;
  io.k = b->k;
  io.v = b->v;
  io.k_bytes = b->kb;
  io.v_bytes = b->vb;
  return io;
}

static inline engine_xfer_t fx_xfer(fx_rng_t r, kvc_dtype_t dt) {
  engine_xfer_t x = {.layer_begin = r.lb, .layer_end = r.le, .head_begin = r.hb, .head_end = r.he, .dtype = dt};
  return x;
}

/* Puts tokens [pos, pos+n) of seq for layers [lb, le) (le 0: all) in f32. */
static inline int fx_put_layers(fx_t *f, uint64_t seq, uint64_t pos, uint64_t n, uint32_t lb,
                                uint32_t le, uint32_t salt) {
  fx_rng_t r = fx_rng(&f->lay, lb, le, 0, 0);
  fx_buf_t b = fx_buf_new(&f->lay, r, n);
  fx_fill(&f->lay, r, seq, pos, n, salt, b.k, b.v);
  engine_io_t io = fx_io(seq, pos, n, &b);
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  int rc = engine_put(f->eng, f->cid, &x, &io, 1);
  fx_buf_free(&b);
  return rc;
}

static inline int fx_put(fx_t *f, uint64_t seq, uint64_t pos, uint64_t n, uint32_t salt) {
  return fx_put_layers(f, seq, pos, n, 0, 0, salt);
}

/* Reads [pos, pos+n) of seq over r in f32 and returns the engine's code. */
static inline int fx_get_rc(fx_t *f, uint64_t seq, uint64_t pos, uint64_t n, fx_rng_t r) {
  /* a huge n gets a one-token buffer with the byte counts n would need (or
   * any count if those overflow): the call must fail before touching it */
  uint64_t alloc_n = n == 0 || n > (1u << 20) ? 1 : n;
  fx_buf_t b = fx_buf_new(&f->lay, r, alloc_n);
  engine_io_t io = fx_io(seq, pos, n, &b);
  if (n == 0) io.k_bytes = io.v_bytes = 0;
  if (alloc_n != n && n != 0) {
    uint64_t ke = fx_elems(&f->lay, r, 1, 0) * sizeof(float), ve = ke / f->lay.head_dim_k * f->lay.head_dim_v;
    if (__builtin_mul_overflow(ke, n, &io.k_bytes)) io.k_bytes = b.kb;
    if (__builtin_mul_overflow(ve, n, &io.v_bytes)) io.v_bytes = b.vb;
  }
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  int rc = engine_get(f->eng, f->cid, &x, &io, 1);
  fx_buf_free(&b);
  return rc;
}

static inline void fx_cmp_(const kvc_layout_t *l, fx_rng_t r, uint64_t n, const float *got,
                           const float *want, int is_v, uint64_t pos, const char *file,
                           int line) {
  uint64_t total = fx_elems(l, r, n, is_v);
  uint32_t dim = is_v ? l->head_dim_v : l->head_dim_k;
  for (uint64_t i = 0; i < total; i++) {
    if (memcmp(&got[i], &want[i], sizeof(float)) == 0) continue;
    uint64_t d = i % dim, h = i / dim % (r.he - r.hb), t = i / dim / (r.he - r.hb) % n;
    uint64_t ly = i / dim / (r.he - r.hb) / n;
    fprintf(stderr, "%s:%d: ", file, line);
    TEST_FAIL_("%c differs at layer %" PRIu64 " pos %" PRIu64 " head %" PRIu64 " dim %" PRIu64
               ": expected %g, got %g",
               is_v ? 'V' : 'K', r.lb + ly, pos + t, r.hb + h, d, (double)want[i],
               (double)got[i]);
  }
}

/* Reads [pos, pos+n) of seq over r and checks it holds vseq's payload of
 * salt at the same positions. */
static inline void fx_expect_rng_(fx_t *f, uint64_t seq, uint64_t pos, uint64_t n, fx_rng_t r,
                                  uint64_t vseq, uint32_t salt, const char *file, int line) {
  fx_buf_t got = fx_buf_new(&f->lay, r, n), want = fx_buf_new(&f->lay, r, n);
  engine_io_t io = fx_io(seq, pos, n, &got);
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  int rc = engine_get(f->eng, f->cid, &x, &io, 1);
  if (rc != 0) {
    fprintf(stderr, "%s:%d: ", file, line);
    TEST_FAIL_("get seq %" PRIu64 " [%" PRIu64 ", +%" PRIu64 "): %s (%s)", seq, pos, n,
               kvc_err_name(rc), engine_last_error(f->eng)->msg);
  }
  fx_fill(&f->lay, r, vseq, pos, n, salt, want.k, want.v);
  fx_cmp_(&f->lay, r, n, got.k, want.k, 0, pos, file, line);
  fx_cmp_(&f->lay, r, n, got.v, want.v, 1, pos, file, line);
  fx_buf_free(&got);
  fx_buf_free(&want);
}
#define FX_EXPECT_RNG(f, seq, pos, n, r, vseq, salt)                           \
  fx_expect_rng_((f), (seq), (pos), (n), (r), (vseq), (salt), __FILE__, __LINE__)
/* Every layer and head of [pos, pos+n) of seq holds seq's payload of salt. */
#define FX_EXPECT(f, seq, pos, n, salt)                                        \
  fx_expect_rng_((f), (seq), (pos), (n), fx_all(&(f)->lay), (seq), (salt), __FILE__, __LINE__)

static inline kvc_seq_info_t fx_info_(fx_t *f, uint64_t seq, const char *file, int line) {
  kvc_seq_info_t si;
  memset(&si, 0, sizeof si);
  int rc = engine_seq_info(f->eng, f->cid, seq, &si);
  if (rc != 0) {
    fprintf(stderr, "%s:%d: ", file, line);
    TEST_FAIL_("seq_info %" PRIu64 ": %s", seq, kvc_err_name(rc));
  }
  return si;
}
#define FX_INFO(f, seq) fx_info_((f), (seq), __FILE__, __LINE__)

static inline engine_stats_t fx_stats(fx_t *f) {
  engine_stats_t s;
  engine_stats(f->eng, &s);
  return s;
}

/* Every figure of a and b is equal, except the error counters (a failing
 * call moves those and nothing else). */
static inline void fx_stats_same_(const engine_stats_t *a, const engine_stats_t *b,
                                  bool metadata, const char *file, int line) {
#define FX_CMP_STAT_(name, kind, unit, help)                                         \
  if (strcmp(#name, "errors") != 0 && strcmp(#name, "full_errors") != 0 &&     \
      (metadata || strcmp(#name, "metadata_bytes") != 0) && a->name != b->name) { \
    fprintf(stderr, "%s:%d: ", file, line);                                    \
    TEST_FAIL_("stat %s changed: %" PRIu64 " -> %" PRIu64, #name, a->name, b->name); \
  }
  ENGINE_STATS(FX_CMP_STAT_)
#undef FX_CMP_STAT_
}
#define FX_STATS_SAME(a, b) fx_stats_same_((a), (b), true, __FILE__, __LINE__)
/* The same, but heap bytes may differ: for tests about something else, so
 * that a kept allocation fails only the test named after it. */
#define FX_STATS_SAME_BUT_HEAP(a, b) fx_stats_same_((a), (b), false, __FILE__, __LINE__)

#endif
