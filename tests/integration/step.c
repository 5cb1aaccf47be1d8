/* step.c (integration): the decode step in one request (kvc_step) and the
 * batched lease (kvc_lease_batch), against the real daemon: a gathered view
 * equals kvc_history's, a zero-copy view read in place equals the gathered
 * one byte for byte, a refused step (FULL, a view that does not fit, bad
 * input) changes nothing, a batched lease is all or nothing. */
#include "harness.h"

enum { NSEQ = 4, PREFIX = 40 };

static kvc_layout_t lay(void) { return it_layout(KVC_DTYPE_F32); }

/* Every sequence 1..NSEQ holds PREFIX tokens of (seq, salt 3). */
static void prefill(kvc_cache_t *h) {
  kvc_layout_t l = lay();
  size_t nk = it_tok_floats(&l, false) * PREFIX, nv = it_tok_floats(&l, true) * PREFIX;
  float *k = malloc(nk * 4), *v = malloc(nv * 4);
  ASSERT(k && v);
  for (uint64_t s = 1; s <= NSEQ; s++) {
    it_fill_f32(k, v, &l, s, 0, PREFIX, 3);
    ASSERT_OK(kvc_put(h, s, 0, PREFIX, k, v));
  }
  free(k), free(v);
}

/* Writes one new token of each sequence at position pos into the shared
 * buffer at its start and fills the step's entries for them. */
static void step_entries(kvc_client_t *c, kvc_cache_t *h, uint64_t pos, kvc_shm_io_t *e) {
  kvc_layout_t l = lay();
  void *base;
  uint64_t bytes, kb, vb;
  kvc_client_shm(c, &base, &bytes);
  ASSERT_OK(kvc_xfer_bytes(h, NULL, true, 1, &kb, &vb, NULL));
  for (uint64_t s = 1; s <= NSEQ; s++) {
    uint64_t off = (s - 1) * (kb + vb);
    it_fill_f32((float *)(void *)((char *)base + off), (float *)(void *)((char *)base + off + kb),
                &l, s, pos, 1, 3);
    e[s - 1] = (kvc_shm_io_t){.seq_id = s, .pos = pos, .ntokens = 1, .k_off = off,
                              .v_off = off + kb};
  }
}

static kvc_tok_t batch[NSEQ];

static const kvc_tok_t *batch_at(uint64_t pos) {
  for (uint64_t s = 1; s <= NSEQ; s++) batch[s - 1] = (kvc_tok_t){s, pos};
  return batch;
}

TEST(step_gathered_view_equals_history) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  kvc_layout_t l = lay();
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "step", &l, &h));
  prefill(h);
  void *base;
  uint64_t bytes;
  kvc_client_shm(c, &base, &bytes);
  uint64_t out = bytes / 2;
  for (uint64_t pos = PREFIX; pos < PREFIX + 5; pos++) {
    kvc_shm_io_t e[NSEQ];
    step_entries(c, h, pos, e);
    kvc_hist_span_t spans[NSEQ];
    kvc_step_t st = {.view = KVC_VIEW_GATHER, .out_off = out, .out_len = bytes - out,
                     .spans = spans, .spans_cap = NSEQ};
    uint64_t before = stat_get(c, "requests_total", NULL);
    ASSERT_OK(kvc_step(h, NULL, e, NSEQ, &st));
    ASSERT_U64_EQ(stat_get(c, "requests_total", NULL) - before, 1 + 1); /* the step, the stat */
    ASSERT_U64_EQ(st.hist.entries, NSEQ * (pos + 1));
    ASSERT_U64_EQ(st.hist.nspans, NSEQ);
    for (uint64_t s = 0; s < NSEQ; s++) {
      ASSERT_U64_EQ(spans[s].seq_id, s + 1);
      ASSERT_U64_EQ(spans[s].n, pos + 1);
    }
    /* Keep the step's view, then ask kvc_history for the same (it writes
     * at the start of the buffer). */
    size_t vbytes = st.hist.mask_off + st.hist.mask_bytes - st.hist.k_off;
    uint8_t *view = malloc(vbytes);
    memcpy(view, (char *)base + st.hist.k_off, vbytes);
    kvc_hist_t hh;
    ASSERT_OK(kvc_history(h, NULL, batch_at(pos), NSEQ, &hh, NULL, 0));
    ASSERT_U64_EQ(hh.entries, st.hist.entries);
    ASSERT_MEM_EQ(view, (char *)base + hh.k_off, st.hist.k_bytes);
    ASSERT_MEM_EQ(view + (st.hist.v_off - st.hist.k_off), (char *)base + hh.v_off, st.hist.v_bytes);
    ASSERT_MEM_EQ(view + (st.hist.mask_off - st.hist.k_off), (char *)base + hh.mask_off,
                  st.hist.mask_bytes);
    /* And the new token is there: K of layer 0, the entry of seq 1 at pos. */
    float want[128], wantv[128];
    it_fill_f32(want, wantv, &l, 1, pos, 1, 3);
    ASSERT_MEM_EQ(view + pos * 2 * 32 * 4, want, 2 * 32 * 4);
    free(view);
  }
  kvc_client_close(c);
  daemon_stop(&d);
}

