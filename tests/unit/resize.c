/* resize.c: the pool grows and shrinks under a live engine: grown pages are
 * used, a shrink evicts in LRU order and moves what stays, every byte and
 * the prefix index survive, and a shrink that would lose pinned or leased
 * data is refused with nothing changed. The free list (linked through the
 * pin counts of free pages) after each, and the audit that checks it. */
#include "core.h"
#include "engine_fixture.h"
#include "engine_resize.h"

#define T 4u
#define MAXP 32u /* pages the region holds */

static const engine_pkey_t KEY = {"k", 1, NULL, 0, NULL, 0};

/* An engine of n pages over a region of MAXP pages, and cache "main". */
static void open_n(fx_t *f, uint64_t n) {
  kvc_layout_t lay = fx_small_layout();
  memset(f, 0, sizeof *f);
  f->page_bytes = fx_round_up((uint64_t)engine_layout_page_bytes(&lay), 64);
  f->npages = n;
  f->base = fx_pool_alloc(f->page_bytes * MAXP);
  engine_config_t cfg = {.base = f->base, .pool_bytes = f->page_bytes * n,
                         .page_bytes = f->page_bytes};
  ASSERT_OK(engine_new(&cfg, &f->eng));
  engine_set_now(f->eng, 1);
  f->lay = lay;
  ASSERT_OK(engine_cache_open(f->eng, "main", &lay, &f->cid));
}

static uint64_t pages(fx_t *f) { return fx_stats(f).pool_pages; }

TEST(resize_grow_then_shrink_moves_every_byte) {
  fx_t f;
  open_n(&f, 8);
  ASSERT_OK(fx_put(&f, 1, 0, 8 * T, 1)); /* the whole pool */
  ASSERT_OK(engine_pool_grow(f.eng, 16 * f.page_bytes));
  ASSERT_U64_EQ(pages(&f), 16);
  ASSERT_U64_EQ(fx_stats(&f).pages_free, 8);
  ASSERT_OK(fx_put(&f, 2, 0, 8 * T, 2)); /* into the grown pages, nothing evicted */
  ASSERT_U64_EQ(fx_stats(&f).evicted_sequences, 0);
  FX_AUDIT(f.eng);
  ASSERT_OK(engine_remove(f.eng, f.cid, 1, 0, UINT64_MAX));
  engine_shrink_t s;
  ASSERT_OK(engine_pool_shrink(f.eng, 8 * f.page_bytes, &s));
  ASSERT_U64_EQ(s.moved_pages, 8);
  ASSERT_U64_EQ(s.evicted_pages, 0);
  ASSERT_U64_EQ(pages(&f), 8);
  ASSERT_U64_EQ(fx_stats(&f).pages_free, 0);
  FX_AUDIT(f.eng);
  FX_EXPECT(&f, 2, 0, 8 * T, 2);
  ASSERT_OK(fx_put(&f, 3, 0, T, 3)); /* a full pool still evicts */
  FX_AUDIT(f.eng);
  fx_close(&f);
}

TEST(resize_shrink_evicts_least_recent_first) {
  fx_t f;
  open_n(&f, 16);
  for (uint64_t s = 1; s <= 4; s++) ASSERT_OK(fx_put(&f, s, 0, 4 * T, (uint32_t)s));
  FX_EXPECT(&f, 1, 0, 4 * T, 1); /* 1 used: 2 is now the least recent */
  engine_shrink_t sh;
  ASSERT_OK(engine_pool_shrink(f.eng, 8 * f.page_bytes, &sh));
  ASSERT_U64_EQ(sh.evicted_pages, 8);
  kvc_seq_info_t si;
  ASSERT_EQ(engine_seq_info(f.eng, f.cid, 2, &si), KVC_E_NOSEQ);
  ASSERT_EQ(engine_seq_info(f.eng, f.cid, 3, &si), KVC_E_NOSEQ);
  FX_EXPECT(&f, 1, 0, 4 * T, 1);
  FX_EXPECT(&f, 4, 0, 4 * T, 4);
  FX_AUDIT(f.eng);
  fx_close(&f);
}

/* Cached pages of the prefix index move with their chains: a match and an
 * attach after the shrink find the same bytes. */
