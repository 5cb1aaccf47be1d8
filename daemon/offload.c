/* offload.c: copying a large get or put on the daemon's copy threads.
 *
 * Why not libuv's thread pool: its completion path (uv_async_send from the
 * pool thread, uv__async_spin on the loop) makes the loop spin and
 * sched_yield while a pool thread it preempted finishes the send; with bulk
 * copies on every CPU the loop then waits a scheduler slice (1.5-3 ms here)
 * for a thread of lower priority, and so does every small request behind it
 * (measured with bpftrace: 1,347 loop wakeups over 400 us in one `make
 * bench` stall group, 2.0 s of waiting). Here the hand-off takes no lock the
 * loop can wait on for long: jobs go to the threads through a mutex held
 * only to link or unlink one job, and come back through a lock-free stack
 * and an eventfd the loop polls.
 *
 * A large copy is split in shares, one a thread (its layers split: no two
 * shares write the same bytes): the job stays at the head of the queue
 * until every share is taken, and the thread that finishes the last one
 * sends it back. So one client's 4 MiB put moves at the speed of every CPU
 * the daemon may use, not one. */
#include "offload.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"
#include "optable.h"

#define SHARE_BYTES (256u << 10)
#include "testhook.h"

typedef struct job {
  struct job *next;
  conn_t *c;
  engine_get_job_t *get; /* one of get and put */
  engine_put_job_t *put;
  uint64_t id;           /* the request's id, echoed in the reply */
  uint64_t t0_ns;        /* decode start, for the latency figure */
  unsigned nparts;       /* shares of the copy (its layers split), one a thread */
  unsigned taken;        /* shares a thread took (under mu) */
  atomic_uint left;      /* shares not yet copied: the last one done sends it back */
  bool here;             /* offload_run_here's: the loop waits for it; nothing is sent back */
} job_t;

struct offload {
  server_t *srv;
  pthread_mutex_t mu;    /* guards head, tail, stop */
  pthread_cond_t cv;     /* a job was queued, or stop */
  job_t *head, *tail;    /* queued, oldest first */
  bool stop;
  _Atomic(job_t *) done; /* copied, newest first: the threads push, the loop takes all */
  int efd;               /* counts pushes onto done: the loop's wake-up */
  uv_poll_t poll;        /* on efd, started while jobs are in flight */
  bool polled;           /* poll initialized: closed at the stop */
  uint64_t inflight;     /* queued or copying or done, not yet ended (loop only) */
  uint64_t shares;       /* their shares (loop only) */
  daemon_stats_t *stats; /* the loop's figures (offloaded_shares) */
  unsigned nthreads;
  pthread_t threads[];
};

/* A copy thread runs at a lower priority (nice 10) than the event loop:
 * where the two share a CPU, the loop's small requests come before the bulk
 * copy instead of taking turns with it. Linux sets nice per thread. */
static void *copier(void *arg) {
  offload_t *o = arg;
  (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10);
  pthread_mutex_lock(&o->mu);
  for (;;) {
    while (!o->head && !o->stop) pthread_cond_wait(&o->cv, &o->mu);
    job_t *j = o->head;
    if (!j) break; /* stopping, nothing left */
    unsigned part = j->taken++;
    if (j->taken == j->nparts) { /* its last share: off the queue */
      o->head = j->next;
      if (!o->head) o->tail = NULL;
    }
    pthread_mutex_unlock(&o->mu);
    TESTHOOK(offload, NULL);
    if (j->get) engine_get_run_part(j->get, part, j->nparts);
    else engine_put_run_part(j->put, part, j->nparts);
    /* The loop owns a job of offload_run_here and frees it once left is 0:
     * read here first, touch nothing after the decrement. */
    bool here = j->here;
    if (atomic_fetch_sub(&j->left, 1) != 1 || here) { /* another share is still copying */
      pthread_mutex_lock(&o->mu);
      continue;
    }
    job_t *top = atomic_load(&o->done);
    do j->next = top;
    while (!atomic_compare_exchange_weak(&o->done, &top, j));
    uint64_t one = 1;
    while (write(o->efd, &one, sizeof one) < 0 && errno == EINTR) {}
    pthread_mutex_lock(&o->mu);
  }
  pthread_mutex_unlock(&o->mu);
  return NULL;
}

