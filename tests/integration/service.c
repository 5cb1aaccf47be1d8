/* service.c: kvcached under systemd, for real where it can be: the units
 * pass `systemd-analyze verify` and score an exposure of 2.0 or lower,
 * systemd-socket-activate hands the daemon its socket, a fake NOTIFY_SOCKET
 * hears READY=1 (only once the socket accepts), STATUS=, RELOADING=1 and
 * STOPPING=1, and peers are admitted by a supplementary group. */
#include <grp.h>

#include "harness.h"

static bool have_tool(const char *tool) {
  char out[256];
  return it_sh(out, sizeof out, "command -v %s", tool) == 0;
}

static void tmpdir(char *dir, size_t len) {
  snprintf(dir, len, "/tmp/kvcit-XXXXXX");
  ASSERT(mkdtemp(dir) != NULL);
}

static void rmdir_all(const char *dir) {
  char out[256];
  ASSERT_EQ(it_sh(out, sizeof out, "rm -rf '%s'", dir), 0);
}

/* `make install` of the build under test with PREFIX=dir/usr: the unit's
 * ExecStart= then names a binary that exists, as verify requires. */
static void install_prefix(const char *dir) {
  static char out[16384];
  bool asan = strstr(it_build(), "asan") != NULL;
  int rc = it_sh(out, sizeof out,
                 "env -u MAKEFLAGS -u MAKELEVEL -u MFLAGS make -s -C '%s' install B='%s' %s "
                 "PREFIX='%s/usr' SYSCONFDIR='%s/etc'",
                 it_srcdir(), it_build(), asan ? "SANITIZE=1" : "", dir, dir);
  if (rc != 0) TEST_FAIL_("make install failed (%d): %s", rc, out);
}

TEST(service_units_pass_systemd_analyze_verify) {
  if (!have_tool("systemd-analyze")) TEST_SKIP("systemd-analyze not installed (make deps)");
  static char out[16384];
  char dir[64], units[128];
  tmpdir(dir, sizeof dir);
  install_prefix(dir);
  snprintf(units, sizeof units, "%s/usr/lib/systemd/system", dir);
  /* Documentation=man:kvcached(8) is checked with man(1) against the
   * installed page; without man(1) that one check is turned off. */
  const char *man = have_tool("man") ? "" : "--man=no";
  int rc = it_sh(out, sizeof out,
                 "MANPATH='%s/usr/share/man' systemd-analyze verify %s '%s/kvcached.socket' "
                 "'%s/kvcached.service'", dir, man, units, units);
  /* A host without the kvcached user may get a note about it; anything
   * else said about the units is a failure. */
  for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n"))
    if (strstr(line, "kvcached") && !strstr(line, "user") && !strstr(line, "User"))
      TEST_FAIL_("systemd-analyze verify: %s", line);
  ASSERT_EQ(rc, 0);
  ASSERT_EQ(it_sh(out, sizeof out, "grep -x 'ExecStart=%s/usr/bin/kvcached' '%s/kvcached.service'",
                  dir, units), 0);
  /* The check can fail: a unit whose binary is missing does. */
  ASSERT_EQ(it_sh(out, sizeof out,
                  "mkdir -p %s/bad && sed 's|^ExecStart=.*|ExecStart=%s/nonexistent/kvcached|' "
                  "'%s/kvcached.service' > %s/bad/kvcached.service && cp '%s/kvcached.socket' %s/bad/",
                  dir, dir, units, dir, units, dir), 0);
  ASSERT(it_sh(out, sizeof out, "systemd-analyze verify --man=no %s/bad/kvcached.service", dir) != 0);
  ASSERT(strstr(out, "nonexistent") != NULL);
  rmdir_all(dir);
}

/* The network drop-in (systemd/kvcached-network.conf, for the cluster tier,
 * a tcp:// event endpoint or a metrics port): the unit with it verifies, it
 * gives the network back (systemd-analyze security reads drop-ins beside the
 * unit), keeps an IP allow list, and the exposure stays at most 2.0. */
