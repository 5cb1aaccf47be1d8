/* attention.c: attention-aware sequences, scenario by scenario, the way a
 * worker built on ollama's kvcache or llama.cpp's memory API drives them.
 *
 * The scenario caches hold one layer, one head, a K row of two elements
 * (value, -value) and a V row of one (value), two tokens a page, so a
 * history view is a list of numbers and its mask a small matrix:
 * 0 = attend, X = -inf. Every test checks the gathered values, their count
 * and the mask exactly, and ends with engine_audit() == 0.
 */
#include <math.h>

#include "engine_fixture.h"
#include "core.h"
#include "seq.h"
#include "engine_resize.h"

#define X (-INFINITY)
#define MAXH 64

/* A scenario cache: kind, window, memory, chunk; npages pool pages. */
static void sc_open(fx_t *f, kvc_attn_t kind, uint32_t w, uint32_t m, uint32_t c,
                    uint32_t rope_dims, uint64_t npages) {
  kvc_layout_t l = fx_layout(1, 1, 2, 1, KVC_DTYPE_F32, 2);
  l.attn = kind;
  l.attn_window = w;
  l.attn_memory = m;
  l.attn_chunk = c;
  if (rope_dims) {
    l.rope_dims = rope_dims;
    l.rope_theta = 10000;
  }
  fx_open(f, &l, npages);
}

/* One forward pass: reserve the batch, put its values (one entry per
 * sequence, in one request), as ollama's StartForward then Put. */
static void sc_step(fx_t *f, size_t n, const uint64_t *seqs, const uint64_t *pos,
                    const float *vals) {
  engine_tok_t toks[MAXH] = {{0, 0}};
  for (size_t i = 0; i < n; i++) toks[i] = (engine_tok_t){seqs[i], pos[i]};
  ASSERT_OK(engine_reserve(f->eng, f->cid, toks, n));
  float k[MAXH][MAXH * 2], v[MAXH][MAXH];
  engine_io_t io[MAXH];
  size_t nio = 0;
  for (size_t i = 0; i < n; i++) {
    size_t j = 0;
    while (j < nio && io[j].seq_id != seqs[i]) j++;
    if (j == nio) io[nio++] = (engine_io_t){.seq_id = seqs[i], .pos = pos[i], .k = k[j],
                                            .v = v[j]};
    uint64_t t = io[j].ntokens++;
    k[j][2 * t] = vals[i];
    k[j][2 * t + 1] = -vals[i];
    v[j][t] = vals[i];
    io[j].k_bytes += 8;
    io[j].v_bytes += 4;
  }
  ASSERT_OK(engine_put(f->eng, f->cid, NULL, io, nio));
  FX_AUDIT(f->eng);
}

/* The history of a batch, checked against want (values) and wmask. */
static void sc_expect_(fx_t *f, size_t n, const uint64_t *seqs, const uint64_t *pos,
                       size_t nwant, const float *want, const float *wmask, const char *file,
                       int line) {
  engine_tok_t toks[MAXH] = {{0, 0}};
  for (size_t i = 0; i < n; i++) toks[i] = (engine_tok_t){seqs[i], pos[i]};
  engine_hist_t h = {0};
  ASSERT_OK(engine_history(f->eng, f->cid, NULL, toks, n, &h));
  if (h.nentries != nwant)
    TEST_FAIL_("%s:%d: history of %" PRIu64 " entries, expected %zu", file, line,
               h.nentries, nwant);
  float k[MAXH * 2], v[MAXH], mask[MAXH * MAXH];
  engine_span_t spans[MAXH];
  h.k = k, h.v = v, h.mask = mask, h.spans = spans, h.spans_cap = MAXH;
  h.k_bytes = nwant * 8, h.v_bytes = nwant * 4, h.mask_bytes = n * nwant * 4;
  ASSERT_OK(engine_history(f->eng, f->cid, NULL, toks, n, &h));
  for (size_t j = 0; j < nwant; j++)
    if (k[2 * j] != want[j] || k[2 * j + 1] != -want[j] || v[j] != want[j])
      TEST_FAIL_("%s:%d: entry %zu: K (%g, %g) V %g, expected %g", file, line, j,
                 (double)k[2 * j], (double)k[2 * j + 1], (double)v[j], (double)want[j]);
  for (size_t i = 0; i < n; i++)
    for (size_t j = 0; j < nwant; j++)
      if (mask[i * nwant + j] != wmask[i * nwant + j])
        TEST_FAIL_("%s:%d: mask[token %zu][entry %zu] = %g, expected %g", file, line, i, j,
                   (double)mask[i * nwant + j], (double)wmask[i * nwant + j]);
  FX_AUDIT(f->eng);
}
#define SC_EXPECT(f, n, seqs, pos, nwant, want, wmask)                         \
  sc_expect_((f), (n), (seqs), (pos), (nwant), (want), (wmask), __FILE__, __LINE__)

#define A(...) ((const uint64_t[]){__VA_ARGS__})
#define F(...) ((const float[]){__VA_ARGS__})

TEST(causal_two_batches) {
  fx_t f;
  sc_open(&f, KVC_ATTN_CAUSAL, 0, 0, 0, 0, 8);
  sc_step(&f, 4, A(0, 0, 0, 0), A(0, 1, 2, 3), F(1, 2, 3, 4));
  SC_EXPECT(&f, 4, A(0, 0, 0, 0), A(0, 1, 2, 3), 4, F(1, 2, 3, 4),
            F(0, X, X, X, 0, 0, X, X, 0, 0, 0, X, 0, 0, 0, 0));
  sc_step(&f, 2, A(0, 0), A(4, 5), F(5, 6));
  SC_EXPECT(&f, 2, A(0, 0), A(4, 5), 6, F(1, 2, 3, 4, 5, 6),
            F(0, 0, 0, 0, 0, X, 0, 0, 0, 0, 0, 0));
  ASSERT_U64_EQ(FX_INFO(&f, 0).start, 0); /* causal: nothing freed */
  fx_close(&f);
}

TEST(window_drops_old_positions_and_reuses_pages) {
  fx_t f;
  sc_open(&f, KVC_ATTN_WINDOW, 1, 0, 0, 0, 2); /* two pages: no room to grow */
  sc_step(&f, 4, A(0, 0, 0, 0), A(0, 1, 2, 3), F(1, 2, 3, 4));
  SC_EXPECT(&f, 4, A(0, 0, 0, 0), A(0, 1, 2, 3), 4, F(1, 2, 3, 4),
            F(0, X, X, X, 0, 0, X, X, X, 0, 0, X, X, X, 0, 0));
  ASSERT_U64_EQ(fx_stats(&f).pages_free, 0);
  /* positions 4, 5 see 3..5: positions 0..2 go, and with them page 0 */
  sc_step(&f, 2, A(0, 0), A(4, 5), F(5, 6));
  SC_EXPECT(&f, 2, A(0, 0), A(4, 5), 3, F(4, 5, 6), F(0, 0, X, X, 0, 0));
  kvc_seq_info_t in = FX_INFO(&f, 0);
  ASSERT_U64_EQ(in.start, 3);
  ASSERT_U64_EQ(in.length, 6);
  ASSERT_U64_EQ(in.pages, 2);
  ASSERT_U64_EQ(fx_stats(&f).pages_used, 2);
  /* a plain get before the start is out of range */
  ASSERT_ERR(fx_get_rc(&f, 0, 2, 1, fx_all(&f.lay)), KVC_E_RANGE);
  fx_close(&f);
}

TEST(window_two_sequences_interleaved) {
  fx_t f;
  sc_open(&f, KVC_ATTN_WINDOW, 1, 0, 0, 0, 8);
  sc_step(&f, 4, A(0, 1, 0, 1), A(0, 0, 1, 1), F(1, 2, 3, 4));
  SC_EXPECT(&f, 4, A(0, 1, 0, 1), A(0, 0, 1, 1), 4, F(1, 3, 2, 4),
            F(0, X, X, X, X, X, 0, X, 0, 0, X, X, X, X, 0, 0));
  sc_step(&f, 4, A(0, 1, 0, 1), A(2, 2, 3, 3), F(5, 6, 7, 8));
  /* each keeps positions 1..3; position 1 shares page 0 with position 0 */
  SC_EXPECT(&f, 4, A(0, 1, 0, 1), A(2, 2, 3, 3), 6, F(3, 5, 7, 4, 6, 8),
            F(0, 0, X, X, X, X,
              X, X, X, 0, 0, X,
              X, 0, 0, X, X, X,
              X, X, X, X, 0, 0));
  ASSERT_U64_EQ(FX_INFO(&f, 0).start, 1);
  ASSERT_U64_EQ(FX_INFO(&f, 1).start, 1);
  fx_close(&f);
}

