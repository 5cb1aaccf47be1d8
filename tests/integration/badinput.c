/* badinput.c: every bad-input class of BRIEF §6 gets its own error, the
 * connection stays usable and nothing else changes; bad frames close only
 * their own connection; peers that are not allowed are refused. */
#include <pwd.h>
#include <sys/time.h>

#include "harness.h"
#include "raw.h"

/* The connection still works: a ping, and seq 1 reads back as written. */
static void still_usable(kvc_cache_t *h, const float *k, const float *v, size_t kn, size_t vn) {
  float *gk = calloc(kn, 4), *gv = calloc(vn, 4);
  ASSERT_OK(kvc_get(h, 1, 0, 16, gk, gv));
  ASSERT_MEM_EQ(gk, k, kn * 4);
  ASSERT_MEM_EQ(gv, v, vn * 4);
  free(gk);
  free(gv);
}

#define EXPECT(expr, code)                                                \
  do {                                                                         \
    ASSERT_ERR(expr, code);                                                    \
    still_usable(h, k, v, kn, vn);                                             \
  } while (0)

TEST(bad_input_each_class_has_its_error) {
  daemon_t d;
  daemon_start(&d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_client_t *c = client_open(&d);
  kvc_cache_t *h, *h8, *dropped;
  ASSERT_OK(kvc_cache_open(c, "bad", &l, &h));
  size_t kn = it_tok_floats(&l, false) * 16, vn = it_tok_floats(&l, true) * 16;
  float *k = calloc(kn, 4), *v = calloc(vn, 4), *buf = calloc(kn * 4, 4);
  it_fill_f32(k, v, &l, 1, 0, 16, 0);
  ASSERT_OK(kvc_put(h, 1, 0, 16, k, v));
  void *shm;
  uint64_t shm_bytes;
  kvc_client_shm(c, &shm, &shm_bytes);
  uint64_t one_kb;
  ASSERT_OK(kvc_xfer_bytes(h, NULL, true, 1, &one_kb, NULL, NULL));
  ASSERT_U64_EQ(one_kb, 2 * 2 * 32 * 4);

  /* Unknown cache (dropped under a live handle) and unknown sequence. */
  kvc_layout_t l2 = it_layout(KVC_DTYPE_F16);
  ASSERT_OK(kvc_cache_open(c, "gone", &l2, &dropped));
  ASSERT_OK(kvc_cache_drop(dropped));
  EXPECT(kvc_put(dropped, 1, 0, 1, k, v), KVC_E_NOCACHE);
  EXPECT(kvc_seq_pin(dropped, 1), KVC_E_NOCACHE);
  ASSERT_ERR(kvc_cache_find(c, "gone", &dropped), KVC_E_NOCACHE);
  EXPECT(kvc_get(h, 42, 0, 1, buf, buf), KVC_E_NOSEQ);
  EXPECT(kvc_seq_info(h, 42, &(kvc_seq_info_t){0}), KVC_E_NOSEQ);
  EXPECT(kvc_seq_copy_prefix(h, 42, 43, 1), KVC_E_NOSEQ);

  /* Positions out of range: past the end, a hole, trim past the length. */
  EXPECT(kvc_get(h, 1, 10, 17, buf, buf), KVC_E_RANGE);
  EXPECT(kvc_put(h, 1, 17, 1, k, v), KVC_E_RANGE);
  EXPECT(kvc_seq_trim_front(h, 1, 17), KVC_E_RANGE);
  EXPECT(kvc_seq_copy_prefix(h, 1, 2, 17), KVC_E_RANGE);
  EXPECT(kvc_seq_remove(h, 1, 5, 3), KVC_E_RANGE);
  EXPECT(kvc_seq_remove(h, 1, 2, 4), KVC_E_NOROPE);
  EXPECT(kvc_seq_copy_prefix(h, 1, 1, 4), KVC_E_SAMESEQ);
  EXPECT(kvc_seq_unpin(h, 1), KVC_E_NOTPINNED);

  /* Layers and heads out of range, judged by the daemon (direct form). */
  kvc_shm_io_t e = {.seq_id = 1, .pos = 0, .ntokens = 1, .k_off = 0, .v_off = 4096};
  kvc_xfer_t bad_layer = {.layer_begin = 1, .layer_end = 3};
  kvc_xfer_t bad_head = {.head_begin = 2, .head_end = 3};
  EXPECT(kvc_get_shm(h, &bad_layer, &e, 1), KVC_E_LAYER);
  ASSERT(strstr(kvc_client_last_error(c), "entry 0") != NULL); /* the daemon's words */
  EXPECT(kvc_get_shm(h, &bad_head, &e, 1), KVC_E_HEAD);
  EXPECT(kvc_put_shm(h, &(kvc_xfer_t){.head_begin = 1}, &e, 1), KVC_E_HEAD);
  EXPECT(kvc_get_shm(h, &(kvc_xfer_t){.dtype = KVC_DTYPE_F64}, &e, 1), KVC_E_DTYPE);
  /* ... and by the library for the pointer forms, with the same codes. */
  EXPECT(kvc_get_token(h, 1, 0, &bad_layer, buf, buf), KVC_E_LAYER);
  EXPECT(kvc_get_head(h, 1, 0, 2, 0, 1, buf, buf), KVC_E_HEAD);

  /* Sizes that do not match the layout. */
  kvc_shm_io_t wrong = e;
  wrong.k_len = one_kb + 4;
  EXPECT(kvc_put_shm(h, NULL, &wrong, 1), KVC_E_SIZE);
  wrong = e;
  wrong.v_len = one_kb - 4;
  EXPECT(kvc_get_shm(h, NULL, &wrong, 1), KVC_E_SIZE);

  /* Offsets outside the shared buffer, and overflow near UINT64_MAX. */
  kvc_shm_io_t off = e;
  off.k_off = shm_bytes - one_kb + 1;
  EXPECT(kvc_put_shm(h, NULL, &off, 1), KVC_E_OFFSET);
  off = e;
  off.v_off = shm_bytes;
  EXPECT(kvc_get_shm(h, NULL, &off, 1), KVC_E_OFFSET);
  off = e;
  off.k_off = UINT64_MAX - 8;
  EXPECT(kvc_put_shm(h, NULL, &off, 1), KVC_E_OFFSET);
  ASSERT(strstr(kvc_client_last_error(c), "overflows") != NULL);
  off = e;
  off.ntokens = UINT64_MAX / 4;
  EXPECT(kvc_put_shm(h, NULL, &off, 1), KVC_E_OVERFLOW);
  EXPECT(kvc_put(h, 1, UINT64_MAX - 1, 4, k, v), KVC_E_OVERFLOW);
  EXPECT(kvc_get(h, 1, UINT64_MAX - 2, UINT64_MAX, buf, buf), KVC_E_RANGE);

  /* Layout errors at open. */
  kvc_layout_t bad = l;
  bad.num_layers = 0;
  ASSERT_ERR(kvc_cache_open(c, "x", &bad, &dropped), KVC_E_NLAYERS);
  bad = l;
  bad.page_tokens = 3;
  ASSERT_ERR(kvc_cache_open(c, "x", &bad, &dropped), KVC_E_PAGETOKENS);
  bad = l;
  bad.dtype = (kvc_dtype_t)10;
  ASSERT_ERR(kvc_cache_open(c, "x", &bad, &dropped), KVC_E_DTYPE);
  bad = l;
  bad.head_dim_k = 64; /* same name, other layout */
  ASSERT_ERR(kvc_cache_open(c, "bad", &bad, &dropped), KVC_E_LAYOUT);
  ASSERT_ERR(kvc_cache_open(c, "", &l, &dropped), KVC_E_NAME);
  bad = l;
  bad.num_layers = 1024; /* a page of 16 tokens no longer fits 16 KiB */
  ASSERT_ERR(kvc_cache_open(c, "big", &bad, &dropped), KVC_E_PAGESIZE);

  /* A batch naming a sequence twice; a NaN into an int8 cache. */
  kvc_io_t twice[2] = {{.seq_id = 7, .ntokens = 1, .k = k, .v = v},
                       {.seq_id = 7, .ntokens = 1, .k = k, .v = v}};
  EXPECT(kvc_put_batch(h, NULL, twice, 2), KVC_E_DUPSEQ);
  ASSERT_ERR(kvc_seq_info(h, 7, &(kvc_seq_info_t){0}), KVC_E_NOSEQ);
  kvc_layout_t l8 = it_layout(KVC_DTYPE_INT8);
  ASSERT_OK(kvc_cache_open(c, "q", &l8, &h8));
  float *nan = calloc(kn, 4);
  nan[5] = __builtin_nanf("");
  EXPECT(kvc_put(h8, 1, 0, 16, nan, nan), KVC_E_NONFINITE);
  free(nan);

  /* Nothing changed: one sequence of 16 tokens, and the counters agree. */
  kvc_seq_info_t si;
  ASSERT_OK(kvc_seq_info(h, 1, &si));
  ASSERT_U64_EQ(si.length, 16);
  ASSERT_U64_EQ(stat_get(c, "sequences", NULL), 1);
  ASSERT_U64_EQ(stat_get(c, "pages_used", NULL), 1);
  ASSERT_U64_EQ(stat_get(c, "request_errors_total{op=put}", NULL), 10);
  ASSERT_U64_EQ(stat_get(c, "request_errors_total{op=get}", NULL), 8);
  ASSERT_U64_EQ(stat_get(c, "requests_total{op=get}", NULL), 8 + 29); /* + one per EXPECT */
  ASSERT_U64_EQ(stat_get(c, "connections_dropped_total", NULL), 0);
  ASSERT_U64_EQ(stat_get(c, "connections_current", NULL), 1);
  free(k), free(v), free(buf);
  kvc_client_close(c);
  daemon_stop(&d);
}

TEST(bad_frames_close_only_their_connection) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "frames", &l, &h));

  /* Oversized: the header alone announces more than max_frame_bytes. */
  int fd = it_connect_raw(d.sock);
  raw_hello(fd, KVC_PROTOCOL_VERSION);
  Kvcache__V1__Response *r = raw_reply(fd);
  ASSERT(r && r->status == KVCACHE__V1__STATUS__OK);
  kvcache__v1__response__free_unpacked(r, NULL);
  uint8_t big[4] = {0, 0, 16, 0}; /* 1 MiB */
  raw_send(fd, big, 4);
  ASSERT(raw_closed(fd));
  close(fd);
  ASSERT_OK(kvc_ping(c));

  /* Garbage: a frame whose bytes are not a Request (wire type 7). */
  fd = it_connect_raw(d.sock);
  raw_hello(fd, KVC_PROTOCOL_VERSION);
  r = raw_reply(fd);
  ASSERT(r && r->status == KVCACHE__V1__STATUS__OK);
  kvcache__v1__response__free_unpacked(r, NULL);
  uint8_t junk[] = {6, 0, 0, 0, 0x0f, 0xff, 0xff, 0xff, 0xff, 0x01};
  raw_send(fd, junk, sizeof junk);
  ASSERT(raw_closed(fd));
  close(fd);
  ASSERT_OK(kvc_ping(c));

  /* A repeated field that would need more heap than max_decode_bytes. */
  fd = it_connect_raw(d.sock);
  raw_hello(fd, KVC_PROTOCOL_VERSION);
  r = raw_reply(fd);
  kvcache__v1__response__free_unpacked(r, NULL);
  static uint8_t many[4 + 65536];
  size_t body = 65530;
  /* field 8 (put), length-delimited, holding empty entries (field 3). */
  many[4] = 0x42, many[5] = (uint8_t)(0x80 | ((body - 4) & 0x7f)),
  many[6] = (uint8_t)(0x80 | (((body - 4) >> 7) & 0x7f)), many[7] = (uint8_t)((body - 4) >> 14);
  for (size_t i = 8; i + 1 < 4 + body; i += 2) many[i] = 0x1a, many[i + 1] = 0;
  many[0] = (uint8_t)body, many[1] = (uint8_t)(body >> 8);
  raw_send(fd, many, 4 + body);
  ASSERT(raw_closed(fd));
  close(fd);

  /* Truncated: half a frame, then the client goes away. */
  fd = it_connect_raw(d.sock);
  uint8_t half[] = {100, 0, 0, 0, 1, 2, 3};
  raw_send(fd, half, sizeof half);
  close(fd);

  /* Not Hello first: PROTO, then closed. */
  fd = it_connect_raw(d.sock);
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__Ping ping = KVCACHE__V1__PING__INIT;
  req.body_case = KVCACHE__V1__REQUEST__BODY_PING;
  req.ping = &ping;
  raw_send_request(fd, &req);
  r = raw_reply(fd);
  ASSERT(r != NULL);
  ASSERT_EQ(r->status, KVCACHE__V1__STATUS__PROTO);
  kvcache__v1__response__free_unpacked(r, NULL);
  ASSERT(raw_closed(fd));
  close(fd);

  /* Another protocol version: VERSION, then closed. */
  fd = it_connect_raw(d.sock);
  raw_hello(fd, 99);
  r = raw_reply(fd);
  ASSERT(r != NULL);
  ASSERT_EQ(r->status, KVCACHE__V1__STATUS__VERSION);
  ASSERT(strstr(r->error, "99") != NULL);
  kvcache__v1__response__free_unpacked(r, NULL);
  ASSERT(raw_closed(fd));
  close(fd);

  /* More entries than max_entries in one request: TOOMANY, still open. */
  fd = it_connect_raw(d.sock);
  raw_hello(fd, KVC_PROTOCOL_VERSION);
  r = raw_reply(fd);
  kvcache__v1__response__free_unpacked(r, NULL);
  Kvcache__V1__IoEntry ent = KVCACHE__V1__IO_ENTRY__INIT, *ents[4097];
  for (int i = 0; i < 4097; i++) ents[i] = &ent;
  Kvcache__V1__Io io = KVCACHE__V1__IO__INIT;
  io.cache_id = kvc_cache_id(h);
  io.n_entries = 4097;
  io.entries = ents;
  req.body_case = KVCACHE__V1__REQUEST__BODY_GET;
  req.get = &io;
  req.id = 5;
  raw_send_request(fd, &req);
  r = raw_reply(fd);
  ASSERT(r != NULL);
  ASSERT_EQ(r->status, KVCACHE__V1__STATUS__TOOMANY);
  ASSERT_U64_EQ(r->id, 5);
  kvcache__v1__response__free_unpacked(r, NULL);
  req.body_case = KVCACHE__V1__REQUEST__BODY_PING;
  req.id = 6;
  raw_send_request(fd, &req);
  r = raw_reply(fd);
  ASSERT(r && r->status == KVCACHE__V1__STATUS__OK && r->id == 6);
  kvcache__v1__response__free_unpacked(r, NULL);
  close(fd);

  /* The daemon and the first client are fine. */
  ASSERT_OK(kvc_ping(c));
  (void)it_wait_stat(c, "connections_current", 1, false);
  ASSERT_U64_EQ(stat_get(c, "connections_current", NULL), 1);
  ASSERT_U64_EQ(stat_get(c, "connections_dropped_total", NULL), 3);
  ASSERT_U64_EQ(stat_get(c, "request_errors_total{op=hello}", NULL), 1);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* ---- peers ------------------------------------------------------------------ */

