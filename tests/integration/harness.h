/* harness.h: starts the real kvcached for an integration test and drives it
 * through libkvcache and kvcachectl.
 *
 * daemon_start() runs $KVC_BUILD/kvcached (build or build-asan) on a socket in
 * a fresh mkdtemp directory with a small pool, its stderr in a log file there,
 * and waits until the socket accepts. The daemon dies with the test process
 * (PR_SET_PDEATHSIG), so a failing test leaves nothing running.
 * daemon_stop() sends SIGTERM, expects exit status 0 and a log free of
 * sanitizer reports. The daemon runs with KVCACHED_TEST_AUDIT=1: it audits
 * the engine after every request and aborts on a violation.
 */
#ifndef KVC_IT_HARNESS_H
#define KVC_IT_HARNESS_H

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvcache/kvcache.h"
#include "test.h"

#define IT_UNUSED __attribute__((unused))

typedef struct daemon {
  pid_t pid;
  char dir[64];    /* the temporary directory */
  char sock[100];  /* its socket */
  char log[128];   /* its stderr */
} daemon_t;

/* Non-zero: the daemons spawned get this RLIMIT_NOFILE, soft and hard. */
IT_UNUSED static rlim_t it_daemon_nofile;

IT_UNUSED static const char *it_build(void) {
  const char *b = getenv("KVC_BUILD");
  return b && *b ? b : "build";
}

IT_UNUSED static void it_sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* A test gate (daemon/testhook.h): makes a fresh directory under /tmp
 * (its path into dir) with its FIFOs reached and go, and env, the daemon's
 * environment line var=dir. */
#define IT_GATE_DIR 32
IT_UNUSED static void it_gate_open(char dir[IT_GATE_DIR], const char *var, char *env,
                                   size_t envlen) {
  char fifo[300];
  snprintf(dir, IT_GATE_DIR, "/tmp/kvcgate-%s", "XXXXXX"); /* mkdtemp's pattern */
  if (mkdtemp(dir) == NULL) TEST_FAIL_("mkdtemp %s: %s", dir, strerror(errno));
  snprintf(fifo, sizeof fifo, "%s/reached", dir);
  if (mkfifo(fifo, 0600) != 0) TEST_FAIL_("mkfifo %s: %s", fifo, strerror(errno));
  snprintf(fifo, sizeof fifo, "%s/go", dir);
  if (mkfifo(fifo, 0600) != 0) TEST_FAIL_("mkfifo %s: %s", fifo, strerror(errno));
  snprintf(env, envlen, "%s=%s", var, dir);
}

/* Removes the gate's FIFOs and its directory. */
IT_UNUSED static void it_gate_close(const char *dir) {
  char fifo[300];
  snprintf(fifo, sizeof fifo, "%s/reached", dir);
  unlink(fifo);
  snprintf(fifo, sizeof fifo, "%s/go", dir);
  unlink(fifo);
  rmdir(dir);
}

/* Opens the gate's FIFO dir/name, reads (reached: the daemon is there) or
 * writes (go: it goes on) one byte. */
IT_UNUSED static void it_gate(const char *dir, const char *name, bool write_it) {
  char path[300];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  int fd = open(path, write_it ? O_WRONLY : O_RDONLY);
  if (fd < 0) TEST_FAIL_("open %s: %s", path, strerror(errno));
  char b = 'g';
  if ((write_it ? write(fd, &b, 1) : read(fd, &b, 1)) != 1) TEST_FAIL_("gate %s", path);
  close(fd);
}


/* A raw connection to the daemon's socket; -1 if it does not accept. */
IT_UNUSED static int it_connect_raw(const char *path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) return fd;
  if (fd >= 0) close(fd);
  return -1;
}

IT_UNUSED static void it_dump_log(const daemon_t *d) {
  FILE *f = fopen(d->log, "r");
  char line[1024];
  if (!f) return;
  fprintf(stderr, "---- kvcached log (%s) ----\n", d->log);
  while (fgets(line, sizeof line, f)) fputs(line, stderr);
  fclose(f);
}

/* Runs the kvcached binary bin (NULL: $KVC_BUILD/kvcached) with the test
 * defaults, then the NULL-terminated extra flags (later flags win; a
 * --socket among them is the one waited on), with the NULL-terminated
 * "NAME=value" strings of env added to its environment. Does not wait. */