TEST(window_with_memory_keeps_what_it_masks) {
  fx_t f;
  sc_open(&f, KVC_ATTN_WINDOW, 1, 3, 0, 0, 8);
  sc_step(&f, 4, A(0, 0, 0, 0), A(0, 1, 2, 3), F(1, 2, 3, 4));
  sc_step(&f, 2, A(0, 0), A(4, 5), F(5, 6));
  /* memory 3 below position 4: positions 1..5 are held, 1 and 2 masked */
  SC_EXPECT(&f, 2, A(0, 0), A(4, 5), 5, F(2, 3, 4, 5, 6), F(X, X, 0, 0, X, X, X, X, 0, 0));
  ASSERT_U64_EQ(FX_INFO(&f, 0).start, 1);
  ASSERT_U64_EQ(FX_INFO(&f, 0).pages, 3);
  sc_step(&f, 1, A(0), A(6), F(7));
  SC_EXPECT(&f, 1, A(0), A(6), 4, F(4, 5, 6, 7), F(X, X, 0, 0));
  ASSERT_U64_EQ(FX_INFO(&f, 0).start, 3);
  ASSERT_U64_EQ(FX_INFO(&f, 0).pages, 3); /* page 0 (positions 0, 1) went */
  fx_close(&f);
}

TEST(chunked_masks_across_chunk_boundaries) {
  fx_t f;
  sc_open(&f, KVC_ATTN_CHUNKED, 0, 0, 2, 0, 8);
  sc_step(&f, 4, A(0, 0, 0, 0), A(0, 1, 2, 3), F(1, 2, 3, 4));
  SC_EXPECT(&f, 4, A(0, 0, 0, 0), A(0, 1, 2, 3), 4, F(1, 2, 3, 4),
            F(0, X, X, X, 0, 0, X, X, X, X, 0, X, X, X, 0, 0));
  /* the batch starts the chunk at 4: chunks [0, 2) and [2, 4) go */
  sc_step(&f, 3, A(0, 0, 0), A(4, 5, 6), F(5, 6, 7));
  SC_EXPECT(&f, 3, A(0, 0, 0), A(4, 5, 6), 3, F(5, 6, 7), F(0, X, X, 0, 0, X, X, X, 0));
  ASSERT_U64_EQ(FX_INFO(&f, 0).start, 4);
  ASSERT_U64_EQ(FX_INFO(&f, 0).pages, 2);
  fx_close(&f);
}

TEST(two_sequences_in_one_batch_isolated) {
  fx_t f;
  sc_open(&f, KVC_ATTN_CAUSAL, 0, 0, 0, 0, 8);
  sc_step(&f, 4, A(0, 0, 1, 1), A(0, 1, 0, 1), F(1, 2, 3, 4));
  SC_EXPECT(&f, 4, A(0, 0, 1, 1), A(0, 1, 0, 1), 4, F(1, 2, 3, 4),
            F(0, X, X, X, 0, 0, X, X, X, X, 0, X, X, X, 0, 0));
  /* sequence 2 shares sequence 0's page; each attends to its own entries */
  ASSERT_OK(engine_copy_prefix(f.eng, f.cid, 0, 2, 2));
  sc_step(&f, 2, A(2, 0), A(2, 2), F(5, 6));
  SC_EXPECT(&f, 2, A(2, 0), A(2, 2), 6, F(1, 2, 5, 1, 2, 6),
            F(0, 0, 0, X, X, X, X, X, X, 0, 0, 0));
  fx_close(&f);
}

/* RoPE keys of the scenario layout: (v, -v) turned by position p. */
static void rot2(double v, double p, float out[2]) {
  double c = cos(p), s = sin(p); /* dims 2, pair 0: frequency 1 */
  out[0] = (float)(v * c + v * s);
  out[1] = (float)(v * s - v * c);
}

static void put_rotated(fx_t *f, uint64_t seq, uint64_t pos, const float *vals, size_t n) {
  float k[2 * MAXH], v[MAXH];
  for (size_t i = 0; i < n; i++) {
    rot2(vals[i], (double)(pos + i), &k[2 * i]);
    v[i] = vals[i];
  }
  engine_io_t io = {.seq_id = seq, .pos = pos, .ntokens = n, .k = k, .v = v,
                    .k_bytes = n * 8, .v_bytes = n * 4};
  ASSERT_OK(engine_put(f->eng, f->cid, NULL, &io, 1));
}

static void expect_rotated(fx_t *f, uint64_t seq, uint64_t pos, const float *vals, size_t n) {
  float k[2 * MAXH], v[MAXH], want[2];
  engine_io_t io = {.seq_id = seq, .pos = pos, .ntokens = n, .k = k, .v = v,
                    .k_bytes = n * 8, .v_bytes = n * 4};
  ASSERT_OK(engine_get(f->eng, f->cid, NULL, &io, 1));
  for (size_t i = 0; i < n; i++) {
    rot2(vals[i], (double)(pos + i), want);
    if (v[i] != vals[i] || fabsf(k[2 * i] - want[0]) > 1e-4f ||
        fabsf(k[2 * i + 1] - want[1]) > 1e-4f)
      TEST_FAIL_("position %" PRIu64 ": K (%g, %g) V %g, expected (%g, %g) V %g", pos + i,
                 (double)k[2 * i], (double)k[2 * i + 1], (double)v[i], (double)want[0],
                 (double)want[1], (double)vals[i]);
  }
}

TEST(remove_end_and_middle_with_key_shift) {
  fx_t f;
  sc_open(&f, KVC_ATTN_CAUSAL, 0, 0, 0, 2, 16);
  put_rotated(&f, 0, 0, F(1, 2, 3, 4, 5, 6, 7, 8), 8);
  ASSERT_OK(engine_copy_prefix(f.eng, f.cid, 0, 1, 8)); /* shares every page */
  /* the end: plain truncation */
  ASSERT_OK(engine_remove(f.eng, f.cid, 0, 6, UINT64_MAX));
  ASSERT_U64_EQ(FX_INFO(&f, 0).length, 6);
  /* the middle [1, 3): 4, 5, 6 move to 1, 2, 3, their keys turned by -2 */
  ASSERT_OK(engine_remove(f.eng, f.cid, 0, 1, 3));
  ASSERT_U64_EQ(FX_INFO(&f, 0).length, 4);
  expect_rotated(&f, 0, 0, F(1, 4, 5, 6), 4);
  expect_rotated(&f, 1, 0, F(1, 2, 3, 4, 5, 6, 7, 8), 8); /* the sharer is untouched */
  FX_AUDIT(f.eng);
  /* the history continues at position 4 with the moved keys */
  put_rotated(&f, 0, 4, F(9), 1);
  engine_tok_t t = {0, 4};
  float k[10], v[5], mask[5];
  engine_hist_t h = {.k = k, .v = v, .mask = mask, .k_bytes = 40, .v_bytes = 20,
                     .mask_bytes = 20};
  ASSERT_OK(engine_history(f.eng, f.cid, NULL, &t, 1, &h));
  ASSERT_U64_EQ(h.nentries, 5);
  expect_rotated(&f, 0, 0, F(1, 4, 5, 6, 9), 5);
  for (int j = 0; j < 5; j++) ASSERT(mask[j] == 0);
  /* the middle of a sequence without a RoPE description cannot move */
  fx_t g;
  sc_open(&g, KVC_ATTN_CAUSAL, 0, 0, 0, 0, 8);
  sc_step(&g, 4, A(0, 0, 0, 0), A(0, 1, 2, 3), F(1, 2, 3, 4));
  ASSERT_ERR(engine_remove(g.eng, g.cid, 0, 1, 2), KVC_E_NOROPE);
  ASSERT_ERR(engine_shift(g.eng, g.cid, 0, 2, -1, -1), KVC_E_NOROPE);
  ASSERT_U64_EQ(FX_INFO(&g, 0).length, 4);
  fx_close(&g);
  fx_close(&f);
}

