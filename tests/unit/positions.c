/* positions.c: positions of a sequence's own (doc/attention.md, "Positions
 * are labels"): llama.cpp's seq_div and the self-extend sequence built on it
 * (seq_add, seq_div, seq_add), and what every other operation does with a
 * sequence whose tokens no longer sit at their slots' positions.
 *
 * A reference model written from llama.cpp's rules (llama-kv-cells.h:
 * pos_add adds, pos_div divides the positions in [p0, p1) of the sequence's
 * cells) follows each scenario; the engine's positions are read back
 * through the history view.
 */
#include <math.h>

#include "engine_fixture.h"

#define X (-INFINITY)
#define MAXP 256

/* The small layout (4 layers, 2 heads, K dim 8, 4 tokens a page) with RoPE
 * on 4 dims, or rope_style NONE (keys without positions) when none. */
static void open_rope(fx_t *f, bool none, uint64_t npages) {
  kvc_layout_t l = fx_small_layout();
  if (none) {
    l.rope_style = KVC_ROPE_NONE;
  } else {
    l.rope_dims = 4;
    l.rope_theta = 10000;
  }
  fx_open(f, &l, npages);
}

/* The positions of seq's slots [start, len), read from a history view of
 * its last token; *own: whether the view says it has positions of its own. */
static uint64_t positions(fx_t *f, uint64_t seq, int64_t *out, bool *own) {
  kvc_seq_info_t si = FX_INFO(f, seq);
  engine_tok_t t = {seq, si.length - 1};
  engine_hist_t h = {0};
  ASSERT_OK(engine_history(f->eng, f->cid, NULL, &t, 1, &h));
  ASSERT(h.nentries <= MAXP);
  float mask[MAXP];
  engine_span_t sp[1];
  h.mask = mask, h.mask_bytes = h.nentries * 4, h.spans = sp, h.spans_cap = 1;
  h.positions = out, h.positions_cap = MAXP;
  ASSERT_OK(engine_history(f->eng, f->cid, NULL, &t, 1, &h));
  if (own) *own = h.own_positions;
  return h.nentries;
}

static void expect_positions_(fx_t *f, uint64_t seq, const int64_t *want, uint64_t n,
                              const char *file, int line) {
  int64_t got[MAXP];
  uint64_t k = positions(f, seq, got, NULL);
  if (k != n) TEST_FAIL_("%s:%d: %" PRIu64 " positions, expected %" PRIu64, file, line, k, n);
  for (uint64_t i = 0; i < n; i++)
    if (got[i] != want[i])
      TEST_FAIL_("%s:%d: slot %" PRIu64 " at position %" PRId64 ", expected %" PRId64, file,
                 line, i, got[i], want[i]);
}
#define EXPECT_POSITIONS(f, seq, want, n) expect_positions_((f), (seq), (want), (n), __FILE__, __LINE__)

/* llama.cpp's rules on a reference array of n cells (positions). */
static void ref_add(int64_t *p, uint64_t n, int64_t p0, int64_t p1, int64_t d) {
  if (p0 < 0) p0 = 0;
  if (p1 < 0) p1 = INT64_MAX;
  for (uint64_t i = 0; i < n; i++)
    if (p[i] >= p0 && p[i] < p1) p[i] += d;
}
static void ref_div(int64_t *p, uint64_t n, int64_t p0, int64_t p1, int64_t d) {
  if (p0 < 0) p0 = 0;
  if (p1 < 0) p1 = INT64_MAX;
  for (uint64_t i = 0; i < n; i++)
    if (p[i] >= p0 && p[i] < p1) p[i] /= d;
}

