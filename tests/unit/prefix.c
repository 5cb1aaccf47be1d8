/* prefix.c: the engine's prefix index: hashing full pages, verified matches,
 * attach, cached pages, reclaim order, priorities, soft pins, the pin limit. */
#include "engine_fixture.h"

/* Layout of these tests: 4 tokens a page, 1536 bytes a page. */
#define T 4u

static const engine_pkey_t KEY_A = {"tenant-a", 8, NULL, 0};
static const engine_pkey_t KEY_B = {"tenant-b", 8, NULL, 0};

/* Token ids of a prompt: prompt p, position i. */
static uint32_t tok(uint32_t p, uint64_t i) { return p * 100000u + (uint32_t)i; }

static void tokens_of(uint32_t p, uint64_t from, uint64_t n, uint32_t *out) {
  for (uint64_t i = 0; i < n; i++) out[i] = tok(p, from + i);
}

/* Puts [pos, pos+n) of layers [lb, le) (0, 0: every layer) of seq with
 * seq's payload, the token ids of prompt p and span keys sp[0..nsp). */
static int put_spanned(fx_t *f, uint64_t seq, uint64_t pos, uint64_t n, uint32_t lb, uint32_t le,
                       uint32_t p, const engine_pkey_t *key, const kvc_span_key_t *sp, size_t nsp) {
  fx_rng_t r = fx_rng(&f->lay, lb, le, 0, 0);
  fx_buf_t b = fx_buf_new(&f->lay, r, n);
  uint32_t *ids = calloc(n + 1, sizeof *ids);
  fx_fill(&f->lay, r, seq, pos, n, 0, b.k, b.v);
  tokens_of(p, pos, n, ids);
  engine_io_t io = fx_io(seq, pos, n, &b);
  io.tokens = ids;
  io.spans = sp;
  io.nspans = nsp;
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  x.pkey = key;
  int rc = engine_put(f->eng, f->cid, &x, &io, 1);
  fx_buf_free(&b);
  free(ids);
  return rc;
}

/* Puts [pos, pos+n) of seq with seq's payload and the token ids of prompt p. */
static int put_tok(fx_t *f, uint64_t seq, uint64_t pos, uint64_t n, uint32_t p,
                   const engine_pkey_t *key) {
  return put_spanned(f, seq, pos, n, 0, 0, p, key, NULL, 0);
}

static engine_match_t match(fx_t *f, uint32_t p, uint64_t n, const engine_pkey_t *key) {
  uint32_t *ids = calloc(n + 1, sizeof *ids);
  tokens_of(p, 0, n, ids);
  engine_match_t m;
  ASSERT_OK(engine_match(f->eng, f->cid, ids, n, key, &m));
  free(ids);
  return m;
}

static int attach(fx_t *f, uint64_t dst, uint32_t p, uint64_t n, const engine_pkey_t *key,
                  uint64_t owner, engine_match_t *m) {
  uint32_t *ids = calloc(n + 1, sizeof *ids);
  tokens_of(p, 0, n, ids);
  int rc = engine_attach(f->eng, f->cid, dst, ids, n, key, owner, m);
  free(ids);
  return rc;
}

static void open_small(fx_t *f, uint64_t npages) {
  kvc_layout_t lay = fx_small_layout();
  fx_open(f, &lay, npages);
}

/* Like open_small, with the engine options of tweak (base and sizes are set
 * here). */
static void open_cfg(fx_t *f, uint64_t npages, engine_config_t tweak) {
  kvc_layout_t lay = fx_small_layout();
  memset(f, 0, sizeof *f);
  f->page_bytes = 1536;
  f->npages = npages;
  f->base = fx_pool_alloc(f->page_bytes * npages);
  tweak.base = f->base;
  tweak.pool_bytes = f->page_bytes * npages;
  tweak.page_bytes = f->page_bytes;
  ASSERT_OK(engine_new(&tweak, &f->eng));
  f->lay = lay;
  ASSERT_OK(engine_cache_open(f->eng, "main", &lay, &f->cid));
}

TEST(prefix_bad_arguments) {
  fx_t f;
  open_small(&f, 16);
  engine_match_t m;
  uint32_t ids[4] = {1, 2, 3, 4};
  ASSERT_ERR(engine_match(NULL, 0, ids, 4, NULL, &m), KVC_E_INVAL);
  ASSERT_ERR(engine_match(f.eng, 0, ids, 4, NULL, NULL), KVC_E_INVAL);
  ASSERT_ERR(engine_match(f.eng, 9, ids, 4, NULL, &m), KVC_E_NOCACHE);
  ASSERT_ERR(engine_match(f.eng, f.cid, NULL, 4, NULL, &m), KVC_E_INVAL);
  ASSERT_ERR(engine_match(f.eng, f.cid, ids, UINT64_MAX, NULL, &m), KVC_E_RANGE);
  engine_pkey_t big = {ids, 65, NULL, 0};
  ASSERT_ERR(engine_match(f.eng, f.cid, ids, 4, &big, &m), KVC_E_INVAL);
  ASSERT_ERR(engine_attach(f.eng, f.cid, 1, ids, 4, &big, 0, &m), KVC_E_INVAL);
  ASSERT_ERR(engine_set_priority(f.eng, f.cid, 1, 35), KVC_E_NOSEQ);
  ASSERT_OK(fx_put(&f, 1, 0, 4, 0));
  ASSERT_ERR(engine_set_priority(f.eng, f.cid, 1, 101), KVC_E_INVAL);
  ASSERT_ERR(engine_pin_ttl(f.eng, f.cid, 2, 1, 10), KVC_E_NOSEQ);
  /* a put of one layer with ids is a layer-by-layer save: nothing indexed */
  fx_rng_t r = fx_rng(&f.lay, 0, 1, 0, 0);
  fx_buf_t b = fx_buf_new(&f.lay, r, 4);
  engine_io_t io = fx_io(1, 4, 4, &b);
  io.tokens = ids;
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  ASSERT_OK(engine_put(f.eng, f.cid, &x, &io, 1));
  ASSERT_U64_EQ(fx_stats(&f).pages_indexed, 0);
  FX_AUDIT(f.eng);
  fx_buf_free(&b);
  fx_close(&f);
}

TEST(prefix_full_pages_are_indexed_and_matched) {
  fx_t f;
  open_small(&f, 32);
  ASSERT_OK(put_tok(&f, 1, 0, 10, 7, &KEY_A)); /* pages 0, 1 full; page 2 partial */
  engine_stats_t s = fx_stats(&f);
  ASSERT_U64_EQ(s.pages_indexed, 2);
  ASSERT_U64_EQ(s.pages_cached, 0);
  engine_match_t m = match(&f, 7, 10, &KEY_A);
  ASSERT_U64_EQ(m.tokens, 8);
  ASSERT_U64_EQ(m.pages, 2);
  ASSERT_U64_EQ(m.ineligible, 2);
  m = match(&f, 7, 7, &KEY_A); /* a query shorter than the chain */
  ASSERT_U64_EQ(m.tokens, 4);
  ASSERT_U64_EQ(m.ineligible, 3);
  ASSERT_U64_EQ(match(&f, 7, 10, &KEY_B).tokens, 0); /* another tenant's salt */
  ASSERT_U64_EQ(match(&f, 7, 10, NULL).tokens, 0);
  ASSERT_U64_EQ(match(&f, 8, 10, &KEY_A).tokens, 0); /* other tokens */
  /* the appended tokens fill page 2, which is indexed in turn */
  ASSERT_OK(put_tok(&f, 1, 10, 2, 7, &KEY_A));
  ASSERT_U64_EQ(fx_stats(&f).pages_indexed, 3);
  ASSERT_U64_EQ(match(&f, 7, 12, &KEY_A).tokens, 12);
  s = fx_stats(&f);
  ASSERT_U64_EQ(s.prefix_matches, 6);
  ASSERT_U64_EQ(s.prefix_tokens_queried, 10 + 7 + 10 + 10 + 10 + 12);
  ASSERT_U64_EQ(s.prefix_tokens_hit, 8 + 4 + 12);
  ASSERT_U64_EQ(s.prefix_tokens_ineligible, 2 + 3 + 2 + 2 + 2 + 0);
  fx_close(&f);
}

