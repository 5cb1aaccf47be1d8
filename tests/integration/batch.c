/* batch.c: batched put/get of 64 sequences in one request for every dtype,
 * int8 raw and dequantized reads, split transfers, single-token and per-head
 * reads, and the direct-buffer form. */
#include <math.h>

#include "harness.h"

#define NSEQ 64

static uint64_t rng = 88172645463325252ull;
static uint64_t next_rand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static size_t dtype_bytes(kvc_dtype_t d) {
  return d == KVC_DTYPE_F64 ? 8 : d == KVC_DTYPE_F32 ? 4 : d == KVC_DTYPE_F16 || d == KVC_DTYPE_BF16 ? 2 : 1;
}

/* Random bits that are a finite value of dtype (no NaN or inf patterns;
 * fp8: any byte, NaN codes too, as a cache of that dtype stores bytes as
 * given). */
static void fill_random(void *buf, size_t nelem, kvc_dtype_t d) {
  for (size_t i = 0; i < nelem; i++) {
    uint64_t r = next_rand();
    switch (d) {
    case KVC_DTYPE_F64:
      if (((r >> 52) & 0x7ff) == 0x7ff) r ^= 1ull << 52;
      ((uint64_t *)buf)[i] = r;
      break;
    case KVC_DTYPE_F32: {
      uint32_t x = (uint32_t)r;
      if (((x >> 23) & 0xff) == 0xff) x ^= 1u << 23;
      ((uint32_t *)buf)[i] = x;
      break;
    }
    case KVC_DTYPE_F16: {
      uint16_t x = (uint16_t)r;
      if (((x >> 10) & 0x1f) == 0x1f) x ^= 1u << 10;
      ((uint16_t *)buf)[i] = x;
      break;
    }
    case KVC_DTYPE_BF16: {
      uint16_t x = (uint16_t)r;
      if (((x >> 7) & 0xff) == 0xff) x ^= 1u << 7;
      ((uint16_t *)buf)[i] = x;
      break;
    }
    case KVC_DTYPE_INT8: break;
    case KVC_DTYPE_FP8_E4M3:
    case KVC_DTYPE_FP8_E5M2: ((uint8_t *)buf)[i] = (uint8_t)r; break;
    case KVC_DTYPE_Q8_0: /* blocks, as bytes: not this helper's */
    case KVC_DTYPE_Q4_0: break;
    }
  }
}

static kvc_layout_t batch_layout(kvc_dtype_t d) {
  kvc_layout_t l = {.num_layers = 4, .num_kv_heads = 2, .head_dim_k = 16, .head_dim_v = 8,
                    .dtype = d, .page_tokens = 8};
  return l;
}

/* K and V buffers of every entry, and room to read them back. */
typedef struct bufs {
  kvc_io_t io[NSEQ], back[NSEQ];
  uint64_t kb[NSEQ], vb[NSEQ];
} bufs_t;

static void alloc_entries(kvc_cache_t *h, bufs_t *b, const uint64_t *pos, const uint64_t *n,
                          kvc_dtype_t d) {
  for (int i = 0; i < NSEQ; i++) {
    ASSERT_OK(kvc_xfer_bytes(h, NULL, true, n[i], &b->kb[i], &b->vb[i], NULL));
    b->io[i] = (kvc_io_t){.seq_id = 500u + (unsigned)i, .pos = pos[i], .ntokens = n[i],
                          .k = malloc(b->kb[i]), .v = malloc(b->vb[i])};
    fill_random(b->io[i].k, b->kb[i] / dtype_bytes(d), d);
    fill_random(b->io[i].v, b->vb[i] / dtype_bytes(d), d);
    b->back[i] = b->io[i];
    b->back[i].k = calloc(1, b->kb[i]);
    b->back[i].v = calloc(1, b->vb[i]);
  }
}

static void free_entries(bufs_t *b) {
  for (int i = 0; i < NSEQ; i++) {
    free(b->io[i].k), free(b->io[i].v), free(b->back[i].k), free(b->back[i].v);
  }
}

