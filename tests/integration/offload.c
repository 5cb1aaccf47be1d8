/* offload.c (integration): large gets copied on the thread pool
 * (offload_bytes) return the same bytes, keep a connection's replies in
 * order, and survive their client dying mid-copy. */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>

#include "raw.h"

#define NTOK 64 /* 4 pages; 64 tokens x 2 layers x 2 heads x 64 floats x 4 B = 64 KiB */

/* Offloaded beside another client whatever the gaps between requests (the
 * default sends a large copy to the threads only while small requests come). */
static const char *const offload_args[] = {"--offload-bytes", "16KiB", "--offload-quiet-us", "0",
                                           NULL};

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
  (void)it_wait_stat(a, "connections_current", 1, false);
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
      /* Pipelines puts (of the same length: the pages stay as many) and
       * gets without reading replies, then dies. */
      int fd = it_connect_raw(d.sock);
      raw_hello(fd, KVC_PROTOCOL_VERSION);
      Kvcache__V1__Response *r = raw_reply(fd);
      if (!r) _exit(1);
      for (uint64_t i = 0; i < 200; i++) raw_io(fd, 10 + i, i % 2, kvc_cache_id(h), 1, NTOK);
      _exit(0); /* the socket closes with requests queued and one being copied */
    }
    it_sleep_ms(round * 3);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
  }
  (void)it_wait_stat(c, "connections_current", 1, false);
  ASSERT_U64_EQ(stat_get(c, "connections_current", NULL), 1);
  ASSERT_U64_EQ(stat_get(c, "leases", NULL), 0);
  ASSERT_U64_EQ(stat_get(c, "pages_used", NULL), used);
  ASSERT_OK(kvc_ping(c));
  kvc_client_close(c);
  daemon_stop(&d);
}

/* ---- puts ------------------------------------------------------------------ */

TEST(offload_put_stores_the_same_bytes) {
  daemon_t d;
  daemon_start_args(&d, offload_args);
  kvc_client_t *a = client_open(&d), *b = client_open(&d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(a, "off", &l, &h));
  size_t nk = it_tok_floats(&l, false) * NTOK, nv = it_tok_floats(&l, true) * NTOK;
  float *k = malloc(nk * 4), *v = malloc(nv * 4), *gk = malloc(nk * 4), *gv = malloc(nv * 4);
  for (int round = 0; round < 12; round++) {
    uint64_t s = 1 + (uint64_t)round % 4;
    put_seq(h, s, NTOK, (uint32_t)round); /* 64 KiB: offloaded, over the last round's */
    it_fill_f32(k, v, &l, s, 0, NTOK, (uint32_t)round);
    ASSERT_OK(kvc_get(h, s, 0, NTOK, gk, gv));
    ASSERT_MEM_EQ(gk, k, nk * 4);
    ASSERT_MEM_EQ(gv, v, nv * 4);
    ASSERT_OK(kvc_ping(b));
  }
  ASSERT_U64_EQ(stat_get(a, "offloaded_puts_total", NULL), 12);
  /* A failing put stays on the loop and changes nothing. */
  ASSERT_ERR(kvc_put(h, 9, 5, NTOK, k, v), KVC_E_RANGE);
  ASSERT_U64_EQ(stat_get(a, "offloaded_puts_total", NULL), 12);
  ASSERT_U64_EQ(stat_get(a, "sequences", NULL), 4);
  free(k), free(v), free(gk), free(gv);
  kvc_client_close(b);
  kvc_client_close(a);
  daemon_stop(&d);
}

/* A client alone: a get or put of 512 KiB or more is split between the loop
 * and the copy threads within its request; the bytes are the same, a
 * failing one changes nothing, and beside a second client it goes to the
 * threads instead. */
