/* bench_util.h: timing by trials, the run's reference series, and the one
 * result table of kvc_bench.
 *
 * A measurement runs an operation in TRIALS trials of at least trial_ms each
 * (after a warm-up), timing every single operation; a trial's figure is its
 * median operation (robust to the preemptions of a shared 2-vCPU machine),
 * and with it goes how long the measured processes waited for a CPU in that
 * trial (schedstat run_delay). Figures that are compared are measured side
 * by side: measure_side alternates the trials of several operations
 * (kvcached, the memcpy and the round trip of its limit, Redis), so a change
 * of load hits all of them alike. Every trial of a reference also goes into
 * its series over the whole run, whose median is the band a row's trials
 * are held to. A row of the table keeps its trials and its goal (BRIEF
 * section 7); table_judge gives each its verdict (bench_verdict.h) and
 * table_summary the closing line. Nothing here asserts a timing.
 */
#ifndef KVC_BENCH_UTIL_H
#define KVC_BENCH_UTIL_H

#include <dirent.h>
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

#include "bench_verdict.h"

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
  double ns;           /* the figure: median over trials of each trial's median operation */
  double tr[TRIALS];   /* each trial's median operation, ns */
  double wait[TRIALS]; /* time the measured processes waited for a CPU / the round's time */
  double p50, p99;     /* of single operations, over every trial */
  uint64_t ops;        /* operations timed in all */
  bool ok;             /* false if an operation failed */
} meas_t;

/* One trial of fn: at least trial_ms and min_ops; appends single times to
 * s and returns the trial's median operation in *med. */
static int trial(op_fn fn, void *ctx, double trial_ms, int min_ops, double *s, size_t *ns,
                 uint64_t *ops, double *med) {
  double start = now_ns(), last = start, end = start + trial_ms * 1e6;
  size_t first = *ns;
  uint64_t n = 0;
  for (; (int)n < min_ops || last < end; n++) {
    if (fn(ctx) != 0) return -1;
    double now = now_ns();
    if (*ns < MAX_SAMPLES) s[(*ns)++] = now - last;
    last = now;
  }
  *ops += n;
  /* Sorting the trial's own samples in place leaves the pooled set as it was. */
  *med = *ns > first ? quantile(s + first, *ns - first, 0.5) : (last - start) / (double)n;
  return 0;
}

/* The processes a measurement involves besides this thread: the daemon,
 * the echo process, Redis, memcached (watch_pid when started). */
#define MAX_WATCHED 16
static pid_t watched[MAX_WATCHED];
static int nwatched;

static BU_UNUSED void watch_pid(pid_t pid) {
  if (nwatched < MAX_WATCHED && pid > 0) watched[nwatched++] = pid;
}

static BU_UNUSED void unwatch_pid(pid_t pid) {
  for (int i = 0; i < nwatched; i++)
    if (watched[i] == pid) watched[i] = watched[--nwatched];
}

/* The run_delay field of a schedstat file: ns runnable but not running. */
static double run_delay_of(const char *path) {
  unsigned long long run = 0, delay = 0;
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  if (fscanf(f, "%llu %llu", &run, &delay) != 2) delay = 0;
  fclose(f);
  return (double)delay;
}

/* The nice value of a task (field 19 of its stat file; 0 if unreadable). A
 * daemon's background threads run below its loop (copy threads and the
 * cluster tier's writer at nice 10): their waits for a CPU are the design,
 * not other load, and are not counted. */
static int nice_of(const char *path) {
  char buf[1024];
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char *p = strrchr(buf, ')'); /* the name may hold spaces */
  if (!p) return 0;
  int field = 2, nice = 0;
  for (; *p && field < 19; p++)
    if (*p == ' ') field++;
  if (field == 19) nice = atoi(p);
  return nice;
}

/* How long this thread and every thread of the watched processes have
 * waited for a CPU while runnable, ns, summed (/proc/.../schedstat). Other
 * work on the machine shows here only when it delays the measurement. */