TEST(peer_uid_not_allowed_is_refused) {
  static const char *const only_4242[] = {"--allow-uids", "4242", NULL};
  daemon_t d;
  daemon_start_args(&d, only_4242);
  kvc_client_opts_t o = {.socket_path = d.sock};
  kvc_client_t *c = NULL;
  ASSERT_ERR(kvc_client_open(&o, &c), KVC_E_PERM);
  ASSERT(c == NULL);
  ASSERT(strstr(kvc_client_open_error(), "uid 0") != NULL);
  char out[512];
  ASSERT_EQ(ctl_run(&d, out, sizeof out, true, "ping"), 1);
  ASSERT(strstr(out, "permission denied") != NULL);
  ASSERT(strchr(out, '\n') == out + strlen(out) - 1); /* one line */
  daemon_stop(&d);
}

/* A forked child becomes nobody; the socket mode lets it connect, the peer
 * check refuses it; with the default mode the kernel refuses it. */
TEST(peer_nobody_refused_by_peer_check_and_by_mode) {
  static const char *const open_mode[] = {"--socket-mode", "0666", NULL};
  struct passwd *pw = getpwnam("nobody");
  uid_t nobody = pw ? pw->pw_uid : 65534;
  gid_t nogroup = pw ? pw->pw_gid : 65534;
  for (int round = 0; round < 2; round++) {
    daemon_t d;
    daemon_start_args(&d, round == 0 ? open_mode : NULL);
    ASSERT(chmod(d.dir, 0711) == 0);
    fflush(NULL);
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
      ASSERT(setgid(nogroup) == 0 && setuid(nobody) == 0);
      kvc_client_opts_t o = {.socket_path = d.sock};
      kvc_client_t *c = NULL;
      int rc = kvc_client_open(&o, &c);
      if (rc != KVC_E_PERM) _exit(10);
      bool by_daemon = strstr(kvc_client_open_error(), "allow_uids") != NULL;
      _exit(by_daemon == (round == 0) ? 0 : 11);
    }
    int st;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    ASSERT_EQ(WEXITSTATUS(st), 0);
    kvc_client_t *c = client_open(&d);
    ASSERT_U64_EQ(stat_get(c, "connections_rejected_total", NULL), round == 0 ? 1 : 0);
    kvc_client_close(c);
    daemon_stop(&d);
  }
}

TEST(connection_limit_answers_connlimit) {
  static const char *const two[] = {"--max-connections", "2", NULL};
  daemon_t d;
  daemon_start_args(&d, two);
  kvc_client_t *a = client_open(&d), *b = client_open(&d), *c = NULL;
  kvc_client_opts_t o = {.socket_path = d.sock};
  ASSERT_ERR(kvc_client_open(&o, &c), KVC_E_CONNLIMIT);
  ASSERT(strstr(kvc_client_open_error(), "max_connections=2") != NULL);
  ASSERT_U64_EQ(stat_get(a, "connections_rejected_total", NULL), 1);
  kvc_client_close(b);
  int rc = KVC_E_CONNLIMIT;
  for (int i = 0; i < 100 && rc == KVC_E_CONNLIMIT; i++) {
    rc = kvc_client_open(&o, &c);
    if (rc) it_sleep_ms(10);
  }
  ASSERT_OK(rc);
  ASSERT_OK(kvc_ping(c));
  ASSERT_U64_EQ(stat_get(a, "connections_current", NULL), 2);
  kvc_client_close(c);
  kvc_client_close(a);
  daemon_stop(&d);
}
