/* hard_ranges.c: numbers near UINT64_MAX (and UINT32_MAX) in every position,
 * offset, length, id and range of every request: each gets its documented
 * error, the engine audit passes after each (the daemon runs with
 * KVCACHED_TEST_AUDIT), and the one real sequence reads back unchanged. */
#include "hard.h"

#define TOK 512u /* K (and V) bytes of one token of it_layout(F32) */

static int fd;
static uint64_t next_id = 10;
static uint32_t cache;

/* Sends req and returns the reply's status; checks the echoed id. */
static int status_of(Kvcache__V1__Request *req) {
  req->id = next_id++;
  raw_send_request(fd, req);
  Kvcache__V1__Response *r = raw_reply(fd);
  ASSERT(r != NULL);
  ASSERT_U64_EQ(r->id, req->id);
  int st = (int)r->status;
  if (st) ASSERT(r->error && r->error[0]);
  kvcache__v1__response__free_unpacked(r, NULL);
  return st;
}

#define EXPECT_STATUS(req, want, what)                                         \
  do {                                                                         \
    int st_ = status_of(req);                                                  \
    if (st_ != (want))                                                         \
      TEST_FAIL_("%s: expected %s, got %s", what, kvc_err_name(-(want)), kvc_err_name(-st_)); \
  } while (0)

/* An Io of one entry: seq 1, tokens [0, 1), K at 0, V at 512 KiB. */
typedef struct io1 {
  Kvcache__V1__Request req;
  Kvcache__V1__Io io;
  Kvcache__V1__Xfer x;
  Kvcache__V1__IoEntry e, *pe;
} io1_t;

static void io1_init(io1_t *t, bool put) {
  Kvcache__V1__Request r = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__Io io = KVCACHE__V1__IO__INIT;
  Kvcache__V1__Xfer x = KVCACHE__V1__XFER__INIT;
  Kvcache__V1__IoEntry e = KVCACHE__V1__IO_ENTRY__INIT;
  t->req = r, t->io = io, t->x = x, t->e = e;
  t->e.seq_id = 1, t->e.ntokens = 1;
  t->e.k_len = TOK, t->e.v_off = 1u << 19, t->e.v_len = TOK;
  t->pe = &t->e;
  t->io.cache_id = cache, t->io.n_entries = 1, t->io.entries = &t->pe, t->io.xfer = &t->x;
  t->req.body_case = put ? KVCACHE__V1__REQUEST__BODY_PUT : KVCACHE__V1__REQUEST__BODY_GET;
  if (put) t->req.put = &t->io;
  else t->req.get = &t->io;
}

static const uint64_t huge[] = {UINT64_MAX, UINT64_MAX - 1, UINT64_MAX - TOK + 1,
                                1ull << 63, (1ull << 32) + 1};
#define NHUGE (sizeof huge / sizeof huge[0])

