/* fast.c (integration): the fast slots (proto/ringfast.h; doc/protocol.md,
 * "The fast slots"): a put, get and lease written into the slot by hand
 * answer exactly as their Requests do, bad fields are answered and change
 * nothing, a malformed slot closes that one connection, leases riding and
 * released at close; and libkvcache's calls answer the same with the slots
 * and without (KVC_CLIENT_NO_FAST). */
#include "rawring.h"

#define KOFF 0u       /* the raw client's K rows in its buffer */
#define VOFF 65536u   /* its V rows */
#define GKOFF 262144u /* where a get writes them */
#define GVOFF 327680u

/* A client that uses no fast slot: the Request path, for comparisons (and
 * the figures: on the socket it adds none through the rings). */
static kvc_client_t *client_no_fast(const daemon_t *d, uint32_t flags) {
  kvc_client_opts_t o = {.socket_path = d->sock, .timeout_ms = 20000,
                         .flags = KVC_CLIENT_NO_FAST | flags};
  kvc_client_t *c = NULL;
  ASSERT_OK(kvc_client_open(&o, &c));
  return c;
}

/* K and V of tokens [pos, pos + n) of seq, every layer, into the raw
 * client's buffer at KOFF and VOFF ([layer][token] rows), and into k, v. */
static void fill_rows(rawring_t *r, const kvc_layout_t *l, uint64_t seq, uint64_t pos, uint64_t n,
                      float *k, float *v) {
  it_fill_f32(k, v, l, seq, pos, n, 7);
  size_t nk = it_tok_floats(l, false) * n, nv = it_tok_floats(l, true) * n;
  memcpy(r->shm + KOFF, k, nk * 4);
  memcpy(r->shm + VOFF, v, nv * 4);
}

TEST(fast_put_get_lease_answer_as_their_requests) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_no_fast(&d, KVC_CLIENT_NO_RINGS);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "fast", &l, &h));
  rawring_t r;
  rr_open(&r, &d);
  ASSERT_EQ(r.hdr->fast, RING_FAST_VERSION);
  uint64_t ring0 = stat_get(c, "ring_requests_total", NULL);
  size_t n = 20, nk = it_tok_floats(&l, false) * n, nv = it_tok_floats(&l, true) * n;
  float *k = malloc(nk * 4), *v = malloc(nv * 4), *gk = malloc(nk * 4), *gv = malloc(nv * 4);
  fill_rows(&r, &l, 1, 0, n, k, v);
  ringfast_rep_t rep;
  rr_fast(&r, &(ringfast_req_t){.kind = RINGFAST_PUT, .cache_id = kvc_cache_id(h), .seq_id = 1,
                                .ntokens = (uint32_t)n, .k_off = KOFF, .v_off = VOFF},
          &rep);
  ASSERT_EQ(rep.status, KVCACHE__V1__STATUS__OK);
  ASSERT_EQ(rep.npages, 0);
  /* What the fast put wrote, read through the Request path. */
  ASSERT_OK(kvc_get(h, 1, 0, n, gk, gv));
  ASSERT_MEM_EQ(gk, k, nk * 4);
  ASSERT_MEM_EQ(gv, v, nv * 4);
  /* A layer range of one token, then the fast get of it. */
  rr_fast(&r, &(ringfast_req_t){.kind = RINGFAST_GET, .cache_id = kvc_cache_id(h), .seq_id = 1,
                                .pos = 3, .ntokens = 2, .layer_begin = 1, .layer_end = 2,
                                .k_off = GKOFF, .v_off = GVOFF},
          &rep);
  ASSERT_EQ(rep.status, KVCACHE__V1__STATUS__OK);
  size_t row = it_tok_floats(&l, false) / l.num_layers; /* floats of a token of a layer */
  ASSERT_MEM_EQ(r.shm + GKOFF, k + (1 * n + 3) * row, 2 * row * 4);
  ASSERT_MEM_EQ(r.shm + GVOFF, v + (1 * n + 3) * row, 2 * row * 4);
  /* A lease over two pages: the same pages as the Request's lease. */
  rr_fast(&r, &(ringfast_req_t){.kind = RINGFAST_LEASE, .cache_id = kvc_cache_id(h),
                                .seq_id = 1, .pos = 10, .ntokens = 10},
          &rep);
  ASSERT_EQ(rep.status, KVCACHE__V1__STATUS__OK);
  ASSERT_EQ(rep.npages, 2);
  ASSERT_U64_EQ(rep.first_pos, 0);
  ASSERT(rep.lease_id != 0);
  kvc_lease_t *lease;
  ASSERT_OK(kvc_lease(h, 1, 10, 20, &lease));
  const kvc_lease_info_t *li = kvc_lease_info(lease);
  const void *pool;
  uint64_t pool_bytes;
  kvc_client_pool(c, &pool, &pool_bytes);
  ASSERT_EQ(li->npages, 2);
  for (uint32_t i = 0; i < 2; i++)
    ASSERT_U64_EQ(rep.page_off[i], (uint64_t)((const uint8_t *)li->pages[i] - (const uint8_t *)pool));
  ASSERT_U64_EQ(stat_get(c, "leases", NULL), 2);
  ASSERT_OK(kvc_lease_release(lease));
  /* Each fast request counts as one through the rings, and in its op. */
  ASSERT_U64_EQ(stat_get(c, "ring_requests_total", NULL), ring0 + 3);
  ASSERT(stat_get(c, "requests_total{op=lease}", NULL) >= 2);
  free(k), free(v), free(gk), free(gv);
  rr_close(&r);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* Bad fields get the status and message the same Request gets, and change
 * nothing: the sequence reads back as it was, no page moved. */