/* The zero-copy view read in place, every layer, equals the gathered one. */
TEST(step_lease_view_equals_gathered_view) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  kvc_layout_t l = lay();
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "step", &l, &h));
  prefill(h);
  void *base;
  uint64_t bytes;
  kvc_client_shm(c, &base, &bytes);
  uint64_t out = bytes / 2, pos = PREFIX;
  kvc_shm_io_t e[NSEQ];
  step_entries(c, h, pos, e);
  kvc_hist_span_t spans[NSEQ];
  kvc_lease_t *leases[NSEQ];
  kvc_step_t st = {.view = KVC_VIEW_LEASE, .out_off = out, .out_len = bytes - out,
                   .spans = spans, .spans_cap = NSEQ, .leases = leases, .leases_cap = NSEQ};
  ASSERT_OK(kvc_step(h, NULL, e, NSEQ, &st));
  ASSERT_U64_EQ(st.hist.k_bytes, 0);
  ASSERT_U64_EQ(st.hist.mask_bytes, (uint64_t)NSEQ * st.hist.entries * 4);
  ASSERT_U64_EQ(stat_get(c, "leases", NULL), NSEQ);
  float *mask = malloc(st.hist.mask_bytes);
  memcpy(mask, (char *)base + st.hist.mask_off, st.hist.mask_bytes);
  kvc_hist_t hh;
  ASSERT_OK(kvc_history(h, NULL, batch_at(pos), NSEQ, &hh, NULL, 0));
  ASSERT_MEM_EQ(mask, (char *)base + hh.mask_off, hh.mask_bytes);
  /* Entry j of span s, layer L: gathered K at [L][entry][head][dim]. */
  size_t row = 2 * 32 * 4;
  for (uint64_t s = 0; s < NSEQ; s++)
    for (uint32_t layer = 0; layer < 2; layer++)
      for (uint64_t j = 0; j < spans[s].n; j++) {
        uint64_t entry = spans[s].first + j, p = spans[s].pos + j;
        const void *k = kvc_lease_k(leases[s], layer, p), *v = kvc_lease_v(leases[s], layer, p);
        ASSERT(k && v);
        ASSERT_MEM_EQ(k, (char *)base + hh.k_off + (layer * hh.entries + entry) * row, row);
        ASSERT_MEM_EQ(v, (char *)base + hh.v_off + (layer * hh.entries + entry) * row, row);
      }
  for (int s = 0; s < NSEQ; s++) ASSERT_OK(kvc_lease_release_later(leases[s]));
  ASSERT_OK(kvc_ping(c)); /* carries the releases */
  ASSERT_U64_EQ(stat_get(c, "leases", NULL), 0);
  /* Without the mask: the spans and the leases alone; the new token is read
   * in place. */
  step_entries(c, h, pos + 1, e);
  st.no_mask = true;
  ASSERT_OK(kvc_step(h, NULL, e, NSEQ, &st));
  ASSERT_U64_EQ(st.hist.mask_bytes, 0);
  ASSERT_U64_EQ(spans[3].n, pos + 2);
  float want[128], wantv[128];
  it_fill_f32(want, wantv, &l, 4, pos + 1, 1, 3);
  ASSERT_MEM_EQ(kvc_lease_k(leases[3], 0, pos + 1), want, row);
  for (int s = 0; s < NSEQ; s++) ASSERT_OK(kvc_lease_release(leases[s]));
  kvc_step_t bad = {.view = KVC_VIEW_GATHER, .no_mask = true, .out_off = out,
                    .out_len = bytes - out};
  ASSERT_ERR(kvc_step(h, NULL, e, NSEQ, &bad), KVC_E_INVAL);
  free(mask);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* Every sequence's length and bytes, as prefill and n steps left them. */