IT_UNUSED static void daemon_spawn(daemon_t *d, const char *bin, const char *const *extra,
                                   const char *const *env) {
  memset(d, 0, sizeof *d);
  snprintf(d->dir, sizeof d->dir, "/tmp/kvcit-XXXXXX");
  ASSERT(mkdtemp(d->dir) != NULL);
  snprintf(d->sock, sizeof d->sock, "%s/kvcached.sock", d->dir);
  snprintf(d->log, sizeof d->log, "%s/kvcached.log", d->dir);
  char def[256];
  snprintf(def, sizeof def, "%s/kvcached", it_build());
  if (!bin) bin = def;
  const char *argv[64] = {bin, "--socket", d->sock, "--pool-bytes", "8MiB",
                          "--page-bytes", "16KiB", "--shm-default-bytes", "4MiB",
                          "--log-level", "debug"};
  int argc = 11;
  for (int i = 0; extra && extra[i] && argc < 62; i++) {
    argv[argc++] = extra[i];
    if (strcmp(extra[i], "--socket") == 0 && extra[i + 1])
      snprintf(d->sock, sizeof d->sock, "%s", extra[i + 1]); /* wait on that one */
  }
  argv[argc] = NULL;
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (it_daemon_nofile) {
      struct rlimit rl = {it_daemon_nofile, it_daemon_nofile};
      if (setrlimit(RLIMIT_NOFILE, &rl) != 0) _exit(126);
    }
    setenv("KVCACHED_TEST_AUDIT", "1", 0); /* engine_audit after every request */
    int log = open(d->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int null = open("/dev/null", O_WRONLY);
    dup2(log, 2);
    dup2(null, 1);
    for (int i = 0; env && env[i]; i++) putenv((char *)env[i]);
    execv(bin, (char *const *)argv);
    _exit(127);
  }
  d->pid = pid;
}

/* Waits until the daemon's socket accepts (10 s at most). */
IT_UNUSED static void daemon_wait_accepting(daemon_t *d) {
  pid_t pid = d->pid;
  for (int i = 0; i < 1000; i++) {
    int fd = it_connect_raw(d->sock);
    if (fd >= 0) {
      close(fd);
      return;
    }
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) {
      it_dump_log(d);
      TEST_FAIL_("kvcached exited at start (status %d)", st);
    }
    it_sleep_ms(10);
  }
  it_dump_log(d);
  TEST_FAIL_("kvcached did not accept on %s within 10 s", d->sock);
}

/* daemon_spawn, then daemon_wait_accepting. */
IT_UNUSED static void daemon_start_full(daemon_t *d, const char *bin,
                                        const char *const *extra,
                                        const char *const *env) {
  daemon_spawn(d, bin, extra, env);
  daemon_wait_accepting(d);
}

/* Starts $KVC_BUILD/kvcached with the test defaults and extra flags. */
IT_UNUSED static void daemon_start_args(daemon_t *d, const char *const *extra) {
  daemon_start_full(d, NULL, extra, NULL);
}

IT_UNUSED static void daemon_start(daemon_t *d) { daemon_start_args(d, NULL); }

/* Reads a pipe to its end: the first cap - 1 bytes into out (NUL-ended), the
 * rest discarded, so the writer never dies of SIGPIPE on a long output. */
IT_UNUSED static void it_read_all(FILE *p, char *out, size_t cap) {
  size_t used = 0, got;
  char sink[4096];
  while ((got = fread(used + 1 < cap ? out + used : sink, 1,
                      used + 1 < cap ? cap - 1 - used : sizeof sink, p)) > 0)
    if (used + 1 < cap) used += got;
  out[used] = '\0';
}

/* Runs a shell command (a printf format), keeping its stdout and stderr in
 * out. Returns its exit status (128 + signal when killed). */
IT_UNUSED static int it_sh(char *out, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
IT_UNUSED static int it_sh(char *out, size_t cap, const char *fmt, ...) {
  char cmd[4096];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(cmd + 2, sizeof cmd - 16, fmt, ap);
  va_end(ap);
  ASSERT(n > 0 && (size_t)n < sizeof cmd - 16);
  memcpy(cmd, "{ ", 2);
  strcat(cmd, "\n} 2>&1"); /* the stderr of every command in the line */
  fflush(NULL);
  FILE *p = popen(cmd, "r");
  ASSERT(p != NULL);
  it_read_all(p, out, cap);
  int st = pclose(p);
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : -1;
}

/* Writes text to path (the test fails if it cannot). */
IT_UNUSED static void it_write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f) TEST_FAIL_("cannot write %s: %s", path, strerror(errno));
  ASSERT(fputs(text, f) >= 0);
  ASSERT(fclose(f) == 0);
}

/* The source tree (tests run from it; KVC_SRCDIR overrides). */
IT_UNUSED static const char *it_srcdir(void) {
  const char *s = getenv("KVC_SRCDIR");
  return s && *s ? s : ".";
}

/* Whether the log holds a sanitizer report. */
IT_UNUSED static bool it_log_has(const daemon_t *d, const char *needle) {
  FILE *f = fopen(d->log, "r");
  char line[2048];
  bool found = false;
  if (!f) return false;
  while (!found && fgets(line, sizeof line, f)) found = strstr(line, needle) != NULL;
  fclose(f);
  return found;
}

