/* engine_api.c: every call of src/engine.h, bad arguments first, then values.
 *
 * Each test builds its own engine over a small pool (engine_fixture.h) and
 * ends with engine_audit() == 0. Expected codes follow the comments of
 * engine.h; where a rule is only implied, the test says which rule it reads.
 */
#include <math.h>

#include "engine_fixture.h"

#define BIG UINT64_MAX

/* ---- engine_new ----------------------------------------------------------- */

TEST(new_rejects_bad_config) {
  void *base = fx_pool_alloc(64 * 1024);
  engine_t *eng = NULL;
  engine_config_t ok = {.base = base, .pool_bytes = 64 * 1024, .page_bytes = 1024, .max_caches = 0, .max_seqs = 0};
  engine_config_t c = ok;
  ASSERT_ERR(engine_new(NULL, &eng), KVC_E_INVAL);
  ASSERT_ERR(engine_new(&ok, NULL), KVC_E_INVAL);
  c.base = NULL;
  ASSERT_ERR(engine_new(&c, &eng), KVC_E_INVAL);
  c = ok, c.base = (char *)base + 1;
  ASSERT_ERR(engine_new(&c, &eng), KVC_E_INVAL);
  c = ok, c.page_bytes = 0;
  ASSERT_ERR(engine_new(&c, &eng), KVC_E_INVAL);
  c = ok, c.page_bytes = 1000; /* not a multiple of 64 */
  ASSERT_ERR(engine_new(&c, &eng), KVC_E_INVAL);
  c = ok, c.page_bytes = 128 * 1024; /* larger than the pool */
  ASSERT_ERR(engine_new(&c, &eng), KVC_E_INVAL);
  ASSERT(eng == NULL);
  engine_free(NULL); /* accepts NULL */
  free(base);
}

TEST(new_stats_start_empty) {
  fx_t f;
  fx_engine(&f, 1024, 10, 0);
  /* pool_bytes not a multiple of the page: the tail is not a page */
  engine_t *eng2 = NULL;
  engine_config_t cfg = {.base = f.base, .pool_bytes = 10 * 1024 - 1, .page_bytes = 1024, .max_caches = 0, .max_seqs = 0};
  ASSERT_OK(engine_new(&cfg, &eng2));
  engine_stats_t s2;
  engine_stats(eng2, &s2);
  ASSERT_U64_EQ(s2.pool_pages, 9);
  engine_free(eng2);

  engine_stats_t s = fx_stats(&f);
  ASSERT_U64_EQ(s.pool_bytes, 10 * 1024);
  ASSERT_U64_EQ(s.page_bytes, 1024);
  ASSERT_U64_EQ(s.pool_pages, 10);
  ASSERT_U64_EQ(s.pages_free, 10);
  ASSERT_U64_EQ(s.pages_used + s.pages_shared + s.pages_pinned + s.caches + s.sequences, 0);
  ASSERT_U64_EQ(s.tokens + s.puts + s.gets + s.errors + s.cow_copies + s.evicted_pages, 0);
  ASSERT(s.metadata_bytes > 0);
  fx_close(&f);
}

/* ---- layouts ---------------------------------------------------------------- */

TEST(layout_rejects_each_field) {
  kvc_layout_t ok = fx_small_layout(), l;
  ASSERT_ERR(engine_layout_page_bytes(NULL), KVC_E_INVAL);
#define BAD(field, value, code)                                                \
  do {                                                                         \
    l = ok;                                                                    \
    l.field = value;                                                           \
    ASSERT_ERR(engine_layout_page_bytes(&l), code);                            \
  } while (0)
  BAD(num_layers, 0, KVC_E_NLAYERS);
  BAD(num_layers, KVC_MAX_LAYERS + 1, KVC_E_NLAYERS);
  BAD(num_kv_heads, 0, KVC_E_NHEADS);
  BAD(num_kv_heads, KVC_MAX_HEADS + 1, KVC_E_NHEADS);
  BAD(head_dim_k, 0, KVC_E_HEADDIM);
  BAD(head_dim_v, 0, KVC_E_HEADDIM);
  BAD(head_dim_k, KVC_MAX_HEAD_DIM + 1, KVC_E_HEADDIM);
  BAD(head_dim_v, UINT32_MAX, KVC_E_HEADDIM);
  BAD(page_tokens, 3, KVC_E_PAGETOKENS);
  BAD(page_tokens, 48, KVC_E_PAGETOKENS);
  BAD(page_tokens, KVC_MAX_PAGE_TOKENS * 2, KVC_E_PAGETOKENS);
  BAD(page_tokens, UINT32_MAX, KVC_E_PAGETOKENS);
  BAD(dtype, 0, KVC_E_DTYPE);
  BAD(dtype, 10, KVC_E_DTYPE); /* the first unknown */
  BAD(dtype, 99, KVC_E_DTYPE);
#undef BAD
}

TEST(layout_page_bytes_values) {
  kvc_layout_t l = fx_small_layout(); /* 4 tok x 4 layers x 2 heads x (8+4) x 4 B */
  int64_t f32 = engine_layout_page_bytes(&l);
  ASSERT(f32 >= 4 * 4 * 2 * 12 * 4);
  ASSERT(f32 <= 4 * 4 * 2 * 12 * 4 + 4096);
  l.dtype = KVC_DTYPE_F64;
  ASSERT(engine_layout_page_bytes(&l) >= 2 * 1536);
  l.dtype = KVC_DTYPE_F16;
  ASSERT(engine_layout_page_bytes(&l) >= 768);
  l.dtype = KVC_DTYPE_BF16;
  ASSERT(engine_layout_page_bytes(&l) >= 768);
  l.dtype = KVC_DTYPE_INT8; /* bytes plus an f32 scale per token/head/layer, K and V */
  ASSERT(engine_layout_page_bytes(&l) >= 384 + 4 * 4 * 2 * 2 * 4);
  /* page_tokens 0 is the default, 16 */
  l = fx_small_layout();
  l.page_tokens = 0;
  int64_t p0 = engine_layout_page_bytes(&l);
  l.page_tokens = 16;
  ASSERT_EQ(p0, engine_layout_page_bytes(&l));
  ASSERT(p0 >= 4 * f32 - 4096);
  /* the largest legal layout does not overflow */
  l = fx_layout(KVC_MAX_LAYERS, KVC_MAX_HEADS, KVC_MAX_HEAD_DIM, KVC_MAX_HEAD_DIM,
                KVC_DTYPE_F64, KVC_MAX_PAGE_TOKENS);
  int64_t huge = engine_layout_page_bytes(&l);
  ASSERT(huge == KVC_E_OVERFLOW || huge >= (int64_t)1 << 54);
}

/* ---- caches ----------------------------------------------------------------- */

TEST(cache_open_rejects_bad_args) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_engine(&f, 2048, 8, 0);
  uint32_t id = 77;
  ASSERT_ERR(engine_cache_open(f.eng, NULL, &l, &id), KVC_E_INVAL);
  ASSERT_ERR(engine_cache_open(f.eng, "a", NULL, &id), KVC_E_INVAL);
  ASSERT_ERR(engine_cache_open(f.eng, "a", &l, NULL), KVC_E_INVAL);
  ASSERT_ERR(engine_cache_open(f.eng, "", &l, &id), KVC_E_NAME);
  char longname[KVC_MAX_NAME + 2];
  memset(longname, 'x', sizeof longname - 1);
  longname[KVC_MAX_NAME + 1] = 0; /* 65 bytes */
  ASSERT_ERR(engine_cache_open(f.eng, longname, &l, &id), KVC_E_NAME);
  ASSERT_ERR(engine_cache_open(f.eng, "a\nb", &l, &id), KVC_E_NAME);
  ASSERT_ERR(engine_cache_open(f.eng, "tab\there", &l, &id), KVC_E_NAME);
  ASSERT_ERR(engine_cache_open(f.eng, "del\x7f", &l, &id), KVC_E_NAME);
  kvc_layout_t b = l;
  b.num_layers = 0;
  ASSERT_ERR(engine_cache_open(f.eng, "a", &b, &id), KVC_E_NLAYERS);
  b = l, b.num_kv_heads = 0;
  ASSERT_ERR(engine_cache_open(f.eng, "a", &b, &id), KVC_E_NHEADS);
  b = l, b.head_dim_v = 0;
  ASSERT_ERR(engine_cache_open(f.eng, "a", &b, &id), KVC_E_HEADDIM);
  b = l, b.page_tokens = 6;
  ASSERT_ERR(engine_cache_open(f.eng, "a", &b, &id), KVC_E_PAGETOKENS);
  b = l, b.dtype = 10;
  ASSERT_ERR(engine_cache_open(f.eng, "a", &b, &id), KVC_E_DTYPE);
  b = l, b.page_tokens = 8; /* 3072 bytes > the 2048-byte pool page */
  ASSERT_ERR(engine_cache_open(f.eng, "a", &b, &id), KVC_E_PAGESIZE);
  ASSERT_EQ(id, 77);
  size_t n = 9;
  ASSERT_OK(engine_cache_list(f.eng, NULL, 0, &n));
  ASSERT_EQ(n, 0);
  ASSERT_U64_EQ(fx_stats(&f).caches, 0);
  longname[KVC_MAX_NAME] = 0; /* 64 bytes is legal */
  ASSERT_OK(engine_cache_open(f.eng, longname, &l, &id));
  fx_close(&f);
}

TEST(cache_open_same_layout_returns_same_id) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  uint32_t id2 = 0, id3 = 0;
  ASSERT_OK(engine_cache_open(f.eng, "main", &l, &id2));
  ASSERT_EQ(id2, f.cid);
  ASSERT_OK(engine_cache_open(f.eng, "other", &l, &id3));
  ASSERT(id3 != f.cid);
  ASSERT_U64_EQ(fx_stats(&f).caches, 2);
  /* page_tokens 0 reads as 16: the same layout as 16 */
  kvc_layout_t d = fx_layout(1, 1, 4, 4, KVC_DTYPE_F32, 16), d0 = d;
  d0.page_tokens = 0;
  uint32_t a = 0, b = 0;
  ASSERT_OK(engine_cache_open(f.eng, "dflt", &d, &a));
  ASSERT_OK(engine_cache_open(f.eng, "dflt", &d0, &b));
  ASSERT_EQ(a, b);
  fx_close(&f);
}

TEST(cache_open_different_layout_is_LAYOUT) {
  fx_t f;
  kvc_layout_t l = fx_small_layout(), b;
  fx_open(&f, &l, 8);
  uint32_t id = 55;
#define DIFF(field, value)                                                     \
  do {                                                                         \
    b = l;                                                                     \
    b.field = value;                                                           \
    ASSERT_ERR(engine_cache_open(f.eng, "main", &b, &id), KVC_E_LAYOUT);       \
  } while (0)
  DIFF(num_layers, 2);
  DIFF(num_kv_heads, 1);
  DIFF(head_dim_k, 4);
  DIFF(head_dim_v, 8);
  DIFF(dtype, KVC_DTYPE_F16);
  DIFF(page_tokens, 2);
#undef DIFF
  /* The message says what the cache has where the open differs. */
  b = l;
  b.num_layers = l.num_layers + 1;
  b.dtype = KVC_DTYPE_BF16;
  ASSERT_ERR(engine_cache_open(f.eng, "main", &b, &id), KVC_E_LAYOUT);
  ASSERT_EQ(l.num_layers, 4);
  ASSERT_STR_EQ(engine_last_error(f.eng)->msg, "cache 'main' exists with another layout: "
                "num_layers 4 (asked 5), dtype f32 (asked bf16)");
  ASSERT_EQ(id, 55);
  ASSERT_U64_EQ(fx_stats(&f).caches, 1);
  fx_close(&f);
}

TEST(cache_open_max_caches_is_TOOMANY) {
  void *base = fx_pool_alloc(8 * 2048);
  engine_config_t cfg = {.base = base, .pool_bytes = 8 * 2048, .page_bytes = 2048, .max_caches = 2, .max_seqs = 0};
  engine_t *eng;
  ASSERT_OK(engine_new(&cfg, &eng));
  kvc_layout_t l = fx_small_layout();
  uint32_t a, b, c = 99;
  ASSERT_OK(engine_cache_open(eng, "a", &l, &a));
  ASSERT_OK(engine_cache_open(eng, "b", &l, &b));
  ASSERT_ERR(engine_cache_open(eng, "c", &l, &c), KVC_E_TOOMANY);
  ASSERT_EQ(c, 99);
  ASSERT_OK(engine_cache_open(eng, "a", &l, &c)); /* reopening is no new cache */
  ASSERT_EQ(c, a);
  FX_AUDIT(eng);
  engine_free(eng);
  free(base);
}

TEST(cache_info_and_list_values) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 16);
  kvc_cache_info_t ci;
  ASSERT_ERR(engine_cache_info(f.eng, f.cid, NULL), KVC_E_INVAL);
  ASSERT_ERR(engine_cache_info(f.eng, f.cid + 100, &ci), KVC_E_NOCACHE);
  ASSERT_OK(fx_put(&f, 1, 0, 6, 0));
  ASSERT_OK(fx_put(&f, 2, 0, 3, 0));
  ASSERT_OK(engine_cache_info(f.eng, f.cid, &ci));
  ASSERT_STR_EQ(ci.name, "main");
  ASSERT_EQ(ci.cache_id, f.cid);
  ASSERT(memcmp(&ci.layout, &l, sizeof l) == 0);
  ASSERT_U64_EQ(ci.page_bytes, (uint64_t)engine_layout_page_bytes(&l));
  ASSERT_U64_EQ(ci.sequences, 2);
  ASSERT_U64_EQ(ci.tokens, 9);
  ASSERT_U64_EQ(ci.pages, 3);
  uint32_t id2;
  ASSERT_OK(engine_cache_open(f.eng, "second", &l, &id2));
  kvc_cache_info_t list[4];
  size_t n = 0;
  ASSERT_ERR(engine_cache_list(f.eng, list, 4, NULL), KVC_E_INVAL);
  ASSERT_OK(engine_cache_list(f.eng, list, 1, &n));
  ASSERT_EQ(n, 2); /* more than cap: the count, one filled */
  ASSERT_OK(engine_cache_list(f.eng, list, 4, &n));
  ASSERT_EQ(n, 2);
  int seen_main = 0, seen_second = 0;
  for (size_t i = 0; i < n; i++) {
    seen_main += strcmp(list[i].name, "main") == 0 && list[i].cache_id == f.cid;
    seen_second += strcmp(list[i].name, "second") == 0 && list[i].cache_id == id2;
  }
  ASSERT(seen_main == 1 && seen_second == 1);
  fx_close(&f);
}

TEST(cache_stats_values) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 16);
  cache_stats_t cs;
  ASSERT_ERR(engine_cache_stats(f.eng, f.cid, NULL), KVC_E_INVAL);
  ASSERT_ERR(engine_cache_stats(f.eng, 12345, &cs), KVC_E_NOCACHE);
  ASSERT_OK(fx_put(&f, 1, 0, 6, 0));
  ASSERT_OK(fx_put(&f, 2, 0, 2, 0));
  FX_EXPECT(&f, 1, 0, 6, 0);
  ASSERT_OK(engine_cache_stats(f.eng, f.cid, &cs));
  ASSERT_U64_EQ(cs.sequences, 2);
  ASSERT_U64_EQ(cs.tokens, 8);
  ASSERT_U64_EQ(cs.pages, 3);
  ASSERT_U64_EQ(cs.puts, 2);
  ASSERT_U64_EQ(cs.gets, 1);
  ASSERT_U64_EQ(cs.cow_copies + cs.evicted_sequences + cs.full_errors, 0);
  fx_close(&f);
}