TEST(resize_shrink_moves_the_prefix_index) {
  fx_t f;
  open_n(&f, 16);
  ASSERT_OK(fx_put(&f, 9, 0, 8 * T, 9)); /* low pages, no ids */
  fx_rng_t r = fx_all(&f.lay);
  fx_buf_t b = fx_buf_new(&f.lay, r, 6 * T);
  uint32_t ids[6 * T];
  for (uint32_t i = 0; i < 6 * T; i++) ids[i] = 7000 + i;
  fx_fill(&f.lay, r, 1, 0, 6 * T, 0, b.k, b.v);
  engine_io_t io = fx_io(1, 0, 6 * T, &b);
  io.tokens = ids;
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  x.pkey = &KEY;
  ASSERT_OK(engine_put(f.eng, f.cid, &x, &io, 1)); /* pages 8..13 */
  fx_buf_free(&b);
  ASSERT_OK(engine_remove(f.eng, f.cid, 1, 0, UINT64_MAX)); /* cached */
  ASSERT_OK(engine_remove(f.eng, f.cid, 9, 0, UINT64_MAX));
  ASSERT_OK(engine_pool_shrink(f.eng, 8 * f.page_bytes, NULL));
  FX_AUDIT(f.eng); /* recomputes every moved page's chain from its parent */
  engine_match_t m;
  ASSERT_OK(engine_attach(f.eng, f.cid, 5, ids, 6 * T, &KEY, 0, &m));
  ASSERT_U64_EQ(m.pages, 6);
  FX_EXPECT_RNG(&f, 5, 0, 6 * T, fx_all(&f.lay), 1, 0);
  fx_close(&f);
}

TEST(resize_shrink_refused_when_pinned_data_would_be_lost) {
  fx_t f;
  open_n(&f, 16);
  ASSERT_OK(fx_put(&f, 1, 0, 12 * T, 1));
  ASSERT_OK(engine_pin(f.eng, f.cid, 1, 77));
  ASSERT_OK(fx_put(&f, 2, 0, 2 * T, 2));
  engine_stats_t before = fx_stats(&f);
  ASSERT_EQ(engine_pool_shrink(f.eng, 8 * f.page_bytes, NULL), KVC_E_FULL);
  ASSERT(strstr(engine_last_error(f.eng)->msg, "pinned") != NULL);
  engine_stats_t after = fx_stats(&f);
  FX_STATS_SAME_BUT_HEAP(&before, &after); /* not even seq 2 was evicted */
  FX_EXPECT(&f, 1, 0, 12 * T, 1);
  FX_EXPECT(&f, 2, 0, 2 * T, 2);
  /* Unpinned, it may go: the shrink evicts instead. */
  ASSERT_OK(engine_unpin(f.eng, f.cid, 1, 77));
  ASSERT_OK(engine_pool_shrink(f.eng, 8 * f.page_bytes, NULL));
  FX_AUDIT(f.eng);
  fx_close(&f);
}

TEST(resize_shrink_refused_while_a_lease_reads_the_released_part) {
  fx_t f;
  open_n(&f, 16);
  ASSERT_OK(fx_put(&f, 1, 0, 12 * T, 1));
  engine_lease_t l;
  ASSERT_OK(engine_lease(f.eng, f.cid, 1, 10 * T, 11 * T, 5, &l)); /* page 10 */
  ASSERT_EQ(engine_pool_shrink(f.eng, 8 * f.page_bytes, NULL), KVC_E_BUSY);
  ASSERT_U64_EQ(pages(&f), 16);
  ASSERT_OK(engine_lease_release(f.eng, 5, l.id));
  ASSERT_OK(engine_remove(f.eng, f.cid, 1, 4 * T, UINT64_MAX));
  ASSERT_OK(engine_lease(f.eng, f.cid, 1, 0, T, 5, &l)); /* below the new end: fine */
  ASSERT_OK(engine_pool_shrink(f.eng, 8 * f.page_bytes, NULL));
  ASSERT_U64_EQ(l.pages[0], 0);
  FX_AUDIT(f.eng);
  ASSERT_OK(engine_lease_release(f.eng, 5, l.id));
  fx_close(&f);
}

TEST(resize_bad_arguments) {
  fx_t f;
  open_n(&f, 8);
  ASSERT_EQ(engine_pool_grow(NULL, 0), KVC_E_INVAL);
  ASSERT_EQ(engine_pool_grow(f.eng, 8 * f.page_bytes), KVC_E_INVAL);
  ASSERT_EQ(engine_pool_grow(f.eng, 4 * f.page_bytes), KVC_E_INVAL);
  ASSERT_EQ(engine_pool_shrink(f.eng, 8 * f.page_bytes, NULL), KVC_E_INVAL);
  ASSERT_EQ(engine_pool_shrink(f.eng, 0, NULL), KVC_E_INVAL);
  ASSERT_EQ(engine_pool_shrink(NULL, 0, NULL), KVC_E_INVAL);
  ASSERT_U64_EQ(pages(&f), 8);
  fx_close(&f);
}

/* Pages in use stay low: freed pages are used before grown segments, a
 * free segment before a higher one, and a shrink keeps what lies below. */
