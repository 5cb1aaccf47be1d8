/* work.c: the one work queue (work.h). */
#include "work.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "log.h"

typedef struct wclass {
  work_job_t *head, *tail; /* queued, oldest first (under mu) */
  pthread_cond_t cv;       /* a job of it was queued, or stop */
  bool stop, drain;        /* under mu */
  unsigned nthreads, cap;
  pthread_t *threads;      /* nthreads of them (cap allocated) */
  unsigned companions;     /* the most threads joining a job run here; 0: any (work_companions) */
  unsigned polling;        /* threads looking for the next job now (under mu) */
  uint64_t poll_ns;        /* how long an idle thread looks before it sleeps */
  atomic_uint_fast64_t posted; /* jobs queued so far (bumped under mu): a job's seq */
} wclass_t;

typedef struct targ {
  work_t *w;
  enum work_class c;
} targ_t;

struct work {
  pthread_mutex_t mu;          /* guards every class's list and flags */
  wclass_t cls[WORK_CLASSES];
  targ_t args[WORK_CLASSES];
  _Atomic(work_job_t *) done;  /* finished, newest first: the threads push, the loop takes all */
  int efd;                     /* counts pushes onto an empty done stack: the loop's wake-up */
  uv_poll_t poll;              /* on efd, started while jobs are in flight */
  uint64_t inflight;           /* submitted, not yet done (loop only) */
};

/* The last part of j was run: onto the done stack. Only a push onto an
 * empty stack wakes the loop: a stack that was not empty has a wake-up
 * pending (the loop reads the eventfd before it takes the stack). */
static void push_done(work_t *w, work_job_t *j) {
  work_job_t *top = atomic_load(&w->done);
  do j->next = top;
  while (!atomic_compare_exchange_weak(&w->done, &top, j));
  uint64_t one = 1;
  while (!top && write(w->efd, &one, sizeof one) < 0 && errno == EINTR) {}
}

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* An idle thread looks for the next job for poll_ns before it sleeps
 * (called and returns with mu held): a job queued meanwhile starts at once,
 * not after the thread's wake-up (on a VM, a halted vCPU's: tens of
 * microseconds), which a copy split with the loop waits for. One load a
 * look, at nice 10: a client waking on this CPU preempts it. */
static void poll_for_job(work_t *w, wclass_t *k) {
  uint64_t seen = atomic_load_explicit(&k->posted, memory_order_relaxed);
  k->polling++;
  pthread_mutex_unlock(&w->mu);
  uint64_t end = mono_ns() + k->poll_ns;
  for (unsigned i = 1; atomic_load_explicit(&k->posted, memory_order_relaxed) == seen; i++) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
    if (i % 64 == 0 && mono_ns() >= end) break;
  }
  pthread_mutex_lock(&w->mu);
  k->polling--;
}

/* Whether a thread that last joined the job numbered mine may take a part
 * of the head job: any queued job; a job the loop runs here only up to
 * the class's companions (so the loop and they are no more copiers than
 * CPUs: a third copier on two CPUs leaves one holding a part while it
 * waits for a CPU, and the loop waits for that part). */
static bool may_take(const wclass_t *k, uint64_t mine) {
  const work_job_t *j = k->head;
  return j && (!j->here || !k->companions || j->seq == mine || j->joined < k->companions);
}