TEST(prefix_changed_token_stops_the_match_at_its_page) {
  fx_t f;
  open_small(&f, 32);
  ASSERT_OK(put_tok(&f, 1, 0, 16, 7, &KEY_A));
  uint32_t ids[16];
  tokens_of(7, 0, 16, ids);
  ids[9] ^= 1; /* a token of page 2 */
  engine_match_t m;
  ASSERT_OK(engine_match(f.eng, f.cid, ids, 16, &KEY_A, &m));
  ASSERT_U64_EQ(m.pages, 2);
  ASSERT_U64_EQ(fx_stats(&f).hash_verify_failed, 0); /* a plain miss, not a collision */
  fx_close(&f);
}

TEST(prefix_attach_shares_pages_and_pins) {
  fx_t f;
  open_small(&f, 32);
  ASSERT_OK(put_tok(&f, 1, 0, 13, 7, &KEY_A));
  engine_stats_t s0 = fx_stats(&f);
  engine_match_t m;
  ASSERT_OK(attach(&f, 2, 7, 13, &KEY_A, 42, &m));
  ASSERT_U64_EQ(m.tokens, 12);
  kvc_seq_info_t si = FX_INFO(&f, 2);
  ASSERT_U64_EQ(si.length, 12);
  ASSERT_EQ(si.pins, 1);
  ASSERT_EQ(si.shared_pages, 3);
  ASSERT_U64_EQ(fx_stats(&f).pages_used, s0.pages_used); /* no page copied */
  FX_EXPECT_RNG(&f, 2, 0, 12, fx_all(&f.lay), 1, 0);   /* seq 1's bytes */
  /* B extends its copy: a new page; A's pages stay as they were */
  ASSERT_OK(put_tok(&f, 2, 12, 4, 7, &KEY_A));
  FX_EXPECT(&f, 2, 12, 4, 0);
  FX_EXPECT(&f, 1, 0, 13, 0);
  /* overwriting an indexed page copies it: the index keeps the original */
  ASSERT_OK(fx_put(&f, 2, 0, 2, 9));
  ASSERT_U64_EQ(match(&f, 7, 12, &KEY_A).tokens, 12);
  FX_EXPECT(&f, 1, 0, 13, 0);
  ASSERT_EQ(engine_unpin_all(f.eng, 42), 1);
  fx_close(&f);
}

TEST(prefix_attach_of_nothing_makes_an_empty_pinned_sequence) {
  fx_t f;
  open_small(&f, 16);
  engine_match_t m;
  ASSERT_OK(attach(&f, 5, 3, 6, &KEY_A, 7, &m));
  ASSERT_U64_EQ(m.tokens, 0);
  ASSERT_U64_EQ(m.ineligible, 2);
  kvc_seq_info_t si = FX_INFO(&f, 5);
  ASSERT_U64_EQ(si.length, 0);
  ASSERT_EQ(si.pins, 1);
  ASSERT_OK(put_tok(&f, 5, 0, 6, 3, &KEY_A));
  ASSERT_U64_EQ(match(&f, 3, 6, &KEY_A).tokens, 4);
  fx_close(&f);
}

TEST(prefix_pages_outlive_their_sequence_as_cached) {
  fx_t f;
  open_small(&f, 32);
  ASSERT_OK(put_tok(&f, 1, 0, 12, 7, &KEY_A));
  ASSERT_OK(engine_remove(f.eng, f.cid, 1, 0, UINT64_MAX));
  engine_stats_t s = fx_stats(&f);
  ASSERT_U64_EQ(s.sequences, 0);
  ASSERT_U64_EQ(s.pages_cached, 3);
  ASSERT_U64_EQ(s.pages_used, 3);
  engine_match_t m;
  ASSERT_OK(attach(&f, 2, 7, 12, &KEY_A, 0, &m));
  ASSERT_U64_EQ(m.tokens, 12);
  ASSERT_U64_EQ(fx_stats(&f).pages_cached, 0); /* held again */
  FX_EXPECT_RNG(&f, 2, 0, 12, fx_all(&f.lay), 1, 0);
  fx_close(&f);
}

TEST(prefix_reclaims_chain_tails_first) {
  fx_t f;
  open_small(&f, 8);
  ASSERT_OK(put_tok(&f, 1, 0, 16, 7, &KEY_A)); /* 4 indexed pages */
  ASSERT_OK(engine_remove(f.eng, f.cid, 1, 0, UINT64_MAX));
  ASSERT_U64_EQ(fx_stats(&f).pages_cached, 4);
  ASSERT_OK(fx_put(&f, 50, 0, 4 * T, 1)); /* fills the 4 free pages */
  ASSERT_OK(engine_pin(f.eng, f.cid, 50, 1));
  for (uint64_t k = 1; k <= 4; k++) {
    ASSERT_OK(fx_put(&f, 100 + k, 0, T, 1)); /* needs one page: the cached tail goes */
    ASSERT_OK(engine_pin(f.eng, f.cid, 100 + k, 1));
    ASSERT_U64_EQ(fx_stats(&f).cached_reclaimed, k);
    ASSERT_U64_EQ(match(&f, 7, 16, &KEY_A).pages, 4 - k); /* never a hole */
    FX_AUDIT(f.eng);
  }
  ASSERT_EQ(engine_unpin_all(f.eng, 1), 5);
  fx_close(&f);
}

TEST(prefix_cached_pages_and_sequences_go_in_lru_order) {
  fx_t f;
  open_small(&f, 8);
  ASSERT_OK(fx_put(&f, 10, 0, T, 1)); /* oldest */
  engine_set_now(f.eng, 2);
  ASSERT_OK(put_tok(&f, 1, 0, 8, 7, &KEY_A));
  ASSERT_OK(engine_remove(f.eng, f.cid, 1, 0, UINT64_MAX)); /* 2 cached pages */
  ASSERT_OK(fx_put(&f, 11, 0, T, 1));
  ASSERT_OK(fx_put(&f, 12, 0, 4 * T, 1)); /* 4 + 2 + 1 + 1 = 8 pages */
  ASSERT_OK(fx_put(&f, 13, 0, T, 1));     /* one page: seq 10 goes, least recent */
  ASSERT_ERR(engine_seq_info(f.eng, f.cid, 10, &(kvc_seq_info_t){0}), KVC_E_NOSEQ);
  ASSERT_U64_EQ(fx_stats(&f).pages_cached, 2);
  ASSERT_OK(fx_put(&f, 14, 0, 2 * T, 1)); /* two pages: the cached chain, tail then head */
  ASSERT_U64_EQ(fx_stats(&f).cached_reclaimed, 2);
  ASSERT(engine_seq_info(f.eng, f.cid, 11, &(kvc_seq_info_t){0}) == 0);
  fx_close(&f);
}

