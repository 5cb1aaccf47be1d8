/* attention.c: attention-aware sequences through the daemon: a window cache
 * with a RoPE description opened over the wire, a forward pass as reserve,
 * one batched put and a history view with its mask, then shift, llama.cpp's
 * seq_punch (llama.cpp's seq_rm) / seq_keep / pos_min / pos_max and a middle remove, and the errors
 * of each new request. */
#include <math.h>

#include "harness.h"

#define X (-INFINITY)

static kvc_layout_t win_layout(void) {
  kvc_layout_t l = {.num_layers = 1, .num_kv_heads = 1, .head_dim_k = 2, .head_dim_v = 1,
                    .dtype = KVC_DTYPE_F32, .page_tokens = 2};
  l.attn = KVC_ATTN_WINDOW;
  l.attn_window = 2;
  l.attn_memory = 3;
  l.rope_dims = 2;
  l.rope_theta = 10000;
  return l;
}

/* Puts one batch: entries per sequence, K = (v, -v), V = v. */
static void put_batch(kvc_cache_t *h, const kvc_tok_t *t, const float *vals, size_t n) {
  float k[2][64], v[2][32]; /* up to 32 tokens a sequence */
  kvc_io_t io[2];
  size_t nio = 0;
  for (size_t i = 0; i < n; i++) {
    size_t j = 0;
    while (j < nio && io[j].seq_id != t[i].seq_id) j++;
    if (j == nio) io[nio++] = (kvc_io_t){t[i].seq_id, t[i].pos, 0, k[j], v[j], NULL, NULL, NULL};
    uint64_t q = io[j].ntokens++;
    k[j][2 * q] = vals[i], k[j][2 * q + 1] = -vals[i], v[j][q] = vals[i];
  }
  ASSERT_OK(kvc_put_batch(h, NULL, io, nio));
}

static void expect_history(kvc_client_t *c, kvc_cache_t *h, const kvc_tok_t *t, size_t n,
                           size_t nwant, const float *want, const float *wmask) {
  kvc_hist_t hi;
  kvc_hist_span_t spans[4];
  ASSERT_OK(kvc_history(h, NULL, t, n, &hi, spans, 4));
  ASSERT_U64_EQ(hi.entries, nwant);
  ASSERT_U64_EQ(hi.k_bytes, nwant * 8);
  ASSERT_U64_EQ(hi.mask_bytes, n * nwant * 4);
  void *base;
  uint64_t bytes;
  kvc_client_shm(c, &base, &bytes);
  const float *k = (const float *)((char *)base + hi.k_off);
  const float *v = (const float *)((char *)base + hi.v_off);
  const float *m = (const float *)((char *)base + hi.mask_off);
  for (size_t j = 0; j < nwant; j++) {
    if (v[j] != want[j] || k[2 * j] != want[j])
      TEST_FAIL_("entry %zu: K %g V %g, expected %g", j, (double)k[2 * j], (double)v[j],
                 (double)want[j]);
  }
  for (size_t i = 0; i < n * nwant; i++)
    if (m[i] != wmask[i])
      TEST_FAIL_("mask[%zu][%zu] = %g, expected %g", i / nwant, i % nwant, (double)m[i],
                 (double)wmask[i]);
}

