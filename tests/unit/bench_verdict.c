/* bench_verdict.c: the verdict rules of kvc_bench (tests/bench/bench_verdict.h)
 * on made-up trials: a reference that spiked or is implausible never reads
 * "met", a dropped trial takes its figure with it, and clean trials give the
 * plain verdict. No timing is measured here.
 */
#include "bench/bench_verdict.h"
#include "test.h"

#define US 1000.0

/* A limit row of n trials: figure f us, memcpy m us, round trip r us in
 * every trial; the run's median round trip run_rtt us. */
static bv_row_t limit_row(int n, double f, double m, double r, double run_rtt) {
  bv_row_t row;
  memset(&row, 0, sizeof row);
  row.gk = BV_GOAL_MIN;
  row.goal = 0.8;
  row.n = n;
  row.nparts = 2;
  row.part[0] = (bv_part_t){.run_ns = m * US, .w_ref = 1, .w_floor = 1, .name = "memcpy"};
  row.part[1] = (bv_part_t){.run_ns = run_rtt * US, .w_ref = 1, .w_floor = 1,
                            .name = "round trip"};
  for (int t = 0; t < n; t++) {
    row.fig[t] = f * US;
    row.part[0].t[t] = m * US;
    row.part[1].t[t] = r * US;
  }
  return row;
}

TEST(bench_verdict_clean_trials_met_and_not_met) {
  /* 64 KiB: memcpy 5 us + round trip 40 us = 45 us; kvcached 50 us: 0.9x. */
  bv_row_t row = limit_row(7, 50, 5, 40, 40);
  bv_result_t o = bv_judge(&row);
  ASSERT_EQ(o.v, BV_MET);
  ASSERT_EQ(o.kept, 7);
  ASSERT(o.ratio > 0.89 && o.ratio < 0.91);
  row = limit_row(7, 90, 5, 40, 40); /* 0.5x */
  o = bv_judge(&row);
  ASSERT_EQ(o.v, BV_NOT_MET);
  ASSERT(o.ratio > 0.49 && o.ratio < 0.51);
}

/* The run: the round trip of the row's trials measured 340 us while
 * the run's median was 20 us; kvcached (36 us) looked 9.5x the limit. */
TEST(bench_verdict_spiked_round_trip_is_unreliable_not_met) {
  bv_row_t row = limit_row(7, 36, 4, 340, 20);
  bv_result_t o = bv_judge(&row);
  ASSERT_EQ(o.v, BV_UNRELIABLE);
  ASSERT_EQ(o.kept, 0);
  ASSERT(strstr(o.why, "round trip") != NULL);
}

/* A reference slower than the figure, but inside the band of the run (the
 * run's median round trip was itself inflated): the floor rule catches it. */
TEST(bench_verdict_limit_slower_than_figure_is_unreliable) {
  bv_row_t row = limit_row(7, 36, 4, 120, 60);
  bv_result_t o = bv_judge(&row);
  ASSERT_EQ(o.kept, 7);
  ASSERT_EQ(o.v, BV_UNRELIABLE);
  ASSERT(strstr(o.why, "implausible") != NULL);
  /* Within the noise of the floor: a plain verdict. */
  row = limit_row(7, 40, 4, 40, 40); /* floor 44 us = 1.1x the figure */
  o = bv_judge(&row);
  ASSERT_EQ(o.v, BV_MET);
}

/* Latency rows (figure / round trip, <= 1.3x): an inflated round trip would
 * make any request look fast; the floor says the request cannot beat it. */
TEST(bench_verdict_latency_row_inflated_rtt_is_unreliable) {
  bv_row_t row;
  memset(&row, 0, sizeof row);
  row.gk = BV_GOAL_MAX;
  row.goal = 1.3;
  row.fig_over_ref = true;
  row.n = 7;
  row.nparts = 1;
  row.part[0] = (bv_part_t){.run_ns = 50 * US, .w_ref = 1, .w_floor = 1, .name = "round trip"};
  for (int t = 0; t < 7; t++) {
    row.fig[t] = 45 * US;
    row.part[0].t[t] = 100 * US; /* 2x the run: in the band, but twice the request */
  }
  bv_result_t o = bv_judge(&row);
  ASSERT_EQ(o.v, BV_UNRELIABLE);
  for (int t = 0; t < 7; t++) row.part[0].t[t] = 40 * US; /* 45 / 40 = 1.125x */
  o = bv_judge(&row);
  ASSERT_EQ(o.v, BV_MET);
}