TEST(offload_client_alone_splits_within_its_request) {
  static const char *const args[] = {"--offload-threads", "2", NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  kvc_client_t *a = client_open(&d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(a, "split", &l, &h));
  const uint64_t n = 1024; /* 1 MiB: two shares, a layer each */
  size_t nk = it_tok_floats(&l, false) * n, nv = it_tok_floats(&l, true) * n;
  float *k = malloc(nk * 4), *v = malloc(nv * 4), *gk = malloc(nk * 4), *gv = malloc(nv * 4);
  for (uint32_t round = 0; round < 6; round++) {
    uint64_t s = 1 + round % 2;
    it_fill_f32(k, v, &l, s, 0, n, round);
    ASSERT_OK(kvc_put(h, s, 0, n, k, v));
    memset(gk, 0, nk * 4), memset(gv, 0, nv * 4);
    ASSERT_OK(kvc_get(h, s, 0, n, gk, gv));
    ASSERT_MEM_EQ(gk, k, nk * 4);
    ASSERT_MEM_EQ(gv, v, nv * 4);
  }
  ASSERT_U64_EQ(stat_get(a, "split_copies_total", NULL), 12);
  ASSERT_U64_EQ(stat_get(a, "offloaded_puts_total", NULL), 0);
  ASSERT_U64_EQ(stat_get(a, "offloaded_gets_total", NULL), 0);
  /* Refused before anything is copied: not split, nothing changed. */
  ASSERT_ERR(kvc_put(h, 9, 5, n, k, v), KVC_E_RANGE);
  ASSERT_ERR(kvc_get(h, 1, 0, n + 1, gk, gv), KVC_E_RANGE);
  ASSERT_U64_EQ(stat_get(a, "split_copies_total", NULL), 12);
  ASSERT_U64_EQ(stat_get(a, "sequences", NULL), 2);
  /* Beside another client the copy goes to the threads. */
  kvc_client_t *b = client_open(&d);
  ASSERT_OK(kvc_get(h, 2, 0, n, gk, gv));
  ASSERT_MEM_EQ(gk, k, nk * 4);
  ASSERT_U64_EQ(stat_get(a, "offloaded_gets_total", NULL), 1);
  ASSERT_U64_EQ(stat_get(a, "split_copies_total", NULL), 12);
  free(k), free(v), free(gk), free(gv);
  kvc_client_close(b);
  kvc_client_close(a);
  daemon_stop(&d);
}

/* Beside other clients a large copy goes to the queue, and the loop takes
 * queued shares itself only while no request but large copies came within
 * offload_quiet_us. One copy thread, held by the gate in its first share of
 * b's 1 MiB put (2 shares: the layout has 2 layers): with the window at 0
 * (never quiet) nobody takes the other share; reloaded to 1 us, a's 1 MiB
 * put is copied by the loop alone, which takes b's other share on the way,
 * and answered while b's is still held; the gate opened, b's ends. a's put
 * came while the one thread had shares to copy: it went whole, one share
 * (2 helped, 3 offloaded); a 1 MiB put after the others ended is split
 * again (5 offloaded). Every byte reads back. */
TEST(offload_loop_copies_queued_shares_only_while_only_large_copies_come) {
  char gdir[IT_GATE_DIR], genv[300], conf[IT_GATE_DIR + 32];
  it_gate_open(gdir, "KVCACHED_TEST_OFFLOAD_GATE", genv, sizeof genv);
  snprintf(conf, sizeof conf, "%s/kvcached.conf", gdir);
  it_write_file(conf, "offload_quiet_us = 0\n");
  const char *env[] = {genv, NULL};
  const char *const args[] = {"--config", conf, "--offload-threads", "1", NULL};
  daemon_t d;
  daemon_start_full(&d, NULL, args, env);
  kvc_client_t *a = client_open(&d), *b = client_open(&d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *ha, *hb;
  ASSERT_OK(kvc_cache_open(a, "help", &l, &ha));
  ASSERT_OK(kvc_cache_open(b, "help", &l, &hb));
  const uint64_t n = 1024; /* 1 MiB */
  size_t nk = it_tok_floats(&l, false) * n, nv = it_tok_floats(&l, true) * n;
  float *k1 = malloc(nk * 4), *v1 = malloc(nv * 4), *k2 = malloc(nk * 4), *v2 = malloc(nv * 4);
  float *gk = malloc(nk * 4), *gv = malloc(nv * 4);
  it_fill_f32(k1, v1, &l, 1, 0, n, 1);
  it_fill_f32(k2, v2, &l, 2, 0, n, 2);
  fflush(NULL);
  pid_t putter = fork();
  ASSERT(putter >= 0);
  if (putter == 0) _exit(kvc_put(hb, 1, 0, n, k1, v1) == 0 ? 0 : 1);
  it_gate(gdir, "reached", false); /* b's put: its first share held on the thread */
  ASSERT_U64_EQ(stat_get(a, "helped_shares_total", NULL), 0);
  ASSERT_U64_EQ(stat_get(a, "offloaded_shares_total", NULL), 2);

  it_write_file(conf, "offload_quiet_us = 1\n");
  ASSERT_EQ(kill(d.pid, SIGHUP), 0);
  (void)it_wait_stat(a, "config_reloads_total", 1, false); /* the daemon's word: applied */
  ASSERT_OK(kvc_put(ha, 2, 0, n, k2, v2)); /* the thread is held: the loop copied it */
  ASSERT_U64_EQ(stat_get(a, "helped_shares_total", NULL), 2);
  ASSERT_U64_EQ(stat_get(a, "offloaded_shares_total", NULL), 3);
  ASSERT_U64_EQ(stat_get(a, "offloaded_puts_total", NULL), 1);
  int st;
  ASSERT_EQ(waitpid(putter, &st, WNOHANG), 0); /* b's still waits for its held share */
  it_gate(gdir, "go", true);
  ASSERT(waitpid(putter, &st, 0) == putter && WIFEXITED(st) && WEXITSTATUS(st) == 0);
  ASSERT_U64_EQ(stat_get(a, "offloaded_puts_total", NULL), 2);
  ASSERT_OK(kvc_put(ha, 3, 0, n, k2, v2)); /* the thread idle again: split */
  ASSERT_U64_EQ(stat_get(a, "offloaded_shares_total", NULL), 5);
  ASSERT_OK(kvc_get(ha, 3, 0, n, gk, gv));
  ASSERT_MEM_EQ(gk, k2, nk * 4);
  ASSERT_MEM_EQ(gv, v2, nv * 4);
  ASSERT_OK(kvc_get(ha, 1, 0, n, gk, gv));
  ASSERT_MEM_EQ(gk, k1, nk * 4);
  ASSERT_MEM_EQ(gv, v1, nv * 4);
  ASSERT_OK(kvc_get(ha, 2, 0, n, gk, gv));
  ASSERT_MEM_EQ(gk, k2, nk * 4);
  ASSERT_MEM_EQ(gv, v2, nv * 4);
  ASSERT_U64_EQ(stat_get(a, "split_copies_total", NULL), 0);
  free(k1), free(v1), free(k2), free(v2), free(gk), free(gv);
  kvc_client_close(b);
  kvc_client_close(a);
  daemon_stop(&d);
  unlink(conf);
  it_gate_close(gdir);
}

/* A client of its own in a thread: one call that may park. */
typedef struct parked_call {
  const daemon_t *d;
  uint32_t cache_id;
  int op; /* 0: put seq 1 (salt 2), 1: get seq 1, 2: copy_prefix 1 -> 2 */
  int rc;             /* read after the join */
  atomic_bool done;   /* the call returned */
  float *k, *v;
  pthread_t t;
} parked_call_t;

static void *parked_call_run(void *arg) {
  parked_call_t *p = arg;
  kvc_client_t *c = client_open(p->d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  int rc = kvc_cache_open(c, "off", &l, &h);
  if (rc == 0) {
    if (p->op == 0) {
      it_fill_f32(p->k, p->v, &l, 1, 0, NTOK, 2);
      rc = kvc_put(h, 1, 0, NTOK, p->k, p->v);
    } else if (p->op == 1) {
      rc = kvc_get(h, 1, 0, NTOK, p->k, p->v);
    } else {
      rc = kvc_seq_copy_prefix(h, 1, 2, NTOK);
    }
  }
  kvc_client_close(c);
  p->rc = rc;
  atomic_store(&p->done, true);
  return NULL;
}

static void parked_call_start(parked_call_t *p, const daemon_t *d, int op, size_t nk, size_t nv) {
  *p = (parked_call_t){.d = d, .op = op, .rc = -1, .k = malloc(nk * 4), .v = malloc(nv * 4)};
  atomic_init(&p->done, false);
  ASSERT(pthread_create(&p->t, NULL, parked_call_run, p) == 0);
}

/* One byte through the gate FIFO dir/name (blocks until the daemon opens
 * its end: that is the signal). */
/* A put held in flight on a pool thread (the test gate): reads of its
 * sequence's metadata answer at once, from before the put; a get and a
 * copy_prefix of other connections park and then see the new bytes;
 * eviction under a flood of other sequences passes the busy one over; the
 * audit runs after every request throughout. */
TEST(offload_put_in_flight_parks_others_and_escapes_eviction) {
  char gdir[IT_GATE_DIR], genv[300];
  it_gate_open(gdir, "KVCACHED_TEST_OFFLOAD_GATE", genv, sizeof genv);
  const char *env[] = {genv, NULL};
  daemon_t d;
  daemon_start_full(&d, NULL, offload_args, env);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  size_t nk = it_tok_floats(&l, false) * NTOK, nv = it_tok_floats(&l, true) * NTOK;
  kvc_client_t *c = client_open(&d);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "off", &l, &h));
  put_seq(h, 1, NTOK, 1); /* alone: on the loop, no gate */
  parked_call_t put, get, copy;
  parked_call_start(&put, &d, 0, nk, nv);
  it_gate(gdir, "reached", false); /* the put's copy is in flight, held */
  kvc_seq_info_t si;
  ASSERT_OK(kvc_seq_info(h, 1, &si));
  ASSERT_U64_EQ(si.length, NTOK); /* as before the put */
  parked_call_start(&get, &d, 1, nk, nv);
  parked_call_start(&copy, &d, 2, nk, nv);
  /* Each parks (the stat is the daemon's word for it). */
  (void)it_wait_stat(c, "parked_requests_total", 2, true);
  ASSERT_U64_EQ(stat_get(c, "parked_requests_total", NULL), 2);
  /* Fill the pool and a quarter more with small puts of other sequences (on the
   * loop): the least recent sequence, 1, is busy and stays. */
  uint64_t pages = stat_get(c, "pool_pages", NULL);
  float *sk = malloc(nk * 4), *sv = malloc(nv * 4);
  for (uint64_t s = 100; s < 100 + pages + pages / 4; s++) {
    it_fill_f32(sk, sv, &l, s, 0, 8, 0);
    ASSERT_OK(kvc_put(h, s, 0, 8, sk, sv));
  }
  ASSERT(stat_get(c, "evicted_sequences_total", NULL) > 0);
  ASSERT_OK(kvc_seq_info(h, 1, &si));
  ASSERT(!atomic_load(&put.done) && !atomic_load(&get.done) && !atomic_load(&copy.done));
  it_gate(gdir, "go", true); /* the copy runs; the put ends; the parked run */
  ASSERT(pthread_join(put.t, NULL) == 0);
  ASSERT(pthread_join(get.t, NULL) == 0);
  ASSERT(pthread_join(copy.t, NULL) == 0);
  ASSERT_OK(put.rc);
  ASSERT_OK(get.rc);
  ASSERT_OK(copy.rc);
  ASSERT_MEM_EQ(get.k, put.k, nk * 4); /* the new bytes, whole */
  ASSERT_MEM_EQ(get.v, put.v, nv * 4);
  float *gk = malloc(nk * 4), *gv = malloc(nv * 4);
  ASSERT_OK(kvc_get(h, 2, 0, NTOK, gk, gv)); /* the copy took the new bytes too */
  ASSERT_MEM_EQ(gk, put.k, nk * 4);
  ASSERT_MEM_EQ(gv, put.v, nv * 4);
  ASSERT_U64_EQ(stat_get(c, "offloaded_puts_total", NULL), 1);
  free(put.k), free(put.v), free(get.k), free(get.v), free(copy.k), free(copy.v);
  free(sk), free(sv), free(gk), free(gv);
  kvc_client_close(c);
  daemon_stop(&d);
  it_gate_close(gdir);
}

/* ---- every operation waits for a busy sequence -------------------------------- */

enum busy_op { B_GET, B_LEASE, B_COPY_FROM, B_APPEND, B_REMOVE, B_TRIM, B_COPY_INTO, NBUSY_OPS };

typedef struct busy_call {
  kvc_client_t *c; /* opened by the test's thread: the thread only uses it */
  enum busy_op op;
  int rc;
  atomic_bool done;
  float *k, *v; /* B_GET: what it read */
  pthread_t t;
} busy_call_t;

/* Its own client, through its rings: one operation naming a sequence that
 * an offloaded put holds busy (1, 2, 4 or 5). */
static void *busy_call_run(void *arg) {
  busy_call_t *b = arg;
  kvc_client_t *c = b->c;
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  kvc_lease_t *lease;
  int rc = kvc_cache_open(c, "off", &l, &h);
  if (rc == 0) switch (b->op) {
    case B_GET: rc = kvc_get(h, 1, 0, NTOK, b->k, b->v); break;
    case B_LEASE:
      rc = kvc_lease(h, 1, 0, 16, &lease);
      if (rc == 0) rc = kvc_lease_release(lease);
      break;
    case B_COPY_FROM: rc = kvc_seq_copy_prefix(h, 1, 3, NTOK); break;
    case B_APPEND: {
      size_t nk = it_tok_floats(&l, false) * 8, nv = it_tok_floats(&l, true) * 8;
      float *k = malloc(nk * 4), *v = malloc(nv * 4);
      it_fill_f32(k, v, &l, 1, NTOK, 8, 9);
      rc = kvc_put(h, 1, NTOK, 8, k, v);
      free(k), free(v);
      break;
    }
    case B_REMOVE: rc = kvc_seq_remove(h, 2, 0, UINT64_MAX); break;
    case B_TRIM: rc = kvc_seq_trim_front(h, 4, 16); break;
    case B_COPY_INTO: rc = kvc_seq_copy_prefix(h, 6, 5, 16); break;
    case NBUSY_OPS: break;
    }
  kvc_client_close(c);
  b->rc = rc;
  atomic_store(&b->done, true);
  return NULL;
}

/* A put of sequences 1, 2, 4 and 5 held on a copy thread (the gate): every
 * operation of another client that reads, writes, shares, removes or trims
 * one of them (through its ring) waits, parked, then runs on the new bytes;
 * reads of metadata and pins answer at once; eviction under a flood passes
 * the busy sequences over. */
TEST(offload_busy_sequence_honoured_by_eviction_and_every_operation) {
  char gdir[IT_GATE_DIR], genv[300];
  it_gate_open(gdir, "KVCACHED_TEST_OFFLOAD_GATE", genv, sizeof genv);
  const char *env[] = {genv, NULL};
  daemon_t d;
  daemon_start_full(&d, NULL, offload_args, env);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  size_t nk = it_tok_floats(&l, false) * NTOK, nv = it_tok_floats(&l, true) * NTOK;
  kvc_client_t *c = client_open(&d);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "off", &l, &h));
  for (uint64_t s = 1; s <= 6; s++) put_seq(h, s, NTOK, 1); /* alone: on the loop */
  /* The put, from a second client so that it is offloaded. */
  static const uint64_t busy[4] = {1, 2, 4, 5};
  float *pk = malloc(4 * nk * 4), *pv = malloc(4 * nv * 4);
  kvc_io_t io[4];
  for (int i = 0; i < 4; i++) {
    it_fill_f32(pk + i * nk, pv + i * nv, &l, busy[i], 0, NTOK, 7);
    io[i] = (kvc_io_t){.seq_id = busy[i], .pos = 0, .ntokens = NTOK, .k = pk + i * nk,
                       .v = pv + i * nv};
  }
  kvc_client_t *p = client_open(&d);
  kvc_cache_t *ph;
  ASSERT_OK(kvc_cache_open(p, "off", &l, &ph));
  fflush(NULL);
  pid_t putter = fork();
  ASSERT(putter >= 0);
  if (putter == 0) _exit(kvc_put_batch(ph, NULL, io, 4) == 0 ? 0 : 1);
  it_gate(gdir, "reached", false); /* held in flight */
  kvc_seq_info_t si;
  ASSERT_OK(kvc_seq_info(h, 1, &si)); /* metadata answers at once, from before */
  ASSERT_U64_EQ(si.length, NTOK);
  ASSERT_OK(kvc_seq_pin(h, 4));
  ASSERT_OK(kvc_seq_pin(h, 6)); /* the source of B_COPY_INTO outlives the flood */
  busy_call_t calls[NBUSY_OPS];
  for (int op = 0; op < NBUSY_OPS; op++) {
    /* Opened here: a client's open looks up the user kvcached (NSS), whose
     * thread-local storage ThreadSanitizer misreads when 7 threads do it. */
    calls[op] = (busy_call_t){.c = client_open(&d), .op = (enum busy_op)op, .rc = -1,
                              .k = malloc(nk * 4), .v = malloc(nv * 4)};
    atomic_init(&calls[op].done, false);
    ASSERT(pthread_create(&calls[op].t, NULL, busy_call_run, &calls[op]) == 0);
  }
  (void)it_wait_stat(c, "parked_requests_total", NBUSY_OPS, true);
  ASSERT_U64_EQ(stat_get(c, "parked_requests_total", NULL), NBUSY_OPS);
  /* The pool, and a quarter more, of other sequences: the least recent
   * ones are busy (or pinned) and stay. */
  uint64_t pages = stat_get(c, "pool_pages", NULL);
  float *sk = malloc(nk * 4), *sv = malloc(nv * 4);
  for (uint64_t s = 100; s < 100 + pages + pages / 4; s++) {
    it_fill_f32(sk, sv, &l, s, 0, 8, 0);
    ASSERT_OK(kvc_put(h, s, 0, 8, sk, sv));
  }
  ASSERT(stat_get(c, "evicted_sequences_total", NULL) > 0);
  for (int i = 0; i < 4; i++) ASSERT_OK(kvc_seq_info(h, busy[i], &si));
  for (int op = 0; op < NBUSY_OPS; op++) ASSERT(!atomic_load(&calls[op].done));
  it_gate(gdir, "go", true);
  int st;
  ASSERT(waitpid(putter, &st, 0) == putter && WIFEXITED(st) && WEXITSTATUS(st) == 0);
  for (int op = 0; op < NBUSY_OPS; op++) {
    ASSERT(pthread_join(calls[op].t, NULL) == 0);
    if (calls[op].rc) TEST_FAIL_("busy op %d: %s", op, kvc_err_name(calls[op].rc));
  }
  ASSERT_MEM_EQ(calls[B_GET].k, pk, nk * 4); /* the put's bytes, whole */
  ASSERT_MEM_EQ(calls[B_GET].v, pv, nv * 4);
  float *gk = malloc(nk * 4), *gv = malloc(nv * 4);
  ASSERT_OK(kvc_get(h, 3, 0, NTOK, gk, gv)); /* shared from the new bytes */
  ASSERT_MEM_EQ(gk, pk, nk * 4);
  ASSERT_ERR(kvc_seq_info(h, 2, &si), KVC_E_NOSEQ);
  ASSERT_OK(kvc_seq_info(h, 4, &si));
  ASSERT_U64_EQ(si.start, 16);
  ASSERT_OK(kvc_seq_info(h, 1, &si));
  ASSERT_U64_EQ(si.length, NTOK + 8);
  ASSERT_OK(kvc_seq_info(h, 5, &si));
  ASSERT_U64_EQ(si.length, 16); /* copied from 6 */
  ASSERT_U64_EQ(stat_get(c, "offloaded_puts_total", NULL), 1);
  for (int op = 0; op < NBUSY_OPS; op++) free(calls[op].k), free(calls[op].v);
  free(pk), free(pv), free(sk), free(sv), free(gk), free(gv);
  kvc_client_close(p);
  kvc_client_close(c);
  daemon_stop(&d);
  it_gate_close(gdir);
}