TEST(service_network_drop_in_lifts_the_network_only) {
  if (!have_tool("systemd-analyze")) TEST_SKIP("systemd-analyze not installed (make deps)");
  static char out[32768];
  char dir[64];
  tmpdir(dir, sizeof dir);
  install_prefix(dir);
  ASSERT_EQ(it_sh(out, sizeof out,
                  "mkdir -p %s/u/kvcached.service.d && cp %s/usr/lib/systemd/system/kvcached.* %s/u/ "
                  "&& cp %s/usr/share/doc/kvcached/kvcached-network.conf "
                  "%s/u/kvcached.service.d/network.conf",
                  dir, dir, dir, dir, dir), 0);
  ASSERT_EQ(it_sh(out, sizeof out, "systemd-analyze verify --man=no '%s/u/kvcached.socket' "
                                   "'%s/u/kvcached.service'", dir, dir), 0);
  for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n"))
    if (strstr(line, "kvcached") && !strstr(line, "user") && !strstr(line, "User"))
      TEST_FAIL_("systemd-analyze verify with the drop-in: %s", line);
  ASSERT_EQ(it_sh(out, sizeof out, "systemd-analyze security --offline=true --no-pager "
                                   "'%s/u/kvcached.service'", dir), 0);
  ASSERT(strstr(out, "Service has access to the host's network") != NULL);
  ASSERT(strstr(out, "Service may allocate Internet sockets") != NULL);
  ASSERT(strstr(out, "Service blocks all IP address ranges") == NULL);
  ASSERT(strstr(out, "Service cannot allocate packet sockets") != NULL); /* the rest stays */
  const char *p = strstr(out, "Overall exposure level for kvcached.service: ");
  if (!p) TEST_FAIL_("no overall exposure in: %s", out);
  double exposure = atof(p + strlen("Overall exposure level for kvcached.service: "));
  if (exposure > 2.0) TEST_FAIL_("exposure with the drop-in %.1f > 2.0:\n%s", exposure, out);
  rmdir_all(dir);
}

TEST(service_security_exposure_at_most_2) {
  if (!have_tool("systemd-analyze")) TEST_SKIP("systemd-analyze not installed (make deps)");
  static char out[32768];
  char unit[256];
  snprintf(unit, sizeof unit, "%s/systemd/kvcached.service", it_srcdir());
  ASSERT_EQ(it_sh(out, sizeof out, "systemd-analyze security --offline=true --no-pager '%s'", unit), 0);
  const char *p = strstr(out, "Overall exposure level for kvcached.service: ");
  if (!p) TEST_FAIL_("no overall exposure in: %s", out);
  double exposure = atof(p + strlen("Overall exposure level for kvcached.service: "));
  fprintf(stderr, "exposure %.1f\n", exposure);
  if (exposure > 2.0) TEST_FAIL_("exposure %.1f > 2.0:\n%s", exposure, out);
  /* The directives the issue names, each present; no DynamicUser/RemoveIPC. */
  static const char *const need[] = {
      "Type=notify", "ExecReload=/bin/kill -HUP $MAINPID", "User=kvcached", "Group=kvcached",
      "RuntimeDirectory=kvcached", "NoNewPrivileges=yes", "ProtectSystem=strict",
      "ProtectHome=yes", "PrivateTmp=yes", "PrivateDevices=yes",
      "RestrictAddressFamilies=AF_UNIX", "MemoryDenyWriteExecute=yes", "LockPersonality=yes",
      "RestrictNamespaces=yes", "SystemCallArchitectures=native",
      "SystemCallFilter=@system-service", "SystemCallFilter=~@privileged @resources"};
  for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
    if (it_sh(out, sizeof out, "grep -qxF '%s' '%s'", need[i], unit) != 0)
      TEST_FAIL_("kvcached.service lacks %s", need[i]);
  ASSERT(it_sh(out, sizeof out, "grep -E '^(DynamicUser|RemoveIPC)=' '%s'", unit) != 0);
  /* The filter keeps what the daemon needs: memfd_create (@ipc), fallocate
   * (@file-system), sendmsg (@network-io) are in @system-service and not in
   * the sets taken away. */
  ASSERT_EQ(it_sh(out, sizeof out, "systemd-analyze syscall-filter @system-service | "
                                   "grep -qxE ' *@(ipc|file-system|network-io)' && "
                                   "systemd-analyze syscall-filter @ipc | grep -qx ' *memfd_create' && "
                                   "systemd-analyze syscall-filter @file-system | grep -qx ' *fallocate' && "
                                   "systemd-analyze syscall-filter @network-io | grep -qx ' *sendmsg'"), 0);
  ASSERT(it_sh(out, sizeof out, "systemd-analyze syscall-filter @privileged @resources | "
                                "grep -xE ' *(memfd_create|fallocate|sendmsg|recvmsg|mmap)'") != 0);
  /* The socket unit: the path, mode and group the issue names. */
  snprintf(unit, sizeof unit, "%s/systemd/kvcached.socket", it_srcdir());
  ASSERT_EQ(it_sh(out, sizeof out, "grep -qx 'ListenStream=/run/kvcached/kvcached.sock' '%s' && "
                                   "grep -qx 'SocketMode=0660' '%s' && grep -qx 'SocketGroup=kvcached' '%s'",
                  unit, unit, unit), 0);
}