TEST(cache_clear_drops_sequences_and_pins) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 16);
  ASSERT_ERR(engine_cache_clear(f.eng, f.cid + 1), KVC_E_NOCACHE);
  for (uint64_t s = 1; s <= 3; s++) ASSERT_OK(fx_put(&f, s, 0, 5, 0));
  ASSERT_OK(engine_pin(f.eng, f.cid, 2, 9));
  ASSERT_OK(engine_cache_clear(f.eng, f.cid));
  engine_stats_t s = fx_stats(&f);
  ASSERT_U64_EQ(s.sequences, 0);
  ASSERT_U64_EQ(s.sequences_pinned, 0);
  ASSERT_U64_EQ(s.pages_free, 16);
  ASSERT_U64_EQ(s.pages_used, 0);
  ASSERT_U64_EQ(s.tokens, 0);
  ASSERT_U64_EQ(s.caches, 1);
  kvc_seq_info_t si;
  ASSERT_ERR(engine_seq_info(f.eng, f.cid, 2, &si), KVC_E_NOSEQ);
  ASSERT_EQ(engine_unpin_all(f.eng, 9), 0);
  ASSERT_OK(fx_put(&f, 2, 0, 1, 1)); /* the cache is still usable */
  FX_EXPECT(&f, 2, 0, 1, 1);
  fx_close(&f);
}

TEST(cache_drop_frees_and_retires_id) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 16);
  ASSERT_ERR(engine_cache_drop(f.eng, f.cid + 1), KVC_E_NOCACHE);
  ASSERT_OK(fx_put(&f, 1, 0, 9, 0));
  ASSERT_OK(engine_pin(f.eng, f.cid, 1, 4));
  uint32_t old = f.cid;
  ASSERT_OK(engine_cache_drop(f.eng, old));
  engine_stats_t s = fx_stats(&f);
  ASSERT_U64_EQ(s.caches, 0);
  ASSERT_U64_EQ(s.sequences, 0);
  ASSERT_U64_EQ(s.pages_free, 16);
  ASSERT_U64_EQ(s.sequences_pinned, 0);
  ASSERT_EQ(engine_unpin_all(f.eng, 4), 0);
  ASSERT_ERR(fx_put(&f, 1, 0, 1, 0), KVC_E_NOCACHE);
  ASSERT_ERR(engine_cache_drop(f.eng, old), KVC_E_NOCACHE);
  kvc_cache_info_t ci;
  ASSERT_ERR(engine_cache_info(f.eng, old, &ci), KVC_E_NOCACHE);
  ASSERT_OK(engine_cache_open(f.eng, "main", &l, &f.cid));
  ASSERT(f.cid != old); /* ids are not reused */
  kvc_seq_info_t si;
  ASSERT_ERR(engine_seq_info(f.eng, f.cid, 1, &si), KVC_E_NOSEQ);
  fx_close(&f);
}

/* ---- engine_xfer_bytes -------------------------------------------------------- */

TEST(xfer_bytes_values_and_errors) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 4);
  uint64_t kb = 1, vb = 1, sb = 1;
  engine_xfer_t x = {.layer_begin = 0, .layer_end = 0, .head_begin = 0, .head_end = 0, .dtype = 0};
  ASSERT_OK(engine_xfer_bytes(f.eng, f.cid, &x, true, 3, &kb, &vb, &sb));
  ASSERT_U64_EQ(kb, 3 * 4 * 2 * 8 * 4);
  ASSERT_U64_EQ(vb, 3 * 4 * 2 * 4 * 4);
  ASSERT_U64_EQ(sb, 0);
  engine_xfer_t g = {.layer_begin = 1, .layer_end = 3, .head_begin = 1, .head_end = 2, .dtype = KVC_DTYPE_F32};
  ASSERT_OK(engine_xfer_bytes(f.eng, f.cid, &g, false, 5, &kb, &vb, NULL));
  ASSERT_U64_EQ(kb, 5 * 2 * 1 * 8 * 4);
  ASSERT_U64_EQ(vb, 5 * 2 * 1 * 4 * 4);
  ASSERT_ERR(engine_xfer_bytes(f.eng, f.cid + 1, &x, true, 1, &kb, &vb, &sb), KVC_E_NOCACHE);
  engine_xfer_t bad = {.layer_begin = 4, .layer_end = 0, .head_begin = 0, .head_end = 0, .dtype = 0};
  ASSERT_ERR(engine_xfer_bytes(f.eng, f.cid, &bad, false, 1, &kb, &vb, &sb), KVC_E_LAYER);
  bad = (engine_xfer_t){0, 0, 2, 0, 0};
  ASSERT_ERR(engine_xfer_bytes(f.eng, f.cid, &bad, false, 1, &kb, &vb, &sb), KVC_E_HEAD);
  bad = (engine_xfer_t){0, 0, 0, 0, KVC_DTYPE_F64};
  ASSERT_ERR(engine_xfer_bytes(f.eng, f.cid, &bad, true, 1, &kb, &vb, &sb), KVC_E_DTYPE);
  ASSERT_ERR(engine_xfer_bytes(f.eng, f.cid, &x, true, BIG / 64, &kb, &vb, &sb),
             KVC_E_OVERFLOW);
  fx_close(&f);
}

TEST(xfer_bytes_int8) {
  fx_t f;
  kvc_layout_t l = fx_layout(2, 3, 8, 4, KVC_DTYPE_INT8, 4);
  fx_open(&f, &l, 4);
  uint64_t kb, vb, sb;
  engine_xfer_t raw = {.layer_begin = 0, .layer_end = 0, .head_begin = 0, .head_end = 0, .dtype = KVC_DTYPE_INT8};
  ASSERT_OK(engine_xfer_bytes(f.eng, f.cid, &raw, false, 5, &kb, &vb, &sb));
  ASSERT_U64_EQ(kb, 5 * 2 * 3 * 8);
  ASSERT_U64_EQ(vb, 5 * 2 * 3 * 4);
  ASSERT_U64_EQ(sb, 5 * 2 * 3 * 4); /* one f32 per token/head/layer */
  engine_xfer_t deq = {.layer_begin = 0, .layer_end = 0, .head_begin = 0, .head_end = 0, .dtype = KVC_DTYPE_F32};
  ASSERT_OK(engine_xfer_bytes(f.eng, f.cid, &deq, false, 5, &kb, &vb, &sb));
  ASSERT_U64_EQ(kb, 5 * 2 * 3 * 8 * 4);
  ASSERT_U64_EQ(sb, 0);
  engine_xfer_t bf = {.layer_begin = 0, .layer_end = 0, .head_begin = 0, .head_end = 0, .dtype = KVC_DTYPE_BF16};
  ASSERT_OK(engine_xfer_bytes(f.eng, f.cid, &bf, true, 5, &kb, &vb, &sb));
  ASSERT_U64_EQ(kb, 5 * 2 * 3 * 8 * 2);
  fx_close(&f);
}

/* ---- put: bad arguments -------------------------------------------------------- */

/* A put of seq [pos, pos+n) whose buffers are not read (it must fail first). */
static int put_fake(fx_t *f, const engine_xfer_t *x, uint64_t seq, uint64_t pos, uint64_t n) {
  static float dummy[4096]; /* enough for one token; a failing call reads none */
  engine_io_t io = {seq, pos, n, dummy, dummy, 0, 0, NULL, NULL, 0, 0};
  uint64_t kb = 0, vb = 0;
  if (engine_xfer_bytes(f->eng, f->cid, x, true, n, &kb, &vb, NULL) == 0) {
    io.k_bytes = kb;
    io.v_bytes = vb;
  } else {
    io.k_bytes = io.v_bytes = 64;
  }
  return engine_put(f->eng, f->cid, x, &io, 1);
}

TEST(put_rejects_null_and_unknown_cache) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  fx_rng_t r = fx_all(&l);
  fx_buf_t b = fx_buf_new(&l, r, 2);
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  engine_io_t io = fx_io(1, 0, 2, &b);
  ASSERT_ERR(engine_put(f.eng, f.cid, &x, NULL, 1), KVC_E_INVAL);
  io.k = NULL;
  ASSERT_ERR(engine_put(f.eng, f.cid, &x, &io, 1), KVC_E_INVAL);
  io = fx_io(1, 0, 2, &b), io.v = NULL;
  ASSERT_ERR(engine_put(f.eng, f.cid, &x, &io, 1), KVC_E_INVAL);
  io = fx_io(1, 0, 2, &b);
  ASSERT_ERR(engine_put(f.eng, f.cid + 1, &x, &io, 1), KVC_E_NOCACHE);
  ASSERT_ERR(engine_put(f.eng, UINT32_MAX, &x, &io, 1), KVC_E_NOCACHE);
  engine_stats_t s = fx_stats(&f);
  ASSERT_U64_EQ(s.sequences + s.puts + s.pages_used, 0);
  ASSERT_U64_EQ(s.errors, 5);
  ASSERT_EQ(engine_last_error(f.eng)->code, KVC_E_NOCACHE);
  ASSERT_ERR(engine_put(f.eng, f.cid, &x, &io, 0), KVC_E_INVAL); /* no entries */
  fx_buf_free(&b);
  fx_close(&f);
}

TEST(put_rejects_bad_positions) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  engine_xfer_t x = fx_xfer(fx_all(&l), KVC_DTYPE_F32);
  ASSERT_ERR(put_fake(&f, &x, 1, 1, 1), KVC_E_RANGE); /* a hole in a new sequence */
  ASSERT_OK(fx_put(&f, 1, 0, 4, 0));
  ASSERT_ERR(put_fake(&f, &x, 1, 5, 1), KVC_E_RANGE); /* pos > length */
  ASSERT_ERR(put_fake(&f, &x, 1, BIG - 1, 1), KVC_E_RANGE);
  /* pos + ntokens wraps around: an overflow, not a range */
  ASSERT_ERR(put_fake(&f, &x, 1, 4, BIG - 2), KVC_E_OVERFLOW);
  ASSERT_ERR(put_fake(&f, &x, 1, BIG, 1), KVC_E_OVERFLOW);
  /* positions must stay below KVC_MAX_SEQ_TOKENS */
  ASSERT_ERR(put_fake(&f, &x, 1, 4, KVC_MAX_SEQ_TOKENS), KVC_E_RANGE);
  FX_EXPECT(&f, 1, 0, 4, 0);
  kvc_seq_info_t si = FX_INFO(&f, 1);
  ASSERT_U64_EQ(si.length, 4);
  ASSERT_U64_EQ(fx_stats(&f).puts, 1);
  fx_close(&f);
}

TEST(put_rejects_bad_layers_heads_dtypes) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  engine_xfer_t x;
#define PUTX(lb, le, hb, he, dt, code)                                         \
  do {                                                                         \
    x = (engine_xfer_t){lb, le, hb, he, dt};                                   \
    ASSERT_ERR(put_fake(&f, &x, 1, 0, 1), code);                               \
  } while (0)
  PUTX(4, 0, 0, 0, KVC_DTYPE_F32, KVC_E_LAYER);
  PUTX(0, 5, 0, 0, KVC_DTYPE_F32, KVC_E_LAYER);
  PUTX(2, 2, 0, 0, KVC_DTYPE_F32, KVC_E_LAYER);
  PUTX(3, 1, 0, 0, KVC_DTYPE_F32, KVC_E_LAYER);
  PUTX(UINT32_MAX, 0, 0, 0, KVC_DTYPE_F32, KVC_E_LAYER);
  PUTX(0, 0, 0, 1, KVC_DTYPE_F32, KVC_E_HEAD); /* puts cover every head */
  PUTX(0, 0, 1, 2, KVC_DTYPE_F32, KVC_E_HEAD);
  PUTX(0, 0, 1, 0, KVC_DTYPE_F32, KVC_E_HEAD);
  PUTX(0, 0, 0, 3, KVC_DTYPE_F32, KVC_E_HEAD);
  PUTX(0, 0, 0, 0, KVC_DTYPE_F64, KVC_E_DTYPE); /* cache dtype or f32 only */
  PUTX(0, 0, 0, 0, KVC_DTYPE_F16, KVC_E_DTYPE);
  PUTX(0, 0, 0, 0, KVC_DTYPE_BF16, KVC_E_DTYPE);
  PUTX(0, 0, 0, 0, KVC_DTYPE_INT8, KVC_E_DTYPE);
  PUTX(0, 0, 0, 0, 99, KVC_E_DTYPE);
#undef PUTX
  x = (engine_xfer_t){0, 0, 0, 2, KVC_DTYPE_F32}; /* the whole head range is fine */
  ASSERT_OK(put_fake(&f, &x, 1, 0, 1));
  ASSERT_U64_EQ(fx_stats(&f).puts, 1);
  fx_close(&f);
}

TEST(put_rejects_wrong_sizes) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  fx_rng_t r = fx_all(&l);
  fx_buf_t b = fx_buf_new(&l, r, 3);
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  engine_io_t io = fx_io(1, 0, 3, &b);
  io.k_bytes--;
  ASSERT_ERR(engine_put(f.eng, f.cid, &x, &io, 1), KVC_E_SIZE);
  io = fx_io(1, 0, 3, &b), io.v_bytes--;
  ASSERT_ERR(engine_put(f.eng, f.cid, &x, &io, 1), KVC_E_SIZE);
  io = fx_io(1, 0, 3, &b), io.k_bytes = 0;
  ASSERT_ERR(engine_put(f.eng, f.cid, &x, &io, 1), KVC_E_SIZE);
  io = fx_io(1, 0, 3, &b), io.k_bytes = b.vb, io.v_bytes = b.kb; /* swapped */
  ASSERT_ERR(engine_put(f.eng, f.cid, &x, &io, 1), KVC_E_SIZE);
  io = fx_io(1, 0, 3, &b), io.ntokens = 2; /* bytes of 3 tokens for 2 */
  ASSERT_ERR(engine_put(f.eng, f.cid, &x, &io, 1), KVC_E_SIZE);
  ASSERT_U64_EQ(fx_stats(&f).sequences, 0);
  fx_buf_free(&b);
  fx_close(&f);
}

/* Entry i of a batch puts 2 tokens of seq 10+i at 0; bad_at breaks one. */
static int batch_put(fx_t *f, size_t n, size_t bad_at, int how) {
  fx_rng_t r = fx_all(&f->lay);
  fx_buf_t b[8];
  engine_io_t io[8];
  for (size_t i = 0; i < n; i++) {
    b[i] = fx_buf_new(&f->lay, r, 2);
    fx_fill(&f->lay, r, 10 + i, 0, 2, 0, b[i].k, b[i].v);
    io[i] = fx_io(10 + i, 0, 2, &b[i]);
  }
  if (bad_at < n) {
    if (how == 0) io[bad_at].pos = 1;                   /* RANGE */
    if (how == 1) io[bad_at].k_bytes++;                 /* SIZE */
    if (how == 2) io[bad_at].seq_id = io[0].seq_id;     /* DUPSEQ */
    if (how == 3) io[bad_at].v = NULL;                  /* INVAL */
  }
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  int rc = engine_put(f->eng, f->cid, &x, io, n);
  for (size_t i = 0; i < n; i++) fx_buf_free(&b[i]);
  return rc;
}

