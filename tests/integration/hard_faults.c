/* hard_faults.c: faults from outside. Writers SIGKILLed in the middle of
 * puts leave no pin and no partial write; a SIGKILLed daemon is restarted
 * and nobody reads its old data; the seals refuse truncation of the shared
 * buffer; injected allocation failures are error replies; concurrent
 * writers never show a reader a mix of versions; copy-on-write under races
 * and a pool too small for it never changes a shared prefix. */
#include <sys/mman.h>

#include "hard.h"

/* Fills K with `val` and V with -val for ntokens of every layer. */
static void fill_version(float *k, float *v, const kvc_layout_t *l, uint64_t ntokens,
                         float val) {
  size_t n = it_tok_floats(l, false) * ntokens, m = it_tok_floats(l, true) * ntokens;
  for (size_t i = 0; i < n; i++) k[i] = val;
  for (size_t i = 0; i < m; i++) v[i] = -val;
}

/* Every float of K is one value and every float of V its negation: one
 * complete version. Returns the version. */
static float one_version(const float *k, const float *v, const kvc_layout_t *l,
                         uint64_t ntokens) {
  size_t n = it_tok_floats(l, false) * ntokens, m = it_tok_floats(l, true) * ntokens;
  float val = k[0];
  for (size_t i = 0; i < n; i++)
    if (k[i] != val) TEST_FAIL_("K float %zu is %g, float 0 is %g: a mixed read", i, k[i], val);
  for (size_t i = 0; i < m; i++)
    if (v[i] != -val) TEST_FAIL_("V float %zu is %g, want %g: a mixed read", i, v[i], -val);
  return val;
}

static kvc_client_t *open_small(const daemon_t *d) { return client_open_shm(d, 1u << 20); }

/* A writer that pins seq 1 and overwrites its 16 tokens forever with
 * versions base, base+1, ..., half through its buffer (put_shm), half through
 * the copying form. */
static void writer_forever(const daemon_t *d, float base) {
  kvc_client_t *c = open_small(d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  if (kvc_cache_open(c, "kill", &l, &h)) _exit(3);
  if (kvc_seq_pin(h, 1)) _exit(4);
  void *shm;
  uint64_t shm_bytes;
  kvc_client_shm(c, &shm, &shm_bytes);
  size_t kb = it_tok_floats(&l, false) * 16 * 4;
  float *k = malloc(kb), *v = malloc(kb);
  for (uint64_t i = 0;; i++) {
    float val = base + (float)i;
    int rc;
    if (i % 2) {
      fill_version(k, v, &l, 16, val);
      rc = kvc_put(h, 1, 0, 16, k, v);
    } else {
      fill_version(shm, (float *)shm + kb / 4, &l, 16, val);
      kvc_shm_io_t e = {.seq_id = 1, .pos = 0, .ntokens = 16, .k_off = 0, .v_off = kb};
      rc = kvc_put_shm(h, NULL, &e, 1);
    }
    if (rc) _exit(5);
  }
}

TEST_TIMEOUT(hard_writer_sigkilled_mid_put_leaves_no_pin_or_partial_write, 600) {
  int rounds = test_long() ? 10000 : 150;
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = open_small(&d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "kill", &l, &h));
  size_t kb = it_tok_floats(&l, false) * 16 * 4;
  float *k = malloc(kb), *v = malloc(kb);
  fill_version(k, v, &l, 16, 1.0f);
  ASSERT_OK(kvc_put(h, 1, 0, 16, k, v));
  uint64_t seed = 12345;
  double worst_unpin_ms = 0;
  for (int r = 0; r < rounds; r++) {
    fflush(NULL);
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) writer_forever(&d, (float)(r + 1) * 1e5f);
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    it_sleep_ms(0);
    struct timespec ts = {0, (long)((seed >> 33) % 4000000)}; /* 0..4 ms */
    nanosleep(&ts, NULL);
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    int st;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    ASSERT(WIFSIGNALED(st)); /* it was still writing, not failing */
    double t0 = hard_now_ms();
    uint64_t pinned = 1;
    while ((pinned = stat_get(c, "pages_pinned", NULL)) != 0 && hard_now_ms() - t0 < 5000)
      it_sleep_ms(1);
    ASSERT_U64_EQ(pinned, 0);
    double ms = hard_now_ms() - t0;
    if (ms > worst_unpin_ms) worst_unpin_ms = ms;
    ASSERT_OK(kvc_get(h, 1, 0, 16, k, v));
    float val = one_version(k, v, &l, 16);
    ASSERT(val == 1.0f || (val >= 1e5f && val < (float)(r + 2) * 1e5f));
  }
  ASSERT_U64_EQ(stat_get(c, "sequences_pinned", NULL), 0);
  /* Evictions proceed: 40 new sequences of a page each fill the 512-page
   * pool... 600 pages' worth make it evict seq 1 among others. */
  uint64_t ev0 = stat_get(c, "evicted_sequences_total", NULL);
  fill_version(k, v, &l, 16, 7.0f);
  for (uint64_t s = 100; s < 700; s++) ASSERT_OK(kvc_put(h, s, 0, 16, k, v));
  uint64_t ev = stat_get(c, "evicted_sequences_total", NULL) - ev0;
  fprintf(stderr, "%d writers killed mid-put; pins gone within %.1f ms at worst; %llu evictions after\n",
          rounds, worst_unpin_ms, (unsigned long long)ev);
  ASSERT(ev >= 80);
  free(k), free(v);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* A reader killed while it holds pins releases them the same way. */