TEST(copy_prefix_then_extend_with_a_gap) {
  fx_t f;
  sc_open(&f, KVC_ATTN_CAUSAL, 0, 0, 0, 0, 8);
  sc_step(&f, 4, A(0, 0, 0, 0), A(0, 1, 2, 3), F(1, 2, 3, 4));
  ASSERT_OK(engine_copy_prefix(f.eng, f.cid, 0, 1, 2));
  /* sequence 1 continues at 3: position 2 is a hole, read as 0, masked */
  sc_step(&f, 2, A(1, 1), A(3, 4), F(5, 6));
  SC_EXPECT(&f, 2, A(1, 1), A(3, 4), 5, F(1, 2, 0, 5, 6), F(0, 0, X, 0, X, 0, 0, X, 0, 0));
  int64_t lo, hi;
  ASSERT_OK(engine_pos_range(f.eng, f.cid, 1, &lo, &hi));
  ASSERT_EQ(lo, 0);
  ASSERT_EQ(hi, 4);
  /* the source still reads 1..4 */
  SC_EXPECT(&f, 1, A(0), A(3), 4, F(1, 2, 3, 4), F(0, 0, 0, 0));
  fx_close(&f);
}

static bool resumable(fx_t *f, uint64_t seq, uint64_t pos) {
  bool ok = false;
  ASSERT_OK(engine_can_resume(f->eng, f->cid, seq, pos, &ok));
  return ok;
}

TEST(can_resume_window) {
  fx_t f;
  sc_open(&f, KVC_ATTN_WINDOW, 4, 0, 0, 0, 16);
  ASSERT(!resumable(&f, 0, 0)); /* nothing held */
  sc_step(&f, 5, A(0, 0, 0, 0, 0), A(0, 1, 2, 3, 4), F(1, 2, 3, 4, 5));
  for (uint64_t p = 0; p <= 5; p++) ASSERT(resumable(&f, 0, p));
  ASSERT(!resumable(&f, 0, 6));
  /* position 5 attends to 1..5: position 0 goes */
  sc_step(&f, 1, A(0), A(5), F(6));
  ASSERT_U64_EQ(FX_INFO(&f, 0).start, 1);
  for (uint64_t p = 0; p <= 4; p++) ASSERT(!resumable(&f, 0, p));
  ASSERT(resumable(&f, 0, 5));
  ASSERT(resumable(&f, 0, 6));
  ASSERT(!resumable(&f, 0, 7));
  fx_close(&f);
}

TEST(can_resume_window_with_memory) {
  fx_t f;
  sc_open(&f, KVC_ATTN_WINDOW, 4, 6, 0, 0, 16);
  sc_step(&f, 7, A(0, 0, 0, 0, 0, 0, 0), A(0, 1, 2, 3, 4, 5, 6), F(1, 2, 3, 4, 5, 6, 7));
  sc_step(&f, 1, A(0), A(7), F(8));
  ASSERT_U64_EQ(FX_INFO(&f, 0).start, 1); /* 7 - 6 */
  ASSERT(!resumable(&f, 0, 4));           /* needs 0 */
  for (uint64_t p = 5; p <= 8; p++) ASSERT(resumable(&f, 0, p));
  ASSERT(!resumable(&f, 0, 9));
  /* without memory the same run keeps less */
  fx_t g;
  sc_open(&g, KVC_ATTN_WINDOW, 4, 0, 0, 0, 16);
  sc_step(&g, 7, A(0, 0, 0, 0, 0, 0, 0), A(0, 1, 2, 3, 4, 5, 6), F(1, 2, 3, 4, 5, 6, 7));
  sc_step(&g, 1, A(0), A(7), F(8));
  ASSERT_U64_EQ(FX_INFO(&g, 0).start, 3);
  ASSERT(!resumable(&g, 0, 6));
  ASSERT(resumable(&g, 0, 7));
  ASSERT(resumable(&g, 0, 8));
  fx_close(&g);
  fx_close(&f);
}

TEST(can_resume_chunked_and_encoder) {
  fx_t f;
  sc_open(&f, KVC_ATTN_CHUNKED, 0, 0, 2, 0, 16);
  sc_step(&f, 5, A(0, 0, 0, 0, 0), A(0, 1, 2, 3, 4), F(1, 2, 3, 4, 5));
  ASSERT_U64_EQ(FX_INFO(&f, 0).start, 0); /* the put at 0..4 needs chunk 0 still */
  sc_step(&f, 1, A(0), A(5), F(6));
  ASSERT_U64_EQ(FX_INFO(&f, 0).start, 4);
  ASSERT(!resumable(&f, 0, 3));
  ASSERT(resumable(&f, 0, 4));
  ASSERT(resumable(&f, 0, 6));
  ASSERT(!resumable(&f, 0, 7));
  fx_t g;
  sc_open(&g, KVC_ATTN_ENCODER, 0, 0, 0, 0, 16);
  ASSERT(resumable(&g, 9, 100));
  sc_step(&g, 3, A(0, 0, 0), A(0, 1, 2), F(1, 2, 3));
  /* encoder entries are read whole: no causal mask */
  SC_EXPECT(&g, 1, A(0), A(0), 3, F(1, 2, 3), F(0, 0, 0));
  ASSERT_ERR(engine_shift(g.eng, g.cid, 0, 0, -1, 1), KVC_E_KIND);
  ASSERT_OK(engine_remove(g.eng, g.cid, 0, 0, 1)); /* moves without rotating */
  SC_EXPECT(&g, 1, A(0), A(0), 2, F(2, 3), F(0, 0));
  fx_close(&g);
  fx_close(&f);
}

TEST(reserve_full_changes_nothing) {
  fx_t f;
  sc_open(&f, KVC_ATTN_CAUSAL, 0, 0, 0, 0, 3);
  sc_step(&f, 2, A(0, 0), A(0, 1), F(1, 2));
  ASSERT_OK(engine_pin(f.eng, f.cid, 0, 7));
  engine_stats_t before = fx_stats(&f);
  engine_tok_t t[6] = {{1, 0}, {1, 1}, {1, 2}, {1, 3}, {1, 4}, {0, 2}};
  ASSERT_ERR(engine_reserve(f.eng, f.cid, t, 6), KVC_E_FULL);
  ASSERT_U64_EQ(engine_last_error(f.eng)->needed, 4);
  ASSERT_U64_EQ(engine_last_error(f.eng)->freeable, 2);
  engine_stats_t after = fx_stats(&f);
  ASSERT_U64_EQ(after.sequences, before.sequences);
  ASSERT_U64_EQ(after.pages_used, before.pages_used);
  FX_AUDIT(f.eng);
  /* positions out of order, before the start, a missing sequence's history */
  engine_tok_t bad[2] = {{0, 2}, {0, 4}};
  ASSERT_ERR(engine_reserve(f.eng, f.cid, bad, 2), KVC_E_POSORDER);
  engine_hist_t h = {0};
  engine_tok_t miss = {5, 0};
  ASSERT_ERR(engine_history(f.eng, f.cid, NULL, &miss, 1, &h), KVC_E_NOSEQ);
  engine_tok_t unwritten = {0, 2};
  ASSERT_ERR(engine_history(f.eng, f.cid, NULL, &unwritten, 1, &h), KVC_E_RANGE);
  /* a reservation lets the put through without a page more */
  engine_tok_t ok[2] = {{0, 2}, {0, 3}};
  ASSERT_OK(engine_reserve(f.eng, f.cid, ok, 2));
  ASSERT_U64_EQ(FX_INFO(&f, 0).pages, 2);
  FX_AUDIT(f.eng);
  fx_close(&f);
}

TEST(keep_and_pos_range) {
  fx_t f;
  sc_open(&f, KVC_ATTN_CAUSAL, 0, 0, 0, 2, 16);
  sc_step(&f, 3, A(0, 1, 2), A(0, 0, 0), F(1, 2, 3));
  sc_step(&f, 3, A(0, 1, 2), A(1, 1, 1), F(4, 5, 6));
  ASSERT_OK(engine_keep(f.eng, f.cid, 1));
  ASSERT_U64_EQ(fx_stats(&f).sequences, 1);
  int64_t lo, hi;
  ASSERT_OK(engine_pos_range(f.eng, f.cid, 0, &lo, &hi));
  ASSERT_EQ(lo, -1);
  ASSERT_EQ(hi, -1);
  ASSERT_OK(engine_pos_range(f.eng, f.cid, 1, &lo, &hi));
  ASSERT_EQ(lo, 0);
  ASSERT_EQ(hi, 1);
  /* llama.cpp's seq_rm of the front without a shift, then seq_add */
  sc_step(&f, 2, A(1, 1), A(2, 3), F(7, 8));
  ASSERT_OK(engine_punch(f.eng, f.cid, 1, -1, 2));
  ASSERT_OK(engine_pos_range(f.eng, f.cid, 1, &lo, &hi));
  ASSERT_EQ(lo, 2);
  ASSERT_EQ(hi, 3);
  ASSERT_ERR(engine_shift(f.eng, f.cid, 1, 2, -1, -3), KVC_E_RANGE); /* below the start */
  ASSERT_OK(engine_shift(f.eng, f.cid, 1, 2, -1, -2));
  ASSERT_OK(engine_pos_range(f.eng, f.cid, 1, &lo, &hi));
  ASSERT_EQ(lo, 0);
  ASSERT_EQ(hi, 1);
  /* shifting up leaves holes behind; it never overwrites a token */
  ASSERT_OK(engine_shift(f.eng, f.cid, 1, 1, -1, 3));
  ASSERT_OK(engine_pos_range(f.eng, f.cid, 1, &lo, &hi));
  ASSERT_EQ(lo, 0);
  ASSERT_EQ(hi, 4);
  ASSERT_U64_EQ(FX_INFO(&f, 1).length, 5);
  ASSERT_ERR(engine_shift(f.eng, f.cid, 1, 0, 1, 4), KVC_E_RANGE);
  ASSERT_OK(engine_shift(f.eng, f.cid, 1, 0, 1, 2)); /* into the holes */
  ASSERT_OK(engine_keep(f.eng, f.cid, 42));           /* no such sequence: all go */
  ASSERT_U64_EQ(fx_stats(&f).sequences, 0);
  fx_close(&f);
}