TEST(prefix_hit_touches_cached_pages) {
  fx_t f;
  open_small(&f, 8);
  ASSERT_OK(put_tok(&f, 1, 0, 8, 7, &KEY_A));
  ASSERT_OK(engine_remove(f.eng, f.cid, 1, 0, UINT64_MAX)); /* 2 cached pages */
  ASSERT_OK(fx_put(&f, 10, 0, 6 * T, 1));
  ASSERT_U64_EQ(match(&f, 7, 8, &KEY_A).pages, 2); /* a hit: now more recent than 10 */
  ASSERT_OK(fx_put(&f, 11, 0, T, 1));
  ASSERT_ERR(engine_seq_info(f.eng, f.cid, 10, &(kvc_seq_info_t){0}), KVC_E_NOSEQ);
  ASSERT_U64_EQ(match(&f, 7, 8, &KEY_A).pages, 2);
  fx_close(&f);
}

TEST(prefix_forced_collision_never_serves_wrong_pages) {
  fx_t f;
  open_cfg(&f, 64, (engine_config_t){.hash_bits = 4});
  /* 16 one-page prompts with 4-bit hashes: some must share a hash */
  for (uint32_t p = 0; p < 16; p++) ASSERT_OK(put_tok(&f, 1 + p, 0, T, p, &KEY_A));
  engine_stats_t s = fx_stats(&f);
  ASSERT(s.pages_indexed < 16);
  ASSERT_U64_EQ(s.pages_indexed + s.hash_collisions, 16);
  uint64_t hits = 0;
  for (uint32_t p = 0; p < 16; p++) {
    engine_match_t m;
    ASSERT_OK(attach(&f, 100 + p, p, T, &KEY_A, 0, &m));
    hits += m.pages;
    if (m.pages) FX_EXPECT_RNG(&f, 100 + p, 0, T, fx_all(&f.lay), 1 + p, 0); /* its own */
  }
  s = fx_stats(&f);
  ASSERT_U64_EQ(hits, s.pages_indexed);
  ASSERT_U64_EQ(s.hash_verify_failed, 16 - hits); /* every other query hit a stranger */
  fx_close(&f);
}

TEST(prefix_xxh3_matches_too) {
  fx_t f;
  open_cfg(&f, 16, (engine_config_t){.hash = KVC_HASH_XXH3});
  ASSERT_OK(put_tok(&f, 1, 0, 9, 3, &KEY_A));
  ASSERT_U64_EQ(match(&f, 3, 9, &KEY_A).tokens, 8);
  ASSERT_U64_EQ(match(&f, 3, 9, &KEY_B).tokens, 0);
  fx_close(&f);
}

TEST(prefix_lower_priority_goes_first) {
  fx_t f;
  open_small(&f, 4);
  ASSERT_OK(fx_put(&f, 1, 0, T, 1));
  ASSERT_OK(fx_put(&f, 2, 0, T, 1));
  ASSERT_OK(fx_put(&f, 3, 0, T, 1));
  ASSERT_OK(fx_put(&f, 4, 0, T, 1));
  ASSERT_OK(engine_set_priority(f.eng, f.cid, 1, 90)); /* oldest, but kept */
  ASSERT_OK(engine_set_priority(f.eng, f.cid, 3, 10)); /* newer, but goes first */
  ASSERT_OK(fx_put(&f, 5, 0, T, 1));
  ASSERT_ERR(engine_seq_info(f.eng, f.cid, 3, &(kvc_seq_info_t){0}), KVC_E_NOSEQ);
  ASSERT_OK(fx_put(&f, 6, 0, T, 1)); /* then LRU within priority 35: seq 2 */
  ASSERT_ERR(engine_seq_info(f.eng, f.cid, 2, &(kvc_seq_info_t){0}), KVC_E_NOSEQ);
  FX_EXPECT(&f, 1, 0, T, 1);
  fx_close(&f);
}

TEST(prefix_soft_pin_lapses_and_is_refreshed_by_use) {
  fx_t f;
  open_small(&f, 4);
  ASSERT_OK(fx_put(&f, 1, 0, T, 1));
  ASSERT_OK(engine_pin_ttl(f.eng, f.cid, 1, 9, 100)); /* until 101 */
  ASSERT_EQ(FX_INFO(&f, 1).pins, 1);
  engine_set_now(f.eng, 80);
  ASSERT_EQ(engine_expire(f.eng), 0);
  FX_EXPECT(&f, 1, 0, T, 1); /* a read refreshes it: until 180 */
  engine_set_now(f.eng, 150);
  ASSERT_EQ(engine_expire(f.eng), 0);
  engine_set_now(f.eng, 181);
  ASSERT_EQ(engine_expire(f.eng), 1);
  ASSERT_EQ(FX_INFO(&f, 1).pins, 0);
  ASSERT_U64_EQ(fx_stats(&f).pins_lapsed, 1);
  /* a soft pin made hard does not lapse */
  ASSERT_OK(engine_pin_ttl(f.eng, f.cid, 1, 9, 10));
  ASSERT_OK(engine_pin(f.eng, f.cid, 1, 9));
  engine_set_now(f.eng, 1000);
  ASSERT_EQ(engine_expire(f.eng), 0);
  ASSERT_EQ(FX_INFO(&f, 1).pins, 1);
  fx_close(&f);
}

TEST(prefix_pin_limit_refuses_pins_past_it) {
  fx_t f;
  open_cfg(&f, 10, (engine_config_t){.pin_limit_pct = 20});
  ASSERT_OK(fx_put(&f, 1, 0, 2 * T, 1));
  ASSERT_OK(fx_put(&f, 2, 0, T, 1));
  ASSERT_OK(engine_pin(f.eng, f.cid, 1, 5)); /* 2 of 10 pages: at the limit */
  ASSERT_ERR(engine_pin(f.eng, f.cid, 2, 5), KVC_E_PINLIMIT);
  ASSERT_EQ(FX_INFO(&f, 2).pins, 0);
  ASSERT_U64_EQ(fx_stats(&f).pin_limit_errors, 1);
  ASSERT_OK(engine_pin(f.eng, f.cid, 1, 6)); /* its pages are pinned already */
  ASSERT_OK(engine_copy_prefix(f.eng, f.cid, 1, 3, 2 * T));
  ASSERT_OK(engine_pin(f.eng, f.cid, 3, 5)); /* shares pinned pages: no more pinned */
  fx_close(&f);
}

TEST(prefix_clear_and_drop_release_the_index) {
  fx_t f;
  open_small(&f, 16);
  ASSERT_OK(put_tok(&f, 1, 0, 12, 7, &KEY_A));
  ASSERT_OK(engine_remove(f.eng, f.cid, 1, 0, UINT64_MAX));
  ASSERT_OK(put_tok(&f, 2, 0, 8, 8, &KEY_A));
  ASSERT_OK(engine_cache_clear(f.eng, f.cid));
  engine_stats_t s = fx_stats(&f);
  ASSERT_U64_EQ(s.pages_used, 0);
  ASSERT_U64_EQ(s.pages_indexed, 0);
  ASSERT_U64_EQ(s.pages_cached, 0);
  ASSERT_U64_EQ(match(&f, 7, 12, &KEY_A).tokens, 0);
  ASSERT_OK(put_tok(&f, 3, 0, 8, 7, &KEY_A)); /* the cache works after a clear */
  ASSERT_U64_EQ(match(&f, 7, 8, &KEY_A).tokens, 8);
  ASSERT_OK(engine_cache_drop(f.eng, f.cid));
  ASSERT_U64_EQ(fx_stats(&f).pages_used, 0);
  FX_AUDIT(f.eng);
  engine_free(f.eng);
  free(f.base);
}

