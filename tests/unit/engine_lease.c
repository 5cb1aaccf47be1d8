/* engine_lease.c: zero-copy read leases: bad arguments, where the leased
 * bytes are, copy on write after a lease, eviction pressure, release by
 * owner. Every test ends with the audit (fx_close), which counts lease
 * references against every page's refcount. */
#include "engine_fixture.h"

/* The small layout (4 layers, 2 heads, K dim 8, V dim 4, f32, 4-token pages). */
static void open_small(fx_t *f, uint64_t npages) {
  kvc_layout_t l = fx_small_layout();
  fx_open(f, &l, npages);
}

/* Checks the leased bytes of [pos, pos+n) hold seq's payload of salt, read in
 * place from the pool through the lease's placement. */
static void expect_leased(fx_t *f, const engine_lease_t *l, uint64_t seq, uint64_t pos,
                          uint64_t n, uint32_t salt) {
  const kvc_layout_t *lay = &f->lay;
  for (uint64_t p = pos; p < pos + n; p++) {
    uint64_t rel = p - l->first_pos, r = rel % l->page_tokens;
    ASSERT(rel / l->page_tokens < l->npages);
    const uint8_t *page = (const uint8_t *)f->base + (uint64_t)l->pages[rel / l->page_tokens] *
                                                         f->page_bytes;
    for (uint32_t ly = 0; ly < lay->num_layers; ly++) {
      const float *k = (const float *)(page + ly * l->layer_bytes + r * l->k_row_bytes);
      const float *v =
          (const float *)(page + ly * l->layer_bytes + l->v_offset + r * l->v_row_bytes);
      for (uint32_t h = 0; h < lay->num_kv_heads; h++) {
        for (uint32_t d = 0; d < lay->head_dim_k; d++) {
          float want = fx_val(seq, ly, p, h, d, 0, salt);
          if (k[h * lay->head_dim_k + d] != want)
            TEST_FAIL_("leased K layer %u pos %" PRIu64 " head %u dim %u: expected %g, got %g",
                       ly, p, h, d, (double)want, (double)k[h * lay->head_dim_k + d]);
        }
        for (uint32_t d = 0; d < lay->head_dim_v; d++) {
          float want = fx_val(seq, ly, p, h, d, 1, salt);
          if (v[h * lay->head_dim_v + d] != want)
            TEST_FAIL_("leased V layer %u pos %" PRIu64 " head %u dim %u: expected %g, got %g",
                       ly, p, h, d, (double)want, (double)v[h * lay->head_dim_v + d]);
        }
      }
    }
  }
}

TEST(lease_bad_arguments) {
  fx_t f;
  open_small(&f, 8);
  engine_lease_t l;
  ASSERT_OK(fx_put(&f, 1, 0, 10, 0));
  ASSERT_ERR(engine_lease(NULL, f.cid, 1, 0, 1, 7, &l), KVC_E_INVAL);
  ASSERT_ERR(engine_lease(f.eng, f.cid, 1, 0, 1, 7, NULL), KVC_E_INVAL);
  ASSERT_ERR(engine_lease(f.eng, f.cid + 1, 1, 0, 1, 7, &l), KVC_E_NOCACHE);
  ASSERT_ERR(engine_lease(f.eng, f.cid, 2, 0, 1, 7, &l), KVC_E_NOSEQ);
  ASSERT_ERR(engine_lease(f.eng, f.cid, 1, 3, 3, 7, &l), KVC_E_RANGE);  /* empty */
  ASSERT_ERR(engine_lease(f.eng, f.cid, 1, 4, 3, 7, &l), KVC_E_RANGE);  /* reversed */
  ASSERT_ERR(engine_lease(f.eng, f.cid, 1, 0, 11, 7, &l), KVC_E_RANGE); /* past length */
  ASSERT_OK(engine_trim_front(f.eng, f.cid, 1, 4));
  ASSERT_ERR(engine_lease(f.eng, f.cid, 1, 3, 6, 7, &l), KVC_E_RANGE); /* before start */
  ASSERT_ERR(engine_lease_release(f.eng, 7, 1), KVC_E_NOLEASE);
  ASSERT_OK(engine_lease(f.eng, f.cid, 1, 4, 6, 7, &l));
  ASSERT_ERR(engine_lease_release(f.eng, 8, l.id), KVC_E_NOLEASE); /* another owner's */
  ASSERT_OK(engine_lease_release(f.eng, 7, l.id));
  ASSERT_ERR(engine_lease_release(f.eng, 7, l.id), KVC_E_NOLEASE); /* twice */
  ASSERT_U64_EQ(fx_stats(&f).leases, 0);
  ASSERT_U64_EQ(fx_stats(&f).leases_taken, 1);
  fx_close(&f);
}