TEST(layout_attention_and_rope_checked) {
  kvc_layout_t ok = fx_layout(1, 1, 8, 4, KVC_DTYPE_F32, 4), l;
  ASSERT(engine_layout_page_bytes(&ok) > 0);
  l = ok, l.attn = (kvc_attn_t)7;
  ASSERT_ERR(engine_layout_page_bytes(&l), KVC_E_ATTN);
  l = ok, l.attn = KVC_ATTN_WINDOW;
  ASSERT_ERR(engine_layout_page_bytes(&l), KVC_E_WINDOW); /* W 0 */
  l.attn_window = 4, l.attn_memory = 2;
  ASSERT_ERR(engine_layout_page_bytes(&l), KVC_E_WINDOW); /* M < W */
  l.attn_memory = 0;
  ASSERT(engine_layout_page_bytes(&l) > 0);
  l = ok, l.attn_window = 4;
  ASSERT_ERR(engine_layout_page_bytes(&l), KVC_E_WINDOW); /* causal with a window */
  l = ok, l.attn = KVC_ATTN_CHUNKED;
  ASSERT_ERR(engine_layout_page_bytes(&l), KVC_E_CHUNK);
  l = ok, l.attn_chunk = 2;
  ASSERT_ERR(engine_layout_page_bytes(&l), KVC_E_CHUNK);
  l = ok, l.rope_dims = 3, l.rope_theta = 10000;
  ASSERT_ERR(engine_layout_page_bytes(&l), KVC_E_ROPE); /* odd */
  l.rope_dims = 10;
  ASSERT_ERR(engine_layout_page_bytes(&l), KVC_E_ROPE); /* > head_dim_k */
  l.rope_dims = 8, l.rope_theta = NAN;
  ASSERT_ERR(engine_layout_page_bytes(&l), KVC_E_ROPE);
  l.rope_theta = 10000, l.rope_style = (kvc_rope_style_t)2;
  ASSERT_ERR(engine_layout_page_bytes(&l), KVC_E_ROPE);
  l.rope_style = KVC_ROPE_GPTJ, l.rope_scale = -1;
  ASSERT_ERR(engine_layout_page_bytes(&l), KVC_E_ROPE);
  l.rope_scale = 0;
  ASSERT(engine_layout_page_bytes(&l) > 0);
  l.attn = KVC_ATTN_ENCODER;
  ASSERT_ERR(engine_layout_page_bytes(&l), KVC_E_ROPE); /* encoder entries have no position */
  l = ok, l.rope_theta = 10000;
  ASSERT_ERR(engine_layout_page_bytes(&l), KVC_E_ROPE); /* theta without dims */
  /* the kind and the RoPE description are part of a cache's identity */
  fx_t f;
  fx_open(&f, &ok, 4);
  uint32_t id;
  l = ok, l.attn = KVC_ATTN_WINDOW, l.attn_window = 2;
  ASSERT_ERR(engine_cache_open(f.eng, "main", &l, &id), KVC_E_LAYOUT);
  l = ok, l.rope_dims = 8, l.rope_theta = 10000;
  ASSERT_ERR(engine_cache_open(f.eng, "main", &l, &id), KVC_E_LAYOUT);
  ASSERT_OK(engine_cache_open(f.eng, "main", &ok, &id));
  l.rope_scale = 1; /* 0 reads as 1 */
  ASSERT_OK(engine_cache_open(f.eng, "rope", &l, &id));
  l.rope_scale = 0;
  ASSERT_OK(engine_cache_open(f.eng, "rope", &l, &id));
  fx_close(&f);
}

/* Regression: a get copied off the engine's thread (engine_get_begin/run/end)
 * read the stale page bytes of a hole instead of zeros. */
TEST(holes_read_as_zeros_off_the_engine_thread) {
  fx_t f;
  sc_open(&f, KVC_ATTN_CAUSAL, 0, 0, 0, 0, 8);
  sc_step(&f, 4, A(0, 0, 0, 0), A(0, 1, 2, 3), F(1, 2, 3, 4));
  ASSERT_OK(engine_copy_prefix(f.eng, f.cid, 0, 1, 2));
  sc_step(&f, 2, A(1, 1), A(3, 4), F(5, 6)); /* position 2 of seq 1 is a hole */
  fx_rng_t r = fx_all(&f.lay);
  fx_buf_t a = fx_buf_new(&f.lay, r, 5), b = fx_buf_new(&f.lay, r, 5);
  memset(b.k, 0x7f, b.kb);
  memset(b.v, 0x7f, b.vb);
  engine_io_t ia = fx_io(1, 0, 5, &a), ib = fx_io(1, 0, 5, &b);
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  ASSERT_OK(engine_get(f.eng, f.cid, &x, &ia, 1));
  engine_get_job_t *job = NULL;
  ASSERT_OK(engine_get_begin(f.eng, f.cid, &x, &ib, 1, &job));
  engine_get_run(job);
  engine_get_end(f.eng, job);
  ASSERT_MEM_EQ(b.k, a.k, a.kb);
  ASSERT_MEM_EQ(b.v, a.v, a.vb);
  float zero = 0.0f;
  ASSERT_MEM_EQ(&b.k[2 * 2], &zero, sizeof zero); /* K of position 2: 2 floats a token */
  fx_buf_free(&a);
  fx_buf_free(&b);
  fx_close(&f);
}

/* An idle sequence of a window cache loses what its next token cannot see
 * at any reservation (ollama's StartForward), not only at its own next
 * write; a causal cache keeps everything. */
TEST(window_idle_sequences_trimmed_at_any_reservation) {
  fx_t f;
  sc_open(&f, KVC_ATTN_WINDOW, 2, 0, 0, 0, 16);
  sc_step(&f, 8, A(0, 0, 0, 0, 0, 0, 0, 0), A(0, 1, 2, 3, 4, 5, 6, 7), F(1, 2, 3, 4, 5, 6, 7, 8));
  ASSERT_U64_EQ(FX_INFO(&f, 0).start, 0); /* its own put kept what the batch saw */
  ASSERT_U64_EQ(FX_INFO(&f, 0).pages, 4);
  sc_step(&f, 1, A(1), A(0), F(9)); /* another sequence's forward pass */
  kvc_seq_info_t in = FX_INFO(&f, 0);
  ASSERT_U64_EQ(in.start, 6); /* a token at 8 sees 6..8 */
  ASSERT_U64_EQ(in.length, 8);
  ASSERT_U64_EQ(in.pages, 1);
  bool ok;
  ASSERT_OK(engine_can_resume(f.eng, f.cid, 0, 8, &ok));
  ASSERT(ok);
  sc_step(&f, 1, A(0), A(8), F(10));
  SC_EXPECT(&f, 1, A(0), A(8), 3, F(7, 8, 10), F(0, 0, 0));
  fx_close(&f);
  sc_open(&f, KVC_ATTN_CAUSAL, 0, 0, 0, 0, 16);
  sc_step(&f, 4, A(0, 0, 0, 0), A(0, 1, 2, 3), F(1, 2, 3, 4));
  sc_step(&f, 1, A(1), A(0), F(9));
  ASSERT_U64_EQ(FX_INFO(&f, 0).start, 0);
  fx_close(&f);
}

/* Keys without positions (NoPE, ALiBi: rope_style NONE): a middle range is
 * removed and positions are shifted with the keys moved as they are. */