TEST(prefix_trimmed_and_untokened_pages_do_not_chain) {
  fx_t f;
  open_small(&f, 32);
  ASSERT_OK(fx_put(&f, 1, 0, T, 1));          /* page 0 without ids */
  ASSERT_OK(put_tok(&f, 1, T, 2 * T, 7, &KEY_A)); /* pages 1, 2 with ids */
  ASSERT_U64_EQ(fx_stats(&f).pages_indexed, 0);  /* no chain without page 0 */
  ASSERT_OK(put_tok(&f, 2, 0, 2 * T, 7, &KEY_A));
  ASSERT_U64_EQ(fx_stats(&f).pages_indexed, 2);
  ASSERT_OK(fx_put(&f, 2, 2 * T, 2, 1)); /* ids unknown from here */
  ASSERT_OK(put_tok(&f, 2, 2 * T + 2, 2, 7, &KEY_A));
  ASSERT_U64_EQ(fx_stats(&f).pages_indexed, 2);
  fx_close(&f);
}

/* ---- randomized: the index under constant pressure ------------------------- */

typedef struct rseq {
  bool live;
  uint32_t prompt; /* its tokens and payload are prompt's, from position 0 */
  uint64_t len;
} rseq_t;

static uint64_t rnd(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 33;
}

/* Puts [pos, pos+n) of seq with prompt p's ids and p's payload. */
static int put_prompt(fx_t *f, uint64_t seq, uint64_t pos, uint64_t n, uint32_t p) {
  fx_rng_t r = fx_all(&f->lay);
  fx_buf_t b = fx_buf_new(&f->lay, r, n);
  uint32_t *ids = calloc(n + 1, sizeof *ids);
  fx_fill(&f->lay, r, 1000 + p, pos, n, 0, b.k, b.v);
  tokens_of(p, pos, n, ids);
  engine_io_t io = fx_io(seq, pos, n, &b);
  io.tokens = ids;
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  x.pkey = &KEY_A;
  int rc = engine_put(f->eng, f->cid, &x, &io, 1);
  fx_buf_free(&b);
  free(ids);
  return rc;
}

static void random_op(fx_t *f, rseq_t *rs, uint64_t *rng) {
  uint64_t id = 1 + rnd(rng) % 16, op = rnd(rng) % 10;
  rseq_t *s = &rs[id];
  kvc_seq_info_t si;
  if (s->live && engine_seq_info(f->eng, f->cid, id, &si) == KVC_E_NOSEQ) s->live = false;
  if (op < 4) { /* extend or start a sequence */
    if (!s->live) {
      s->prompt = (uint32_t)(rnd(rng) % 4);
      s->len = 0;
    }
    uint64_t n = 1 + rnd(rng) % 7;
    int rc = put_prompt(f, id, s->len, n, s->prompt);
    if (rc == 0) {
      s->live = true;
      s->len += n;
    } else {
      ASSERT_EQ(rc, KVC_E_FULL);
    }
  } else if (op < 7) { /* attach a prompt's prefix */
    uint32_t p = (uint32_t)(rnd(rng) % 4);
    engine_match_t m;
    int rc = attach(f, id, p, 1 + rnd(rng) % 30, &KEY_A, rnd(rng) % 2 ? 77 : 0, &m);
    ASSERT(rc == 0 || rc == KVC_E_PINLIMIT);
    if (rc == 0) {
      s->live = true;
      s->prompt = p;
      s->len = m.tokens;
    }
  } else if (op < 8) {
    if (s->live) ASSERT_OK(engine_remove(f->eng, f->cid, id, 0, UINT64_MAX));
    s->live = false;
  } else if (op < 9) {
    uint64_t dst = 1 + rnd(rng) % 16;
    if (s->live && dst != id) {
      uint64_t n = s->len ? rnd(rng) % (s->len + 1) : 0;
      ASSERT_OK(engine_copy_prefix(f->eng, f->cid, id, dst, n));
      rs[dst].live = true;
      rs[dst].prompt = s->prompt;
      rs[dst].len = n;
    }
  } else {
    engine_unpin_all(f->eng, 77);
  }
}

TEST(prefix_random_ops_keep_invariants_and_bytes) {
  uint64_t seeds = test_long() ? 100 : 10, ops = 0;
  for (uint64_t seed = 1; seed <= seeds; seed++) {
    fx_t f;
    open_small(&f, 14);
    rseq_t rs[17];
    memset(rs, 0, sizeof rs);
    uint64_t rng = seed;
    for (int i = 0; i < 4000; i++, ops++) {
      engine_set_now(f.eng, (uint64_t)i + 2);
      random_op(&f, rs, &rng);
      FX_AUDIT(f.eng);
      if (i % 16) continue;
      for (uint64_t id = 1; id <= 16; id++) {
        kvc_seq_info_t si;
        if (!rs[id].live || engine_seq_info(f.eng, f.cid, id, &si) != 0) continue;
        ASSERT_U64_EQ(si.length, rs[id].len);
        if (si.length) FX_EXPECT_RNG(&f, id, 0, si.length, fx_all(&f.lay), 1000 + rs[id].prompt, 0);
      }
    }
    engine_stats_t st = fx_stats(&f);
    fprintf(stderr, "seed %" PRIu64 ": hit %" PRIu64 " of %" PRIu64 " tokens, %" PRIu64
            " reclaimed, %" PRIu64 " evicted\n", seed, st.prefix_tokens_hit,
            st.prefix_tokens_queried, st.cached_reclaimed, st.evicted_sequences);
    fx_close(&f);
  }
  fprintf(stderr, "%" PRIu64 " random prefix ops\n", ops);
}

TEST(prefix_index_reference_is_not_sharing) {
  fx_t f;
  open_small(&f, 16);
  ASSERT_OK(put_tok(&f, 1, 0, 8, 7, &KEY_A)); /* 2 indexed pages, one sequence */
  ASSERT_U64_EQ(fx_stats(&f).pages_shared, 0);
  ASSERT_EQ(FX_INFO(&f, 1).shared_pages, 0);
  engine_match_t m;
  ASSERT_OK(attach(&f, 2, 7, 8, &KEY_A, 0, &m));
  ASSERT_U64_EQ(fx_stats(&f).pages_shared, 2);
  ASSERT_EQ(FX_INFO(&f, 2).shared_pages, 2);
  ASSERT_OK(engine_remove(f.eng, f.cid, 1, 0, UINT64_MAX));
  ASSERT_U64_EQ(fx_stats(&f).pages_shared, 0);
  fx_close(&f);
}

TEST(prefix_ttl_near_uint64_max_never_lapses) {
  fx_t f;
  open_small(&f, 4);
  ASSERT_OK(fx_put(&f, 1, 0, T, 1));
  engine_set_now(f.eng, 100);
  ASSERT_OK(engine_pin_ttl(f.eng, f.cid, 1, 9, UINT64_MAX - 10));
  engine_set_now(f.eng, 200);
  FX_EXPECT(&f, 1, 0, T, 1); /* a use refreshes the deadline: still saturated */
  engine_set_now(f.eng, UINT64_MAX - 1);
  ASSERT_EQ(engine_expire(f.eng), 0);
  ASSERT_EQ(FX_INFO(&f, 1).pins, 1);
  ASSERT_EQ(engine_unpin_all(f.eng, 9), 1);
  fx_close(&f);
}