/* Waits up to ms for needle in the daemon's log. */
IT_UNUSED static bool it_log_wait(const daemon_t *d, const char *needle, long ms) {
  for (long waited = 0; waited <= ms; waited += 10) {
    if (it_log_has(d, needle)) return true;
    it_sleep_ms(10);
  }
  return false;
}

/* With KVC_IT_STATS=FILE in the environment, appends the daemon's latency
 * figures (kvcachectl stats) to FILE before it stops: how the suite's
 * latencies are collected. */
IT_UNUSED static void it_save_latencies(const daemon_t *d) {
  const char *file = getenv("KVC_IT_STATS");
  if (!file || !*file) return;
  char cmd[512];
  snprintf(cmd, sizeof cmd, "%s/kvcachectl --socket '%s' stats | grep -E '^(requests|latency)_' >> '%s'",
           it_build(), d->sock, file);
  if (system(cmd) != 0) fprintf(stderr, "could not save latencies\n");
}

/* SIGTERM, then exit status 0 and a clean log are required. */
IT_UNUSED static void daemon_stop(daemon_t *d) {
  it_save_latencies(d);
  ASSERT(kill(d->pid, SIGTERM) == 0);
  int st = 0;
  ASSERT(waitpid(d->pid, &st, 0) == d->pid);
  bool bad = it_log_has(d, "ERROR: AddressSanitizer") || it_log_has(d, "runtime error") ||
             it_log_has(d, "ERROR: LeakSanitizer") || it_log_has(d, "event=audit_failed") ||
             it_log_has(d, "Sanitizer:");
  if (bad || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    it_dump_log(d);
    TEST_FAIL_("kvcached: exited=%d status=%d signal=%d sanitizer_report=%d",
               WIFEXITED(st), WIFEXITED(st) ? WEXITSTATUS(st) : -1,
               WIFSIGNALED(st) ? WTERMSIG(st) : 0, bad);
  }
  ASSERT(access(d->sock, F_OK) != 0); /* the socket file is removed */
  char cmd[160];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", d->dir);
  ASSERT(system(cmd) == 0);
}

IT_UNUSED static kvc_client_t *client_open_shm(const daemon_t *d, uint64_t shm_bytes) {
  kvc_client_opts_t o = {.socket_path = d->sock, .shm_bytes = shm_bytes, .timeout_ms = 20000,
                         .client_name = "it"};
  kvc_client_t *c = NULL;
  int rc = kvc_client_open(&o, &c);
  if (rc) TEST_FAIL_("kvc_client_open: %s: %s", kvc_err_name(rc), kvc_client_open_error());
  return c;
}

IT_UNUSED static kvc_client_t *client_open(const daemon_t *d) { return client_open_shm(d, 0); }

/* A global figure (cache NULL) or one cache's; fails the test if absent. */
IT_UNUSED static uint64_t stat_get(kvc_client_t *c, const char *name, const char *cache) {
  /* name is a family, optionally with labels: "requests_total{op=put}";
   * the matching samples are summed (request_errors_total over statuses,
   * 0 when there is none: that family is sparse). */
  char fam[128], sel[256] = "";
  const char *brace = strchr(name, '{');
  size_t flen = brace ? (size_t)(brace - name) : strlen(name);
  /* A cache's figure is the family cache_NAME. */
  const char *pre = cache && strncmp(name, "cache_", 6) != 0 ? "cache_" : "";
  ASSERT(flen + strlen(pre) < sizeof fam);
  snprintf(fam, sizeof fam, "%s%.*s", pre, (int)flen, name);
  if (brace) snprintf(sel, sizeof sel, "%.*s", (int)(strlen(brace + 1) - 1), brace + 1);
  kvc_stat_t *st;
  size_t n;
  /* A cache's figures come by its name (a reply holds only the top caches). */
  kvc_stats_opts_t q = {.cache = cache};
  ASSERT_OK(kvc_stats_query(c, cache ? &q : NULL, &st, &n));
  uint64_t v = 0;
  bool found = false;
  for (size_t i = 0; i < n; i++) {
    if (strcmp(st[i].name, fam) != 0 || strcmp(st[i].cache, cache ? cache : "") != 0) continue;
    bool match = true;
    for (char *save = NULL, *dup = strdup(sel), *kv = strtok_r(dup, ",", &save); ;
         kv = strtok_r(NULL, ",", &save)) {
      if (!kv) { free(dup); break; }
      char *eq = strchr(kv, '=');
      ASSERT(eq != NULL);
      *eq = '\0';
      const char *have = kvc_stat_label(&st[i], kv);
      if (!have || strcmp(have, eq + 1) != 0) match = false;
    }
    if (!match) continue;
    v += st[i].value;
    found = true;
  }
  kvc_stats_free(st);
  if (!found && strcmp(fam, "request_errors_total") != 0)
    TEST_FAIL_("no stat %s (cache %s)", name, cache ? cache : "-");
  return v;
}

