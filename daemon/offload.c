/* offload.c: copying a large get or put on libuv's thread pool. */
#include "offload.h"

#include <stdbool.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"
#include "testhook.h"
#include "optable.h"

typedef struct job {
  uv_work_t req;
  conn_t *c;
  engine_get_job_t *get; /* one of get and put */
  engine_put_job_t *put;
  uint64_t id;           /* the request's id, echoed in the reply */
  uint64_t t0_ns;        /* decode start, for the latency figure */
} job_t;

/* A pool thread runs at a lower priority (nice 10) than the event loop:
 * where the two share a CPU, the loop's small requests come before the bulk
 * copy instead of taking turns with it (a copy only slows down while the
 * CPU is contended). Linux sets the nice value per thread. */
static void lower_priority(void) {
  static _Thread_local bool lowered;
  if (lowered) return;
  lowered = true;
  (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10);
}

/* On a pool thread: only memcpy between the job's pages and c's buffer. */
static void work(uv_work_t *req) {
  job_t *j = (job_t *)req;
  lower_priority();
  TESTHOOK(offload, NULL);
  if (j->get) engine_get_run(j->get);
  else engine_put_run(j->put);
}

/* The engine's end of a job: the copy is done (here or on a pool thread). */
static void finish(server_t *srv, job_t *j) {
  if (j->get) {
    engine_get_end(srv->eng, j->get);
    srv->stats.offloaded_gets++;
  } else {
    engine_put_end(srv->eng, j->put);
    srv->stats.offloaded_puts++;
    conn_unpark_all(srv); /* the sequences it held busy are free */
  }
}

/* Back on the loop. */
static void after(uv_work_t *req, int status) {
  job_t *j = (job_t *)req;
  conn_t *c = j->c;
  server_t *srv = c->srv;
  (void)status; /* never cancelled */
  finish(srv, j);
  metrics_record(&srv->stats, j->get ? OP_GET : OP_PUT, uv_hrtime() - j->t0_ns, 0);
  uint64_t id = j->id;
  free(j);
  if (!conn_offload_end(c)) return; /* closed meanwhile: freed */
  Kvcache__V1__Response resp = KVCACHE__V1__RESPONSE__INIT;
  resp.id = id;
  resp.status = KVCACHE__V1__STATUS__OK;
  resp.error = (char *)"";
  if (conn_send(c, &resp) != 0) return; /* conn_send closed it */
  conn_resume(c);
}

static bool queue(conn_t *c, job_t *proto) {
  job_t *j = malloc(sizeof *j);
  int rc = UV_ENOMEM;
  if (j) {
    *j = *proto;
    j->req.data = j;
    rc = uv_queue_work(c->srv->loop, &j->req, work, after);
  }
  if (rc != 0) { /* copy here, as an inline request would */
    LOG_WARN("offload", "conn=%llu error=\"%s\"", (unsigned long long)c->id, uv_strerror(rc));
    free(j);
    work(&proto->req);
    finish(c->srv, proto);
    return false;
  }
  conn_offload_begin(c);
  return true;
}

bool offload_get(conn_t *c, engine_get_job_t *get, uint64_t request_id, uint64_t t0_ns) {
  return queue(c, &(job_t){.c = c, .get = get, .id = request_id, .t0_ns = t0_ns});
}

bool offload_put(conn_t *c, engine_put_job_t *put, uint64_t request_id, uint64_t t0_ns) {
  return queue(c, &(job_t){.c = c, .put = put, .id = request_id, .t0_ns = t0_ns});
}