TEST(put_batch_is_all_or_nothing_on_bad_entry) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 16);
  engine_stats_t s0 = fx_stats(&f);
  ASSERT_ERR(batch_put(&f, 4, 3, 0), KVC_E_RANGE);
  ASSERT_ERR(batch_put(&f, 4, 2, 1), KVC_E_SIZE);
  ASSERT_ERR(batch_put(&f, 4, 3, 2), KVC_E_DUPSEQ);
  ASSERT_ERR(batch_put(&f, 4, 1, 3), KVC_E_INVAL);
  engine_stats_t s1 = fx_stats(&f);
  FX_STATS_SAME_BUT_HEAP(&s0, &s1); /* heap: failed_put_keeps_no_allocation */
  ASSERT_U64_EQ(s1.errors, 4);
  kvc_seq_info_t si;
  for (uint64_t s = 10; s < 14; s++)
    ASSERT_ERR(engine_seq_info(f.eng, f.cid, s, &si), KVC_E_NOSEQ);
  ASSERT_OK(batch_put(&f, 4, 99, 0));
  for (uint64_t s = 10; s < 14; s++) FX_EXPECT(&f, s, 0, 2, 0);
  ASSERT_U64_EQ(fx_stats(&f).puts, 4);
  ASSERT_U64_EQ(fx_stats(&f).put_tokens, 8);
  fx_close(&f);
}

TEST(put_max_seqs_is_TOOMANY) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  int64_t pb = engine_layout_page_bytes(&l);
  fx_engine(&f, fx_round_up((uint64_t)pb, 64), 16, 3);
  f.lay = l;
  ASSERT_OK(engine_cache_open(f.eng, "main", &l, &f.cid));
  for (uint64_t s = 1; s <= 3; s++) {
    ASSERT_OK(fx_put(&f, s, 0, 1, 0));
    ASSERT_OK(engine_pin(f.eng, f.cid, s, 1));
  }
  ASSERT_ERR(fx_put(&f, 4, 0, 1, 0), KVC_E_TOOMANY);
  ASSERT_OK(fx_put(&f, 3, 1, 1, 0)); /* existing sequences still grow */
  ASSERT_U64_EQ(fx_stats(&f).sequences, 3);
  fx_close(&f);
}

/* ---- put and get: values ---------------------------------------------------- */

TEST(put_append_then_get_values) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  ASSERT_OK(fx_put(&f, 1, 0, 5, 0));
  ASSERT_OK(fx_put(&f, 1, 5, 4, 0));
  FX_EXPECT(&f, 1, 0, 9, 0);
  FX_EXPECT(&f, 1, 3, 4, 0); /* a window across a page boundary */
  kvc_seq_info_t si = FX_INFO(&f, 1);
  ASSERT_U64_EQ(si.seq_id, 1);
  ASSERT_U64_EQ(si.start, 0);
  ASSERT_U64_EQ(si.length, 9);
  ASSERT_U64_EQ(si.extent, 9);
  ASSERT_EQ(si.pages, 3); /* ceil(9 / 4) */
  ASSERT_EQ(si.shared_pages, 0);
  ASSERT_EQ(si.pins, 0);
  engine_stats_t s = fx_stats(&f);
  ASSERT_U64_EQ(s.pages_used, 3);
  ASSERT_U64_EQ(s.pages_free, 5);
  ASSERT_U64_EQ(s.sequences, 1);
  ASSERT_U64_EQ(s.tokens, 9);
  ASSERT_U64_EQ(s.puts, 2);
  ASSERT_U64_EQ(s.put_tokens, 9);
  ASSERT_U64_EQ(s.bytes_in, 9 * 4 * 2 * 12 * 4);
  ASSERT_U64_EQ(s.gets, 2);
  ASSERT_U64_EQ(s.get_tokens, 13);
  ASSERT_U64_EQ(s.bytes_out, 13 * 4 * 2 * 12 * 4);
  ASSERT_U64_EQ(s.bytes_used, 3 * (uint64_t)engine_layout_page_bytes(&l));
  fx_close(&f);
}

TEST(put_overwrite_inside_and_across_end) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  ASSERT_OK(fx_put(&f, 1, 0, 8, 0));
  ASSERT_OK(fx_put(&f, 1, 2, 3, 7)); /* [2, 5) inside */
  FX_EXPECT(&f, 1, 0, 2, 0);
  FX_EXPECT(&f, 1, 2, 3, 7);
  FX_EXPECT(&f, 1, 5, 3, 0);
  ASSERT_U64_EQ(FX_INFO(&f, 1).length, 8);
  ASSERT_OK(fx_put(&f, 1, 6, 4, 8)); /* [6, 10): over the end */
  FX_EXPECT(&f, 1, 5, 1, 0);
  FX_EXPECT(&f, 1, 6, 4, 8);
  ASSERT_U64_EQ(FX_INFO(&f, 1).length, 10);
  ASSERT_U64_EQ(fx_stats(&f).pages_used, 3);
  ASSERT_U64_EQ(fx_stats(&f).tokens, 10);
  fx_close(&f);
}

TEST(get_rejects_bad_arguments) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  fx_rng_t r = fx_all(&l);
  ASSERT_OK(fx_put(&f, 1, 0, 6, 0));
  fx_buf_t b = fx_buf_new(&l, r, 2);
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  engine_io_t io = fx_io(1, 0, 2, &b);
  ASSERT_ERR(engine_get(f.eng, f.cid, &x, NULL, 1), KVC_E_INVAL);
  io.k = NULL;
  ASSERT_ERR(engine_get(f.eng, f.cid, &x, &io, 1), KVC_E_INVAL);
  io = fx_io(1, 0, 2, &b), io.k_bytes -= 4;
  ASSERT_ERR(engine_get(f.eng, f.cid, &x, &io, 1), KVC_E_SIZE);
  io = fx_io(1, 0, 2, &b);
  ASSERT_ERR(engine_get(f.eng, f.cid + 1, &x, &io, 1), KVC_E_NOCACHE);
  io.seq_id = 2;
  ASSERT_ERR(engine_get(f.eng, f.cid, &x, &io, 1), KVC_E_NOSEQ);
  ASSERT_ERR(fx_get_rc(&f, 1, 5, 2, r), KVC_E_RANGE); /* past length */
  ASSERT_ERR(fx_get_rc(&f, 1, 6, 1, r), KVC_E_RANGE);
  ASSERT_ERR(fx_get_rc(&f, 1, BIG - 1, 1, r), KVC_E_RANGE);
  ASSERT_ERR(fx_get_rc(&f, 1, BIG, 1, r), KVC_E_OVERFLOW);  /* pos + n wraps */
  ASSERT_ERR(fx_get_rc(&f, 1, 2, BIG - 1, r), KVC_E_OVERFLOW);
  x.dtype = KVC_DTYPE_F16; /* f32 cache: gets are f32 only */
  io = fx_io(1, 0, 2, &b);
  ASSERT_ERR(engine_get(f.eng, f.cid, &x, &io, 1), KVC_E_DTYPE);
  x.dtype = KVC_DTYPE_INT8;
  ASSERT_ERR(engine_get(f.eng, f.cid, &x, &io, 1), KVC_E_DTYPE);
  ASSERT_U64_EQ(fx_stats(&f).gets, 0);
  fx_buf_free(&b);
  fx_close(&f);
}

TEST(get_batch_writes_nothing_when_one_entry_fails) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  fx_rng_t r = fx_all(&l);
  ASSERT_OK(fx_put(&f, 1, 0, 4, 0));
  ASSERT_OK(fx_put(&f, 2, 0, 4, 0));
  fx_buf_t b1 = fx_buf_new(&l, r, 4), b2 = fx_buf_new(&l, r, 4);
  memset(b1.k, 0x5a, b1.kb);
  memset(b1.v, 0x5a, b1.vb);
  engine_io_t io[2] = {fx_io(1, 0, 4, &b1), fx_io(2, 1, 4, &b2)}; /* [1,5) > 4 */
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  ASSERT_ERR(engine_get(f.eng, f.cid, &x, io, 2), KVC_E_RANGE);
  for (uint64_t i = 0; i < b1.kb; i++) ASSERT_EQ(((unsigned char *)b1.k)[i], 0x5a);
  for (uint64_t i = 0; i < b1.vb; i++) ASSERT_EQ(((unsigned char *)b1.v)[i], 0x5a);
  io[0].seq_id = 2;
  io[1] = fx_io(2, 0, 4, &b2);
  ASSERT_OK(engine_get(f.eng, f.cid, &x, io, 2)); /* the same seq twice is fine */
  ASSERT_MEM_EQ(b1.k, b2.k, b1.kb);
  fx_buf_free(&b1);
  fx_buf_free(&b2);
  fx_close(&f);
}

TEST(get_single_token_and_head_ranges) {
  fx_t f;
  kvc_layout_t l = fx_layout(3, 4, 8, 4, KVC_DTYPE_F32, 4);
  fx_open(&f, &l, 8);
  ASSERT_OK(fx_put(&f, 1, 0, 10, 3));
  for (uint64_t p = 0; p < 10; p++) FX_EXPECT(&f, 1, p, 1, 3);
  for (uint32_t hb = 0; hb < 4; hb++)
    for (uint32_t he = hb + 1; he <= 4; he++)
      FX_EXPECT_RNG(&f, 1, 2, 7, fx_rng(&l, 0, 0, hb, he), 1, 3);
  FX_EXPECT_RNG(&f, 1, 9, 1, fx_rng(&l, 1, 2, 2, 3), 1, 3); /* one token, layer, head */
  FX_EXPECT_RNG(&f, 1, 0, 10, fx_rng(&l, 2, 0, 3, 0), 1, 3); /* ends 0: to the last */
  engine_xfer_t x;
  fx_buf_t b = fx_buf_new(&l, fx_all(&l), 1);
  engine_io_t io = fx_io(1, 0, 1, &b);
#define GETX(lb, le, hb, he, code)                                             \
  do {                                                                         \
    x = (engine_xfer_t){lb, le, hb, he, KVC_DTYPE_F32};                        \
    io.k_bytes = io.v_bytes = 4;                                               \
    ASSERT_ERR(engine_get(f.eng, f.cid, &x, &io, 1), code);                    \
  } while (0)
  GETX(0, 0, 1, 1, KVC_E_HEAD);
  GETX(0, 0, 3, 2, KVC_E_HEAD);
  GETX(0, 0, 0, 5, KVC_E_HEAD);
  GETX(0, 0, 4, 0, KVC_E_HEAD);
  GETX(3, 0, 0, 0, KVC_E_LAYER);
  GETX(1, 1, 0, 0, KVC_E_LAYER);
  GETX(0, 4, 0, 0, KVC_E_LAYER);
#undef GETX
  fx_buf_free(&b);
  fx_close(&f);
}

/* Layer 0 runs ahead of the others: pipelined prefill. */
TEST(put_layer_range_pipelining) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  fx_rng_t all = fx_all(&l), l0 = fx_rng(&l, 0, 1, 0, 0), rest = fx_rng(&l, 1, 0, 0, 0);
  ASSERT_OK(fx_put_layers(&f, 1, 0, 4, 0, 1, 0));
  kvc_seq_info_t si = FX_INFO(&f, 1);
  ASSERT_U64_EQ(si.length, 0); /* not yet written for every layer */
  ASSERT_U64_EQ(si.extent, 4);
  FX_EXPECT_RNG(&f, 1, 0, 4, l0, 1, 0);
  ASSERT_ERR(fx_get_rc(&f, 1, 0, 4, all), KVC_E_RANGE);
  ASSERT_ERR(fx_get_rc(&f, 1, 0, 1, rest), KVC_E_RANGE);
  ASSERT_OK(fx_put_layers(&f, 1, 4, 4, 0, 1, 0)); /* layer 0 now 8 */
  ASSERT_ERR(fx_put_layers(&f, 1, 1, 1, 1, 0, 0), KVC_E_RANGE); /* hole in layers 1.. */
  ASSERT_ERR(fx_put(&f, 1, 1, 1, 0), KVC_E_RANGE); /* pos > written length of layer 1 */
  ASSERT_OK(fx_put_layers(&f, 1, 0, 4, 1, 0, 0));
  si = FX_INFO(&f, 1);
  ASSERT_U64_EQ(si.length, 4);
  ASSERT_U64_EQ(si.extent, 8);
  ASSERT_EQ(si.pages, 2);
  ASSERT_U64_EQ(fx_stats(&f).tokens, 4);
  FX_EXPECT(&f, 1, 0, 4, 0);
  FX_EXPECT_RNG(&f, 1, 0, 8, l0, 1, 0);
  ASSERT_ERR(fx_get_rc(&f, 1, 0, 5, all), KVC_E_RANGE);
  ASSERT_OK(fx_put(&f, 1, 4, 4, 1)); /* all layers at 4: overwrites layer 0's [4,8) */
  si = FX_INFO(&f, 1);
  ASSERT_U64_EQ(si.length, 8);
  ASSERT_U64_EQ(si.extent, 8);
  FX_EXPECT(&f, 1, 4, 4, 1);
  fx_close(&f);
}

/* engine.h leaves zero-length transfers open: either refused as INVAL or
 * done as nothing. Either way no page, token or byte changes. */
TEST(zero_tokens_change_nothing) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  ASSERT_OK(fx_put(&f, 1, 0, 3, 0));
  engine_stats_t s0 = fx_stats(&f);
  int r = fx_put(&f, 2, 0, 0, 0);
  ASSERT(r == 0 || r == KVC_E_INVAL);
  r = fx_put(&f, 1, 3, 0, 0);
  ASSERT(r == 0 || r == KVC_E_INVAL);
  r = fx_get_rc(&f, 1, 3, 0, fx_all(&l));
  ASSERT(r == 0 || r == KVC_E_INVAL);
  /* a put "creates the sequence if new": if the empty put of seq 2 was
   * taken, seq 2 exists and holds nothing */
  kvc_seq_info_t si;
  int r2 = engine_seq_info(f.eng, f.cid, 2, &si);
  ASSERT(r2 == 0 || r2 == KVC_E_NOSEQ);
  if (r2 == 0) ASSERT(si.length == 0 && si.extent == 0 && si.pages == 0);
  engine_stats_t s1 = fx_stats(&f);
  ASSERT_U64_EQ(s1.sequences, s0.sequences + (r2 == 0));
  ASSERT_U64_EQ(s1.pages_used, s0.pages_used);
  ASSERT_U64_EQ(s1.tokens, s0.tokens);
  FX_EXPECT(&f, 1, 0, 3, 0);
  fx_close(&f);
}

/* ---- dtypes ------------------------------------------------------------------- */

/* One layer, one head, K and V of dim elements: element i of a token is at
 * [token * dim + i], so a buffer is just a flat array. */
static void open_flat(fx_t *f, kvc_dtype_t dt, uint32_t dim, uint32_t pt, uint64_t npages) {
  kvc_layout_t l = fx_layout(1, 1, dim, dim, dt, pt);
  fx_open(f, &l, npages);
}

static int put_raw(fx_t *f, kvc_dtype_t dt, uint64_t seq, uint64_t pos, uint64_t n,
                   const void *k, const void *v, uint64_t esize) {
  uint64_t bytes = n * f->lay.head_dim_k * esize;
  engine_io_t io = {seq, pos, n, (void *)k, (void *)v, bytes, bytes, NULL, NULL, 0, 0};
  engine_xfer_t x = {.layer_begin = 0, .layer_end = 0, .head_begin = 0, .head_end = 0, .dtype = dt};
  return engine_put(f->eng, f->cid, &x, &io, 1);
}

