/* offload.c: copying a large get on libuv's thread pool. */
#include "offload.h"

#include <stdbool.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"
#include "optable.h"

typedef struct job {
  uv_work_t req;
  conn_t *c;
  engine_get_job_t *get;
  uint64_t id;     /* the request's id, echoed in the reply */
  uint64_t t0_ns;  /* decode start, for the latency figure */
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

/* On a pool thread: only memcpy out of referenced pages into c's buffer. */
static void work(uv_work_t *req) {
  lower_priority();
  engine_get_run(((job_t *)req)->get);
}

/* Back on the loop. */
static void after(uv_work_t *req, int status) {
  job_t *j = (job_t *)req;
  conn_t *c = j->c;
  server_t *srv = c->srv;
  (void)status; /* never cancelled */
  engine_get_end(srv->eng, j->get);
  srv->stats.offloaded_gets++;
  metrics_record(&srv->stats, OP_GET, uv_hrtime() - j->t0_ns, 0);
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

bool offload_get(conn_t *c, engine_get_job_t *get, uint64_t request_id, uint64_t t0_ns) {
  job_t *j = malloc(sizeof *j);
  int rc = UV_ENOMEM;
  if (j) {
    *j = (job_t){.c = c, .get = get, .id = request_id, .t0_ns = t0_ns};
    j->req.data = j;
    rc = uv_queue_work(c->srv->loop, &j->req, work, after);
  }
  if (rc != 0) { /* copy here, as an inline get would */
    LOG_WARN("offload", "conn=%llu error=\"%s\"", (unsigned long long)c->id, uv_strerror(rc));
    free(j);
    engine_get_run(get);
    engine_get_end(c->srv->eng, get);
    return false;
  }
  conn_offload_begin(c);
  return true;
}