/* Regression: a lease took pool references behind the prefix index's back:
 * an indexed page released by its lease after its sequence went was never
 * cached (not on the LRU, never reclaimable), and clearing the cache while a
 * lease held an indexed page unlinked a node that was on no list. */
TEST(prefix_leased_pages_become_cached_after_release) {
  fx_t f;
  open_small(&f, 16);
  ASSERT_OK(put_tok(&f, 1, 0, 8, 7, &KEY_A)); /* 2 indexed pages */
  engine_lease_t l;
  ASSERT_OK(engine_lease(f.eng, f.cid, 1, 0, 8, 5, &l));
  ASSERT_OK(engine_remove(f.eng, f.cid, 1, 0, UINT64_MAX));
  ASSERT_U64_EQ(fx_stats(&f).pages_cached, 0); /* the lease still holds them */
  FX_AUDIT(f.eng);
  ASSERT_OK(engine_lease_release(f.eng, 5, l.id));
  ASSERT_U64_EQ(fx_stats(&f).pages_cached, 2);
  FX_AUDIT(f.eng);
  ASSERT_U64_EQ(match(&f, 7, 8, &KEY_A).pages, 2);
  ASSERT_OK(put_tok(&f, 2, 0, 8, 8, &KEY_A));
  ASSERT_OK(engine_lease(f.eng, f.cid, 2, 0, 8, 5, &l));
  ASSERT_OK(engine_cache_clear(f.eng, f.cid));
  FX_AUDIT(f.eng);
  ASSERT_OK(engine_lease_release(f.eng, 5, l.id));
  ASSERT_U64_EQ(fx_stats(&f).pages_used, 0);
  fx_close(&f);
}

/* ---- issue 11: a page is indexed only under the chain it was written in ---------- */

/* Puts [pos, pos+n) of seq with payload salt and the given ids. */
static int put_ids(fx_t *f, uint64_t seq, uint64_t pos, uint64_t n, const uint32_t *ids,
                   uint32_t salt, const engine_pkey_t *key) {
  fx_rng_t r = fx_all(&f->lay);
  fx_buf_t b = fx_buf_new(&f->lay, r, n);
  fx_fill(&f->lay, r, seq, pos, n, salt, b.k, b.v);
  engine_io_t io = fx_io(seq, pos, n, &b);
  io.tokens = ids;
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  x.pkey = key;
  int rc = engine_put(f->eng, f->cid, &x, &io, 1);
  fx_buf_free(&b);
  return rc;
}

static uint64_t match_ids(fx_t *f, const uint32_t *ids, uint64_t n, const engine_pkey_t *key) {
  engine_match_t m;
  ASSERT_OK(engine_match(f->eng, f->cid, ids, n, key, &m));
  return m.tokens;
}

/* The smallest case: seq 2 attaches A0 A1 A2, rewrites page 0 with
 * B0, then appends t3. No sequence ever held A0 A1 A2 t3, so a match of it
 * stops at 12; B0 A1 A2 t3 was never written in order either: 4. */
TEST(prefix_rewrite_of_an_attached_page_does_not_extend_the_old_chain) {
  fx_t f;
  open_small(&f, 32);
  uint32_t a[16], b0[4], q[16];
  for (uint32_t i = 0; i < 16; i++) a[i] = 1000 + i;
  for (uint32_t i = 0; i < 4; i++) b0[i] = 2000 + i;
  ASSERT_OK(put_ids(&f, 1, 0, 12, a, 0, &KEY_A));
  engine_match_t m;
  ASSERT_OK(engine_attach(f.eng, f.cid, 2, a, 12, &KEY_A, 0, &m));
  ASSERT_U64_EQ(m.tokens, 12);
  ASSERT_OK(put_ids(&f, 2, 0, 4, b0, 1, &KEY_A));    /* rewrite page 0 */
  ASSERT_OK(put_ids(&f, 2, 12, 4, a + 12, 2, &KEY_A)); /* append t3 after it */
  FX_AUDIT(f.eng);
  ASSERT_U64_EQ(match_ids(&f, a, 16, &KEY_A), 12);
  memcpy(q, a, sizeof q);
  memcpy(q, b0, sizeof b0);
  ASSERT_U64_EQ(match_ids(&f, q, 16, &KEY_A), 4);
  /* an attach of A0..A3 gets seq 1's pages only, never seq 2's page 3 */
  ASSERT_OK(engine_attach(f.eng, f.cid, 3, a, 16, &KEY_A, 0, &m));
  ASSERT_U64_EQ(m.tokens, 12);
  FX_EXPECT_RNG(&f, 3, 0, 12, fx_all(&f.lay), 1, 0); /* seq 1's bytes */
  /* rewriting pages 1 and 2 in order makes seq 2's chain whole again, and
   * only an append after that is indexed under B0 A1 A2 */
  ASSERT_OK(put_ids(&f, 2, 4, 8, a + 4, 3, &KEY_A));
  ASSERT_U64_EQ(match_ids(&f, q, 16, &KEY_A), 12);
  ASSERT_OK(put_ids(&f, 2, 12, 4, a + 12, 4, &KEY_A));
  ASSERT_U64_EQ(match_ids(&f, q, 16, &KEY_A), 16);
  FX_AUDIT(f.eng);
  fx_close(&f);
}

/* The same without attach: a sequence rewrites one of its own pages (indexed
 * or not) with other ids, then appends: the append is not indexed under the
 * old chain, and a rewrite without ids ends the chain at its position. */
TEST(prefix_rewrite_of_an_own_page_cuts_the_chain_there) {
  fx_t f;
  open_small(&f, 32);
  uint32_t a[16], c[16];
  for (uint32_t i = 0; i < 16; i++) a[i] = 1000 + i, c[i] = 1000 + i;
  c[5] = 9999; /* C = A with one id of page 1 changed */
  engine_match_t m;
  ASSERT_OK(put_ids(&f, 1, 0, 8, a, 0, &KEY_A));
  ASSERT_OK(put_ids(&f, 1, 4, 4, c + 4, 1, &KEY_A)); /* page 1 rewritten as C1 */
  ASSERT_OK(put_ids(&f, 1, 8, 4, a + 8, 2, &KEY_A)); /* page 2, after C1 */
  FX_AUDIT(f.eng);
  ASSERT_U64_EQ(match_ids(&f, a, 12, &KEY_A), 8); /* A0 A1 were indexed first */
  /* the case without attach: rewrite indexed page 0, then append */
  static const engine_pkey_t kc = {"tenant-c", 8, NULL, 0};
  uint32_t b0[4] = {2000, 2001, 2002, 2003};
  ASSERT_OK(put_ids(&f, 6, 0, 12, a, 9, &kc));
  ASSERT_OK(put_ids(&f, 6, 0, 4, b0, 10, &kc));
  ASSERT_OK(put_ids(&f, 6, 12, 4, a + 12, 11, &kc));
  ASSERT_U64_EQ(match_ids(&f, a, 16, &kc), 12);
  ASSERT_U64_EQ(match_ids(&f, c, 12, &KEY_A), 12);
  /* a rewrite without ids inside page 0: nothing after position 2 chains */
  ASSERT_OK(fx_put(&f, 1, 2, 1, 5));
  ASSERT_OK(put_ids(&f, 1, 12, 4, c + 12, 6, &KEY_A));
  ASSERT_U64_EQ(match_ids(&f, c, 16, &KEY_A), 12);
  /* truncation and a rewrite in a fresh sequence: only what was rewritten
   * in order from the cut chains again */
  ASSERT_OK(put_ids(&f, 4, 0, 12, c, 7, &KEY_B));
  ASSERT_OK(engine_remove(f.eng, f.cid, 4, 6, UINT64_MAX));
  uint32_t mix[16];
  memcpy(mix, c, 6 * sizeof *mix);
  for (uint32_t i = 6; i < 16; i++) mix[i] = 3000 + i;
  ASSERT_OK(put_ids(&f, 4, 6, 10, mix + 6, 8, &KEY_B));
  ASSERT_U64_EQ(match_ids(&f, mix, 16, &KEY_B), 16);
  ASSERT_U64_EQ(match_ids(&f, c, 16, &KEY_B), 12); /* C0..C2, indexed before */
  ASSERT_OK(engine_attach(f.eng, f.cid, 5, mix, 16, &KEY_B, 0, &m));
  FX_EXPECT_RNG(&f, 5, 0, 6, fx_all(&f.lay), 4, 7);
  FX_EXPECT_RNG(&f, 5, 6, 10, fx_all(&f.lay), 4, 8);
  FX_AUDIT(f.eng);
  fx_close(&f);
}