/* The engine's end of a job: the copy is done (on a thread, or here). */
static void finish(server_t *srv, job_t *j) {
  if (j->get) {
    engine_get_end(srv->eng, j->get);
    srv->stats.offloaded_gets++;
  } else {
    engine_put_end(srv->eng, j->put);
    srv->stats.offloaded_puts++;
    if (srv->up.seqs_free) srv->up.seqs_free(srv); /* the sequences it held busy are free */
  }
}

/* Back on the loop: ends the job and replies. */
static void end(offload_t *o, job_t *j) {
  conn_t *c = j->c;
  server_t *srv = o->srv;
  o->shares -= j->nparts;
  if (--o->inflight == 0) uv_poll_stop(&o->poll); /* an idle daemon polls nothing */
  finish(srv, j);
  metrics_record(&srv->stats, j->get ? OP_GET : OP_PUT, uv_hrtime() - j->t0_ns, 0);
  uint64_t id = j->id;
  free(j);
  srv->up.copied(c, id); /* the reply, and what waited (conn_copied) */
}

/* Ends every job the threads sent back, oldest first. */
static void reap(offload_t *o) {
  uint64_t n;
  /* Read, then take: a push after the take writes the eventfd again. */
  if (read(o->efd, &n, sizeof n) < 0 && errno != EAGAIN) LOG_WARN("offload", "read: %s", strerror(errno));
  job_t *list = atomic_exchange(&o->done, NULL), *fifo = NULL;
  while (list) { /* oldest first */
    job_t *next = list->next;
    list->next = fifo;
    fifo = list;
    list = next;
  }
  while (fifo) {
    job_t *next = fifo->next;
    end(o, fifo);
    fifo = next;
  }
}

static void on_done(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  reap(h->data);
}

uint64_t offload_shares(const server_t *srv) { return srv->offload ? srv->offload->shares : 0; }

bool offload_reap(server_t *srv) {
  offload_t *o = srv->offload;
  if (!o || !atomic_load_explicit(&o->done, memory_order_relaxed)) return false;
  reap(o);
  return true;
}

