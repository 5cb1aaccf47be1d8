/* startup.c: kvcached's start and stop: options and their errors, a pool
 * that cannot be backed, the socket's mode, a stale socket replaced, a live
 * one respected, and the drain on SIGTERM answering what was sent. */
#include "harness.h"
#include "raw.h"

/* Runs kvcached with args (a shell fragment), returns its exit status and
 * its stdout+stderr in out. */
static int run_daemon(char *out, size_t cap, const char *args) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s/kvcached %s 2>&1", it_build(), args);
  FILE *p = popen(cmd, "r");
  ASSERT(p != NULL);
  it_read_all(p, out, cap);
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

TEST(startup_options_help_version_and_errors) {
  static char out[16384];
  ASSERT_EQ(run_daemon(out, sizeof out, "--help"), 0);
  ASSERT(strstr(out, "--pool-bytes") && strstr(out, "--allow-uids") && strstr(out, "reloadable"));
  ASSERT_EQ(run_daemon(out, sizeof out, "--version"), 0);
  ASSERT(strstr(out, KVC_VERSION_STRING) != NULL);
  ASSERT_EQ(run_daemon(out, sizeof out, "--no-such-option 1"), 2);
  ASSERT(strstr(out, "unknown option") != NULL);
  ASSERT_EQ(run_daemon(out, sizeof out, "--pool-bytes 12XB"), 2);
  ASSERT(strstr(out, "pool_bytes") != NULL);
  ASSERT_EQ(run_daemon(out, sizeof out, "--page-bytes 100"), 2);
  ASSERT(strstr(out, "multiple of 64") != NULL);
  ASSERT_EQ(run_daemon(out, sizeof out, "--max-connections 0"), 2);
  ASSERT(strstr(out, "out of bounds") != NULL);
  ASSERT_EQ(run_daemon(out, sizeof out, "--socket-mode 0999"), 2);
}

TEST(startup_prefix_options) {
  static char out[32768]; /* --help is long */
  ASSERT_EQ(run_daemon(out, sizeof out, "--prefix-hash xxh3"), 2);
  ASSERT(strstr(out, "prefix_single_tenant = true") != NULL);
  ASSERT(strchr(out, '\n') == out + strlen(out) - 1); /* one line */
  ASSERT_EQ(run_daemon(out, sizeof out, "--prefix-hash md5"), 2);
  ASSERT(strstr(out, "sha256 or xxh3") != NULL);
  ASSERT_EQ(run_daemon(out, sizeof out, "--prefix-single-tenant maybe"), 2);
  ASSERT(strstr(out, "true or false") != NULL);
  ASSERT_EQ(run_daemon(out, sizeof out, "--pin-limit-pct 0"), 2);
  ASSERT(strstr(out, "pin_limit_pct") && strstr(out, "out of bounds"));
  ASSERT_EQ(run_daemon(out, sizeof out, "--pin-limit-pct 101"), 2);
  ASSERT_EQ(run_daemon(out, sizeof out, "--help"), 0);
  ASSERT(strstr(out, "--prefix-hash") && strstr(out, "--pin-limit-pct") &&
         strstr(out, "Default 20"));
}

TEST(startup_pool_larger_than_memory_fails_clearly) {
  static char out[4096];
  ASSERT_EQ(run_daemon(out, sizeof out,
                       "--socket /tmp/kvcit-never/k.sock --pool-bytes 64TiB --page-bytes 2MiB"),
            1);
  ASSERT(strstr(out, "MemAvailable") != NULL);
  ASSERT(access("/tmp/kvcit-never/k.sock", F_OK) != 0);
}

TEST(startup_socket_mode_stale_and_live_socket) {
  static const char *const mode[] = {"--socket-mode", "0600", NULL};
  daemon_t d;
  daemon_start_args(&d, mode);
  struct stat st;
  ASSERT_EQ(stat(d.sock, &st), 0);
  ASSERT(S_ISSOCK(st.st_mode));
  ASSERT_EQ(st.st_mode & 0777, 0600);
  /* A second daemon on the same socket refuses to start. */
  static char out[4096];
  char args[256];
  snprintf(args, sizeof args, "--socket '%s' --pool-bytes 4MiB --page-bytes 16KiB", d.sock);
  ASSERT_EQ(run_daemon(out, sizeof out, args), 1);
  ASSERT(strstr(out, "another kvcached is listening") != NULL);
  kvc_client_t *c = client_open(&d);
  ASSERT_OK(kvc_ping(c));
  kvc_client_close(c);
  /* A daemon killed hard leaves its socket file: the next start replaces it. */
  ASSERT_EQ(kill(d.pid, SIGKILL), 0);
  int status;
  ASSERT_EQ(waitpid(d.pid, &status, 0), d.pid);
  ASSERT_EQ(stat(d.sock, &st), 0);
  daemon_t d2;
  static const char *extra[4];
  extra[0] = "--socket", extra[1] = d.sock, extra[2] = NULL;
  daemon_start_args(&d2, extra);
  c = client_open(&d2);
  ASSERT_OK(kvc_ping(c));
  kvc_client_close(c);
  ASSERT(it_log_has(&d2, "event=stale_socket"));
  char rm[160];
  daemon_stop(&d2);
  snprintf(rm, sizeof rm, "rm -rf '%s'", d.dir);
  ASSERT_EQ(system(rm), 0);
}

