/* fuzz_fast.c: one fast request (proto/ringfast.h) against the fixed state,
 * and the Request it stands for against the same state on a fresh server.
 *
 * The input is the slot's body (zero-padded or cut to RING_FAST_BODY bytes),
 * run on a greeted connection holding fuzz_msg's state (fz_seed_state).
 * Checks:
 * - a body ringfast_req_decode refuses closes the connection, unanswered;
 *   any other is answered once, through the fast reply (written into a slot
 *   and read back as the client reads it: fake_conn.c);
 * - a failed request changed no gauge of the engine and no byte of the
 *   pool; the engine audit passes;
 * - the same request as a frame (an Io of one entry with the transfer's own
 *   K and V lengths, or a Lease, with the release riding on it) gets the
 *   same status, message, engine figures, pool bytes and lease: the fast
 *   frame is only an encoding.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_daemon.h"
#include "fuzz_seed.h"
#include "layout.h"

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "fast invariant failed: %s\n", #cond);                   \
      abort();                                                                 \
    }                                                                          \
  } while (0)

typedef struct outcome {
  bool closed;
  uint64_t replies, fast_replies;
  int status;
  char error[256];
  uint64_t lease_id;
  uint32_t npages;
  uint64_t pages[8];
  engine_stats_t stats;
  uint8_t *pool;  /* the pool's bytes after (malloc'd) */
} outcome_t;

/* The gauges a failed request must leave alone (as fuzz_msg). */
static void gauges(server_t *srv, engine_stats_t *s) {
  engine_stats(srv->eng, s);
  s->puts = s->put_tokens = s->gets = s->get_tokens = s->removes = s->copies = 0;
  s->trims = s->pins = s->unpins = s->bytes_in = s->bytes_out = s->cow_copies = 0;
  s->full_errors = s->errors = 0;
}

/* The frame a fast request stands for, packed into out. */
static size_t twin(server_t *srv, const ringfast_req_t *q, uint64_t id, uint8_t *out) {
  Kvcache__V1__Request r = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__Io io = KVCACHE__V1__IO__INIT;
  Kvcache__V1__Xfer x = KVCACHE__V1__XFER__INIT;
  Kvcache__V1__IoEntry e = KVCACHE__V1__IO_ENTRY__INIT, *ep = &e;
  Kvcache__V1__Lease l = KVCACHE__V1__LEASE__INIT;
  uint64_t release = q->release;
  if (release) {
    r.n_release_leases = 1;
    r.release_leases = &release;
  }
  if (q->kind == RINGFAST_LEASE) {
    l.cache_id = q->cache_id;
    l.seq_id = q->seq_id;
    l.begin = q->pos;
    l.end = q->pos + q->ntokens < q->pos ? UINT64_MAX : q->pos + q->ntokens;
    r.body_case = KVCACHE__V1__REQUEST__BODY_LEASE;
    r.lease = &l;
    return seed_pack(&r, id, out);
  }
  x.layer_begin = q->layer_begin;
  x.layer_end = q->layer_end;
  x.head_begin = q->head_begin;
  x.head_end = q->head_end;
  x.dtype = (Kvcache__V1__DType)q->dtype;
  bool put = q->kind == RINGFAST_PUT;
  /* The lengths the fast request implies: the transfer's own (0 when the
   * transfer is refused: the daemon says so before it looks at them). */
  const kvc_layout_t *lay;
  kvc_xfer_t kx = {q->layer_begin, q->layer_end, q->head_begin, q->head_end,
                   (kvc_dtype_t)q->dtype, 0, 0};
  layout_xfer_t g;
  char why[128];
  uint64_t kb = 0, vb = 0, sb = 0;
  if (!engine_cache_stride(srv->eng, q->cache_id) || /* no such cache: no figure moves */
      engine_cache_layout(srv->eng, q->cache_id, &lay) != 0 ||
      layout_xfer(lay, &kx, put, &g, why, sizeof why) != 0 ||
      layout_xfer_bytes(&g, q->ntokens, &kb, &vb, &sb) != 0)
    kb = vb = 0;
  e.seq_id = q->seq_id;
  e.pos = q->pos;
  e.ntokens = q->ntokens;
  e.k_off = q->k_off;
  e.k_len = kb;
  e.v_off = q->v_off;
  e.v_len = vb;
  io.cache_id = q->cache_id;
  io.xfer = &x;
  io.n_entries = 1;
  io.entries = &ep;
  r.body_case = put ? KVCACHE__V1__REQUEST__BODY_PUT : KVCACHE__V1__REQUEST__BODY_GET;
  if (put) r.put = &io;
  else r.get = &io;
  return seed_pack(&r, id, out);
}

