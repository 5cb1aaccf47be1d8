/* drain.c: the graceful stop. SIGTERM while clients stream requests: every
 * request either completes (its bytes verified) or fails with
 * KVC_E_SHUTDOWN, never anything vaguer, and kvcached exits 0. Requests
 * still unread in the socket when the signal comes are answered too; a
 * client that stops reading cannot hold the exit past drain_timeout_ms; a
 * second signal exits at once. */
#include <sys/ioctl.h>
#include <sys/mman.h>

#include "raw.h"

#define NCLIENTS 4

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Waits until the daemon has paused a connection because its replies pile
 * up (write_pauses, asked on a second connection), then closes that second
 * connection and waits for its disconnect: the stuck connection is then
 * the only one. Beside a client that reads (the second), one that does not
 * waits in the background (doc/protocol.md), so its socket fills once that
 * one is gone: wait until the stuck client's socket holds at least 128 KiB
 * and no more comes (the daemon holds the rest). */
static void wait_write_paused(const daemon_t *d, int stuck) {
  kvc_client_t *c = client_open(d);
  uint64_t pauses = 0;
  for (int i = 0; i < 2000 && (pauses = stat_get(c, "write_pauses_total", NULL)) == 0; i++)
    it_sleep_ms(10);
  ASSERT(pauses >= 1);
  kvc_client_close(c);
  ASSERT(it_log_wait(d, "event=disconnect", 10000));
  int prev = -1, have = 0;
  for (int i = 0; i < 2000; i++, prev = have) {
    ASSERT_EQ(ioctl(stuck, FIONREAD, &have), 0);
    if (have >= (128 << 10) && have == prev) return;
    it_sleep_ms(10);
  }
  TEST_FAIL_("the stuck client's socket holds %d bytes, still growing or under 128 KiB", have);
}

typedef struct progress {
  volatile uint64_t ok;   /* requests completed and verified */
  volatile int last_rc;   /* the code that ended the stream */
} progress_t;

/* One client process: put 4 tokens at position 0 (overwriting), get them
 * back, compare; until a call fails. Exits 0 only if that failure is
 * KVC_E_SHUTDOWN and the next call says the same. */
static void stream(const daemon_t *d, int id, progress_t *p) {
  kvc_client_opts_t o = {.socket_path = d->sock, .shm_bytes = 1 << 20, .timeout_ms = 20000};
  kvc_client_t *c = NULL;
  if (kvc_client_open(&o, &c) != 0) _exit(2);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *cache;
  if (kvc_cache_open(c, "drain", &l, &cache) != 0) _exit(3);
  size_t nk = 4 * it_tok_floats(&l, false), nv = 4 * it_tok_floats(&l, true);
  float *k = malloc(nk * 4), *v = malloc(nv * 4), *k2 = malloc(nk * 4), *v2 = malloc(nv * 4);
  for (uint32_t i = 0;; i++) {
    it_fill_f32(k, v, &l, (uint64_t)id, 0, 4, i);
    int rc = kvc_put(cache, (uint64_t)id, 0, 4, k, v);
    if (rc == 0) {
      p->ok++;
      rc = kvc_get(cache, (uint64_t)id, 0, 4, k2, v2);
      if (rc == 0 && (memcmp(k, k2, nk * 4) != 0 || memcmp(v, v2, nv * 4) != 0)) {
        fprintf(stderr, "client %d: get %u returned other bytes\n", id, i);
        _exit(4);
      }
      if (rc == 0) p->ok++;
    }
    if (rc != 0) {
      p->last_rc = rc;
      if (rc != KVC_E_SHUTDOWN) {
        fprintf(stderr, "client %d: %s: %s\n", id, kvc_err_name(rc), kvc_client_last_error(c));
        _exit(5);
      }
      int again = kvc_ping(c);
      if (again != KVC_E_SHUTDOWN) {
        fprintf(stderr, "client %d: after SHUTDOWN, ping gave %s\n", id, kvc_err_name(again));
        _exit(6);
      }
      kvc_client_close(c);
      _exit(0);
    }
  }
}

