/* offload.c: copying a large get or put on the daemon's copy threads.
 *
 * The copies are the WORK_COPY class of the daemon's one work queue
 * (work.c), with threads of their own. Why not libuv's thread pool: its completion path (uv_async_send from the
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
 * A large copy is split in shares (its layers split: no two shares write
 * the same bytes), more than there are copiers: the job stays at the head of
 * the queue until every share is taken, whoever is free takes the next, and
 * whoever finishes the last one sends it back. So one client's 4 MiB put
 * moves at the speed of every CPU the daemon may use, not one; while only
 * large copies come, the loop takes shares too (on_help). A copy queued
 * while every thread has a share to copy already goes whole: the CPUs are
 * busy, and splitting would only add hand-offs (queued_shares). */
#include "offload.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "optable.h"
#include "testhook.h"
#include "work.h"

#define SHARE_BYTES (256u << 10)
#define MAX_SHARES 16
/* How long an idle copy thread looks for the next copy before it sleeps:
 * longer than the loop's own work between two of a client's large
 * requests (a decode step's decoding, begin and end: about 40 us here). */
#define COPY_POLL_NS 200000u

typedef struct job {
  work_job_t wj;         /* first: class WORK_COPY, its parts the shares */
  server_t *srv;
  conn_t *c;
  engine_get_job_t *get; /* one of get and put */
  engine_put_job_t *put;
  uint64_t id;           /* the request's id, echoed in the reply */
  uint64_t t0_ns;        /* decode start, for the latency figure */
} job_t;

struct offload {
  server_t *srv;
  uint64_t shares;       /* shares queued or copying or done, not yet ended (loop only) */
  unsigned ncpus;        /* CPUs the daemon may use (work_cpus) */
  daemon_stats_t *stats; /* the loop's figures (offloaded_shares) */
  uv_idle_t help;        /* active while the loop takes queued shares itself */
};

/* Set on the loop while it copies shares itself (offload_run_here, on_help). */
static _Thread_local bool on_loop;