TEST(seq_div_bad_input_fails_alone) {
  fx_t f;
  open_rope(&f, false, 32);
  ASSERT_OK(fx_put(&f, 0, 0, 8, 1));
  engine_stats_t before = fx_stats(&f);
  ASSERT_ERR(engine_seq_div(NULL, f.cid, 0, 0, 8, 2), KVC_E_INVAL);
  ASSERT_ERR(engine_seq_div(f.eng, f.cid, 9, 0, 8, 2), KVC_E_NOSEQ);
  ASSERT_ERR(engine_seq_div(f.eng, f.cid + 1, 0, 0, 8, 2), KVC_E_NOCACHE);
  ASSERT_ERR(engine_seq_div(f.eng, f.cid, 0, 0, 8, 0), KVC_E_INVAL);
  ASSERT_ERR(engine_seq_div(f.eng, f.cid, 0, 0, 8, -2), KVC_E_INVAL);
  ASSERT_ERR(engine_seq_div(f.eng, f.cid, 0, 6, 2, 2), KVC_E_RANGE);
  ASSERT_OK(engine_seq_div(f.eng, f.cid, 0, 0, 8, 1)); /* d 1: nothing */
  ASSERT_OK(engine_seq_div(f.eng, f.cid, 0, 3, 3, 2)); /* empty range: nothing */
  ASSERT_OK(engine_seq_div(f.eng, f.cid, 0, 20, -1, 2)); /* no token there */
  engine_stats_t after = fx_stats(&f);
  FX_STATS_SAME(&before, &after);
  FX_EXPECT(&f, 0, 0, 8, 1);
  int64_t p[MAXP];
  bool own = true;
  ASSERT_U64_EQ(positions(&f, 0, p, &own), 8);
  ASSERT(!own); /* no positions of its own were made */
  /* a sequence with a put in flight: BUSY */
  fx_buf_t b = fx_buf_new(&f.lay, fx_all(&f.lay), 2);
  engine_io_t io = fx_io(0, 8, 2, &b);
  engine_xfer_t x = fx_xfer(fx_all(&f.lay), KVC_DTYPE_F32);
  engine_put_job_t *job = NULL;
  ASSERT_OK(engine_put_begin(f.eng, f.cid, &x, &io, 1, &job));
  ASSERT_ERR(engine_seq_div(f.eng, f.cid, 0, 0, 8, 2), KVC_E_BUSY);
  engine_put_run(job);
  engine_put_end(f.eng, job);
  fx_buf_free(&b);
  fx_close(&f);
  /* kinds: window and chunked caches free by slot ranges, an encoder's
   * entries have no positions; a cache without a RoPE description cannot
   * turn its keys */
  kvc_layout_t kinds[4] = {fx_small_layout(), fx_small_layout(), fx_small_layout(),
                           fx_small_layout()};
  kinds[0].attn = KVC_ATTN_WINDOW, kinds[0].attn_window = 4;
  kinds[1].attn = KVC_ATTN_CHUNKED, kinds[1].attn_chunk = 4;
  kinds[2].attn = KVC_ATTN_ENCODER;
  int want[4] = {KVC_E_KIND, KVC_E_KIND, KVC_E_KIND, KVC_E_NOROPE};
  for (int i = 0; i < 4; i++) {
    if (i < 2) kinds[i].rope_dims = 4, kinds[i].rope_theta = 10000;
    fx_open(&f, &kinds[i], 16);
    ASSERT_OK(fx_put(&f, 0, 0, 8, 1));
    ASSERT_ERR(engine_seq_div(f.eng, f.cid, 0, 0, 8, 2), want[i]);
    FX_EXPECT(&f, 0, 0, 8, 1);
    fx_close(&f);
  }
}

/* Positions after a div are llama.cpp's pos / d for the tokens in range,
 * unchanged outside; pos_range reports them; without RoPE (NONE) the bytes
 * stay as they were. */