TEST(service_sysusers_creates_the_user) {
  if (!have_tool("systemd-sysusers")) TEST_SKIP("systemd-sysusers not installed (make deps)");
  static char out[4096];
  char dir[64];
  tmpdir(dir, sizeof dir);
  ASSERT_EQ(it_sh(out, sizeof out, "mkdir -p %s/etc && cp %s/systemd/kvcached.sysusers %s/k.conf && "
                                   "systemd-sysusers --root=%s %s/k.conf && grep '^kvcached:' %s/etc/passwd "
                                   "&& grep '^kvcached:' %s/etc/group",
                  dir, it_srcdir(), dir, dir, dir, dir, dir), 0);
  ASSERT(strstr(out, "/usr/sbin/nologin") != NULL);
  rmdir_all(dir);
}

/* A put and a get of 3 tokens through a fresh client on sock. */
static void put_get_roundtrip(const char *sock) {
  kvc_client_opts_t o = {.socket_path = sock, .shm_bytes = 1 << 20, .timeout_ms = 20000};
  kvc_client_t *c = NULL;
  int rc = kvc_client_open(&o, &c);
  if (rc) TEST_FAIL_("kvc_client_open %s: %s: %s", sock, kvc_err_name(rc), kvc_client_open_error());
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *cache;
  ASSERT_OK(kvc_cache_open(c, "svc", &l, &cache));
  size_t nk = 3 * it_tok_floats(&l, false), nv = 3 * it_tok_floats(&l, true);
  float *k = calloc(nk, 4), *v = calloc(nv, 4), *k2 = calloc(nk, 4), *v2 = calloc(nv, 4);
  it_fill_f32(k, v, &l, 7, 0, 3, 1);
  ASSERT_OK(kvc_put(cache, 7, 0, 3, k, v));
  ASSERT_OK(kvc_get(cache, 7, 0, 3, k2, v2));
  ASSERT_MEM_EQ(k2, k, nk * 4);
  ASSERT_MEM_EQ(v2, v, nv * 4);
  free(k), free(v), free(k2), free(v2);
  kvc_client_close(c);
}

TEST(service_socket_activation_serves_on_the_inherited_socket) {
  if (!have_tool("systemd-socket-activate"))
    TEST_SKIP("systemd-socket-activate not installed (make deps)");
  daemon_t d;
  memset(&d, 0, sizeof d);
  tmpdir(d.dir, sizeof d.dir);
  char ignored[128], bin[256];
  snprintf(d.sock, sizeof d.sock, "%s/activated.sock", d.dir);
  snprintf(d.log, sizeof d.log, "%s/kvcached.log", d.dir);
  snprintf(ignored, sizeof ignored, "%s/configured.sock", d.dir);
  snprintf(bin, sizeof bin, "%s/kvcached", it_build());
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int log = open(d.log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(log, 2);
    dup2(log, 1);
    execlp("systemd-socket-activate", "systemd-socket-activate", "-l", d.sock, bin,
           "--socket", ignored, "--pool-bytes", "8MiB", "--page-bytes", "16KiB",
           "--shm-default-bytes", "4MiB", "--log-level", "debug", (char *)NULL);
    _exit(127);
  }
  d.pid = pid;
  /* systemd-socket-activate listens at once and execs kvcached on the
   * first connection, which kvcached then accepts. */
  for (int i = 0; i < 1000 && access(d.sock, F_OK) != 0; i++) it_sleep_ms(10);
  put_get_roundtrip(d.sock);
  char cmd[512];
  snprintf(cmd, sizeof cmd, "event=socket_activation fd=3 socket=%s configured_socket=%s", d.sock,
           ignored);
  if (!it_log_has(&d, cmd)) {
    it_dump_log(&d);
    TEST_FAIL_("no '%s' in the log", cmd);
  }
  ASSERT(it_log_has(&d, "the configured socket path is ignored"));
  ASSERT(it_log_has(&d, "source=systemd"));
  ASSERT(access(ignored, F_OK) != 0);
  static char out[16384];
  ASSERT_EQ(ctl_run(&d, out, sizeof out, true, "stats"), 0);
  ASSERT(strstr(out, "connections_current") != NULL);
  /* kvcached is the same process (exec): SIGTERM drains and exits 0, and
   * leaves systemd's socket file in place for the next start. */
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  int st;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    it_dump_log(&d);
    TEST_FAIL_("kvcached exit status %d", st);
  }
  ASSERT(access(d.sock, F_OK) == 0);
  ASSERT(!it_log_has(&d, "runtime error") && !it_log_has(&d, "Sanitizer"));
  rmdir_all(d.dir);
}