static void expect_unchanged(kvc_cache_t *h, uint64_t len) {
  kvc_layout_t l = lay();
  size_t nk = it_tok_floats(&l, false) * len, nv = it_tok_floats(&l, true) * len;
  float *k = malloc(nk * 4), *v = malloc(nv * 4), *wk = malloc(nk * 4), *wv = malloc(nv * 4);
  for (uint64_t s = 1; s <= NSEQ; s++) {
    kvc_seq_info_t si;
    ASSERT_OK(kvc_seq_info(h, s, &si));
    ASSERT_U64_EQ(si.length, len);
    ASSERT_OK(kvc_get(h, s, 0, len, k, v));
    it_fill_f32(wk, wv, &l, s, 0, len, 3);
    ASSERT_MEM_EQ(k, wk, nk * 4);
    ASSERT_MEM_EQ(v, wv, nv * 4);
  }
  free(k), free(v), free(wk), free(wv);
}

/* Refusals change nothing: a view that does not fit its region, a pool
 * without room, bad input. */
TEST(step_refused_changes_nothing) {
  static const char *const args[] = {"--pin-limit-pct", "100", "--tenant-max-pinned-pct", "100",
                                     "--tenant-max-pages-pct", "100", NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  kvc_client_t *c = client_open(&d);
  kvc_layout_t l = lay();
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "step", &l, &h));
  prefill(h);
  void *base;
  uint64_t bytes;
  kvc_client_shm(c, &base, &bytes);
  uint64_t out = bytes / 2;
  kvc_shm_io_t e[NSEQ];
  step_entries(c, h, PREFIX, e);
  kvc_step_t st = {.view = KVC_VIEW_GATHER, .out_off = out, .out_len = 4096};
  ASSERT_ERR(kvc_step(h, NULL, e, NSEQ, &st), KVC_E_SIZE);
  expect_unchanged(h, PREFIX);
  st.out_len = bytes; /* past the end of the buffer */
  ASSERT_ERR(kvc_step(h, NULL, e, NSEQ, &st), KVC_E_OFFSET);
  st = (kvc_step_t){.view = (kvc_view_t)7};
  ASSERT_ERR(kvc_step(h, NULL, e, NSEQ, &st), KVC_E_INVAL);
  kvc_shm_io_t dup[2] = {e[0], e[0]};
  st = (kvc_step_t){.view = KVC_VIEW_GATHER, .out_off = out, .out_len = bytes - out};
  ASSERT_ERR(kvc_step(h, NULL, dup, 2, &st), KVC_E_DUPSEQ);
  kvc_shm_io_t gap = e[1];
  gap.pos = PREFIX + 1; /* past the length */
  ASSERT_ERR(kvc_step(h, NULL, &gap, 1, &st), KVC_E_RANGE);
  expect_unchanged(h, PREFIX);
  /* Each sequence to a page boundary (48 = 3 pages of 16), so that the next
   * token needs a new page; then the pool full of pinned sequences of
   * another cache: the step is FULL and changes nothing. */
  size_t nk = it_tok_floats(&l, false) * 8, nv = it_tok_floats(&l, true) * 8;
  float *k = malloc(nk * 4), *v = malloc(nv * 4);
  for (uint64_t s = 1; s <= NSEQ; s++) {
    it_fill_f32(k, v, &l, s, PREFIX, 8, 3);
    ASSERT_OK(kvc_put(h, s, PREFIX, 8, k, v));
  }
  for (uint64_t s = 1; s <= NSEQ; s++) ASSERT_OK(kvc_seq_pin(h, s)); /* not evicted */
  kvc_cache_t *o;
  ASSERT_OK(kvc_cache_open(c, "other", &l, &o));
  int rc = 0;
  for (uint64_t s = 100; rc == 0; s++) {
    rc = kvc_put(o, s, 0, 8, k, v);
    if (rc == 0) ASSERT_OK(kvc_seq_pin(o, s));
  }
  ASSERT_ERR(rc, KVC_E_FULL);
  free(k), free(v);
  step_entries(c, h, PREFIX + 8, e);
  st = (kvc_step_t){.view = KVC_VIEW_GATHER, .out_off = out, .out_len = bytes - out};
  ASSERT_ERR(kvc_step(h, NULL, e, NSEQ, &st), KVC_E_FULL);
  expect_unchanged(h, PREFIX + 8);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* A batched lease: every range in one round trip, the bytes those of a get;
 * one bad range refuses the batch and leaves nothing held. */