TEST(lease_places_pages_and_rows) {
  fx_t f;
  open_small(&f, 8);
  ASSERT_OK(fx_put(&f, 1, 0, 10, 3)); /* pages: [0,4) [4,8) [8,10) */
  engine_lease_t l;
  ASSERT_OK(engine_lease(f.eng, f.cid, 1, 5, 10, 7, &l));
  ASSERT(l.id != 0);
  ASSERT_U64_EQ(l.first_pos, 4);
  ASSERT_EQ(l.npages, 2);
  ASSERT_EQ(l.page_tokens, 4);
  uint64_t off;
  ASSERT_OK(engine_page_offset(f.eng, f.cid, 1, 5, &off));
  ASSERT_U64_EQ((uint64_t)l.pages[0] * f.page_bytes, off);
  ASSERT_OK(engine_page_offset(f.eng, f.cid, 1, 9, &off));
  ASSERT_U64_EQ((uint64_t)l.pages[1] * f.page_bytes, off);
  expect_leased(&f, &l, 1, 5, 5, 3);
  engine_stats_t s = fx_stats(&f);
  ASSERT_U64_EQ(s.leases, 1);
  ASSERT_U64_EQ(s.leased_pages, 2);
  ASSERT_U64_EQ(s.pages_shared, 2); /* the sequence's and the lease's */
  FX_AUDIT(f.eng);
  ASSERT_EQ(engine_lease_release_all(f.eng, 7), 1);
  s = fx_stats(&f);
  ASSERT_U64_EQ(s.leases, 0);
  ASSERT_U64_EQ(s.pages_shared, 0);
  ASSERT_U64_EQ(s.pages_used, 3);
  fx_close(&f);
}

TEST(lease_write_after_lease_copies) {
  fx_t f;
  open_small(&f, 16);
  ASSERT_OK(fx_put(&f, 1, 0, 10, 0));
  engine_lease_t l;
  ASSERT_OK(engine_lease(f.eng, f.cid, 1, 0, 10, 7, &l));
  ASSERT_OK(fx_put(&f, 1, 0, 10, 9));  /* overwrite everything */
  ASSERT_OK(fx_put(&f, 1, 10, 2, 9));  /* append into the partial page */
  expect_leased(&f, &l, 1, 0, 10, 0);  /* the lease still sees salt 0 */
  FX_EXPECT(&f, 1, 0, 12, 9);          /* the sequence sees its writes */
  engine_stats_t s = fx_stats(&f);
  ASSERT_U64_EQ(s.cow_copies, 3);
  ASSERT_U64_EQ(s.pages_used, 6);
  ASSERT_OK(engine_lease_release(f.eng, 7, l.id));
  s = fx_stats(&f);
  ASSERT_U64_EQ(s.pages_used, 3);
  ASSERT_U64_EQ(s.bytes_used, 3 * (uint64_t)engine_layout_page_bytes(&f.lay));
  fx_close(&f);
}