TEST(seq_div_positions_follow_llama_cpp) {
  fx_t f;
  open_rope(&f, true, 32);
  ASSERT_OK(fx_put(&f, 0, 0, 12, 1));
  int64_t ref[12];
  for (int i = 0; i < 12; i++) ref[i] = i;
  ASSERT_OK(engine_seq_div(f.eng, f.cid, 0, 2, 9, 3));
  ref_div(ref, 12, 2, 9, 3);
  EXPECT_POSITIONS(&f, 0, ref, 12);
  ASSERT_EQ(ref[5], 1);
  ASSERT_OK(engine_seq_div(f.eng, f.cid, 0, -1, -1, 2)); /* open ends: every token */
  ref_div(ref, 12, -1, -1, 2);
  EXPECT_POSITIONS(&f, 0, ref, 12);
  int64_t lo, hi;
  ASSERT_OK(engine_pos_range(f.eng, f.cid, 0, &lo, &hi));
  ASSERT_EQ(lo, 0);
  ASSERT_EQ(hi, 5); /* 11 / 2 */
  FX_EXPECT(&f, 0, 0, 12, 1); /* keys without positions: bytes unchanged */
  fx_close(&f);
}

/* llama.cpp's self-extend (group attention, tools/main and examples/passkey):
 * before each decode, while n_past >= ga_i + ga_w, seq_add / seq_div /
 * seq_add compress the window; the next token is decoded at n_past, below
 * the number of tokens held. Followed against the reference model at every
 * step; each new token lands at n_past, and the history's mask goes by
 * positions. */
TEST(self_extend_sequence_matches_llama_cpp) {
  fx_t f;
  open_rope(&f, false, 64);
  const int64_t ga_n = 4, ga_w = 8;
  int64_t ref[MAXP], n_past = 0, ga_i = 0;
  uint64_t n = 0;
  ASSERT_OK(fx_put(&f, 0, 0, 6, 1)); /* a 6-token prompt */
  for (; n < 6; n++) ref[n] = n_past++;
  for (int step = 0; step < 40; step++) {
    while (n_past >= ga_i + ga_w) {
      const int64_t ib = (ga_n * ga_i) / ga_w, bd = (ga_w / ga_n) * (ga_n - 1);
      const int64_t dd = (ga_w / ga_n) - ib * bd - ga_w;
      ASSERT_OK(engine_shift(f.eng, f.cid, 0, ga_i, n_past, ib * bd));
      ref_add(ref, n, ga_i, n_past, ib * bd);
      ASSERT_OK(engine_seq_div(f.eng, f.cid, 0, ga_i + ib * bd, ga_i + ib * bd + ga_w, ga_n));
      ref_div(ref, n, ga_i + ib * bd, ga_i + ib * bd + ga_w, ga_n);
      ASSERT_OK(engine_shift(f.eng, f.cid, 0, ga_i + ib * bd + ga_w, n_past + ib * bd, dd));
      ref_add(ref, n, ga_i + ib * bd + ga_w, n_past + ib * bd, dd);
      n_past -= bd;
      ga_i += ga_w / ga_n;
      EXPECT_POSITIONS(&f, 0, ref, n);
      FX_AUDIT(f.eng);
    }
    /* decode one token: reserve and put the next slot; it lands at n_past */
    engine_tok_t t = {0, n};
    ASSERT_OK(engine_reserve(f.eng, f.cid, &t, 1));
    ASSERT_OK(fx_put(&f, 0, n, 1, 1));
    ref[n++] = n_past++;
    EXPECT_POSITIONS(&f, 0, ref, n);
  }
  ASSERT(n_past < (int64_t)n); /* compressed: fewer positions than tokens */
  int64_t lo, hi;
  ASSERT_OK(engine_pos_range(f.eng, f.cid, 0, &lo, &hi));
  ASSERT_EQ(lo, 0);
  ASSERT_EQ(hi, n_past - 1);
  /* the mask of a batch of two held tokens goes by positions: a key is
   * open to a query when its position is at most the query's (llama.cpp's
   * causal rule), whatever their slots */
  uint64_t q0 = 9, q1 = 20;
  engine_tok_t bt[2] = {{0, q0}, {0, q1}};
  engine_hist_t h = {0};
  ASSERT_OK(engine_history(f.eng, f.cid, NULL, bt, 2, &h));
  ASSERT_U64_EQ(h.nentries, q1 + 1);
  float mask[2 * MAXP];
  int64_t pos[MAXP];
  h.mask = mask, h.mask_bytes = 2 * h.nentries * 4, h.positions = pos, h.positions_cap = MAXP;
  ASSERT_OK(engine_history(f.eng, f.cid, NULL, bt, 2, &h));
  ASSERT(h.own_positions);
  bool later_open = false;
  for (uint64_t j = 0; j <= q1; j++) {
    ASSERT_EQ(pos[j], ref[j]);
    for (int i = 0; i < 2; i++) {
      float want = ref[j] <= ref[bt[i].pos] ? 0 : X;
      if (mask[i * h.nentries + j] != want)
        TEST_FAIL_("mask[%d][%" PRIu64 "] = %g, expected %g (positions %" PRId64 ", %" PRId64 ")",
                   i, j, (double)mask[i * h.nentries + j], (double)want, ref[bt[i].pos], ref[j]);
      if (j > bt[i].pos && want == 0) later_open = true;
    }
  }
  ASSERT(later_open); /* a later slot sharing the query's position is open to it */
  fx_close(&f);
}