TEST(nope_cache_removes_a_middle_range_without_rotation) {
  fx_t f;
  kvc_layout_t l = fx_layout(1, 1, 2, 1, KVC_DTYPE_F32, 2);
  l.rope_style = KVC_ROPE_NONE;
  fx_open(&f, &l, 8);
  sc_step(&f, 6, A(0, 0, 0, 0, 0, 0), A(0, 1, 2, 3, 4, 5), F(1, 2, 3, 4, 5, 6));
  ASSERT_OK(engine_remove(f.eng, f.cid, 0, 1, 3)); /* 4, 5, 6 move to 1, 2, 3 */
  ASSERT_U64_EQ(FX_INFO(&f, 0).length, 4);
  SC_EXPECT(&f, 1, A(0), A(3), 4, F(1, 4, 5, 6), F(0, 0, 0, 0));
  ASSERT_OK(engine_shift(f.eng, f.cid, 0, 2, -1, 3)); /* 5, 6 to 5, 6: a gap at 2..4 */
  kvc_seq_info_t in = FX_INFO(&f, 0);
  ASSERT_U64_EQ(in.length, 7);
  sc_step(&f, 1, A(0), A(7), F(9));
  SC_EXPECT(&f, 1, A(0), A(7), 8, F(1, 4, 0, 0, 0, 5, 6, 9), F(0, 0, X, X, X, 0, 0, 0));
  fx_close(&f);
  /* NONE goes only without rope_dims; a RoPE style other than the two is refused */
  kvc_layout_t bad = fx_layout(1, 1, 2, 1, KVC_DTYPE_F32, 2);
  bad.rope_style = KVC_ROPE_NONE;
  bad.rope_dims = 2;
  bad.rope_theta = 10000;
  fx_t g;
  fx_engine(&g, 1024, 8, 0);
  uint32_t id;
  ASSERT_ERR(engine_cache_open(g.eng, "bad", &bad, &id), KVC_E_ROPE);
  fx_close(&g);
}

/* A chunked cache with memory keeps history below its chunk (ollama keeps
 * it, so a sequence can resume or branch there); KVC_ATTN_KEEP_ALL keeps
 * everything; the mask still shows a token only its chunk. */
TEST(chunked_with_memory_keeps_history_below_the_chunk) {
  fx_t f;
  sc_open(&f, KVC_ATTN_CHUNKED, 0, 3, 2, 0, 16);
  sc_step(&f, 6, A(0, 0, 0, 0, 0, 0), A(0, 1, 2, 3, 4, 5), F(1, 2, 3, 4, 5, 6));
  sc_step(&f, 1, A(0), A(6), F(7));
  ASSERT_U64_EQ(FX_INFO(&f, 0).start, 3); /* 6 - 3 kept, below its chunk at 6 */
  ASSERT(resumable(&f, 0, 4));             /* chunk 4..5 is still held */
  ASSERT(!resumable(&f, 0, 3));            /* its chunk 2..3 starts below the start */
  SC_EXPECT(&f, 1, A(0), A(6), 4, F(4, 5, 6, 7), F(X, X, X, 0));
  fx_close(&f);
  sc_open(&f, KVC_ATTN_CHUNKED, 0, KVC_ATTN_KEEP_ALL, 2, 0, 16);
  sc_step(&f, 6, A(0, 0, 0, 0, 0, 0), A(0, 1, 2, 3, 4, 5), F(1, 2, 3, 4, 5, 6));
  sc_step(&f, 2, A(0, 0), A(6, 7), F(7, 8));
  ASSERT_U64_EQ(FX_INFO(&f, 0).start, 0);
  ASSERT(resumable(&f, 0, 2));
  fx_close(&f);
  /* a window cache still refuses KEEP_ALL (its memory is at most 2^30) */
  kvc_layout_t l = fx_layout(1, 1, 2, 1, KVC_DTYPE_F32, 2);
  l.attn = KVC_ATTN_WINDOW, l.attn_window = 2, l.attn_memory = KVC_ATTN_KEEP_ALL;
  fx_t g;
  fx_engine(&g, 1024, 8, 0);
  uint32_t id;
  ASSERT_ERR(engine_cache_open(g.eng, "w", &l, &id), KVC_E_WINDOW);
  fx_close(&g);
}

/* ---- gaps of whole pages cost no pool page (issue 15, parity) --------------- */

/* Reads [pos, pos + n) of seq as the scenario's values (K is (v, -v)),
 * on the engine's thread and off it, into buffers full of junk first: both
 * must read the same, holes as zeros. */
static void sc_get_(fx_t *f, uint64_t seq, uint64_t pos, uint64_t n, const float *want,
                    const char *file, int line) {
  float k[2][MAXH * 2], v[2][MAXH];
  memset(k, 0x7f, sizeof k);
  memset(v, 0x7f, sizeof v);
  engine_io_t io[2];
  for (int j = 0; j < 2; j++)
    io[j] = (engine_io_t){.seq_id = seq, .pos = pos, .ntokens = n, .k = k[j], .v = v[j],
                          .k_bytes = n * 8, .v_bytes = n * 4};
  ASSERT_OK(engine_get(f->eng, f->cid, NULL, &io[0], 1));
  engine_get_job_t *job = NULL;
  ASSERT_OK(engine_get_begin(f->eng, f->cid, NULL, &io[1], 1, &job));
  engine_get_run(job);
  engine_get_end(f->eng, job);
  for (int j = 0; j < 2; j++)
    for (uint64_t t = 0; t < n; t++)
      if (k[j][2 * t] != want[t] || k[j][2 * t + 1] != -want[t] || v[j][t] != want[t])
        TEST_FAIL_("%s:%d: %s get, position %llu: K (%g, %g) V %g, expected %g", file, line,
                   j ? "an off-thread" : "a", (unsigned long long)(pos + t),
                   (double)k[j][2 * t], (double)k[j][2 * t + 1], (double)v[j][t],
                   (double)want[t]);
}
#define SC_GET(f, seq, pos, n, want) sc_get_((f), (seq), (pos), (n), (want), __FILE__, __LINE__)

/* ollama's case: a pool that holds exactly the pages a batch needs. After a
 * copy_prefix, sequence 1 continues 3 positions past its length (slots 5..7
 * are a gap): with one token a page (ollama's cells) the gap is 3 whole
 * pages of holes, which cost nothing, so the batch fits in the pool's last 2
 * pages. It was KVC_E_FULL while each slot of the gap took a page. */
TEST(reserve_with_a_gap_of_whole_pages_fits_the_pages_the_batch_needs) {
  fx_t f;
  kvc_layout_t l = fx_layout(1, 1, 2, 1, KVC_DTYPE_F32, 1);
  fx_open(&f, &l, 12);
  sc_step(&f, 10, A(0, 0, 0, 0, 0, 0, 0, 0, 0, 0), A(0, 1, 2, 3, 4, 5, 6, 7, 8, 9),
          F(1, 2, 3, 4, 5, 6, 7, 8, 9, 10));
  ASSERT_OK(engine_copy_prefix(f.eng, f.cid, 0, 1, 5));
  ASSERT_U64_EQ(fx_stats(&f).pages_free, 2);
  sc_step(&f, 2, A(0, 1), A(10, 8), F(11, 21));
  engine_stats_t st = fx_stats(&f);
  ASSERT_U64_EQ(st.pages_free, 0);
  ASSERT_U64_EQ(st.pages_used, 12);
  ASSERT_U64_EQ(st.evicted_sequences, 0);
  kvc_seq_info_t in = FX_INFO(&f, 1);
  ASSERT_U64_EQ(in.length, 9);
  ASSERT_U64_EQ(in.pages, 6); /* 0..4 shared, 8 its own; 5..7 none */
  ASSERT_U64_EQ(in.shared_pages, 5);
  /* the holes read as zeros and are masked, gathered or as a zero-copy view */
  SC_GET(&f, 1, 0, 9, F(1, 2, 3, 4, 5, 0, 0, 0, 21));
  SC_EXPECT(&f, 2, A(1, 0), A(8, 10), 20, F(1, 2, 3, 4, 5, 0, 0, 0, 21, 1, 2, 3, 4, 5, 6, 7,
                                           8, 9, 10, 11),
            F(0, 0, 0, 0, 0, X, X, X, 0, X, X, X, X, X, X, X, X, X, X, X,
              X, X, X, X, X, X, X, X, X, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0));
  engine_tok_t tok = {1, 8};
  float mask[9];
  engine_span_t span;
  engine_hist_t h = {.mask = mask, .mask_bytes = sizeof mask, .spans = &span, .spans_cap = 1};
  ASSERT_OK(engine_history(f.eng, f.cid, NULL, &tok, 1, &h));
  ASSERT_U64_EQ(h.nentries, 9);
  ASSERT_U64_EQ(span.n, 9);
  for (int j = 0; j < 9; j++) ASSERT(mask[j] == (j >= 5 && j < 8 ? X : 0));
  /* a zero-copy reader gets no page for a hole: a lease refuses one */
  engine_lease_t ls;
  ASSERT_ERR(engine_lease(f.eng, f.cid, 1, 0, 9, 7, &ls), KVC_E_RANGE);
  ASSERT_OK(engine_lease(f.eng, f.cid, 1, 8, 9, 7, &ls));
  ASSERT_U64_EQ(ls.npages, 1);
  ASSERT_OK(engine_lease_release(f.eng, 7, ls.id));
  /* the pool is full now: the next step of both is FULL, and changes nothing */
  engine_tok_t next[2] = {{0, 11}, {1, 9}};
  ASSERT_ERR(engine_reserve(f.eng, f.cid, next, 2), KVC_E_FULL);
  ASSERT_U64_EQ(engine_last_error(f.eng)->needed, 2);
  ASSERT_U64_EQ(fx_stats(&f).pages_free, 0);
  ASSERT_U64_EQ(FX_INFO(&f, 1).length, 9);
  SC_GET(&f, 1, 0, 9, F(1, 2, 3, 4, 5, 0, 0, 0, 21));
  fx_close(&f);
}