TEST(startup_sigterm_drains_buffered_requests) {
  static const char *const slow[] = {"--frames-per-turn", "1", NULL};
  daemon_t d;
  daemon_start_args(&d, slow);
  int fd = it_connect_raw(d.sock);
  raw_hello(fd, KVC_PROTOCOL_VERSION);
  Kvcache__V1__Response *r = raw_reply(fd);
  ASSERT(r && r->status == KVCACHE__V1__STATUS__OK);
  kvcache__v1__response__free_unpacked(r, NULL);
  uint8_t burst[200 * 16], *p = burst;
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__Ping ping = KVCACHE__V1__PING__INIT;
  req.body_case = KVCACHE__V1__REQUEST__BODY_PING;
  req.ping = &ping;
  for (uint64_t i = 0; i < 200; i++) {
    req.id = 10 + i;
    size_t n = kvcache__v1__request__get_packed_size(&req);
    p[0] = (uint8_t)n, p[1] = p[2] = p[3] = 0;
    kvcache__v1__request__pack(&req, p + 4);
    p += 4 + n;
  }
  raw_send(fd, burst, (size_t)(p - burst));
  r = raw_reply(fd); /* the daemon has read the burst */
  ASSERT(r && r->id == 10);
  kvcache__v1__response__free_unpacked(r, NULL);
  ASSERT_EQ(kill(d.pid, SIGTERM), 0);
  for (uint64_t i = 1; i < 200; i++) {
    r = raw_reply(fd);
    ASSERT(r != NULL);
    ASSERT_U64_EQ(r->id, 10 + i);
    kvcache__v1__response__free_unpacked(r, NULL);
  }
  r = raw_reply(fd); /* the goodbye: id 0, SHUTDOWN */
  ASSERT(r != NULL);
  ASSERT_U64_EQ(r->id, 0);
  ASSERT_EQ(r->status, KVCACHE__V1__STATUS__SHUTDOWN);
  kvcache__v1__response__free_unpacked(r, NULL);
  ASSERT(raw_closed(fd));
  close(fd);
  int st;
  ASSERT_EQ(waitpid(d.pid, &st, 0), d.pid);
  ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  ASSERT(!it_log_has(&d, "runtime error") && !it_log_has(&d, "Sanitizer"));
  ASSERT(it_log_has(&d, "mode=drain"));
  ASSERT(access(d.sock, F_OK) != 0);
  char rm[160];
  snprintf(rm, sizeof rm, "rm -rf '%s'", d.dir);
  ASSERT_EQ(system(rm), 0);
}

/* A large pool takes seconds to back (11.8 s for 4 GiB on one VM): the
 * start says so at once (and how far it is, a line a second), and a SIGTERM
 * meanwhile ends the daemon cleanly, exit 0 (it was killed, status 143,
 * having printed nothing). Arenas: a segment at a time, 128 of 32 MiB. */
TEST(startup_sigterm_while_the_pool_is_backed_exits_0) {
  daemon_t d;
  const char *extra[] = {"--page-bytes", "0", "--pool-bytes", "4GiB", "--pool-huge-pages",
                         "false", NULL};
  daemon_spawn(&d, NULL, extra, NULL);
  ASSERT(it_log_wait(&d, "event=pool_prefault bytes=4294967296 state=start", 20000));
  ASSERT_EQ(kill(d.pid, SIGTERM), 0);
  int st;
  ASSERT(waitpid(d.pid, &st, 0) == d.pid);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) it_dump_log(&d);
  ASSERT(WIFEXITED(st));
  ASSERT_EQ(WEXITSTATUS(st), 0);
  ASSERT(it_log_has(&d, "event=exit status=0 reason=\"stopped while starting"));
  ASSERT(!it_log_has(&d, "Sanitizer") && !it_log_has(&d, "runtime error"));
  char cmd[160];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", d.dir);
  ASSERT(system(cmd) == 0);
}