TEST(fast_bad_fields_answered_changing_nothing) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_no_fast(&d, KVC_CLIENT_NO_RINGS);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "bad", &l, &h));
  rawring_t r;
  rr_open(&r, &d);
  size_t n = 8, nk = it_tok_floats(&l, false) * n, nv = it_tok_floats(&l, true) * n;
  float *k = malloc(nk * 4), *v = malloc(nv * 4), *gk = malloc(nk * 4), *gv = malloc(nv * 4);
  fill_rows(&r, &l, 1, 0, n, k, v);
  ringfast_rep_t rep;
  uint32_t id = kvc_cache_id(h);
  rr_fast(&r, &(ringfast_req_t){.kind = RINGFAST_PUT, .cache_id = id, .seq_id = 1, .ntokens = 8,
                                .k_off = KOFF, .v_off = VOFF},
          &rep);
  ASSERT_EQ(rep.status, KVCACHE__V1__STATUS__OK);
  uint64_t used = stat_get(c, "pages_used", NULL);
  memset(r.shm + KOFF, 0x55, 4096); /* what a bad put would write */
  memset(r.shm + VOFF, 0x55, 4096);
  static const struct {
    ringfast_req_t q;
    Kvcache__V1__Status want;
  } bad[] = {
      {{.kind = RINGFAST_PUT, .seq_id = 1, .pos = 2, .ntokens = 2, .layer_end = 9}, KVCACHE__V1__STATUS__LAYER},
      {{.kind = RINGFAST_PUT, .seq_id = 1, .pos = 2, .ntokens = 2, .head_begin = 1, .head_end = 2},
       KVCACHE__V1__STATUS__HEAD},
      {{.kind = RINGFAST_PUT, .seq_id = 1, .pos = 2, .ntokens = 2, .dtype = 99}, KVCACHE__V1__STATUS__DTYPE},
      {{.kind = RINGFAST_PUT, .seq_id = 1, .pos = 2, .ntokens = 2, .v_off = 1ull << 40},
       KVCACHE__V1__STATUS__OFFSET},
      {{.kind = RINGFAST_PUT, .seq_id = 1, .pos = 2, .ntokens = 2, .k_off = UINT64_MAX - 8},
       KVCACHE__V1__STATUS__OFFSET},
      {{.kind = RINGFAST_PUT, .seq_id = 1, .pos = 9, .ntokens = 1, .v_off = VOFF}, KVCACHE__V1__STATUS__RANGE},
      {{.kind = RINGFAST_PUT, .seq_id = 5, .pos = 1, .ntokens = 1, .v_off = VOFF}, KVCACHE__V1__STATUS__RANGE},
      {{.kind = RINGFAST_PUT, .seq_id = 1, .pos = UINT64_MAX - 1, .ntokens = 4, .v_off = VOFF},
       KVCACHE__V1__STATUS__OVERFLOW},
      {{.kind = RINGFAST_GET, .seq_id = 2, .ntokens = 1, .v_off = VOFF}, KVCACHE__V1__STATUS__NOSEQ},
      {{.kind = RINGFAST_GET, .seq_id = 1, .pos = 6, .ntokens = 4, .v_off = VOFF}, KVCACHE__V1__STATUS__RANGE},
      {{.kind = RINGFAST_LEASE, .seq_id = 1, .pos = 4, .ntokens = 8}, KVCACHE__V1__STATUS__RANGE},
      {{.kind = RINGFAST_LEASE, .seq_id = 1, .ntokens = 200}, KVCACHE__V1__STATUS__TOOMANY},
      {{.kind = RINGFAST_LEASE, .seq_id = 1, .pos = 3}, KVCACHE__V1__STATUS__RANGE},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ringfast_req_t q = bad[i].q;
    q.cache_id = id;
    rr_fast(&r, &q, &rep);
    ASSERT_EQ(rep.status, bad[i].want);
    ASSERT(rep.err_len > 0 && strlen(rep.err) == rep.err_len);
  }
  /* Another tenant's cache, or none: NOCACHE, as the gate says it. */
  rr_fast(&r, &(ringfast_req_t){.kind = RINGFAST_GET, .cache_id = 4000, .seq_id = 1, .ntokens = 1},
          &rep);
  ASSERT_EQ(rep.status, KVCACHE__V1__STATUS__NOCACHE);
  ASSERT_STR_EQ(rep.err, "no cache with id 4000");
  /* The same layer range through the Request path: the same message. */
  kvc_xfer_t x = {.layer_end = 9};
  kvc_shm_io_t e = {.seq_id = 1, .pos = 2, .ntokens = 2};
  ASSERT_EQ(kvc_get_shm(h, &x, &e, 1), KVC_E_LAYER);
  rr_fast(&r, &(ringfast_req_t){.kind = RINGFAST_GET, .cache_id = id, .seq_id = 1, .pos = 2,
                                .ntokens = 2, .layer_end = 9},
          &rep);
  ASSERT_STR_EQ(rep.err, kvc_client_last_error(c));
  ASSERT_OK(kvc_get(h, 1, 0, n, gk, gv));
  ASSERT_MEM_EQ(gk, k, nk * 4);
  ASSERT_MEM_EQ(gv, v, nv * 4);
  ASSERT_U64_EQ(stat_get(c, "pages_used", NULL), used);
  ASSERT_U64_EQ(stat_get(c, "leases", NULL), 0);
  rr_ping(&r); /* the connection is as usable as ever */
  free(k), free(v), free(gk), free(gv);
  rr_close(&r);
  kvc_client_close(c);
  daemon_stop(&d);
}