TEST(hard_reader_sigkilled_holding_pins_releases_them) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = open_small(&d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "rk", &l, &h));
  size_t kb = it_tok_floats(&l, false) * 16 * 4;
  float *k = malloc(kb), *v = malloc(kb);
  fill_version(k, v, &l, 16, 3.0f);
  for (uint64_t s = 1; s <= 8; s++) ASSERT_OK(kvc_put(h, s, 0, 16, k, v));
  for (int r = 0; r < 20; r++) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
      kvc_client_t *rc = open_small(&d);
      kvc_cache_t *rh;
      if (kvc_cache_open(rc, "rk", &l, &rh)) _exit(3);
      for (uint64_t s = 1; s <= 8; s++)
        if (kvc_seq_pin(rh, s)) _exit(4);
      for (;;)
        if (kvc_get(rh, 1 + (uint64_t)r % 8, 0, 16, k, v)) _exit(5);
    }
    it_sleep_ms(5 + r % 7);
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    int st;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    ASSERT(WIFSIGNALED(st));
    double t0 = hard_now_ms();
    while (stat_get(c, "sequences_pinned", NULL) != 0 && hard_now_ms() - t0 < 5000) it_sleep_ms(1);
    ASSERT_U64_EQ(stat_get(c, "sequences_pinned", NULL), 0);
  }
  free(k), free(v);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* Load from two child processes while the daemon is SIGKILLed and started
 * again on the same socket: the children see an I/O error, not a hang; the
 * old client stays broken; a new client finds none of the old data. */