static int get_raw(fx_t *f, kvc_dtype_t dt, uint64_t seq, uint64_t pos, uint64_t n, void *k,
                   void *v, uint64_t esize) {
  uint64_t bytes = n * f->lay.head_dim_k * esize;
  engine_io_t io = {seq, pos, n, k, v, bytes, bytes, NULL, NULL, 0, 0};
  engine_xfer_t x = {.layer_begin = 0, .layer_end = 0, .head_begin = 0, .head_end = 0, .dtype = dt};
  return engine_get(f->eng, f->cid, &x, &io, 1);
}

static float f32_of_bits(uint32_t b) {
  float x;
  memcpy(&x, &b, 4);
  return x;
}

static uint32_t bits_of_f32(float x) {
  uint32_t b;
  memcpy(&b, &x, 4);
  return b;
}

/* IEEE binary16 to f32, exactly (the reference the engine is checked against). */
static float f16_ref(uint16_t h) {
  int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  float x;
  if (e == 0) x = ldexpf((float)m, -24);
  else if (e == 31) x = m ? NAN : INFINITY;
  else x = ldexpf((float)(1024 + m), e - 25);
  return sign ? -x : x;
}

/* got must be want, bit for bit, except that a NaN only needs to stay a NaN
 * of the same sign (quieting a signaling NaN on widening is allowed). */
static void expect_f32_(float got, float want, uint64_t i, int line) {
  if (isnan(want)) {
    if (!isnan(got) || signbit(got) != signbit(want))
      TEST_FAIL_("line %d element %" PRIu64 ": expected a NaN of sign %d, got %08x", line, i,
                 signbit(want) != 0, bits_of_f32(got));
    return;
  }
  if (bits_of_f32(got) != bits_of_f32(want))
    TEST_FAIL_("line %d element %" PRIu64 ": expected %08x (%g), got %08x (%g)", line, i,
               bits_of_f32(want), (double)want, bits_of_f32(got), (double)got);
}

/* Stores all 65536 16-bit patterns (K ascending, V descending) in a 16-bit
 * cache and checks the raw round trip and the f32 widening. */
static void all_16bit_patterns(kvc_dtype_t dt) {
  fx_t f;
  open_flat(&f, dt, 64, 64, 16); /* 1024 tokens x 64 elements */
  uint16_t *k = malloc(65536 * 2), *v = malloc(65536 * 2), *gk = malloc(65536 * 2),
           *gv = malloc(65536 * 2);
  float *wk = malloc(65536 * 4), *wv = malloc(65536 * 4);
  for (uint32_t i = 0; i < 65536; i++) k[i] = (uint16_t)i, v[i] = (uint16_t)(65535 - i);
  ASSERT_OK(put_raw(&f, dt, 1, 0, 1024, k, v, 2));
  ASSERT_OK(get_raw(&f, dt, 1, 0, 1024, gk, gv, 2));
  ASSERT_MEM_EQ(gk, k, 65536 * 2);
  ASSERT_MEM_EQ(gv, v, 65536 * 2);
  ASSERT_OK(get_raw(&f, KVC_DTYPE_F32, 1, 0, 1024, wk, wv, 4));
  for (uint32_t i = 0; i < 65536; i++) {
    float want = dt == KVC_DTYPE_F16 ? f16_ref(k[i]) : f32_of_bits((uint32_t)k[i] << 16);
    expect_f32_(wk[i], want, i, __LINE__);
    want = dt == KVC_DTYPE_F16 ? f16_ref(v[i]) : f32_of_bits((uint32_t)v[i] << 16);
    expect_f32_(wv[i], want, i, __LINE__);
  }
  free(k), free(v), free(gk), free(gv), free(wk), free(wv);
  fx_close(&f);
}

TEST(dtype_f16_every_pattern_bit_exact_and_widens_exactly) { all_16bit_patterns(KVC_DTYPE_F16); }
TEST(dtype_bf16_every_pattern_bit_exact_and_widens_exactly) {
  all_16bit_patterns(KVC_DTYPE_BF16);
}

static const uint32_t special_f32[] = {
    0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0x7f800001, 0xffc12345,
    0x7fbfffff, 0x00000001, 0x807fffff, 0x3f800000, 0x7f7fffff, 0xdeadbeef, 0x12345678};

TEST(dtype_f32_bits_round_trip_incl_nan_payloads) {
  fx_t f;
  open_flat(&f, KVC_DTYPE_F32, 14, 4, 4);
  uint32_t k[14 * 3], v[14 * 3], gk[14 * 3], gv[14 * 3];
  for (int i = 0; i < 14 * 3; i++) {
    k[i] = special_f32[i % 14] ^ (uint32_t)(i / 14);
    v[i] = special_f32[13 - i % 14];
  }
  ASSERT_OK(put_raw(&f, KVC_DTYPE_F32, 1, 0, 3, k, v, 4));
  ASSERT_OK(get_raw(&f, KVC_DTYPE_F32, 1, 0, 3, gk, gv, 4));
  ASSERT_MEM_EQ(gk, k, sizeof k);
  ASSERT_MEM_EQ(gv, v, sizeof v);
  ASSERT_OK(get_raw(&f, 0, 1, 0, 3, gk, gv, 4)); /* dtype 0: the cache's */
  ASSERT_MEM_EQ(gk, k, sizeof k);
  fx_close(&f);
}

TEST(dtype_f64_bits_round_trip_and_f32_conversions) {
  fx_t f;
  open_flat(&f, KVC_DTYPE_F64, 8, 4, 4);
  uint64_t k[16] = {0, 1ull << 63, 0x7ff0000000000000ull, 0xfff0000000000000ull,
                    0x7ff0000000000001ull, 0xfff8dead00000001ull, 1, 0x3ff0000000000000ull,
                    0x3ff0000010000000ull, 0x3ff0000030000000ull, 0x3ff0000010000001ull,
                    0x0123456789abcdefull, 0x7fefffffffffffffull, 2, 3, 4};
  uint64_t v[16], gk[16], gv[16];
  for (int i = 0; i < 16; i++) v[i] = ~k[i];
  ASSERT_OK(put_raw(&f, KVC_DTYPE_F64, 1, 0, 2, k, v, 8));
  ASSERT_OK(get_raw(&f, KVC_DTYPE_F64, 1, 0, 2, gk, gv, 8));
  ASSERT_MEM_EQ(gk, k, sizeof k);
  ASSERT_MEM_EQ(gv, v, sizeof v);
  float g32[16], gv32[16];
  ASSERT_OK(get_raw(&f, KVC_DTYPE_F32, 1, 0, 2, g32, gv32, 4));
  /* 1 + 2^-24 is halfway between 1 and 1 + 2^-23: even is 1 */
  ASSERT_EQ(bits_of_f32(g32[8]), 0x3f800000);
  /* 1 + 3 * 2^-24 is halfway between mantissa 1 and 2: even is 2 */
  ASSERT_EQ(bits_of_f32(g32[9]), 0x3f800002);
  ASSERT_EQ(bits_of_f32(g32[10]), 0x3f800001); /* just above half: up */
  ASSERT_EQ(bits_of_f32(g32[12]), 0x7f800000); /* DBL_MAX: inf */
  ASSERT(isnan(g32[4]) && isnan(g32[5]) && signbit(g32[5]));
  float in[16];
  for (int i = 0; i < 16; i++) in[i] = (float)i - 7.5f;
  in[0] = -0.0f;
  ASSERT_OK(put_raw(&f, KVC_DTYPE_F32, 2, 0, 2, in, in, 4)); /* f32 widened exactly */
  double out[16], outv[16];
  ASSERT_OK(get_raw(&f, KVC_DTYPE_F64, 2, 0, 2, out, outv, 8));
  for (int i = 0; i < 16; i++) ASSERT(out[i] == (double)in[i] && outv[i] == (double)in[i]);
  ASSERT(signbit(out[0]));
  fx_close(&f);
}

/* Puts f32 bit patterns into a 16-bit cache and checks the stored bits. */
static void expect_narrowing(kvc_dtype_t dt, const uint32_t *in, const uint16_t *want,
                             int n) {
  fx_t f;
  open_flat(&f, dt, (uint32_t)n, 4, 4);
  uint16_t got[64], gotv[64];
  ASSERT_OK(put_raw(&f, KVC_DTYPE_F32, 1, 0, 1, in, in, 4));
  ASSERT_OK(get_raw(&f, dt, 1, 0, 1, got, gotv, 2));
  for (int i = 0; i < n; i++) {
    int is_nan_want = dt == KVC_DTYPE_F16 ? (want[i] & 0x7c00) == 0x7c00 && (want[i] & 0x3ff)
                                          : (want[i] & 0x7f80) == 0x7f80 && (want[i] & 0x7f);
    int is_nan_got = dt == KVC_DTYPE_F16 ? (got[i] & 0x7c00) == 0x7c00 && (got[i] & 0x3ff)
                                         : (got[i] & 0x7f80) == 0x7f80 && (got[i] & 0x7f);
    if (is_nan_want ? !(is_nan_got && (got[i] >> 15) == (want[i] >> 15)) : got[i] != want[i])
      TEST_FAIL_("f32 %08x -> %s: expected %04x, got %04x", in[i],
                 dt == KVC_DTYPE_F16 ? "f16" : "bf16", want[i], got[i]);
    ASSERT_EQ(got[i], gotv[i]);
  }
  fx_close(&f);
}

TEST(dtype_f32_to_f16_rounds_to_nearest_even) {
  static const uint32_t in[] = {
      0x3f800000, /* 1 */
      0x3f801000, /* 1 + 2^-11: halfway 1 | 1+2^-10 -> even 3c00 */
      0x3f803000, /* 1 + 3*2^-11: halfway 3c01 | 3c02 -> 3c02 */
      0x3f801001, /* just above half -> 3c01 */
      0x3f800fff, /* just below half -> 3c00 */
      0x477fe000, /* 65504, max */
      0x477fefff, /* 65519.99 -> 65504 */
      0x477ff000, /* 65520: halfway max | 2^16 -> inf */
      0x33800000, /* 2^-24, smallest subnormal -> 0001 */
      0x33000000, /* 2^-25: halfway 0 | 0001 -> 0 */
      0x33c00000, /* 3*2^-25: halfway 0001 | 0002 -> 0002 */
      0x33000001, /* just above 2^-25 -> 0001 */
      0x38800000, /* 2^-14, smallest normal -> 0400 */
      0x387fe000, /* 2^-14 - 2^-25: halfway 03ff | 0400 -> 0400 */
      0x80000000, /* -0 */
      0x7f800000, /* inf */
      0xff800000, /* -inf */
      0x7fc00000, /* NaN */
      0xff800001, /* -sNaN stays a NaN */
      0x2edbe6ff, /* 1e-10 -> 0 */
      0xc0490fdb, /* -pi -> c248 */
  };
  static const uint16_t want[] = {0x3c00, 0x3c00, 0x3c02, 0x3c01, 0x3c00, 0x7bff, 0x7bff,
                                  0x7c00, 0x0001, 0x0000, 0x0002, 0x0001, 0x0400, 0x0400,
                                  0x8000, 0x7c00, 0xfc00, 0x7e00, 0xfe00, 0x0000, 0xc248};
  expect_narrowing(KVC_DTYPE_F16, in, want, (int)(sizeof in / sizeof in[0]));
}

TEST(dtype_f32_to_bf16_rounds_to_nearest_even) {
  static const uint32_t in[] = {
      0x3f808000, /* halfway 3f80 | 3f81 -> 3f80 */
      0x3f818000, /* halfway 3f81 | 3f82 -> 3f82 */
      0x3f808001, /* above half -> 3f81 */
      0x3f807fff, /* below half -> 3f80 */
      0x7f7fffff, /* FLT_MAX rounds to inf */
      0x7f7f8000, /* halfway 7f7f | 7f80, 7f7f odd -> 7f80 (inf) */
      0x7f7e8000, /* halfway 7f7e | 7f7f, even -> 7f7e */
      0x00008000, /* subnormal halfway -> 0000 */
      0x00018000, /* subnormal halfway, odd -> 0002 */
      0x80000000, /* -0 */
      0xff800000, /* -inf */
      0x7f800001, /* sNaN with only a low payload bit: must stay NaN, not inf */
      0xffffffff, /* NaN */
      0x40490fdb, /* pi -> 4049 */
  };
  static const uint16_t want[] = {0x3f80, 0x3f82, 0x3f81, 0x3f80, 0x7f80, 0x7f80, 0x7f7e,
                                  0x0000, 0x0002, 0x8000, 0xff80, 0x7fc0, 0xffc0, 0x4049};
  expect_narrowing(KVC_DTYPE_BF16, in, want, (int)(sizeof in / sizeof in[0]));
}

/* ---- failed puts keep nothing ----------------------------------------------- */

/* Regression: a put that created a sequence and then failed (a duplicate in
 * its batch, or a full pool) kept the grown sequence map: engine.h promises
 * "no allocation kept". */
TEST(failed_put_keeps_no_allocation) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 2);
  engine_stats_t s0 = fx_stats(&f);
  ASSERT_ERR(batch_put(&f, 2, 1, 2), KVC_E_DUPSEQ); /* [seq 10, seq 10] */
  engine_stats_t s1 = fx_stats(&f);
  FX_STATS_SAME(&s0, &s1);
  ASSERT_OK(fx_put(&f, 1, 0, 8, 0)); /* fills both pages */
  ASSERT_OK(engine_pin(f.eng, f.cid, 1, 1));
  s0 = fx_stats(&f);
  ASSERT_ERR(fx_put(&f, 2, 0, 1, 0), KVC_E_FULL); /* a new sequence, no page */
  s1 = fx_stats(&f);
  FX_STATS_SAME(&s0, &s1);
  fx_close(&f);
}

/* Regression: max_seqs was checked against the sequences held before the
 * call, so one batch could create several past the limit. */
TEST(batch_put_respects_max_seqs) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  int64_t pb = engine_layout_page_bytes(&l);
  fx_engine(&f, fx_round_up((uint64_t)pb, 64), 16, 2);
  f.lay = l;
  ASSERT_OK(engine_cache_open(f.eng, "main", &l, &f.cid));
  ASSERT_ERR(batch_put(&f, 3, 99, 0), KVC_E_TOOMANY); /* 3 new sequences, limit 2 */
  ASSERT_U64_EQ(fx_stats(&f).sequences, 0);
  ASSERT_OK(batch_put(&f, 2, 99, 0));
  ASSERT_U64_EQ(fx_stats(&f).sequences, 2);
  fx_close(&f);
}

/* ---- int8 ----------------------------------------------------------------------- */

typedef struct q8 {
  int8_t *k, *v;
  float *ks, *vs;
  uint64_t kb, vb, sb;
} q8_t;

/* Raw int8 get of [pos, pos+n) of every layer and head. */
static int get_q8(fx_t *f, uint64_t seq, uint64_t pos, uint64_t n, q8_t *q) {
  const kvc_layout_t *l = &f->lay;
  uint64_t rows = n * l->num_layers * l->num_kv_heads;
  q->kb = rows * l->head_dim_k, q->vb = rows * l->head_dim_v, q->sb = rows * 4;
  q->k = malloc(q->kb), q->v = malloc(q->vb), q->ks = malloc(q->sb), q->vs = malloc(q->sb);
  engine_io_t io = {seq, pos, n, q->k, q->v, q->kb, q->vb, q->ks, q->vs, q->sb, q->sb};
  engine_xfer_t x = {.layer_begin = 0, .layer_end = 0, .head_begin = 0, .head_end = 0, .dtype = KVC_DTYPE_INT8};
  return engine_get(f->eng, f->cid, &x, &io, 1);
}

static void q8_free(q8_t *q) { free(q->k), free(q->v), free(q->ks), free(q->vs); }