TEST(lease_pages_outlive_eviction) {
  fx_t f;
  open_small(&f, 4);
  ASSERT_OK(fx_put(&f, 1, 0, 8, 1)); /* 2 pages */
  engine_lease_t l;
  ASSERT_OK(engine_lease(f.eng, f.cid, 1, 0, 8, 7, &l));
  /* 3 pages needed, 2 free, and evicting seq 1 would free nothing. */
  ASSERT_ERR(fx_put(&f, 2, 0, 12, 2), KVC_E_FULL);
  ASSERT_U64_EQ(engine_last_error(f.eng)->freeable, 2);
  FX_EXPECT(&f, 1, 0, 8, 1);
  ASSERT_OK(fx_put(&f, 2, 0, 8, 2));    /* the 2 free pages */
  ASSERT_OK(fx_put(&f, 3, 0, 4, 3));    /* evicts 1 (frees nothing) and 2 */
  kvc_seq_info_t si;
  ASSERT_ERR(engine_seq_info(f.eng, f.cid, 1, &si), KVC_E_NOSEQ);
  ASSERT_ERR(engine_seq_info(f.eng, f.cid, 2, &si), KVC_E_NOSEQ);
  expect_leased(&f, &l, 1, 0, 8, 1);
  engine_stats_t s = fx_stats(&f);
  ASSERT_U64_EQ(s.evicted_sequences, 2);
  ASSERT_U64_EQ(s.evicted_pages, 2);
  ASSERT_U64_EQ(s.pages_used, 3);
  FX_AUDIT(f.eng);
  ASSERT_OK(engine_lease_release(f.eng, 7, l.id));
  ASSERT_U64_EQ(fx_stats(&f).pages_free, 3);
  ASSERT_U64_EQ(fx_stats(&f).bytes_used, (uint64_t)engine_layout_page_bytes(&f.lay));
  fx_close(&f);
}

TEST(lease_outlives_remove_and_drop) {
  fx_t f;
  open_small(&f, 8);
  ASSERT_OK(fx_put(&f, 1, 0, 6, 4));
  engine_lease_t l;
  ASSERT_OK(engine_lease(f.eng, f.cid, 1, 1, 6, 7, &l));
  ASSERT_OK(engine_remove(f.eng, f.cid, 1, 0, UINT64_MAX));
  ASSERT_OK(engine_cache_drop(f.eng, f.cid));
  expect_leased(&f, &l, 1, 1, 5, 4);
  ASSERT_U64_EQ(fx_stats(&f).pages_used, 2);
  FX_AUDIT(f.eng);
  ASSERT_OK(engine_lease_release(f.eng, 7, l.id));
  engine_stats_t s = fx_stats(&f);
  ASSERT_U64_EQ(s.pages_used, 0);
  ASSERT_U64_EQ(s.bytes_used, 0);
  fx_close(&f);
}

TEST(lease_release_all_is_per_owner) {
  fx_t f;
  open_small(&f, 8);
  ASSERT_OK(fx_put(&f, 1, 0, 8, 0));
  engine_lease_t a, b, c;
  ASSERT_OK(engine_lease(f.eng, f.cid, 1, 0, 4, 7, &a));
  ASSERT_OK(engine_lease(f.eng, f.cid, 1, 0, 8, 8, &b));
  ASSERT_OK(engine_lease(f.eng, f.cid, 1, 4, 8, 7, &c));
  ASSERT(a.id != b.id && b.id != c.id && a.id != c.id);
  ASSERT_U64_EQ(fx_stats(&f).leased_pages, 4);
  ASSERT_EQ(engine_lease_release_all(f.eng, 7), 2);
  ASSERT_EQ(engine_lease_release_all(f.eng, 7), 0);
  ASSERT_U64_EQ(fx_stats(&f).leases, 1);
  ASSERT_U64_EQ(fx_stats(&f).leased_pages, 2);
  ASSERT_OK(engine_lease_release(f.eng, 8, b.id));
  fx_close(&f); /* the engine frees with a lease held in other tests */
}

TEST(lease_held_at_engine_free) {
  fx_t f;
  open_small(&f, 8);
  ASSERT_OK(fx_put(&f, 1, 0, 8, 0));
  engine_lease_t l;
  ASSERT_OK(engine_lease(f.eng, f.cid, 1, 0, 8, 7, &l));
  fx_close(&f); /* LeakSanitizer checks the lease is freed */
}

/* A get job copies what the pages held at begin, whatever happens to the
 * sequence before it runs (the daemon runs it on a worker thread). */
