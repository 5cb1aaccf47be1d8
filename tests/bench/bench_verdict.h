/* bench_verdict.h: the verdict of one row of kvc_bench from its trials: met,
 * not met, or unreliable with the reason. Pure (no clock, no I/O), so
 * tests/unit/bench_verdict.c holds it to the rules of doc/benchmarks.md.
 *
 * A row has n trials. In trial t the measured operation took fig[t] (the
 * median operation of that trial) and each part of its reference took
 * part[k].t[t], measured in the same round of alternating trials. The
 * reference of a trial is the weighted sum of its parts (the limit: one
 * memcpy + one bare round trip, weights 1 and 1):
 *
 *   trial      0     1     2   ...  n-1
 *   fig       fig0  fig1  fig2      ...       median over kept trials -> figure
 *   memcpy    m0    m1    m2        ...  \
 *   rtt       r0    r1*   r2        ...  /    median over kept trials -> reference
 *                   ^ r1 outside [0.5x, 3x] of the run's median round trip:
 *                     trial 1 is dropped, figure and reference alike
 *
 * Rules, in order (the first that applies decides):
 *  1. A trial whose reference part is outside [BV_BAND_LO, BV_BAND_HI] times
 *     that part's median over the whole run is dropped; so is a trial in
 *     which the measured processes (the client, kvcached, the echo process,
 *     Redis, memcached) waited for a CPU while runnable for more than
 *     BV_WAIT_MAX of the time (run_delay of /proc/PID/task/TID/schedstat,
 *     summed; wait[t] is the largest of the figure's and the sleeping
 *     references' trials). Such a wait is added to every request time it
 *     falls in, but hardly to the median of a memcpy loop that never sleeps,
 *     so on a busy machine the limit's ratio drops with the load, not with
 *     kvcached.
 *  2. If fewer than half of the trials are left: unreliable.
 *  3. ratio = median reference / median figure (or figure / reference for
 *     rows where a smaller ratio is better: latency, metadata), each median
 *     over the kept trials.
 *  4. If the parts also give a floor (a time the operation cannot beat:
 *     a blocking request of b bytes needs one round trip and one copy of b
 *     bytes), and the figure beats that floor by more than BV_FLOOR_NOISE,
 *     the reference is implausible: unreliable.
 *  5. The ratio's band: the figure and the reference each anywhere in the
 *     middle of their kept trials (sorted x[0..k): from x[k/4] to
 *     x[k-1-k/4], the 2nd to the 6th of 7), the other at its worst. If the
 *     goal lies strictly inside that band, the noise of the run could put
 *     the row on either side of it: unreliable ("too close"). Figure and
 *     reference are taken apart, not trial by trial, because load moves them
 *     apart: on a busy machine the bare round trip swings 2x between trials
 *     while kvcached's request time does not, or the other way round.
 *  6. Otherwise met or not met by the ratio.
 * Informational rows (no goal) go through rules 1-4 too: their ratio is
 * printed, so a broken reference is marked there as well.
 */
#ifndef KVC_BENCH_VERDICT_H
#define KVC_BENCH_VERDICT_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BV_UNUSED __attribute__((unused))
#define BV_MAX_TRIALS 16
#define BV_MAX_PARTS 2
#define BV_BAND_LO 0.5      /* a reference trial under 0.5x its run median is dropped */
#define BV_BAND_HI 3.0      /* and one over 3x */
#define BV_FLOOR_NOISE 0.2  /* how far a figure may beat its floor before the floor is called broken */
#define BV_WAIT_MAX 0.25    /* a trial whose processes waited for a CPU longer is dropped */

typedef enum bv_goal {
  BV_GOAL_NONE, /* informational */
  BV_GOAL_MIN,  /* ratio >= goal */
  BV_GOAL_MAX   /* ratio <= goal */
} bv_goal_t;

typedef enum bv_verdict { BV_INFO, BV_MET, BV_NOT_MET, BV_UNRELIABLE } bv_verdict_t;

