/* work.c: the daemon's one work queue (daemon/work.c): every part of a job
 * runs once and its done once after the last; a class's jobs never wait on
 * another class's threads; a drain runs what is queued, a stop without one
 * hands the jobs not begun back; the loop takes parts itself. A real libuv
 * loop and real threads; no sleeps (the blocked job waits on a condition
 * the test sets). */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>

#include "../../daemon/work.h"
#include "test.h"

typedef struct tjob {
  work_job_t wj;
  atomic_uint ran[8];      /* per part: times it ran */
  atomic_int entered;      /* a thread began a part */
  int done;                /* times done ran (loop) */
  int cancelled;
  pthread_mutex_t *gate;   /* held: the job's part 0 waits for it */
} tjob_t;

static int ndone;

static void t_run(work_job_t *w, unsigned part, unsigned nparts) {
  tjob_t *j = (tjob_t *)(void *)w;
  ASSERT(part < nparts && nparts <= 8);
  atomic_store(&j->entered, 1);
  if (j->gate && part == 0) {
    pthread_mutex_lock(j->gate);
    pthread_mutex_unlock(j->gate);
  }
  atomic_fetch_add(&j->ran[part], 1);
}

static void t_done(work_job_t *w) {
  ((tjob_t *)(void *)w)->done++;
  ndone++;
}

static void t_cancel(work_job_t *w) { ((tjob_t *)(void *)w)->cancelled++; }

static void job(tjob_t *j, enum work_class c, unsigned nparts) {
  memset(j, 0, sizeof *j);
  j->wj = (work_job_t){.run = t_run, .done = t_done, .nparts = nparts, .cls = (uint8_t)c};
}

/* Runs the loop until n jobs are done in all (each turn waits on the
 * queue's eventfd: no polling of our own). */
static void until_done(uv_loop_t *loop, int n) {
  while (ndone < n) uv_run(loop, UV_RUN_ONCE);
}

TEST(work_every_part_once_done_once_after_the_last) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  char err[256];
  work_t *w = work_new(&loop, err, sizeof err);
  ASSERT(w != NULL);
  ASSERT_EQ(work_threads(w, WORK_COPY, 3, err, sizeof err), 0);
  ASSERT_EQ(work_nthreads(w, WORK_COPY), 3);
  static tjob_t j[16];
  ndone = 0;
  for (int i = 0; i < 16; i++) {
    job(&j[i], WORK_COPY, (unsigned)(i % 5) + 1);
    work_submit(w, &j[i].wj);
  }
  until_done(&loop, 16);
  for (int i = 0; i < 16; i++) {
    ASSERT_EQ(j[i].done, 1);
    for (int p = 0; p < 8; p++) ASSERT_EQ(atomic_load(&j[i].ran[p]), p < i % 5 + 1 ? 1u : 0u);
  }
  work_stop(w, WORK_COPY, true, NULL);
  work_free(w);
  uv_run(&loop, UV_RUN_DEFAULT); /* the poll handle closes */
  ASSERT_EQ(uv_loop_close(&loop), 0);
}

TEST(work_a_blocked_class_holds_up_no_other) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  char err[256];
  work_t *w = work_new(&loop, err, sizeof err);
  ASSERT(w != NULL);
  ASSERT_EQ(work_threads(w, WORK_NET, 1, err, sizeof err), 0);
  ASSERT_EQ(work_threads(w, WORK_COPY, 1, err, sizeof err), 0);
  ASSERT_EQ(work_threads(w, WORK_DISK, 1, err, sizeof err), 0);
  pthread_mutex_t gate = PTHREAD_MUTEX_INITIALIZER;
  pthread_mutex_lock(&gate);
  static tjob_t net[3], copy, disk;
  ndone = 0;
  for (int i = 0; i < 3; i++) {
    job(&net[i], WORK_NET, 1);
    net[i].gate = &gate; /* a silent node: the SET hangs */
    work_submit(w, &net[i].wj);
  }
  job(&copy, WORK_COPY, 2);
  job(&disk, WORK_DISK, 1);
  work_submit(w, &copy.wj);
  work_submit(w, &disk.wj);
  until_done(&loop, 2); /* the copy and the disk job, while the SETs hang */
  ASSERT_EQ(copy.done, 1);
  ASSERT_EQ(disk.done, 1);
  ASSERT_EQ(net[0].done + net[1].done + net[2].done, 0);
  /* A stop without a drain: the SET in progress ends, the others come
   * back not begun (or run, if the thread took them before the stop). */
  while (!atomic_load(&net[0].entered)) sched_yield(); /* in progress (the copy's done came first) */
  pthread_mutex_unlock(&gate);
  work_stop(w, WORK_NET, false, t_cancel);
  work_reap(w);
  int done = 0, cancelled = 0;
  for (int i = 0; i < 3; i++) {
    ASSERT_EQ(net[i].done + net[i].cancelled, 1);
    done += net[i].done, cancelled += net[i].cancelled;
  }
  ASSERT_EQ(net[0].done, 1);
  ASSERT_EQ(done + cancelled, 3);
  work_stop(w, WORK_COPY, true, NULL);
  work_stop(w, WORK_DISK, true, NULL);
  work_free(w);
  uv_run(&loop, UV_RUN_DEFAULT);
  ASSERT_EQ(uv_loop_close(&loop), 0);
}