/* A div whose pages are shared (a copied prefix) copies them first, all or
 * nothing: FULL with figures leaves both sequences byte for byte as they
 * were and no positions of its own; with room it goes through and the
 * other holder keeps its keys. */
TEST(seq_div_full_on_shared_pages_changes_nothing) {
  fx_t f;
  open_rope(&f, false, 7);
  ASSERT_OK(fx_put(&f, 0, 0, 16, 1));           /* 4 pages */
  ASSERT_OK(engine_copy_prefix(f.eng, f.cid, 0, 1, 16));
  ASSERT_OK(fx_put(&f, 2, 0, 12, 3));           /* the other 3 pages */
  ASSERT_OK(engine_pin(f.eng, f.cid, 0, 7));
  ASSERT_OK(engine_pin(f.eng, f.cid, 2, 7));
  engine_stats_t before = fx_stats(&f);
  ASSERT_ERR(engine_seq_div(f.eng, f.cid, 1, 4, -1, 2), KVC_E_FULL);
  ASSERT_U64_EQ(engine_last_error(f.eng)->needed, 3);
  ASSERT_U64_EQ(engine_last_error(f.eng)->freeable, 0);
  engine_stats_t after = fx_stats(&f);
  FX_STATS_SAME(&before, &after);
  FX_EXPECT_RNG(&f, 1, 0, 16, fx_all(&f.lay), 0, 1);
  FX_EXPECT(&f, 0, 0, 16, 1);
  int64_t p[MAXP];
  bool own = true;
  positions(&f, 1, p, &own);
  ASSERT(!own);
  FX_AUDIT(f.eng);
  /* room made: the div copies the 3 pages it rewrites; seq 0 keeps its keys */
  ASSERT_OK(engine_unpin(f.eng, f.cid, 2, 7));
  ASSERT_OK(engine_remove(f.eng, f.cid, 2, 0, 12));
  ASSERT_OK(engine_seq_div(f.eng, f.cid, 1, 4, -1, 2));
  FX_EXPECT(&f, 0, 0, 16, 1);
  FX_EXPECT_RNG(&f, 1, 0, 4, fx_all(&f.lay), 0, 1); /* slots below 4 untouched */
  ASSERT_U64_EQ(FX_INFO(&f, 1).shared_pages, 1);
  fx_close(&f);
}

static void ids_of(uint64_t from, uint64_t n, uint32_t *out) {
  for (uint64_t i = 0; i < n; i++) out[i] = (uint32_t)(1000 + from + i);
}

