/* hard_reuse.c: a page evicted from one sequence and reused by another never
 * shows the old bytes to a reader of the new one. A small pool is filled with
 * recognizable bytes (every byte 0xA5), then sequences of three caches (the
 * same layout, f16 with smaller pages, int8 with scales) take its pages by
 * eviction, each writing less than a page. Each reads back exactly what it
 * wrote, and every read past what was written (tokens past the length, a
 * layer past its written length, a range before a trimmed start, a copied
 * prefix's end) fails with RANGE and leaves the caller's buffers untouched,
 * and a lease (read in place) covers exactly the written tokens: no path of
 * the API returns a stale byte. */
#include "hard.h"

#define POOL_PAGES 64
#define OLD 0xA5   /* every byte the first owners wrote */
#define SENT 0x5C  /* what the reader's buffers hold before a read */
#define MAXTOK 40

typedef struct kind {
  const char *name;
  kvc_layout_t lay;
  size_t tok_bytes; /* K (= V) bytes of one token, every layer, as put and got */
} kind_t;

static kind_t kinds[3];

static void kinds_init(void) {
  kinds[0] = (kind_t){"same", it_layout(KVC_DTYPE_F32), 0};
  kinds[1] = (kind_t){"half", it_layout(KVC_DTYPE_F16), 0};
  kinds[2] = (kind_t){"int8", it_layout(KVC_DTYPE_INT8), 0};
  for (int i = 0; i < 3; i++) {
    kvc_layout_t *l = &kinds[i].lay;
    size_t elem = l->dtype == KVC_DTYPE_F16 ? 2 : 4; /* int8 puts and gets f32 */
    kinds[i].tok_bytes = (size_t)l->num_layers * l->num_kv_heads * l->head_dim_k * elem;
  }
}

/* The bytes a new owner writes: f32 values that int8 stores exactly (per
 * token and head the absmax is 127 * 0.5, so the scale is 0.5 and every
 * value a multiple of it), or f16 bit patterns; never the OLD byte pattern. */
static void fill_new(const kind_t *kd, uint64_t seq, uint64_t pos, uint64_t n, uint32_t layers,
                     uint8_t *k, uint8_t *v) {
  const kvc_layout_t *l = &kd->lay;
  size_t per_tok = (size_t)l->num_kv_heads * l->head_dim_k, i = 0;
  for (uint32_t layer = 0; layer < layers; layer++)
    for (uint64_t t = 0; t < n; t++)
      for (size_t e = 0; e < per_tok; e++, i++) {
        uint32_t d = (uint32_t)(e % l->head_dim_k);
        uint32_t mix = (uint32_t)(seq * 131 + (pos + t) * 17 + layer * 7 + e);
        if (l->dtype == KVC_DTYPE_F16) {
          uint16_t hk = (uint16_t)(0x3000 + mix % 0x0800), hv = (uint16_t)(0xB000 + mix % 0x0800);
          memcpy(k + i * 2, &hk, 2);
          memcpy(v + i * 2, &hv, 2);
        } else {
          int q = d == 0 ? -127 : (int)(mix % 200) - 100;
          if (q == 0) q = 1; /* -0.0 would come back as 0.0 from int8 */
          float fk = (float)q * 0.5f, fv = -(float)q * 0.5f;
          memcpy(k + i * 4, &fk, 4);
          memcpy(v + i * 4, &fv, 4);
        }
      }
}

static bool all_bytes(const uint8_t *p, size_t n, uint8_t b) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != b) return false;
  return true;
}

static uint8_t gk[2 * MAXTOK * 1024], gv[2 * MAXTOK * 1024];

/* A read that must fail with RANGE and write nothing. */
#define EXPECT_RANGE_UNTOUCHED(call)                                           \
  do {                                                                         \
    memset(gk, SENT, sizeof gk);                                               \
    memset(gv, SENT, sizeof gv);                                               \
    ASSERT_ERR(call, KVC_E_RANGE);                                             \
    ASSERT(all_bytes(gk, sizeof gk, SENT) && all_bytes(gv, sizeof gv, SENT));  \
  } while (0)

/* Reads [0, n) whole and checks it byte for byte, and that nothing past it
 * in the caller's buffers was written. */
static void read_exact(kvc_cache_t *h, const kind_t *kd, uint64_t seq, uint64_t n,
                       const uint8_t *k, const uint8_t *v) {
  memset(gk, SENT, sizeof gk);
  memset(gv, SENT, sizeof gv);
  ASSERT_OK(kvc_get(h, seq, 0, n, gk, gv));
  size_t bytes = kd->tok_bytes * n;
  ASSERT_MEM_EQ(gk, k, bytes);
  ASSERT_MEM_EQ(gv, v, bytes);
  ASSERT(all_bytes(gk + bytes, sizeof gk - bytes, SENT));
  ASSERT(all_bytes(gv + bytes, sizeof gv - bytes, SENT));
  if (kd->lay.dtype == KVC_DTYPE_INT8) return; /* stored quantized: a lease reads int8 */
  /* In place under a lease: the same bytes, and nothing past n. */
  kvc_lease_t *ls;
  ASSERT_OK(kvc_lease(h, seq, 0, n, &ls));
  size_t row = kd->tok_bytes / kd->lay.num_layers;
  for (uint32_t layer = 0; layer < kd->lay.num_layers; layer++)
    for (uint64_t t = 0; t < n; t++) {
      ASSERT_MEM_EQ(kvc_lease_k(ls, layer, t), k + (layer * n + t) * row, row);
      ASSERT_MEM_EQ(kvc_lease_v(ls, layer, t), v + (layer * n + t) * row, row);
    }
  ASSERT(kvc_lease_k(ls, 0, n) == NULL && kvc_lease_v(ls, 1, n) == NULL);
  ASSERT_OK(kvc_lease_release(ls));
}