typedef struct bv_part {
  double t[BV_MAX_TRIALS]; /* this part's time in each trial, ns */
  double run_ns;           /* its median over the whole run; 0: no band check */
  double w_ref;            /* weight in the reference */
  double w_floor;          /* weight in the floor (every part 0: no floor) */
  const char *name;        /* "round trip", "memcpy": for the reason */
} bv_part_t;

typedef struct bv_row {
  bv_goal_t gk;
  double goal;
  bool fig_over_ref;           /* ratio = figure / reference (smaller is better) */
  int n;                       /* trials, 1..BV_MAX_TRIALS */
  double fig[BV_MAX_TRIALS];   /* the measured operation's time in each trial */
  double wait[BV_MAX_TRIALS];  /* time the trial's processes waited for a CPU / its time */
  int nparts;                  /* 1..BV_MAX_PARTS */
  bv_part_t part[BV_MAX_PARTS];
} bv_row_t;

typedef struct bv_result {
  bv_verdict_t v;
  double ratio;             /* of the medians over kept trials (over all if none); < 0: none */
  double fig, ref;          /* those medians (the figure, the reference), ns */
  double fig_min, fig_max;  /* over all trials, to show the noise */
  double ref_min, ref_max;
  int kept;                 /* trials left after rule 1 */
  int busy;                 /* of the trials dropped, those for the CPU wait */
  double wait;              /* the median of wait[] */
  char why[112];            /* the reason, when unreliable */
} bv_result_t;

static void bv_sort(double *s, int n) {
  for (int i = 1; i < n; i++) /* insertion sort: n is tiny */
    for (int j = i; j > 0 && s[j - 1] > s[j]; j--) {
      double x = s[j];
      s[j] = s[j - 1];
      s[j - 1] = x;
    }
}

