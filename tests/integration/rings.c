/* rings.c (integration): requests and replies through the shared-memory
 * rings: around the end of both rings, beside the socket on one connection,
 * replies too large for the ring, a daemon asleep woken by the doorbell, a
 * client asleep woken by the futex, clients that die or lie mid-ring, and
 * the daemon's answers staying exactly what the socket gives. */
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>

#include "rawring.h"

/* ---- through libkvcache ------------------------------------------------------- */

static void put_get_check(kvc_cache_t *h, uint64_t seq, uint64_t pos, uint64_t n, uint32_t salt) {
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  size_t nk = it_tok_floats(&l, false) * n, nv = it_tok_floats(&l, true) * n;
  float *k = malloc(nk * 4), *v = malloc(nv * 4), *gk = malloc(nk * 4), *gv = malloc(nv * 4);
  it_fill_f32(k, v, &l, seq, pos, n, salt);
  ASSERT_OK(kvc_put(h, seq, pos, n, k, v));
  ASSERT_OK(kvc_get(h, seq, pos, n, gk, gv));
  ASSERT_MEM_EQ(gk, k, nk * 4);
  ASSERT_MEM_EQ(gv, v, nv * 4);
  free(k), free(v), free(gk), free(gv);
}

/* Thousands of requests of many frame sizes (batches of 1..9 entries) go
 * around the end of the 256 KiB submission ring and the 64 KiB completion
 * ring many times; each answer is the one the socket gives. */
TEST(rings_requests_wrap_around_both_rings) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "wrap", &l, &h));
  ASSERT_U64_EQ(stat_get(c, "ring_connections", NULL), 1);
  uint64_t ring0 = stat_get(c, "ring_requests_total", NULL);
  size_t nk = it_tok_floats(&l, false), nv = it_tok_floats(&l, true);
  float *k = malloc(9 * nk * 4), *v = malloc(9 * nv * 4), *gk = malloc(9 * nk * 4),
        *gv = malloc(9 * nv * 4);
  kvc_io_t io[9], gio[9];
  for (int round = 0; round < 3000; round++) {
    size_t n = 1 + (size_t)round % 9; /* frames of different sizes cross the end anywhere */
    for (size_t i = 0; i < n; i++) {
      uint64_t seq = 1 + i, pos = (uint64_t)(round / 9) % 32;
      it_fill_f32(k + i * nk, v + i * nv, &l, seq, pos, 1, (uint32_t)round);
      io[i] = (kvc_io_t){.seq_id = seq, .pos = pos, .ntokens = 1, .k = k + i * nk, .v = v + i * nv};
      gio[i] = (kvc_io_t){.seq_id = seq, .pos = pos, .ntokens = 1, .k = gk + i * nk,
                          .v = gv + i * nv};
    }
    ASSERT_OK(kvc_put_batch(h, NULL, io, n));
    ASSERT_OK(kvc_get_batch(h, NULL, gio, n));
    ASSERT_MEM_EQ(gk, k, n * nk * 4);
    ASSERT_MEM_EQ(gv, v, n * nv * 4);
  }
  ASSERT_ERR(kvc_get(h, 99, 0, 1, gk, gv), KVC_E_NOSEQ); /* errors come back the same way */
  ASSERT(strstr(kvc_client_last_error(c), "no sequence 99") != NULL);
  /* 6,001 requests of about 100 to 900 bytes: the SQ (256 KiB) went round
   * several times, the CQ (64 KiB) more. */
  ASSERT(stat_get(c, "ring_requests_total", NULL) - ring0 >= 6001);
  free(k), free(v), free(gk), free(gv);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* A reply larger than the completion ring (a listing of 4096 sequences)
 * comes on the socket in its place; the ring goes on after it. */