/* Checks one K or V of a raw get against the f32 input and the dequantized
 * get: scale = absmax / 127 per row, |q| of the absmax element is 127, and
 * every dequantized value is within scale / 2 of the input. */
static void check_q8_rows(const float *in, const int8_t *q, const float *scale,
                          const float *deq, uint64_t rows, uint32_t dim) {
  for (uint64_t r = 0; r < rows; r++) {
    float amax = 0;
    for (uint32_t d = 0; d < dim; d++) amax = fmaxf(amax, fabsf(in[r * dim + d]));
    float want = amax / 127.0f, s = scale[r];
    if (fabsf(s - want) > want * 1e-6f) TEST_FAIL_("row %" PRIu64 ": scale %g, want %g", r, (double)s, (double)want);
    int saw_max = amax == 0;
    for (uint32_t d = 0; d < dim; d++) {
      float x = in[r * dim + d], y = deq[r * dim + d];
      if (fabsf(y - x) > s / 2 * 1.0001f + 1e-30f)
        TEST_FAIL_("row %" PRIu64 " dim %u: %g dequantized to %g, scale %g", r, d, (double)x,
                   (double)y, (double)s);
      if (fabsf(y - (float)q[r * dim + d] * s) > fabsf(y) * 1e-6f)
        TEST_FAIL_("row %" PRIu64 " dim %u: deq %g != q %d x scale %g", r, d, (double)y,
                   q[r * dim + d], (double)s);
      saw_max |= fabsf(x) == amax && abs(q[r * dim + d]) == 127;
    }
    if (!saw_max) TEST_FAIL_("row %" PRIu64 ": absmax element is not +-127", r);
  }
}

TEST(int8_quantizes_symmetric_absmax) {
  fx_t f;
  kvc_layout_t l = fx_layout(2, 3, 8, 4, KVC_DTYPE_INT8, 4);
  fx_open(&f, &l, 8);
  fx_rng_t r = fx_all(&l);
  fx_buf_t in = fx_buf_new(&l, r, 6), deq = fx_buf_new(&l, r, 6);
  fx_fill(&l, r, 1, 0, 6, 0, in.k, in.v);
  for (int d = 0; d < 8; d++) in.k[8 + d] = 0; /* one all-zero K row */
  in.v[5] = 1e-30f;                            /* a tiny value beside larger ones */
  engine_io_t io = fx_io(1, 0, 6, &in);
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  ASSERT_OK(engine_put(f.eng, f.cid, &x, &io, 1));
  q8_t q;
  ASSERT_OK(get_q8(&f, 1, 0, 6, &q));
  io = fx_io(1, 0, 6, &deq);
  ASSERT_OK(engine_get(f.eng, f.cid, &x, &io, 1));
  check_q8_rows(in.k, q.k, q.ks, deq.k, 6 * 2 * 3, 8);
  check_q8_rows(in.v, q.v, q.vs, deq.v, 6 * 2 * 3, 4);
  for (int d = 0; d < 8; d++) ASSERT(deq.k[8 + d] == 0.0f);
  q8_free(&q);
  fx_buf_free(&in);
  fx_buf_free(&deq);
  fx_close(&f);
}

/* int8 caches take f16 and bf16 too: quantized from the exact values. */
TEST(int8_quantizes_f16_and_bf16_input) {
  fx_t f;
  open_flat(&f, KVC_DTYPE_INT8, 16, 4, 8);
  uint16_t h[32], b[32];
  float hf[32], bf[32], deqk[32], deqv[32];
  for (int i = 0; i < 32; i++) {
    h[i] = (uint16_t)(0x3c00 + i * 37 - (i & 1) * 0x8000 * (i % 3 == 0)); /* +-1..2 */
    b[i] = (uint16_t)(0x4000 + i * 3 + (i % 5 == 0 ? 0x8000 : 0));
    hf[i] = f16_ref(h[i]);
    bf[i] = f32_of_bits((uint32_t)b[i] << 16);
  }
  ASSERT_OK(put_raw(&f, KVC_DTYPE_F16, 1, 0, 2, h, h, 2));
  ASSERT_OK(put_raw(&f, KVC_DTYPE_BF16, 2, 0, 2, b, b, 2));
  q8_t q;
  ASSERT_OK(get_raw(&f, KVC_DTYPE_F32, 1, 0, 2, deqk, deqv, 4));
  ASSERT_OK(get_q8(&f, 1, 0, 2, &q));
  check_q8_rows(hf, q.k, q.ks, deqk, 2, 16);
  check_q8_rows(hf, q.v, q.vs, deqv, 2, 16);
  q8_free(&q);
  ASSERT_OK(get_raw(&f, KVC_DTYPE_F32, 2, 0, 2, deqk, deqv, 4));
  ASSERT_OK(get_q8(&f, 2, 0, 2, &q));
  check_q8_rows(bf, q.k, q.ks, deqk, 2, 16);
  q8_free(&q);
  fx_close(&f);
}

TEST(int8_nonfinite_input_changes_nothing) {
  fx_t f;
  open_flat(&f, KVC_DTYPE_INT8, 4, 4, 8);
  float k[8] = {1, 2, 3, 4, 5, 6, 7, 8}, v[8] = {-1, -2, -3, -4, -5, -6, -7, -8};
  ASSERT_OK(put_raw(&f, KVC_DTYPE_F32, 1, 0, 2, k, v, 4));
  q8_t q0, q1;
  ASSERT_OK(get_q8(&f, 1, 0, 2, &q0));
  engine_stats_t s0 = fx_stats(&f);
  float bad[8];
  const float poison[3] = {NAN, INFINITY, -INFINITY};
  for (int p = 0; p < 3; p++) {
    memcpy(bad, k, sizeof bad);
    bad[5] = poison[p];
    ASSERT_ERR(put_raw(&f, KVC_DTYPE_F32, 1, 0, 2, bad, v, 4), KVC_E_NONFINITE);
    ASSERT_ERR(put_raw(&f, KVC_DTYPE_F32, 1, 2, 2, k, bad, 4), KVC_E_NONFINITE);
    ASSERT_ERR(put_raw(&f, KVC_DTYPE_F32, 2, 0, 2, bad, v, 4), KVC_E_NONFINITE);
  }
  uint16_t hnan[8] = {0x3c00, 0x7e00, 0, 0, 0, 0, 0, 0}, hinf[8] = {0, 0x7f80}; /* bf16 inf */
  ASSERT_ERR(put_raw(&f, KVC_DTYPE_F16, 1, 0, 2, hnan, hnan, 2), KVC_E_NONFINITE);
  ASSERT_ERR(put_raw(&f, KVC_DTYPE_BF16, 1, 0, 2, hinf, hinf, 2), KVC_E_NONFINITE);
  engine_stats_t s1 = fx_stats(&f);
  FX_STATS_SAME(&s0, &s1);
  ASSERT_OK(get_q8(&f, 1, 0, 2, &q1));
  ASSERT_MEM_EQ(q1.k, q0.k, q0.kb);
  ASSERT_MEM_EQ(q1.vs, q0.vs, q0.sb);
  kvc_seq_info_t si;
  ASSERT_ERR(engine_seq_info(f.eng, f.cid, 2, &si), KVC_E_NOSEQ);
  q8_free(&q0);
  q8_free(&q1);
  fx_close(&f);
}

TEST(int8_rejects_bad_dtypes_and_scale_buffers) {
  fx_t f;
  open_flat(&f, KVC_DTYPE_INT8, 4, 4, 8);
  float k[4] = {1, 2, 3, 4};
  double d[4] = {1, 2, 3, 4};
  int8_t raw[4] = {1, 2, 3, 4};
  ASSERT_ERR(put_raw(&f, KVC_DTYPE_F64, 1, 0, 1, d, d, 8), KVC_E_DTYPE);
  ASSERT_ERR(put_raw(&f, KVC_DTYPE_INT8, 1, 0, 1, raw, raw, 1), KVC_E_DTYPE);
  ASSERT_OK(put_raw(&f, KVC_DTYPE_F32, 1, 0, 1, k, k, 4));
  uint16_t h[4];
  ASSERT_ERR(get_raw(&f, KVC_DTYPE_F16, 1, 0, 1, h, h, 2), KVC_E_DTYPE);
  ASSERT_ERR(get_raw(&f, KVC_DTYPE_F64, 1, 0, 1, d, d, 8), KVC_E_DTYPE);
  int8_t qk[4], qv[4];
  float ks, vs;
  engine_xfer_t x = {.layer_begin = 0, .layer_end = 0, .head_begin = 0, .head_end = 0, .dtype = KVC_DTYPE_INT8};
  engine_io_t io = {1, 0, 1, qk, qv, 4, 4, &ks, &vs, 4, 4};
  ASSERT_OK(engine_get(f.eng, f.cid, &x, &io, 1));
  ASSERT_EQ(qk[3], 127);
  io.k_scale = NULL;
  ASSERT_ERR(engine_get(f.eng, f.cid, &x, &io, 1), KVC_E_INVAL);
  io.k_scale = &ks, io.v_scale_bytes = 8;
  ASSERT_ERR(engine_get(f.eng, f.cid, &x, &io, 1), KVC_E_SIZE);
  io.v_scale_bytes = 0;
  ASSERT_ERR(engine_get(f.eng, f.cid, &x, &io, 1), KVC_E_SIZE);
  fx_close(&f);
}

/* ---- remove ------------------------------------------------------------------------ */

TEST(remove_rejects_bad_arguments) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  ASSERT_OK(fx_put(&f, 1, 0, 10, 0));
  engine_stats_t s0 = fx_stats(&f);
  ASSERT_ERR(engine_remove(f.eng, f.cid + 1, 1, 0, BIG), KVC_E_NOCACHE);
  ASSERT_ERR(engine_remove(f.eng, f.cid, 2, 0, BIG), KVC_E_NOSEQ);
  ASSERT_ERR(engine_remove(f.eng, f.cid, 1, 5, 4), KVC_E_RANGE);
  ASSERT_ERR(engine_remove(f.eng, f.cid, 1, BIG, 0), KVC_E_RANGE);
  ASSERT_ERR(engine_remove(f.eng, f.cid, 1, 2, 5), KVC_E_NOROPE); /* middle */
  ASSERT_ERR(engine_remove(f.eng, f.cid, 1, 0, 5), KVC_E_NOROPE); /* front: shifts too */
  ASSERT_ERR(engine_remove(f.eng, f.cid, 1, 1, 9), KVC_E_NOROPE);
  engine_stats_t s1 = fx_stats(&f);
  FX_STATS_SAME(&s0, &s1);
  ASSERT_U64_EQ(s1.errors, s0.errors + 7);
  FX_EXPECT(&f, 1, 0, 10, 0);
  fx_close(&f);
}

TEST(remove_empty_or_past_end_does_nothing) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  ASSERT_OK(fx_put(&f, 1, 0, 10, 0));
  engine_stats_t s0 = fx_stats(&f);
  ASSERT_OK(engine_remove(f.eng, f.cid, 1, 3, 3));
  ASSERT_OK(engine_remove(f.eng, f.cid, 1, 10, 20));
  ASSERT_OK(engine_remove(f.eng, f.cid, 1, 12, BIG));
  ASSERT_OK(engine_remove(f.eng, f.cid, 1, BIG, BIG));
  engine_stats_t s1 = fx_stats(&f);
  ASSERT_U64_EQ(s1.tokens, s0.tokens);
  ASSERT_U64_EQ(s1.pages_used, s0.pages_used);
  ASSERT_U64_EQ(FX_INFO(&f, 1).length, 10);
  FX_EXPECT(&f, 1, 0, 10, 0);
  fx_close(&f);
}

TEST(remove_truncates_and_frees_pages) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  ASSERT_OK(fx_put(&f, 1, 0, 10, 0)); /* 3 pages */
  ASSERT_OK(engine_remove(f.eng, f.cid, 1, 6, BIG));
  kvc_seq_info_t si = FX_INFO(&f, 1);
  ASSERT_U64_EQ(si.length, 6);
  ASSERT_U64_EQ(si.extent, 6);
  ASSERT_EQ(si.pages, 2);
  engine_stats_t s = fx_stats(&f);
  ASSERT_U64_EQ(s.pages_used, 2);
  ASSERT_U64_EQ(s.pages_free, 6);
  ASSERT_U64_EQ(s.tokens, 6);
  ASSERT_U64_EQ(s.removes, 1);
  FX_EXPECT(&f, 1, 0, 6, 0);
  ASSERT_ERR(fx_get_rc(&f, 1, 5, 2, fx_all(&l)), KVC_E_RANGE);
  ASSERT_OK(engine_remove(f.eng, f.cid, 1, 4, 6)); /* end == extent: truncates */
  ASSERT_U64_EQ(FX_INFO(&f, 1).length, 4);
  ASSERT_EQ(FX_INFO(&f, 1).pages, 1);
  ASSERT_OK(fx_put(&f, 1, 4, 3, 5)); /* appends again where it was cut */
  FX_EXPECT(&f, 1, 0, 4, 0);
  FX_EXPECT(&f, 1, 4, 3, 5);
  fx_close(&f);
}

TEST(remove_whole_range_drops_sequence) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  ASSERT_OK(fx_put(&f, 1, 0, 10, 0));
  ASSERT_OK(fx_put(&f, 2, 0, 5, 0));
  ASSERT_OK(engine_pin(f.eng, f.cid, 2, 3));
  ASSERT_OK(engine_remove(f.eng, f.cid, 1, 0, BIG));
  ASSERT_OK(engine_remove(f.eng, f.cid, 2, 0, 5)); /* exactly the extent; pinned */
  kvc_seq_info_t si;
  ASSERT_ERR(engine_seq_info(f.eng, f.cid, 1, &si), KVC_E_NOSEQ);
  ASSERT_ERR(engine_seq_info(f.eng, f.cid, 2, &si), KVC_E_NOSEQ);
  engine_stats_t s = fx_stats(&f);
  ASSERT_U64_EQ(s.sequences, 0);
  ASSERT_U64_EQ(s.sequences_pinned, 0);
  ASSERT_U64_EQ(s.pages_pinned, 0);
  ASSERT_U64_EQ(s.pages_free, 8);
  ASSERT_U64_EQ(s.tokens, 0);
  ASSERT_EQ(engine_unpin_all(f.eng, 3), 0);
  ASSERT_ERR(engine_remove(f.eng, f.cid, 1, 0, BIG), KVC_E_NOSEQ);
  fx_close(&f);
}