TEST(attention_window_rope_through_the_daemon) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  kvc_layout_t l = win_layout(), bad = l;
  kvc_cache_t *h;
  bad.attn = (kvc_attn_t)9;
  ASSERT_ERR(kvc_cache_open(c, "bad", &bad, &h), KVC_E_ATTN);
  bad = l, bad.rope_dims = 3;
  ASSERT_ERR(kvc_cache_open(c, "bad", &bad, &h), KVC_E_ROPE);
  ASSERT_OK(kvc_cache_open(c, "win", &l, &h));
  kvc_cache_info_t ci[2];
  size_t nc = 0;
  ASSERT_OK(kvc_cache_list(c, ci, 2, &nc));
  ASSERT_EQ(nc, 1);
  ASSERT_EQ(ci[0].layout.attn, KVC_ATTN_WINDOW);
  ASSERT_EQ(ci[0].layout.attn_memory, 3);
  ASSERT_EQ(ci[0].layout.rope_dims, 2);
  ASSERT(ci[0].layout.rope_scale == 1.0f);
  l.attn_memory = 4;
  ASSERT_ERR(kvc_cache_open(c, "win", &l, &h), KVC_E_LAYOUT);
  l = win_layout();
  ASSERT_OK(kvc_cache_open(c, "win", &l, &h));

  /* pass 1: two sequences interleaved, then the history with its mask */
  kvc_tok_t b1[5] = {{1, 0}, {2, 0}, {1, 1}, {2, 1}, {1, 2}};
  ASSERT_OK(kvc_reserve(h, b1, 5));
  put_batch(h, b1, (const float[]){1, 2, 3, 4, 5}, 5);
  expect_history(c, h, b1, 5, 5, (const float[]){1, 3, 5, 2, 4},
                 (const float[]){0, X, X, X, X,
                                 X, X, X, 0, X,
                                 0, 0, X, X, X,
                                 X, X, X, 0, 0,
                                 0, 0, 0, X, X});
  /* pass 2: sequence 1 at 3, 4, 5: below 3 - 3 = 0 nothing goes yet */
  kvc_tok_t b2[3] = {{1, 3}, {1, 4}, {1, 5}};
  ASSERT_OK(kvc_reserve(h, b2, 3));
  put_batch(h, b2, (const float[]){6, 7, 8}, 3);
  expect_history(c, h, b2, 3, 6, (const float[]){1, 3, 5, 6, 7, 8},
                 (const float[]){X, 0, 0, 0, X, X,
                                 X, X, 0, 0, 0, X,
                                 X, X, X, 0, 0, 0});
  /* pass 3: position 6 keeps 3..6, positions 0..2 go (page 0 with them) */
  kvc_tok_t b3[1] = {{1, 6}};
  ASSERT_OK(kvc_reserve(h, b3, 1));
  put_batch(h, b3, (const float[]){9}, 1);
  expect_history(c, h, b3, 1, 4, (const float[]){6, 7, 8, 9}, (const float[]){X, 0, 0, 0});
  kvc_seq_info_t si;
  ASSERT_OK(kvc_seq_info(h, 1, &si));
  ASSERT_U64_EQ(si.start, 3);
  bool ok;
  ASSERT_OK(kvc_seq_can_resume(h, 1, 5, &ok));
  ASSERT(ok);
  ASSERT_OK(kvc_seq_can_resume(h, 1, 4, &ok));
  ASSERT(!ok);

  /* llama.cpp's calls */
  int64_t lo, hi;
  ASSERT_OK(kvc_seq_pos_range(h, 1, &lo, &hi));
  ASSERT_EQ(lo, 3);
  ASSERT_EQ(hi, 6);
  ASSERT_OK(kvc_seq_punch(h, 1, 5, -1)); /* to the end: truncates */
  ASSERT_OK(kvc_seq_pos_range(h, 1, &lo, &hi));
  ASSERT_EQ(hi, 4);
  ASSERT_OK(kvc_seq_shift(h, 1, -1, -1, 2)); /* 3, 4 -> 5, 6; 3, 4 become holes */
  ASSERT_OK(kvc_seq_pos_range(h, 1, &lo, &hi));
  ASSERT_EQ(lo, 5);
  ASSERT_EQ(hi, 6);
  ASSERT_ERR(kvc_seq_shift(h, 1, 5, 7, -3), KVC_E_RANGE); /* below the start */
  ASSERT_OK(kvc_seq_shift(h, 1, 5, 7, -2));
  float k[4], v[2], want[2];
  ASSERT_OK(kvc_get(h, 1, 3, 5, k, v));
  for (int i = 0; i < 2; i++) { /* keys turned by +2 then -2: as put */
    want[0] = (float)(6 + i), want[1] = -(float)(6 + i);
    ASSERT(fabsf(k[2 * i] - want[0]) < 1e-4f && fabsf(k[2 * i + 1] - want[1]) < 1e-4f);
    ASSERT(v[i] == (float)(6 + i));
  }
  ASSERT_OK(kvc_seq_remove(h, 2, 0, 1)); /* a middle range, RoPE: moves */
  ASSERT_OK(kvc_seq_pos_range(h, 2, &lo, &hi));
  ASSERT_EQ(lo, 0);
  ASSERT_EQ(hi, 0);
  ASSERT_OK(kvc_seq_keep(h, 2));
  ASSERT_ERR(kvc_seq_info(h, 1, &si), KVC_E_NOSEQ);
  ASSERT_OK(kvc_seq_pos_range(h, 1, &lo, &hi));
  ASSERT_EQ(lo, -1);

  /* errors of the new requests */
  kvc_tok_t gap[2] = {{2, 1}, {2, 3}};
  ASSERT_ERR(kvc_reserve(h, gap, 2), KVC_E_POSORDER);
  kvc_hist_t hv;
  kvc_tok_t miss[1] = {{9, 0}};
  ASSERT_ERR(kvc_history(h, NULL, miss, 1, &hv, NULL, 0), KVC_E_NOSEQ);
  ASSERT_ERR(kvc_reserve(h, NULL, 0), KVC_E_INVAL);
  kvc_layout_t plain = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *p;
  ASSERT_OK(kvc_cache_open(c, "plain", &plain, &p));
  float pk[4 * 64 * 2], pv[4 * 64 * 2];
  memset(pk, 0, sizeof pk), memset(pv, 0, sizeof pv);
  ASSERT_OK(kvc_put(p, 1, 0, 4, pk, pv));
  ASSERT_ERR(kvc_seq_shift(p, 1, 1, -1, 1), KVC_E_NOROPE);
  ASSERT_ERR(kvc_seq_remove(p, 1, 1, 2), KVC_E_NOROPE);
  ASSERT_U64_EQ(stat_get(c, "requests_total{op=history}", NULL), 7); /* 3 views x 2 round trips + 1 */
  kvc_client_close(c);
  daemon_stop(&d);
}