TEST(drain_sigterm_under_a_stream_of_requests) {
  daemon_t d;
  daemon_start(&d);
  progress_t *p = mmap(NULL, sizeof(progress_t) * NCLIENTS, PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT(p != MAP_FAILED);
  memset(p, 0, sizeof(progress_t) * NCLIENTS);
  pid_t kids[NCLIENTS];
  for (int i = 0; i < NCLIENTS; i++) {
    fflush(NULL);
    kids[i] = fork();
    ASSERT(kids[i] >= 0);
    if (kids[i] == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      stream(&d, i + 1, &p[i]);
    }
  }
  /* Everyone is streaming before the signal. */
  for (int i = 0; i < NCLIENTS; i++)
    for (int w = 0; p[i].ok < 50; w++) {
      if (w == 2000) TEST_FAIL_("client %d made %llu requests in 20 s", i, (unsigned long long)p[i].ok);
      it_sleep_ms(10);
    }
  ASSERT_EQ(kill(d.pid, SIGTERM), 0);
  int st;
  ASSERT_EQ(waitpid(d.pid, &st, 0), d.pid);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    it_dump_log(&d);
    TEST_FAIL_("kvcached exit status %d", st);
  }
  for (int i = 0; i < NCLIENTS; i++) {
    ASSERT_EQ(waitpid(kids[i], &st, 0), kids[i]);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
      TEST_FAIL_("client %d ended with status %d (last code %s)", i + 1, st,
                 kvc_err_name(p[i].last_rc));
    ASSERT_ERR(p[i].last_rc, KVC_E_SHUTDOWN);
  }
  ASSERT(it_log_has(&d, "mode=drain"));
  ASSERT(it_log_has(&d, "event=drained"));
  ASSERT(!it_log_has(&d, "runtime error") && !it_log_has(&d, "Sanitizer"));
  ASSERT(access(d.sock, F_OK) != 0);
  munmap(p, sizeof(progress_t) * NCLIENTS);
  char out[256];
  ASSERT_EQ(it_sh(out, sizeof out, "rm -rf '%s'", d.dir), 0);
}

TEST(drain_answers_requests_still_in_the_socket) {
  /* A read buffer of two 1 KiB frames: most pings wait in the socket. */
  static const char *const slow[] = {"--frames-per-turn", "1", "--max-frame-bytes", "1KiB", NULL};
  daemon_t d;
  daemon_start_args(&d, slow);
  int fd = it_connect_raw(d.sock);
  raw_hello(fd, KVC_PROTOCOL_VERSION);
  Kvcache__V1__Response *r = raw_reply(fd);
  ASSERT(r && r->status == KVCACHE__V1__STATUS__OK);
  kvcache__v1__response__free_unpacked(r, NULL);
  /* With the daemon stopped, fill the socket with pings it has not read;
   * the last frame may be cut short by a full socket buffer. */
  ASSERT_EQ(kill(d.pid, SIGSTOP), 0);
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__Ping ping = KVCACHE__V1__PING__INIT;
  req.body_case = KVCACHE__V1__REQUEST__BODY_PING;
  req.ping = &ping;
  /* Batches of frames of one size (ids 200..16383 take two varint bytes). */
  uint64_t complete = 0, id = 200;
  static uint8_t batch[256 * 32];
  for (bool full = false; !full && id + 256 < 16384;) {
    size_t used = 0, fsize = 0;
    for (int i = 0; i < 256; i++, id++) {
      req.id = id;
      size_t n = kvcache__v1__request__get_packed_size(&req);
      ASSERT(fsize == 0 || fsize == 4 + n);
      fsize = 4 + n;
      batch[used] = (uint8_t)n, batch[used + 1] = batch[used + 2] = batch[used + 3] = 0;
      kvcache__v1__request__pack(&req, batch + used + 4);
      used += fsize;
    }
    ssize_t sent = send(fd, batch, used, MSG_NOSIGNAL | MSG_DONTWAIT);
    ASSERT(sent >= 0 || errno == EAGAIN);
    if (sent < 0) sent = 0;
    complete += (uint64_t)sent / fsize;
    full = (size_t)sent < used;
  }
  ASSERT(complete > 256);
  ASSERT_EQ(kill(d.pid, SIGTERM), 0);
  ASSERT_EQ(kill(d.pid, SIGCONT), 0);
  /* Each complete ping is answered in order, then the goodbye, then EOF. */
  for (uint64_t i = 0; i < complete; i++) {
    r = raw_reply(fd);
    if (!r) TEST_FAIL_("reply %llu of %llu missing", (unsigned long long)i, (unsigned long long)complete);
    ASSERT_U64_EQ(r->id, 200 + i);
    ASSERT_EQ(r->status, KVCACHE__V1__STATUS__OK);
    kvcache__v1__response__free_unpacked(r, NULL);
  }
  r = raw_reply(fd);
  ASSERT(r != NULL);
  ASSERT_U64_EQ(r->id, 0);
  ASSERT_EQ(r->status, KVCACHE__V1__STATUS__SHUTDOWN);
  ASSERT_STR_EQ(r->error, "kvcached is shutting down");
  kvcache__v1__response__free_unpacked(r, NULL);
  ASSERT(raw_closed(fd));
  close(fd);
  int st;
  ASSERT_EQ(waitpid(d.pid, &st, 0), d.pid);
  ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  char out[256];
  ASSERT_EQ(it_sh(out, sizeof out, "rm -rf '%s'", d.dir), 0);
}