TEST(resize_free_list_order_after_grow_and_shrink) {
  fx_t f;
  open_n(&f, 8);
  pool_t *p = &f.eng->pool;
  ASSERT_EQ(p->arenas[0].free_head, 0u); /* its first segment, carved at open */
  ASSERT_OK(fx_put(&f, 1, 0, 2 * T, 1)); /* pages 0, 1 */
  ASSERT_OK(fx_put(&f, 2, 0, 2 * T, 2)); /* pages 2, 3 */
  ASSERT_OK(engine_remove(f.eng, f.cid, 1, 0, UINT64_MAX)); /* 0, 1 free again */
  ASSERT_OK(engine_pool_grow(f.eng, 12 * f.page_bytes));
  FX_AUDIT(f.eng);
  ASSERT_EQ(p->nfree, 2u);
  ASSERT_EQ(p->nseg_free, 8u); /* 4..11, lowest first */
  ASSERT_U64_EQ(fx_stats(&f).pages_free, 10);
  ASSERT_OK(fx_put(&f, 3, 0, 3 * T, 3)); /* 0 and 1, then segment 4 */
  uint64_t off[3];
  for (uint32_t i = 0; i < 3; i++) ASSERT_OK(engine_page_offset(f.eng, f.cid, 3, i * T, &off[i]));
  ASSERT(off[0] / f.page_bytes < 2 && off[1] / f.page_bytes < 2 && off[0] != off[1]);
  ASSERT_U64_EQ(off[2] / f.page_bytes, 4);
  ASSERT_OK(engine_pool_shrink(f.eng, 6 * f.page_bytes, NULL));
  FX_AUDIT(f.eng);
  ASSERT_U64_EQ(fx_stats(&f).pages_free, 1); /* segment 5 */
  ASSERT_OK(engine_page_offset(f.eng, f.cid, 3, 2 * T, &off[2]));
  ASSERT_U64_EQ(off[2] / f.page_bytes, 4); /* nothing moved */
  FX_EXPECT(&f, 3, 0, 3 * T, 3);
  FX_EXPECT(&f, 2, 0, 2 * T, 2);
  fx_close(&f);
}

/* The audit walks each arena's free list: a link to a page in use, out of
 * the pool, into a cycle or cut short is each caught, and the pinref of a
 * page in use is still checked against its pinned holders. */
TEST(audit_checks_the_free_list) {
  fx_t f;
  open_n(&f, 8);
  ASSERT_OK(fx_put(&f, 1, 0, 8 * T, 1)); /* pages 0..7 */
  ASSERT_OK(engine_remove(f.eng, f.cid, 1, 2 * T, UINT64_MAX)); /* 2..7 free */
  pool_t *p = &f.eng->pool;
  uint32_t l[6], q = p->arenas[0].free_head;
  for (uint32_t i = 0; i < 6; i++, q = p->pinref[q]) l[i] = q;
  ASSERT_EQ(q, POOL_NOPAGE);
  FX_AUDIT(f.eng);
  char why[256] = "";
  p->pinref[l[2]] = 0; /* to a page in use */
  ASSERT_ERR(engine_audit(f.eng, why, sizeof why), KVC_E_INTERNAL);
  ASSERT(strstr(why, "free page 0 has refcnt 1") != NULL);
  p->pinref[l[2]] = l[1]; /* a cycle */
  ASSERT_ERR(engine_audit(f.eng, why, sizeof why), KVC_E_INTERNAL);
  ASSERT(strstr(why, "free list: goes on past its 6 pages") != NULL);
  p->pinref[l[2]] = 99; /* out of the pool */
  ASSERT_ERR(engine_audit(f.eng, why, sizeof why), KVC_E_INTERNAL);
  ASSERT(strstr(why, "free list: entry 3 of 6 is page 99") != NULL);
  p->pinref[l[2]] = POOL_NOPAGE; /* cut short: the last three lost */
  ASSERT_ERR(engine_audit(f.eng, why, sizeof why), KVC_E_INTERNAL);
  ASSERT(strstr(why, "free list: entry 3 of 6 is page 4294967295") != NULL);
  p->pinref[l[2]] = l[3];
  FX_AUDIT(f.eng);
  ASSERT_OK(engine_pin(f.eng, f.cid, 1, 7));
  p->pinref[0] = 0; /* a pinned page in use that says it is not */
  ASSERT_ERR(engine_audit(f.eng, why, sizeof why), KVC_E_INTERNAL);
  ASSERT(strstr(why, "page 0: pinref 0, 1 pinned holders") != NULL);
  p->pinref[0] = 1;
  FX_AUDIT(f.eng);
  fx_close(&f);
}