/* Two tokens a page: sequence 0 holds 0, 1 and 6, 7; slots 2..5 are holes
 * and their pages (1 and 2) have none. Reads, leases, copies and page
 * offsets over them. */
static void gap_open(fx_t *f, kvc_rope_style_t style, uint64_t npages) {
  kvc_layout_t l = fx_layout(1, 1, 2, 1, KVC_DTYPE_F32, 2);
  l.rope_style = style;
  fx_open(f, &l, npages);
  sc_step(f, 2, A(0, 0), A(0, 1), F(1, 2));
  sc_step(f, 2, A(0, 0), A(6, 7), F(7, 8));
  ASSERT_U64_EQ(FX_INFO(f, 0).pages, 2);
  ASSERT_U64_EQ(fx_stats(f).pages_used, 2);
}

TEST(pages_of_holes_read_as_zeros_and_copy_as_none) {
  fx_t f;
  gap_open(&f, KVC_ROPE_NEOX, 8);
  SC_GET(&f, 0, 0, 8, F(1, 2, 0, 0, 0, 0, 7, 8));
  SC_GET(&f, 0, 3, 4, F(0, 0, 0, 7)); /* a read that starts inside them */
  SC_EXPECT(&f, 1, A(0), A(7), 8, F(1, 2, 0, 0, 0, 0, 7, 8), F(0, 0, X, X, X, X, 0, 0));
  uint64_t off;
  ASSERT_ERR(engine_page_offset(f.eng, f.cid, 0, 3, &off), KVC_E_RANGE);
  ASSERT_OK(engine_page_offset(f.eng, f.cid, 0, 6, &off));
  /* copies share what has a page and copy the rest as none */
  ASSERT_OK(engine_copy_prefix(f.eng, f.cid, 0, 1, 8));
  ASSERT_OK(engine_copy_range(f.eng, f.cid, 0, 2, 4, 8));
  ASSERT_OK(engine_copy_prefix(f.eng, f.cid, 0, 3, 5)); /* ends in the holes */
  ASSERT_U64_EQ(fx_stats(&f).pages_used, 2);
  kvc_seq_info_t a = FX_INFO(&f, 1), b = FX_INFO(&f, 2), c = FX_INFO(&f, 3);
  ASSERT_U64_EQ(a.pages, 2);
  ASSERT_U64_EQ(a.shared_pages, 2);
  ASSERT_U64_EQ(b.start, 4);
  ASSERT_U64_EQ(b.pages, 1);
  ASSERT_U64_EQ(c.pages, 1);
  SC_GET(&f, 1, 0, 8, F(1, 2, 0, 0, 0, 0, 7, 8));
  SC_GET(&f, 2, 4, 4, F(0, 0, 7, 8));
  SC_GET(&f, 3, 0, 5, F(1, 2, 0, 0, 0));
  SC_EXPECT(&f, 1, A(2), A(7), 4, F(0, 0, 7, 8), F(X, X, 0, 0));
  /* a write into a copy's page of holes allocates its own page, not the source's */
  sc_step(&f, 2, A(1, 1), A(2, 3), F(30, 40));
  ASSERT_U64_EQ(fx_stats(&f).pages_used, 3);
  ASSERT_U64_EQ(FX_INFO(&f, 1).pages, 3);
  SC_GET(&f, 1, 0, 8, F(1, 2, 30, 40, 0, 0, 7, 8));
  SC_GET(&f, 0, 0, 8, F(1, 2, 0, 0, 0, 0, 7, 8));
  fx_close(&f);
}

/* A move into a page of holes allocates it (planned like any new page);
 * pages a move leaves all holes go back to the pool. */
TEST(shift_into_and_out_of_pages_of_holes) {
  fx_t f;
  gap_open(&f, KVC_ROPE_NONE, 3);
  /* 7, 8 move from 6, 7 down to 4, 5: page 2 gets one, page 3 goes (the tail) */
  ASSERT_OK(engine_shift(f.eng, f.cid, 0, 6, 8, -2));
  kvc_seq_info_t in = FX_INFO(&f, 0);
  ASSERT_U64_EQ(in.length, 6);
  ASSERT_U64_EQ(in.pages, 2);
  ASSERT_U64_EQ(fx_stats(&f).pages_used, 2);
  SC_GET(&f, 0, 0, 6, F(1, 2, 0, 0, 7, 8));
  /* up by 6, past the length: 4..9 become holes, pages 2..4 have none */
  ASSERT_OK(engine_shift(f.eng, f.cid, 0, 4, 6, 6));
  in = FX_INFO(&f, 0);
  ASSERT_U64_EQ(in.length, 12);
  ASSERT_U64_EQ(in.pages, 2);
  ASSERT_U64_EQ(fx_stats(&f).pages_used, 2);
  SC_EXPECT(&f, 1, A(0), A(11), 12, F(1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 7, 8),
            F(0, 0, X, X, X, X, X, X, X, X, 0, 0));
  /* 8 from 11 down to 3: page 1 gets a page, the pool's last; 7 stays at 10 */
  ASSERT_OK(engine_shift(f.eng, f.cid, 0, 11, 12, -8));
  ASSERT_U64_EQ(fx_stats(&f).pages_free, 0);
  ASSERT_U64_EQ(FX_INFO(&f, 0).length, 11);
  SC_GET(&f, 0, 0, 11, F(1, 2, 0, 8, 0, 0, 0, 0, 0, 0, 7));
  /* 7 to 5 needs page 2 first: FULL (the page the move would free does not
   * count, nor can the sequence evict itself), and nothing changed */
  engine_stats_t before = fx_stats(&f);
  ASSERT_ERR(engine_shift(f.eng, f.cid, 0, 10, 11, -5), KVC_E_FULL);
  engine_stats_t after = fx_stats(&f);
  FX_STATS_SAME_BUT_HEAP(&before, &after);
  ASSERT_U64_EQ(engine_last_error(f.eng)->needed, 1);
  SC_GET(&f, 0, 0, 11, F(1, 2, 0, 8, 0, 0, 0, 0, 0, 0, 7));
  /* 7 to 2 instead: page 1 holds it, page 5 goes, the length ends at 4 */
  ASSERT_OK(engine_shift(f.eng, f.cid, 0, 10, 11, -8));
  ASSERT_U64_EQ(FX_INFO(&f, 0).length, 4);
  ASSERT_U64_EQ(fx_stats(&f).pages_free, 1);
  SC_GET(&f, 0, 0, 4, F(1, 2, 7, 8));
  fx_close(&f);
}