TEST(hard_daemon_sigkilled_under_load_restarts_without_stale_data) {
  char dir[64] = "/tmp/kvcit-restart-XXXXXX", sock[128], cmd[128];
  ASSERT(mkdtemp(dir) != NULL);
  snprintf(sock, sizeof sock, "%s/kvcached.sock", dir);
  const char *args[] = {"--socket", sock, NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  kvc_client_t *c = open_small(&d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "old", &l, &h));
  size_t kb = it_tok_floats(&l, false) * 16 * 4;
  float *k = malloc(kb), *v = malloc(kb);
  fill_version(k, v, &l, 16, 42.0f);
  ASSERT_OK(kvc_put(h, 1, 0, 16, k, v));
  /* Each child writes a byte to ready once its first put and get are done:
   * the daemon is killed under load, never before a child has connected. */
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t kids[2];
  for (int i = 0; i < 2; i++) {
    fflush(NULL);
    kids[i] = fork();
    ASSERT(kids[i] >= 0);
    if (kids[i] == 0) {
      close(ready[0]);
      kvc_client_opts_t o = {.socket_path = sock, .shm_bytes = 1u << 20, .timeout_ms = 5000};
      kvc_client_t *kc;
      kvc_cache_t *kh;
      if (kvc_client_open(&o, &kc) || kvc_cache_open(kc, "old", &l, &kh)) _exit(3);
      for (uint64_t n = 0;; n++) {
        int rc = n % 2 ? kvc_get(kh, 1, 0, 16, k, v) : kvc_put(kh, 10 + (uint64_t)i, 0, 16, k, v);
        if (rc == KVC_E_IO) _exit(strlen(kvc_client_last_error(kc)) > 0 ? 0 : 6);
        if (rc) _exit(4);
        if (n == 1 && (write(ready[1], "r", 1) != 1 || close(ready[1]) != 0)) _exit(7);
      }
    }
  }
  close(ready[1]);
  for (int i = 0; i < 2; i++) {
    struct pollfd p = {.fd = ready[0], .events = POLLIN};
    char b;
    ASSERT_EQ(poll(&p, 1, 30000), 1);
    if (read(ready[0], &b, 1) != 1) { /* EOF: a child ended before its first put */
      int st = 0;
      pid_t gone = waitpid(-1, &st, WNOHANG);
      TEST_FAIL_("child %d ended before it was ready: exit %d", (int)gone,
                 WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    }
  }
  close(ready[0]);
  ASSERT_EQ(kill(d.pid, SIGKILL), 0);
  int st;
  ASSERT_EQ(waitpid(d.pid, &st, 0), d.pid);
  for (int i = 0; i < 2; i++) {
    ASSERT_EQ(waitpid(kids[i], &st, 0), kids[i]);
    ASSERT(WIFEXITED(st));
    ASSERT_EQ(WEXITSTATUS(st), 0); /* each saw KVC_E_IO with a message */
  }
  ASSERT_ERR(kvc_get(h, 1, 0, 16, k, v), KVC_E_IO);
  fprintf(stderr, "old client after the kill: %s\n", kvc_client_last_error(c));
  kvc_client_opts_t o = {.socket_path = sock};
  kvc_client_t *none = NULL;
  ASSERT_ERR(kvc_client_open(&o, &none), KVC_E_NOTRUNNING); /* a stale socket file */
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", d.dir);
  ASSERT(system(cmd) == 0);

  daemon_t d2;
  daemon_start_args(&d2, args); /* the stale socket file is replaced */
  ASSERT_ERR(kvc_ping(c), KVC_E_IO); /* the old connection stays broken */
  kvc_client_close(c);
  c = open_small(&d2);
  kvc_cache_t *h2;
  ASSERT_ERR(kvc_cache_find(c, "old", &h2), KVC_E_NOCACHE);
  ASSERT_OK(kvc_cache_open(c, "old", &l, &h2));
  ASSERT_ERR(kvc_get(h2, 1, 0, 16, k, v), KVC_E_NOSEQ);
  ASSERT_U64_EQ(stat_get(c, "sequences", NULL), 0);
  free(k), free(v);
  kvc_client_close(c);
  daemon_stop(&d2);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ASSERT(system(cmd) == 0);
}

/* Reads the Hello reply keeping the passed descriptor; returns it. */
static int hello_keep_fd(int fd, uint64_t *shm_bytes) {
  raw_hello(fd, KVC_PROTOCOL_VERSION);
  uint8_t buf[4096];
  char ctl[CMSG_SPACE(2 * sizeof(int))];
  struct iovec iov = {.iov_base = buf, .iov_len = sizeof buf};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl,
                       .msg_controllen = sizeof ctl};
  ssize_t n = recvmsg(fd, &msg, 0);
  ASSERT(n > 4);
  int passed[2] = {-1, -1};
  struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
  ASSERT(cm && cm->cmsg_type == SCM_RIGHTS);
  memcpy(passed, CMSG_DATA(cm), cm->cmsg_len - CMSG_LEN(0));
  if (passed[1] >= 0) close(passed[1]); /* the read-only pool: not this test's */
  Kvcache__V1__Response *r = kvcache__v1__response__unpack(NULL, (size_t)n - 4, buf + 4);
  ASSERT(r && r->status == KVCACHE__V1__STATUS__OK && r->hello);
  *shm_bytes = r->hello->shm_bytes;
  kvcache__v1__response__free_unpacked(r, NULL);
  return passed[0];
}