TEST(drain_timeout_closes_a_client_that_does_not_read) {
  static const char *const quick[] = {"--drain-timeout-ms", "300", "--write-queue-bytes", "64KiB",
                                      NULL};
  daemon_t d;
  daemon_start_args(&d, quick);
  int fd = it_connect_raw(d.sock);
  raw_hello(fd, KVC_PROTOCOL_VERSION);
  Kvcache__V1__Response *r = raw_reply(fd);
  ASSERT(r && r->status == KVCACHE__V1__STATUS__OK);
  kvcache__v1__response__free_unpacked(r, NULL);
  /* Stats replies are large: ask for many and never read them, so the
   * daemon's write queue stays full. */
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__StatsRequest sr = KVCACHE__V1__STATS_REQUEST__INIT;
  req.body_case = KVCACHE__V1__REQUEST__BODY_STATS;
  req.stats = &sr;
  for (uint64_t id = 2; id < 2000; id++) {
    req.id = id;
    size_t n = kvcache__v1__request__get_packed_size(&req);
    uint8_t frame[64];
    frame[0] = (uint8_t)n, frame[1] = frame[2] = frame[3] = 0;
    kvcache__v1__request__pack(&req, frame + 4);
    if (send(fd, frame, 4 + n, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)(4 + n)) break;
  }
  wait_write_paused(&d, fd);
  uint64_t t0 = now_ms();
  ASSERT_EQ(kill(d.pid, SIGTERM), 0);
  int st;
  ASSERT_EQ(waitpid(d.pid, &st, 0), d.pid);
  uint64_t ms = now_ms() - t0;
  ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  ASSERT(ms >= 250 && ms < 5000);
  ASSERT(it_log_has(&d, "event=drain_timeout drain_timeout_ms=300 connections_closed=1"));
  close(fd);
  char out[256];
  ASSERT_EQ(it_sh(out, sizeof out, "rm -rf '%s'", d.dir), 0);
}

TEST(drain_second_signal_exits_at_once) {
  static const char *const slow[] = {"--drain-timeout-ms", "60000", "--write-queue-bytes",
                                     "64KiB", NULL};
  daemon_t d;
  daemon_start_args(&d, slow);
  int fd = it_connect_raw(d.sock);
  raw_hello(fd, KVC_PROTOCOL_VERSION);
  Kvcache__V1__Response *r = raw_reply(fd);
  ASSERT(r && r->status == KVCACHE__V1__STATUS__OK);
  kvcache__v1__response__free_unpacked(r, NULL);
  /* Hold the drain open: a client that never reads its large replies. */
  ASSERT_EQ(kill(d.pid, SIGSTOP), 0);
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__StatsRequest sr = KVCACHE__V1__STATS_REQUEST__INIT;
  req.body_case = KVCACHE__V1__REQUEST__BODY_STATS;
  req.stats = &sr;
  for (uint64_t id = 2; id < 4000; id++) {
    req.id = id;
    size_t n = kvcache__v1__request__get_packed_size(&req);
    uint8_t frame[64];
    frame[0] = (uint8_t)n, frame[1] = frame[2] = frame[3] = 0;
    kvcache__v1__request__pack(&req, frame + 4);
    if (send(fd, frame, 4 + n, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)(4 + n)) break;
  }
  ASSERT_EQ(kill(d.pid, SIGCONT), 0);
  wait_write_paused(&d, fd);
  ASSERT_EQ(kill(d.pid, SIGTERM), 0);
  ASSERT(it_log_wait(&d, "mode=drain", 5000));
  ASSERT_EQ(kill(d.pid, SIGINT), 0);
  int st;
  ASSERT_EQ(waitpid(d.pid, &st, 0), d.pid);
  ASSERT(WIFEXITED(st));
  ASSERT_EQ(WEXITSTATUS(st), 1);
  ASSERT(it_log_has(&d, "mode=immediate"));
  close(fd);
  char out[256];
  ASSERT_EQ(it_sh(out, sizeof out, "rm -rf '%s'", d.dir), 0);
}