/* Runs kvcached with fd 3 made by make_fd and LISTEN_FDS/LISTEN_PID set (pid
 * 0: its own). Returns its exit status; its stderr goes to out. */
static int run_with_fd3(char *out, size_t cap, int fd3, const char *nfds, bool own_pid,
                        const char *sock) {
  char bin[256], log[128], dir[64];
  tmpdir(dir, sizeof dir);
  snprintf(bin, sizeof bin, "%s/kvcached", it_build());
  snprintf(log, sizeof log, "%s/log", dir);
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    char pidenv[32];
    snprintf(pidenv, sizeof pidenv, "%d", own_pid ? (int)getpid() : 1);
    setenv("LISTEN_PID", pidenv, 1);
    setenv("LISTEN_FDS", nfds, 1);
    if (fd3 != 3) dup2(fd3, 3);
    int l = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(l, 2);
    dup2(l, 1);
    execl(bin, bin, "--socket", sock, "--pool-bytes", "4MiB", "--page-bytes", "16KiB", (char *)NULL);
    _exit(127);
  }
  /* A daemon that did start is asked to stop once its socket accepts. */
  int st = 0;
  for (int i = 0; i < 1000; i++) {
    if (waitpid(pid, &st, WNOHANG) == pid) break;
    int fd = it_connect_raw(sock);
    if (fd >= 0) {
      close(fd);
      kill(pid, SIGTERM);
      ASSERT_EQ(waitpid(pid, &st, 0), pid);
      break;
    }
    it_sleep_ms(10);
  }
  it_sh(out, cap, "cat %s", log);
  rmdir_all(dir);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

TEST(service_socket_activation_rejects_unusable_sockets) {
  static char out[8192];
  char dir[64], sock[128];
  tmpdir(dir, sizeof dir);
  snprintf(sock, sizeof sock, "%s/k.sock", dir);
  int dgram = socket(AF_UNIX, SOCK_DGRAM, 0);
  ASSERT(dgram >= 0);
  ASSERT_EQ(run_with_fd3(out, sizeof out, dgram, "1", true, sock), 1);
  ASSERT(strstr(out, "is not a listening Unix stream socket") != NULL);
  int stream = socket(AF_UNIX, SOCK_STREAM, 0); /* not listening */
  ASSERT_EQ(run_with_fd3(out, sizeof out, stream, "1", true, sock), 1);
  ASSERT(strstr(out, "listening 0") != NULL);
  ASSERT_EQ(run_with_fd3(out, sizeof out, stream, "2", true, sock), 1);
  ASSERT(strstr(out, "passed 2 sockets") != NULL);
  /* LISTEN_PID of another process: not ours, so the configured path is bound. */
  ASSERT_EQ(run_with_fd3(out, sizeof out, stream, "1", false, sock), 0);
  ASSERT(strstr(out, "source=config") != NULL);
  ASSERT(access(sock, F_OK) != 0);
  close(dgram);
  close(stream);
  rmdir_all(dir);
}