TEST(hard_seals_refuse_truncating_the_shared_buffer) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = open_small(&d);
  int fds0 = hard_fd_count(d.pid);
  int sock = it_connect_raw(d.sock);
  uint64_t bytes;
  int mfd = hello_keep_fd(sock, &bytes);
  ASSERT_U64_EQ(bytes, 1u << 20);
  int seals = fcntl(mfd, F_GET_SEALS);
  ASSERT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  ASSERT_EQ(ftruncate(mfd, 0), -1);
  ASSERT_EQ(errno, EPERM);
  ASSERT_EQ(ftruncate(mfd, (off_t)bytes / 2), -1);
  ASSERT_EQ(errno, EPERM);
  ASSERT_EQ(ftruncate(mfd, (off_t)bytes * 2), -1);
  ASSERT_EQ(errno, EPERM);
  ASSERT_EQ(fallocate(mfd, 0, (off_t)bytes - 4096, 8192), -1); /* grow */
  ASSERT_EQ(errno, EPERM);
  ASSERT_EQ(fcntl(mfd, F_ADD_SEALS, F_SEAL_WRITE), -1); /* no more seals */
  ASSERT_EQ(errno, EPERM);
  /* Punching a hole keeps the size: no seal short of F_SEAL_WRITE (which
   * would forbid the client's own writes) refuses it, and it only zeroes
   * the client's own buffer. The daemon's mapping still has its size, so
   * no access of it can fault. */
  uint8_t *map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
  ASSERT(map != MAP_FAILED);
  memset(map, 0x7f, bytes);
  int punched = fallocate(mfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t)bytes);
  fprintf(stderr, "ftruncate and growing fallocate: EPERM; punch hole: %s\n",
          punched == 0 ? "allowed (size kept, buffer reads zeros)" : strerror(errno));
  struct stat st;
  ASSERT_EQ(fstat(mfd, &st), 0);
  ASSERT_EQ(st.st_size, (off_t)bytes);
  if (punched == 0) ASSERT_EQ(map[bytes - 1], 0);
  /* The daemon uses the punched buffer for a put and a get: no fault. */
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__CacheOpen co = KVCACHE__V1__CACHE_OPEN__INIT;
  Kvcache__V1__Layout lw = KVCACHE__V1__LAYOUT__INIT;
  lw.num_layers = 2, lw.num_kv_heads = 2, lw.head_dim_k = 32, lw.head_dim_v = 32;
  lw.dtype = KVCACHE__V1__DTYPE__F32;
  co.name = (char *)"sealed", co.layout = &lw;
  req.body_case = KVCACHE__V1__REQUEST__BODY_CACHE_OPEN, req.cache_open = &co, req.id = 2;
  raw_send_request(sock, &req);
  Kvcache__V1__Response *r = raw_reply(sock);
  ASSERT(r && r->status == KVCACHE__V1__STATUS__OK);
  uint32_t cache = r->cache_open->cache_id;
  kvcache__v1__response__free_unpacked(r, NULL);
  for (int round = 0; round < 2; round++) {
    Kvcache__V1__IoEntry e = KVCACHE__V1__IO_ENTRY__INIT, *pe = &e;
    Kvcache__V1__Io io = KVCACHE__V1__IO__INIT;
    e.seq_id = 1, e.ntokens = 16, e.k_len = e.v_len = 16 * 512, e.v_off = bytes - 16 * 512;
    io.cache_id = cache, io.n_entries = 1, io.entries = &pe;
    req = (Kvcache__V1__Request)KVCACHE__V1__REQUEST__INIT;
    req.id = 3 + (uint64_t)round;
    if (round == 0) req.body_case = KVCACHE__V1__REQUEST__BODY_PUT, req.put = &io;
    else req.body_case = KVCACHE__V1__REQUEST__BODY_GET, req.get = &io;
    if (round == 1) memset(map, 0x55, bytes);
    raw_send_request(sock, &req);
    r = raw_reply(sock);
    ASSERT(r && r->status == KVCACHE__V1__STATUS__OK);
    kvcache__v1__response__free_unpacked(r, NULL);
  }
  for (size_t i = 0; i < 16 * 512; i++) ASSERT(map[i] == 0 && map[bytes - 1 - i] == 0);
  munmap(map, bytes);
  close(mfd);
  close(sock);
  ASSERT(hard_wait_fds(d.pid, fds0 - 1, 1000) <= fds0); /* (the harness's probe may close too) */
  ASSERT_OK(kvc_ping(c));
  kvc_client_close(c);
  daemon_stop(&d);
}

