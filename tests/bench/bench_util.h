/* bench_util.h: timing with medians over trials, and the one result table of
 * kvc_bench.
 *
 * A measurement runs an operation in TRIALS trials of at least trial_ms each
 * (after a warm-up), timing every single operation; its figure is the median
 * operation (robust to the preemptions of a shared 2-vCPU machine), and p99
 * is there too. Figures that are compared are measured side by side:
 * measure_side alternates the trials of several operations (kvcached, the
 * memcpy and the round trip of its limit, Redis), so a change of load on the
 * machine hits all of them alike. A row of the table holds
 * a figure, its reference, their ratio and the goal the ratio is held to
 * (BRIEF section 7), met or not. Nothing here asserts a timing.
 */
#ifndef KVC_BENCH_UTIL_H
#define KVC_BENCH_UTIL_H

#include <errno.h>
#include <sched.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BU_UNUSED __attribute__((unused))
#define TRIALS 7
#define MAX_SAMPLES 200000

static BU_UNUSED double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static BU_UNUSED void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static BU_UNUSED void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "kvc_bench: ");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(1);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The q-quantile (0..1) of v[0..n), sorting v. */
static BU_UNUSED double quantile(double *v, size_t n, double q) {
  if (n == 0) return 0;
  qsort(v, n, sizeof *v, cmp_double);
  size_t i = (size_t)(q * (double)(n - 1) + 0.5);
  return v[i < n ? i : n - 1];
}

/* One timed operation: returns 0, or non-zero to abort the measurement. */
typedef int (*op_fn)(void *ctx);

typedef struct meas {
  double ns;       /* median time of one operation */
  double p50, p99; /* of single operations, over every trial */
  uint64_t ops;    /* operations timed in all */
  bool ok;         /* false if an operation failed */
} meas_t;

/* One trial of fn: at least trial_ms and min_ops; appends single times. */
static int trial(op_fn fn, void *ctx, double trial_ms, int min_ops, double *s, size_t *ns,
                 uint64_t *ops) {
  double start = now_ns(), last = start, end = start + trial_ms * 1e6;
  for (int n = 0; n < min_ops || last < end; n++) {
    if (fn(ctx) != 0) return -1;
    double now = now_ns();
    if (*ns < MAX_SAMPLES) s[(*ns)++] = now - last;
    last = now;
    (*ops)++;
  }
  return 0;
}

#define MAX_SIDE 4

/* Measures n operations side by side: after a warm-up of each, TRIALS rounds
 * in which each runs one trial in turn. out[i] belongs to fns[i]. */
static BU_UNUSED void measure_side(const op_fn *fns, void *const *ctxs, int n, double trial_ms,
                                   int min_ops, meas_t *out) {
  static double samples[MAX_SIDE][MAX_SAMPLES];
  size_t ns[MAX_SIDE] = {0};
  for (int i = 0; i < n; i++) {
    out[i] = (meas_t){0, 0, 0, 0, true};
    for (int w = 0; w < 3 && out[i].ok; w++) out[i].ok = fns[i](ctxs[i]) == 0;
  }
  for (int t = 0; t < TRIALS; t++)
    for (int i = 0; i < n; i++)
      if (out[i].ok)
        out[i].ok = trial(fns[i], ctxs[i], trial_ms, min_ops, samples[i], &ns[i],
                          &out[i].ops) == 0;
  for (int i = 0; i < n; i++) {
    if (!out[i].ok) continue;
    out[i].ns = out[i].p50 = quantile(samples[i], ns[i], 0.5);
    out[i].p99 = quantile(samples[i], ns[i], 0.99);
  }
}

static BU_UNUSED meas_t measure(op_fn fn, void *ctx, double trial_ms, int min_ops) {
  meas_t m;
  measure_side(&fn, &ctx, 1, trial_ms, min_ops, &m);
  return m;
}

/* ---- the table ---------------------------------------------------------- */

enum goal_kind {
  GOAL_NONE,  /* informational */
  GOAL_MIN,   /* ratio >= goal */
  GOAL_MAX    /* ratio <= goal */
};

typedef struct row {
  char section[24];
  char name[56];
  char fig[24];
  char ref[40];
  double ratio;    /* < 0: not measured */
  enum goal_kind gk;
  double goal;
  char note[64];
} row_t;

#define MAX_ROWS 128
static row_t rows[MAX_ROWS];
static int nrows;
static char cur_section[24];

/* Starts a part of the table; says so on stderr, as the table comes last. */
static BU_UNUSED void section(const char *s) {
  snprintf(cur_section, sizeof cur_section, "%s", s);
  fprintf(stderr, "kvc_bench: %s ...\n", s);
}