static void set_flags(uint8_t *body) { body[2] = 1; } /* flags, at offset 6 of the slot */

/* A slot no fast request can be closes its connection (a dropped
 * connection, its lease released); the others go on. */
TEST(fast_malformed_slot_closes_that_connection_only) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_no_fast(&d, KVC_CLIENT_NO_RINGS);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "mal", &l, &h));
  uint32_t id = kvc_cache_id(h);
  static const ringfast_req_t malformed[] = {
      {.kind = 0},
      {.kind = 4, .seq_id = 1, .ntokens = 1},
      {.kind = RINGFAST_LEASE, .seq_id = 1, .ntokens = 1, .v_off = 64},
      {.kind = RINGFAST_LEASE, .seq_id = 1, .ntokens = 1, .layer_end = 1},
      {.kind = RINGFAST_PUT, .seq_id = 1, .ntokens = 1}, /* with flags set */
  };
  rawring_t keep;
  rr_open(&keep, &d);
  for (size_t i = 0; i < sizeof malformed / sizeof malformed[0]; i++) {
    rawring_t r;
    rr_open(&r, &d);
    size_t n = 4, nk = it_tok_floats(&l, false) * n, nv = it_tok_floats(&l, true) * n;
    float *k = malloc(nk * 4), *v = malloc(nv * 4);
    fill_rows(&r, &l, 1, 0, n, k, v);
    ringfast_rep_t rep;
    rr_fast(&r, &(ringfast_req_t){.kind = RINGFAST_PUT, .cache_id = id, .seq_id = 1, .ntokens = 4,
                                  .k_off = KOFF, .v_off = VOFF},
            &rep);
    ASSERT_EQ(rep.status, KVCACHE__V1__STATUS__OK);
    rr_fast(&r, &(ringfast_req_t){.kind = RINGFAST_LEASE, .cache_id = id, .seq_id = 1, .ntokens = 4},
            &rep);
    ASSERT_EQ(rep.status, KVCACHE__V1__STATUS__OK);
    uint64_t dropped = stat_get(c, "connections_dropped_total", NULL);
    ringfast_req_t q = malformed[i];
    q.cache_id = id;
    rr_fast_submit(&r, &q, 1000, i == 4 ? set_flags : NULL);
    ASSERT(!rr_fast_reply(&r, 1000, &rep)); /* closed, unanswered */
    ASSERT(raw_closed(r.fd));
    ASSERT_U64_EQ(stat_get(c, "connections_dropped_total", NULL), dropped + 1);
    (void)it_wait_stat(c, "leases", 0, true);
    ASSERT_U64_EQ(stat_get(c, "leases", NULL), 0);
    free(k), free(v);
    rr_close(&r);
    rr_fast(&keep, &(ringfast_req_t){.kind = RINGFAST_GET, .cache_id = id, .seq_id = 1,
                                     .ntokens = 4, .k_off = KOFF, .v_off = VOFF},
            &rep);
    ASSERT_EQ(rep.status, KVCACHE__V1__STATUS__OK);
  }
  rr_close(&keep);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* A release riding on a fast request releases before it runs; what the
 * connection holds goes when it closes. */