/* KVCACHED_TEST_FAILALLOC=6: every other request fails its 0th..5th engine
 * allocation in turn. Every request either succeeds or answers NOMEM,
 * nothing half-done stays behind, and the engine's heap after each round of
 * create-copy-remove is the same. */
TEST(hard_allocation_failures_are_error_replies) {
  setenv("KVCACHED_TEST_FAILALLOC", "6", 1);
  daemon_t d;
  daemon_start(&d);
  unsetenv("KVCACHED_TEST_FAILALLOC");
  kvc_client_t *c = open_small(&d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h = NULL;
  int rc, nomem = 0, ok = 0;
#define RETRY(expr)                                                            \
  do {                                                                         \
    for (int try_ = 0; (rc = (expr)) == KVC_E_NOMEM && try_ < 10; try_++) nomem++; \
    ASSERT_OK(rc);                                                             \
    ok++;                                                                      \
  } while (0)
  RETRY(kvc_cache_open(c, "af", &l, &h));
  uint64_t meta[3];
  size_t kb = it_tok_floats(&l, false) * 40 * 4;
  float *k = malloc(kb), *v = malloc(kb), *gk = malloc(kb), *gv = malloc(kb);
  for (int round = 0; round < 3; round++) {
    for (uint64_t s = 1; s <= 20; s++) {
      it_fill_f32(k, v, &l, s, 0, 40, (uint32_t)round);
      RETRY(kvc_put(h, s, 0, 40, k, v));
      RETRY(kvc_seq_pin(h, s));
      RETRY(kvc_seq_copy_prefix(h, s, 100 + s, 20 + s));
      RETRY(kvc_put(h, 100 + s, 20 + s, 1, k, v)); /* copy on write */
      RETRY(kvc_get(h, s, 0, 40, gk, gv));
      ASSERT_MEM_EQ(gk, k, kb);
      ASSERT_MEM_EQ(gv, v, kb);
      RETRY(kvc_seq_unpin(h, s));
    }
    for (uint64_t s = 1; s <= 20; s++) RETRY(kvc_seq_remove(h, 100 + s, 0, UINT64_MAX));
    for (uint64_t s = 1; s <= 20; s++) RETRY(kvc_seq_remove(h, s, 0, UINT64_MAX));
    meta[round] = stat_get(c, "metadata_bytes", NULL);
  }
  fprintf(stderr, "%d operations succeeded, %d NOMEM replies on the way; engine heap after "
          "each round %llu, %llu, %llu bytes\n", ok, nomem, (unsigned long long)meta[0],
          (unsigned long long)meta[1], (unsigned long long)meta[2]);
  ASSERT_U64_EQ(meta[2], meta[1]);
  ASSERT(nomem > 10);
  ASSERT_U64_EQ(stat_get(c, "sequences", NULL), 0);
  ASSERT_U64_EQ(stat_get(c, "pages_used", NULL), 0);
  ASSERT_U64_EQ(stat_get(c, "connections_dropped_total", NULL), 0);
  free(k), free(v), free(gk), free(gv);
  kvc_client_close(c);
  daemon_stop(&d); /* LeakSanitizer in the asan build: nothing leaked */
#undef RETRY
}

/* A request that needs more heap to decode than max_decode_bytes (the
 * protobuf-c allocator refuses) closes only its connection. */
TEST(hard_decode_budget_exhaustion_closes_only_that_connection) {
  static const char *const args[] = {"--max-decode-bytes", "4KiB", NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  kvc_client_t *a = open_small(&d), *b = open_small(&d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(a, "dec", &l, &h));
  size_t kb = it_tok_floats(&l, false) * 4;
  float *k = calloc(200, kb), *v = calloc(200, kb);
  kvc_io_t e[200];
  for (int i = 0; i < 200; i++)
    e[i] = (kvc_io_t){.seq_id = (uint64_t)i, .ntokens = 1, .k = k + i * kb / 4, .v = v + i * kb / 4};
  ASSERT_ERR(kvc_put_batch(h, NULL, e, 200), KVC_E_IO);
  ASSERT_OK(kvc_ping(b));
  ASSERT_U64_EQ(stat_get(b, "connections_dropped_total", NULL), 1);
  ASSERT_U64_EQ(stat_get(b, "sequences", NULL), 0);
  free(k), free(v);
  kvc_client_close(a);
  kvc_client_close(b);
  daemon_stop(&d);
}

/* Four writers overwrite seq 1 with their own versions while two readers
 * read it whole: every read is one complete version. */
TEST(hard_concurrent_writers_readers_see_whole_versions) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = open_small(&d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "cw", &l, &h));
  size_t kb = it_tok_floats(&l, false) * 64 * 4;
  float *k = malloc(kb), *v = malloc(kb);
  fill_version(k, v, &l, 64, 0.5f);
  ASSERT_OK(kvc_put(h, 1, 0, 64, k, v)); /* four pages */
  double ms = test_long() ? 10000 : 1500;
  pid_t kids[6];
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  for (int i = 0; i < 6; i++) {
    fflush(NULL);
    kids[i] = fork();
    if (kids[i] != 0) continue;
    kvc_client_t *kc = open_small(&d);
    kvc_cache_t *kh;
    if (kvc_cache_open(kc, "cw", &l, &kh)) _exit(3);
    double t0 = hard_now_ms();
    uint64_t n = 0, versions_seen = 0;
    float last = 0;
    while (hard_now_ms() - t0 < ms) {
      if (i < 4) {
        fill_version(k, v, &l, 64, (float)(i + 1) * 1e6f + (float)n);
        if (kvc_put(kh, 1, 0, 64, k, v)) _exit(4);
      } else {
        if (kvc_get(kh, 1, 0, 64, k, v)) _exit(5);
        float val = one_version(k, v, &l, 64);
        versions_seen += val != last;
        last = val;
      }
      n++;
    }
    if (i >= 4) {
      char line[64];
      int len = snprintf(line, sizeof line, "%llu %llu\n", (unsigned long long)n,
                         (unsigned long long)versions_seen);
      if (write(pipefd[1], line, (size_t)len) != len) _exit(6);
    }
    _exit(0);
  }
  close(pipefd[1]);
  for (int i = 0; i < 6; i++) {
    int st;
    ASSERT_EQ(waitpid(kids[i], &st, 0), kids[i]);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) TEST_FAIL_("child %d: status %d", i, st);
  }
  char out[256] = {0};
  ASSERT(read(pipefd[0], out, sizeof out - 1) > 0);
  close(pipefd[0]);
  unsigned long long r1, v1, r2, v2;
  ASSERT_EQ(sscanf(out, "%llu %llu\n%llu %llu", &r1, &v1, &r2, &v2), 4);
  fprintf(stderr, "reads %llu + %llu, distinct versions seen in a row %llu + %llu, puts %llu\n",
          r1, r2, v1, v2, (unsigned long long)stat_get(c, "requests_total{op=put}", NULL));
  ASSERT(r1 > 10 && r2 > 10 && v1 > 2 && v2 > 2);
  free(k), free(v);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* The tokens [from, to) of seq read back as pattern(base_seq) below split and
 * pattern(seq) from split on (it_fill_f32, salt 0). */