TEST(remove_pipelined_and_trimmed_sequences) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  ASSERT_OK(fx_put(&f, 1, 0, 4, 0));
  ASSERT_OK(fx_put_layers(&f, 1, 4, 4, 0, 1, 0)); /* layer 0 to 8: extent 8 */
  ASSERT_ERR(engine_remove(f.eng, f.cid, 1, 1, 3), KVC_E_NOROPE); /* end < length */
  ASSERT_OK(engine_remove(f.eng, f.cid, 1, 6, 8));
  kvc_seq_info_t si = FX_INFO(&f, 1);
  ASSERT_U64_EQ(si.length, 4);
  ASSERT_U64_EQ(si.extent, 6);
  FX_EXPECT_RNG(&f, 1, 0, 6, fx_rng(&l, 0, 1, 0, 0), 1, 0);
  ASSERT_OK(engine_remove(f.eng, f.cid, 1, 5, 5)); /* empty: nothing */
  ASSERT_U64_EQ(FX_INFO(&f, 1).extent, 6);
  /* end between the length and the extent: a truncation (was NOROPE) */
  ASSERT_OK(engine_remove(f.eng, f.cid, 1, 5, 6));
  si = FX_INFO(&f, 1);
  ASSERT_U64_EQ(si.length, 4);
  ASSERT_U64_EQ(si.extent, 5);
  ASSERT_OK(fx_put_layers(&f, 1, 5, 2, 0, 1, 0)); /* layer 0 to 7 again */
  ASSERT_OK(engine_remove(f.eng, f.cid, 1, 4, 5));
  si = FX_INFO(&f, 1);
  ASSERT_U64_EQ(si.length, 4);
  ASSERT_U64_EQ(si.extent, 4);
  ASSERT_OK(engine_remove(f.eng, f.cid, 1, 3, BIG)); /* cuts every layer */
  si = FX_INFO(&f, 1);
  ASSERT_U64_EQ(si.length, 3);
  ASSERT_U64_EQ(si.extent, 3);
  ASSERT_OK(fx_put(&f, 2, 0, 10, 0));
  ASSERT_OK(engine_trim_front(f.eng, f.cid, 2, 5));
  ASSERT_OK(engine_remove(f.eng, f.cid, 2, 7, BIG));
  ASSERT_U64_EQ(FX_INFO(&f, 2).length, 7);
  ASSERT_OK(engine_remove(f.eng, f.cid, 2, 3, BIG)); /* begin <= start: drops */
  ASSERT_ERR(engine_seq_info(f.eng, f.cid, 2, &si), KVC_E_NOSEQ);
  fx_close(&f);
}

/* kvc_seq_remove's contract (kvcache.h), for every begin and end against
 * every start, length and extent of a small sequence: the length decides. */
TEST(remove_follows_its_contract_for_every_begin_end_length_extent) {
  kvc_layout_t l = fx_small_layout(); /* no RoPE: a middle range is NOROPE */
  uint64_t checked = 0;
  for (uint64_t start = 0; start <= 4; start += 4)
    for (uint64_t len = start; len <= 9; len++)
      for (uint64_t ext = len; ext <= len + 3 && ext <= 10; ext++)
        for (uint64_t b = 0; b <= 12; b++)
          for (uint64_t e = 0; e <= 12; e++) {
            if (ext == start) continue; /* nothing written: no sequence */
            fx_t f;
            fx_open(&f, &l, 16);
            if (len > 0) ASSERT_OK(fx_put(&f, 1, 0, len, 0));
            if (ext > len) ASSERT_OK(fx_put_layers(&f, 1, len, ext - len, 0, 1, 0));
            if (start) ASSERT_OK(engine_trim_front(f.eng, f.cid, 1, start));
            int want = 0;
            uint64_t wlen = len, wext = ext;
            bool gone = false;
            if (b > e) want = KVC_E_RANGE;
            else if (b == e) {
            } else if (e < len) want = KVC_E_NOROPE;
            else if (b <= start) gone = true;
            else if (b < ext) wlen = b < len ? b : len, wext = b;
            int rc = engine_remove(f.eng, f.cid, 1, b, e);
            if (rc != want)
              TEST_FAIL_("start %" PRIu64 " len %" PRIu64 " extent %" PRIu64 ": remove(%" PRIu64
                         ", %" PRIu64 ") = %s, want %s", start, len, ext, b, e,
                         kvc_err_name(rc), kvc_err_name(want));
            kvc_seq_info_t si;
            rc = engine_seq_info(f.eng, f.cid, 1, &si);
            if (gone != (rc == KVC_E_NOSEQ) ||
                (!gone && (si.length != wlen || si.extent != wext || si.start != start)))
              TEST_FAIL_("start %" PRIu64 " len %" PRIu64 " extent %" PRIu64 ": remove(%" PRIu64
                         ", %" PRIu64 ") left %s length %" PRIu64 " extent %" PRIu64
                         ", want %s length %" PRIu64 " extent %" PRIu64, start, len, ext, b, e,
                         rc ? "no sequence" : "a sequence", rc ? 0 : si.length,
                         rc ? 0 : si.extent, gone ? "no sequence" : "a sequence", wlen, wext);
            FX_AUDIT(f.eng);
            fx_close(&f);
            checked++;
          }
  ASSERT(checked > 3000);
}

/* ---- copy_prefix and copy on write ------------------------------------------------ */

TEST(copy_prefix_rejects_bad_arguments) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  ASSERT_OK(fx_put(&f, 1, 0, 10, 0));
  ASSERT_OK(fx_put(&f, 2, 0, 10, 0));
  ASSERT_OK(engine_trim_front(f.eng, f.cid, 2, 5));
  engine_stats_t s0 = fx_stats(&f);
  ASSERT_ERR(engine_copy_prefix(f.eng, f.cid + 1, 1, 3, 4), KVC_E_NOCACHE);
  ASSERT_ERR(engine_copy_prefix(f.eng, f.cid, 1, 1, 4), KVC_E_SAMESEQ);
  ASSERT_ERR(engine_copy_prefix(f.eng, f.cid, 9, 3, 4), KVC_E_NOSEQ);
  ASSERT_ERR(engine_copy_prefix(f.eng, f.cid, 1, 3, 11), KVC_E_RANGE);
  ASSERT_ERR(engine_copy_prefix(f.eng, f.cid, 1, 3, BIG), KVC_E_RANGE);
  ASSERT_ERR(engine_copy_prefix(f.eng, f.cid, 2, 3, 4), KVC_E_RANGE); /* n < start */
  ASSERT_ERR(engine_copy_prefix(f.eng, f.cid, 1, 2, 11), KVC_E_RANGE); /* dst untouched */
  engine_stats_t s1 = fx_stats(&f);
  FX_STATS_SAME(&s0, &s1);
  kvc_seq_info_t si;
  ASSERT_ERR(engine_seq_info(f.eng, f.cid, 3, &si), KVC_E_NOSEQ);
  FX_EXPECT(&f, 2, 5, 5, 0);
  fx_close(&f);
}

TEST(copy_prefix_shares_pages_without_copying) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  ASSERT_OK(fx_put(&f, 1, 0, 10, 0)); /* pages: 4 + 4 + 2 tokens */
  engine_stats_t s0 = fx_stats(&f);
  ASSERT_OK(engine_copy_prefix(f.eng, f.cid, 1, 2, 10));
  engine_stats_t s1 = fx_stats(&f);
  ASSERT_U64_EQ(s1.pages_used, 3);
  ASSERT_U64_EQ(s1.pages_shared, 3);
  ASSERT_U64_EQ(s1.pages_free, 5);
  ASSERT_U64_EQ(s1.sequences, 2);
  ASSERT_U64_EQ(s1.tokens, 20);
  ASSERT_U64_EQ(s1.copies, s0.copies + 1);
  ASSERT_U64_EQ(s1.bytes_in, s0.bytes_in);
  ASSERT_U64_EQ(s1.cow_copies, 0);
  kvc_seq_info_t a = FX_INFO(&f, 1), b = FX_INFO(&f, 2);
  ASSERT(a.pages == 3 && a.shared_pages == 3 && b.pages == 3 && b.shared_pages == 3);
  ASSERT(b.length == 10 && b.extent == 10 && b.start == 0);
  FX_EXPECT_RNG(&f, 2, 0, 10, fx_all(&l), 1, 0); /* seq 2 holds seq 1's payload */
  kvc_cache_info_t ci;
  ASSERT_OK(engine_cache_info(f.eng, f.cid, &ci));
  ASSERT_U64_EQ(ci.pages, 6); /* shared pages counted per use */
  fx_close(&f);
}

/* Copies 10 tokens of seq 1 to seq 2; the last page (tokens 8, 9) is shared
 * and partly filled. */
static void shared_pair(fx_t *f) {
  kvc_layout_t l = fx_small_layout();
  fx_open(f, &l, 8);
  ASSERT_OK(fx_put(f, 1, 0, 10, 0));
  ASSERT_OK(engine_copy_prefix(f->eng, f->cid, 1, 2, 10));
}

TEST(cow_on_append_by_dst_into_shared_partial_page) {
  fx_t f;
  shared_pair(&f);
  ASSERT_OK(fx_put(&f, 2, 10, 1, 9));
  engine_stats_t s = fx_stats(&f);
  ASSERT_U64_EQ(s.cow_copies, 1);
  ASSERT_U64_EQ(s.pages_used, 4);
  ASSERT_U64_EQ(s.pages_shared, 2);
  ASSERT_EQ(FX_INFO(&f, 1).shared_pages, 2);
  FX_EXPECT(&f, 1, 0, 10, 0);
  ASSERT_U64_EQ(FX_INFO(&f, 1).length, 10);
  FX_EXPECT_RNG(&f, 2, 0, 10, fx_all(&f.lay), 1, 0);
  FX_EXPECT(&f, 2, 10, 1, 9);
  ASSERT_OK(fx_put(&f, 1, 10, 2, 4)); /* src's page is its own now: no copy */
  ASSERT_U64_EQ(fx_stats(&f).cow_copies, 1);
  FX_EXPECT(&f, 1, 10, 2, 4);
  FX_EXPECT(&f, 2, 10, 1, 9);
  cache_stats_t cs;
  ASSERT_OK(engine_cache_stats(f.eng, f.cid, &cs));
  ASSERT_U64_EQ(cs.cow_copies, 1);
  fx_close(&f);
}

TEST(cow_on_append_by_src_into_shared_partial_page) {
  fx_t f;
  shared_pair(&f);
  ASSERT_OK(fx_put(&f, 1, 10, 2, 4));
  ASSERT_U64_EQ(fx_stats(&f).cow_copies, 1);
  ASSERT_U64_EQ(fx_stats(&f).pages_used, 4);
  FX_EXPECT_RNG(&f, 2, 0, 10, fx_all(&f.lay), 1, 0);
  ASSERT_U64_EQ(FX_INFO(&f, 2).length, 10);
  ASSERT_OK(fx_put(&f, 2, 10, 2, 9));
  ASSERT_U64_EQ(fx_stats(&f).cow_copies, 1);
  FX_EXPECT(&f, 1, 10, 2, 4);
  FX_EXPECT(&f, 2, 10, 2, 9);
  fx_close(&f);
}

TEST(cow_on_overwrite_of_shared_full_page) {
  fx_t f;
  shared_pair(&f);
  ASSERT_OK(fx_put(&f, 2, 1, 2, 9)); /* page 0, full and shared */
  ASSERT_U64_EQ(fx_stats(&f).cow_copies, 1);
  FX_EXPECT(&f, 1, 0, 10, 0);
  FX_EXPECT_RNG(&f, 2, 0, 1, fx_all(&f.lay), 1, 0);
  FX_EXPECT(&f, 2, 1, 2, 9);
  FX_EXPECT_RNG(&f, 2, 3, 7, fx_all(&f.lay), 1, 0);
  ASSERT_OK(fx_put(&f, 1, 2, 8, 4)); /* pages 0 (own), 1 and 2 (shared): 2 copies */
  ASSERT_U64_EQ(fx_stats(&f).cow_copies, 3);
  ASSERT_U64_EQ(fx_stats(&f).pages_shared, 0);
  ASSERT_U64_EQ(fx_stats(&f).pages_used, 6);
  FX_EXPECT_RNG(&f, 2, 3, 7, fx_all(&f.lay), 1, 0);
  FX_EXPECT(&f, 1, 2, 8, 4);
  fx_close(&f);
}

/* dst's tokens past n share src's partly filled page: writing them must
 * not show through to src. */
TEST(cow_when_prefix_ends_mid_page) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  ASSERT_OK(fx_put(&f, 1, 0, 10, 0));
  ASSERT_OK(engine_copy_prefix(f.eng, f.cid, 1, 2, 6));
  kvc_seq_info_t b = FX_INFO(&f, 2);
  ASSERT(b.length == 6 && b.extent == 6 && b.pages == 2 && b.shared_pages == 2);
  ASSERT_ERR(fx_get_rc(&f, 2, 5, 2, fx_all(&l)), KVC_E_RANGE);
  ASSERT_OK(fx_put(&f, 2, 6, 1, 9));
  ASSERT_U64_EQ(fx_stats(&f).cow_copies, 1);
  FX_EXPECT(&f, 1, 0, 10, 0);
  FX_EXPECT_RNG(&f, 2, 0, 6, fx_all(&l), 1, 0);
  FX_EXPECT(&f, 2, 6, 1, 9);
  fx_close(&f);
}

TEST(copy_prefix_replaces_dst_and_keeps_its_pins) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 16);
  ASSERT_OK(fx_put(&f, 1, 0, 6, 0));
  ASSERT_OK(fx_put(&f, 2, 0, 20, 3)); /* 5 pages of its own */
  ASSERT_OK(engine_pin(f.eng, f.cid, 2, 7));
  ASSERT_OK(engine_copy_prefix(f.eng, f.cid, 1, 2, 5));
  kvc_seq_info_t b = FX_INFO(&f, 2);
  ASSERT(b.length == 5 && b.extent == 5 && b.pages == 2 && b.pins == 1);
  engine_stats_t s = fx_stats(&f);
  ASSERT_U64_EQ(s.pages_used, 2);
  ASSERT_U64_EQ(s.pages_free, 14);
  ASSERT_U64_EQ(s.sequences, 2);
  ASSERT_U64_EQ(s.sequences_pinned, 1);
  ASSERT_U64_EQ(s.pages_pinned, 2);
  ASSERT_U64_EQ(s.tokens, 11);
  FX_EXPECT_RNG(&f, 2, 0, 5, fx_all(&l), 1, 0);
  ASSERT_OK(engine_unpin(f.eng, f.cid, 2, 7));
  fx_close(&f);
}

TEST(copy_prefix_of_trimmed_and_pipelined_src) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 16);
  ASSERT_OK(fx_put(&f, 1, 0, 10, 0));
  ASSERT_OK(engine_trim_front(f.eng, f.cid, 1, 5));
  ASSERT_OK(engine_copy_prefix(f.eng, f.cid, 1, 2, 8));
  kvc_seq_info_t b = FX_INFO(&f, 2);
  ASSERT(b.start == 5 && b.length == 8 && b.pages == 1);
  FX_EXPECT_RNG(&f, 2, 5, 3, fx_all(&l), 1, 0);
  ASSERT_OK(fx_put(&f, 3, 0, 4, 0));
  ASSERT_OK(fx_put_layers(&f, 3, 4, 4, 0, 1, 0)); /* length 4, extent 8 */
  ASSERT_ERR(engine_copy_prefix(f.eng, f.cid, 3, 4, 6), KVC_E_RANGE);
  ASSERT_OK(engine_copy_prefix(f.eng, f.cid, 3, 4, 4));
  b = FX_INFO(&f, 4);
  ASSERT(b.length == 4 && b.extent == 4 && b.pages == 1);
  FX_EXPECT_RNG(&f, 4, 0, 4, fx_all(&l), 3, 0);
  fx_close(&f);
}

/* ---- can_resume and trim_front ----------------------------------------------------- */