/* Every way of reading past what seq holds ([start, n)): RANGE, nothing written. */
static void reads_past_fail(kvc_client_t *c, kvc_cache_t *h, const kind_t *kd, uint64_t seq,
                            uint64_t start, uint64_t n) {
  uint64_t page_end = (n / kd->lay.page_tokens + 1) * kd->lay.page_tokens;
  EXPECT_RANGE_UNTOUCHED(kvc_get(h, seq, start, n + 1, gk, gv));
  EXPECT_RANGE_UNTOUCHED(kvc_get(h, seq, n, n + 1, gk, gv));
  EXPECT_RANGE_UNTOUCHED(kvc_get(h, seq, start, page_end, gk, gv));
  EXPECT_RANGE_UNTOUCHED(kvc_get(h, seq, page_end - 1, page_end, gk, gv));
  EXPECT_RANGE_UNTOUCHED(kvc_get_token(h, seq, n, NULL, gk, gv));
  EXPECT_RANGE_UNTOUCHED(kvc_get_token(h, seq, page_end - 1, NULL, gk, gv));
  EXPECT_RANGE_UNTOUCHED(kvc_get_head(h, seq, 1, 1, start, n + 1, gk, gv));
  kvc_io_t io[2] = {{.seq_id = seq, .pos = start, .ntokens = n - start, .k = gk, .v = gv},
                    {.seq_id = seq, .pos = n, .ntokens = 1, .k = gk + sizeof gk / 2, .v = gv + sizeof gv / 2}};
  EXPECT_RANGE_UNTOUCHED(kvc_get_batch(h, NULL, io, 2)); /* one bad entry: nothing read */
  kvc_lease_t *ls = NULL;
  ASSERT_ERR(kvc_lease(h, seq, start, n + 1, &ls), KVC_E_RANGE);
  ASSERT_ERR(kvc_lease(h, seq, n, page_end, &ls), KVC_E_RANGE);
  ASSERT(ls == NULL);
  if (start > 0) {
    EXPECT_RANGE_UNTOUCHED(kvc_get(h, seq, 0, n, gk, gv));
    EXPECT_RANGE_UNTOUCHED(kvc_get(h, seq, start - 1, start, gk, gv));
    ASSERT_ERR(kvc_lease(h, seq, start - 1, n, &ls), KVC_E_RANGE);
  }
  if (kd->lay.dtype == KVC_DTYPE_INT8) {
    static float ks[4096], vs[4096];
    memset(ks, SENT, sizeof ks);
    EXPECT_RANGE_UNTOUCHED(kvc_get_raw(h, seq, start, n + 1, NULL, (int8_t *)gk, (int8_t *)gv,
                                       ks, vs));
    ASSERT(all_bytes((const uint8_t *)ks, sizeof ks, SENT));
  }
  /* Through the shared buffer: the region is left as it was. */
  void *base;
  uint64_t shm;
  kvc_client_shm(c, &base, &shm);
  uint64_t kb, vb;
  ASSERT_OK(kvc_xfer_bytes(h, NULL, false, n + 1 - start, &kb, &vb, NULL));
  ASSERT(kb + vb <= shm);
  memset(base, SENT, kb + vb);
  kvc_shm_io_t e = {.seq_id = seq, .pos = start, .ntokens = n + 1 - start, .k_off = 0,
                    .v_off = kb};
  ASSERT_ERR(kvc_get_shm(h, NULL, &e, 1), KVC_E_RANGE);
  ASSERT(all_bytes(base, kb + vb, SENT));
  /* The exact range through the buffer: n - start tokens, then untouched. */
  e.ntokens = n - start;
  e.v_off = kb; /* V still starts after room for n + 1 - start tokens of K */
  ASSERT_OK(kvc_get_shm(h, NULL, &e, 1));
  uint64_t kx;
  ASSERT_OK(kvc_xfer_bytes(h, NULL, false, n - start, &kx, NULL, NULL));
  ASSERT(all_bytes((uint8_t *)base + kx, kb - kx, SENT));
  ASSERT(all_bytes((uint8_t *)base + kb + kx, vb - kx, SENT));
}