/* CPUs this process may run on: its affinity, capped by a cgroup v2 quota. */
unsigned offload_cpus(void) {
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

int offload_start(server_t *srv, unsigned nthreads, char *err, size_t errlen) {
  if (nthreads == 0) nthreads = offload_cpus();
  offload_t *o = calloc(1, sizeof *o + nthreads * sizeof o->threads[0]);
  if (!o) {
    snprintf(err, errlen, "copy threads: out of memory");
    return -1;
  }
  o->srv = srv;
  o->stats = &srv->stats;
  o->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  pthread_mutex_init(&o->mu, NULL);
  pthread_cond_init(&o->cv, NULL);
  atomic_init(&o->done, NULL);
  srv->offload = o;
  if (o->efd < 0 || uv_poll_init(srv->loop, &o->poll, o->efd) != 0) {
    snprintf(err, errlen, "copy threads: eventfd: %s", strerror(errno));
    return -1;
  }
  o->polled = true;
  o->poll.data = o;
  for (; o->nthreads < nthreads; o->nthreads++) {
    int rc = pthread_create(&o->threads[o->nthreads], NULL, copier, o);
    if (rc) {
      snprintf(err, errlen, "copy threads: %s", strerror(rc));
      return -1;
    }
  }
  return 0;
}

static void on_poll_closed(uv_handle_t *h) { free(h->data); }

void offload_stop(server_t *srv) {
  offload_t *o = srv->offload;
  if (!o) return;
  srv->offload = NULL;
  pthread_mutex_lock(&o->mu);
  o->stop = true;
  pthread_cond_broadcast(&o->cv);
  pthread_mutex_unlock(&o->mu);
  for (unsigned i = 0; i < o->nthreads; i++) pthread_join(o->threads[i], NULL);
  pthread_mutex_destroy(&o->mu);
  pthread_cond_destroy(&o->cv);
  if (o->efd >= 0) close(o->efd);
  if (o->polled) uv_close((uv_handle_t *)&o->poll, on_poll_closed); /* frees o once closed */
  else free(o);
}

unsigned offload_threads(const server_t *srv) { return srv->offload ? srv->offload->nthreads : 0; }

/* Shares of a copy of bytes: one a copy thread, each at least SHARE_BYTES
 * (a smaller one costs more in hand-offs than it saves). */
static unsigned shares(const offload_t *o, uint64_t bytes) {
  uint64_t n = bytes / SHARE_BYTES;
  if (n > o->nthreads) n = o->nthreads;
  return n ? (unsigned)n : 1u;
}

static bool queue(conn_t *c, const job_t *proto, uint64_t bytes) {
  offload_t *o = c->srv->offload;
  job_t *j = o && o->nthreads ? malloc(sizeof *j) : NULL;
  if (!j) { /* copy here, as an inline request would */
    job_t local = *proto;
    if (local.get) engine_get_run(local.get);
    else engine_put_run(local.put);
    finish(c->srv, &local);
    return false;
  }
  *j = *proto;
  j->next = NULL;
  j->nparts = shares(o, bytes);
  j->taken = 0;
  atomic_init(&j->left, j->nparts);
  o->stats->offloaded_shares += j->nparts;
  o->shares += j->nparts;
  if (o->inflight++ == 0) uv_poll_start(&o->poll, UV_READABLE, on_done);
  pthread_mutex_lock(&o->mu);
  if (o->tail) o->tail->next = j;
  else o->head = j;
  o->tail = j;
  if (j->nparts > 1) pthread_cond_broadcast(&o->cv);
  else pthread_cond_signal(&o->cv);
  pthread_mutex_unlock(&o->mu);
  return true; /* the caller marks c offloaded (conn_offload_begin) */
}

/* A lone client's large copy: split between the loop and the copy threads
 * and done within the turn (begun, copied and ended in one request, as an
 * inline copy is: the event stream and the other requests see no
 * difference). The loop takes shares as a thread does; the job goes first
 * in the queue (the loop waits for it) and the loop copies every share no
 * thread has taken by the time it is free, so it waits only for shares
 * already being copied. */
bool offload_run_here(server_t *srv, engine_get_job_t *get, engine_put_job_t *put,
                      uint64_t bytes) {
  offload_t *o = srv->offload;
  if (!o || o->nthreads < 2 || shares(o, bytes) < 2) return false;
  job_t j = {.get = get, .put = put, .nparts = shares(o, bytes), .here = true};
  atomic_init(&j.left, j.nparts);
  o->stats->split_copies++;
  pthread_mutex_lock(&o->mu);
  j.next = o->head;
  o->head = &j;
  if (!o->tail) o->tail = &j;
  if (j.nparts > 2) pthread_cond_broadcast(&o->cv);
  else pthread_cond_signal(&o->cv);
  for (;;) {
    if (j.taken == j.nparts) break;
    unsigned part = j.taken++;
    if (j.taken == j.nparts) { /* still the head: only the loop queues */
      o->head = j.next;
      if (!o->head) o->tail = NULL;
    }
    pthread_mutex_unlock(&o->mu);
    if (get) engine_get_run_part(get, part, j.nparts);
    else engine_put_run_part(put, part, j.nparts);
    atomic_fetch_sub(&j.left, 1);
    pthread_mutex_lock(&o->mu);
  }
  pthread_mutex_unlock(&o->mu);
  for (unsigned i = 0; atomic_load(&j.left); i++) { /* a thread's share, being copied */
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
    if ((i & 1023) == 1023) sched_yield();
  }
  return true;
}

bool offload_get(conn_t *c, engine_get_job_t *get, uint64_t bytes, uint64_t request_id,
                 uint64_t t0_ns) {
  return queue(c, &(job_t){.c = c, .get = get, .id = request_id, .t0_ns = t0_ns}, bytes);
}

bool offload_put(conn_t *c, engine_put_job_t *put, uint64_t bytes, uint64_t request_id,
                 uint64_t t0_ns) {
  return queue(c, &(job_t){.c = c, .put = put, .id = request_id, .t0_ns = t0_ns}, bytes);
}