static void *worker(void *arg) {
  targ_t *a = arg;
  work_t *w = a->w;
  wclass_t *k = &w->cls[a->c];
  uint64_t mine = 0; /* the job run here this thread joined last (seqs start at 1) */
  (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10);
  pthread_mutex_lock(&w->mu);
  for (;;) {
    if (!k->head && !k->stop && k->poll_ns && k->polling < k->companions) poll_for_job(w, k);
    while (!k->stop && !may_take(k, mine)) pthread_cond_wait(&k->cv, &w->mu);
    work_job_t *j = k->head;
    if (!j || (k->stop && !k->drain)) break;
    if (j->here && j->seq != mine) {
      j->joined++;
      mine = j->seq;
    }
    unsigned n = j->nparts ? j->nparts : 1, part = j->taken++;
    if (j->taken == n) { /* its last part: off the list */
      k->head = j->next;
      if (!k->head) k->tail = NULL;
      else if (j->here) pthread_cond_signal(&k->cv); /* as work_run_here does */
    }
    pthread_mutex_unlock(&w->mu);
    j->run(j, part, n);
    /* The loop owns a job of work_run_here and frees it once left is 0:
     * read here first, touch nothing after the decrement. */
    bool here = j->here;
    if (atomic_fetch_sub(&j->left, 1) == 1 && !here) push_done(w, j);
    pthread_mutex_lock(&w->mu);
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

static void reap(work_t *w) {
  work_job_t *list = atomic_exchange(&w->done, NULL), *fifo = NULL;
  while (list) { /* oldest first */
    work_job_t *next = list->next;
    list->next = fifo;
    fifo = list;
    list = next;
  }
  while (fifo) {
    work_job_t *next = fifo->next;
    if (--w->inflight == 0) uv_poll_stop(&w->poll); /* idle: poll nothing */
    fifo->done(fifo);
    fifo = next;
  }
}

static void on_done(uv_poll_t *h, int status, int events) {
  work_t *w = h->data;
  uint64_t n;
  (void)status;
  (void)events;
  /* Read, then take: a push after the take writes the eventfd again. */
  if (read(w->efd, &n, sizeof n) < 0 && errno != EAGAIN)
    LOG_WARN("work", "read eventfd: %s", strerror(errno));
  reap(w);
}

bool work_reap(work_t *w) {
  if (!w || !atomic_load_explicit(&w->done, memory_order_relaxed)) return false;
  uint64_t n;
  if (read(w->efd, &n, sizeof n) < 0 && errno != EAGAIN)
    LOG_WARN("work", "read eventfd: %s", strerror(errno));
  reap(w);
  return true;
}

work_t *work_new(uv_loop_t *loop, char *err, size_t errlen) {
  work_t *w = calloc(1, sizeof *w);
  if (!w) {
    snprintf(err, errlen, "work queue: out of memory");
    return NULL;
  }
  w->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (w->efd < 0 || uv_poll_init(loop, &w->poll, w->efd) != 0) {
    snprintf(err, errlen, "work queue: eventfd: %s", strerror(errno));
    if (w->efd >= 0) close(w->efd);
    free(w);
    return NULL;
  }
  pthread_mutex_init(&w->mu, NULL);
  for (int c = 0; c < WORK_CLASSES; c++) {
    pthread_cond_init(&w->cls[c].cv, NULL);
    w->args[c] = (targ_t){w, (enum work_class)c};
  }
  atomic_init(&w->done, NULL);
  w->poll.data = w;
  return w;
}

int work_threads(work_t *w, enum work_class c, unsigned n, char *err, size_t errlen) {
  wclass_t *k = &w->cls[c];
  pthread_mutex_lock(&w->mu);
  k->stop = k->drain = false;
  pthread_mutex_unlock(&w->mu);
  if (k->nthreads + n > k->cap) {
    pthread_t *t = realloc(k->threads, (k->nthreads + n) * sizeof *t);
    if (!t) {
      snprintf(err, errlen, "threads: out of memory");
      return -1;
    }
    k->threads = t;
    k->cap = k->nthreads + n;
  }
  for (unsigned i = 0; i < n; i++) {
    int rc = pthread_create(&k->threads[k->nthreads], NULL, worker, &w->args[c]);
    if (rc) {
      snprintf(err, errlen, "threads: %s", strerror(rc));
      return -1;
    }
    k->nthreads++;
  }
  return 0;
}

void work_companions(work_t *w, enum work_class c, unsigned n, uint64_t poll_ns) {
  w->cls[c].companions = n;
  w->cls[c].poll_ns = n ? poll_ns : 0;
}

unsigned work_nthreads(const work_t *w, enum work_class c) { return w ? w->cls[c].nthreads : 0; }

void work_submit(work_t *w, work_job_t *j) {
  wclass_t *k = &w->cls[j->cls];
  unsigned n = j->nparts ? j->nparts : 1;
  j->next = NULL;
  j->taken = 0;
  j->here = false;
  atomic_init(&j->left, n);
  if (w->inflight++ == 0) uv_poll_start(&w->poll, UV_READABLE, on_done);
  pthread_mutex_lock(&w->mu);
  j->seq = atomic_fetch_add_explicit(&k->posted, 1, memory_order_relaxed) + 1;
  if (k->tail) k->tail->next = j;
  else k->head = j;
  k->tail = j;
  if (n > 1) pthread_cond_broadcast(&k->cv);
  else pthread_cond_signal(&k->cv);
  pthread_mutex_unlock(&w->mu);
}

void work_run_here(work_t *w, work_job_t *j) {
  wclass_t *k = &w->cls[j->cls];
  unsigned n = j->nparts ? j->nparts : 1;
  j->taken = 0;
  j->here = true;
  j->joined = 0;
  atomic_init(&j->left, n);
  pthread_mutex_lock(&w->mu);
  j->seq = atomic_fetch_add_explicit(&k->posted, 1, memory_order_relaxed) + 1;
  j->next = k->head;
  k->head = j;
  if (!k->tail) k->tail = j;
  /* As many threads as may join and would find a part, less those looking
   * for a job already (they see the new seq). */
  unsigned want = n - 1;
  if (k->companions && want > k->companions) want = k->companions;
  for (unsigned i = k->polling; i < want; i++) pthread_cond_signal(&k->cv);
  for (;;) {
    if (j->taken == n) break;
    unsigned part = j->taken++;
    if (j->taken == n) { /* still the head: only the loop queues */
      k->head = j->next;
      if (!k->head) k->tail = NULL;
      else pthread_cond_signal(&k->cv); /* a thread kept off j may sleep by a queued job */
    }
    pthread_mutex_unlock(&w->mu);
    j->run(j, part, n);
    atomic_fetch_sub(&j->left, 1);
    pthread_mutex_lock(&w->mu);
  }
  pthread_mutex_unlock(&w->mu);
  for (unsigned i = 0; atomic_load(&j->left); i++) { /* a thread's part, being run */
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
    if ((i & 1023) == 1023) sched_yield();
  }
}

bool work_help(work_t *w, enum work_class c) {
  wclass_t *k = &w->cls[c];
  pthread_mutex_lock(&w->mu);
  work_job_t *j = k->head;
  if (!j || j->here || k->stop) { /* a job of work_run_here's is the loop's own already */
    pthread_mutex_unlock(&w->mu);
    return false;
  }
  unsigned n = j->nparts ? j->nparts : 1, part = j->taken++;
  if (j->taken == n) {
    k->head = j->next;
    if (!k->head) k->tail = NULL;
  }
  pthread_mutex_unlock(&w->mu);
  j->run(j, part, n);
  if (atomic_fetch_sub(&j->left, 1) == 1) { /* its last part to end ended here: done now */
    if (--w->inflight == 0) uv_poll_stop(&w->poll);
    j->done(j);
  }
  return true;
}

void work_stop(work_t *w, enum work_class c, bool drain, void (*cancel)(work_job_t *j)) {
  if (!w) return;
  wclass_t *k = &w->cls[c];
  pthread_mutex_lock(&w->mu);
  k->stop = true;
  k->drain = drain;
  pthread_cond_broadcast(&k->cv);
  pthread_mutex_unlock(&w->mu);
  for (unsigned i = 0; i < k->nthreads; i++) pthread_join(k->threads[i], NULL);
  k->nthreads = 0;
  work_job_t *left = k->head; /* not begun (a drain leaves none) */
  k->head = k->tail = NULL;
  while (left) {
    work_job_t *next = left->next;
    if (--w->inflight == 0) uv_poll_stop(&w->poll);
    if (cancel) cancel(left);
    left = next;
  }
}

static void on_poll_closed(uv_handle_t *h) { free(h->data); }

void work_free(work_t *w) {
  if (!w) return;
  for (int c = 0; c < WORK_CLASSES; c++) {
    pthread_cond_destroy(&w->cls[c].cv);
    free(w->cls[c].threads);
  }
  pthread_mutex_destroy(&w->mu);
  close(w->efd);
  uv_close((uv_handle_t *)&w->poll, on_poll_closed); /* frees w once closed */
}

/* CPUs this process may run on: its affinity, capped by a cgroup v2 quota. */
unsigned work_cpus(void) {
  cpu_set_t set;
  unsigned n = 1;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
    n = (unsigned)CPU_COUNT(&set);
  FILE *f = fopen("/sys/fs/cgroup/cpu.max", "r");
  if (f) {
    char quota[32];
    unsigned long long period;
    if (fscanf(f, "%31s %llu", quota, &period) == 2 && strcmp(quota, "max") != 0 && period) {
      unsigned long long q = strtoull(quota, NULL, 10), cpus = (q + period - 1) / period;
      if (cpus >= 1 && cpus < n) n = (unsigned)cpus;
    }
    fclose(f);
  }
  return n;
}