static int put_ids(fx_t *f, uint64_t seq, uint64_t pos, uint64_t n, uint32_t salt) {
  fx_rng_t r = fx_all(&f->lay);
  fx_buf_t b = fx_buf_new(&f->lay, r, n);
  uint32_t ids[64];
  fx_fill(&f->lay, r, seq, pos, n, salt, b.k, b.v);
  ids_of(pos, n, ids);
  engine_io_t io = fx_io(seq, pos, n, &b);
  io.tokens = ids;
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  int rc = engine_put(f->eng, f->cid, &x, &io, 1);
  fx_buf_free(&b);
  return rc;
}

/* The pages of a divided sequence are not the prompt's: a match of the
 * prompt finds the pages as they were written (the index's own, copied
 * before the div rewrote them), and what the divided sequence writes after
 * with ids is not indexed as a continuation of the prompt. */
TEST(seq_div_pages_not_matched_as_the_prompt) {
  fx_t f;
  open_rope(&f, false, 32);
  ASSERT_OK(put_ids(&f, 0, 0, 16, 1));
  uint32_t ids[64];
  ids_of(0, 24, ids);
  engine_match_t m;
  ASSERT_OK(engine_match(f.eng, f.cid, ids, 16, NULL, &m));
  ASSERT_U64_EQ(m.tokens, 16);
  ASSERT_OK(engine_seq_div(f.eng, f.cid, 0, 4, -1, 2));
  FX_AUDIT(f.eng);
  /* the divided sequence goes on with ids: not a continuation of the prompt */
  ASSERT_OK(put_ids(&f, 0, 16, 8, 1));
  ASSERT_OK(engine_match(f.eng, f.cid, ids, 24, NULL, &m));
  ASSERT_U64_EQ(m.tokens, 16);
  ASSERT_OK(engine_attach(f.eng, f.cid, 5, ids, 24, NULL, 0, &m));
  ASSERT_U64_EQ(m.tokens, 16);
  FX_EXPECT_RNG(&f, 5, 0, 16, fx_all(&f.lay), 0, 1); /* the prompt's keys, not divided */
  int64_t p[MAXP];
  bool own = true;
  positions(&f, 5, p, &own);
  ASSERT(!own);
  fx_close(&f);
}

/* copy_prefix and copy_range carry the positions; an append to the copy
 * continues from its last position; remove of a middle range lowers the
 * later positions; punch and truncation address slots. */