/* A punch that leaves whole pages of holes frees them; a put refills one. */
TEST(punch_frees_pages_it_leaves_all_holes) {
  fx_t f;
  sc_open(&f, KVC_ATTN_CAUSAL, 0, 0, 0, 0, 8);
  sc_step(&f, 8, A(0, 0, 0, 0, 0, 0, 0, 0), A(0, 1, 2, 3, 4, 5, 6, 7), F(1, 2, 3, 4, 5, 6, 7, 8));
  ASSERT_OK(engine_copy_prefix(f.eng, f.cid, 0, 1, 8)); /* shared: a punch drops a reference */
  ASSERT_OK(engine_punch(f.eng, f.cid, 0, 1, 3)); /* no page all holes yet */
  ASSERT_U64_EQ(FX_INFO(&f, 0).pages, 4);
  ASSERT_OK(engine_punch(f.eng, f.cid, 0, 3, 6)); /* [1, 6): pages 1 and 2 */
  kvc_seq_info_t in = FX_INFO(&f, 0);
  ASSERT_U64_EQ(in.pages, 2);
  ASSERT_U64_EQ(in.length, 8);
  ASSERT_U64_EQ(fx_stats(&f).pages_used, 4); /* seq 1 still holds them */
  ASSERT_OK(engine_punch(f.eng, f.cid, 1, 2, 6));
  ASSERT_U64_EQ(fx_stats(&f).pages_used, 2);
  SC_GET(&f, 0, 0, 8, F(1, 0, 0, 0, 0, 0, 7, 8));
  SC_GET(&f, 1, 0, 8, F(1, 2, 0, 0, 0, 0, 7, 8));
  sc_step(&f, 2, A(0, 0), A(2, 3), F(30, 40)); /* into the holes: page 1 again */
  ASSERT_U64_EQ(FX_INFO(&f, 0).pages, 3);
  ASSERT_U64_EQ(fx_stats(&f).pages_used, 3);
  SC_EXPECT(&f, 1, A(0), A(7), 8, F(1, 0, 30, 40, 0, 0, 7, 8), F(0, X, 0, 0, X, X, 0, 0));
  fx_close(&f);
}

/* Pins, the pin limit, eviction, trim, shrink and remove count and free
 * only the pages a table holds. */
TEST(pins_eviction_trim_and_remove_over_pages_of_holes) {
  fx_t f;
  gap_open(&f, KVC_ROPE_NEOX, 4);
  /* a pin limit of half the pool: 2 pages, what seq 0 holds (not its 4 entries) */
  ASSERT_OK(engine_set_pin_limit(f.eng, 50));
  ASSERT_OK(engine_pin(f.eng, f.cid, 0, 9));
  ASSERT_U64_EQ(fx_stats(&f).pages_pinned, 2);
  ASSERT_OK(engine_unpin(f.eng, f.cid, 0, 9));
  ASSERT_U64_EQ(fx_stats(&f).pages_pinned, 0);
  /* 4 pages for seq 1: seq 0 is evicted, its 2 pages freed */
  sc_step(&f, 8, A(1, 1, 1, 1, 1, 1, 1, 1), A(0, 1, 2, 3, 4, 5, 6, 7), F(1, 2, 3, 4, 5, 6, 7, 8));
  engine_stats_t st = fx_stats(&f);
  ASSERT_U64_EQ(st.evicted_sequences, 1);
  ASSERT_U64_EQ(st.evicted_pages, 2);
  ASSERT_U64_EQ(st.pages_free, 0);
  fx_close(&f);
  /* trim past a page of holes, shrink the pool under it, remove it */
  gap_open(&f, KVC_ROPE_NEOX, 8);
  sc_step(&f, 2, A(0, 0), A(12, 13), F(13, 14)); /* holes 8..11: pages 4, 5 none */
  ASSERT_U64_EQ(FX_INFO(&f, 0).pages, 3);
  ASSERT_OK(engine_trim_front(f.eng, f.cid, 0, 4)); /* pages 0 (held) and 1 (none) go */
  kvc_seq_info_t in = FX_INFO(&f, 0);
  ASSERT_U64_EQ(in.start, 4);
  ASSERT_U64_EQ(in.pages, 2);
  ASSERT_U64_EQ(fx_stats(&f).pages_used, 2);
  engine_shrink_t sh;
  ASSERT_OK(engine_pool_shrink(f.eng, 2 * f.page_bytes, &sh));
  FX_AUDIT(f.eng);
  SC_GET(&f, 0, 4, 10, F(0, 0, 7, 8, 0, 0, 0, 0, 13, 14));
  ASSERT_OK(engine_remove(f.eng, f.cid, 0, 10, 14)); /* truncated in its holes */
  ASSERT_U64_EQ(FX_INFO(&f, 0).pages, 1);
  ASSERT_OK(engine_remove(f.eng, f.cid, 0, 0, 10));
  ASSERT_U64_EQ(fx_stats(&f).pages_used, 0);
  fx_close(&f);
}

/* Regression: a shift moving a sequence's last tokens down (llama.cpp's
 * seq_add with p1 at the length) truncated it at the target's end, as a
 * remove of a middle range does, losing the tokens between the target and
 * the range moved. */
TEST(shift_of_the_tail_down_keeps_the_tokens_below_it) {
  fx_t f;
  kvc_layout_t l = fx_layout(1, 1, 2, 1, KVC_DTYPE_F32, 2);
  l.rope_style = KVC_ROPE_NONE;
  fx_open(&f, &l, 8);
  sc_step(&f, 8, A(0, 0, 0, 0, 0, 0, 0, 0), A(0, 1, 2, 3, 4, 5, 6, 7), F(1, 2, 3, 4, 5, 6, 7, 8));
  ASSERT_OK(engine_punch(f.eng, f.cid, 0, 2, 4));
  ASSERT_OK(engine_punch(f.eng, f.cid, 0, 5, 7)); /* tokens 0, 1, 4, 7 */
  ASSERT_OK(engine_shift(f.eng, f.cid, 0, 7, 8, -5)); /* 8 to slot 2; 5 stays at 4 */
  ASSERT_U64_EQ(FX_INFO(&f, 0).length, 5);
  SC_GET(&f, 0, 0, 5, F(1, 2, 8, 0, 5));
  int64_t lo, hi;
  ASSERT_OK(engine_pos_range(f.eng, f.cid, 0, &lo, &hi));
  ASSERT_EQ(hi, 4);
  /* a remove of a middle range still drops the range: 4.. move down to 1 */
  ASSERT_OK(engine_remove(f.eng, f.cid, 0, 1, 4));
  SC_GET(&f, 0, 0, 2, F(1, 5));
  fx_close(&f);
}

/* The audit accepts an entry with no page only where every slot is a hole,
 * and counts a sequence's pages without them. */
TEST(audit_checks_entries_with_no_page) {
  fx_t f;
  gap_open(&f, KVC_ROPE_NEOX, 8);
  FX_AUDIT(f.eng);
  seq_t *s = hmap_get(&engine_cache(f.eng, f.cid)->seqs, 0);
  ASSERT(s && s->ntable == 4 && s->table[1] == POOL_NOPAGE && s->table[2] == POOL_NOPAGE);
  uint32_t held = s->table[0];
  s->table[0] = POOL_NOPAGE; /* slots 0, 1 hold tokens */
  char why[256] = "";
  ASSERT_ERR(engine_audit(f.eng, why, sizeof why), KVC_E_INTERNAL);
  ASSERT(strstr(why, "has no page but holds tokens") != NULL);
  s->table[0] = held;
  s->npages--; /* a count that disagrees with the table */
  ASSERT_ERR(engine_audit(f.eng, why, sizeof why), KVC_E_INTERNAL);
  ASSERT(strstr(why, "2 pages in its table, 1 counted") != NULL);
  s->npages++;
  FX_AUDIT(f.eng);
  fx_close(&f);
}

/* What few sequences use (lengths per layer, holes, positions) lives in
 * parts of their own: made by the call that needs them, given back once
 * they hold nothing, and the audit refuses an empty one kept. A
 * reservation with no gap makes none. */
TEST(seq_rare_parts_come_and_go) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  ASSERT_OK(fx_put(&f, 1, 0, 4, 0));
  seq_t *s = hmap_get(&engine_cache(f.eng, f.cid)->seqs, 1);
  ASSERT(s && s->x == &seq_ext_none);
  ASSERT_OK(fx_put_layers(&f, 1, 4, 4, 0, 1, 0)); /* layer 0 ahead: a length per layer */
  ASSERT(seq_ext_owned(s) && s->x->layer_len != NULL);
  FX_AUDIT(f.eng);
  ASSERT_OK(fx_put_layers(&f, 1, 4, 4, 1, 0, 0)); /* the rest catch up: one length again */
  ASSERT(s->x == &seq_ext_none);
  FX_AUDIT(f.eng);
  engine_tok_t tok = {1, 8};
  ASSERT_OK(engine_reserve(f.eng, f.cid, &tok, 1)); /* at its length: no gap, no holes */
  ASSERT(s->x == &seq_ext_none);
  ASSERT_OK(seq_ext_own(f.eng, s)); /* parts kept with nothing in them */
  char why[256] = "";
  ASSERT_ERR(engine_audit(f.eng, why, sizeof why), KVC_E_INTERNAL);
  ASSERT(strstr(why, "seq 1: rare parts of its own that hold nothing") != NULL);
  seq_ext_release(f.eng, s);
  ASSERT(s->x == &seq_ext_none);
  FX_AUDIT(f.eng);
  tok.pos = 12; /* past its length: [9, 12) are holes */
  ASSERT_OK(engine_reserve(f.eng, f.cid, &tok, 1));
  ASSERT(seq_ext_owned(s) && s->x->nholes == 1);
  FX_AUDIT(f.eng);
  fx_close(&f);
}