/* Moves cut the chain where a slot changed or was left empty: a middle
 * remove (later tokens moved down, keys re-rotated) at its begin, a move up
 * (seq_add) at the first slot it vacated; punching a hole at the hole. */
TEST(prefix_moves_and_punches_cut_the_chain) {
  kvc_layout_t l = fx_small_layout();
  l.rope_dims = 8, l.rope_theta = 10000;
  fx_t f;
  fx_open(&f, &l, 48);
  uint32_t a[24], q[24];
  for (uint32_t i = 0; i < 24; i++) a[i] = 700 + i;
  /* remove [4, 8): 8..15 move to 4..11; an append of ids after them is not
   * indexed under 0..3 8..15 (their bytes are rotated, not a prefill) */
  ASSERT_OK(put_ids(&f, 1, 0, 16, a, 0, &KEY_A));
  ASSERT_OK(engine_remove(f.eng, f.cid, 1, 4, 8));
  FX_AUDIT(f.eng);
  ASSERT_OK(put_ids(&f, 1, 12, 4, a + 16, 1, &KEY_A));
  memcpy(q, a, 4 * sizeof *q);
  memcpy(q + 4, a + 8, 12 * sizeof *q);
  ASSERT_U64_EQ(match_ids(&f, q, 16, &KEY_A), 4);
  /* seq_add of [8, 12) by +4 leaves holes at 8..11 inside the old chain */
  ASSERT_OK(put_ids(&f, 2, 0, 12, a, 2, &KEY_B));
  ASSERT_OK(engine_shift(f.eng, f.cid, 2, 8, 12, 4));
  FX_AUDIT(f.eng);
  ASSERT_OK(put_ids(&f, 2, 16, 4, a + 16, 3, &KEY_B));
  ASSERT_U64_EQ(match_ids(&f, a, 20, &KEY_B), 12); /* what was indexed before the move */
  /* a punched hole: the chain ends at it */
  ASSERT_OK(put_ids(&f, 3, 0, 8, a, 4, &KEY_A)); /* twins of seq 1's pages */
  ASSERT_OK(engine_punch(f.eng, f.cid, 3, 2, 3));
  FX_AUDIT(f.eng);
  fx_close(&f);
}

/* A write that copies an indexed page on write outside a put (a reservation
 * over it, a move into it) gives the copy the page's token metadata: the
 * blocks for it are reserved first (it dereferenced an empty reserve). */
TEST(prefix_reserve_and_move_over_indexed_pages_copy_their_metadata) {
  kvc_layout_t l = fx_small_layout();
  l.rope_dims = 8, l.rope_theta = 10000;
  fx_t f;
  fx_open(&f, &l, 48);
  uint32_t a[16];
  for (uint32_t i = 0; i < 16; i++) a[i] = 900 + i;
  ASSERT_OK(put_ids(&f, 1, 0, 16, a, 0, &KEY_A)); /* 4 pages, indexed */
  engine_tok_t t[2] = {{.seq_id = 1, .pos = 5}, {.seq_id = 1, .pos = 6}};
  ASSERT_OK(engine_reserve(f.eng, f.cid, t, 2)); /* page 1 copied on write */
  FX_AUDIT(f.eng);
  ASSERT_OK(engine_copy_prefix(f.eng, f.cid, 1, 2, 16));
  ASSERT_OK(engine_remove(f.eng, f.cid, 2, 2, 3)); /* every later page moves */
  FX_AUDIT(f.eng);
  ASSERT_U64_EQ(match_ids(&f, a, 16, &KEY_A), 16); /* the index kept its pages */
  fx_close(&f);
}

/* Tenants: one name is two caches; a prompt indexed in one never matches in
 * the other, whatever the salt (the tenant is in the chain's seed). */