TEST(fast_lease_release_rides_and_leases_end_at_close) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_no_fast(&d, KVC_CLIENT_NO_RINGS);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "ride", &l, &h));
  uint32_t id = kvc_cache_id(h);
  rawring_t r;
  rr_open(&r, &d);
  size_t n = 40, nk = it_tok_floats(&l, false) * n, nv = it_tok_floats(&l, true) * n;
  float *k = malloc(nk * 4), *v = malloc(nv * 4);
  fill_rows(&r, &l, 1, 0, n, k, v);
  ringfast_rep_t rep;
  rr_fast(&r, &(ringfast_req_t){.kind = RINGFAST_PUT, .cache_id = id, .seq_id = 1, .ntokens = 40,
                                .k_off = KOFF, .v_off = VOFF},
          &rep);
  ASSERT_EQ(rep.status, KVCACHE__V1__STATUS__OK);
  uint64_t held = 0;
  for (uint64_t pos = 0; pos < 40; pos++) {
    rr_fast(&r, &(ringfast_req_t){.kind = RINGFAST_LEASE, .cache_id = id, .seq_id = 1,
                                  .pos = pos, .ntokens = 1, .release = held},
            &rep);
    ASSERT_EQ(rep.status, KVCACHE__V1__STATUS__OK);
    ASSERT_EQ(rep.npages, 1);
    ASSERT_U64_EQ(rep.first_pos, pos / 16 * 16);
    held = rep.lease_id;
    ASSERT_U64_EQ(stat_get(c, "leases", NULL), 1);
  }
  /* An id it does not hold is ignored, as in release_leases. */
  rr_fast(&r, &(ringfast_req_t){.kind = RINGFAST_LEASE, .cache_id = id, .seq_id = 1, .ntokens = 1,
                                .release = held + 1000},
          &rep);
  ASSERT_EQ(rep.status, KVCACHE__V1__STATUS__OK);
  ASSERT_U64_EQ(stat_get(c, "leases", NULL), 2);
  rr_close(&r);
  (void)it_wait_stat(c, "leases", 0, true);
  ASSERT_U64_EQ(stat_get(c, "leases", NULL), 0);
  free(k), free(v);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* libkvcache's puts, gets and leases answer the same with the fast slots as
 * without, good and bad alike: codes, messages, bytes. */