/* seq_div relabels the tokens around a page of holes: it rewrites the
 * pages holding them and gives back the one it made writable in between. */
TEST(seq_div_over_pages_of_holes_keeps_them_pageless) {
  fx_t f;
  sc_open(&f, KVC_ATTN_CAUSAL, 0, 0, 0, 2, 8);
  sc_step(&f, 2, A(0, 0), A(0, 1), F(1, 2));
  sc_step(&f, 2, A(0, 0), A(6, 7), F(7, 8)); /* pages 1, 2: holes only */
  ASSERT_U64_EQ(fx_stats(&f).pages_used, 2);
  ASSERT_OK(engine_seq_div(f.eng, f.cid, 0, 0, -1, 2));
  ASSERT_U64_EQ(FX_INFO(&f, 0).pages, 2);
  ASSERT_U64_EQ(fx_stats(&f).pages_used, 2);
  int64_t lo, hi;
  ASSERT_OK(engine_pos_range(f.eng, f.cid, 0, &lo, &hi));
  ASSERT_EQ(lo, 0);
  ASSERT_EQ(hi, 3); /* 7 / 2 */
  fx_close(&f);
}

/* Keys turned in place need no page for pages of holes: on a pool with no
 * page free and nothing evictable, a seq_div over them fits (it used to
 * count them as new pages and return FULL). */
TEST(seq_div_over_pages_of_holes_fits_a_full_pool) {
  fx_t f;
  sc_open(&f, KVC_ATTN_CAUSAL, 0, 0, 0, 2, 8);
  sc_step(&f, 2, A(0, 0), A(0, 1), F(1, 2));
  sc_step(&f, 2, A(0, 0), A(6, 7), F(7, 8)); /* pages 1, 2: holes only */
  ASSERT_OK(fx_put(&f, 1, 0, 12, 5));        /* the other 6 pages */
  ASSERT_OK(engine_pin(f.eng, f.cid, 1, 1));
  ASSERT_OK(engine_pin(f.eng, f.cid, 0, 1));
  ASSERT_U64_EQ(fx_stats(&f).pages_free, 0);
  ASSERT_OK(engine_seq_div(f.eng, f.cid, 0, 0, -1, 2));
  ASSERT_U64_EQ(FX_INFO(&f, 0).pages, 2);
  ASSERT_U64_EQ(fx_stats(&f).pages_used, 8);
  int64_t lo, hi;
  ASSERT_OK(engine_pos_range(f.eng, f.cid, 0, &lo, &hi));
  ASSERT_EQ(hi, 3);
  FX_EXPECT(&f, 1, 0, 12, 5);
  fx_close(&f);
}

/* shift over pages of holes: the target pages that would receive only
 * holes need no page. On a pool with one page free and nothing evictable,
 * moving [2, 8) (holes 2-5, tokens 6-7) up by 2 needs one new page (for
 * slots 8-9), not two (it used to count slots 4-5's page, which receives
 * only holes, as new, and return FULL). */
TEST(shift_over_pages_of_holes_fits_a_full_pool) {
  fx_t f;
  sc_open(&f, KVC_ATTN_CAUSAL, 0, 0, 0, 2, 8);
  sc_step(&f, 2, A(0, 0), A(0, 1), F(1, 2));
  sc_step(&f, 2, A(0, 0), A(6, 7), F(7, 8)); /* pages 1, 2: holes only */
  ASSERT_OK(fx_put(&f, 1, 0, 10, 5));        /* 5 of the other 6 pages */
  ASSERT_OK(engine_pin(f.eng, f.cid, 1, 1));
  ASSERT_OK(engine_pin(f.eng, f.cid, 0, 1));
  ASSERT_U64_EQ(fx_stats(&f).pages_free, 1);
  ASSERT_OK(engine_shift(f.eng, f.cid, 0, 2, -1, 2));
  FX_AUDIT(f.eng);
  /* tokens at 0, 1 and 8, 9; 2-7 holes: pages 0 and 4, the one that held
   * 6-7 given back */
  ASSERT_U64_EQ(FX_INFO(&f, 0).length, 10);
  ASSERT_U64_EQ(FX_INFO(&f, 0).pages, 2);
  ASSERT_U64_EQ(fx_stats(&f).pages_used, 7);
  int64_t lo, hi;
  ASSERT_OK(engine_pos_range(f.eng, f.cid, 0, &lo, &hi));
  ASSERT_EQ(lo, 0);
  ASSERT_EQ(hi, 9);
  FX_EXPECT(&f, 1, 0, 10, 5);
  /* and the other way, down over the holes: back where they were */
  ASSERT_OK(engine_shift(f.eng, f.cid, 0, 4, -1, -2));
  FX_AUDIT(f.eng);
  ASSERT_U64_EQ(FX_INFO(&f, 0).pages, 2);
  ASSERT_OK(engine_pos_range(f.eng, f.cid, 0, &lo, &hi));
  ASSERT_EQ(hi, 7);
  fx_close(&f);
}

/* A put of some layers into a hole makes its slots tokens for every layer:
 * the other layers' rows there read as zeros, as the hole did, never the
 * bytes the page held before (another sequence's, another tenant's: pool
 * pages are not cleared when they are freed). Both ways a hole arises: a
 * reservation past the length, and a punch. */
static void expect_zero_rows(fx_t *f, uint64_t seq, uint64_t pos, uint32_t lb, uint32_t le) {
  fx_rng_t r = fx_rng(&f->lay, lb, le, 0, 0);
  fx_buf_t b = fx_buf_new(&f->lay, r, 1);
  memset(b.k, 0x5A, b.kb);
  memset(b.v, 0x5A, b.vb);
  engine_io_t io = fx_io(seq, pos, 1, &b);
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  ASSERT_OK(engine_get(f->eng, f->cid, &x, &io, 1));
  for (uint64_t i = 0; i < b.kb / 4; i++) ASSERT(((float *)b.k)[i] == 0.0f);
  for (uint64_t i = 0; i < b.vb / 4; i++) ASSERT(((float *)b.v)[i] == 0.0f);
  fx_buf_free(&b);
}

TEST(layer_range_put_into_a_hole_leaves_the_other_layers_zero) {
  fx_t f;
  kvc_layout_t l = fx_layout(4, 2, 8, 4, KVC_DTYPE_F32, 4);
  fx_open(&f, &l, 4); /* the pool's bytes are 0xA5: what a freed page holds */
  ASSERT_OK(fx_put(&f, 1, 0, 1, 3));
  engine_tok_t t[2] = {{1, 6}, {1, 7}}; /* holes [1, 6) */
  ASSERT_OK(engine_reserve(f.eng, f.cid, t, 2));
  ASSERT_OK(fx_put(&f, 1, 6, 2, 3));
  ASSERT_OK(fx_put_layers(&f, 1, 2, 1, 0, 1, 3)); /* layer 0 only, into the hole */
  FX_EXPECT_RNG(&f, 1, 2, 1, fx_rng(&f.lay, 0, 1, 0, 0), 1, 3);
  expect_zero_rows(&f, 1, 2, 1, 4);
  expect_zero_rows(&f, 1, 1, 0, 4); /* still a hole */
  /* a punched slot held the sequence's own bytes: they do not come back */
  ASSERT_OK(fx_put(&f, 2, 0, 8, 7));
  ASSERT_OK(engine_punch(f.eng, f.cid, 2, 3, 5));
  ASSERT_OK(fx_put_layers(&f, 2, 3, 2, 2, 4, 7));
  FX_EXPECT_RNG(&f, 2, 3, 2, fx_rng(&f.lay, 2, 4, 0, 0), 2, 7);
  expect_zero_rows(&f, 2, 3, 0, 2);
  expect_zero_rows(&f, 2, 4, 0, 2);
  FX_EXPECT(&f, 2, 5, 3, 7);
  fx_close(&f);
}