static double run_delay_ns(void) {
  double sum = run_delay_of("/proc/thread-self/schedstat");
  for (int i = 0; i < nwatched; i++) {
    char dir[64], path[600];
    snprintf(dir, sizeof dir, "/proc/%d/task", (int)watched[i]);
    DIR *d = opendir(dir);
    if (!d) continue;
    for (struct dirent *e; (e = readdir(d));) {
      if (e->d_name[0] == '.') continue;
      snprintf(path, sizeof path, "%s/%s/stat", dir, e->d_name);
      if (nice_of(path) > 0) continue; /* waits for the others by design */
      snprintf(path, sizeof path, "%s/%s/schedstat", dir, e->d_name);
      sum += run_delay_of(path);
    }
    closedir(d);
  }
  return sum;
}

#define MAX_SIDE 4

/* Measures n operations side by side: after a warm-up of each, TRIALS rounds
 * in which each runs one trial in turn. out[i] belongs to fns[i]. */
static BU_UNUSED void measure_side(const op_fn *fns, void *const *ctxs, int n, double trial_ms,
                                   int min_ops, meas_t *out) {
  static double samples[MAX_SIDE][MAX_SAMPLES];
  size_t ns[MAX_SIDE] = {0};
  for (int i = 0; i < n; i++) {
    memset(&out[i], 0, sizeof out[i]);
    out[i].ok = true;
    for (int w = 0; w < 3 && out[i].ok; w++) out[i].ok = fns[i](ctxs[i]) == 0;
  }
  for (int t = 0; t < TRIALS; t++)
    for (int i = 0; i < n; i++) {
      if (!out[i].ok) continue;
      double w0 = run_delay_ns(), t0 = now_ns();
      out[i].ok = trial(fns[i], ctxs[i], trial_ms, min_ops, samples[i], &ns[i], &out[i].ops,
                        &out[i].tr[t]) == 0;
      out[i].wait[t] = (run_delay_ns() - w0) / (now_ns() - t0);
    }
  for (int i = 0; i < n; i++) {
    if (!out[i].ok) continue;
    out[i].ns = bv_median(out[i].tr, TRIALS);
    out[i].p50 = quantile(samples[i], ns[i], 0.5);
    out[i].p99 = quantile(samples[i], ns[i], 0.99);
  }
}

static BU_UNUSED meas_t measure(op_fn fn, void *ctx, double trial_ms, int min_ops) {
  meas_t m;
  measure_side(&fn, &ctx, 1, trial_ms, min_ops, &m);
  return m;
}

/* ---- a reference over the whole run ------------------------------------- */

/* Every trial of one reference (the round trip, memcpy of one size, Redis
 * SET of one size) in the run: its median is what a trial's band is held
 * to (bench_verdict.h rule 1). */
#define SERIES_MAX 1024
typedef struct series {
  const char *name;     /* "round trip", "memcpy" */
  bool hog;             /* a loop that never sleeps: waiting for a CPU does not move its median */
  double t[SERIES_MAX]; /* trial medians, ns */
  int n;
} series_t;

static BU_UNUSED void series_add(series_t *s, const meas_t *m) {
  for (int t = 0; t < TRIALS && m->ok && s->n < SERIES_MAX; t++) s->t[s->n++] = m->tr[t];
}

static BU_UNUSED double series_median(const series_t *s) {
  static double v[SERIES_MAX];
  memcpy(v, s->t, (size_t)s->n * sizeof *v);
  return quantile(v, (size_t)s->n, 0.5);
}

/* ---- the table ---------------------------------------------------------- */

enum fmt {
  FMT_TEXT, /* fig and ref as written, no trials to format */
  FMT_US,   /* trial times in us */
  FMT_GBS,  /* bytes / trial time in GB/s */
  FMT_MS,   /* trial times in ms */
  FMT_RATE  /* operations a second */
};