/* How long a test waits for the daemon to reach a state it polls for: the
 * deadline for a daemon that never gets there, not a pace (it looks every
 * 1-10 ms and goes on at once), long because a loaded 2-CPU machine running
 * sanitizer builds is slow. */
#define IT_WAIT_MS 60000

IT_UNUSED static uint64_t it_mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Polls the sum of the daemon's figures names[0..n) (each as stat_get)
 * until it equals want or, with at_least, reaches it; fails the test after
 * IT_WAIT_MS. Returns the sum. The daemon's counters are its word that
 * something happened: the pace only spaces the looks. */
IT_UNUSED static uint64_t it_wait_sum(kvc_client_t *c, const char *const *names, int n,
                                      uint64_t want, bool at_least) {
  uint64_t end = it_mono_ms() + IT_WAIT_MS;
  for (long pace = 1;; pace = pace < 10 ? pace * 2 : 10) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v += stat_get(c, names[i], NULL);
    if (at_least ? v >= want : v == want) return v;
    if (it_mono_ms() > end)
      TEST_FAIL_("%s%s stayed at %llu for %d s, expected %s%llu", names[0],
                 n > 1 ? " (and the figures summed with it)" : "", (unsigned long long)v,
                 IT_WAIT_MS / 1000, at_least ? "at least " : "", (unsigned long long)want);
    it_sleep_ms(pace);
  }
}

/* Polls the daemon's figure name (as stat_get) until it equals want or,
 * with at_least, reaches it; fails the test after IT_WAIT_MS. Returns it. */
IT_UNUSED static uint64_t it_wait_stat(kvc_client_t *c, const char *name, uint64_t want,
                                       bool at_least) {
  return it_wait_sum(c, &name, 1, want, at_least);
}

/* Runs `kvcachectl --socket SOCK ARGS` (ARGS a printf format), keeping its
 * stdout in out (and stderr when err_too). Returns its exit status. */
IT_UNUSED static int ctl_run(const daemon_t *d, char *out, size_t cap, bool err_too,
                             const char *fmt, ...) __attribute__((format(printf, 5, 6)));
IT_UNUSED static int ctl_run(const daemon_t *d, char *out, size_t cap, bool err_too,
                             const char *fmt, ...) {
  char args[512], cmd[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  snprintf(cmd, sizeof cmd, "%s/kvcachectl --socket '%s' %s%s", it_build(), d->sock, args,
           err_too ? " 2>&1" : "");
  FILE *p = popen(cmd, "r");
  ASSERT(p != NULL);
  it_read_all(p, out, cap);
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* A small layout used by most tests; page = 16 tokens x 2 layers x 2 heads x
 * (32 + 32) x 4 bytes = 16 KiB, one pool page. */
IT_UNUSED static kvc_layout_t it_layout(kvc_dtype_t dtype) {
  kvc_layout_t l = {.num_layers = 2, .num_kv_heads = 2, .head_dim_k = 32, .head_dim_v = 32,
                    .dtype = dtype, .page_tokens = 16};
  return l;
}

/* Deterministic test bytes for (seq, token, salt): f32 values that differ per
 * element, for a layout's every layer/head/dim. */
IT_UNUSED static void it_fill_f32(float *k, float *v, const kvc_layout_t *l, uint64_t seq,
                                  uint64_t pos, uint64_t ntokens, uint32_t salt) {
  size_t i = 0, j = 0;
  for (uint32_t layer = 0; layer < l->num_layers; layer++)
    for (uint64_t t = 0; t < ntokens; t++)
      for (uint32_t h = 0; h < l->num_kv_heads; h++) {
        for (uint32_t d = 0; d < l->head_dim_k; d++)
          k[i++] = (float)(seq * 1000 + (pos + t) * 10 + layer) + (float)(h * 64 + d) / 128.0f +
                   (float)salt;
        for (uint32_t d = 0; d < l->head_dim_v; d++)
          v[j++] = -(float)(seq * 1000 + (pos + t) * 10 + layer) - (float)(h * 64 + d) / 128.0f -
                   (float)salt;
      }
}

/* Bytes of one token of every layer in f32 (K or V). */
IT_UNUSED static size_t it_tok_floats(const kvc_layout_t *l, bool v) {
  return (size_t)l->num_layers * l->num_kv_heads * (v ? l->head_dim_v : l->head_dim_k);
}

#endif