TEST(copies_and_removes_of_a_divided_sequence) {
  fx_t f;
  open_rope(&f, true, 64);
  ASSERT_OK(fx_put(&f, 0, 0, 12, 1));
  ASSERT_OK(engine_seq_div(f.eng, f.cid, 0, 4, -1, 2)); /* 0 1 2 3 2 2 3 3 4 4 5 5 */
  int64_t ref[MAXP] = {0, 1, 2, 3, 2, 2, 3, 3, 4, 4, 5, 5};
  ASSERT_OK(engine_copy_prefix(f.eng, f.cid, 0, 1, 10));
  EXPECT_POSITIONS(&f, 1, ref, 10);
  ASSERT_OK(fx_put(&f, 1, 10, 2, 2));
  int64_t r1[MAXP] = {0, 1, 2, 3, 2, 2, 3, 3, 4, 4, 5, 6};
  EXPECT_POSITIONS(&f, 1, r1, 12);
  ASSERT_OK(engine_copy_range(f.eng, f.cid, 0, 2, 5, 9));
  int64_t lo, hi;
  ASSERT_OK(engine_pos_range(f.eng, f.cid, 2, &lo, &hi));
  ASSERT_EQ(lo, 2);
  ASSERT_EQ(hi, 4);
  /* remove slots [2, 6) of seq 0: the later ones go down by pos(6) - pos(2) = 1 */
  ASSERT_OK(engine_remove(f.eng, f.cid, 0, 2, 6));
  int64_t r0[MAXP] = {0, 1, 2, 2, 3, 3, 4, 4};
  EXPECT_POSITIONS(&f, 0, r0, 8);
  { /* NONE: slots 6.. moved down to 2.. as they were */
    fx_rng_t r = fx_all(&f.lay);
    fx_buf_t got = fx_buf_new(&f.lay, r, 6), want = fx_buf_new(&f.lay, r, 6);
    engine_io_t io = fx_io(0, 2, 6, &got);
    engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
    ASSERT_OK(engine_get(f.eng, f.cid, &x, &io, 1));
    fx_fill(&f.lay, r, 0, 6, 6, 1, want.k, want.v);
    fx_cmp_(&f.lay, r, 6, got.k, want.k, 0, 2, __FILE__, __LINE__);
    fx_cmp_(&f.lay, r, 6, got.v, want.v, 1, 2, __FILE__, __LINE__);
    fx_buf_free(&got);
    fx_buf_free(&want);
  }
  /* punch addresses slots: the holes keep no token, pos_range skips them */
  ASSERT_OK(engine_punch(f.eng, f.cid, 0, 6, 7));
  ASSERT_OK(engine_pos_range(f.eng, f.cid, 0, &lo, &hi));
  ASSERT_EQ(hi, 4);
  ASSERT_OK(engine_remove(f.eng, f.cid, 1, 4, 100)); /* truncation keeps the positions below */
  EXPECT_POSITIONS(&f, 1, r1, 4);
  ASSERT_OK(engine_punch(f.eng, f.cid, 0, 1, -1));
  ASSERT_OK(fx_put(&f, 0, 1, 3, 1));
  int64_t id[4] = {0, 1, 2, 3};
  EXPECT_POSITIONS(&f, 0, id, 4);
  FX_AUDIT(f.eng);
  fx_close(&f);
}

/* Random seq_div / shift / append / remove / truncate / copy_prefix calls on
 * sequences with positions of their own, against the reference (llama.cpp's
 * rules for div and add; doc/attention.md's for the others); positions,
 * pos_range and the audit checked after every call. KVC_LONG=1 runs long. */
#define RSEQ 4
typedef struct pref {
  int64_t pos[MAXP];
  uint64_t n;
} pref_t;

static uint64_t prng(uint64_t *s) {
  *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
  return *s;
}