static BU_UNUSED row_t *row_add(const char *name, enum goal_kind gk, double goal) {
  if (nrows == MAX_ROWS) die("too many rows");
  row_t *r = &rows[nrows++];
  memset(r, 0, sizeof *r);
  snprintf(r->section, sizeof r->section, "%s", cur_section);
  snprintf(r->name, sizeof r->name, "%s", name);
  r->ratio = -1;
  r->gk = gk;
  r->goal = goal;
  return r;
}

static BU_UNUSED void fmt_bw(char *out, size_t len, double bytes, double ns) {
  snprintf(out, len, "%.2f GB/s", ns > 0 ? bytes / ns : 0);
}

static BU_UNUSED void fmt_us(char *out, size_t len, double ns) {
  snprintf(out, len, "%.1f us", ns / 1e3);
}

static const char *met_text(const row_t *r) {
  if (r->ratio < 0) return "n/a";
  if (r->gk == GOAL_NONE) return "-";
  bool met = r->gk == GOAL_MIN ? r->ratio >= r->goal : r->ratio <= r->goal;
  return met ? "met" : "NOT MET";
}

static BU_UNUSED void table_print(FILE *f) {
  fprintf(f, "| section | row | figure | reference | ratio | goal | met |\n");
  fprintf(f, "|---|---|---:|---:|---:|---:|---|\n");
  for (int i = 0; i < nrows; i++) {
    const row_t *r = &rows[i];
    char ratio[24], goal[24];
    if (r->ratio < 0) snprintf(ratio, sizeof ratio, "-");
    else if (r->ratio >= 100) snprintf(ratio, sizeof ratio, "%.0fx", r->ratio);
    else if (r->ratio < 0.1) snprintf(ratio, sizeof ratio, "%.4fx", r->ratio);
    else snprintf(ratio, sizeof ratio, "%.2fx", r->ratio);
    if (r->gk == GOAL_MIN) snprintf(goal, sizeof goal, ">= %gx", r->goal);
    else if (r->gk == GOAL_MAX) snprintf(goal, sizeof goal, "<= %gx", r->goal);
    else snprintf(goal, sizeof goal, "-");
    fprintf(f, "| %s | %s%s%s%s | %s | %s | %s | %s | %s |\n", r->section, r->name,
            r->note[0] ? " (" : "", r->note, r->note[0] ? ")" : "", r->fig, r->ref, ratio,
            goal, met_text(r));
  }
}

/* ---- processes ------------------------------------------------------------ */

/* Placement: clients run on the first CPU, servers (kvcached, Redis,
 * memcached, the echo process of the bare round trip) on the last, so every
 * round trip of every figure wakes a process on the other CPU, whatever the
 * scheduler would have chosen (a wakeup on the same CPU costs a fraction of
 * one on the other, and which one happens otherwise changes from run to
 * run). With one CPU this does nothing. */
static BU_UNUSED void place_on(bool server) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  if (n < 2) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(server ? (int)n - 1 : 0, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) perror("sched_setaffinity");
}

/* Waits until a Unix socket at path accepts, up to timeout_ms; false if not
 * (or if pid exited). */
static BU_UNUSED bool wait_socket(const char *path, pid_t pid, int timeout_ms) {
  for (int i = 0; i < timeout_ms / 10; i++) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
      close(fd);
      return true;
    }
    if (fd >= 0) close(fd);
    int st;
    if (pid > 0 && waitpid(pid, &st, WNOHANG) == pid) return false;
    struct timespec ts = {0, 10 * 1000000L};
    nanosleep(&ts, NULL);
  }
  return false;
}

/* Starts argv[0] (a path) with stdout/stderr to log; returns its pid. */
static BU_UNUSED pid_t spawn(const char *const *argv, const char *log) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) die("fork: %s", strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the bench */
    place_on(true);
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  return pid;
}

static BU_UNUSED void stop(pid_t pid) {
  if (pid <= 0) return;
  kill(pid, SIGTERM);
  int st;
  for (int i = 0; i < 500; i++) {
    if (waitpid(pid, &st, WNOHANG) == pid) return;
    struct timespec ts = {0, 10 * 1000000L};
    nanosleep(&ts, NULL);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &st, 0);
}

/* A field of /proc/PID/status in kB ("VmRSS", "RssAnon"), or 0. */
static BU_UNUSED uint64_t proc_kb(pid_t pid, const char *field) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  unsigned long long v = 0;
  size_t fl = strlen(field);
  while (fgets(line, sizeof line, f))
    if (strncmp(line, field, fl) == 0 && line[fl] == ':') {
      sscanf(line + fl + 1, "%llu", &v);
      break;
    }
  fclose(f);
  return v;
}

#endif