static void expect_tokens(kvc_cache_t *h, const kvc_layout_t *l, uint64_t seq, uint64_t len,
                          uint64_t split, uint64_t base_seq) {
  size_t row = it_tok_floats(l, false);
  float *k = malloc(row * len * 4), *v = malloc(row * len * 4);
  float *ek = malloc(row * len * 4), *ev = malloc(row * len * 4);
  ASSERT_OK(kvc_get(h, seq, 0, len, k, v));
  size_t lrow = row / l->num_layers;
  for (uint64_t t = 0; t < len; t++) {
    it_fill_f32(ek, ev, l, t < split ? base_seq : seq, t, 1, 0);
    for (uint32_t layer = 0; layer < l->num_layers; layer++) {
      size_t at = (layer * len + t) * lrow;
      if (memcmp(k + at, ek + layer * lrow, lrow * 4) || memcmp(v + at, ev + layer * lrow, lrow * 4))
        TEST_FAIL_("seq %llu token %llu layer %u differs (prefix of %llu up to %llu)",
                   (unsigned long long)seq, (unsigned long long)t, layer,
                   (unsigned long long)base_seq, (unsigned long long)split);
    }
  }
  free(k), free(v), free(ek), free(ev);
}

/* 32 forks of a 40-token parent (two full shared pages and a shared partial
 * one), all pinned, in a 64-page pool: four processes extend the parent and
 * the forks concurrently, so copies on write keep running out of pages
 * (FULL) and trimming makes room again. The shared prefix never changes, a
 * failed write changes nothing, every sequence reads back as written. */