TEST_TIMEOUT(positions_random_ops_match_reference, 600) {
  const char *lng = getenv("KVC_LONG");
  uint64_t nops = lng && *lng && *lng != '0' ? 40000 : 1500, seed = 0x9e3779b97f4a7c15ull;
  fx_t f;
  open_rope(&f, true, 256);
  pref_t r[RSEQ];
  for (int i = 0; i < RSEQ; i++) {
    r[i].n = 16;
    for (uint64_t q = 0; q < 16; q++) r[i].pos[q] = (int64_t)q;
    ASSERT_OK(fx_put(&f, (uint64_t)i, 0, 16, 1));
    ASSERT_OK(engine_seq_div(f.eng, f.cid, (uint64_t)i, 4, 12, 2));
    ref_div(r[i].pos, 16, 4, 12, 2);
  }
  for (uint64_t op = 0; op < nops; op++) {
    int i = (int)(prng(&seed) % RSEQ);
    pref_t *x = &r[i];
    uint64_t sid = (uint64_t)i, kind = prng(&seed) % 6;
    int64_t top = x->pos[x->n - 1] + 4;
    int64_t p0 = (int64_t)(prng(&seed) % (uint64_t)(top + 1)) - 1;
    int64_t p1 = p0 < 0 ? -1 : p0 + (int64_t)(prng(&seed) % 8) - 1;
    if (p1 >= 0 && p1 < p0) p1 = p0;
    if (kind == 0) { /* seq_div */
      int64_t d = 1 + (int64_t)(prng(&seed) % 4);
      ASSERT_OK(engine_seq_div(f.eng, f.cid, sid, p0, p1, d));
      ref_div(x->pos, x->n, p0, p1, d);
    } else if (kind == 1) { /* seq_add on own positions: RANGE below 0 */
      int64_t delta = (int64_t)(prng(&seed) % 9) - 4, lo = p0 < 0 ? 0 : p0;
      int64_t hi = p1 < 0 ? INT64_MAX : p1;
      bool neg = false;
      for (uint64_t q = 0; q < x->n; q++)
        if (x->pos[q] >= lo && x->pos[q] < hi && x->pos[q] + delta < 0) neg = true;
      if (neg) {
        ASSERT_ERR(engine_shift(f.eng, f.cid, sid, p0, p1, delta), KVC_E_RANGE);
      } else {
        ASSERT_OK(engine_shift(f.eng, f.cid, sid, p0, p1, delta));
        ref_add(x->pos, x->n, p0, p1, delta);
      }
    } else if (kind == 2 && x->n < MAXP - 8) { /* append 1..4 */
      uint64_t k = 1 + prng(&seed) % 4;
      ASSERT_OK(fx_put(&f, sid, x->n, k, 2));
      for (uint64_t q = 0; q < k; q++) x->pos[x->n + q] = x->pos[x->n - 1] + 1 + (int64_t)q;
      x->n += k;
    } else if (kind == 3 && x->n > 4) { /* remove a middle range */
      uint64_t b = 1 + prng(&seed) % (x->n - 3), e = b + 1 + prng(&seed) % (x->n - 1 - b);
      int64_t rd = x->pos[b] - x->pos[e];
      bool neg = false;
      for (uint64_t q = e; q < x->n; q++) neg |= x->pos[q] + rd < 0;
      if (neg) {
        ASSERT_ERR(engine_remove(f.eng, f.cid, sid, b, e), KVC_E_RANGE);
      } else {
        ASSERT_OK(engine_remove(f.eng, f.cid, sid, b, e));
        for (uint64_t q = e; q < x->n; q++) x->pos[q - (e - b)] = x->pos[q] + rd;
        x->n -= e - b;
      }
    } else if (kind == 4 && x->n > 2) { /* truncate (punch to the end) */
      uint64_t b = 1 + prng(&seed) % (x->n - 1);
      ASSERT_OK(engine_punch(f.eng, f.cid, sid, (int64_t)b, -1));
      x->n = b;
    } else if (kind == 5) { /* copy a prefix onto another sequence */
      int j = (int)(prng(&seed) % RSEQ);
      uint64_t n = 1 + prng(&seed) % x->n;
      if (j == i) continue;
      ASSERT_OK(engine_copy_prefix(f.eng, f.cid, sid, (uint64_t)j, n));
      memcpy(r[j].pos, x->pos, n * sizeof *x->pos);
      r[j].n = n;
    }
    for (int s = 0; s < RSEQ; s++) {
      int64_t got[MAXP];
      bool own;
      uint64_t k = positions(&f, (uint64_t)s, got, &own);
      if (k != r[s].n) TEST_FAIL_("op %" PRIu64 ": seq %d holds %" PRIu64 ", expected %" PRIu64, op, s, k, r[s].n);
      int64_t lo = INT64_MAX, hi = -1, elo, ehi;
      for (uint64_t q = 0; q < k; q++) {
        if (got[q] != r[s].pos[q])
          TEST_FAIL_("op %" PRIu64 " (kind %" PRIu64 "): seq %d slot %" PRIu64 " at %" PRId64
                     ", expected %" PRId64, op, kind, s, q, got[q], r[s].pos[q]);
        lo = got[q] < lo ? got[q] : lo, hi = got[q] > hi ? got[q] : hi;
      }
      ASSERT_OK(engine_pos_range(f.eng, f.cid, (uint64_t)s, &elo, &ehi));
      ASSERT_EQ(elo, lo);
      ASSERT_EQ(ehi, hi);
    }
    FX_AUDIT(f.eng);
  }
  fx_close(&f);
}