typedef struct row {
  char section[24];
  char name[96];
  char note[64];
  char fig[32];        /* FMT_TEXT: the figure as printed */
  char ref[48];        /* FMT_TEXT: the reference; else its label ("limit") */
  enum fmt fmt;
  double bytes;        /* FMT_GBS: bytes of one operation */
  bv_row_t bv;         /* goal and trials */
  series_t *ser[BV_MAX_PARTS]; /* each part's run series (NULL: no band) */
  bool measured;       /* false: n/a (a server missing) */
  bv_result_t res;     /* filled by table_judge */
} row_t;

#define MAX_ROWS 160
static row_t rows[MAX_ROWS];
static int nrows;
static char cur_section[24];

/* Starts a part of the table; says so on stderr, as the table comes last. */
static BU_UNUSED void section(const char *s) {
  snprintf(cur_section, sizeof cur_section, "%s", s);
  fprintf(stderr, "kvc_bench: %s ...\n", s);
}

static BU_UNUSED row_t *row_add(const char *name, bv_goal_t gk, double goal) {
  if (nrows == MAX_ROWS) die("too many rows");
  row_t *r = &rows[nrows++];
  memset(r, 0, sizeof *r);
  snprintf(r->section, sizeof r->section, "%s", cur_section);
  snprintf(r->name, sizeof r->name, "%s", name);
  r->bv.gk = gk;
  r->bv.goal = goal;
  return r;
}

/* The row's figure: m's trials, printed as f. */
static BU_UNUSED void row_fig(row_t *r, const meas_t *m, enum fmt f, double bytes) {
  r->fmt = f;
  r->bytes = bytes;
  r->measured = m->ok;
  r->bv.n = TRIALS;
  for (int t = 0; t < TRIALS; t++) {
    r->bv.fig[t] = m->tr[t];
    r->bv.wait[t] = m->wait[t];
  }
}

/* Adds a part to the row's reference: m's trials, weight w in the reference
 * and wf in its floor, held to the band of series s (NULL: none). */
static BU_UNUSED void row_part(row_t *r, const meas_t *m, double w, double wf, series_t *s) {
  if (r->bv.nparts == BV_MAX_PARTS) die("too many parts in row %s", r->name);
  int k = r->bv.nparts++;
  bv_part_t *p = &r->bv.part[k];
  for (int t = 0; t < TRIALS; t++) p->t[t] = m ? m->tr[t] : 0;
  p->w_ref = w;
  p->w_floor = wf;
  p->name = s ? s->name : "reference";
  r->ser[k] = s;
  if (!m || !m->ok) r->measured = false;
  for (int t = 0; m && !(s && s->hog) && t < TRIALS; t++) /* as long as its slowest part */
    if (m->wait[t] > r->bv.wait[t]) r->bv.wait[t] = m->wait[t];
}

/* A row of single values (no trials): ratio fig / ref or ref / fig. */
static BU_UNUSED void row_values(row_t *r, double fig, double ref, bool fig_over_ref) {
  r->measured = fig > 0 && ref > 0;
  r->bv.n = 1;
  r->bv.nparts = 1;
  r->bv.fig[0] = fig;
  r->bv.part[0] = (bv_part_t){.t = {ref}, .w_ref = 1, .name = "reference"};
  r->bv.fig_over_ref = fig_over_ref;
}

static BU_UNUSED void fmt_us(char *out, size_t len, double ns) {
  snprintf(out, len, "%.1f us", ns / 1e3);
}

/* A time in the row's unit, without the unit (for spreads) or with it. */
static void fmt_val(const row_t *r, char *out, size_t len, double ns, bool unit) {
  switch (r->fmt) {
  case FMT_GBS: snprintf(out, len, "%.2f%s", r->bytes / ns, unit ? " GB/s" : ""); break;
  case FMT_MS: snprintf(out, len, "%.1f%s", ns / 1e6, unit ? " ms" : ""); break;
  case FMT_RATE: snprintf(out, len, "%.0f%s", 1e9 / ns, unit ? " /s" : ""); break;
  default: snprintf(out, len, "%.1f%s", ns / 1e3, unit ? " us" : ""); break;
  }
}