/* Runs the request on a fresh server holding the fixed state: the fast
 * body (q NULL) or its twin frame. */
static void run(const uint8_t *body, const ringfast_req_t *q, outcome_t *o) {
  static server_t srv;
  static uint8_t buf[FZ_MAX_FRAME];
  fz_server_init(&srv, 16, 4096);
  conn_t *c = fz_conn_open(&srv);
  fz_seed_state(c);
  fz_seen_t before = *fz_seen(c);
  engine_stats_t g0, g1;
  gauges(&srv, &g0);
  uint8_t *pool0 = malloc(srv.cfg.pool_bytes);
  memcpy(pool0, fz_pool(), srv.cfg.pool_bytes);
  if (q) fz_conn_frame(c, buf, twin(&srv, q, 7, buf));
  else fz_conn_fast(c, body, RING_FAST_BODY);
  fz_audit(&srv, "the input");
  fz_seen_t *after = fz_seen(c);
  memset(o, 0, sizeof *o);
  o->closed = c->state == CONN_CLOSED;
  o->replies = after->replies - before.replies;
  o->fast_replies = after->fast_replies - before.fast_replies;
  o->status = after->last_status;
  memcpy(o->error, after->last_error, sizeof o->error);
  o->lease_id = after->last_lease_id;
  o->npages = after->last_npages;
  memcpy(o->pages, after->last_pages, sizeof o->pages);
  engine_stats(srv.eng, &o->stats);
  if (o->replies && o->status != KVCACHE__V1__STATUS__OK) {
    gauges(&srv, &g1);
    CHECK(memcmp(&g0, &g1, sizeof g0) == 0);
    CHECK(memcmp(pool0, fz_pool(), srv.cfg.pool_bytes) == 0);
  }
  o->pool = pool0;
  memcpy(o->pool, fz_pool(), srv.cfg.pool_bytes);
  fz_conn_free(c);
  engine_stats_t s;
  engine_stats(srv.eng, &s);
  CHECK(s.pages_pinned == 0 && s.sequences_pinned == 0);
  fz_server_deinit(&srv);
  CHECK(fz_count_memfds() == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t body[RING_FAST_BODY] = {0};
  memcpy(body, data, size < sizeof body ? size : sizeof body);
  ringfast_req_t q;
  const char *why;
  bool valid = ringfast_req_decode(body, &q, &why) == 0;
  outcome_t fast, frame;
  run(body, NULL, &fast);
  if (!valid) { /* malformed: that connection closes, unanswered */
    CHECK(fast.closed && fast.replies == 0);
    free(fast.pool);
    return 0;
  }
  CHECK(!fast.closed && fast.replies == 1 && fast.fast_replies == 1);
  run(NULL, &q, &frame);
  CHECK(!frame.closed && frame.replies == 1 && frame.fast_replies == 0);
  /* A fast lease past its pages is refused before anything happens; the
   * frame has no such bound. */
  bool bounded = q.kind == RINGFAST_LEASE && fast.status == KVCACHE__V1__STATUS__TOOMANY &&
                 strstr(fast.error, "a fast lease spans at most") != NULL;
  if (!bounded) {
    CHECK(fast.status == frame.status);
    CHECK(strcmp(fast.error, frame.error) == 0);
    if (memcmp(&fast.stats, &frame.stats, sizeof fast.stats) != 0) {
#define DIFF_(name, ...)                                                         \
  if (fast.stats.name != frame.stats.name)                                     \
    fprintf(stderr, "engine figure %s: fast %llu, frame %llu\n", #name,          \
            (unsigned long long)fast.stats.name, (unsigned long long)frame.stats.name);
      ENGINE_STATS(DIFF_)
#undef DIFF_
      fprintf(stderr, "fast invariant failed: the engine's figures differ\n");
      abort();
    }
    CHECK(fast.lease_id == frame.lease_id && fast.npages == frame.npages);
    CHECK(memcmp(fast.pages, frame.pages, sizeof fast.pages) == 0);
  }
  CHECK(memcmp(fast.pool, frame.pool, 16 * 4096) == 0 || bounded);
  free(fast.pool);
  free(frame.pool);
  return 0;
}