/* A share of the copy, on a copy thread (or the loop: offload_run_here). */
static void copy_part(work_job_t *w, unsigned part, unsigned nparts) {
  job_t *j = (job_t *)(void *)w;
  if (!on_loop) TESTHOOK(offload, NULL);
  if (j->get) engine_get_run_part(j->get, part, nparts);
  else engine_put_run_part(j->put, part, nparts);
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
static void copied(work_job_t *w) {
  job_t *j = (job_t *)(void *)w;
  server_t *srv = j->srv;
  conn_t *c = j->c;
  if (srv->offload) srv->offload->shares -= j->wj.nparts;
  finish(srv, j);
  metrics_record(&srv->stats, j->get ? OP_GET : OP_PUT, uv_hrtime() - j->t0_ns, 0);
  uint64_t id = j->id;
  free(j);
  srv->up.copied(c, id); /* the reply, and what waited (conn_copied) */
}

uint64_t offload_shares(const server_t *srv) { return srv->offload ? srv->offload->shares : 0; }

bool offload_quiet(const server_t *srv, uint64_t now_ns) {
  uint64_t quiet_ns = (uint64_t)srv->cfg.offload_quiet_us * 1000u;
  return quiet_ns && now_ns - srv->small_ns > quiet_ns;
}

/* While only large copies come (no small request within offload_quiet_us
 * to keep waiting), the loop is a copy thread too: each turn of the loop
 * it takes one share of the queued copies, between the turns' looks at
 * the sockets, the rings and the timers. So the CPU the loop runs on
 * copies rather than waits, and a copy the loop ends replies at once. */
static void on_help(uv_idle_t *h) {
  offload_t *o = h->data;
  server_t *srv = o->srv;
  on_loop = true;
  bool took = offload_quiet(srv, uv_hrtime()) && work_help(srv->work, WORK_COPY);
  on_loop = false;
  if (!took) {
    uv_idle_stop(h);
    return;
  }
  o->stats->helped_shares++;
}

bool offload_reap(server_t *srv) { return work_reap(srv->work); }


int offload_start(server_t *srv, unsigned nthreads, char *err, size_t errlen) {
  unsigned ncpus = work_cpus();
  if (nthreads == 0) nthreads = ncpus;
  offload_t *o = calloc(1, sizeof *o);
  if (!o) {
    snprintf(err, errlen, "copy threads: out of memory");
    return -1;
  }
  o->srv = srv;
  o->stats = &srv->stats;
  o->ncpus = ncpus;
  uv_idle_init(srv->loop, &o->help);
  o->help.data = o;
  srv->offload = o;
  char why[256];
  /* The loop copies a lone client's copy too (offload_run_here): one
   * thread fewer than the CPUs joins it, and that one looks for the next
   * copy a while before it sleeps. Every thread takes queued copies. */
  if (ncpus > 1) work_companions(srv->work, WORK_COPY, ncpus - 1, COPY_POLL_NS);
  if (work_threads(srv->work, WORK_COPY, nthreads, why, sizeof why) != 0) {
    snprintf(err, errlen, "copy %s", why);
    return -1;
  }
  return 0;
}

static void on_help_closed(uv_handle_t *h) { free(h->data); }

void offload_stop(server_t *srv) {
  offload_t *o = srv->offload;
  if (!o) return;
  work_stop(srv->work, WORK_COPY, true, NULL); /* every copy ended: the loop ran out of work */
  srv->offload = NULL;
  uv_close((uv_handle_t *)&o->help, on_help_closed); /* frees o once closed */
}

unsigned offload_threads(const server_t *srv) { return work_nthreads(srv->work, WORK_COPY); }

/* Shares of a copy of bytes: each at least SHARE_BYTES (a smaller one
 * costs more in hand-offs than it saves), two a CPU the daemon may use
 * (at most MAX_SHARES), never more than the layers it moves. More shares
 * than copiers: whoever is free takes the next one, so a copier that
 * started late (a thread waking, the loop finishing a request) or runs
 * slower (a CPU it shares) takes fewer. But not many more: a share is a
 * range of layers of every run, and narrower ranges copy slower (the
 * decode step's get, 8 MiB on two CPUs: 16 shares copied in 430 us, 4 in
 * 360 us, doc/offload.md). */
static unsigned shares(const offload_t *o, const engine_get_job_t *get,
                       const engine_put_job_t *put, uint64_t bytes) {
  uint64_t n = bytes / SHARE_BYTES, layers = get ? engine_get_job_layers(get)
                                                 : engine_put_job_layers(put);
  uint64_t most = 2u * (uint64_t)o->ncpus;
  if (most > MAX_SHARES) most = MAX_SHARES;
  if (n > most) n = most;
  if (n > layers) n = layers; /* a share is a range of layers */
  return n ? (unsigned)n : 1u;
}

/* Shares of a queued copy: as shares() while the copy threads have less
 * than one share each to copy; else one. Split, a copy takes CPUs that
 * would idle; with every thread busy already, splitting buys no CPU and
 * costs hand-offs and narrower runs (8 clients' 1 MiB puts: 20.2 GB/s
 * split, 24.7 whole; doc/offload.md). */
static unsigned queued_shares(const server_t *srv, const job_t *proto, uint64_t bytes) {
  const offload_t *o = srv->offload;
  if (o->shares >= offload_threads(srv)) return 1;
  return shares(o, proto->get, proto->put, bytes);
}

static bool queue(conn_t *c, const job_t *proto, uint64_t bytes) {
  server_t *srv = c->srv;
  offload_t *o = srv->offload;
  job_t *j = o && offload_threads(srv) ? malloc(sizeof *j) : NULL;
  if (!j) { /* copy here, as an inline request would */
    job_t local = *proto;
    if (local.get) engine_get_run(local.get);
    else engine_put_run(local.put);
    finish(srv, &local);
    return false;
  }
  *j = *proto;
  j->srv = srv;
  j->wj = (work_job_t){.run = copy_part, .done = copied, .cls = WORK_COPY,
                       .nparts = queued_shares(srv, proto, bytes)};
  o->stats->offloaded_shares += j->wj.nparts;
  o->shares += j->wj.nparts;
  work_submit(srv->work, &j->wj);
  if (offload_quiet(srv, uv_hrtime()) && !uv_is_active((uv_handle_t *)&o->help))
    uv_idle_start(&o->help, on_help);
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
  unsigned n = o ? shares(o, get, put, bytes) : 1;
  if (n < 2 || o->ncpus < 2 || !offload_threads(srv)) return false;
  job_t j = {.wj = {.run = copy_part, .nparts = n, .cls = WORK_COPY},
             .srv = srv, .get = get, .put = put};
  o->stats->split_copies++;
  on_loop = true;
  work_run_here(srv->work, &j.wj);
  on_loop = false;
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
