/* startup.c: kvcached's start and stop: options and their errors, a pool
 * that cannot be backed, the socket's mode, a stale socket replaced, a live
 * one respected, and the drain on SIGTERM answering what was sent. */
#include <grp.h>

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
  /* Sizes in the units the options take (they were byte counts). */
  ASSERT_EQ(run_daemon(out, sizeof out, "--pool-bytes 100 --check-config"), 2);
  ASSERT(strstr(out, "pool_bytes: 100 out of bounds [1MiB, 64TiB]") != NULL);
  ASSERT_EQ(run_daemon(out, sizeof out, "--pool-bytes 64TiB --check-config"), 2);
  ASSERT(strstr(out, "segment_bytes: 32MiB makes more than 4096 segments of pool_bytes 64TiB"));
  ASSERT_EQ(run_daemon(out, sizeof out, "--pool-bytes 1GiB --pool-reserve-bytes 512MiB "
                                        "--check-config"), 2);
  ASSERT(strstr(out, "pool_reserve_bytes: 512MiB is less than pool_bytes 1GiB") != NULL);
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
  ASSERT(strstr(out, "a pool of 64TiB exceeds the memory available (MemAvailable ") != NULL);
  for (const char *p = out; *p; p++) /* no byte count of 10 digits and more */
    if (strspn(p, "0123456789") >= 10) TEST_FAIL_("a raw byte count: %s", out);
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

/* ---- the default socket: kvcached's and its clients' ------------------------ */

#define SOCK_UID 64131

/* Runs argv as uid (0: as we are) with KVCACHED_SOCKET and XDG_RUNTIME_DIR
 * unset, then the "NAME=value" strings of env set; stdout and stderr into
 * log. Returns the child's pid. */
static pid_t spawn_as(uid_t uid, const char *const *env, const char *const *argv,
                      const char *log) {
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid != 0) return pid;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0666);
  if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0) _exit(90);
  if (uid && (setgroups(0, NULL) != 0 || setresgid(uid, uid, uid) != 0 ||
              setresuid(uid, uid, uid) != 0))
    _exit(91);
  unsetenv("KVCACHED_SOCKET");
  unsetenv("XDG_RUNTIME_DIR");
  for (int i = 0; env[i]; i++) putenv((char *)env[i]);
  execv(argv[0], (char *const *)argv);
  _exit(92);
}

static int wait_exit(pid_t pid) {
  int st;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* kvcachectl ping as uid with env, no --socket: its exit status, its output
 * in out. */
static int ping_as(uid_t uid, const char *const *env, const char *dir, char *out, size_t cap) {
  char bin[256], log[256];
  snprintf(bin, sizeof bin, "%s/kvcachectl", it_build());
  snprintf(log, sizeof log, "%s/ctl.log", dir);
  const char *const argv[] = {bin, "ping", NULL};
  int rc = wait_exit(spawn_as(uid, env, argv, log));
  ASSERT_EQ(it_sh(out, cap, "cat '%s'", log), 0);
  return rc;
}

/* kvcached started with no --socket as uid with env: waits until path
 * accepts; returns its pid. */
static pid_t daemon_as(uid_t uid, const char *const *env, const char *dir, const char *path) {
  char bin[256], log[256];
  snprintf(bin, sizeof bin, "%s/kvcached", it_build());
  snprintf(log, sizeof log, "%s/kvcached.log", dir);
  const char *const argv[] = {bin, "--pool-bytes", "64MiB", "--socket-mode", "0600", NULL};
  pid_t pid = spawn_as(uid, env, argv, log);
  for (uint64_t t0 = it_mono_ms(); it_mono_ms() - t0 < IT_WAIT_MS; it_sleep_ms(5)) {
    int fd = it_connect_raw(path);
    if (fd >= 0) {
      close(fd);
      return pid;
    }
    if (waitpid(pid, NULL, WNOHANG) == pid) break;
  }
  char out[4096];
  it_sh(out, sizeof out, "cat '%s'", log);
  TEST_FAIL_("kvcached (uid %u) did not listen on %s: %s", (unsigned)uid, path, out);
  return -1;
}

static void daemon_end(pid_t pid) {
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  ASSERT_EQ(wait_exit(pid), 0);
}

TEST(startup_default_socket_is_where_clients_look) {
  char dir[] = "/tmp/kvcit-XXXXXX", out[4096], path[256], var[300];
  ASSERT(mkdtemp(dir) != NULL);
  ASSERT_EQ(chmod(dir, 0755), 0);
  /* KVCACHED_SOCKET names the socket of both sides. */
  snprintf(path, sizeof path, "%s/named.sock", dir);
  snprintf(var, sizeof var, "KVCACHED_SOCKET=%s", path);
  const char *const named[] = {var, NULL};
  pid_t d = daemon_as(0, named, dir, path);
  ASSERT_EQ(ping_as(0, named, dir, out, sizeof out), 0);
  ASSERT(strncmp(out, "pong from kvcached", 18) == 0);
  daemon_end(d);
  /* Not root, no XDG_RUNTIME_DIR: the daemon's socket is in /tmp/kvcached-UID,
   * and a client whose session has XDG_RUNTIME_DIR finds it there. */
  uid_t uid = geteuid() == 0 ? SOCK_UID : geteuid();
  char tmpdir[64], xdg[128], xvar[160];
  snprintf(tmpdir, sizeof tmpdir, "/tmp/kvcached-%u", (unsigned)uid);
  snprintf(path, sizeof path, "%s/kvcached.sock", tmpdir);
  if (access(path, F_OK) == 0) {
    it_sh(out, sizeof out, "rm -rf '%s'", dir);
    TEST_SKIP("a kvcached of this uid holds /tmp/kvcached-UID");
  }
  /* A root daemon's socket there (`make run` beside the tests, or one left
   * by a daemon killed): the client is refused it (PERM), it does not look
   * on for NOTRUNNING. */
  if (access("/run/kvcached/kvcached.sock", F_OK) == 0) {
    it_sh(out, sizeof out, "rm -rf '%s'", dir);
    TEST_SKIP("a socket is at /run/kvcached/kvcached.sock (make run?)");
  }
  snprintf(xdg, sizeof xdg, "%s/xdg", dir);
  ASSERT_EQ(mkdir(xdg, 0700), 0);
  ASSERT_EQ(chown(xdg, uid, uid), 0);
  snprintf(xvar, sizeof xvar, "XDG_RUNTIME_DIR=%s", xdg);
  const char *const none[] = {NULL}, *const session[] = {xvar, NULL};
  /* Nothing runs: the error names every place looked at and the variable. */
  ASSERT_EQ(ping_as(uid, session, dir, out, sizeof out), 1);
  ASSERT(strstr(out, "NOTRUNNING") && strstr(out, xdg) && strstr(out, path) &&
         strstr(out, "/run/kvcached/kvcached.sock") && strstr(out, "KVCACHED_SOCKET"));
  d = daemon_as(uid, none, dir, path);
  ASSERT_EQ(ping_as(uid, none, dir, out, sizeof out), 0);
  ASSERT_EQ(ping_as(uid, session, dir, out, sizeof out), 0);
  ASSERT(strncmp(out, "pong from kvcached", 18) == 0);
  daemon_end(d);
  if (geteuid() == 0) ASSERT_EQ(it_sh(out, sizeof out, "rm -rf '%s'", tmpdir), 0);
  ASSERT_EQ(it_sh(out, sizeof out, "rm -rf '%s'", dir), 0);
}