TEST(work_drain_runs_what_is_queued_and_the_loop_takes_parts) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  char err[256];
  work_t *w = work_new(&loop, err, sizeof err);
  ASSERT(w != NULL);
  ASSERT_EQ(work_threads(w, WORK_DISK, 2, err, sizeof err), 0);
  ASSERT_EQ(work_threads(w, WORK_COPY, 2, err, sizeof err), 0);
  static tjob_t d[32], here;
  ndone = 0;
  for (int i = 0; i < 32; i++) {
    job(&d[i], WORK_DISK, 1);
    work_submit(w, &d[i].wj);
  }
  work_stop(w, WORK_DISK, true, t_cancel); /* every one runs before the threads end */
  work_reap(w);
  for (int i = 0; i < 32; i++) {
    ASSERT_EQ(d[i].done, 1);
    ASSERT_EQ(d[i].cancelled, 0);
  }
  /* The loop runs the parts no thread took, then waits for the others;
   * done is not called (the caller ends it). */
  job(&here, WORK_COPY, 8);
  work_run_here(w, &here.wj);
  for (int p = 0; p < 8; p++) ASSERT_EQ(atomic_load(&here.ran[p]), 1u);
  ASSERT_EQ(here.done, 0);
  ASSERT(!work_reap(w));
  work_stop(w, WORK_COPY, true, NULL);
  work_free(w);
  uv_run(&loop, UV_RUN_DEFAULT);
  ASSERT_EQ(uv_loop_close(&loop), 0);
}

/* work_help: the loop takes the head job's parts as a thread would; the
 * part that ends a job runs its done at once (no reap, and nothing keeps
 * the loop alive after); a part a thread holds is left to it, and the job
 * comes back through the done stack when that thread ends it. */
TEST(work_help_takes_parts_and_ends_the_jobs_it_finishes) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  char err[256];
  work_t *w = work_new(&loop, err, sizeof err);
  ASSERT(w != NULL);
  static tjob_t a, b, c;
  ndone = 0;
  /* No thread of the class: the loop alone, in order. */
  job(&a, WORK_COPY, 3);
  job(&b, WORK_COPY, 2);
  work_submit(w, &a.wj);
  work_submit(w, &b.wj);
  ASSERT(uv_loop_alive(&loop)); /* the queue's poll, while jobs are in flight */
  for (int i = 0; i < 3; i++) {
    ASSERT(work_help(w, WORK_COPY));
    ASSERT_EQ(a.done, i == 2 ? 1 : 0);
  }
  ASSERT(work_help(w, WORK_COPY));
  ASSERT(work_help(w, WORK_COPY));
  ASSERT_EQ(b.done, 1);
  ASSERT(!work_help(w, WORK_COPY)); /* nothing left */
  for (int p = 0; p < 8; p++) {
    ASSERT_EQ(atomic_load(&a.ran[p]), p < 3 ? 1u : 0u);
    ASSERT_EQ(atomic_load(&b.ran[p]), p < 2 ? 1u : 0u);
  }
  ASSERT(!work_reap(w));
  ASSERT(!uv_loop_alive(&loop)); /* nothing in flight: the poll stopped */
  /* A thread holds part 0; the loop takes the others; the thread ends it. */
  ASSERT_EQ(work_threads(w, WORK_COPY, 1, err, sizeof err), 0);
  pthread_mutex_t gate = PTHREAD_MUTEX_INITIALIZER;
  pthread_mutex_lock(&gate);
  job(&c, WORK_COPY, 3);
  c.gate = &gate;
  work_submit(w, &c.wj);
  while (!atomic_load(&c.entered)) sched_yield(); /* the thread is in part 0 */
  ASSERT(work_help(w, WORK_COPY));
  ASSERT(work_help(w, WORK_COPY));
  ASSERT(!work_help(w, WORK_COPY));
  ASSERT_EQ(c.done, 0);
  pthread_mutex_unlock(&gate);
  until_done(&loop, 3);
  ASSERT_EQ(c.done, 1);
  for (int p = 0; p < 3; p++) ASSERT_EQ(atomic_load(&c.ran[p]), 1u);
  work_stop(w, WORK_COPY, true, NULL);
  work_free(w);
  uv_run(&loop, UV_RUN_DEFAULT);
  ASSERT_EQ(uv_loop_close(&loop), 0);
}