/* "lo-hi" in the row's unit (a rate's low end is the slowest trial). */
static void fmt_spread(const row_t *r, char *out, size_t len, double min_ns, double max_ns) {
  char a[24], b[24];
  bool rate = r->fmt == FMT_GBS || r->fmt == FMT_RATE;
  fmt_val(r, a, sizeof a, rate ? max_ns : min_ns, false);
  fmt_val(r, b, sizeof b, rate ? min_ns : max_ns, false);
  snprintf(out, len, "%s-%s", a, b);
}

static void fmt_ratio(char *out, size_t len, double ratio) {
  if (ratio < 0) snprintf(out, len, "-");
  else if (ratio >= 100) snprintf(out, len, "%.0fx", ratio);
  else if (ratio < 0.1) snprintf(out, len, "%.4fx", ratio);
  else snprintf(out, len, "%.2fx", ratio);
}

/* Judges every row (bench_verdict.h), with each part's run median. */
static BU_UNUSED void table_judge(void) {
  for (int i = 0; i < nrows; i++) {
    row_t *r = &rows[i];
    for (int k = 0; k < r->bv.nparts; k++)
      r->bv.part[k].run_ns = r->ser[k] && r->ser[k]->n ? series_median(r->ser[k]) : 0;
    if (!r->measured) continue;
    if (r->bv.nparts > 0) {
      r->res = bv_judge(&r->bv);
      continue;
    }
    /* A reference row or plain text: its own trials' spread, no ratio. */
    bv_result_t *o = &r->res;
    memset(o, 0, sizeof *o);
    o->v = BV_INFO;
    o->ratio = -1;
    o->kept = r->bv.n;
    o->wait = bv_median(r->bv.wait, r->bv.n);
    o->fig = bv_median(r->bv.fig, r->bv.n);
    o->fig_min = o->fig_max = o->fig;
    for (int t = 0; t < r->bv.n; t++) {
      if (r->bv.fig[t] < o->fig_min) o->fig_min = r->bv.fig[t];
      if (r->bv.fig[t] > o->fig_max) o->fig_max = r->bv.fig[t];
    }
  }
}