TEST_TIMEOUT(hard_evicted_page_reused_never_shows_old_bytes, 120) {
  kinds_init();
  static const char *const args[] = {"--pool-bytes", "1MiB", "--page-bytes", "16KiB",
                                     "--shm-default-bytes", "1MiB", "--pin-limit-pct", "100",
                                     NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  kvc_client_t *c = client_open(&d);
  ASSERT_U64_EQ(stat_get(c, "pool_pages", NULL), POOL_PAGES);
  kvc_cache_t *h[3], *old;
  ASSERT_OK(kvc_cache_open(c, "old", &kinds[0].lay, &old));
  for (int i = 0; i < 3; i++) ASSERT_OK(kvc_cache_open(c, kinds[i].name, &kinds[i].lay, &h[i]));
  /* The first owners fill every page with 0xA5. */
  static uint8_t k[2 * MAXTOK * 1024], v[2 * MAXTOK * 1024];
  memset(k, OLD, sizeof k);
  memset(v, OLD, sizeof v);
  for (uint64_t s = 0; s < POOL_PAGES; s++) ASSERT_OK(kvc_put(old, s, 0, 16, k, v));
  ASSERT_U64_EQ(stat_get(c, "pages_free", NULL), 0);
  /* Two rounds of new owners, each taking a page by eviction and writing
   * 1..15 tokens of it; the second round reuses the first round's pages. */
  uint64_t checked = 0;
  for (int round = 0; round < 2; round++)
    for (uint64_t j = 0; j < POOL_PAGES; j++) {
      const kind_t *kd = &kinds[j % 3];
      kvc_cache_t *hh = h[j % 3];
      uint64_t seq = 1000 + (uint64_t)round * 100 + j, n = 1 + (j * 7 + (uint64_t)round) % 15;
      fill_new(kd, seq, 0, n, kd->lay.num_layers, k, v);
      ASSERT_OK(kvc_put(hh, seq, 0, n, k, v));
      read_exact(hh, kd, seq, n, k, v);
      reads_past_fail(c, hh, kd, seq, 0, n);
      checked++;
    }
  uint64_t evicted = stat_get(c, "evicted_pages_total", NULL);
  ASSERT(evicted >= 2 * POOL_PAGES - 8); /* the pool held 64 pages throughout */

  /* Layer by layer: layer 0 of tokens [n, n + 3) written, layer 1 not. Layer
   * 0 reads up to n + 3, every other read stops at n. */
  const kind_t *kd = &kinds[0];
  uint64_t seq = 5000, n = 5;
  fill_new(kd, seq, 0, n, 2, k, v);
  ASSERT_OK(kvc_put(h[0], seq, 0, n, k, v));
  static uint8_t k0[MAXTOK * 512], v0[MAXTOK * 512];
  fill_new(kd, seq, n, 3, 1, k0, v0);
  kvc_xfer_t layer0 = {.layer_begin = 0, .layer_end = 1};
  kvc_io_t io = {.seq_id = seq, .pos = n, .ntokens = 3, .k = k0, .v = v0};
  ASSERT_OK(kvc_put_batch(h[0], &layer0, &io, 1));
  kvc_seq_info_t si;
  ASSERT_OK(kvc_seq_info(h[0], seq, &si));
  ASSERT_U64_EQ(si.length, n);
  kvc_io_t g0 = {.seq_id = seq, .pos = n, .ntokens = 3, .k = gk, .v = gv};
  memset(gk, SENT, sizeof gk);
  ASSERT_OK(kvc_get_batch(h[0], &layer0, &g0, 1));
  ASSERT_MEM_EQ(gk, k0, kd->tok_bytes / 2 * 3);
  kvc_xfer_t layer1 = {.layer_begin = 1, .layer_end = 2};
  kvc_io_t g1 = {.seq_id = seq, .pos = n, .ntokens = 1, .k = gk, .v = gv};
  EXPECT_RANGE_UNTOUCHED(kvc_get_batch(h[0], &layer1, &g1, 1));
  EXPECT_RANGE_UNTOUCHED(kvc_get_token(h[0], seq, n, &layer1, gk, gv));
  reads_past_fail(c, h[0], kd, seq, 0, n);

  /* A copied prefix ends where it was copied; a trimmed front is gone. */
  fill_new(kd, 6000, 0, 37, 2, k, v);
  ASSERT_OK(kvc_put(h[0], 6000, 0, 37, k, v));
  ASSERT_OK(kvc_seq_copy_prefix(h[0], 6000, 6001, 21));
  reads_past_fail(c, h[0], kd, 6001, 0, 21);
  ASSERT_OK(kvc_seq_trim_front(h[0], 6000, 16));
  reads_past_fail(c, h[0], kd, 6000, 16, 37);
  /* Tokens [16, 37) of 6000 still read as written. */
  memset(gk, SENT, sizeof gk);
  ASSERT_OK(kvc_get(h[0], 6000, 16, 37, gk, gv));
  for (uint32_t layer = 0; layer < 2; layer++) {
    size_t row = kd->tok_bytes / 2;
    ASSERT_MEM_EQ(gk + layer * 21 * row, k + (layer * 37 + 16) * row, 21 * row);
  }
  fprintf(stderr, "reuse: %llu new owners checked over %llu evicted pages\n",
          (unsigned long long)checked, (unsigned long long)evicted);
  kvc_client_close(c);
  daemon_stop(&d);
}