TEST(prefix_tenants_share_no_cache_and_no_chain) {
  fx_t f;
  open_small(&f, 32);
  uint32_t a, b, again, t;
  kvc_layout_t lay = fx_small_layout();
  ASSERT_OK(engine_cache_open_in(f.eng, 7, "llama", &lay, &a));
  ASSERT_OK(engine_cache_open_in(f.eng, 8, "llama", &lay, &b));
  ASSERT(a != b);
  ASSERT_OK(engine_cache_open_in(f.eng, 7, "llama", &lay, &again));
  ASSERT_EQ(again, a);
  ASSERT_OK(engine_cache_tenant(f.eng, b, &t));
  ASSERT_EQ(t, 8);
  ASSERT_ERR(engine_cache_tenant(f.eng, 99, &t), KVC_E_NOCACHE);
  kvc_layout_t other = fx_layout(2, 2, 8, 4, KVC_DTYPE_F32, 4);
  ASSERT_OK(engine_cache_open_in(f.eng, 9, "llama", &other, &t)); /* its own layout */
  uint32_t ids[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  fx_rng_t r = fx_all(&f.lay);
  fx_buf_t buf = fx_buf_new(&f.lay, r, 8);
  engine_io_t io = fx_io(1, 0, 8, &buf);
  io.tokens = ids;
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  x.pkey = &KEY_A;
  ASSERT_OK(engine_put(f.eng, a, &x, &io, 1));
  fx_buf_free(&buf);
  engine_match_t m;
  ASSERT_OK(engine_match(f.eng, a, ids, 8, &KEY_A, &m));
  ASSERT_U64_EQ(m.tokens, 8);
  ASSERT_OK(engine_match(f.eng, b, ids, 8, &KEY_A, &m));
  ASSERT_U64_EQ(m.tokens, 0);
  fx_close(&f);
}

/* A layer-by-layer save (vLLM's save_kv_layer) of layers [lb, le). */
static int put_tok_layers(fx_t *f, uint64_t seq, uint64_t pos, uint64_t n, uint32_t lb,
                          uint32_t le, uint32_t p, const engine_pkey_t *key) {
  return put_spanned(f, seq, pos, n, lb, le, p, key, NULL, 0);
}

TEST(prefix_layer_by_layer_saves_index_a_page_once_every_layer_is_in) {
  fx_t f;
  open_small(&f, 64); /* 4 layers, 4 tokens a page */
  /* A prompt of 10 tokens saved layer by layer, each layer in two parts (a
   * save split by the shared buffer): nothing is indexed until the last
   * layer holds a page. */
  for (uint32_t l = 0; l < 4; l++) {
    ASSERT_OK(put_tok_layers(&f, 1, 0, 6, l, l + 1, 7, &KEY_A));
    ASSERT_OK(put_tok_layers(&f, 1, 6, 4, l, l + 1, 7, &KEY_A));
    FX_AUDIT(f.eng);
    ASSERT_U64_EQ(fx_stats(&f).pages_indexed, l == 3 ? 2u : 0u);
    ASSERT_U64_EQ(match(&f, 7, 10, &KEY_A).tokens, l == 3 ? 8u : 0u);
  }
  /* Another worker attaches the prompt: every byte is what was saved. */
  engine_match_t m;
  ASSERT_OK(attach(&f, 2, 7, 10, &KEY_A, 0, &m));
  ASSERT_U64_EQ(m.tokens, 8);
  FX_EXPECT_RNG(&f, 2, 0, 8, fx_all(&f.lay), 1, 0);
  FX_EXPECT(&f, 1, 0, 10, 0);

  /* Layer 2 saved with other ids for page 1: the page's layers were
   * computed for two prompts, so only page 0 enters the index. */
  for (uint32_t l = 0; l < 4; l++) {
    uint32_t p = l == 2 ? 8u : 9u;
    ASSERT_OK(put_tok_layers(&f, 3, 0, 4, l, l + 1, 9, &KEY_A));
    ASSERT_OK(put_tok_layers(&f, 3, 4, 4, l, l + 1, p, &KEY_A));
    FX_AUDIT(f.eng);
  }
  ASSERT_U64_EQ(match(&f, 9, 8, &KEY_A).tokens, 4);
  ASSERT_U64_EQ(match(&f, 8, 8, &KEY_A).tokens, 0);
  /* Saving that layer again with the prompt's ids does not complete it:
   * the chains of layers 0 and 1 ended when other ids were written under
   * them. Saving them again does. */
  ASSERT_OK(put_tok_layers(&f, 3, 4, 4, 2, 3, 9, &KEY_A));
  FX_AUDIT(f.eng);
  ASSERT_U64_EQ(match(&f, 9, 8, &KEY_A).tokens, 4);
  ASSERT_OK(put_tok_layers(&f, 3, 4, 4, 0, 2, 9, &KEY_A));
  FX_AUDIT(f.eng);
  ASSERT_U64_EQ(match(&f, 9, 8, &KEY_A).tokens, 8);

  /* A layer written without ids, or under another key, keeps the page out. */
  for (uint32_t l = 0; l < 4; l++) {
    if (l == 1) ASSERT_OK(fx_put_layers(&f, 4, 0, 4, 1, 2, 0));
    else ASSERT_OK(put_tok_layers(&f, 4, 0, 4, l, l + 1, 11, &KEY_A));
    if (l == 3) ASSERT_OK(put_tok_layers(&f, 5, 0, 4, 0, 3, 12, &KEY_A));
    else if (l < 3) ASSERT_OK(put_tok_layers(&f, 5, 0, 4, l, l + 1, 12, &KEY_A));
    FX_AUDIT(f.eng);
  }
  ASSERT_OK(put_tok_layers(&f, 5, 0, 4, 3, 4, 12, &KEY_B));
  FX_AUDIT(f.eng);
  ASSERT_U64_EQ(match(&f, 11, 4, &KEY_A).tokens, 0);
  ASSERT_U64_EQ(match(&f, 12, 4, &KEY_A).tokens, 0);
  ASSERT_U64_EQ(match(&f, 12, 4, &KEY_B).tokens, 0);
  /* A failed layer-range put with ids leaves no chain state behind. */
  uint32_t ids[4] = {1, 2, 3, 4};
  fx_rng_t r = fx_rng(&f.lay, 0, 1, 0, 0);
  fx_buf_t b = fx_buf_new(&f.lay, r, 4);
  engine_io_t io = fx_io(6, 4, 4, &b); /* a new sequence must start at 0 */
  io.tokens = ids;
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  x.pkey = &KEY_A;
  engine_stats_t before = fx_stats(&f);
  ASSERT_ERR(engine_put(f.eng, f.cid, &x, &io, 1), KVC_E_RANGE);
  engine_stats_t after = fx_stats(&f);
  FX_STATS_SAME(&before, &after);
  fx_buf_free(&b);
  FX_AUDIT(f.eng);
  fx_close(&f);
}

/* put_ids under KEY_A with span keys. */
static int put_spans(fx_t *f, uint64_t seq, uint64_t pos, uint64_t n, uint32_t lb, uint32_t le,
                     uint32_t p, const kvc_span_key_t *sp, size_t nsp) {
  return put_spanned(f, seq, pos, n, lb, le, p, &KEY_A, sp, nsp);
}

static uint64_t match_spans(fx_t *f, uint32_t p, uint64_t n, const kvc_span_key_t *sp,
                            size_t nsp) {
  uint32_t *ids = calloc(n + 1, sizeof *ids);
  tokens_of(p, 0, n, ids);
  engine_pkey_t key = KEY_A;
  key.spans = sp;
  key.nspans = nsp;
  engine_match_t m;
  ASSERT_OK(engine_match(f->eng, f->cid, ids, n, &key, &m));
  free(ids);
  return m.tokens;
}

TEST(prefix_span_keys_separate_prompts_with_the_same_ids) {
  fx_t f;
  open_small(&f, 64); /* 4 tokens a page */
  /* Two prompts of the same 12 ids (an image's placeholder tokens at
   * [2, 7)) with different images: neither matches the other's. */
  const kvc_span_key_t img_a = {2, 7, "image-a", 7}, img_b = {2, 7, "image-b", 7};
  ASSERT_OK(put_spans(&f, 1, 0, 12, 0, 0, 20, &img_a, 1));
  ASSERT_OK(put_spans(&f, 2, 0, 12, 0, 0, 20, &img_b, 1));
  FX_AUDIT(f.eng);
  ASSERT_U64_EQ(fx_stats(&f).pages_indexed, 6); /* two chains of 3 */
  ASSERT_U64_EQ(match_spans(&f, 20, 12, &img_a, 1), 12);
  ASSERT_U64_EQ(match_spans(&f, 20, 12, &img_b, 1), 12);
  ASSERT_U64_EQ(match_spans(&f, 20, 12, NULL, 0), 0); /* the ids alone */
  const kvc_span_key_t shorter = {2, 6, "image-a", 7}, later = {3, 7, "image-a", 7};
  /* page 0 agrees on positions 2, 3; page 1 holds the key up to 7 */
  ASSERT_U64_EQ(match_spans(&f, 20, 12, &shorter, 1), 4);
  ASSERT_U64_EQ(match_spans(&f, 20, 12, &later, 1), 0);
  const kvc_span_key_t unknown[2] = {{2, 7, "image-a", 7}, {9, 10, "never-seen", 10}};
  ASSERT_U64_EQ(match_spans(&f, 20, 12, unknown, 2), 8); /* page 2 has no such key */
  /* Attach hands each query its own prompt's bytes. */
  uint32_t ids[12];
  tokens_of(20, 0, 12, ids);
  engine_pkey_t ka = KEY_A, kb = KEY_A;
  ka.spans = &img_a, ka.nspans = 1;
  kb.spans = &img_b, kb.nspans = 1;
  engine_match_t m;
  ASSERT_OK(engine_attach(f.eng, f.cid, 3, ids, 12, &ka, 0, &m));
  ASSERT_U64_EQ(m.tokens, 12);
  FX_EXPECT_RNG(&f, 3, 0, 12, fx_all(&f.lay), 1, 0);
  ASSERT_OK(engine_attach(f.eng, f.cid, 4, ids, 12, &kb, 0, &m));
  ASSERT_U64_EQ(m.tokens, 12);
  FX_EXPECT_RNG(&f, 4, 0, 12, fx_all(&f.lay), 2, 0);
  FX_AUDIT(f.eng);

  /* A prompt without the image, same ids: its own chain, no match for A. */
  ASSERT_OK(put_spans(&f, 5, 0, 12, 0, 0, 20, NULL, 0));
  ASSERT_U64_EQ(match_spans(&f, 20, 12, NULL, 0), 12);
  ASSERT_U64_EQ(match_spans(&f, 20, 12, &img_a, 1), 12);
  /* Layer by layer, one layer saved with another image: not indexed. */
  for (uint32_t l = 0; l < 4; l++)
    ASSERT_OK(put_spans(&f, 6, 0, 8, l, l + 1, 21, l == 2 ? &img_b : &img_a, 1));
  FX_AUDIT(f.eng);
  ASSERT_U64_EQ(match_spans(&f, 21, 8, &img_a, 1), 0);
  ASSERT_U64_EQ(match_spans(&f, 21, 8, &img_b, 1), 0);
  for (uint32_t l = 0; l < 4; l++)
    ASSERT_OK(put_spans(&f, 7, 0, 8, l, l + 1, 21, &img_a, 1));
  ASSERT_U64_EQ(match_spans(&f, 21, 8, &img_a, 1), 8);
  /* A chunked prefill: the image's span given with each chunk (clipped). */
  ASSERT_OK(put_spans(&f, 8, 0, 4, 0, 0, 22, &img_b, 1));
  ASSERT_OK(put_spans(&f, 8, 4, 8, 0, 0, 22, &img_b, 1));
  ASSERT_U64_EQ(match_spans(&f, 22, 12, &img_b, 1), 12);
  FX_AUDIT(f.eng);

  /* Bad lists change nothing. */
  engine_stats_t before = fx_stats(&f);
  const kvc_span_key_t overlap[2] = {{2, 5, "a", 1}, {4, 6, "b", 1}};
  const kvc_span_key_t order[2] = {{6, 8, "a", 1}, {2, 4, "b", 1}};
  const kvc_span_key_t empty = {2, 5, "", 0}, backwards = {5, 5, "a", 1};
  char big[KVC_MAX_KEY_BYTES + 1];
  memset(big, 'x', sizeof big);
  const kvc_span_key_t toolong = {2, 5, big, sizeof big};
  ASSERT_ERR(put_spans(&f, 9, 0, 8, 0, 0, 23, overlap, 2), KVC_E_INVAL);
  ASSERT_ERR(put_spans(&f, 9, 0, 8, 0, 0, 23, order, 2), KVC_E_INVAL);
  ASSERT_ERR(put_spans(&f, 9, 0, 8, 0, 0, 23, &empty, 1), KVC_E_INVAL);
  ASSERT_ERR(put_spans(&f, 9, 0, 8, 0, 0, 23, &backwards, 1), KVC_E_INVAL);
  ASSERT_ERR(put_spans(&f, 9, 0, 8, 0, 0, 23, &toolong, 1), KVC_E_INVAL);
  engine_pkey_t kq = KEY_A;
  kq.spans = overlap, kq.nspans = 2;
  ASSERT_ERR(engine_match(f.eng, f.cid, ids, 12, &kq, &m), KVC_E_INVAL);
  fx_rng_t r = fx_all(&f.lay);
  fx_buf_t b = fx_buf_new(&f.lay, r, 4);
  engine_io_t io = fx_io(9, 0, 4, &b);
  io.spans = &img_a, io.nspans = 1; /* without token ids */
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  ASSERT_ERR(engine_put(f.eng, f.cid, &x, &io, 1), KVC_E_INVAL);
  /* A put that fails after interning new span keys keeps none of them. */
  const kvc_span_key_t fresh = {0, 2, "fresh-key", 9};
  io = fx_io(9, 2, 4, &b); /* a new sequence must start at 0: RANGE */
  io.tokens = ids;
  io.spans = &fresh, io.nspans = 1;
  x.pkey = &KEY_A;
  ASSERT_ERR(engine_put(f.eng, f.cid, &x, &io, 1), KVC_E_RANGE);
  fx_buf_free(&b);
  engine_stats_t after = fx_stats(&f);
  FX_STATS_SAME(&before, &after);
  FX_AUDIT(f.eng);
  fx_close(&f);
}

TEST(prefix_branch_of_an_independently_written_prefix_is_indexed_under_its_twin) {
  fx_t f;
  open_small(&f, 64);
  /* Two workers prefill the same 8-token system prompt on their own (no
   * attach), then different questions: the second one's pages of the
   * prompt are private twins, and its question is indexed under the first
   * one's pages, which a match walks. */
  uint32_t a[16], b[16];
  tokens_of(30, 0, 16, a);
  tokens_of(30, 0, 8, b);
  tokens_of(31, 8, 8, b + 8);
  fx_rng_t r = fx_all(&f.lay);
  for (int i = 0; i < 2; i++) {
    fx_buf_t buf = fx_buf_new(&f.lay, r, 16);
    fx_fill(&f.lay, r, 1u + (unsigned)i, 0, 16, 0, buf.k, buf.v);
    engine_io_t io = fx_io(1u + (unsigned)i, 0, 16, &buf);
    io.tokens = i ? b : a;
    engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
    x.pkey = &KEY_A;
    ASSERT_OK(engine_put(f.eng, f.cid, &x, &io, 1));
    fx_buf_free(&buf);
    FX_AUDIT(f.eng);
  }
  ASSERT_U64_EQ(fx_stats(&f).pages_indexed, 6); /* 4 of a, b's question's 2 */
  engine_match_t m;
  ASSERT_OK(engine_attach(f.eng, f.cid, 3, b, 16, &KEY_A, 0, &m));
  ASSERT_U64_EQ(m.tokens, 16);
  FX_EXPECT_RNG(&f, 3, 0, 8, fx_all(&f.lay), 1, 0); /* the prompt: a's twin pages */
  fx_expect_rng_(&f, 3, 8, 8, fx_all(&f.lay), 2, 0, __FILE__, __LINE__);
  /* The twin the branch hangs on is not reclaimed before the branch. */
  ASSERT_OK(engine_remove(f.eng, f.cid, 1, 0, UINT64_MAX));
  ASSERT_OK(engine_remove(f.eng, f.cid, 2, 0, UINT64_MAX));
  ASSERT_OK(engine_remove(f.eng, f.cid, 3, 0, UINT64_MAX));
  FX_AUDIT(f.eng);
  ASSERT_OK(engine_attach(f.eng, f.cid, 4, b, 16, &KEY_A, 0, &m));
  ASSERT_U64_EQ(m.tokens, 16);
  fx_close(&f);
}
