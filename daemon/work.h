/* work.h: the daemon's one work queue: jobs run off the loop on threads of
 * the daemon's own and come back to the loop (libuv's uv__work, with the
 * hand-off of offload.c, which says why not libuv's own pool).
 *
 *   loop:    work_submit(j) --> the class's list (one mutex, held only to
 *                               link or unlink a job)
 *   threads: a part of the head job of their class: j->run(j, part)
 *            the last part done --> one lock-free done stack, an eventfd
 *   loop:    the eventfd's poll (only while jobs are in flight), or
 *            work_reap --> j->done(j), oldest first
 *
 * Classes, each with threads of its own so that a slow disk or a silent
 * cluster node never holds up a copy a client waits on, all at nice 10
 * (below the loop: where they share a CPU, the loop's small requests come
 * first):
 *
 *   WORK_COPY  a large get's or put's copy (offload.c), split in parts that
 *              whoever is free takes; the loop may take parts itself
 *              (work_run_here, work_help)
 *   WORK_DISK  the disk tier's reads, writes and start-up scan (disk.c)
 *   WORK_NET   the cluster tier's SETs, blocking, on connections its one
 *              thread keeps (rsend.c)
 */
#ifndef KVCD_WORK_H
#define KVCD_WORK_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

enum work_class { WORK_COPY, WORK_DISK, WORK_NET, WORK_CLASSES };

typedef struct work_job work_job_t;
struct work_job {
  work_job_t *next;
  void (*run)(work_job_t *j, unsigned part, unsigned nparts); /* on a thread of its class */
  void (*done)(work_job_t *j);          /* on the loop, once every part ran */
  unsigned nparts;                      /* 0 or 1: one part */
  unsigned taken;                       /* parts a thread took (under the mutex) */
  atomic_uint left;                     /* parts not yet run */
  bool here;                            /* work_run_here's: the loop waits for it */
  unsigned joined;                      /* threads that took a part of it (here; under the mutex) */
  uint64_t seq;                         /* its number in its class (under the mutex) */
  uint8_t cls;                          /* enum work_class */
};

typedef struct work work_t;

/* The queue, its eventfd and its poll handle on loop (no thread yet), or
 * NULL with a reason in err. */
work_t *work_new(uv_loop_t *loop, char *err, size_t errlen);
/* Starts n more threads of class c: 0, or -1 with a reason in err. */
int work_threads(work_t *w, enum work_class c, unsigned n, char *err, size_t errlen);
/* Makes n the most threads of class c that join the loop on a job it runs
 * (work_run_here), and lets up to n idle threads look for the next job for
 * poll_ns before they sleep (0: they sleep at once). Set once, before any
 * job; without it every thread may join and none polls. */
void work_companions(work_t *w, enum work_class c, unsigned n, uint64_t poll_ns);
/* Threads of class c running. */
unsigned work_nthreads(const work_t *w, enum work_class c);

/* Queues j (its run, done, cls and nparts set) at the tail of its class;
 * taken until its done runs. */
void work_submit(work_t *w, work_job_t *j);
/* j (class WORK_COPY, on the loop's stack) goes first in its class and the
 * loop runs every part no thread has taken by the time it is free, then
 * waits for the parts being run; done is not called. */
void work_run_here(work_t *w, work_job_t *j);
/* The loop takes the next part of class c's head job as a thread would and
 * runs it; if that part was the job's last to end, done runs now. Whether
 * there was a part to take (a job of work_run_here's is never taken). */
bool work_help(work_t *w, enum work_class c);
/* Ends the jobs the threads finished, now (the eventfd's poll does it
 * otherwise): whether there were any. */
bool work_reap(work_t *w);

/* Stops class c's threads: with drain, once they ran every job of it
 * queued; else at once, the jobs not begun handed back to cancel (on the
 * loop, j->done not called). What they finished is left to work_reap. */
void work_stop(work_t *w, enum work_class c, bool drain, void (*cancel)(work_job_t *j));

/* After every class stopped: frees the queue (its poll handle closes on
 * the next loop run). NULL is a no-op. */
void work_free(work_t *w);

/* CPUs the daemon may use: its affinity, capped by a cgroup v2 cpu.max quota
 * (how many threads a class gets by default). */
unsigned work_cpus(void);

#endif