static void row_print(FILE *f, const row_t *r) {
  char fig[40], fsp[56] = "", ref[80], rsp[56] = "", ratio[24], goal[24], kept[16] = "",
       verdict[160], wait[16] = "";
  const bv_result_t *o = &r->res;
  if (!r->measured) {
    snprintf(fig, sizeof fig, "%s", r->fig[0] ? r->fig : "n/a");
    snprintf(ref, sizeof ref, "%s", r->fmt == FMT_TEXT ? r->ref : "n/a");
    snprintf(ratio, sizeof ratio, "-");
  } else if (r->bv.nparts == 0) {
    if (r->fmt == FMT_TEXT) snprintf(fig, sizeof fig, "%s", r->fig);
    else fmt_val(r, fig, sizeof fig, o->fig, true);
    if (r->fmt != FMT_TEXT && r->bv.n > 1) fmt_spread(r, fsp, sizeof fsp, o->fig_min, o->fig_max);
    snprintf(ref, sizeof ref, "%s", r->ref);
    snprintf(ratio, sizeof ratio, "-");
  } else if (r->fmt == FMT_TEXT) {
    snprintf(fig, sizeof fig, "%s", r->fig);
    snprintf(ref, sizeof ref, "%s", r->ref);
    fmt_ratio(ratio, sizeof ratio, o->ratio);
  } else {
    fmt_val(r, fig, sizeof fig, o->fig, true);
    fmt_spread(r, fsp, sizeof fsp, o->fig_min, o->fig_max);
    char v[24];
    fmt_val(r, v, sizeof v, o->ref, true);
    snprintf(ref, sizeof ref, "%s%s%s", r->ref, r->ref[0] ? " " : "", v);
    fmt_spread(r, rsp, sizeof rsp, o->ref_min, o->ref_max);
    fmt_ratio(ratio, sizeof ratio, o->ratio);
    snprintf(kept, sizeof kept, "%d/%d", o->kept, r->bv.n);
  }
  if (r->measured && r->fmt != FMT_TEXT) snprintf(wait, sizeof wait, "%.0f%%", 100 * o->wait);
  if (r->bv.gk == BV_GOAL_MIN) snprintf(goal, sizeof goal, ">= %gx", r->bv.goal);
  else if (r->bv.gk == BV_GOAL_MAX) snprintf(goal, sizeof goal, "<= %gx", r->bv.goal);
  else snprintf(goal, sizeof goal, "-");
  if (!r->measured) snprintf(verdict, sizeof verdict, "n/a");
  else if (o->v == BV_UNRELIABLE) snprintf(verdict, sizeof verdict, "unreliable: %s", o->why);
  else snprintf(verdict, sizeof verdict, "%s", bv_verdict_name(o->v));
  fprintf(f, "| %s | %s%s%s%s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r->section,
          r->name, r->note[0] ? " (" : "", r->note, r->note[0] ? ")" : "", fig, fsp, ref, rsp,
          ratio, wait, kept, goal, verdict);
}

static BU_UNUSED void table_print(FILE *f, bool references) {
  fprintf(f, "| section | row | figure | min-max | reference | min-max | ratio | cpu wait | "
             "kept | goal | verdict |\n");
  fprintf(f, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
  for (int i = 0; i < nrows; i++)
    if ((strcmp(rows[i].section, "reference") == 0) == references) row_print(f, &rows[i]);
}

/* "goal rows: N met, N not met, N unreliable"; returns nothing, never fails. */
static BU_UNUSED void table_summary(FILE *f) {
  int met = 0, not_met = 0, unrel = 0, na = 0, info_unrel = 0;
  for (int i = 0; i < nrows; i++) {
    const row_t *r = &rows[i];
    if (r->bv.gk == BV_GOAL_NONE) {
      info_unrel += r->measured && r->res.v == BV_UNRELIABLE;
      continue;
    }
    if (!r->measured) na++;
    else if (r->res.v == BV_MET) met++;
    else if (r->res.v == BV_NOT_MET) not_met++;
    else unrel++;
  }
  fprintf(f, "goal rows: %d met, %d not met, %d unreliable", met, not_met, unrel);
  if (na) fprintf(f, ", %d n/a", na);
  fprintf(f, " (informational rows unreliable: %d)\n", info_unrel);
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

/* Set: the next servers spawned may run on every CPU (not only the last). */
static bool spawn_any_cpu;

/* Lets this process run on every CPU again (undoes place_on). */
static BU_UNUSED void place_free(void) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (long i = 0; i < sysconf(_SC_NPROCESSORS_ONLN) && i < CPU_SETSIZE; i++) CPU_SET(i, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) perror("sched_setaffinity");
}

/* Starts argv[0] (a path) with stdout/stderr to log, on the servers' CPU
 * (pinned, unless spawn_any_cpu) or on any; returns its pid. */
static BU_UNUSED pid_t spawn_on(const char *const *argv, const char *log, bool pinned) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) die("fork: %s", strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the bench */
    if (pinned && !spawn_any_cpu) place_on(true);
    else place_free();
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  watch_pid(pid);
  return pid;
}

static BU_UNUSED pid_t spawn(const char *const *argv, const char *log) {
  return spawn_on(argv, log, true);
}

static BU_UNUSED void stop(pid_t pid) {
  if (pid <= 0) return;
  unwatch_pid(pid);
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