static void io_fields(bool put) {
  const char *op = put ? "put" : "get";
  char what[128];
  for (size_t i = 0; i < NHUGE; i++) {
    uint64_t v = huge[i];
    io1_t t;
#define FIELD(field, want)                                                     \
  io1_init(&t, put);                                                           \
  t.e.field = v;                                                               \
  snprintf(what, sizeof what, "%s " #field " = %llu", op, (unsigned long long)v); \
  EXPECT_STATUS(&t.req, want, what);
    /* A put of a sequence id that is new starts it (any u64 is an id); a
     * get of it finds none. seq_requests() removes them. */
    FIELD(seq_id, put ? KVCACHE__V1__STATUS__OK : KVCACHE__V1__STATUS__NOSEQ);
    FIELD(pos, v > UINT64_MAX - 1 ? KVCACHE__V1__STATUS__OVERFLOW /* pos + 1 */
                                  : KVCACHE__V1__STATUS__RANGE);
    FIELD(ntokens, KVCACHE__V1__STATUS__OVERFLOW * (v > UINT64_MAX / TOK) +
                       KVCACHE__V1__STATUS__SIZE * (v <= UINT64_MAX / TOK));
    FIELD(k_off, KVCACHE__V1__STATUS__OFFSET);
    FIELD(v_off, KVCACHE__V1__STATUS__OFFSET);
    FIELD(k_len, KVCACHE__V1__STATUS__SIZE);
    FIELD(v_len, KVCACHE__V1__STATUS__SIZE);
    FIELD(ks_off, KVCACHE__V1__STATUS__OFFSET);
    FIELD(vs_off, KVCACHE__V1__STATUS__OFFSET);
    FIELD(ks_len, KVCACHE__V1__STATUS__SIZE);
    FIELD(vs_len, KVCACHE__V1__STATUS__SIZE);
#undef FIELD
    uint32_t v32 = (uint32_t)(v >> 32) ? UINT32_MAX : (uint32_t)v;
#define XFIELD(field, want)                                                    \
  io1_init(&t, put);                                                           \
  t.x.field = v32;                                                             \
  snprintf(what, sizeof what, "%s xfer." #field " = %u", op, v32);             \
  EXPECT_STATUS(&t.req, want, what);
    XFIELD(layer_begin, KVCACHE__V1__STATUS__LAYER);
    XFIELD(layer_end, KVCACHE__V1__STATUS__LAYER);
    XFIELD(head_begin, KVCACHE__V1__STATUS__HEAD);
    XFIELD(head_end, KVCACHE__V1__STATUS__HEAD);
    XFIELD(dtype, KVCACHE__V1__STATUS__DTYPE);
#undef XFIELD
    io1_init(&t, put);
    t.io.cache_id = (uint32_t)v == cache ? cache + 7 : (uint32_t)v;
    snprintf(what, sizeof what, "%s cache_id = %u", op, t.io.cache_id);
    EXPECT_STATUS(&t.req, KVCACHE__V1__STATUS__NOCACHE, what);
  }
  /* The last token's worth at the very end of the buffer is fine; one byte
   * further is not. */
  io1_t t;
  io1_init(&t, put);
  t.e.k_off = (1u << 20) - TOK;
  EXPECT_STATUS(&t.req, KVCACHE__V1__STATUS__OK, "k at the end of the buffer");
  t.e.k_off++;
  EXPECT_STATUS(&t.req, KVCACHE__V1__STATUS__OFFSET, "k one byte past the end");
}

static void seq_requests(void) {
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__Remove rm = KVCACHE__V1__REMOVE__INIT;
  Kvcache__V1__CopyPrefix cp = KVCACHE__V1__COPY_PREFIX__INIT;
  Kvcache__V1__SeqPos sp = KVCACHE__V1__SEQ_POS__INIT;
  Kvcache__V1__SeqRef sr = KVCACHE__V1__SEQ_REF__INIT;
  Kvcache__V1__SeqList sl = KVCACHE__V1__SEQ_LIST__INIT;
  rm.cache_id = cp.cache_id = sp.cache_id = sr.cache_id = sl.cache_id = cache;
  char what[128];
  for (size_t i = 0; i < NHUGE; i++) {
    uint64_t v = huge[i];
    req.body_case = KVCACHE__V1__REQUEST__BODY_REMOVE, req.remove = &rm;
    rm.seq_id = 1, rm.begin = v, rm.end = v;
    snprintf(what, sizeof what, "remove [%llu, %llu)", (unsigned long long)v, (unsigned long long)v);
    EXPECT_STATUS(&req, KVCACHE__V1__STATUS__OK, what); /* empty, past the end: nothing */
    rm.begin = v, rm.end = 3;
    EXPECT_STATUS(&req, KVCACHE__V1__STATUS__RANGE, "remove with begin > end");
    rm.seq_id = v, rm.begin = 0, rm.end = v;
    EXPECT_STATUS(&req, KVCACHE__V1__STATUS__OK, "remove of the sequence a put of id v made");
    EXPECT_STATUS(&req, KVCACHE__V1__STATUS__NOSEQ, "remove of an unknown sequence");

    req.body_case = KVCACHE__V1__REQUEST__BODY_COPY_PREFIX, req.copy_prefix = &cp;
    cp.src = 1, cp.dst = 2, cp.ntokens = v;
    snprintf(what, sizeof what, "copy_prefix of %llu tokens", (unsigned long long)v);
    EXPECT_STATUS(&req, KVCACHE__V1__STATUS__RANGE, what);
    cp.src = v, cp.dst = 2, cp.ntokens = 1;
    EXPECT_STATUS(&req, KVCACHE__V1__STATUS__NOSEQ, "copy_prefix from an unknown sequence");
    cp.src = 1, cp.dst = 1, cp.ntokens = v;
    EXPECT_STATUS(&req, KVCACHE__V1__STATUS__SAMESEQ, "copy_prefix onto itself");

    req.body_case = KVCACHE__V1__REQUEST__BODY_TRIM_FRONT, req.trim_front = &sp;
    sp.seq_id = 1, sp.pos = v;
    EXPECT_STATUS(&req, KVCACHE__V1__STATUS__RANGE, "trim_front past the length");
    req.body_case = KVCACHE__V1__REQUEST__BODY_CAN_RESUME, req.can_resume = &sp;
    EXPECT_STATUS(&req, KVCACHE__V1__STATUS__OK, "can_resume far past the length");
    sp.seq_id = v;
    EXPECT_STATUS(&req, KVCACHE__V1__STATUS__OK, "can_resume of an unknown sequence");

    req.body_case = KVCACHE__V1__REQUEST__BODY_PIN, req.pin = &sr;
    sr.seq_id = v;
    EXPECT_STATUS(&req, KVCACHE__V1__STATUS__NOSEQ, "pin of an unknown sequence");
    req.body_case = KVCACHE__V1__REQUEST__BODY_UNPIN, req.unpin = &sr;
    EXPECT_STATUS(&req, KVCACHE__V1__STATUS__NOSEQ, "unpin of an unknown sequence");
    req.body_case = KVCACHE__V1__REQUEST__BODY_SEQ_INFO, req.seq_info = &sr;
    EXPECT_STATUS(&req, KVCACHE__V1__STATUS__NOSEQ, "seq_info of an unknown sequence");

    req.body_case = KVCACHE__V1__REQUEST__BODY_SEQ_LIST, req.seq_list = &sl;
    sl.cursor = v, sl.max = UINT32_MAX;
    EXPECT_STATUS(&req, KVCACHE__V1__STATUS__OK, "seq_list from a huge cursor");

    /* Every request naming a cache that does not exist. */
    uint32_t bad = (uint32_t)v == cache ? cache + 1 : (uint32_t)v;
    rm.cache_id = cp.cache_id = sp.cache_id = sr.cache_id = sl.cache_id = bad;
    Kvcache__V1__CacheRef cr = KVCACHE__V1__CACHE_REF__INIT;
    cr.cache_id = bad;
    Kvcache__V1__Request each[] = {KVCACHE__V1__REQUEST__INIT, KVCACHE__V1__REQUEST__INIT,
                                   KVCACHE__V1__REQUEST__INIT, KVCACHE__V1__REQUEST__INIT,
                                   KVCACHE__V1__REQUEST__INIT, KVCACHE__V1__REQUEST__INIT,
                                   KVCACHE__V1__REQUEST__INIT, KVCACHE__V1__REQUEST__INIT};
    each[0].body_case = KVCACHE__V1__REQUEST__BODY_REMOVE, each[0].remove = &rm;
    each[1].body_case = KVCACHE__V1__REQUEST__BODY_COPY_PREFIX, each[1].copy_prefix = &cp;
    each[2].body_case = KVCACHE__V1__REQUEST__BODY_TRIM_FRONT, each[2].trim_front = &sp;
    each[3].body_case = KVCACHE__V1__REQUEST__BODY_PIN, each[3].pin = &sr;
    each[4].body_case = KVCACHE__V1__REQUEST__BODY_SEQ_INFO, each[4].seq_info = &sr;
    each[5].body_case = KVCACHE__V1__REQUEST__BODY_SEQ_LIST, each[5].seq_list = &sl;
    each[6].body_case = KVCACHE__V1__REQUEST__BODY_CACHE_CLEAR, each[6].cache_clear = &cr;
    each[7].body_case = KVCACHE__V1__REQUEST__BODY_CACHE_DROP, each[7].cache_drop = &cr;
    for (size_t k = 0; k < 8; k++) {
      snprintf(what, sizeof what, "request %zu on cache %u", k, bad);
      EXPECT_STATUS(&each[k], KVCACHE__V1__STATUS__NOCACHE, what);
    }
    rm.cache_id = cp.cache_id = sp.cache_id = sr.cache_id = sl.cache_id = cache;
  }
  /* copy_prefix longer than its source, and of exactly its length. */
  req.body_case = KVCACHE__V1__REQUEST__BODY_COPY_PREFIX, req.copy_prefix = &cp;
  cp.src = 1, cp.dst = 2, cp.ntokens = 17;
  EXPECT_STATUS(&req, KVCACHE__V1__STATUS__RANGE, "copy_prefix longer than the source");
  cp.ntokens = 16;
  EXPECT_STATUS(&req, KVCACHE__V1__STATUS__OK, "copy_prefix of the whole source");
}

TEST(hard_ranges_near_uint64_max_each_get_their_error) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "ranges", &l, &h));
  cache = kvc_cache_id(h);
  size_t kn = it_tok_floats(&l, false) * 16, vn = it_tok_floats(&l, true) * 16;
  ASSERT_EQ(it_tok_floats(&l, false) * 4, TOK);
  float *k = malloc(kn * 4), *v = malloc(vn * 4), *gk = malloc(kn * 4), *gv = malloc(vn * 4);
  it_fill_f32(k, v, &l, 1, 0, 16, 0);
  ASSERT_OK(kvc_put(h, 1, 0, 16, k, v));
  fd = hard_greeted(&d);
  io_fields(false);
  io_fields(true);
  seq_requests();
  uint64_t errors = stat_get(c, "request_errors_total{op=get}", NULL) + stat_get(c, "request_errors_total{op=put}", NULL);
  fprintf(stderr, "%llu requests sent, %llu put/get errors\n",
          (unsigned long long)(next_id - 10), (unsigned long long)errors);
  ASSERT_U64_EQ(stat_get(c, "sequences", NULL), 2); /* 1 and its copy 2 */
  ASSERT_U64_EQ(stat_get(c, "connections_dropped_total", NULL), 0);
  /* seq 1 reads back as written: the valid puts of its token 0 wrote what
   * the gets before them had read into the same place of the buffer. */
  ASSERT_OK(kvc_get(h, 1, 0, 16, gk, gv));
  ASSERT_MEM_EQ(gk, k, kn * 4);
  ASSERT_MEM_EQ(gv, v, vn * 4);
  close(fd);
  free(k), free(v), free(gk), free(gv);
  kvc_client_close(c);
  daemon_stop(&d);
}