TEST_TIMEOUT(hard_cow_races_under_pressure_keep_prefixes, 120) {
  /* 64 pages, every fork pinned: no pin limit here (and one tenant may use
   * all of it: no fair share of it either). */
  static const char *const args[] = {"--pool-bytes", "1MiB", "--pin-limit-pct", "100",
                                     "--tenant-max-pinned-pct", "100", NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  kvc_client_t *c = open_small(&d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "cow", &l, &h));
  size_t row = it_tok_floats(&l, false);
  float *k = malloc(row * 64 * 4), *v = malloc(row * 64 * 4);
  it_fill_f32(k, v, &l, 1000, 0, 40, 0);
  ASSERT_OK(kvc_put(h, 1000, 0, 40, k, v));
  for (uint64_t f = 0; f < 32; f++) ASSERT_OK(kvc_seq_copy_prefix(h, 1000, f, 40));
  /* Pinned here too: an extender that finishes first releases its own pins,
   * and its sequences must not then be evicted by the others' puts. */
  for (uint64_t f = 0; f < 32; f++) ASSERT_OK(kvc_seq_pin(h, f));
  ASSERT_OK(kvc_seq_pin(h, 1000));
  double ms = test_long() ? 20000 : 2000;
  pid_t kids[4];
  for (int p = 0; p < 4; p++) {
    fflush(NULL);
    kids[p] = fork();
    if (kids[p] != 0) continue;
    kvc_client_t *kc = open_small(&d);
    kvc_cache_t *kh;
    if (kvc_cache_open(kc, "cow", &l, &kh)) _exit(3);
    uint64_t mine[9], len[9];
    int n = 0;
    for (uint64_t f = (uint64_t)p; f < 32; f += 4) mine[n++] = f;
    if (p == 0) mine[n++] = 1000;
    for (int i = 0; i < n; i++) {
      len[i] = 40;
      if (kvc_seq_pin(kh, mine[i])) _exit(4);
    }
    uint64_t x = (uint64_t)p + 1;
    double t0 = hard_now_ms();
    while (hard_now_ms() - t0 < ms) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      int i = (int)((x >> 33) % (uint64_t)n);
      uint64_t s = mine[i], add = 1 + (x >> 40) % 20;
      if ((x >> 20) % 8 == 0 && len[i] > 40) { /* make room: back to the prefix */
        if (kvc_seq_remove(kh, s, 40, UINT64_MAX)) _exit(5);
        len[i] = 40;
        continue;
      }
      if (len[i] + add > 200) continue;
      it_fill_f32(k, v, &l, s == 1000 ? 1000 : s, len[i], add, 0);
      int rc = kvc_put(kh, s, len[i], add, k, v);
      if (rc == 0) len[i] += add;
      else if (rc != KVC_E_FULL) _exit(6);
      kvc_seq_info_t si;
      if (kvc_seq_info(kh, s, &si) || si.length != len[i]) _exit(7);
    }
    _exit(0);
  }
  for (int p = 0; p < 4; p++) {
    int st;
    ASSERT_EQ(waitpid(kids[p], &st, 0), kids[p]);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) TEST_FAIL_("extender %d: status %d", p, st);
  }
  uint64_t full = stat_get(c, "full_errors_total", NULL), cow = stat_get(c, "cow_copies_total", NULL);
  fprintf(stderr, "FULL %llu times, %llu pages copied on write, %llu puts\n",
          (unsigned long long)full, (unsigned long long)cow,
          (unsigned long long)stat_get(c, "requests_total{op=put}", NULL));
  ASSERT(full > 0 && cow > 0);
  for (uint64_t f = 0; f <= 32; f++) {
    uint64_t s = f == 32 ? 1000 : f;
    kvc_seq_info_t si;
    ASSERT_OK(kvc_seq_info(h, s, &si));
    ASSERT(si.length >= 40);
    expect_tokens(h, &l, s, si.length, 40, 1000);
  }
  free(k), free(v);
  kvc_client_close(c);
  daemon_stop(&d);
}