TEST(lease_batch_all_or_nothing) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  kvc_layout_t l = lay();
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "lb", &l, &h));
  prefill(h);
  kvc_lease_range_t r[NSEQ];
  kvc_lease_t *out[NSEQ];
  for (uint64_t s = 1; s <= NSEQ; s++) r[s - 1] = (kvc_lease_range_t){s, s, PREFIX - s};
  uint64_t before = stat_get(c, "requests_total{op=lease_batch}", NULL);
  ASSERT_OK(kvc_lease_batch(h, r, NSEQ, out));
  ASSERT_U64_EQ(stat_get(c, "requests_total{op=lease_batch}", NULL) - before, 1);
  ASSERT_U64_EQ(stat_get(c, "leases", NULL), NSEQ);
  size_t row = 2 * 32 * 4;
  float k[128], v[128];
  for (uint64_t s = 1; s <= NSEQ; s++)
    for (uint64_t p = s; p < PREFIX - s; p++) {
      ASSERT_OK(kvc_get(h, s, p, p + 1, k, v)); /* layer 0 first in the buffer */
      ASSERT_MEM_EQ(kvc_lease_k(out[s - 1], 0, p), k, row);
      ASSERT_MEM_EQ(kvc_lease_v(out[s - 1], 0, p), v, row);
    }
  for (int i = 0; i < NSEQ; i++) ASSERT_OK(kvc_lease_release(out[i]));
  ASSERT_U64_EQ(stat_get(c, "leases", NULL), 0);
  r[2].seq_id = 77; /* no such sequence */
  ASSERT_ERR(kvc_lease_batch(h, r, NSEQ, out), KVC_E_NOSEQ);
  ASSERT(strstr(kvc_client_last_error(c), "range 2") != NULL);
  for (int i = 0; i < NSEQ; i++) ASSERT(out[i] == NULL);
  ASSERT_U64_EQ(stat_get(c, "leases", NULL), 0);
  r[2].seq_id = 3;
  r[2].end = PREFIX + 5; /* past the length */
  ASSERT_ERR(kvc_lease_batch(h, r, NSEQ, out), KVC_E_RANGE);
  ASSERT_U64_EQ(stat_get(c, "leases", NULL), 0);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* A lease view past the tenant's pinned-plus-leased quota is refused before
 * the write: nothing written, nothing leased. */
TEST(step_lease_view_over_quota_changes_nothing) {
  static const char *const args[] = {"--tenant-max-pinned-pct", "1", NULL}; /* 5 of 512 pages */
  daemon_t d;
  daemon_start_args(&d, args);
  kvc_client_t *c = client_open(&d);
  kvc_layout_t l = lay();
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "step", &l, &h));
  prefill(h); /* 3 pages a sequence */
  void *base;
  uint64_t bytes;
  kvc_client_shm(c, &base, &bytes);
  kvc_shm_io_t e[NSEQ];
  step_entries(c, h, PREFIX, e);
  kvc_lease_t *leases[NSEQ];
  kvc_step_t st = {.view = KVC_VIEW_LEASE, .out_off = bytes / 2, .out_len = bytes / 2,
                   .leases = leases, .leases_cap = NSEQ};
  ASSERT_ERR(kvc_step(h, NULL, e, NSEQ, &st), KVC_E_QUOTA_PINS);
  ASSERT(strstr(kvc_client_last_error(c), "nothing was written") != NULL);
  ASSERT_U64_EQ(stat_get(c, "leases", NULL), 0);
  expect_unchanged(h, PREFIX);
  kvc_client_close(c);
  daemon_stop(&d);
}