TEST(can_resume_values) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  bool ok = true;
  ASSERT_ERR(engine_can_resume(f.eng, f.cid, 1, 0, NULL), KVC_E_INVAL);
  ASSERT_ERR(engine_can_resume(f.eng, f.cid + 1, 1, 0, &ok), KVC_E_NOCACHE);
  ASSERT_OK(engine_can_resume(f.eng, f.cid, 1, 0, &ok)); /* missing, pos 0: true */
  ASSERT(ok);
  ASSERT_OK(engine_can_resume(f.eng, f.cid, 1, 3, &ok)); /* missing: false */
  ASSERT(!ok);
  ASSERT_OK(fx_put(&f, 1, 0, 5, 0));
  for (uint64_t p = 0; p <= 5; p++) {
    ok = false;
    ASSERT_OK(engine_can_resume(f.eng, f.cid, 1, p, &ok));
    ASSERT(ok);
  }
  ASSERT_OK(engine_can_resume(f.eng, f.cid, 1, 6, &ok));
  ASSERT(!ok);
  ok = true;
  ASSERT_OK(engine_can_resume(f.eng, f.cid, 1, BIG, &ok));
  ASSERT(!ok);
  ASSERT_OK(engine_trim_front(f.eng, f.cid, 1, 2)); /* start 2: not causal anymore */
  ok = true;
  ASSERT_OK(engine_can_resume(f.eng, f.cid, 1, 5, &ok));
  ASSERT(!ok);
  fx_close(&f);
}

TEST(trim_front_rejects_bad_arguments) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  ASSERT_OK(fx_put(&f, 1, 0, 10, 0));
  engine_stats_t s0 = fx_stats(&f);
  ASSERT_ERR(engine_trim_front(f.eng, f.cid + 1, 1, 2), KVC_E_NOCACHE);
  ASSERT_ERR(engine_trim_front(f.eng, f.cid, 2, 2), KVC_E_NOSEQ);
  ASSERT_ERR(engine_trim_front(f.eng, f.cid, 1, 11), KVC_E_RANGE);
  ASSERT_ERR(engine_trim_front(f.eng, f.cid, 1, BIG), KVC_E_RANGE);
  engine_stats_t s1 = fx_stats(&f);
  FX_STATS_SAME(&s0, &s1);
  ASSERT_U64_EQ(FX_INFO(&f, 1).start, 0);
  fx_close(&f);
}

TEST(trim_front_frees_whole_pages_and_keeps_positions) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  ASSERT_OK(fx_put(&f, 1, 0, 10, 0)); /* pages [0,4) [4,8) [8,10) */
  ASSERT_OK(engine_trim_front(f.eng, f.cid, 1, 5));
  kvc_seq_info_t si = FX_INFO(&f, 1);
  ASSERT(si.start == 5 && si.length == 10 && si.extent == 10 && si.pages == 2);
  engine_stats_t s = fx_stats(&f);
  ASSERT_U64_EQ(s.pages_used, 2);
  ASSERT_U64_EQ(s.pages_free, 6);
  ASSERT_U64_EQ(s.trims, 1);
  FX_EXPECT(&f, 1, 5, 5, 0);
  ASSERT_ERR(fx_get_rc(&f, 1, 4, 1, fx_all(&l)), KVC_E_RANGE);
  ASSERT_ERR(fx_get_rc(&f, 1, 0, 10, fx_all(&l)), KVC_E_RANGE);
  ASSERT_ERR(fx_put(&f, 1, 4, 2, 1), KVC_E_RANGE); /* before start */
  ASSERT_OK(engine_trim_front(f.eng, f.cid, 1, 3)); /* n <= start: nothing */
  ASSERT_U64_EQ(FX_INFO(&f, 1).start, 5);
  ASSERT_OK(fx_put(&f, 1, 5, 1, 2)); /* overwrite at start, append at the end */
  ASSERT_OK(fx_put(&f, 1, 10, 3, 2));
  FX_EXPECT(&f, 1, 5, 1, 2);
  FX_EXPECT(&f, 1, 6, 4, 0);
  FX_EXPECT(&f, 1, 10, 3, 2);
  ASSERT_OK(engine_trim_front(f.eng, f.cid, 1, 8)); /* page [4,8) goes */
  si = FX_INFO(&f, 1);
  ASSERT(si.start == 8 && si.length == 13 && si.pages == 2);
  ASSERT_U64_EQ(fx_stats(&f).pages_used, 2);
  fx_close(&f);
}

TEST(trim_front_to_the_end_then_append) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  ASSERT_OK(fx_put(&f, 1, 0, 8, 0));
  ASSERT_OK(engine_trim_front(f.eng, f.cid, 1, 8));
  kvc_seq_info_t si = FX_INFO(&f, 1);
  ASSERT(si.start == 8 && si.length == 8 && si.pages == 0);
  ASSERT_U64_EQ(fx_stats(&f).pages_free, 8);
  ASSERT_U64_EQ(fx_stats(&f).tokens, 8); /* length is still 8 */
  ASSERT_OK(fx_put(&f, 1, 8, 2, 1));
  FX_EXPECT(&f, 1, 8, 2, 1);
  ASSERT_EQ(FX_INFO(&f, 1).pages, 1);
  fx_close(&f);
}

TEST(trim_front_of_shared_pages_keeps_the_other_side) {
  fx_t f;
  shared_pair(&f);
  ASSERT_OK(engine_trim_front(f.eng, f.cid, 1, 9));
  engine_stats_t s = fx_stats(&f);
  ASSERT_U64_EQ(s.pages_used, 3); /* seq 2 still holds all three */
  ASSERT_U64_EQ(s.pages_shared, 1);
  ASSERT_EQ(FX_INFO(&f, 1).pages, 1);
  ASSERT_EQ(FX_INFO(&f, 2).shared_pages, 1);
  FX_EXPECT_RNG(&f, 2, 0, 10, fx_all(&f.lay), 1, 0);
  FX_EXPECT(&f, 1, 9, 1, 0);
  fx_close(&f);
}

/* ---- pins ----------------------------------------------------------------------------- */

TEST(pin_rejects_bad_arguments) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  ASSERT_OK(fx_put(&f, 1, 0, 3, 0));
  ASSERT_ERR(engine_pin(f.eng, f.cid + 1, 1, 1), KVC_E_NOCACHE);
  ASSERT_ERR(engine_pin(f.eng, f.cid, 2, 1), KVC_E_NOSEQ);
  ASSERT_ERR(engine_unpin(f.eng, f.cid + 1, 1, 1), KVC_E_NOCACHE);
  ASSERT_ERR(engine_unpin(f.eng, f.cid, 2, 1), KVC_E_NOSEQ);
  ASSERT_ERR(engine_unpin(f.eng, f.cid, 1, 1), KVC_E_NOTPINNED);
  ASSERT_OK(engine_pin(f.eng, f.cid, 1, 1));
  ASSERT_ERR(engine_unpin(f.eng, f.cid, 1, 2), KVC_E_NOTPINNED); /* another owner */
  ASSERT_EQ(FX_INFO(&f, 1).pins, 1);
  kvc_seq_info_t si;
  ASSERT_ERR(engine_seq_info(f.eng, f.cid, 2, &si), KVC_E_NOSEQ); /* pin made nothing */
  fx_close(&f);
}

TEST(pin_is_idempotent_per_owner) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  ASSERT_OK(fx_put(&f, 1, 0, 6, 0));
  ASSERT_OK(engine_pin(f.eng, f.cid, 1, 1));
  ASSERT_OK(engine_pin(f.eng, f.cid, 1, 1));
  ASSERT_EQ(FX_INFO(&f, 1).pins, 1);
  ASSERT_OK(engine_pin(f.eng, f.cid, 1, BIG)); /* any u64 is an owner */
  ASSERT_EQ(FX_INFO(&f, 1).pins, 2);
  engine_stats_t s = fx_stats(&f);
  ASSERT_U64_EQ(s.sequences_pinned, 1);
  ASSERT_U64_EQ(s.pages_pinned, 2);
  ASSERT_OK(engine_unpin(f.eng, f.cid, 1, 1));
  ASSERT_EQ(FX_INFO(&f, 1).pins, 1);
  ASSERT_ERR(engine_unpin(f.eng, f.cid, 1, 1), KVC_E_NOTPINNED);
  ASSERT_OK(engine_unpin(f.eng, f.cid, 1, BIG));
  s = fx_stats(&f);
  ASSERT_U64_EQ(s.sequences_pinned, 0);
  ASSERT_U64_EQ(s.pages_pinned, 0);
  ASSERT_U64_EQ(s.unpins, 2);
  fx_close(&f);
}

TEST(unpin_all_releases_one_owner) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  uint32_t c2;
  ASSERT_OK(engine_cache_open(f.eng, "two", &l, &c2));
  for (uint64_t s = 1; s <= 3; s++) ASSERT_OK(fx_put(&f, s, 0, 2, 0));
  ASSERT_OK(fx_put(&f, 4, 0, 2, 0));
  uint32_t main_cid = f.cid;
  f.cid = c2;
  ASSERT_OK(fx_put(&f, 1, 0, 2, 0)); /* seq 1 of the second cache */
  f.cid = main_cid;
  for (uint64_t s = 1; s <= 3; s++) ASSERT_OK(engine_pin(f.eng, f.cid, s, 5));
  ASSERT_OK(engine_pin(f.eng, c2, 1, 5));
  ASSERT_OK(engine_pin(f.eng, f.cid, 2, 6));
  ASSERT_EQ(engine_unpin_all(f.eng, 5), 4);
  ASSERT_EQ(FX_INFO(&f, 1).pins, 0);
  ASSERT_EQ(FX_INFO(&f, 2).pins, 1);
  ASSERT_U64_EQ(fx_stats(&f).sequences_pinned, 1);
  ASSERT_EQ(engine_unpin_all(f.eng, 5), 0);
  ASSERT_EQ(engine_unpin_all(f.eng, 99), 0);
  ASSERT_EQ(engine_unpin_all(f.eng, 6), 1);
  ASSERT_U64_EQ(fx_stats(&f).sequences_pinned, 0);
  fx_close(&f);
}

/* ---- seq_info and seq_list ------------------------------------------------------------ */

TEST(seq_info_fields_and_last_use) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  kvc_seq_info_t si;
  ASSERT_ERR(engine_seq_info(f.eng, f.cid, 1, NULL), KVC_E_INVAL);
  ASSERT_ERR(engine_seq_info(f.eng, f.cid + 1, 1, &si), KVC_E_NOCACHE);
  ASSERT_ERR(engine_seq_info(f.eng, f.cid, 1, &si), KVC_E_NOSEQ);
  engine_set_now(f.eng, 1000);
  ASSERT_OK(fx_put(&f, BIG, 0, 7, 0)); /* any u64 is a seq_id */
  si = FX_INFO(&f, BIG);
  ASSERT_U64_EQ(si.seq_id, BIG);
  ASSERT(si.start == 0 && si.length == 7 && si.extent == 7 && si.pages == 2);
  ASSERT(si.shared_pages == 0 && si.pins == 0);
  ASSERT_U64_EQ(si.last_use_ms, 1000);
  engine_set_now(f.eng, 2500);
  FX_EXPECT(&f, BIG, 0, 7, 0); /* a read touches */
  ASSERT_U64_EQ(FX_INFO(&f, BIG).last_use_ms, 2500);
  engine_set_now(f.eng, 4000);
  ASSERT_OK(fx_put(&f, BIG, 7, 1, 0)); /* a write touches */
  ASSERT_U64_EQ(FX_INFO(&f, BIG).last_use_ms, 4000);
  fx_close(&f);
}

/* Lists every sequence of the cache from cursor 0 with a cap of `cap`, and
 * checks each of ids [1, n] comes exactly once. */
static void expect_listing(fx_t *f, uint64_t n, size_t cap) {
  unsigned char *seen = calloc(n + 1, 1);
  kvc_seq_info_t out[16];
  uint64_t cursor = 0, total = 0;
  int rounds = 0;
  do {
    size_t got = 99;
    ASSERT_OK(engine_seq_list(f->eng, f->cid, &cursor, out, cap, &got));
    ASSERT(got <= cap);
    for (size_t i = 0; i < got; i++) {
      ASSERT(out[i].seq_id >= 1 && out[i].seq_id <= n);
      ASSERT_EQ(seen[out[i].seq_id]++, 0);
      ASSERT_U64_EQ(out[i].length, out[i].seq_id % 5 + 1);
      total++;
    }
    ASSERT(++rounds < 10000);
  } while (cursor != 0);
  ASSERT_U64_EQ(total, n);
  free(seen);
}

TEST(seq_list_covers_every_sequence_once) {
  fx_t f;
  kvc_layout_t l = fx_layout(1, 1, 4, 4, KVC_DTYPE_F32, 16);
  fx_open(&f, &l, 256);
  uint64_t cursor = 0;
  size_t n = 7;
  kvc_seq_info_t out[16];
  ASSERT_ERR(engine_seq_list(f.eng, f.cid + 1, &cursor, out, 16, &n), KVC_E_NOCACHE);
  ASSERT_ERR(engine_seq_list(f.eng, f.cid, NULL, out, 16, &n), KVC_E_INVAL);
  ASSERT_ERR(engine_seq_list(f.eng, f.cid, &cursor, out, 16, NULL), KVC_E_INVAL);
  ASSERT_OK(engine_seq_list(f.eng, f.cid, &cursor, out, 16, &n)); /* empty cache */
  ASSERT(n == 0 && cursor == 0);
  for (uint64_t s = 1; s <= 200; s++) ASSERT_OK(fx_put(&f, s, 0, s % 5 + 1, 0));
  uint32_t c2;
  ASSERT_OK(engine_cache_open(f.eng, "other", &l, &c2)); /* its sequences stay apart */
  uint32_t main_cid = f.cid;
  f.cid = c2;
  ASSERT_OK(fx_put(&f, 1000, 0, 1, 0));
  f.cid = main_cid;
  expect_listing(&f, 200, 1);
  expect_listing(&f, 200, 7);
  expect_listing(&f, 200, 16);
  fx_close(&f);
}

/* ---- eviction -------------------------------------------------------------------------- */

/* A pool of npages with seqs 1..nseq of one page each, written in id order
 * (seq 1 least recently used), at clock 10 * id. */
static void full_pool(fx_t *f, uint64_t npages, uint64_t nseq) {
  kvc_layout_t l = fx_small_layout();
  fx_open(f, &l, npages);
  for (uint64_t s = 1; s <= nseq; s++) {
    engine_set_now(f->eng, 10 * s);
    ASSERT_OK(fx_put(f, s, 0, 4, 0));
  }
}

static bool seq_exists(fx_t *f, uint64_t seq) {
  kvc_seq_info_t si;
  int rc = engine_seq_info(f->eng, f->cid, seq, &si);
  if (rc != 0 && rc != KVC_E_NOSEQ) TEST_FAIL_("seq_info: %s", kvc_err_name(rc));
  return rc == 0;
}

TEST(evict_least_recently_used_first) {
  fx_t f;
  full_pool(&f, 6, 6);
  engine_set_now(f.eng, 100);
  FX_EXPECT(&f, 1, 0, 4, 0); /* a read makes 1 the most recent */
  ASSERT_OK(fx_put(&f, 7, 0, 4, 0));
  ASSERT(!seq_exists(&f, 2) && seq_exists(&f, 1));
  engine_stats_t s = fx_stats(&f);
  ASSERT_U64_EQ(s.evicted_sequences, 1);
  ASSERT_U64_EQ(s.evicted_pages, 1);
  ASSERT_OK(fx_put(&f, 3, 1, 1, 0)); /* a write makes 3 recent */
  ASSERT_OK(fx_put(&f, 8, 0, 8, 0)); /* 2 pages: 4 then 5 go */
  ASSERT(!seq_exists(&f, 4) && !seq_exists(&f, 5));
  for (uint64_t q = 1; q <= 8; q++)
    if (q != 2 && q != 4 && q != 5) ASSERT(seq_exists(&f, q));
  s = fx_stats(&f);
  ASSERT_U64_EQ(s.evicted_sequences, 3);
  ASSERT_U64_EQ(s.evicted_pages, 3);
  ASSERT_U64_EQ(s.pages_free, 0);
  ASSERT_U64_EQ(s.sequences, 5);
  cache_stats_t cs;
  ASSERT_OK(engine_cache_stats(f.eng, f.cid, &cs));
  ASSERT_U64_EQ(cs.evicted_sequences, 3);
  FX_EXPECT(&f, 1, 0, 4, 0);
  FX_EXPECT(&f, 8, 0, 8, 0);
  fx_close(&f);
}