static void round_trip(kvc_client_t *c, kvc_cache_t *h, kvc_dtype_t d, const uint64_t *pos,
                       const uint64_t *n) {
  bufs_t b;
  alloc_entries(h, &b, pos, n, d);
  uint64_t puts = stat_get(c, "requests_total{op=put}", NULL), gets = stat_get(c, "requests_total{op=get}", NULL);
  ASSERT_OK(kvc_put_batch(h, NULL, b.io, NSEQ));
  ASSERT_OK(kvc_get_batch(h, NULL, b.back, NSEQ));
  ASSERT_U64_EQ(stat_get(c, "requests_total{op=put}", NULL), puts + 1); /* one request each */
  ASSERT_U64_EQ(stat_get(c, "requests_total{op=get}", NULL), gets + 1);
  for (int i = 0; i < NSEQ; i++) {
    ASSERT_MEM_EQ(b.back[i].k, b.io[i].k, b.kb[i]);
    ASSERT_MEM_EQ(b.back[i].v, b.io[i].v, b.vb[i]);
  }
  free_entries(&b);
}

TEST(batch_64_sequences_bit_exact_every_dtype) {
  static const kvc_dtype_t dtypes[] = {KVC_DTYPE_F32, KVC_DTYPE_F64, KVC_DTYPE_F16,
                                       KVC_DTYPE_BF16, KVC_DTYPE_FP8_E4M3, KVC_DTYPE_FP8_E5M2};
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  for (size_t t = 0; t < sizeof dtypes / sizeof dtypes[0]; t++) {
    kvc_layout_t l = batch_layout(dtypes[t]);
    kvc_cache_t *h;
    char name[16];
    snprintf(name, sizeof name, "dtype%d", (int)dtypes[t]);
    ASSERT_OK(kvc_cache_open(c, name, &l, &h));
    /* Prefill: ragged lengths 1..20; then one decode step of 1 token each. */
    uint64_t pos[NSEQ], n[NSEQ], total = 0;
    for (int i = 0; i < NSEQ; i++) pos[i] = 0, n[i] = 1 + (uint64_t)(i * 7 % 20), total += n[i];
    round_trip(c, h, dtypes[t], pos, n);
    for (int i = 0; i < NSEQ; i++) pos[i] = n[i], n[i] = 1;
    round_trip(c, h, dtypes[t], pos, n);
    ASSERT_U64_EQ(stat_get(c, "sequences", name), NSEQ);
    ASSERT_U64_EQ(stat_get(c, "tokens", name), total + NSEQ);
    ASSERT_OK(kvc_cache_drop(h));
    kvc_cache_close(h);
  }
  ASSERT_U64_EQ(stat_get(c, "sequences", NULL), 0);
  ASSERT_U64_EQ(stat_get(c, "pages_used", NULL), 0);
  ASSERT_U64_EQ(stat_get(c, "request_errors_total{op=put}", NULL), 0);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* Rows of int8-exact values: q * 2^-e with one |q| = 127 per row, so the
 * scale is exactly 2^-e and quantizing loses nothing. */
static void fill_exact(float *x, float *scale, size_t rows, size_t dim) {
  for (size_t r = 0; r < rows; r++) {
    float s = ldexpf(1.0f, -(int)(next_rand() % 7));
    scale[r] = s;
    for (size_t j = 0; j < dim; j++) {
      int q = (int)(next_rand() % 255) - 127;
      if (j == r % dim) q = (next_rand() & 1) ? 127 : -127;
      x[r * dim + j] = (float)q * s;
    }
  }
}

TEST(batch_int8_raw_exact_and_dequantized) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  kvc_layout_t l = batch_layout(KVC_DTYPE_INT8);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "q8", &l, &h));
  size_t L = 4, H = 2, dk = 16, dv = 8;
  kvc_io_t io[NSEQ], back[NSEQ];
  float *ks[NSEQ], *vs[NSEQ];
  for (int i = 0; i < NSEQ; i++) {
    uint64_t n = 1 + (uint64_t)i % 9, rows = L * n * H;
    ks[i] = malloc(rows * 4), vs[i] = malloc(rows * 4);
    io[i] = (kvc_io_t){.seq_id = (uint64_t)i, .ntokens = n, .k = malloc(rows * dk * 4),
                       .v = malloc(rows * dv * 4)};
    fill_exact(io[i].k, ks[i], rows, dk);
    fill_exact(io[i].v, vs[i], rows, dv);
    back[i] = io[i];
    back[i].k = calloc(rows * dk, 4), back[i].v = calloc(rows * dv, 4);
  }
  uint64_t puts = stat_get(c, "requests_total{op=put}", NULL);
  ASSERT_OK(kvc_put_batch(h, NULL, io, NSEQ));
  ASSERT_U64_EQ(stat_get(c, "requests_total{op=put}", NULL), puts + 1);
  ASSERT_OK(kvc_get_batch(h, NULL, back, NSEQ)); /* dequantized f32 */
  for (int i = 0; i < NSEQ; i++) {
    uint64_t rows = L * io[i].ntokens * H;
    ASSERT_MEM_EQ(back[i].k, io[i].k, rows * dk * 4);
    ASSERT_MEM_EQ(back[i].v, io[i].v, rows * dv * 4);
    /* Raw: the stored bytes are q, the scales 2^-e. */
    int8_t *rk = malloc(rows * dk), *rv = malloc(rows * dv);
    float *sk = malloc(rows * 4), *sv = malloc(rows * 4);
    ASSERT_OK(kvc_get_raw(h, io[i].seq_id, 0, io[i].ntokens, NULL, rk, rv, sk, sv));
    ASSERT_MEM_EQ(sk, ks[i], rows * 4);
    ASSERT_MEM_EQ(sv, vs[i], rows * 4);
    for (uint64_t j = 0; j < rows * dk; j++)
      ASSERT_EQ(rk[j], (int)(((float *)io[i].k)[j] / ks[i][j / dk]));
    for (uint64_t j = 0; j < rows * dv; j++)
      ASSERT_EQ(rv[j], (int)(((float *)io[i].v)[j] / vs[i][j / dv]));
    free(rk), free(rv), free(sk), free(sv);
  }
  /* Arbitrary values: dequantized within half a step of their row's scale. */
  uint64_t rows = L * 5 * H;
  float *k = malloc(rows * dk * 4), *v = malloc(rows * dv * 4);
  float *gk = malloc(rows * dk * 4), *gv = malloc(rows * dv * 4);
  float *sk = malloc(rows * 4), *sv = malloc(rows * 4);
  int8_t *rk = malloc(rows * dk), *rv = malloc(rows * dv);
  for (uint64_t j = 0; j < rows * dk; j++) k[j] = (float)((int64_t)(next_rand() % 20001) - 10000) / 777.0f;
  for (uint64_t j = 0; j < rows * dv; j++) v[j] = (float)((int64_t)(next_rand() % 20001) - 10000) / 333.0f;
  ASSERT_OK(kvc_put(h, 1000, 0, 5, k, v));
  ASSERT_OK(kvc_get(h, 1000, 0, 5, gk, gv));
  ASSERT_OK(kvc_get_raw(h, 1000, 0, 5, NULL, rk, rv, sk, sv));
  for (uint64_t j = 0; j < rows * dk; j++) {
    ASSERT(fabsf(gk[j] - k[j]) <= sk[j / dk] * 0.5f * 1.0001f);
    ASSERT(gk[j] == (float)rk[j] * sk[j / dk]);
  }
  for (uint64_t j = 0; j < rows * dv; j++) ASSERT(fabsf(gv[j] - v[j]) <= sv[j / dv] * 0.5f * 1.0001f);
  free(k), free(v), free(gk), free(gv), free(sk), free(sv), free(rk), free(rv);
  for (int i = 0; i < NSEQ; i++) {
    free(io[i].k), free(io[i].v), free(back[i].k), free(back[i].v), free(ks[i]), free(vs[i]);
  }
  ASSERT_U64_EQ(stat_get(c, "sequences", "q8"), NSEQ + 1);
  kvc_client_close(c);
  daemon_stop(&d);
}