TEST(get_job_copies_what_begin_saw) {
  fx_t f;
  open_small(&f, 6);
  ASSERT_OK(fx_put(&f, 1, 0, 10, 2));
  fx_rng_t r = fx_all(&f.lay);
  fx_buf_t b = fx_buf_new(&f.lay, r, 9), want = fx_buf_new(&f.lay, r, 9);
  engine_io_t io = fx_io(1, 1, 9, &b);
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  engine_get_job_t *job = NULL;
  ASSERT_ERR(engine_get_begin(f.eng, f.cid, &x, &io, 1, NULL), KVC_E_INVAL);
  engine_io_t bad = fx_io(2, 1, 9, &b);
  ASSERT_ERR(engine_get_begin(f.eng, f.cid, &x, &bad, 1, &job), KVC_E_NOSEQ);
  ASSERT(job == NULL);
  ASSERT_U64_EQ(fx_stats(&f).leases, 0);
  ASSERT_OK(engine_get_begin(f.eng, f.cid, &x, &io, 1, &job));
  ASSERT_U64_EQ(fx_stats(&f).leased_pages, 3);
  ASSERT_U64_EQ(fx_stats(&f).gets, 1);
  ASSERT_OK(fx_put(&f, 1, 0, 10, 9));  /* overwrite: copies the 3 pages */
  ASSERT_OK(fx_put(&f, 7, 0, 4, 7));   /* a new sequence: evicts 1, frees no leased page */
  FX_AUDIT(f.eng);
  engine_get_run(job);
  engine_get_end(f.eng, job);
  fx_fill(&f.lay, r, 1, 1, 9, 2, want.k, want.v);
  ASSERT_MEM_EQ(b.k, want.k, b.kb);
  ASSERT_MEM_EQ(b.v, want.v, b.vb);
  engine_stats_t s = fx_stats(&f);
  ASSERT_U64_EQ(s.leases, 0);
  ASSERT_U64_EQ(s.leased_pages, 0);
  fx_buf_free(&b);
  fx_buf_free(&want);
  fx_close(&f);
}

/* A put job: between its begin and end its sequence is busy; every
 * operation that would read its bytes or change it says so and changes
 * nothing, its cache stays, metadata reads see the sequence as before, and
 * the end makes the bytes and lengths visible. */