TEST(rings_reply_too_large_for_the_ring_comes_on_the_socket) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "big", &l, &h));
  uint64_t *ids = malloc(4096 * sizeof *ids);
  ASSERT_OK(kvc_seq_create(h, 4096, false, ids));
  kvc_seq_info_t *seqs = malloc(4096 * sizeof *seqs);
  size_t n = 0;
  uint64_t out0 = stat_get(c, "socket_bytes_out_total", NULL);
  uint64_t cursor = 0;
  ASSERT_OK(kvc_seq_list(h, &cursor, seqs, 4096, &n));
  ASSERT_U64_EQ(n, 4096);
  ASSERT(stat_get(c, "socket_bytes_out_total", NULL) - out0 > 64 * 1024); /* it took the socket */
  put_get_check(h, ids[7], 0, 3, 1); /* and the ring carries on */
  ASSERT_OK(kvc_ping(c));
  free(ids), free(seqs);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* One connection, requests alternating between its ring and its socket
 * (the client keeps the order: it waits for each reply), with a reply that
 * the ring cannot hold: each answer comes back the way its request went. */
TEST(rings_ring_and_socket_mixed_on_one_connection) {
  daemon_t d;
  daemon_start(&d);
  rawring_t r;
  rr_open(&r, &d);
  kvc_client_t *c = client_open(&d);
  for (int i = 0; i < 200; i++) {
    Kvcache__V1__Request req;
    Kvcache__V1__Ping ping;
    uint64_t id = r.next_id++;
    req_ping(&req, &ping, id);
    if (i % 3 == 2) { /* the socket */
      raw_send_request(r.fd, &req);
      Kvcache__V1__Response *resp = raw_reply(r.fd);
      ASSERT(resp && resp->id == id && resp->status == KVCACHE__V1__STATUS__OK);
      kvcache__v1__response__free_unpacked(resp, NULL);
    } else {
      rr_ping(&r);
    }
  }
  /* Stats through the ring: its reply is larger than the 64 KiB CQ only
   * with many figures; either way it comes back whole, marker or not. */
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__StatsRequest sreq = KVCACHE__V1__STATS_REQUEST__INIT;
  req.id = r.next_id++;
  req.body_case = KVCACHE__V1__REQUEST__BODY_STATS;
  req.stats = &sreq;
  rr_submit(&r, &req);
  bool sock;
  Kvcache__V1__Response *resp = rr_reply(&r, &sock);
  if (sock) resp = raw_reply(r.fd);
  ASSERT(resp && resp->id == req.id && resp->status == KVCACHE__V1__STATUS__OK);
  ASSERT(resp->stats && resp->stats->n_stats > 50);
  kvcache__v1__response__free_unpacked(resp, NULL);
  rr_ping(&r);
  /* 134 pings and the stats came through the ring, 66 on the socket, plus
   * the hello and the library client's own. */
  ASSERT(stat_get(c, "ring_requests_total", NULL) >= 135);
  ASSERT_U64_EQ(stat_get(c, "requests_total{op=ping}", NULL), 201);
  rr_close(&r);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* A request through a polled ring runs between two frames of a socket
 * connection's turn (ring_preempt), not after the turn: a socket client
 * pipelines 4,000 pings, run in one turn here (no frame or time budget);
 * once its first reply is back, a ring client pings. The pass can miss the
 * turn (the ring client's thread comes late, or the poll loop backed off and
 * the ping came through the doorbell): tried up to 30 times, it must happen. */
TEST(rings_request_runs_between_a_socket_turns_frames) {
  /* No background: the socket client pipelines, so beside the ring
   * client's pings its requests would wait there (doc/protocol.md), not run
   * in one long turn. */
  static const char *const args[] = {"--frames-per-turn", "65536", "--turn-us", "0",
                                     "--turn-bytes", "1GiB", "--ring-poll-us", "100000",
                                     "--background-quiet-us", "0", NULL};
  enum { NPINGS = 4000 };
  daemon_t d;
  daemon_start_args(&d, args);
  kvc_client_t *c = client_open(&d);
  int fd = it_connect_raw(d.sock);
  raw_hello(fd, KVC_PROTOCOL_VERSION);
  Kvcache__V1__Response *resp = raw_reply(fd);
  ASSERT(resp && resp->status == KVCACHE__V1__STATUS__OK);
  kvcache__v1__response__free_unpacked(resp, NULL);
  static uint8_t pings[NPINGS * 8];
  for (int i = 0; i < NPINGS; i++)
    memcpy(pings + 8 * i, (uint8_t[]){4, 0, 0, 0, 0x08, 0x02, 0x1a, 0x00}, 8);
  uint64_t preempts = 0;
  int tries = 0;
  while (tries < 30 && preempts == 0) {
    tries++;
    ASSERT_OK(kvc_ping(c)); /* the ring is polled from its reply on */
    raw_send(fd, pings, sizeof pings);
    resp = raw_reply(fd);
    ASSERT(resp && resp->status == KVCACHE__V1__STATUS__OK);
    kvcache__v1__response__free_unpacked(resp, NULL);
    ASSERT_OK(kvc_ping(c));
    for (int i = 1; i < NPINGS; i++) { /* every ping is answered, in order */
      resp = raw_reply(fd);
      ASSERT(resp && resp->status == KVCACHE__V1__STATUS__OK && resp->id == 2);
      kvcache__v1__response__free_unpacked(resp, NULL);
    }
    preempts = stat_get(c, "ring_preempts_total", NULL);
  }
  fprintf(stderr, "ring passes inside a socket turn after %d tries: %llu\n", tries,
          (unsigned long long)preempts);
  ASSERT(preempts > 0);
  ASSERT_U64_EQ(stat_get(c, "requests_total{op=ping}", NULL), (uint64_t)tries * (NPINGS + 2));
  close(fd);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* Once the daemon stops polling a ring (it says so: sq_wakeup), a request
 * there wakes it through the doorbell; with ring_poll_us 0 every request
 * does. */
TEST(rings_sleeping_daemon_woken_by_the_doorbell) {
  daemon_t d;
  daemon_start(&d);
  rawring_t r;
  rr_open(&r, &d);
  kvc_client_t *c = client_open(&d);
  for (int round = 0; round < 5; round++) {
    rr_ping(&r); /* now the daemon polls this ring for a while */
    for (int i = 0; i < 5000 && !atomic_load(&r.hdr->sq_wakeup); i++) it_sleep_ms(1);
    ASSERT_EQ(atomic_load(&r.hdr->sq_wakeup), 1); /* the daemon's word: it stopped */
    uint64_t bells = stat_get(c, "ring_doorbells_total", NULL);
    rr_ping(&r); /* rings the doorbell: the daemon wakes and answers */
    ASSERT(stat_get(c, "ring_doorbells_total", NULL) > bells);
  }
  rr_close(&r);
  kvc_client_close(c);
  daemon_stop(&d);

  static const char *const never[] = {"--ring-poll-us", "0", NULL};
  daemon_start_args(&d, never);
  kvc_client_opts_t o = {.socket_path = d.sock, .timeout_ms = 20000, .flags = KVC_CLIENT_NO_SPIN};
  ASSERT_OK(kvc_client_open(&o, &c));
  kvc_client_opts_t so = {.socket_path = d.sock, .timeout_ms = 20000, .flags = KVC_CLIENT_NO_RINGS};
  kvc_client_t *s;
  ASSERT_OK(kvc_client_open(&so, &s)); /* asks for the figures on its socket */
  for (int i = 0; i < 100; i++) ASSERT_OK(kvc_ping(c));
  /* Each ping rang (the daemon never polls); a ring it read late, having
   * run the ping in the same turn as the one before, it counts once read. */
  (void)it_wait_stat(s, "ring_doorbells_total", 100, true);
  ASSERT_U64_EQ(stat_get(s, "ring_doorbells_total", NULL), 100);
  ASSERT_U64_EQ(stat_get(s, "ring_requests_total", NULL), 100);
  kvc_client_close(s);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* A client asleep on its completion ring is woken by the daemon's
 * FUTEX_WAKE: the request is held on a copy thread (the offload gate) until
 * the client says it sleeps. */
TEST(rings_sleeping_client_woken_by_the_futex) {
  char gdir[IT_GATE_DIR], path[300], genv[300];
  it_gate_open(gdir, "KVCACHED_TEST_OFFLOAD_GATE", genv, sizeof genv);
  const char *env[] = {genv, NULL};
  static const char *const args[] = {"--offload-bytes", "16KiB", "--offload-quiet-us", "0", NULL};
  daemon_t d;
  daemon_start_full(&d, NULL, args, env);
  /* On the socket: the only futex wake is the one this test waits for. */
  kvc_client_opts_t o = {.socket_path = d.sock, .timeout_ms = 20000, .flags = KVC_CLIENT_NO_RINGS};
  kvc_client_t *c;
  ASSERT_OK(kvc_client_open(&o, &c));
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "sleep", &l, &h));
  put_get_check(h, 1, 0, 64, 3); /* 64 KiB; alone: not offloaded, no gate */
  rawring_t r;
  rr_open(&r, &d); /* a second connection: the next large get is offloaded */
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__Io io = KVCACHE__V1__IO__INIT;
  Kvcache__V1__IoEntry e = KVCACHE__V1__IO_ENTRY__INIT, *ep = &e;
  e.seq_id = 1;
  e.ntokens = 64;
  e.k_len = e.v_len = 64 * 2 * 2 * 32 * 4;
  e.v_off = e.k_len;
  io.cache_id = kvc_cache_id(h);
  io.n_entries = 1;
  io.entries = &ep;
  req.id = 7;
  req.body_case = KVCACHE__V1__REQUEST__BODY_GET;
  req.get = &io;
  uint32_t seq = atomic_load(&r.hdr->cq_seq);
  rr_submit(&r, &req);
  snprintf(path, sizeof path, "%s/reached", gdir);
  int rfd = open(path, O_RDONLY);
  char b;
  ASSERT(read(rfd, &b, 1) == 1); /* the get is in flight, held */
  atomic_store(&r.hdr->client_waiting, 1); /* asleep, as libkvcache says it */
  snprintf(path, sizeof path, "%s/go", gdir);
  int fd = open(path, O_WRONLY);
  ASSERT(write(fd, "g", 1) == 1); /* the copy runs, the reply comes */
  for (int i = 0; i < 500 && atomic_load(&r.hdr->cq_seq) == seq; i++) {
    struct timespec ts = {0, 20 * 1000000};
    syscall(SYS_futex, (uint32_t *)&r.hdr->cq_seq, FUTEX_WAIT, seq, &ts, NULL, 0);
  }
  atomic_store(&r.hdr->client_waiting, 0);
  bool sock;
  Kvcache__V1__Response *resp = rr_reply(&r, &sock);
  ASSERT(!sock && resp && resp->id == 7 && resp->status == KVCACHE__V1__STATUS__OK);
  kvcache__v1__response__free_unpacked(resp, NULL);
  ASSERT_U64_EQ(stat_get(c, "ring_client_wakeups_total", NULL), 1);
  ASSERT_U64_EQ(stat_get(c, "offloaded_gets_total", NULL), 1);
  close(fd), close(rfd);
  rr_close(&r);
  kvc_client_close(c);
  daemon_stop(&d);
  it_gate_close(gdir);
}

/* Clients that die with requests in their ring, or publish what no ring can
 * hold: their connection goes (pins and leases released), nobody else
 * notices. */
TEST(rings_client_killed_mid_ring) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "kill", &l, &h));
  put_get_check(h, 1, 0, 32, 1);
  uint64_t used = stat_get(c, "pages_used", NULL);
  for (int round = 0; round < 6; round++) {
    int prog[2];
    ASSERT(pipe(prog) == 0);
    fflush(NULL);
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
      close(prog[0]);
      rawring_t r;
      rr_open(&r, &d);
      if (round % 3 == 0) { /* requests in the ring, never read: then killed */
        Kvcache__V1__Request req;
        Kvcache__V1__Ping ping;
        for (int i = 0; i < 1000; i++) {
          req_ping(&req, &ping, (uint64_t)i + 2);
          if (ringbuf_room(&r.sq, atomic_load(&r.hdr->sq_head)) < 64) break;
          rr_submit(&r, &req);
        }
        /* Killed once the daemon is answering them (its word: the CQ). */
        for (int i = 0; i < 10000 && atomic_load(&r.hdr->cq_tail) == 0; i++) it_sleep_ms(1);
      } else { /* a lie: a tail past what a ring holds, or a frame that does not decode */
        if (round % 3 == 1) {
          atomic_store(&r.hdr->sq_tail, r.sq.size + 100);
        } else {
          uint8_t junk[64];
          memset(junk, 0xff, sizeof junk);
          ringbuf_put(&r.sq, junk, sizeof junk);
          atomic_store(&r.hdr->sq_tail, r.sq.pos);
        }
        uint64_t one = 1;
        if (write(r.bell, &one, 8) != 8) _exit(3);
        if (!raw_closed(r.fd)) _exit(5); /* the daemon's word: it closed us */
      }
      if (write(prog[1], "r", 1) != 1) _exit(4);
      pause(); /* killed here */
      _exit(0);
    }
    close(prog[1]);
    char b;
    ASSERT(read(prog[0], &b, 1) == 1); /* it published, and the daemon saw it */
    close(prog[0]);
    kill(pid, SIGKILL);
    int st;
    waitpid(pid, &st, 0);
    ASSERT(WIFSIGNALED(st)); /* killed in pause(), not failed before */
  }
  /* A library client that holds a pin and a lease, killed between requests
   * on its ring. */
  int prog[2];
  ASSERT(pipe(prog) == 0);
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    close(prog[0]);
    kvc_client_t *k = client_open(&d);
    kvc_cache_t *kh;
    kvc_lease_t *lease;
    if (kvc_cache_open(k, "kill", &l, &kh) || kvc_seq_pin(kh, 1) || kvc_lease(kh, 1, 0, 16, &lease))
      _exit(2);
    for (int i = 0;; i++) {
      if (kvc_ping(k)) _exit(3);
      if (i == 100 && write(prog[1], "r", 1) != 1) _exit(4);
    }
  }
  close(prog[1]);
  char b;
  ASSERT(read(prog[0], &b, 1) == 1);
  close(prog[0]);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  (void)it_wait_stat(c, "connections_current", 1, false);
  ASSERT_U64_EQ(stat_get(c, "connections_current", NULL), 1);
  ASSERT_U64_EQ(stat_get(c, "ring_connections", NULL), 1);
  ASSERT_U64_EQ(stat_get(c, "connections_dropped_total", NULL), 4); /* the liars */
  ASSERT_U64_EQ(stat_get(c, "leases", NULL), 0);
  ASSERT_U64_EQ(stat_get(c, "sequences_pinned", NULL), 0);
  ASSERT_U64_EQ(stat_get(c, "pages_used", NULL), used);
  put_get_check(h, 1, 0, 32, 2);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* A client that asks for no rings, and a daemon that grants none, speak the
 * socket exactly as before. */
TEST(rings_refused_or_not_asked_use_the_socket) {
  static const char *const off[] = {"--rings", "false", NULL};
  daemon_t d;
  daemon_start_args(&d, off);
  kvc_client_t *c = client_open(&d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "sock", &l, &h));
  put_get_check(h, 1, 0, 20, 1);
  ASSERT_U64_EQ(stat_get(c, "ring_connections", NULL), 0);
  ASSERT_U64_EQ(stat_get(c, "ring_requests_total", NULL), 0);
  kvc_client_close(c);
  daemon_stop(&d);
  daemon_start(&d);
  kvc_client_opts_t o = {.socket_path = d.sock, .timeout_ms = 20000, .flags = KVC_CLIENT_NO_RINGS};
  ASSERT_OK(kvc_client_open(&o, &c));
  ASSERT_OK(kvc_cache_open(c, "sock", &l, &h));
  put_get_check(h, 1, 0, 20, 1);
  ASSERT_U64_EQ(stat_get(c, "ring_connections", NULL), 0);
  ASSERT_U64_EQ(stat_get(c, "ring_requests_total", NULL), 0);
  kvc_client_close(c);
  daemon_stop(&d);
}