TEST(batch_split_transfers_token_head_reads_and_shm_form) {
  static const char *const big[] = {"--pool-bytes", "32MiB", NULL};
  daemon_t d;
  daemon_start_args(&d, big);
  kvc_client_t *c = client_open_shm(&d, 1 << 20); /* a 1 MiB buffer forces splits */
  kvc_layout_t l = batch_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "split", &l, &h));
  const uint64_t T = 2048; /* 768 bytes a token: 1.5 MiB */
  size_t L = 4, H = 2, dk = 16, dv = 8, rk = H * dk, rv = H * dv;
  float *k = malloc(L * T * rk * 4), *v = malloc(L * T * rv * 4);
  fill_random(k, L * T * rk, KVC_DTYPE_F32);
  fill_random(v, L * T * rv, KVC_DTYPE_F32);
  uint64_t puts = stat_get(c, "requests_total{op=put}", NULL);
  ASSERT_OK(kvc_put(h, 9, 0, T, k, v));
  ASSERT(stat_get(c, "requests_total{op=put}", NULL) >= puts + 2);
  float *gk = calloc(L * T * rk, 4), *gv = calloc(L * T * rv, 4);
  ASSERT_OK(kvc_get(h, 9, 0, T, gk, gv));
  ASSERT_MEM_EQ(gk, k, L * T * rk * 4);
  ASSERT_MEM_EQ(gv, v, L * T * rv * 4);

  /* A batch of 4 x 600 tokens (4 x 450 KiB): split by entries and tokens,
   * every entry still round-trips. */
  kvc_io_t many[4], many_back[4];
  for (int i = 0; i < 4; i++) {
    many[i] = (kvc_io_t){.seq_id = 20u + (unsigned)i, .ntokens = 600,
                         .k = malloc(L * 600 * rk * 4), .v = malloc(L * 600 * rv * 4)};
    fill_random(many[i].k, L * 600 * rk, KVC_DTYPE_F32);
    fill_random(many[i].v, L * 600 * rv, KVC_DTYPE_F32);
    many_back[i] = many[i];
    many_back[i].k = calloc(L * 600 * rk, 4), many_back[i].v = calloc(L * 600 * rv, 4);
  }
  puts = stat_get(c, "requests_total{op=put}", NULL);
  ASSERT_OK(kvc_put_batch(h, NULL, many, 4));
  ASSERT_U64_EQ(stat_get(c, "requests_total{op=put}", NULL), puts + 2); /* 1364 + 1036 tokens */
  ASSERT_OK(kvc_get_batch(h, NULL, many_back, 4));
  for (int i = 0; i < 4; i++) {
    ASSERT_MEM_EQ(many_back[i].k, many[i].k, L * 600 * rk * 4);
    ASSERT_MEM_EQ(many_back[i].v, many[i].v, L * 600 * rv * 4);
    free(many[i].k), free(many[i].v), free(many_back[i].k), free(many_back[i].v);
  }

  /* One token of layers 1..3; one head of one layer over a range. */
  kvc_xfer_t x = {.layer_begin = 1, .layer_end = 3};
  ASSERT_OK(kvc_get_token(h, 9, 1000, &x, gk, gv));
  for (size_t layer = 1; layer < 3; layer++) {
    ASSERT_MEM_EQ(gk + (layer - 1) * rk, k + (layer * T + 1000) * rk, rk * 4);
    ASSERT_MEM_EQ(gv + (layer - 1) * rv, v + (layer * T + 1000) * rv, rv * 4);
  }
  ASSERT_OK(kvc_get_head(h, 9, 2, 1, 100, 300, gk, NULL));
  for (size_t t = 100; t < 300; t++)
    ASSERT_MEM_EQ(gk + (t - 100) * dk, k + (2 * T + t) * rk + dk, dk * 4);

  /* Direct buffer: fill it, put from it, get into another region of it. */
  void *shm;
  uint64_t shm_bytes, kb, vb;
  kvc_client_shm(c, &shm, &shm_bytes);
  ASSERT_U64_EQ(shm_bytes, 1 << 20);
  ASSERT_OK(kvc_xfer_bytes(h, NULL, true, 3, &kb, &vb, NULL));
  fill_random(shm, (kb + vb) / 4, KVC_DTYPE_F32);
  kvc_shm_io_t in = {.seq_id = 77, .ntokens = 3, .k_off = 0, .v_off = kb};
  kvc_shm_io_t out = {.seq_id = 77, .ntokens = 3, .k_off = 65536, .v_off = 65536 + kb};
  ASSERT_OK(kvc_put_shm(h, NULL, &in, 1));
  ASSERT_OK(kvc_get_shm(h, NULL, &out, 1));
  ASSERT_MEM_EQ((uint8_t *)shm + 65536, shm, kb + vb);
  ASSERT_U64_EQ(stat_get(c, "tokens", "split"), T + 4 * 600 + 3);
  free(k), free(v), free(gk), free(gv);
  kvc_client_close(c);
  daemon_stop(&d);
}