/* ollama's case through the daemon: a pool of 16 pages of one token each
 * (ollama's 16 cells). Sequence 0 holds 14 tokens, sequence 1 a copy of its
 * first 5 and continues at 8: the 3-token gap costs no page, so the batch
 * (0, 14) (1, 8) fits in the last 2 pages; the next one is FULL. */
TEST(attention_reserve_past_a_gap_fits_the_pool_through_the_daemon) {
  static const char *const pool16[] = {"--pool-bytes", "1MiB", "--page-bytes", "64KiB", NULL};
  daemon_t d;
  daemon_start_args(&d, pool16);
  kvc_client_t *c = client_open(&d);
  kvc_layout_t l = {.num_layers = 1, .num_kv_heads = 1, .head_dim_k = 2, .head_dim_v = 1,
                    .dtype = KVC_DTYPE_F32, .page_tokens = 1};
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "cells", &l, &h));
  kvc_tok_t pre[14];
  float vals[14];
  for (int i = 0; i < 14; i++) pre[i] = (kvc_tok_t){0, (uint64_t)i}, vals[i] = (float)(i + 1);
  ASSERT_OK(kvc_reserve(h, pre, 14));
  put_batch(h, pre, vals, 14);
  ASSERT_OK(kvc_seq_copy_prefix(h, 0, 1, 5));
  ASSERT_U64_EQ(stat_get(c, "pages_free", NULL), 2);
  kvc_tok_t b[2] = {{0, 14}, {1, 8}};
  ASSERT_OK(kvc_reserve(h, b, 2));
  put_batch(h, b, (const float[]){15, 21}, 2);
  ASSERT_U64_EQ(stat_get(c, "pages_free", NULL), 0);
  kvc_seq_info_t si;
  ASSERT_OK(kvc_seq_info(h, 1, &si));
  ASSERT_U64_EQ(si.length, 9);
  ASSERT_U64_EQ(si.pages, 6);
  kvc_tok_t one[1] = {{1, 8}};
  expect_history(c, h, one, 1, 9, (const float[]){1, 2, 3, 4, 5, 0, 0, 0, 21},
                 (const float[]){0, 0, 0, 0, 0, X, X, X, 0});
  kvc_tok_t next[2] = {{0, 15}, {1, 9}};
  ASSERT_ERR(kvc_reserve(h, next, 2), KVC_E_FULL);
  uint64_t needed = 0, freeable = 0;
  kvc_client_last_full(c, &needed, &freeable);
  ASSERT_U64_EQ(needed, 2);
  ASSERT_U64_EQ(freeable, 0);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* llama.cpp's seq_div through the daemon: a causal RoPE cache (one rotary
 * pair, frequency 1: a key at position p is (v cos p, v sin p)); the keys
 * read back are the ones computed at the divided positions; the next token
 * goes in slot 8 at position 4 (n_past); kvc_history and a step's gathered
 * and lease views report the positions and mask by them; the errors. */