/* The fake systemd: a datagram socket at addr ("/path" or "@abstract"). */
static int notify_listen(const char *addr) {
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT(fd >= 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  size_t len = strlen(addr);
  memcpy(sa.sun_path, addr, len);
  socklen_t sl = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
  if (addr[0] == '@') sa.sun_path[0] = '\0';
  else sl++;
  ASSERT_EQ(bind(fd, (struct sockaddr *)&sa, sl), 0);
  struct timeval tv = {10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

/* The next datagram, NUL-terminated; the test fails after 10 s. */
static void notify_recv(int fd, char *buf, size_t cap) {
  ssize_t n = recv(fd, buf, cap - 1, 0);
  if (n < 0) TEST_FAIL_("no datagram on NOTIFY_SOCKET within 10 s: %s", strerror(errno));
  buf[n] = '\0';
}

/* Skips datagrams until one starting with prefix; returns in buf. */
static void notify_expect(int fd, const char *prefix, char *buf, size_t cap) {
  for (int i = 0; i < 200; i++) {
    notify_recv(fd, buf, cap);
    if (strncmp(buf, prefix, strlen(prefix)) == 0) return;
    if (strncmp(buf, "STATUS=", 7) != 0) TEST_FAIL_("expected %s..., got \"%s\"", prefix, buf);
  }
  TEST_FAIL_("no %s datagram", prefix);
}

static void notify_scenario(const char *addr, int nfd) {
  char env[160], buf[1024];
  snprintf(env, sizeof env, "NOTIFY_SOCKET=%s", addr);
  const char *const envs[] = {env, NULL};
  const char *const extra[] = {"--status-interval-ms", "100", NULL};
  daemon_t d;
  daemon_spawn(&d, NULL, extra, envs);
  /* The first word from the daemon is READY=1, and by then it accepts. */
  notify_recv(nfd, buf, sizeof buf);
  int fd = it_connect_raw(d.sock);
  if (strncmp(buf, "READY=1\n", 8) != 0) TEST_FAIL_("first datagram \"%s\"", buf);
  if (fd < 0) TEST_FAIL_("READY=1 before %s accepts", d.sock);
  close(fd);
  ASSERT(strstr(buf, "STATUS=") != NULL);
  /* STATUS= with live figures, every status_interval_ms. */
  kvc_client_t *c = client_open(&d);
  for (int i = 0; i < 100 && !strstr(buf, "1 clients"); i++) /* older ones may be queued */
    notify_expect(nfd, "STATUS=", buf, sizeof buf);
  ASSERT(strstr(buf, "1 clients") && strstr(buf, "pages 0/512 used") && strstr(buf, "requests"));
  /* A reload: RELOADING=1 with the monotonic time, then READY=1. */
  ASSERT_EQ(kill(d.pid, SIGHUP), 0);
  notify_expect(nfd, "RELOADING=1\nMONOTONIC_USEC=", buf, sizeof buf);
  ASSERT(strtoull(buf + strlen("RELOADING=1\nMONOTONIC_USEC="), NULL, 10) > 0);
  notify_expect(nfd, "READY=1", buf, sizeof buf);
  kvc_client_close(c);
  /* SIGTERM: STOPPING=1, then exit 0. */
  ASSERT_EQ(kill(d.pid, SIGTERM), 0);
  notify_expect(nfd, "STOPPING=1", buf, sizeof buf);
  int st;
  ASSERT_EQ(waitpid(d.pid, &st, 0), d.pid);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    it_dump_log(&d);
    TEST_FAIL_("kvcached exit status %d", st);
  }
  ASSERT(!it_log_has(&d, "runtime error") && !it_log_has(&d, "Sanitizer"));
  rmdir_all(d.dir);
}

TEST(service_notify_ready_status_reloading_stopping) {
  char dir[64], addr[128];
  tmpdir(dir, sizeof dir);
  snprintf(addr, sizeof addr, "%s/notify", dir);
  int nfd = notify_listen(addr);
  notify_scenario(addr, nfd);
  close(nfd);
  rmdir_all(dir);
}

TEST(service_notify_abstract_socket) {
  char addr[64];
  snprintf(addr, sizeof addr, "@kvcit-notify-%d", (int)getpid());
  int nfd = notify_listen(addr);
  notify_scenario(addr, nfd);
  close(nfd);
}

/* In a child: become uid/gid 5000 with the given supplementary groups, open
 * a client; exits 0 if the outcome is want (0 or a KVC_E_* code). */
static void child_connects(const char *sock, gid_t *groups, size_t ngroups, int want) {
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    if (setgroups(ngroups, groups) != 0 || setgid(5000) != 0 || setuid(5000) != 0) _exit(3);
    kvc_client_opts_t o = {.socket_path = sock, .shm_bytes = 1 << 20, .timeout_ms = 10000};
    kvc_client_t *c = NULL;
    int rc = kvc_client_open(&o, &c);
    kvc_client_close(c);
    if (rc != want) fprintf(stderr, "uid 5000: got %s, expected %s\n", kvc_err_name(rc), kvc_err_name(want));
    _exit(rc == want ? 0 : 1);
  }
  int st;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT(WIFEXITED(st));
  ASSERT_EQ(WEXITSTATUS(st), 0);
}

TEST(service_peer_admitted_by_supplementary_group) {
  if (geteuid() != 0) TEST_SKIP("needs root to run a client as another uid with groups");
  const char *const extra[] = {"--allow-uids", "root", "--allow-gids", "4242", "--socket-mode",
                               "0666", NULL};
  daemon_t d;
  daemon_start_args(&d, extra);
  ASSERT_EQ(chmod(d.dir, 0755), 0);
  gid_t member[] = {4242};
  child_connects(d.sock, member, 1, 0);
  child_connects(d.sock, NULL, 0, KVC_E_PERM);
  kvc_client_t *c = client_open(&d);
  ASSERT_U64_EQ(stat_get(c, "connections_rejected_total", NULL), 1);
  kvc_client_close(c);
  daemon_stop(&d);
}
