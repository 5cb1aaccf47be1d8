/* offload.c (integration): large gets copied on the thread pool
 * (offload_bytes) return the same bytes, keep a connection's replies in
 * order, and survive their client dying mid-copy. */
#include "raw.h"

#define NTOK 64 /* 4 pages; 64 tokens x 2 layers x 2 heads x 64 floats x 4 B = 64 KiB */

static const char *const offload_args[] = {"--offload-bytes", "16KiB", NULL};

static void put_seq(kvc_cache_t *h, uint64_t seq, uint64_t n, uint32_t salt) {
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  size_t nk = it_tok_floats(&l, false) * n, nv = it_tok_floats(&l, true) * n;
  float *k = malloc(nk * 4), *v = malloc(nv * 4);
  it_fill_f32(k, v, &l, seq, 0, n, salt);
  ASSERT_OK(kvc_put(h, seq, 0, n, k, v));
  free(k);
  free(v);
}

TEST(offload_large_get_returns_the_same_bytes) {
  daemon_t d;
  daemon_start_args(&d, offload_args);
  kvc_client_t *a = client_open(&d), *b = client_open(&d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(a, "off", &l, &h));
  size_t nk = it_tok_floats(&l, false) * NTOK, nv = it_tok_floats(&l, true) * NTOK;
  float *k = malloc(nk * 4), *v = malloc(nv * 4), *gk = malloc(nk * 4), *gv = malloc(nv * 4);
  for (uint64_t s = 1; s <= 3; s++) put_seq(h, s, NTOK, (uint32_t)s);
  for (int round = 0; round < 20; round++) {
    uint64_t s = 1 + (uint64_t)round % 3;
    it_fill_f32(k, v, &l, s, 0, NTOK, (uint32_t)s);
    ASSERT_OK(kvc_get(h, s, 0, NTOK, gk, gv)); /* 128 KiB: offloaded */
    ASSERT_MEM_EQ(gk, k, nk * 4);
    ASSERT_MEM_EQ(gv, v, nv * 4);
    ASSERT_OK(kvc_ping(b));
  }
  /* A small get and a failing one stay on the loop. */
  ASSERT_OK(kvc_get(h, 1, 0, 1, gk, gv));
  ASSERT_ERR(kvc_get(h, 9, 0, NTOK, gk, gv), KVC_E_NOSEQ);
  ASSERT_U64_EQ(stat_get(a, "offloaded_gets_total", NULL), 20);
  ASSERT_U64_EQ(stat_get(a, "requests_total{op=get}", NULL), 22);
  ASSERT_U64_EQ(stat_get(a, "request_errors_total{op=get}", NULL), 1);
  ASSERT_U64_EQ(stat_get(a, "leases", NULL), 0); /* the copies' references are gone */
  kvc_client_close(b);
  for (int i = 0; i < 1000 && stat_get(a, "connections_current", NULL) != 1; i++) it_sleep_ms(10);
  /* Alone, a client's gets are not offloaded (no one to stall). */
  ASSERT_OK(kvc_get(h, 2, 0, NTOK, gk, gv));
  ASSERT_U64_EQ(stat_get(a, "offloaded_gets_total", NULL), 20);
  free(k), free(v), free(gk), free(gv);
  kvc_client_close(a);
  daemon_stop(&d);
}

/* Raw requests on one connection, for pipelining. */
static void raw_io(int fd, uint64_t id, bool put, uint32_t cache, uint64_t seq,
                   uint64_t ntok) {
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__Io io = KVCACHE__V1__IO__INIT;
  Kvcache__V1__IoEntry e = KVCACHE__V1__IO_ENTRY__INIT, *ep = &e;
  uint64_t half = ntok * 2 * 2 * 32 * 4;
  e.seq_id = seq;
  e.ntokens = ntok;
  e.k_off = 0;
  e.k_len = half;
  e.v_off = half;
  e.v_len = half;
  io.cache_id = cache;
  io.n_entries = 1;
  io.entries = &ep;
  req.id = id;
  if (put) {
    req.body_case = KVCACHE__V1__REQUEST__BODY_PUT;
    req.put = &io;
  } else {
    req.body_case = KVCACHE__V1__REQUEST__BODY_GET;
    req.get = &io;
  }
  raw_send_request(fd, &req);
}

static void raw_ping(int fd, uint64_t id) {
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__Ping p = KVCACHE__V1__PING__INIT;
  req.id = id;
  req.body_case = KVCACHE__V1__REQUEST__BODY_PING;
  req.ping = &p;
  raw_send_request(fd, &req);
}

static void expect_reply(int fd, uint64_t id) {
  Kvcache__V1__Response *r = raw_reply(fd);
  ASSERT(r != NULL);
  ASSERT_U64_EQ(r->id, id);
  ASSERT_EQ(r->status, KVCACHE__V1__STATUS__OK);
  kvcache__v1__response__free_unpacked(r, NULL);
}

TEST(offload_pipelined_replies_stay_in_order) {
  daemon_t d;
  daemon_start_args(&d, offload_args);
  kvc_client_t *other = client_open(&d); /* so that gets are offloaded */
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(other, "off", &l, &h));
  int fd = it_connect_raw(d.sock);
  raw_hello(fd, KVC_PROTOCOL_VERSION);
  expect_reply(fd, 1);
  raw_io(fd, 2, true, kvc_cache_id(h), 1, NTOK); /* the buffer's zeros */
  expect_reply(fd, 2);
  /* get, ping, get, ping, ... in one go: each ping waits for its get. */
  for (uint64_t i = 0; i < 20; i++) {
    if (i % 2) raw_ping(fd, 10 + i);
    else raw_io(fd, 10 + i, false, kvc_cache_id(h), 1, NTOK);
  }
  for (uint64_t i = 0; i < 20; i++) expect_reply(fd, 10 + i);
  ASSERT_U64_EQ(stat_get(other, "offloaded_gets_total", NULL), 10);
  close(fd);
  kvc_client_close(other);
  daemon_stop(&d);
}

TEST(offload_client_killed_mid_copy) {
  daemon_t d;
  daemon_start_args(&d, offload_args);
  kvc_client_t *c = client_open(&d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "off", &l, &h));
  put_seq(h, 1, NTOK, 1);
  uint64_t used = stat_get(c, "pages_used", NULL);
  for (int round = 0; round < 5; round++) {
    fflush(NULL);
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
      /* Pipelines gets without reading replies, then dies. */
      int fd = it_connect_raw(d.sock);
      raw_hello(fd, KVC_PROTOCOL_VERSION);
      Kvcache__V1__Response *r = raw_reply(fd);
      if (!r) _exit(1);
      for (uint64_t i = 0; i < 200; i++) raw_io(fd, 10 + i, false, kvc_cache_id(h), 1, NTOK);
      _exit(0); /* the socket closes with gets queued and one being copied */
    }
    it_sleep_ms(round * 3);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
  }
  for (int i = 0; i < 1000 && stat_get(c, "connections_current", NULL) != 1; i++) it_sleep_ms(10);
  ASSERT_U64_EQ(stat_get(c, "connections_current", NULL), 1);
  ASSERT_U64_EQ(stat_get(c, "leases", NULL), 0);
  ASSERT_U64_EQ(stat_get(c, "pages_used", NULL), used);
  ASSERT_OK(kvc_ping(c));
  kvc_client_close(c);
  daemon_stop(&d);
}