TEST(put_job_busy_until_its_end) {
  fx_t f;
  open_small(&f, 8);
  ASSERT_OK(fx_put(&f, 1, 0, 4, 1));
  ASSERT_OK(fx_put(&f, 3, 0, 4, 3));
  fx_rng_t r = fx_all(&f.lay);
  fx_buf_t b = fx_buf_new(&f.lay, r, 9), got = fx_buf_new(&f.lay, r, 9);
  fx_fill(&f.lay, r, 1, 2, 9, 5, b.k, b.v);
  engine_io_t io = fx_io(1, 2, 9, &b);
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  engine_put_job_t *job = NULL;
  ASSERT_ERR(engine_put_begin(f.eng, f.cid, &x, &io, 1, NULL), KVC_E_INVAL);
  engine_io_t bad = fx_io(2, 3, 9, &b); /* a new sequence must start at 0 */
  ASSERT_ERR(engine_put_begin(f.eng, f.cid, &x, &bad, 1, &job), KVC_E_RANGE);
  ASSERT(job == NULL);
  ASSERT_OK(engine_put_begin(f.eng, f.cid, &x, &io, 1, &job));
  FX_AUDIT(f.eng);
  kvc_seq_info_t si;
  ASSERT_OK(engine_seq_info(f.eng, f.cid, 1, &si));
  ASSERT_U64_EQ(si.length, 4);
  fx_buf_t small = fx_buf_new(&f.lay, r, 4);
  engine_io_t rd = fx_io(1, 0, 4, &small);
  engine_tok_t tok = {1, 4};
  engine_lease_t l;
  ASSERT_ERR(engine_get(f.eng, f.cid, &x, &rd, 1), KVC_E_BUSY);
  ASSERT_ERR(engine_put(f.eng, f.cid, &x, &io, 1), KVC_E_BUSY);
  ASSERT_ERR(engine_remove(f.eng, f.cid, 1, 0, 2), KVC_E_BUSY);
  ASSERT_ERR(engine_copy_prefix(f.eng, f.cid, 1, 5, 2), KVC_E_BUSY);
  ASSERT_ERR(engine_copy_prefix(f.eng, f.cid, 3, 1, 2), KVC_E_BUSY);
  ASSERT_ERR(engine_trim_front(f.eng, f.cid, 1, 1), KVC_E_BUSY);
  ASSERT_ERR(engine_shift(f.eng, f.cid, 1, 0, 2, 1), KVC_E_BUSY);
  ASSERT_ERR(engine_punch(f.eng, f.cid, 1, 0, 1), KVC_E_BUSY);
  ASSERT_ERR(engine_keep(f.eng, f.cid, 3), KVC_E_BUSY);
  ASSERT_ERR(engine_reserve(f.eng, f.cid, &tok, 1), KVC_E_BUSY);
  ASSERT_ERR(engine_lease(f.eng, f.cid, 1, 0, 2, 7, &l), KVC_E_BUSY);
  ASSERT_ERR(engine_cache_clear(f.eng, f.cid), KVC_E_BUSY);
  ASSERT_ERR(engine_cache_drop(f.eng, f.cid), KVC_E_BUSY);
  ASSERT_OK(fx_put(&f, 4, 0, 20, 4)); /* 5 pages of 4 free: evicts 3, not the older busy 1 */
  ASSERT_ERR(engine_seq_info(f.eng, f.cid, 3, &si), KVC_E_NOSEQ);
  FX_AUDIT(f.eng);
  engine_put_run(job);
  engine_put_end(f.eng, job);
  FX_AUDIT(f.eng);
  ASSERT_OK(engine_seq_info(f.eng, f.cid, 1, &si));
  ASSERT_U64_EQ(si.length, 11);
  engine_io_t back = fx_io(1, 2, 9, &got);
  ASSERT_OK(engine_get(f.eng, f.cid, &x, &back, 1));
  ASSERT_MEM_EQ(got.k, b.k, b.kb);
  ASSERT_MEM_EQ(got.v, b.v, b.vb);
  ASSERT_OK(engine_cache_drop(f.eng, f.cid));
  fx_buf_free(&b);
  fx_buf_free(&got);
  fx_buf_free(&small);
  fx_close(&f);
}

/* A copy split in shares (by layers) for several copy threads: every share
 * run, in any order (empty ones too: more shares than layers), is the whole
 * copy, for a put and a get alike. */
TEST(jobs_split_in_parts_copy_the_same_bytes) {
  fx_t f;
  open_small(&f, 8);
  ASSERT_OK(fx_put(&f, 1, 0, 10, 1));
  fx_rng_t r = fx_all(&f.lay);
  for (unsigned nparts = 1; nparts <= 5; nparts++) {
    fx_buf_t b = fx_buf_new(&f.lay, r, 10), got = fx_buf_new(&f.lay, r, 10);
    fx_fill(&f.lay, r, 1, 0, 10, 20 + nparts, b.k, b.v);
    engine_io_t io = fx_io(1, 0, 10, &b);
    engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
    engine_put_job_t *pj = NULL;
    ASSERT_OK(engine_put_begin(f.eng, f.cid, &x, &io, 1, &pj));
    for (unsigned p = nparts; p-- > 0;) engine_put_run_part(pj, p, nparts); /* last first */
    engine_put_end(f.eng, pj);
    engine_io_t rd = fx_io(1, 0, 10, &got);
    engine_get_job_t *gj = NULL;
    ASSERT_OK(engine_get_begin(f.eng, f.cid, &x, &rd, 1, &gj));
    for (unsigned odd = 1; odd < 2; odd--) /* the odd shares, then the even ones */
      for (unsigned p = odd; p < nparts; p += 2) engine_get_run_part(gj, p, nparts);
    engine_get_end(f.eng, gj);
    ASSERT_MEM_EQ(got.k, b.k, b.kb);
    ASSERT_MEM_EQ(got.v, b.v, b.vb);
    FX_AUDIT(f.eng);
    fx_buf_free(&b);
    fx_buf_free(&got);
  }
  fx_close(&f);
}