TEST(evict_never_takes_a_pinned_sequence) {
  fx_t f;
  full_pool(&f, 4, 4);
  ASSERT_OK(engine_pin(f.eng, f.cid, 1, 1));
  ASSERT_OK(engine_pin(f.eng, f.cid, 2, 2));
  ASSERT_OK(fx_put(&f, 5, 0, 4, 0));
  ASSERT(seq_exists(&f, 1) && seq_exists(&f, 2) && !seq_exists(&f, 3));
  ASSERT_OK(fx_put(&f, 6, 0, 4, 0));
  ASSERT(seq_exists(&f, 1) && seq_exists(&f, 2) && !seq_exists(&f, 4));
  ASSERT_OK(engine_unpin(f.eng, f.cid, 1, 1));
  ASSERT_OK(fx_put(&f, 7, 0, 12, 0)); /* 3 pages: every unpinned one goes */
  ASSERT(!seq_exists(&f, 1) && seq_exists(&f, 2) && !seq_exists(&f, 5));
  fx_close(&f);
}

/* Regression: pin set last_use_ms and unpin put the sequence at the most
 * recently used end, so a sequence last read or written long ago outlived
 * newer ones. The brief's order is by last read or write ("every read or
 * write touches"), the clock seq_info reports as last_use_ms. */
/* Design decision (doc/design.md): a worker pins what it works on, so pin
 * and unpin count as uses; an unpinned sequence rejoins the LRU as the most
 * recent, as vLLM returns a finished request's blocks to the tail of its
 * free queue. */
TEST(pin_and_unpin_count_as_use) {
  fx_t f;
  full_pool(&f, 4, 4); /* last use: seq s at 10 * s */
  ASSERT_OK(engine_pin(f.eng, f.cid, 1, 1));
  engine_set_now(f.eng, 100);
  ASSERT_OK(engine_unpin(f.eng, f.cid, 1, 1));
  ASSERT_U64_EQ(FX_INFO(&f, 1).last_use_ms, 100);
  ASSERT_OK(fx_put(&f, 5, 0, 4, 0));
  ASSERT(seq_exists(&f, 1)); /* unpinned at 100: after 2, 3, 4 */
  ASSERT(!seq_exists(&f, 2));
  fx_close(&f);
}

/* Reads back seqs 1..n, each ntok tokens of salt 0. */
static void expect_all(fx_t *f, uint64_t n, uint64_t ntok) {
  for (uint64_t s = 1; s <= n; s++) FX_EXPECT(f, s, 0, ntok, 0);
}

TEST(full_when_pinned_pages_leave_no_room) {
  fx_t f;
  full_pool(&f, 6, 6);
  for (uint64_t s = 1; s <= 3; s++) ASSERT_OK(engine_pin(f.eng, f.cid, s, 1));
  engine_stats_t s0 = fx_stats(&f);
  ASSERT_ERR(fx_put(&f, 9, 0, 16, 0), KVC_E_FULL); /* 4 pages, 3 freeable */
  const engine_err_t *e = engine_last_error(f.eng);
  ASSERT_EQ(e->code, KVC_E_FULL);
  ASSERT_U64_EQ(e->needed, 4);
  ASSERT_U64_EQ(e->freeable, 3);
  ASSERT_ERR(fx_put(&f, 1, 4, 16, 0), KVC_E_FULL); /* an append of 4 pages */
  ASSERT_U64_EQ(engine_last_error(f.eng)->needed, 4);
  engine_stats_t s1 = fx_stats(&f);
  FX_STATS_SAME_BUT_HEAP(&s0, &s1); /* heap: failed_put_keeps_no_allocation */
  ASSERT_U64_EQ(s1.full_errors, s0.full_errors + 2);
  ASSERT_U64_EQ(s1.evicted_sequences, 0);
  FX_AUDIT(f.eng);
  expect_all(&f, 6, 4);
  cache_stats_t cs;
  ASSERT_OK(engine_cache_stats(f.eng, f.cid, &cs));
  ASSERT_U64_EQ(cs.full_errors, 2);
  ASSERT_OK(fx_put(&f, 1, 1, 3, 0)); /* an overwrite needs no page */
  ASSERT_OK(fx_put(&f, 9, 0, 12, 0)); /* 3 pages fit: 4, 5, 6 go */
  ASSERT(!seq_exists(&f, 4) && !seq_exists(&f, 5) && !seq_exists(&f, 6));
  fx_close(&f);
}

TEST(full_batched_put_is_all_or_nothing) {
  fx_t f;
  full_pool(&f, 6, 6);
  for (uint64_t s = 1; s <= 3; s++) ASSERT_OK(engine_pin(f.eng, f.cid, s, 1));
  engine_stats_t s0 = fx_stats(&f);
  /* two new sequences of 2 pages each: 4 needed, 3 freeable */
  fx_rng_t r = fx_all(&f.lay);
  fx_buf_t b[2] = {fx_buf_new(&f.lay, r, 8), fx_buf_new(&f.lay, r, 8)};
  engine_io_t io[2] = {fx_io(20, 0, 8, &b[0]), fx_io(21, 0, 8, &b[1])};
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  ASSERT_ERR(engine_put(f.eng, f.cid, &x, io, 2), KVC_E_FULL);
  ASSERT_U64_EQ(engine_last_error(f.eng)->needed, 4);
  ASSERT_U64_EQ(engine_last_error(f.eng)->freeable, 3);
  engine_stats_t s1 = fx_stats(&f);
  FX_STATS_SAME_BUT_HEAP(&s0, &s1);
  ASSERT(!seq_exists(&f, 20) && !seq_exists(&f, 21));
  FX_AUDIT(f.eng);
  expect_all(&f, 6, 4);
  io[1].ntokens = 4, io[1].k_bytes /= 2, io[1].v_bytes /= 2; /* 3 pages: fits */
  ASSERT_OK(engine_put(f.eng, f.cid, &x, io, 2));
  ASSERT(seq_exists(&f, 20) && seq_exists(&f, 21) && !seq_exists(&f, 6));
  fx_buf_free(&b[0]);
  fx_buf_free(&b[1]);
  fx_close(&f);
}

/* The oldest sequence is part of the call: the engine must pass over it. */
TEST(put_never_evicts_its_own_sequences) {
  fx_t f;
  full_pool(&f, 4, 4);
  fx_rng_t r = fx_all(&f.lay);
  fx_buf_t b[2] = {fx_buf_new(&f.lay, r, 4), fx_buf_new(&f.lay, r, 4)};
  fx_fill(&f.lay, r, 1, 4, 4, 0, b[0].k, b[0].v);
  fx_fill(&f.lay, r, 9, 0, 4, 0, b[1].k, b[1].v);
  engine_io_t io[2] = {fx_io(1, 4, 4, &b[0]), fx_io(9, 0, 4, &b[1])};
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  ASSERT_OK(engine_put(f.eng, f.cid, &x, io, 2)); /* 2 pages: 2 and 3 go, not 1 */
  ASSERT(seq_exists(&f, 1) && !seq_exists(&f, 2) && !seq_exists(&f, 3));
  FX_EXPECT(&f, 1, 0, 8, 0);
  FX_EXPECT(&f, 9, 0, 4, 0);
  FX_EXPECT(&f, 4, 0, 4, 0);
  fx_buf_free(&b[0]);
  fx_buf_free(&b[1]);
  fx_close(&f);
}

/* Evicting a sequence whose pages another holds frees nothing: the engine
 * goes on to the next, and the FULL figures count only pages that free. */
TEST(evict_counts_only_pages_that_free) {
  fx_t f;
  full_pool(&f, 4, 2); /* seqs 1, 2: one page each, 2 pages free */
  ASSERT_OK(engine_copy_prefix(f.eng, f.cid, 2, 3, 4)); /* 3 shares 2's page */
  ASSERT_OK(engine_pin(f.eng, f.cid, 2, 1));
  ASSERT_OK(fx_put(&f, 4, 0, 12, 0)); /* 3 pages: 2 free + seq 1 */
  ASSERT(!seq_exists(&f, 1) && seq_exists(&f, 3));
  ASSERT_U64_EQ(fx_stats(&f).evicted_pages, 1);
  ASSERT_OK(engine_pin(f.eng, f.cid, 4, 1));
  /* only 3 is evictable, and its one page is 2's too: nothing can free */
  ASSERT_ERR(fx_put(&f, 5, 0, 4, 0), KVC_E_FULL);
  ASSERT_U64_EQ(engine_last_error(f.eng)->needed, 1);
  ASSERT_U64_EQ(engine_last_error(f.eng)->freeable, 0);
  ASSERT(seq_exists(&f, 3)); /* all or nothing: not evicted for nothing */
  FX_AUDIT(f.eng);
  FX_EXPECT_RNG(&f, 3, 0, 4, fx_all(&f.lay), 2, 0);
  ASSERT_OK(engine_unpin(f.eng, f.cid, 2, 1));
  ASSERT_OK(fx_put(&f, 5, 0, 4, 0)); /* 3 then 2 go: the page frees */
  ASSERT(!seq_exists(&f, 3) && !seq_exists(&f, 2));
  fx_close(&f);
}

/* Regression: a write into a page shared with an evictable sequence counted
 * the copy as needed even when evicting that sequence leaves the page to the
 * writer alone. The brief reclaims unpinned sequences "until the write fits":
 * here it fits once seq 2 is gone, with no page at all. */
TEST(cow_put_evicts_the_other_holder_instead_of_full) {
  fx_t f;
  full_pool(&f, 1, 1);
  ASSERT_OK(engine_copy_prefix(f.eng, f.cid, 1, 2, 4)); /* the one page, shared */
  engine_set_now(f.eng, 1000);
  FX_EXPECT(&f, 1, 0, 4, 0); /* 2 is the least recently used */
  ASSERT_OK(fx_put(&f, 1, 0, 1, 5));
  ASSERT(!seq_exists(&f, 2));
  FX_EXPECT(&f, 1, 0, 1, 5);
  FX_EXPECT(&f, 1, 1, 3, 0);
  fx_close(&f);
}

/* ---- page offsets and trims inside a page ------------------------------------------------- */

TEST(page_offset_values_follow_sharing) {
  fx_t f;
  shared_pair(&f); /* seq 2 = seq 1's 10 tokens */
  uint64_t a, b;
  ASSERT_ERR(engine_page_offset(f.eng, f.cid, 1, 0, NULL), KVC_E_INVAL);
  ASSERT_ERR(engine_page_offset(f.eng, f.cid + 1, 1, 0, &a), KVC_E_NOCACHE);
  ASSERT_ERR(engine_page_offset(f.eng, f.cid, 9, 0, &a), KVC_E_NOSEQ);
  ASSERT_ERR(engine_page_offset(f.eng, f.cid, 1, 10, &a), KVC_E_RANGE);
  ASSERT_ERR(engine_page_offset(f.eng, f.cid, 1, BIG, &a), KVC_E_RANGE);
  for (uint64_t p = 0; p < 10; p++) {
    ASSERT_OK(engine_page_offset(f.eng, f.cid, 1, p, &a));
    ASSERT_OK(engine_page_offset(f.eng, f.cid, 2, p, &b));
    ASSERT_U64_EQ(a, b);
    ASSERT(a % f.page_bytes == 0 && a / f.page_bytes < f.npages);
  }
  ASSERT_OK(engine_page_offset(f.eng, f.cid, 1, 3, &a));
  ASSERT_OK(engine_page_offset(f.eng, f.cid, 1, 4, &b));
  ASSERT(a != b);
  ASSERT_OK(fx_put(&f, 2, 9, 1, 3)); /* COW of the last page */
  ASSERT_OK(engine_page_offset(f.eng, f.cid, 1, 9, &a));
  ASSERT_OK(engine_page_offset(f.eng, f.cid, 2, 9, &b));
  ASSERT(a != b);
  ASSERT_OK(engine_trim_front(f.eng, f.cid, 1, 5));
  ASSERT_ERR(engine_page_offset(f.eng, f.cid, 1, 4, &a), KVC_E_RANGE);
  fx_close(&f);
}

/* Trimming to the end inside a page keeps positions: the next append lands
 * in the page that holds them. */
TEST(trim_front_to_the_end_inside_a_page_then_append) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  ASSERT_OK(fx_put(&f, 1, 0, 10, 0));
  ASSERT_OK(engine_trim_front(f.eng, f.cid, 1, 10));
  kvc_seq_info_t si = FX_INFO(&f, 1);
  ASSERT(si.start == 10 && si.length == 10 && si.pages <= 1);
  ASSERT_ERR(fx_get_rc(&f, 1, 9, 1, fx_all(&l)), KVC_E_RANGE);
  ASSERT_OK(fx_put(&f, 1, 10, 3, 2)); /* 10, 11 in page 2; 12 in page 3 */
  FX_EXPECT(&f, 1, 10, 3, 2);
  si = FX_INFO(&f, 1);
  ASSERT_EQ(si.pages, 2);
  ASSERT_U64_EQ(fx_stats(&f).pages_used, 2);
  fx_close(&f);
}

/* llama.cpp's seq_cp with p0 > 0: dst holds [p0, p1) of src at the same
 * positions, pages shared from the page of p0, nothing below p0 readable. */
TEST(copy_range_shares_a_middle_range_at_its_positions) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  ASSERT_OK(fx_put(&f, 1, 0, 16, 0)); /* 4 pages of 4 */
  ASSERT_OK(engine_copy_range(f.eng, f.cid, 1, 2, 5, 13));
  kvc_seq_info_t b = FX_INFO(&f, 2);
  ASSERT(b.start == 5 && b.length == 13 && b.extent == 13);
  ASSERT_U64_EQ(b.pages, 3); /* pages of 4..7, 8..11, 12..15 */
  ASSERT_U64_EQ(b.shared_pages, 3);
  ASSERT_U64_EQ(fx_stats(&f).pages_used, 4); /* nothing copied */
  FX_EXPECT_RNG(&f, 2, 5, 8, fx_all(&l), 1, 0);
  ASSERT_ERR(fx_get_rc(&f, 2, 4, 1, fx_all(&l)), KVC_E_RANGE); /* below its start */
  ASSERT_ERR(fx_get_rc(&f, 2, 13, 1, fx_all(&l)), KVC_E_RANGE); /* past its length */
  ASSERT_OK(fx_put(&f, 2, 13, 2, 9)); /* it goes on from p1: copy on write of page 3 */
  FX_EXPECT(&f, 2, 13, 2, 9);
  FX_EXPECT(&f, 1, 12, 4, 0); /* the source is untouched */
  ASSERT_ERR(engine_copy_range(f.eng, f.cid, 1, 3, 7, 7), KVC_E_RANGE);
  ASSERT_ERR(engine_copy_range(f.eng, f.cid, 1, 3, 2, 17), KVC_E_RANGE);
  ASSERT_ERR(engine_copy_range(f.eng, f.cid, 1, 1, 2, 5), KVC_E_SAMESEQ);
  ASSERT_OK(engine_copy_range(f.eng, f.cid, 1, 3, 0, 6)); /* p0 0: a prefix */
  ASSERT_U64_EQ(FX_INFO(&f, 3).start, 0);
  FX_AUDIT(f.eng);
  fx_close(&f);
}