TEST(seq_div_through_the_daemon) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  kvc_layout_t l = win_layout();
  l.attn = KVC_ATTN_CAUSAL, l.attn_window = l.attn_memory = 0;
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "ga", &l, &h));
  float k[18], v[9];
  for (int p = 0; p < 8; p++)
    k[2 * p] = (float)((p + 1) * cos(p)), k[2 * p + 1] = (float)((p + 1) * sin(p)),
    v[p] = (float)(p + 1);
  ASSERT_OK(kvc_put(h, 1, 0, 8, k, v));
  ASSERT_ERR(kvc_seq_div(h, 1, 2, 8, 0), KVC_E_INVAL);
  ASSERT_ERR(kvc_seq_div(h, 1, 2, 8, -3), KVC_E_INVAL);
  ASSERT_ERR(kvc_seq_div(h, 1, 8, 2, 2), KVC_E_RANGE);
  ASSERT_ERR(kvc_seq_div(h, 9, 2, 8, 2), KVC_E_NOSEQ);
  ASSERT_ERR(kvc_seq_div(NULL, 1, 2, 8, 2), KVC_E_INVAL);
  ASSERT_OK(kvc_seq_div(h, 1, 2, 8, 1)); /* nothing */
  /* self-extend's three calls, ga_n 2 and ga_w 4 at ga_i 2 (ib 0) */
  ASSERT_OK(kvc_seq_shift(h, 1, 2, 8, 0));
  ASSERT_OK(kvc_seq_div(h, 1, 2, 6, 2));      /* 2 3 4 5 -> 1 1 2 2 */
  ASSERT_OK(kvc_seq_shift(h, 1, 6, 8, -2));   /* 6 7 -> 4 5 */
  const int64_t want[9] = {0, 1, 1, 1, 2, 2, 4, 5, 6};
  int64_t lo, hi;
  ASSERT_OK(kvc_seq_pos_range(h, 1, &lo, &hi));
  ASSERT_EQ(lo, 0);
  ASSERT_EQ(hi, 5);
  float gk[16], gv[8];
  ASSERT_OK(kvc_get(h, 1, 0, 8, gk, gv));
  for (int q = 0; q < 8; q++) {
    double p = (double)want[q], a = q + 1;
    if (fabs(gk[2 * q] - a * cos(p)) > 1e-4 * a || fabs(gk[2 * q + 1] - a * sin(p)) > 1e-4 * a ||
        gv[q] != v[q])
      TEST_FAIL_("slot %d: K (%g, %g) V %g, expected the key at position %g", q,
                 (double)gk[2 * q], (double)gk[2 * q + 1], (double)gv[q], p);
  }
  /* the next token: slot 8 (the length), at position 6 (the last + 1) */
  kvc_tok_t t = {1, 8};
  ASSERT_OK(kvc_reserve(h, &t, 1));
  ASSERT_OK(kvc_put(h, 1, 8, 1, (const float[]){9, 0}, (const float[]){9}));
  kvc_tok_t bt[2] = {{1, 3}, {1, 8}};
  kvc_hist_t hv;
  kvc_hist_span_t sp[1];
  ASSERT_OK(kvc_history(h, NULL, bt, 2, &hv, sp, 1));
  ASSERT_U64_EQ(hv.entries, 9);
  ASSERT_U64_EQ(sp[0].pos, 0);
  ASSERT(hv.positions != NULL);
  void *base;
  uint64_t bytes;
  kvc_client_shm(c, &base, &bytes);
  const float *m = (const float *)((char *)base + hv.mask_off);
  for (int j = 0; j < 9; j++) {
    ASSERT_EQ(hv.positions[j], want[j]);
    ASSERT(m[j] == (want[j] <= 1 ? 0 : X));     /* slot 3, position 1: slots 0..3 */
    ASSERT(m[9 + j] == 0);                      /* slot 8, position 6: all */
  }
  /* a step writes the next token (slot 9, position 7) and returns the view */
  float *sk = (float *)base, *svv = sk + 2;
  sk[0] = 10, sk[1] = 0, svv[0] = 10;
  kvc_shm_io_t e = {.seq_id = 1, .pos = 9, .ntokens = 1, .k_off = 0, .v_off = 8};
  kvc_hist_span_t ssp[1];
  kvc_lease_t *ls[1];
  kvc_step_t st = {.view = KVC_VIEW_GATHER, .out_off = bytes / 2, .out_len = bytes / 2,
                   .spans = ssp, .spans_cap = 1};
  ASSERT_OK(kvc_step(h, NULL, &e, 1, &st));
  ASSERT_U64_EQ(st.hist.entries, 10);
  ASSERT(st.hist.positions != NULL);
  for (int j = 0; j < 9; j++) ASSERT_EQ(st.hist.positions[j], want[j]);
  ASSERT_EQ(st.hist.positions[9], 7);
  e.pos = 10, sk[0] = 11;
  st = (kvc_step_t){.view = KVC_VIEW_LEASE, .out_off = bytes / 2, .out_len = bytes / 2,
                    .spans = ssp, .spans_cap = 1, .leases = ls, .leases_cap = 1};
  ASSERT_OK(kvc_step(h, NULL, &e, 1, &st));
  ASSERT_U64_EQ(st.hist.entries, 11);
  ASSERT(st.hist.positions != NULL);
  ASSERT_EQ(st.hist.positions[10], 8);
  ASSERT_EQ(st.hist.positions[5], 2);
  ASSERT_OK(kvc_lease_release(ls[0]));
  /* an undivided sequence's view has no positions list */
  ASSERT_OK(kvc_put(h, 2, 0, 2, k, v));
  kvc_tok_t t2 = {2, 1};
  ASSERT_OK(kvc_history(h, NULL, &t2, 1, &hv, NULL, 0));
  ASSERT(hv.positions == NULL);
  /* kinds: a window cache refuses, a cache without RoPE cannot turn keys */
  kvc_layout_t wl = win_layout(), pl = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *w, *p;
  ASSERT_OK(kvc_cache_open(c, "win", &wl, &w));
  ASSERT_OK(kvc_put(w, 1, 0, 2, k, v));
  ASSERT_ERR(kvc_seq_div(w, 1, 0, 2, 2), KVC_E_KIND);
  ASSERT_OK(kvc_cache_open(c, "plain", &pl, &p));
  float pk[4 * 64 * 2] = {0}, pv[4 * 64 * 2] = {0};
  ASSERT_OK(kvc_put(p, 1, 0, 4, pk, pv));
  ASSERT_ERR(kvc_seq_div(p, 1, 0, 4, 2), KVC_E_NOROPE);
  ASSERT_U64_EQ(stat_get(c, "requests_total{op=seq_div}", NULL), 8);
  ASSERT_U64_EQ(stat_get(c, "request_errors_total{op=seq_div}", NULL), 6);
  kvc_client_close(c);
  daemon_stop(&d);
}