/* One spiked trial is dropped with its figure; the rest decide. */
TEST(bench_verdict_one_spiked_trial_is_dropped) {
  bv_row_t row = limit_row(7, 90, 5, 40, 40);
  row.part[1].t[3] = 400 * US;
  row.fig[3] = 10 * US; /* would pull the figure if it were kept */
  bv_result_t o = bv_judge(&row);
  ASSERT_EQ(o.kept, 6);
  ASSERT_EQ(o.v, BV_NOT_MET);
  ASSERT(o.ref_max > 400 * US); /* the spread still shows it */
  ASSERT(o.fig_min < 11 * US);
  /* Four of seven spiked: too few left. */
  for (int t = 0; t < 4; t++) row.part[1].t[t] = 400 * US;
  o = bv_judge(&row);
  ASSERT_EQ(o.kept, 3);
  ASSERT_EQ(o.v, BV_UNRELIABLE);
}

/* Trials on both sides of the goal: too close to call. */
TEST(bench_verdict_goal_inside_trial_spread_is_unreliable) {
  bv_row_t row = limit_row(7, 50, 5, 40, 40);
  static const double f[7] = {45, 50, 52, 56, 60, 62, 70}; /* 1.0x .. 0.64x */
  for (int t = 0; t < 7; t++) row.fig[t] = f[t] * US;
  bv_result_t o = bv_judge(&row);
  ASSERT_EQ(o.v, BV_UNRELIABLE);
  ASSERT(strstr(o.why, "too close") != NULL);
  /* Only the extreme trials across the goal: the middle decides. */
  static const double g[7] = {45, 46, 47, 48, 49, 50, 70};
  for (int t = 0; t < 7; t++) row.fig[t] = g[t] * US;
  o = bv_judge(&row);
  ASSERT_EQ(o.v, BV_MET);
  /* A steady figure but a reference that swings trial to trial (a loaded
   * machine): 50 us against limits of 33-65 us, 0.9x in the median. */
  static const double r[7] = {28, 33, 36, 40, 48, 55, 60}; /* + 5 us memcpy */
  for (int t = 0; t < 7; t++) {
    row.fig[t] = 50 * US;
    row.part[1].t[t] = r[t] * US;
  }
  o = bv_judge(&row);
  ASSERT_EQ(o.kept, 7);
  ASSERT_EQ(o.v, BV_UNRELIABLE);
  ASSERT(strstr(o.why, "too close") != NULL);
}

/* An informational row with a broken reference is marked too; a clean one
 * has no verdict. */
TEST(bench_verdict_informational_rows) {
  bv_row_t row = limit_row(7, 36, 4, 120, 60);
  row.gk = BV_GOAL_NONE;
  ASSERT_EQ(bv_judge(&row).v, BV_UNRELIABLE);
  row = limit_row(7, 60, 4, 40, 40);
  row.gk = BV_GOAL_NONE;
  ASSERT_EQ(bv_judge(&row).v, BV_INFO);
}

/* A row with no floor (Redis is no bound on kvcached): fast is fine. */
TEST(bench_verdict_no_floor_row_and_bad_input) {
  bv_row_t row;
  memset(&row, 0, sizeof row);
  row.gk = BV_GOAL_MIN;
  row.goal = 2;
  row.n = 5;
  row.nparts = 1;
  row.part[0] = (bv_part_t){.run_ns = 250 * US, .w_ref = 1, .name = "Redis SET"};
  for (int t = 0; t < 5; t++) {
    row.fig[t] = 100 * US;
    row.part[0].t[t] = 250 * US;
  }
  bv_result_t o = bv_judge(&row);
  ASSERT_EQ(o.v, BV_MET);
  row.n = 0;
  ASSERT_EQ(bv_judge(&row).v, BV_UNRELIABLE);
  row.n = BV_MAX_TRIALS + 1;
  ASSERT_EQ(bv_judge(&row).v, BV_UNRELIABLE);
  row.n = 5;
  row.nparts = 0;
  ASSERT_EQ(bv_judge(&row).v, BV_UNRELIABLE);
}

/* Trials in which the processes waited for a CPU are dropped: a few leave a
 * verdict, most leave none. */
TEST(bench_verdict_cpu_wait_drops_trials) {
  bv_row_t row = limit_row(7, 50, 5, 40, 40);
  row.wait[2] = 0.6;
  row.fig[2] = 200 * US; /* what the wait did to it */
  bv_result_t o = bv_judge(&row);
  ASSERT_EQ(o.kept, 6);
  ASSERT_EQ(o.busy, 1);
  ASSERT_EQ(o.v, BV_MET);
  for (int t = 0; t < 5; t++) row.wait[t] = 0.5;
  o = bv_judge(&row);
  ASSERT_EQ(o.kept, 2);
  ASSERT_EQ(o.v, BV_UNRELIABLE);
  ASSERT(strstr(o.why, "busy machine") != NULL);
}