TEST(fast_library_calls_answer_as_without_the_slots) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *fast = client_open(&d), *slow = client_no_fast(&d, 0);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *hf, *hs;
  ASSERT_OK(kvc_cache_open(fast, "same", &l, &hf));
  ASSERT_OK(kvc_cache_open(slow, "same", &l, &hs));
  void *bf, *bs;
  uint64_t capf, caps;
  kvc_client_shm(fast, &bf, &capf);
  kvc_client_shm(slow, &bs, &caps);
  ASSERT_U64_EQ(capf, caps);
  size_t n = 24, nk = it_tok_floats(&l, false) * n, nv = it_tok_floats(&l, true) * n;
  float *k = malloc(nk * 4), *v = malloc(nv * 4);
  it_fill_f32(k, v, &l, 3, 0, n, 1);
  memcpy(bf, k, nk * 4);
  memcpy((uint8_t *)bf + 65536, v, nv * 4);
  memcpy(bs, k, nk * 4);
  memcpy((uint8_t *)bs + 65536, v, nv * 4);
  uint64_t ring0 = stat_get(slow, "ring_requests_total", NULL);
  static const struct {
    bool put;
    kvc_xfer_t x;
    kvc_shm_io_t e;
  } calls[] = {
      {true, {0}, {.seq_id = 10, .ntokens = 24, .v_off = 65536}},
      {true, {0}, {.seq_id = 11, .ntokens = 24, .v_off = 65536}},
      {false, {0}, {.seq_id = 10, .pos = 4, .ntokens = 8, .k_off = 131072, .v_off = 196608}},
      {false, {.layer_begin = 1, .layer_end = 2}, {.seq_id = 10, .pos = 1, .ntokens = 3, .k_off = 131072, .v_off = 196608}},
      {false, {.head_begin = 1, .head_end = 2}, {.seq_id = 10, .ntokens = 2, .k_off = 131072, .v_off = 196608}},
      {false, {.dtype = KVC_DTYPE_BF16}, {.seq_id = 10, .ntokens = 2, .k_off = 131072, .v_off = 196608}},
      {true, {.layer_begin = 0, .layer_end = 1}, {.seq_id = 10, .pos = 24, .ntokens = 1, .v_off = 65536}},
      {false, {.layer_end = 7}, {.seq_id = 10, .ntokens = 1}},
      {false, {0}, {.seq_id = 99, .ntokens = 1}},
      {false, {0}, {.seq_id = 10, .pos = 20, .ntokens = 8}},
      {false, {0}, {.seq_id = 10, .ntokens = 1, .k_off = 1ull << 40}},
      {true, {0}, {.seq_id = 12, .pos = 3, .ntokens = 1, .v_off = 65536}},
      {true, {.dtype = KVC_DTYPE_INT8}, {.seq_id = 10, .ntokens = 1, .v_off = 65536}},
      {true, {0}, {.seq_id = 10, .ntokens = 1, .k_len = 5, .v_off = 65536}},
  };
  for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
    const kvc_xfer_t *x = &calls[i].x;
    int rf = calls[i].put ? kvc_put_shm(hf, x, &calls[i].e, 1) : kvc_get_shm(hf, x, &calls[i].e, 1);
    int rs = calls[i].put ? kvc_put_shm(hs, x, &calls[i].e, 1) : kvc_get_shm(hs, x, &calls[i].e, 1);
    ASSERT_EQ(rf, rs);
    ASSERT_STR_EQ(kvc_client_last_error(fast), kvc_client_last_error(slow));
    if (rf == 0 && !calls[i].put) ASSERT_MEM_EQ((uint8_t *)bf + 131072, (uint8_t *)bs + 131072, 131072);
  }
  for (uint64_t b = 0; b < 30; b += 7) {
    kvc_lease_t *lf = NULL, *ls = NULL;
    int rf = kvc_lease(hf, 10, b, b + 9, &lf), rs = kvc_lease(hs, 10, b, b + 9, &ls);
    ASSERT_EQ(rf, rs);
    ASSERT_STR_EQ(kvc_client_last_error(fast), kvc_client_last_error(slow));
    if (rf) continue;
    const kvc_lease_info_t *a = kvc_lease_info(lf), *s = kvc_lease_info(ls);
    ASSERT(a->first_pos == s->first_pos && a->npages == s->npages && a->page_tokens == s->page_tokens &&
           a->layer_bytes == s->layer_bytes && a->v_offset == s->v_offset &&
           a->k_row_bytes == s->k_row_bytes && a->v_row_bytes == s->v_row_bytes);
    for (uint64_t p = b; p < b + 9 && p < 25; p++)
      ASSERT_MEM_EQ(kvc_lease_k(lf, 1, p), kvc_lease_k(ls, 1, p), a->k_row_bytes);
    ASSERT_OK(kvc_lease_release_later(lf));
    ASSERT_OK(kvc_lease_release_later(ls));
  }
  ASSERT_OK(kvc_ping(fast));
  ASSERT_OK(kvc_ping(slow));
  ASSERT_U64_EQ(stat_get(slow, "leases", NULL), 0);
  ASSERT(stat_get(slow, "ring_requests_total", NULL) > ring0);
  free(k), free(v);
  kvc_client_close(fast);
  kvc_client_close(slow);
  daemon_stop(&d);
}