/* The median of v[0..n) without changing v (n <= BV_MAX_TRIALS). */
static BV_UNUSED double bv_median(const double *v, int n) {
  double s[BV_MAX_TRIALS];
  if (n <= 0) return 0;
  memcpy(s, v, (size_t)n * sizeof *s);
  bv_sort(s, n);
  return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

static double bv_ref_of(const bv_row_t *r, int t, bool floor) {
  double s = 0;
  for (int k = 0; k < r->nparts; k++)
    s += (floor ? r->part[k].w_floor : r->part[k].w_ref) * r->part[k].t[t];
  return s;
}

static double bv_ratio(const bv_row_t *r, double fig, double ref) {
  if (fig <= 0 || ref <= 0) return -1;
  return r->fig_over_ref ? fig / ref : ref / fig;
}

static bool bv_meets(const bv_row_t *r, double ratio) {
  return r->gk == BV_GOAL_MIN ? ratio >= r->goal : ratio <= r->goal;
}

static bool bv_in_band(const bv_part_t *p, int t) {
  return p->run_ns <= 0 || (p->t[t] >= BV_BAND_LO * p->run_ns && p->t[t] <= BV_BAND_HI * p->run_ns);
}

/* Rule 1: which trials are kept; counts those dropped for the CPU wait and
 * says which part dropped the most of the others. */
static int bv_keep(const bv_row_t *r, bool *keep, int *busy, const char **worst) {
  int kept = 0, most = 0;
  *worst = "reference";
  *busy = 0;
  for (int k = 0; k < r->nparts; k++) {
    int out = 0;
    for (int t = 0; t < r->n; t++) out += !bv_in_band(&r->part[k], t);
    if (out > most) {
      most = out;
      *worst = r->part[k].name ? r->part[k].name : "reference";
    }
  }
  for (int t = 0; t < r->n; t++) {
    keep[t] = r->fig[t] > 0;
    for (int k = 0; k < r->nparts; k++) keep[t] = keep[t] && bv_in_band(&r->part[k], t);
    if (keep[t] && r->wait[t] > BV_WAIT_MAX) {
      keep[t] = false;
      (*busy)++;
    }
    kept += keep[t];
  }
  return kept;
}

/* The verdict of row r (see the rules above). */
static BV_UNUSED bv_result_t bv_judge(const bv_row_t *r) {
  bv_result_t o;
  memset(&o, 0, sizeof o);
  o.ratio = -1;
  if (r->n < 1 || r->n > BV_MAX_TRIALS || r->nparts < 1 || r->nparts > BV_MAX_PARTS) {
    o.v = BV_UNRELIABLE;
    snprintf(o.why, sizeof o.why, "no trials");
    return o;
  }
  double f[BV_MAX_TRIALS], ref[BV_MAX_TRIALS], fl[BV_MAX_TRIALS];
  bool keep[BV_MAX_TRIALS];
  const char *worst;
  o.kept = bv_keep(r, keep, &o.busy, &worst);
  o.wait = bv_median(r->wait, r->n);
  o.fig_min = o.ref_min = 1e300;
  int k = 0;
  bool has_floor = false;
  for (int p = 0; p < r->nparts; p++) has_floor |= r->part[p].w_floor > 0;
  for (int t = 0; t < r->n; t++) {
    double rf = bv_ref_of(r, t, false);
    if (r->fig[t] < o.fig_min) o.fig_min = r->fig[t];
    if (r->fig[t] > o.fig_max) o.fig_max = r->fig[t];
    if (rf < o.ref_min) o.ref_min = rf;
    if (rf > o.ref_max) o.ref_max = rf;
    if (!keep[t]) continue;
    f[k] = r->fig[t];
    ref[k] = rf;
    fl[k] = bv_ref_of(r, t, true);
    k++;
  }
  if (k == 0) /* nothing kept: show the medians of every trial */
    for (int t = 0; t < r->n; t++) {
      f[t] = r->fig[t];
      ref[t] = bv_ref_of(r, t, false);
    }
  o.fig = bv_median(f, k ? k : r->n);
  o.ref = bv_median(ref, k ? k : r->n);
  o.ratio = bv_ratio(r, o.fig, o.ref); /* of every trial when none is kept */
  o.v = BV_UNRELIABLE; /* informational rows too, by rules 2 and 4 */
  if (2 * k < r->n) { /* rule 2 */
    if (2 * o.busy >= r->n - k)
      snprintf(o.why, sizeof o.why, "busy machine: in %d of %d trials the processes waited for a "
               "CPU > %.0f%% of the time", o.busy, r->n, 100 * BV_WAIT_MAX);
    else
      snprintf(o.why, sizeof o.why, "%d of %d trials had a %s outside %.1f-%.0fx its run median",
               r->n - k - o.busy, r->n, worst, BV_BAND_LO, BV_BAND_HI);
    return o;
  }
  double floor = bv_median(fl, k);
  if (has_floor && floor > (1 + BV_FLOOR_NOISE) * o.fig) { /* rule 4 */
    snprintf(o.why, sizeof o.why, "reference implausible: the figure beats its floor by %.2fx",
             floor / o.fig);
    return o;
  }
  if (r->gk == BV_GOAL_NONE) {
    o.v = BV_INFO;
    return o;
  }
  if (k > 1) { /* rule 5 */
    bv_sort(f, k);
    bv_sort(ref, k);
    int q = k / 4;
    double a = bv_ratio(r, f[q], ref[k - 1 - q]), b = bv_ratio(r, f[k - 1 - q], ref[q]);
    double lo = a < b ? a : b, hi = a < b ? b : a;
    if (lo < r->goal && r->goal < hi) {
      snprintf(o.why, sizeof o.why, "too close: the trials put the ratio anywhere in %.2f-%.2fx",
               lo, hi);
      return o;
    }
  }
  o.v = bv_meets(r, o.ratio) ? BV_MET : BV_NOT_MET;
  return o;
}

static BV_UNUSED const char *bv_verdict_name(bv_verdict_t v) {
  switch (v) {
  case BV_MET: return "met";
  case BV_NOT_MET: return "NOT MET";
  case BV_UNRELIABLE: return "unreliable";
  default: return "-";
  }
}

#endif