/* work_companions: a job the loop runs here is joined by at most that many
 * threads, even when every thread is awake and looking (a job queued behind
 * it wakes them all), and a job queued behind it still runs once the loop's
 * is off the head. Each part works a while (no sleep: a spin on the clock)
 * so that threads left free to join would. */
typedef struct cjob {
  work_job_t wj;
  work_t *w;
  tjob_t *behind;          /* queued by the loop's first part: wakes every thread */
  _Atomic(pthread_t) by[8]; /* who ran each part */
  pthread_t loop;
} cjob_t;

static void c_run(work_job_t *w, unsigned part, unsigned nparts) {
  cjob_t *j = (cjob_t *)(void *)w;
  ASSERT(part < nparts && nparts <= 8);
  atomic_store(&j->by[part], pthread_self());
  if (pthread_equal(pthread_self(), j->loop) && j->behind) {
    work_submit(j->w, &j->behind->wj); /* on the loop: it may queue */
    j->behind = NULL;
  }
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  do clock_gettime(CLOCK_MONOTONIC, &t);
  while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 100000L);
}

TEST(work_companions_cap_the_threads_joining_a_job_run_here) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  char err[256];
  work_t *w = work_new(&loop, err, sizeof err);
  ASSERT(w != NULL);
  work_companions(w, WORK_COPY, 1, 2000000); /* one joins; it looks 2 ms for the next job */
  ASSERT_EQ(work_threads(w, WORK_COPY, 3, err, sizeof err), 0);
  static tjob_t behind[20];
  ndone = 0;
  unsigned joined_by_threads = 0;
  for (int rep = 0; rep < 20; rep++) {
    static cjob_t j;
    memset(&j, 0, sizeof j);
    j.wj = (work_job_t){.run = c_run, .nparts = 8, .cls = WORK_COPY};
    j.w = w;
    j.loop = pthread_self();
    job(&behind[rep], WORK_COPY, 1);
    j.behind = &behind[rep];
    work_run_here(w, &j.wj);
    pthread_t seen[8];
    unsigned nseen = 0;
    for (int p = 0; p < 8; p++) {
      pthread_t t = atomic_load(&j.by[p]);
      ASSERT(!pthread_equal(t, (pthread_t)0));
      if (pthread_equal(t, j.loop)) continue;
      bool known = false;
      for (unsigned i = 0; i < nseen; i++) known |= pthread_equal(seen[i], t);
      if (!known) seen[nseen++] = t;
    }
    ASSERT(nseen <= 1); /* the loop and one thread, never more */
    joined_by_threads += nseen;
    until_done(&loop, rep + 1); /* the job behind it ran, on a thread */
    ASSERT_EQ(behind[rep].done, 1);
    ASSERT_EQ(atomic_load(&behind[rep].ran[0]), 1u);
  }
  ASSERT(joined_by_threads > 0); /* a thread did join: the loop is not left alone */
  work_stop(w, WORK_COPY, true, NULL);
  work_free(w);
  uv_run(&loop, UV_RUN_DEFAULT);
  ASSERT_EQ(uv_loop_close(&loop), 0);
}
