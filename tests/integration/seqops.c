/* seqops.c: the sequence and cache operations that move no tensor bytes,
 * through the client library: remove, can_resume, trim_front, list, clear. */
#include "harness.h"

static void put_tokens(kvc_cache_t *h, uint64_t seq, uint64_t pos, uint64_t n) {
  const kvc_layout_t *l = kvc_cache_layout(h);
  float *k = calloc(it_tok_floats(l, false) * n, 4), *v = calloc(it_tok_floats(l, true) * n, 4);
  it_fill_f32(k, v, l, seq, pos, n, 0);
  ASSERT_OK(kvc_put(h, seq, pos, n, k, v));
  free(k);
  free(v);
}

TEST(seqops_remove_resume_trim_list_clear) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "ops", &l, &h));
  ASSERT_EQ(kvc_cache_layout(h)->page_tokens, 16);
  ASSERT_STR_EQ(kvc_cache_name(h), "ops");
  put_tokens(h, 1, 0, 50);
  put_tokens(h, 2, 0, 10);

  bool ok = false;
  ASSERT_OK(kvc_seq_can_resume(h, 1, 50, &ok));
  ASSERT(ok);
  ASSERT_OK(kvc_seq_can_resume(h, 1, 51, &ok));
  ASSERT(!ok);
  ASSERT_OK(kvc_seq_can_resume(h, 77, 0, &ok));
  ASSERT(ok);

  /* Truncate to 40 tokens: the fourth page goes. */
  ASSERT_OK(kvc_seq_remove(h, 1, 40, UINT64_MAX));
  kvc_seq_info_t si;
  ASSERT_OK(kvc_seq_info(h, 1, &si));
  ASSERT_U64_EQ(si.length, 40);
  ASSERT_EQ(si.pages, 3);

  /* Sliding window: drop the first 33 tokens, two whole pages are freed. */
  uint64_t used = stat_get(c, "pages_used", NULL);
  ASSERT_OK(kvc_seq_trim_front(h, 1, 33));
  ASSERT_OK(kvc_seq_info(h, 1, &si));
  ASSERT_U64_EQ(si.start, 33);
  ASSERT_U64_EQ(si.length, 40);
  ASSERT_U64_EQ(stat_get(c, "pages_used", NULL), used - 2);
  ASSERT_OK(kvc_seq_can_resume(h, 1, 40, &ok));
  ASSERT(!ok); /* the causal prefix is gone */
  float buf[4096];
  ASSERT_ERR(kvc_get(h, 1, 0, 1, buf, buf), KVC_E_RANGE);
  ASSERT_OK(kvc_get(h, 1, 33, 34, buf, buf));

  /* Remove everything of seq 2: it is dropped. */
  ASSERT_OK(kvc_seq_remove(h, 2, 0, UINT64_MAX));
  ASSERT_ERR(kvc_seq_info(h, 2, &si), KVC_E_NOSEQ);

  /* List and info. */
  kvc_cache_info_t infos[4];
  size_t n = 0;
  ASSERT_OK(kvc_cache_list(c, infos, 4, &n));
  ASSERT_EQ(n, 1);
  ASSERT_STR_EQ(infos[0].name, "ops");
  ASSERT_U64_EQ(infos[0].sequences, 1);
  ASSERT_EQ(infos[0].layout.head_dim_k, 32);
  ASSERT_U64_EQ(infos[0].page_bytes, 16384);

  /* Clear drops pinned sequences too; the cache stays. */
  put_tokens(h, 3, 0, 5);
  ASSERT_OK(kvc_seq_pin(h, 3));
  ASSERT_OK(kvc_cache_clear(h));
  ASSERT_ERR(kvc_seq_info(h, 3, &si), KVC_E_NOSEQ);
  ASSERT_U64_EQ(stat_get(c, "sequences", "ops"), 0);
  ASSERT_U64_EQ(stat_get(c, "pages_used", NULL), 0);
  ASSERT_U64_EQ(stat_get(c, "removes_total", NULL), 2);
  ASSERT_U64_EQ(stat_get(c, "trims_total", NULL), 1);
  ASSERT_U64_EQ(stat_get(c, "requests_total{op=can_resume}", NULL), 4);
  put_tokens(h, 4, 0, 1);
  kvc_cache_close(h);
  kvc_client_close(c);
  daemon_stop(&d);
}
